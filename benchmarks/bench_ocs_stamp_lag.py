"""How late the TL1 driver's thread reads a reply after the kernel received it (what a read-time stamp would
add to "OCS switch (completed - sent)"), and the bound of the kernel stamp's conversion to the harness clock.

    .venv/bin/python benchmarks/bench_ocs_stamp_lag.py [--commands 800] [--profile instant]

Against the emulated TL1 server: connect/disconnect pairs, every received chunk's (read time - kernel stamp)
and `bound_ns` (devices/timing.py ReceiveStamps); p50/p90/p99/max in us, and the stamps that fell back.
Run it next to the load you care about: the lag is the machine's scheduling, not the driver's code.
"""
from __future__ import annotations

import argparse

import numpy as np

from devices.emulated.ocs_server import OcsServers
from devices.emulated.physics import OpticalBench
from devices.emulated.profile import load_profile
from devices.ocs import open_switch
from devices.resources import OcsResource
from devices.timing import now_ns


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--commands", type=int, default=800)
    parser.add_argument("--profile", default="instant")
    args = parser.parse_args()
    bench = OpticalBench(load_profile(args.profile), seed=1).start()
    servers = OcsServers(bench, pty=False).start()
    n = 16
    try:
        host, port = servers.tl1_address
        switch = open_switch(OcsResource(name="ocs1", protocol="polatis-tl1", url=f"tcp://{host}:{port}",
                                         size=(n, n), allowed_ports=frozenset(range(1, 2 * n + 1)),
                                         user="admin", password="root"), timeout_s=10)
        channel, lag, bounds = switch._channel, [], []
        read = channel._read

        def timed_read(timeout_s):
            data, stamp, bound = read(timeout_s)
            if data:
                lag.append(now_ns() - stamp)
                bounds.append(bound)
            return data, stamp, bound

        channel._read = timed_read
        for k in range(args.commands // 2):
            switch.connect(1 + k % n, n + 1 + (k * 7) % n)
            switch.disconnect([1 + k % n])
        switch.close()
    finally:
        servers.stop()
        bench.stop()
    for name, values in (("read - kernel stamp", lag), ("conversion bound", bounds)):
        us = np.asarray(values, dtype=float) / 1e3
        print(f"{name:>20} (us, {len(us)} chunks): p50 {np.percentile(us, 50):.2f}  p90 {np.percentile(us, 90):.2f}"
              f"  p99 {np.percentile(us, 99):.2f}  max {us.max():.2f}")
    print(f"fell back to the read time: {channel.stamps.fallbacks}" + (f" ({channel.stamps.reason})"
                                                                         if channel.stamps.fallbacks else ""))


if __name__ == "__main__":
    main()
