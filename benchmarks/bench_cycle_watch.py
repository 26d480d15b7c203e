"""A cycle's host lines fed through `CycleWatch` (with `CycleEvents`, as the turnaround step feeds them), per line.

The step's thread feeds every line of a cycle's final burst before the cycle can end, so its cost per line is
on the critical path. The cycle here is an 8 x 8 pod's as the emulated burst-mode bench prints it: per port the
side losing light (rx_los 1, rx_lol 1, carrier 0, state DOWN in one poll) and the side gaining it (rx_los 0 and
rx_lol 0, then carrier 1, then state ACTIVE, one poll each), then its first probe; the watch fields that mark no
stage (operstate, phys_state) are not fed, as the log does not queue them. Prints µs per line (p50, min, max
over the repeats) and the cycle's events built at its end for comparison (`cycle_events`, every port).

    .venv/bin/python benchmarks/bench_cycle_watch.py [--hosts 8] [--nics 8] [--repeats 9]
"""
from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from analysis.stages import PORT_CHAIN  # noqa: E402
from harness.bench.observe import CycleWatch  # noqa: E402
from harness.bench.scripted import ScriptedObservations  # noqa: E402
from harness.bench.stages import CycleEvents, PortRef, cycle_events  # noqa: E402
from harness.eventlog import encode  # noqa: E402

MS = 1_000_000
SENT = 100 * MS


def cycle(hosts: int, nics: int) -> tuple[ScriptedObservations, dict[str, PortRef], dict[str, str]]:
    """The cycle's lines in arrival order (each host's polls interleaved as they come), its ports, their peers' MACs."""
    script = ScriptedObservations()
    ports, macs, polls = {}, {}, []
    for h in range(hosts):
        host = f"gpu{h + 1}"
        for n in range(nics):
            netdev = f"ens{n + 1}f0np0"
            key = f"{host}:{netdev}"
            ports[key] = PortRef(key, host, netdev, f"mlx5_{n}", h * nics + n + 1)
            macs[key] = f"02:00:00:00:{h:02x}:{n:02x}"
            down = SENT + 400_000 + h * 10_000
            up = SENT + 25 * MS + (n * 80_000) % 600_000 + h * 7_000
            polls += [(down, h, host, netdev, [("rx_los", "1"), ("rx_lol", "1"), ("carrier", "0"), ("state", "DOWN")]),
                      (up, h, host, netdev, [("rx_los", "0"), ("rx_lol", "0")]),
                      (up + 200_000, h, host, netdev, [("carrier", "1")]),
                      (up + 400_000, h, host, netdev, [("state", "ACTIVE")]),
                      (up + 500_000, h, host, netdev, None)]
    for at, _, host, netdev, fields in sorted(polls, key=lambda p: (p[0], p[1])):
        if fields is None:
            script.probe(host, netdev, macs[f"{host}:{netdev}"], at)
        for field, value in fields or ():
            script.watch(host, netdev, field, value, at)
    return script, ports, macs


def feed_once(script, ports, macs) -> tuple[float, CycleWatch, CycleEvents]:
    port_of = {(p.host, p.netdev): k for k, p in ports.items()}
    built = CycleEvents("bench", 1, ports, SENT, script.convert, PORT_CHAIN, lambda host: 0, encode)
    watch = CycleWatch({k: set(PORT_CHAIN) for k in ports}, port_of, SENT, SENT + 25 * MS, script.convert,
                       peer_mac=macs, chain=PORT_CHAIN, events=built)
    feed, items = watch.feed, script.items
    began = time.perf_counter_ns()
    for obs in items:
        feed(obs)
    return (time.perf_counter_ns() - began) / len(items) / 1e3, watch, built


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--hosts", type=int, default=8)
    ap.add_argument("--nics", type=int, default=8)
    ap.add_argument("--repeats", type=int, default=9)
    args = ap.parse_args()
    script, ports, macs = cycle(args.hosts, args.nics)
    per_line, ends = [], []
    for _ in range(args.repeats):
        for _ in range(20):  # rounds per repeat: a repeat's figure is their median
            us, watch, built = feed_once(script, ports, macs)
            per_line.append(us)
        arrivals = watch.result(SENT + 40 * MS)
        assert not arrivals.missing and len(arrivals.kept) == len(ports) * 7, arrivals.missing
        began = time.perf_counter_ns()
        events, _ = cycle_events("bench", 1, ports, "ocs1", SENT, SENT + 25 * MS, arrivals, script.convert,
                                 PORT_CHAIN, built, watch.version)
        ends.append((time.perf_counter_ns() - began) / 1e3)
    print(f"{len(script.items)} lines, {len(ports)} ports: feed per line p50 {statistics.median(per_line):.2f} us "
          f"(min {min(per_line):.2f}, max {max(per_line):.2f}; {args.repeats} x 20 cycles)")
    print(f"every port's events built at the cycle's end: p50 {statistics.median(ends):.0f} us "
          f"({len(events)} events)")


if __name__ == "__main__":
    main()
