"""Link-failure and link-flap metrics in nccl-tests conventions (spec algorithms.md §8, our formulation).

- bus bandwidth (nccl-tests PERFORMANCE.md): algBW = bytes / time; all-to-all busBW = algBW·(n−1)/n,
  all-reduce busBW = algBW·2(n−1)/n;
- effective-bandwidth fraction = busBW / line rate;
- latency inflation = the p50 and p99 of per-iteration times (an iteration of the trace, its phases back
  to back: the unit that is independent) with f % of the links failed ÷ the same with 0 % failed;
- proportionality = (busBW(f) / busBW(0)) ÷ (capacity(f) / capacity(0)): 1 when bandwidth follows the
  surviving capacity exactly, < 1 when the fabric loses more than the failed links carried;
- flap reaction time = from link down until goodput is ≥ 95 % of the new steady state, over a goodput time
  series of windows (start, end, goodput) — back-to-back operations, or the intervals between two samples of
  a byte counter (`counter_windows`) — bounded by the window that first reaches it.
Pure functions over arrays: numbers in, numbers out.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Sequence

import numpy as np

COLLECTIVE_FACTORS = {"alltoall": lambda n: (n - 1) / n, "allreduce": lambda n: 2 * (n - 1) / n,
                      "allgather": lambda n: (n - 1) / n, "reducescatter": lambda n: (n - 1) / n,
                      "broadcast": lambda n: 1.0, "sendrecv": lambda n: 1.0}


def bus_bandwidth(size_bytes, seconds, nranks: int, collective: str = "alltoall"):
    """nccl-tests busBW in bytes/s: (size / time) × the collective's factor for `nranks` ranks."""
    if nranks < 1:
        raise ValueError("nranks must be >= 1")
    if collective not in COLLECTIVE_FACTORS:
        raise ValueError(f"unknown collective {collective!r} (known: {', '.join(COLLECTIVE_FACTORS)})")
    seconds = np.asarray(seconds, dtype=float)
    if np.any(seconds <= 0):
        raise ValueError("times must be > 0")
    return np.asarray(size_bytes, dtype=float) / seconds * COLLECTIVE_FACTORS[collective](nranks)


def effective_bandwidth_fraction(bus_bw_bytes_s, line_rate_bytes_s: float):
    """busBW / line rate (1.0 = the link's full rate)."""
    if not line_rate_bytes_s > 0:
        raise ValueError("line rate must be > 0")
    return np.asarray(bus_bw_bytes_s, dtype=float) / line_rate_bytes_s


def latency_inflation(failed_s: Sequence[float], baseline_s: Sequence[float],
                      quantiles: Sequence[float] = (0.5, 0.99)) -> dict[str, float]:
    """{"p50": q50(failed)/q50(baseline), "p99": ...}; quantiles by numpy's default (linear) rule."""
    failed, base = np.asarray(failed_s, dtype=float), np.asarray(baseline_s, dtype=float)
    if failed.size == 0 or base.size == 0:
        raise ValueError("both samples need at least one time")
    out = {}
    for q in quantiles:
        b = float(np.quantile(base, q))
        if not b > 0:
            raise ValueError("baseline times must be > 0")
        out[f"p{round(q * 100):d}"] = float(np.quantile(failed, q)) / b
    return out


def proportionality(bus_bw_failed: float, bus_bw_baseline: float, capacity_failed: float,
                    capacity_baseline: float) -> float:
    """Bandwidth kept ÷ capacity kept (1.0 = bandwidth proportional to the surviving capacity)."""
    if not (bus_bw_baseline > 0 and capacity_baseline > 0 and capacity_failed > 0):
        raise ValueError("baseline bandwidth and both capacities must be > 0")
    return (bus_bw_failed / bus_bw_baseline) / (capacity_failed / capacity_baseline)


def iteration_times(seconds, units) -> np.ndarray:
    """One time per unit (an iteration of the trace: its phases back to back): the sum of its phase times."""
    x = np.asarray(seconds, dtype=float)
    u = np.asarray(units)
    if x.shape != u.shape:
        raise ValueError("one unit per time")
    _, inverse = np.unique(u, return_inverse=True)
    return np.bincount(inverse, weights=x)


