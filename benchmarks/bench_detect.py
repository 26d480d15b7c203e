"""GLR-CUSUM / KT: Monte Carlo threshold, empirical false-alarm rate on fresh runs vs target, analytic
bounds, and detection delay after a shift (spec §4 prototype setting).

    .venv/bin/python benchmarks/bench_detect.py [--calib-runs 1000 --test-runs 2000 --alpha 0.05]

Setting: m = 4 classes, p0 = (.4,.3,.2,.1), n_t = 50 units/epoch, window W = 50, horizon T = 1000 epochs.
Calibration and test runs use independent seeds, so the test rate is an honest estimate; its binomial
standard error is printed next to it. Delay: shift to p1 = (.3,.3,.2,.2) at epoch 200, mean over runs,
next to Lorden's first-order h / (n_t KL(p1||p0)).
"""
from __future__ import annotations

import argparse
import json
import time

import numpy as np

from analysis.detect import GlrCusum, calibrate_threshold, false_alarm_rate, glr_statistics

P0 = np.array([0.4, 0.3, 0.2, 0.1])
P1 = np.array([0.3, 0.3, 0.2, 0.2])


def delay(h, variant, n, window, runs, seed, change=200, horizon=400):
    rng = np.random.default_rng(seed)
    counts = np.concatenate([rng.multinomial(n, P0, (runs, change)), rng.multinomial(n, P1, (runs, horizon - change))],
                            axis=1).astype(float)
    S = glr_statistics(counts, P0, window, variant)
    hit = S >= h
    first = np.where(hit.any(axis=1), hit.argmax(axis=1), horizon)
    ok = first >= change
    return float(np.mean(first[ok] - change + 1)), float(np.mean(~ok))


def main(argv=None):
    ap = argparse.ArgumentParser()
    ap.add_argument("--calib-runs", type=int, default=1000)
    ap.add_argument("--test-runs", type=int, default=2000)
    ap.add_argument("--alpha", type=float, default=0.05)
    ap.add_argument("--n", type=int, default=50)
    ap.add_argument("--window", type=int, default=50)
    ap.add_argument("--horizon", type=int, default=1000)
    ap.add_argument("--json", action="store_true")
    a = ap.parse_args(argv)
    kl = float(np.sum(P1 * np.log(P1 / P0)))
    rows = []
    for variant in ("glr", "kt"):
        t = time.perf_counter()
        cal = calibrate_threshold(P0, a.n, a.window, a.horizon, a.alpha, runs=a.calib_runs, seed=1, variant=variant)
        t_cal = time.perf_counter() - t
        fa = false_alarm_rate(P0, a.n, a.window, a.horizon, cal["threshold"], a.test_runs, seed=2, variant=variant)
        fa_b = false_alarm_rate(P0, a.n, a.window, a.horizon, cal["bound"], a.test_runs, seed=3, variant=variant)
        d_cal, fa_pre = delay(cal["threshold"], variant, a.n, a.window, 500, 4)
        d_b, _ = delay(cal["bound"], variant, a.n, a.window, 500, 5, horizon=600)
        rows.append({"variant": variant, "threshold_mc": cal["threshold"], "threshold_bound": cal["bound"],
                     "target_alpha": a.alpha, "fa_at_mc": fa, "fa_se": float(np.sqrt(a.alpha * (1 - a.alpha) / a.test_runs)),
                     "fa_at_bound": fa_b, "delay_at_mc": d_cal, "lorden_at_mc": cal["threshold"] / (a.n * kl),
                     "delay_at_bound": d_b, "lorden_at_bound": cal["bound"] / (a.n * kl),
                     "calibration_s": t_cal, "calib_runs": a.calib_runs, "test_runs": a.test_runs})
    if a.json:
        print(json.dumps(rows, indent=1))
        return rows
    print(f"m=4, n_t={a.n}, W={a.window}, T={a.horizon}; calibration {a.calib_runs} runs, test {a.test_runs} fresh runs")
    print("| variant | h (MC, 1-alpha quantile) | h (analytic bound) | target alpha | FA rate at h_MC (+-1 se) |"
          " FA rate at bound | delay at h_MC (Lorden) | delay at bound (Lorden) | calibration s |")
    print("|---|---|---|---|---|---|---|---|---|")
    for r in rows:
        print(f"| {r['variant']} | {r['threshold_mc']:.2f} | {r['threshold_bound']:.2f} | {r['target_alpha']:.3f} |"
              f" {r['fa_at_mc']:.4f} +- {r['fa_se']:.4f} | {r['fa_at_bound']:.4f} | {r['delay_at_mc']:.1f} ({r['lorden_at_mc']:.1f}) |"
              f" {r['delay_at_bound']:.1f} ({r['lorden_at_bound']:.1f}) | {r['calibration_s']:.1f} |")
    return rows


if __name__ == "__main__":
    main()
