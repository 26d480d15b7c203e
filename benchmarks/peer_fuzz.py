"""Long fuzz run of misbehaving peers against the TL1 and SCPI drivers; outcomes by class.

    python benchmarks/peer_fuzz.py [--examples 300] [--timeout 0.3] [--seed 1]

Each example: a fresh driver session against a HostilePeer playing a hypothesis-generated behaviour
(devices/emulated/peer_behaviours.py; pauses up to 0.5 s), one `patches()` call. Prints, per protocol,
how many calls ended in each class (`ok`, a DeviceError subclass, or `CONTRACT:...` — a broken contract:
a bare exception, an impossible state believed, a late return), call time p50/p99/max, and the peak
memory traced per call (driver and peer together) and over the run, RSS before/after. Exit 1 if any contract was broken.
"""
from __future__ import annotations

import argparse
import collections
import resource
import sys
import tracemalloc
from pathlib import Path

import numpy as np
from hypothesis import HealthCheck, given, seed as hypothesis_seed, settings

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from devices.emulated.hostile_peer import HostilePeer  # noqa: E402
from devices.emulated.peer_behaviours import behaviours, outcome_of  # noqa: E402


def _rss_mb() -> float:
    with open("/proc/self/status") as status:
        for line in status:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


def run(dialect: str, examples: int, timeout_s: float, seed: int) -> bool:
    outcomes: collections.Counter[str] = collections.Counter()
    times: list[float] = []
    broken: list[str] = []
    call_peaks: list[float] = []  # MiB allocated at the peak of each call (driver and peer together)
    with HostilePeer(lambda command: [], dialect) as peer:
        @settings(max_examples=examples, deadline=None, database=None, derandomize=False,
                  suppress_health_check=list(HealthCheck), phases=["generate"])
        @hypothesis_seed(seed)
        @given(behaviour=behaviours(dialect, long_pauses=True))
        def one(behaviour):
            base = tracemalloc.get_traced_memory()[0]
            tracemalloc.reset_peak()
            kind, elapsed, _ = outcome_of(peer, dialect, behaviour, timeout_s)
            call_peaks.append((tracemalloc.get_traced_memory()[1] - base) / 2**20)
            outcomes[kind.split(":")[0] if not kind.startswith("CONTRACT") else kind] += 1
            times.append(elapsed)
            if kind.startswith("CONTRACT"):
                broken.append(f"{kind} <- {behaviour!r:.300}")

        rss_before = _rss_mb()
        tracemalloc.start()
        one()
        peak = tracemalloc.get_traced_memory()[1] / 2**20
        tracemalloc.stop()
        rss_after = _rss_mb()
    t = np.array(times) * 1e3
    print(f"{dialect}: {len(times)} calls, timeout {timeout_s} s; outcomes: "
          + ", ".join(f"{k} {v}" for k, v in outcomes.most_common()))
    print(f"  call time ms p50 {np.percentile(t, 50):.0f}, p99 {np.percentile(t, 99):.0f}, max {t.max():.0f}; "
          f"per-call traced peak p99 {np.percentile(call_peaks, 99):.1f}, max {max(call_peaks):.1f} MiB, "
          f"whole run {peak:.1f} MiB; RSS {rss_before:.0f} -> {rss_after:.0f} MiB")
    for line in broken[:20]:
        print("  BROKEN", line)
    return not broken


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--examples", type=int, default=300)
    parser.add_argument("--timeout", type=float, default=0.3)
    parser.add_argument("--seed", type=int, default=1)
    args = parser.parse_args()
    ok = [run(dialect, args.examples, args.timeout, args.seed) for dialect in ("tl1", "scpi")]
    return 0 if all(ok) else 1


if __name__ == "__main__":
    sys.exit(main())
