"""How late a re-pairing's new circuit starts after the OCS command, over the TL1 driver and the emulated switch.

    .venv/bin/python benchmarks/bench_tl1_pipeline.py [--applies 200]

Each `apply` re-pairs 8 ingresses (a DLT-PATCH of the old patches, an ENT-PATCH list of the new ones) on a
switch whose mirrors take 5 ms (dark 0.2 ms). Printed: the ground truth's first `mirror_settled` − 5 ms − the
driver's `sent_ns`, i.e. when the switch began the ENT-PATCH, after the command went out. With DLT and ENT
pipelined this is the wire and the server's stamp (µs); sent one after the other it is the DLT's round trip,
which a loaded machine stretches.
"""
from __future__ import annotations

import argparse
import dataclasses

import numpy as np

from devices.emulated.ocs_server import OcsServers
from devices.emulated.physics import OpticalBench
from devices.emulated.profile import Delay, load_profile
from devices.ocs import open_switch
from devices.resources import OcsResource

SWITCH_NS = 5_000_000


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--applies", type=int, default=200)
    args = parser.parse_args()
    profile = dataclasses.replace(load_profile("instant"),
                                  ocs={"switch": Delay.fixed(SWITCH_NS / 1e9), "dark": Delay.fixed(0.0002)})
    bench = OpticalBench(profile).start()
    servers = OcsServers(bench, pty=False).start()
    host, port = servers.tl1_address
    switch = open_switch(OcsResource(name="ocs1", protocol="polatis-tl1", url=f"tcp://{host}:{port}", size=(16, 16),
                                     allowed_ports=frozenset(range(1, 33)), user="admin", password="root"),
                         timeout_s=10)
    late_ms = []
    try:
        for k in range(args.applies + 1):
            shift = k % 7 + 1
            before = len(bench.ground_truth())
            timing = switch.apply({i: 17 + (i - 1 + shift) % 8 for i in range(1, 9)}, exclusive=True)
            bench.wait_idle()
            settled = [t["t_ns"] for t in bench.ground_truth()[before:] if t["stage"] == "mirror_settled"]
            if k:  # the first apply has nothing to delete
                late_ms.append((min(settled) - SWITCH_NS - timing.sent_ns) / 1e6)
    finally:
        switch.close()
        servers.stop()
        bench.stop()
    p50, p90, p99 = np.percentile(late_ms, [50, 90, 99])
    print(f"{len(late_ms)} re-pairings: the ENT-PATCH began {p50:.3f} ms (p50), {p90:.3f} (p90), {p99:.3f} (p99), "
          f"{max(late_ms):.3f} (max) after the command")


if __name__ == "__main__":
    main()
