"""Emulated physics per reconfiguration: CPU time to run one all-ports reconfiguration (release, settle, bring-up,
first packets) of an N-port bench, with a fake clock so that only the physics' own work is timed.

    .venv/bin/python benchmarks/bench_physics.py [--ports 128 1024 2048 --cycles 3]

Per cycle every port's circuit moves (remove all, then patch to the next neighbour) with probes running, so
every port goes dark, re-lights, trains and gets its first packet. Reported: median CPU ms per cycle, actions
run, and whether all first packets arrived.
"""
from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from devices.emulated.physics import OpticalBench  # noqa: E402
from devices.emulated.profile import load_profile, profile_from_dict  # noqa: E402


def bench_cycle_times(ports: int, cycles: int, per_host: int = 8) -> dict:
    base = load_profile("burst-mode")
    spec = {"name": "bench", "ocs": {k: d.spec for k, d in base.ocs.items()},
            "nic": {k: d.spec for k, d in base.nic.items()},
            "topology": {"hosts": ports // per_host, "nics_per_host": per_host, "ocs_size": [ports, ports]}}
    now = [10**12]
    bench = OpticalBench(profile_from_dict(spec), seed=1, clock=lambda: now[0])
    nics = bench.all_nic_ports()
    for p in nics:
        bench.probe_start(p.host, p.netdev, 100_000)
    times, firsts = [], []
    for c in range(cycles):
        mapping = {p.ocs_tx: nics[(i + 1 + c) % len(nics)].ocs_rx for i, p in enumerate(nics)}
        t0 = time.process_time()
        if c:
            bench.ocs_apply({}, removes=list(mapping))
        bench.ocs_apply(mapping)
        now[0] += 200_000_000  # 200 ms later: everything of this cycle is due
        truth = bench.ground_truth()  # a reader runs what is due
        times.append(time.process_time() - t0)
        firsts.append(sum(1 for t in truth if t["stage"] == "first_packet"))
    times.sort()
    return {"ports": ports, "cycle_ms_median": 1e3 * times[len(times) // 2], "actions": bench.lateness()["n"],
            "first_packets_last_cycle": firsts[-1] - (firsts[-2] if len(firsts) > 1 else 0)}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--ports", type=int, nargs="+", default=[128, 1024, 2048])
    ap.add_argument("--cycles", type=int, default=3)
    args = ap.parse_args()
    print("| ports | CPU per cycle (ms, median) | actions run | first packets in the last cycle |")
    print("|---:|---:|---:|---:|")
    for n in args.ports:
        r = bench_cycle_times(n, args.cycles)
        print(f"| {n} | {r['cycle_ms_median']:.1f} | {r['actions']} | {r['first_packets_last_cycle']} |")


if __name__ == "__main__":
    main()
