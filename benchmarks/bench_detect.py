"""GLR-CUSUM / KT: Monte Carlo threshold, empirical false-alarm rate on fresh runs vs target, analytic
bounds, and detection delay after a shift (spec §4 prototype setting).

    .venv/bin/python benchmarks/bench_detect.py [--calib-runs 1000 --test-runs 2000 --alpha 0.05]

Setting: m = 4 classes, p0 = (.4,.3,.2,.1), n_t = 50 units/epoch, window W = 50, horizon T = 1000 epochs.
Calibration and test runs use independent seeds, so the test rate is an honest estimate; its binomial
standard error is printed next to it. Delay: shift to p1 = (.3,.3,.2,.2) at epoch 200, mean over runs,
next to Lorden's first-order h / (n_t KL(p1||p0)).

    .venv/bin/python benchmarks/bench_detect.py --level-spread 40 [--runs 200 2000 --window 20 --horizon 200]

The realised false-alarm level of a calibrated threshold, P(alarm before T | H0), over K independent
calibrations: its range and its calibration error (RMS of realised - nominal), for each calibration size.
"known p0": `calibrate_threshold` under the true law (the Monte Carlo error alone); "reference, ...": what the
detectors do (`default_threshold` on `reference` epochs of H0 counts, p0 estimated from them), calibrated as
if the estimate were exact (`estimated=False`: the Monte Carlo error plus the plug-in error) or over the
estimate's error too (the default). Each threshold's realised level is measured on fresh H0 runs
of the detector it belongs to (`--test-runs`; their own binomial error is printed).
"""
from __future__ import annotations

import argparse
import json
import time

import numpy as np

from analysis.detect import calibrate_threshold, default_threshold, false_alarm_rate, glr_statistics

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


MODES = ("known p0", "reference, as if exact", "reference, estimate calibrated")


def level_spread(k: int, runs: int, mode: str, variant: str, n: int, window: int, horizon: int, alpha: float,
                 test_runs: int, reference: int, seed: int = 100) -> dict:
    """Realised level of k independently calibrated thresholds (see the module's docstring)."""
    rng = np.random.default_rng(seed)
    pool = None
    levels, se_cal = [], []
    for i in range(k):
        if mode == "known p0":
            cal = calibrate_threshold(P0, n, window, horizon, alpha, runs=runs, seed=rng.integers(2**63), variant=variant)
            if pool is None:    # one law for every threshold: one test pool
                pool = glr_statistics(rng.multinomial(n, P0, (test_runs, horizon)).astype(float), P0, window,
                                      variant).max(axis=1)
            levels.append(float(np.mean(pool >= cal["threshold"])))
        else:
            ref = rng.multinomial(n, P0, reference)
            cal = default_threshold(ref, window, horizon, alpha, variant, runs=runs, seed=rng.integers(2**63),
                                    estimated=mode.endswith("calibrated"))
            p_hat = ref.sum(axis=0) + 0.5    # the detector's own pre-change law (as default_threshold's)
            mx = glr_statistics(rng.multinomial(n, P0, (test_runs, horizon)).astype(float), p_hat, window,
                                variant).max(axis=1)
            levels.append(float(np.mean(mx >= cal["threshold"])))
        se_cal.append(cal["level_se"])
    lv = np.array(levels)
    return {"mode": mode, "variant": variant, "runs": runs, "k": k, "alpha": alpha, "min": float(lv.min()),
            "p5": float(np.quantile(lv, 0.05)), "median": float(np.median(lv)), "p95": float(np.quantile(lv, 0.95)),
            "max": float(lv.max()), "mean": float(lv.mean()), "rms_error": float(np.sqrt(np.mean((lv - alpha) ** 2))),
            "level_se_claimed": float(se_cal[0]), "test_se": float(np.sqrt(alpha * (1 - alpha) / test_runs))}


def main_spread(a) -> list[dict]:
    rows = [level_spread(a.level_spread, r, mode, v, a.n, a.window, a.horizon, a.alpha, a.test_runs, a.reference)
            for v in a.variants for mode in MODES for r in a.runs]
    if a.json:
        print(json.dumps(rows, indent=1))
        return rows
    print(f"m=4, n_t={a.n}, W={a.window}, T={a.horizon}, nominal alpha {a.alpha}; {a.level_spread} calibrations each;"
          f" realised level on {a.test_runs} fresh H0 runs per threshold (binomial se {rows[0]['test_se']:.4f});"
          f" reference = {a.reference} epochs")
    print("| variant | p0 | calibration runs | realised level min / p5 / median / p95 / max | mean |"
          " calibration error (RMS) | level_se stated |")
    print("|---|---|---|---|---|---|---|")
    for r in rows:
        print(f"| {r['variant']} | {r['mode']} | {r['runs']} | {r['min']:.3f} / {r['p5']:.3f} / {r['median']:.3f} /"
              f" {r['p95']:.3f} / {r['max']:.3f} | {r['mean']:.4f} | {r['rms_error'] * 100:.2f} pp |"
              f" {r['level_se_claimed'] * 100:.2f} pp |")
    return rows


def main(argv=None):
    ap = argparse.ArgumentParser()
    ap.add_argument("--calib-runs", type=int, default=1000)
    ap.add_argument("--test-runs", type=int, default=2000)
    ap.add_argument("--alpha", type=float, default=0.05)
    ap.add_argument("--n", type=int, default=50)
    ap.add_argument("--window", type=int, default=50)
    ap.add_argument("--horizon", type=int, default=1000)
    ap.add_argument("--json", action="store_true")
    ap.add_argument("--level-spread", type=int, default=0, metavar="K", help="K calibrations per row (see above)")
    ap.add_argument("--runs", type=int, nargs="+", default=[200, 2000], help="calibration runs (with --level-spread)")
    ap.add_argument("--variants", nargs="+", default=["kt", "glr"], choices=["kt", "glr"])
    ap.add_argument("--reference", type=int, default=10, help="reference epochs for p0 (with --level-spread)")
    a = ap.parse_args(argv)
    if a.level_spread:
        return main_spread(a)
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
