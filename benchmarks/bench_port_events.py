"""One port's events built at a cycle's end (`CycleEvents.port`: bounds, events, their encodings), per shape.

A cycle's end builds the ports whose last observation came in its final batch of host lines (8 x 8: median 8,
p90 ~50-64 of 64), on the critical path between cycles. Each observation was bounded as it arrived (as
`CycleWatch` does), so what is timed is what the cycle's end does: the port's bounds, events and encodings.

    .venv/bin/python benchmarks/bench_port_events.py [--builds 2000] [--repeats 9] [--profile SHAPE]

Shapes: `all-seen` (7 kept observations with the losing side's two, 3 not-yet), `between-polls` (phy_up passed
between two polls), `contradiction` (a stage implied with contradicting bounds: a fault), `not-lit` (only the
side that loses light). Prints per-port µs, p50 (and min, max) over the repeats; then the whole of a cycle's
end for 8 x 8 ports, all `all-seen`, built while the cycle waited and 0, 8 (the median) or 64 (p90) of them
built again at its end (`cycle_events`: gathering their observations, the ready ports' checks, the OCS events).
"""
from __future__ import annotations

import argparse
import cProfile
import pstats
import statistics
import sys
import time
from dataclasses import replace
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from analysis.stages import PORT_CHAIN  # noqa: E402
from harness.bench.stages import Arrivals, CycleEvents, PortRef, cycle_events  # noqa: E402
from harness.eventlog import encode  # noqa: E402
from harness.bench.hosts import Observation  # noqa: E402

MS = 1_000_000
PORT = PortRef("gpu1:eth0", "gpu1", "eth0", "mlx5_0", 3)


def _watch(field: str, value: str, at_ns: int, poll_ns: int = 200_000) -> Observation:
    return Observation("watch", PORT.host, PORT.netdev, field, value, at_ns, poll_ns, 0)


LOSING = {"light_lost": _watch("rx_los", "1", 101 * MS), "port_down": _watch("carrier", "0", 102 * MS)}
CHAIN_SEEN = {
    "light_detected": _watch("rx_los", "0", 110 * MS),
    "cdr_locked": _watch("rx_lol", "0", 111 * MS),
    "phy_up": _watch("carrier", "1", 115 * MS),
    "port_active": _watch("state", "ACTIVE", 120 * MS),
    "first_packet": Observation("probe", PORT.host, PORT.netdev, "first", "aa:bb:cc:dd:ee:ff 12", 121 * MS,
                                100_000, 0),
}
NOT_YET = {
    "light_detected": _watch("rx_los", "1", 109 * MS),
    "cdr_locked": _watch("rx_lol", "1", 110 * MS + 500_000),
    "phy_up": _watch("carrier", "0", 114 * MS),
}
# shape -> (kept, not_yet, done_ns)
SHAPES = {
    "all-seen": (LOSING | CHAIN_SEEN, NOT_YET, 200 * MS),
    "between-polls": (LOSING | {s: o for s, o in CHAIN_SEEN.items() if s != "phy_up"},
                      {s: o for s, o in NOT_YET.items() if s != "phy_up"}, 200 * MS),
    # phy_up still down at 116 ms, yet port ACTIVE by 115.2 ms: phy_up is implied with an empty interval
    "contradiction": (LOSING | {s: o for s, o in CHAIN_SEEN.items() if s != "phy_up"} |
                      {"port_active": _watch("state", "ACTIVE", 115 * MS)},
                      {s: o for s, o in NOT_YET.items() if s != "phy_up"} | {"phy_up": _watch("carrier", "0", 116 * MS)},
                      200 * MS),
    "not-lit": (LOSING, {}, 200 * MS),
}


def convert(host: str, host_ns: int) -> tuple[int, int, int]:
    return host_ns - 5 * MS, 5 * MS, 30_000


def prepared(kept: dict, not_yet: dict) -> CycleEvents:
    """The cycle's events with every observation bounded as it arrived, nothing built yet."""
    built = CycleEvents("run", 1, {PORT.key: PORT}, 100 * MS, convert, encode=encode)
    for obs in [*kept.values(), *not_yet.values()]:
        built.bound(obs)
    return built


