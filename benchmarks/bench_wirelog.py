"""What a run's wire.log costs a switch command: TL1 RTRV-PATCH round trips through the driver against the
emulator (profile `instant`), without a wire log and with one (harness.logs.run_logs), interleaved in blocks
so machine load falls on both alike; and one wire record's cost alone.

    .venv/bin/python benchmarks/bench_wirelog.py [--count 2000]
"""
from __future__ import annotations

import argparse
import contextlib
import tempfile
import time

import numpy as np

from devices import wirelog
from devices.emulated.ocs_server import OcsServers
from devices.emulated.physics import OpticalBench
from devices.emulated.profile import load_profile
from devices.ocs import open_switch
from devices.resources import OcsResource
from harness import logs


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--count", type=int, default=2000)
    args = parser.parse_args()
    bench = OpticalBench(load_profile("instant"), seed=1).start()
    servers = OcsServers(bench, pty=False).start()
    host, port = servers.tl1_address
    switch = open_switch(OcsResource(name="o", protocol="polatis-tl1", url=f"tcp://{host}:{port}", size=(16, 16),
                                     allowed_ports=frozenset(range(1, 33)), user="admin", password="root"))
    times: dict[str, list[float]] = {"no wire log": [], "wire.log": []}
    with tempfile.TemporaryDirectory() as tmp:
        for block in range(20):
            for label in times:
                with logs.run_logs(tmp) if label == "wire.log" else contextlib.nullcontext():
                    for _ in range(args.count // 20):
                        started = time.perf_counter_ns()
                        switch.patches()
                        times[label].append((time.perf_counter_ns() - started) / 1e3)
        with logs.run_logs(tmp):
            reply = b"\r\n\r\n   POLATIS 26-12-06 05:17:01\r\nM  5 COMPLD\r\n;\r\n"
            started = time.perf_counter_ns()
            for i in range(args.count):
                wirelog.record(i, "tcp://127.0.0.1:3082", "<", reply)
            per_record = (time.perf_counter_ns() - started) / args.count / 1e3
    switch.close()
    servers.stop()
    bench.stop()
    for label, values in times.items():
        print(f"RTRV-PATCH round trip, {label}: p50 {np.percentile(values, 50):.1f} us, "
              f"p99 {np.percentile(values, 99):.1f} us (n={len(values)})")
    print(f"one wire record (a 5-line reply): {per_record:.1f} us")


if __name__ == "__main__":
    main()
