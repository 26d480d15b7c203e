"""Wiring optimizer vs exact MILP at n = 8 and 16 (objective gap and speed ratio).

    .venv/bin/python benchmarks/bench_wiring.py [--sizes 8 16 --seeds 0 1 2 --degree 4 --layers 2 --time-limit 600]

Two optimizer schedules: "accurate" (beta annealed 1 -> 10 -> 100 per median arc length, up to 400
iterations per phase) and "fast" (3 -> 30, 40 iterations per phase).

What each side solves (compare like with like):
- MILP (`exact_wiring_milp`, HiGHS): the integer problem at beta -> inf, b1 -> inf: min over integer circuits
  x (sum_{e ni i} x_e <= d_i) of the hard critical path (iteration time) of the DAG. Exact (to mip gap).
- Relaxation (`optimize_wiring`): min over w in P (fractional perfect b-matching polytope, x = M w) of
  U_beta + KL(w||q)/b1 with b1 = 1e6 / s and beta annealed to 100 / (typical arc length): a smooth,
  continuous problem. Its U_beta is not an integer wiring's time; it is turned into one by rounding
  (`round_wiring`, largest remainder) and then local search (`polish_wiring`, moves that add a circuit
  on the current critical path only). The gap we quote is
  hard critical path(rounded [+ polished] relaxation) vs MILP optimum, both as iteration times (s),
  and the time is the whole pipeline (optimize + round [+ polish]) vs the MILP's wall time.
Instance families (n endpoints, 100 Gb/s circuits, 25 Gb/s EPS fallback per pair, d ports per endpoint,
reconfiguration arcs at 45 ms, the same for every wiring):
- `moe`: `layers` MoE layers, 1 micro-batch, skewed all-to-all (gamma(0.6) bytes, n/2 hot pairs x6 per layer);
- `random`: `layers` layers, 1 micro-batch, each pair present with probability 1/2, uniform bytes (no skew);
- `pipeline`: 1 layer, 4 micro-batches, traffic between neighbouring stages i -> i+1 (activations) with a
  1/20 uniform background: a sparse pattern that a ring of circuits serves.
`--families` runs several; the summary prints one row per (family, n, schedule), and "auto" is what
`solve_wiring` returns: the MILP's own optimum up to EXACT_MAX_ENDPOINTS endpoints, the fast pipeline above.
"""
from __future__ import annotations

import argparse
import json
import time

import numpy as np

from analysis.dag import MoEConfig, build_training_dag
from analysis.wiring import EXACT_MAX_ENDPOINTS, PIPELINE_SCHEDULES, exact_wiring_milp, optimize_wiring, polish_wiring, round_wiring


FAMILIES = ("moe", "random", "pipeline")


