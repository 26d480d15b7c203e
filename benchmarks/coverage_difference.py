"""Coverage of the run comparison's interval (`harness report A B`): mean(B) − mean(A) over per-cycle values,
two-sample studentised bootstrap (analysis.stats.mean_difference_interval).

    .venv/bin/python benchmarks/coverage_difference.py [--reps 2000 --seed 0 --json]

Each repetition draws run A and run B with n cycles each from known per-cycle models (delays in ms, from the
emulator's profiles and the cases benchmarks/coverage.py uses), reduces them to per-cycle values as a run's
comparison does, and checks whether the stated 95 % interval holds the true difference of means (closed form).
Pairs: the same OCS model on both sides (no difference), a 25 ms switch against MixNet's measured OCS
(mean 44, p99 64), and a skewed lognormal (σ 0.6) against the OCS model; plus unequal cycle counts.
Binomial standard error of a coverage near 95 % with R repetitions: sqrt(.95·.05/R) (0.49 pp at R = 2000).
"""
from __future__ import annotations

import argparse
import json
import math
import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from analysis.delays import lognormal_from_mean_p99  # noqa: E402
from analysis.stats import mean_difference_interval  # noqa: E402



OCS = lognormal_from_mean_p99(44.0, 64.0)
FAST = lognormal_from_mean_p99(25.0, 30.0)
SKEWED = (math.log(40.0), 0.6)
MODELS = {"OCS 44/64": OCS, "switch 25/30": FAST, "skewed σ 0.6": SKEWED}
PAIRS = [("OCS 44/64", "OCS 44/64"), ("switch 25/30", "OCS 44/64"), ("OCS 44/64", "skewed σ 0.6")]


def mean_of(model) -> float:
    mu, s = MODELS[model]
    return math.exp(mu + s * s / 2)


def run(reps: int, seed: int, sizes=((10, 10), (20, 20), (80, 80), (10, 40))) -> list[dict]:
    rng = np.random.default_rng(seed)
    rows = []
    for a, b in PAIRS:
        truth = mean_of(b) - mean_of(a)
        for na, nb in sizes:
            hit = 0
            for r in range(reps):
                xa = rng.lognormal(*MODELS[a], size=na)
                xb = rng.lognormal(*MODELS[b], size=nb)
                lo, hi = mean_difference_interval(xa, xb, rng_seed=r)
                hit += lo <= truth <= hi
            rows.append({"A": a, "B": b, "cycles_A": na, "cycles_B": nb, "reps": reps, "coverage": hit / reps})
    return rows


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--reps", type=int, default=2000)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args()
    t0 = time.perf_counter()
    rows = run(args.reps, args.seed)
    if args.json:
        print(json.dumps(rows, indent=1))
        return
    print("| A | B | cycles A | cycles B | coverage of the 95 % interval of mean(B) − mean(A) |")
    print("|---|---|---:|---:|---:|")
    for r in rows:
        print(f"| {r['A']} | {r['B']} | {r['cycles_A']} | {r['cycles_B']} | {100 * r['coverage']:.1f} % |")
    se = math.sqrt(0.95 * 0.05 / args.reps)
    print(f"\nnominal 95 %; binomial SE ≈ {100 * se:.2f} pp at {args.reps} repetitions; "
          f"{time.perf_counter() - t0:.0f} s")


if __name__ == "__main__":
    main()