def inflation_interval(failed_units_s: Sequence[float], baseline_units_s: Sequence[float], q: float,
                       confidence: float = 0.95) -> dict:
    """Interval of quantile(failed, q) / quantile(baseline, q) over independent units (one time per iteration:
    the phases of one iteration share its fate and never count as independent). Each side's distribution-free
    order-statistic interval (analysis.stats.quantile_interval) at 1 − α/2: both hold together with
    probability ≥ `confidence`, and so does [low_f / high_b, high_f / low_b] (coverage: benchmarks/coverage.py
    --inflation). Too few units for both ends (a p99 needs hundreds): "ci" None, "needs_n" per side, and the
    one-sided bounds the units do support ("lower", "upper"; else None)."""
    from analysis.stats import quantile_interval

    failed, base = (np.asarray(x, dtype=float) for x in (failed_units_s, baseline_units_s))
    if failed.size == 0 or base.size == 0:
        raise ValueError("both sides need at least one unit")
    each = 1 - (1 - confidence) / 2
    f, b = quantile_interval(failed, q, each), quantile_interval(base, q, each)
    value = float(np.quantile(failed, q) / np.quantile(base, q))
    out = {"value": value, "ci": None, "lower": None, "upper": None, "needs_n": f["needs_n"],
           "n_units": [int(base.size), int(failed.size)]}
    if f["ci"] is not None and b["ci"] is not None and b["ci"][0] > 0:
        out["ci"] = [f["ci"][0] / b["ci"][1], f["ci"][1] / b["ci"][0]]
        return out
    f_lo = f["ci"][0] if f["ci"] is not None else f["lower"]
    b_hi = b["ci"][1] if b["ci"] is not None else b["upper"]
    f_hi = f["ci"][1] if f["ci"] is not None else f["upper"]
    b_lo = b["ci"][0] if b["ci"] is not None else b["lower"]
    if f_lo is not None and b_hi is not None and b_hi > 0:
        out["lower"] = f_lo / b_hi
    if f_hi is not None and b_lo is not None and b_lo > 0:
        out["upper"] = f_hi / b_lo
    return out


@dataclass(frozen=True)
class Reaction:
    """Reaction to a link going down at `down_s`: the first window (operation, or counter interval) whose
    goodput is ≥ `fraction` × the new steady state. The true reaction time is in (low_s, high_s]: after the
    start of the window before it (still below), at most the end of that first window."""

    low_s: float
    high_s: float
    steady: float  # the new steady state's goodput (median over the steady window)
    reached: bool


def reaction_time(start_s, end_s, goodput, down_s: float, steady_from_s: float, steady_to_s: float,
                  fraction: float = 0.95, steady: float | None = None) -> Reaction:
    """Flap reaction time over a series of back-to-back operations (start, end, goodput), time in s.

    The new steady state is the median goodput of the operations that start within
    [steady_from_s, steady_to_s) (after the link went down and before it returns), or `steady` if given (an
    oracle judging the same samples against the same state). The reaction is reached
    at the first operation starting at or after `down_s` (and before `steady_to_s`) with goodput ≥
    fraction × steady; its bounds are relative to `down_s`."""
    start, end, good = (np.asarray(x, dtype=float) for x in (start_s, end_s, goodput))
    if not (start.shape == end.shape == good.shape) or np.any(end < start):
        raise ValueError("start, end and goodput must be equal-length with end >= start")
    if steady is None:
        window = (start >= steady_from_s) & (start < steady_to_s)
        if not window.any():
            raise ValueError("no operation inside the steady-state window")
        steady = float(np.median(good[window]))
    after = np.flatnonzero((start >= down_s) & (start < steady_to_s))
    if after.size == 0:
        raise ValueError("no operation after the link went down")
    ok = np.flatnonzero(good[after] >= fraction * steady)
    if ok.size == 0:
        return Reaction(float(start[after[-1]] - down_s), float("inf"), steady, False)
    first = int(ok[0])
    low = float(start[after[first - 1]] - down_s) if first > 0 else 0.0
    return Reaction(max(low, 0.0), float(end[after[first]] - down_s), steady, True)


def counter_windows(t_s, octets) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """A cumulative byte counter sampled at times `t_s` → windows (start, end, goodput in bytes/s) between
    consecutive samples. Samples out of order or at the same instant are refused (a clock went backwards)."""
    t, b = np.asarray(t_s, dtype=float), np.asarray(octets, dtype=float)
    if t.shape != b.shape or t.size < 2:
        raise ValueError("need at least two samples, times and counts of equal length")
    if np.any(np.diff(t) <= 0):
        raise ValueError("sample times must increase")
    return t[:-1], t[1:], np.diff(b) / np.diff(t)
