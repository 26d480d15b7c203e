"""ClockTracker.add cost against the number of samples already in the segment (it must not grow).

    .venv/bin/python benchmarks/bench_clock_fit.py [--samples 12000]
"""
from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from harness.clock import ClockSample, ClockTracker  # noqa: E402


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--samples", type=int, default=12_000)
    args = parser.parse_args()
    rng = np.random.default_rng(1)
    tracker = ClockTracker("h")
    epoch, t = 1_764_000_000 * 10**9, 10**12
    costs = []
    for i in range(args.samples):
        t += 40_000_000 + int(rng.integers(0, 1_000_000))
        delay = 150_000 + int(rng.exponential(50_000))
        offset = epoch - 20_000_000 + round(7e-6 * (t - 10**12)) + int(rng.integers(-delay // 2, delay // 2))
        sample = ClockSample(t_ns=t, offset_ns=offset, delay_ns=delay, uncertainty_ns=delay // 2 + 1001)
        start = time.perf_counter_ns()
        tracker.add(sample)
        costs.append(time.perf_counter_ns() - start)
    costs = np.array(costs) / 1e3
    for lo, hi in ((1, 10), (90, 110), (args.samples - 1000, args.samples)):
        part = costs[lo:hi]
        print(f"samples {lo:>6}-{hi:<6}: add p50 {np.median(part):7.1f} us, p99 {np.percentile(part, 99):7.1f} us")
    lookups = []
    for k in range(2000):
        host_ns = int(tracker.segments[0].first_t + rng.integers(0, t - tracker.segments[0].first_t)) + epoch
        start = time.perf_counter_ns()
        tracker.to_harness(host_ns)
        lookups.append(time.perf_counter_ns() - start)
    print(f"to_harness anywhere in the run: p50 {np.median(lookups) / 1e3:.1f} us, "
          f"p99 {np.percentile(lookups, 99) / 1e3:.1f} us; steps {len(tracker.steps)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
