"""The Spectrum-X link-failure table from the fabric model alone (analysis/fabric.py), not from a bench:
10 % of the leaf–spine links failed, ECMP vs spraying vs adaptive routing, 2 and 4 planes per NIC.

    .venv/bin/python benchmarks/fabric_study.py [--draws 40 --seed 13 --endpoints 20 --per-leaf 4 --spines 4]

Pod: `endpoints` NICs at 800 Gb/s (ConnectX-8), `per_leaf` per leaf, `spines` per plane (a 1:1 leaf); a
uniform all-to-all of 256 MiB per rank. Each draw pulls a fresh seeded ceil(10 %) of the fabric links: the
draw is the unit (intervals over draws; the intact fabric is one value). Per row: busBW / line (line = the
NIC's physical rate) intact and failed, bandwidth kept ÷ raw surviving capacity (median draw and range),
p50 / p99 inflation of the all-to-all time with their intervals (analysis.linkfail.inflation_interval).
"""
from __future__ import annotations

import argparse
import math
import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from analysis import fabric as fb  # noqa: E402
from analysis import linkfail as lf  # noqa: E402


def interval(iv: dict) -> str:
    if iv["ci"] is not None:
        return f"{iv['ci'][0]:.3f}–{iv['ci'][1]:.3f}"
    if iv["lower"] is not None:
        return f"≥ {iv['lower']:.3f} (two ends need {iv['needs_n']})"
    return f"none: needs ≥ {iv['needs_n']} draws"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--draws", type=int, default=40)
    ap.add_argument("--seed", type=int, default=13)
    ap.add_argument("--endpoints", type=int, default=20)
    ap.add_argument("--per-leaf", type=int, default=4)
    ap.add_argument("--spines", type=int, default=4)
    ap.add_argument("--fail-pct", type=float, default=10.0)
    ap.add_argument("--qps", type=int, default=1)
    args = ap.parse_args()
    t0 = time.perf_counter()
    rank_bytes = 256 * 2**20
    print("| planes | load balancing | fabric links | failed | busBW/line intact | busBW/line failed (median) | "
          "kept ÷ surviving (median, range) | p50 ÷ 0 % [95 %] | p99 ÷ 0 % [95 %] |")
    print("|---:|---|---:|---:|---:|---:|---:|---|---|")
    for planes in (2, 4):
        fabric = fb.LeafSpine(args.endpoints, planes, args.per_leaf, args.spines, nic_gbps=800)
        links = fabric.fabric_links()
        k = math.ceil(args.fail_pct / 100 * len(links) - 1e-9)
        pair = rank_bytes / args.endpoints
        line = fb.line_time(fabric, pair)
        rng = np.random.default_rng([args.seed, planes])
        draws = [[links[i] for i in rng.choice(len(links), size=k, replace=False)] for _ in range(args.draws)]
        for mode in fb.MODES:
            base = fb.alltoall_time(fabric, pair, mode, qps=args.qps, seed=args.seed)
            failed = np.array([fb.alltoall_time(fabric, pair, mode, d, qps=args.qps, seed=args.seed) for d in draws])
            surviving = np.array([fabric.fabric_capacity(d) / fabric.fabric_capacity() for d in draws])
            ratio = (base / failed) / surviving
            p50 = lf.inflation_interval(failed, np.full(len(draws), base), 0.5)
            p99 = lf.inflation_interval(failed, np.full(len(draws), base), 0.99)
            print(f"| {planes} | {mode} | {len(links)} | {k} | {line / base:.3f} | {np.median(line / failed):.3f} | "
                  f"{np.median(ratio):.3f} ({ratio.min():.3f}–{ratio.max():.3f}) | {p50['value']:.3f} "
                  f"[{interval(p50)}] | {p99['value']:.3f} [{interval(p99)}] |")
    print(f"\n{args.draws} draws of ceil({args.fail_pct:g} %) fabric links per row, seed {args.seed}, "
          f"{args.qps} QP per pair; {time.perf_counter() - t0:.0f} s")


if __name__ == "__main__":
    main()
