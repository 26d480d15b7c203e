"""Recorded events against emulator ground truth. Pure: DataFrames in, numbers out."""
from __future__ import annotations

import numpy as np
import pandas as pd

KEY = ["cycle", "stage", "host", "port"]


def assign_cycles(truth: pd.DataFrame, cycle_starts: list[tuple[int, int]]) -> pd.DataFrame:
    """Give each truth row (t_ns) the cycle whose start is the latest at or before it; rows before the first
    start are dropped. `cycle_starts` is [(cycle, start_ns), ...]."""
    if truth.empty or not cycle_starts:
        return truth.assign(cycle=pd.Series(dtype="int64")).iloc[0:0]
    starts = sorted(cycle_starts, key=lambda cs: cs[1])
    times = np.array([s for _, s in starts], dtype=np.int64)
    cycles = np.array([c for c, _ in starts], dtype=np.int64)
    idx = np.searchsorted(times, truth["t_ns"].to_numpy(dtype=np.int64), side="right") - 1
    keep = idx >= 0
    out = truth.loc[keep].copy()
    out["cycle"] = cycles[idx[keep]]
    return out


def match(events: pd.DataFrame, truth: pd.DataFrame) -> pd.DataFrame:
    """First recorded event and first true event per (cycle, stage, host, port); error = recorded − true."""
    rec = events.groupby(KEY, observed=True).agg(t_ns=("t_ns", "min"), uncertainty_ns=("uncertainty_ns", "first"))
    tru = truth.groupby(KEY, observed=True)["t_ns"].min().rename("true_ns")
    joined = rec.join(tru, how="inner").reset_index()
    joined["error_ns"] = joined["t_ns"] - joined["true_ns"]
    joined["covered"] = joined["error_ns"].abs() <= joined["uncertainty_ns"]
    return joined


def accuracy_table(matched: pd.DataFrame) -> pd.DataFrame:
    """Per stage: n, p50 and p99 of |error| (ms), mean error (bias, ms), coverage of ±uncertainty."""
    rows = []
    for stage, g in list(matched.groupby("stage")) + [("all", matched)]:
        err = g["error_ns"].abs().to_numpy(dtype=float) / 1e6
        if len(err) == 0:
            continue
        rows.append({"stage": stage, "n": len(err), "abs_err_p50_ms": float(np.quantile(err, 0.5)),
                     "abs_err_p99_ms": float(np.quantile(err, 0.99)),
                     "bias_ms": float(g["error_ns"].mean() / 1e6),
                     "coverage": float(g["covered"].mean())})
    return pd.DataFrame(rows)