def per_port_us(shape: str, builds: int) -> tuple[float, int, int]:
    kept, not_yet, done_ns = SHAPES[shape]
    built = prepared(kept, not_yet)
    port, forget = built.port, built._built.clear
    start = time.perf_counter_ns()
    for version in range(builds):
        forget()
        events, _ = port(PORT.key, version, kept, not_yet, done_ns)
    elapsed = time.perf_counter_ns() - start
    return elapsed / builds / 1e3, len(events), sum(e.stage == "fault" for e in events)


def pod_ports(hosts: int = 8, nics: int = 8) -> tuple[dict[str, PortRef], Arrivals]:
    """hosts x nics ports, each with the `all-seen` shape's observations, as the cycle's arrivals."""
    kept, not_yet, done_ns = SHAPES["all-seen"]
    ports, arrivals = {}, Arrivals(done_ns=done_ns)
    for h in range(1, hosts + 1):
        for n in range(nics):
            port = PortRef(f"gpu{h}:eth{n}", f"gpu{h}", f"eth{n}", f"mlx5_{n}", (h - 1) * nics + n + 1)
            ports[port.key] = port
            for table, mine in ((arrivals.kept, kept), (arrivals.not_yet, not_yet)):
                table.update({(port.key, s): replace(o, host=port.host, netdev=port.netdev) for s, o in mine.items()})
    return ports, arrivals


def cycle_end_us(ports: dict[str, PortRef], arrivals: Arrivals, rebuilt: int) -> float:
    """`cycle_events` at a cycle's end, every port built while the cycle waited and `rebuilt` of them changed."""
    built = CycleEvents("run", 1, ports, 100 * MS, convert, encode=encode)
    versions = {}
    for i, key in enumerate(ports):
        kept = {s: o for (k, s), o in arrivals.kept.items() if k == key}
        not_yet = {s: o for (k, s), o in arrivals.not_yet.items() if k == key}
        for obs in [*kept.values(), *not_yet.values()]:
            built.bound(obs)
        built.port(key, 0, kept, not_yet)
        versions[key] = 1 if i < rebuilt else 0  # a later observation: built again at the end
    start = time.perf_counter_ns()
    cycle_events("run", 1, ports, "ocs1", 100 * MS, 101 * MS, arrivals, convert, PORT_CHAIN, built, versions)
    elapsed = time.perf_counter_ns() - start
    assert built.rebuilt == rebuilt
    return elapsed / 1e3


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--builds", type=int, default=2000, help="port builds per repeat")
    parser.add_argument("--repeats", type=int, default=9)
    parser.add_argument("--shape", choices=sorted(SHAPES), action="append", help="(default: every shape)")
    parser.add_argument("--profile", choices=sorted(SHAPES), help="cProfile one shape's builds instead")
    args = parser.parse_args()
    if args.profile:
        profile = cProfile.Profile()
        profile.runcall(per_port_us, args.profile, args.builds)
        pstats.Stats(profile).sort_stats("tottime").print_stats(14)
        return 0
    for shape in args.shape or SHAPES:
        per_port_us(shape, args.builds // 10)  # warm
        runs = [per_port_us(shape, args.builds) for _ in range(args.repeats)]
        us = [r[0] for r in runs]
        _, events, faults = runs[0]
        print(f"{shape:<14} per port p50 {statistics.median(us):6.1f} us  (min {min(us):5.1f}, max {max(us):5.1f};"
              f" {events} events, {faults} faults; {args.repeats} x {args.builds} builds)")
    ports, arrivals = pod_ports()
    for rebuilt in (0, 8, len(ports)):
        us = [cycle_end_us(ports, arrivals, rebuilt) for _ in range(args.repeats * 10)]
        print(f"cycle's end, {len(ports)} ports, {rebuilt:>2} built again: p50 {statistics.median(us):7.1f} us "
              f"(min {min(us):6.1f}; {len(us)} cycles)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
