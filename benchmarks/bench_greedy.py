"""MixNet greedy circuits: lazy heap vs the literal argmax loop, greedy/exact gap, claim-evaluation cost.

Run: .venv/bin/python benchmarks/bench_greedy.py [--quick] [--table]
Prints p50/p99 wall times and ratios; no assertions. `--table` prints only the per-model iteration time at
constant delays 0 / 25 ms / 45 ms / 5.7 s (defaults, then the released simulator's overlap and policy).
"""
from __future__ import annotations

import argparse
import time

import numpy as np

from analysis import claims, mixnet as mx


def _timed(fn, reps: int) -> np.ndarray:
    out = np.empty(reps)
    for k in range(reps):
        t = time.perf_counter()
        fn()
        out[k] = time.perf_counter() - t
    return out


def _ms(a: np.ndarray) -> str:
    return f"p50 {np.percentile(a, 50) * 1e3:8.3f} ms  p99 {np.percentile(a, 99) * 1e3:8.3f} ms"


def bench_heap_vs_argmax(quick: bool) -> None:
    print("== greedy_circuits: sorted walk + heap vs literal argmax loop (alpha = 6, U(0,1) symmetric demand)")
    rng = np.random.default_rng(0)
    for n in (8, 16, 32) if quick else (8, 16, 32, 64, 128, 512):
        upper = np.triu(rng.random((n, n)), 1)
        d = upper + upper.T
        reps = 20 if quick else 50
        heap = _timed(lambda: mx.greedy_circuits(d, 6, 1.0, 0.5, method="heap"), reps)
        literal = _timed(lambda: mx.greedy_circuits(d, 6, 1.0, 0.5, method="argmax"), reps)
        same = np.array_equal(mx.greedy_circuits(d, 6, 1.0, 0.5), mx.greedy_circuits(d, 6, 1.0, 0.5,
                                                                                       method="argmax"))
        print(f"n={n:4d}  heap {_ms(heap)}   argmax {_ms(literal)}   "
              f"speed-up {np.median(literal) / np.median(heap):6.1f}x  identical={same}")


def bench_gap(quick: bool) -> None:
    print("== greedy / exact all-to-all time on random U(0,1) instances (B_ocs = 1, B_eps = 0.5)")
    cases = [(300, 4, 2, "brute"), (100 if quick else 300, 5, 2, "milp"), (30 if quick else 100, 6, 3, "milp"),
             (30 if quick else 100, 8, 6, "milp")]              # the last: a MixNet region (alpha = 6)
    for n_inst, n, ports, method in cases:
        for compat in (False, True):
            t = time.perf_counter()
            rep = mx.greedy_gap_report(n_inst, n, ports, 1.0, 0.5, seed=0, method=method, code_compat=compat)
            print(f"n={n} ports={ports} {n_inst:3d} instances ({method:5s}) code_compat={compat!s:5}: "
                  f"worst {rep['worst_ratio']:.3f}  mean {rep['mean_ratio']:.3f}  p99 {rep['p99_ratio']:.3f}  "
                  f"optimal {rep['fraction_optimal']:.0%}  [{time.perf_counter() - t:.1f} s]")


def bench_claims(quick: bool) -> None:
    print("== evaluate_claims on the default models x {100, 400} Gb/s, default assumption grid")
    rng = np.random.default_rng(1)
    shared = rng.lognormal(np.log(0.043), 0.17, 20)     # 20 cycles shaped like the MixNet prototype's OCS
    per_port = shared[:, None] + rng.lognormal(np.log(5.6), 0.05, (20, 8))
    delays = mx.CycleDelays(per_port, shared, "synthetic")
    measured = {"ocs": mx.CycleDelays(shared[:, None] + 5e-5, shared, "synthetic"), "total": delays}
    n_boot = 50 if quick else 200
    grid = claims.assumption_grid(None, claims.Assumptions())
    for workers in (1, 2):
        t = time.perf_counter()
        out = claims.evaluate_claims(measured, setup=claims.Setup(n_boot=n_boot), grid=grid, max_workers=workers)
        print(f"{len(grid)} grid points, n_boot={n_boot}, n_reps=32, workers={workers}: "
              f"{time.perf_counter() - t:.1f} s; verdicts: "
              + ", ".join(f"{c['id']}={c['verdict']} {' or '.join(c['conditions'])}".rstrip() for c in out["claims"]))


def print_delay_table(**scenario_options) -> None:
    """T_ft and T_mix at d = 0 / 25 ms / 45 ms (OCS-like) / 5.7 s (NIC-like) with the break-even d*."""
    label = ", ".join(f"{k}={v}" for k, v in scenario_options.items()) or "defaults"
    print(f"== iteration time vs constant reconfiguration delay ({label}); d*: T_mix(d*) = 1.05 x T_ft")
    print(f"{'model':18s} {'link':>4s} {'T_ft s':>8s} {'d=0':>8s} {'25 ms':>8s} {'45 ms':>8s} {'5.7 s':>9s} "
          f"{'x T_ft at 25ms':>14s} {'d* ms':>8s} {'paper':>6s}")
    scenarios = claims.build_scenarios(seed=0, **scenario_options)
    for row in claims.delay_table(scenarios, (0.0, 0.025, 0.045, 5.7)):
        d_star = "inf" if row["break_even_never_reached"] else \
            "-" if row["break_even_ms"] is None else f"{row['break_even_ms']:.1f}"
        paper = "-" if row["paper_reported_ratio"] is None else f"{row['paper_reported_ratio']:.3f}"
        print(f"{row['model']:18s} {row['link_gbps']:4d} {row['t_fat_tree_s']:8.3f} "
              + " ".join(f"{t:8.3f}" for t in row["t_mixnet_s"][:3]) + f" {row['t_mixnet_s'][3]:9.1f} "
              f"{row['ratio'][1]:14.3f} {d_star:>8s} {paper:>6s}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="fewer sizes and instances")
    parser.add_argument("--table", action="store_true", help="only the per-model delay table")
    args = parser.parse_args()
    if args.table:
        print_delay_table()
        print_delay_table(overlap="simulator", reconfigure="always")
        return
    bench_heap_vs_argmax(args.quick)
    bench_gap(args.quick)
    bench_claims(args.quick)


if __name__ == "__main__":
    main()