def instance(n: int, degree: int, layers: int, seed: int = 0, family: str = "moe"):
    rng = np.random.default_rng(seed)
    micro = 1
    if family == "moe":
        D = rng.gamma(0.6, 20e6, (layers, n, n))
        for l in range(layers):                       # hot pairs (expert popularity skew)
            hot = rng.choice(n * n, n // 2, replace=False)
            D[l].flat[hot] *= 6
    elif family == "random":
        D = rng.uniform(0.0, 24e6, (layers, n, n)) * (rng.random((layers, n, n)) < 0.5)
    elif family == "pipeline":
        layers, micro = 1, 4
        D = rng.uniform(0.0, 2e6, (1, n, n))          # background
        i = np.arange(n - 1)
        D[0, i, i + 1] = rng.uniform(30e6, 50e6, n - 1)   # activations to the next stage
    else:
        raise ValueError(f"unknown family {family!r}; expected one of {FAMILIES}")
    np.einsum("lii->li", D)[:] = 0.0
    cfg = MoEConfig(num_layers=layers, micro_batches=micro, attn_fwd_s=4e-3, expert_fwd_s=6e-3,
                    aggregate_bwd_s=3e-3)
    dag = build_training_dag(D, cfg, b_ocs=12.5e9, b_eps=3.125e9)
    return dag, dag.to_wiring_problem(degree=degree, reconfig_delay=0.045)


SCHEDULES = PIPELINE_SCHEDULES   # (anneal betas, final beta, max iterations per phase, tol), betas per median arc


def run(n, degree, layers, time_limit, seed=0, schedules=("accurate", "fast"), family="moe"):
    dag, prob = instance(n, degree, layers, seed, family)
    milp = exact_wiring_milp(prob, time_limit=time_limit)
    T_milp = milp["makespan"]
    x_sym = round_wiring(prob.prior, prob.edges, prob.degree)
    ell = prob.lengths(np.ones(prob.num_edges))
    scale = float(np.median(ell[prob.arc_edge >= 0]))
    rows = []
    for name in schedules:
        betas, fb, iters, tol = SCHEDULES[name]
        t0 = time.perf_counter()
        res = optimize_wiring(prob, 1e6, fb / scale, anneal=tuple(b / scale for b in betas), max_iter=iters, tol=tol)
        t_opt = time.perf_counter() - t0
        t0 = time.perf_counter()
        x_r = round_wiring(res.w, prob.edges, prob.degree)
        t_round = time.perf_counter() - t0
        t0 = time.perf_counter()
        x_p, pinfo = polish_wiring(prob, x_r, neighborhood="critical", time_limit=60)
        t_pol = time.perf_counter() - t0
        out = {
            "family": family, "n": n, "seed": seed, "schedule": name, "edges": prob.num_edges, "degree": degree,
            "circuits": prob.num_circuits, "dag_arcs": int(prob.src.size),
            "relaxed_U_beta": float(res.U[-1]), "opt_iterations": res.iterations,
            "T_symmetric": prob.makespan(x_sym), "T_rounded": prob.makespan(x_r), "T_polished": pinfo["makespan"],
            "T_milp": T_milp, "milp_status": milp["message"], "milp_mip_gap": milp["mip_gap"],
            "t_optimize_s": t_opt, "t_round_s": t_round, "t_polish_s": t_pol, "polish_evals": pinfo["evals"],
            "t_milp_s": milp["seconds"],
        }
        out["gap_rounded"] = out["T_rounded"] / T_milp - 1
        out["gap_polished"] = out["T_polished"] / T_milp - 1
        out["speed_rounded"] = milp["seconds"] / (t_opt + t_round)
        out["speed_polished"] = milp["seconds"] / (t_opt + t_round + t_pol)
        # solve_wiring's choice: the MILP itself up to EXACT_MAX_ENDPOINTS, the fast pipeline above
        out["gap_auto"] = (milp["makespan"] / T_milp - 1) if n <= EXACT_MAX_ENDPOINTS else out["gap_polished"]
        rows.append(out)
    return rows


def summary(rows) -> list[dict]:
    """One row per (family, n, schedule): gap percentiles over seeds, seeds above 0 and 1 %, speed-ups."""
    out = []
    for key in sorted({(r["family"], r["n"], r["schedule"]) for r in rows}, key=lambda k: (FAMILIES.index(k[0]), *k[1:])):
        sub = [r for r in rows if (r["family"], r["n"], r["schedule"]) == key]
        pol, auto = (np.array([r[k] for r in sub]) * 100 for k in ("gap_polished", "gap_auto"))
        rnd = np.array([r["gap_rounded"] for r in sub]) * 100
        sp = np.array([r["speed_polished"] for r in sub])
        out.append({"family": key[0], "n": key[1], "schedule": key[2], "seeds": len(sub),
                    "rounded_p50": float(np.median(rnd)), "rounded_max": float(rnd.max()),
                    "polished_p50": float(np.median(pol)), "polished_p90": float(np.quantile(pol, 0.9)),
                    "polished_max": float(pol.max()), "above_0": int((pol > 1e-9).sum()), "above_1": int((pol > 1.0).sum()),
                    "auto_max": float(auto.max()), "speed_p10": float(np.quantile(sp, 0.1)),
                    "speed_p50": float(np.median(sp)), "speed_p90": float(np.quantile(sp, 0.9)),
                    "milp_s_p50": float(np.median([r["t_milp_s"] for r in sub])),
                    "pipeline_s_p50": float(np.median([r["t_optimize_s"] + r["t_round_s"] + r["t_polish_s"] for r in sub])),
                    "milp_not_optimal": sum("optimal" not in str(r["milp_status"]).lower() for r in sub)})
    return out


def main(argv=None):
    ap = argparse.ArgumentParser()
    ap.add_argument("--families", nargs="+", default=["moe"], choices=FAMILIES)
    ap.add_argument("--sizes", type=int, nargs="+", default=[8, 16])
    ap.add_argument("--degree", type=int, default=4)
    ap.add_argument("--layers", type=int, default=2)
    ap.add_argument("--time-limit", type=float, default=600.0)
    ap.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    ap.add_argument("--schedules", nargs="+", default=list(SCHEDULES), choices=list(SCHEDULES))
    ap.add_argument("--jsonl", metavar="FILE", help="append each row as it is done (a long run keeps its results)")
    ap.add_argument("--from-jsonl", metavar="FILE", help="only summarise the rows in FILE")
    ap.add_argument("--json", action="store_true")
    a = ap.parse_args(argv)
    if a.from_jsonl:
        with open(a.from_jsonl) as f:
            rows = [json.loads(line) for line in f if line.strip()]
    else:
        rows = []
        for fam in a.families:
            for n in a.sizes:
                for sd in a.seeds:
                    new = run(n, a.degree, a.layers, a.time_limit, sd, a.schedules, fam)
                    rows += new
                    if a.jsonl:
                        with open(a.jsonl, "a") as f:
                            f.writelines(json.dumps(r, default=str) + "\n" for r in new)
    if a.json:
        print(json.dumps(rows, indent=1, default=str))
        return rows
    if not a.from_jsonl:
        print("| family | n | seed | schedule | T_milp (ms) | rounded: gap | polished: gap | t_milp (s) |"
              " t_pipeline (s) | speed-up polished |")
        print("|---|---|---|---|---|---|---|---|---|---|")
        for r in rows:
            print(f"| {r['family']} | {r['n']} | {r['seed']} | {r['schedule']} | {r['T_milp'] * 1e3:.2f} |"
                  f" {r['gap_rounded'] * 100:+.2f} % | {r['gap_polished'] * 100:+.2f} % | {r['t_milp_s']:.2f} |"
                  f" {r['t_optimize_s'] + r['t_round_s'] + r['t_polish_s']:.3f} | {r['speed_polished']:.0f}x |")
        print()
    print("| family | n | schedule | seeds | rounded gap p50 / max | polished gap p50 / p90 / max | seeds > 0 / > 1 % |"
          " solve_wiring gap max | MILP / pipeline s (p50) | speed-up p10 / p50 / p90 | MILP not optimal |")
    print("|---|---|---|---|---|---|---|---|---|---|---|")
    for s in summary(rows):
        print(f"| {s['family']} | {s['n']} | {s['schedule']} | {s['seeds']} | {s['rounded_p50']:.2f} / {s['rounded_max']:.2f} % |"
              f" {s['polished_p50']:.2f} / {s['polished_p90']:.2f} / {s['polished_max']:.2f} % |"
              f" {s['above_0']} / {s['above_1']} | {s['auto_max']:.2f} % | {s['milp_s_p50']:.2f} / {s['pipeline_s_p50']:.3f} |"
              f" {s['speed_p10']:.0f}x / {s['speed_p50']:.0f}x / {s['speed_p90']:.0f}x | {s['milp_not_optimal']} |")
    return rows


if __name__ == "__main__":
    main()
