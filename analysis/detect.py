"""Multinomial GLR-CUSUM change detector, window-limited (spec algorithms.md §4).

Per epoch a count vector N_t (m classes) of roughly independent units (chunks/flows, not bytes).
    S_t = max_{t-W < k <= t} N_{k:t} KL(p_hat_{k:t} || p0)            ("glr": sup over the post-change law)
    S_t = max_k [log KT(N_{k:t}) - sum_c N_{k:t,c} log p0_c]            ("kt": Dirichlet(1/2) mixture)
Alarm when S_t >= h. Thresholds: Monte Carlo calibration under p0 (`calibrate_threshold`) next to the
non-asymptotic bounds (`analytic_threshold`): type/union bound for GLR, Ville for KT. The default
(`default_threshold`) is the Monte Carlo one, with the analytic bound reported beside it: the bounds are
valid but loose (GLR's grows with (m-1) log N and at m = 8 categories never lets a change through).
"""
from __future__ import annotations

from collections import deque

import numpy as np
from scipy.special import gammaln, xlogy

__all__ = ["GlrCusum", "glr_statistics", "analytic_threshold", "calibrate_threshold", "default_threshold",
           "false_alarm_rate", "log_kt"]


def _clean_p0(p0) -> np.ndarray:
    p0 = np.maximum(np.asarray(p0, dtype=np.float64), 1e-12)
    return p0 / p0.sum()


def log_kt(N) -> np.ndarray:
    """log of the Krichevsky-Trofimov (Dirichlet(1/2)) mixture probability of counts N (last axis)."""
    N = np.asarray(N, dtype=np.float64)
    m = N.shape[-1]
    return (gammaln(N + 0.5).sum(axis=-1) - m * gammaln(0.5) + gammaln(m / 2.0)
            - gammaln(N.sum(axis=-1) + m / 2.0))


def _score(N, log_p0, variant):
    """Per-start statistic for window sums N (..., m)."""
    n = N.sum(axis=-1)
    if variant == "glr":
        # n KL(N/n || p0) = sum_c N_c log N_c - n log n - sum_c N_c log p0_c
        return xlogy(N, N).sum(axis=-1) - xlogy(n, n) - (N * log_p0).sum(axis=-1)
    return log_kt(N) - (N * log_p0).sum(axis=-1)


class GlrCusum:
    """Streaming detector. `update(counts) -> bool` (alarm at this epoch); `statistic` = S_t;
    `change_estimate` = epoch index k_hat (0-based count of updates since the last reset) of the
    maximising start; `alarm_time` = index of the first alarm or None."""

    def __init__(self, p0, window: int, threshold: float, variant: str = "glr"):
        if variant not in ("glr", "kt"):
            raise ValueError("variant must be 'glr' or 'kt'")
        self.variant = variant
        self.window = int(window)
        self.threshold = float(threshold)
        self.reset(p0)

    def reset(self, p0=None):
        """Forget the history (after an alarm); optionally a new pre-change law (counts are normalised)."""
        if p0 is not None:
            self.p0 = _clean_p0(p0)
            self.log_p0 = np.log(self.p0)
        self._buf = deque(maxlen=self.window)
        self.t = 0
        self.statistic = 0.0
        self.change_estimate = None
        self.alarm_time = None

    def update(self, counts) -> bool:
        c = np.asarray(counts, dtype=np.float64)
        if c.shape != self.p0.shape:
            raise ValueError(f"expected {self.p0.size} counts")
        self._buf.append(c)
        self.t += 1
        arr = np.asarray(self._buf)                       # oldest .. newest
        suffix = np.cumsum(arr[::-1], axis=0)             # row j = sum of the newest j+1 epochs
        sc = _score(suffix, self.log_p0, self.variant)
        j = int(np.argmax(sc))
        self.statistic = float(max(sc[j], 0.0))
        self.change_estimate = self.t - 1 - j
        alarm = self.statistic >= self.threshold
        if alarm and self.alarm_time is None:
            self.alarm_time = self.t - 1
        return bool(alarm)


def _table_score(variant: str, m: int, n_max: int):
    """For integer counts, `_score`'s special functions as tables over k, n <= n_max: k log k (glr), or
    gammaln(k + 1/2) and gammaln(n + m/2) with the constants (kt). Looking them up instead of evaluating them
    per entry is most of the calibration's cost."""
    k = np.arange(n_max + 1, dtype=np.float64)
    if variant == "glr":
        per_class = per_total = xlogy(k, k)
    else:
        per_class = gammaln(k + 0.5)
        per_total = gammaln(k + m / 2.0) + m * gammaln(0.5) - gammaln(m / 2.0)
    return per_class, per_total


def glr_statistics(counts, p0, window: int, variant: str = "glr", chunk: int = 4096) -> np.ndarray:
    """Vectorised S_t for many runs: counts (R, T, m) or (T, m) -> S (R, T) or (T,). Same as GlrCusum.
    `p0` is one law (m,) or one per run (R, m) (a detector whose pre-change law was itself estimated)."""
    counts = np.asarray(counts, dtype=np.float64)
    squeeze = counts.ndim == 2
    if squeeze:
        counts = counts[None]
    p0 = np.maximum(np.asarray(p0, dtype=np.float64), 1e-12)
    log_p0 = np.log(p0 / p0.sum(axis=-1, keepdims=True))
    R, T, m = counts.shape
    if log_p0.ndim == 2 and log_p0.shape != (R, m):
        raise ValueError(f"p0 per run must be ({R}, {m}), got {log_p0.shape}")
    table = None
    if counts.size and counts.min() >= 0 and np.array_equal(counts, np.round(counts)):
        n_max = int(counts.sum(axis=2).max()) * min(window, T)
        if n_max <= 10_000_000:
            table = _table_score(variant, m, n_max)
    chunk = max(1, min(chunk, 4_000_000 // max(1, T * m)))  # bound memory: chunk × T × m prefix sums
    out = np.empty((R, T))
    for r0 in range(0, R, chunk):
        c = counts[r0:r0 + chunk]
        lp = log_p0[r0:r0 + chunk, None, :] if log_p0.ndim == 2 else log_p0   # broadcasts over epochs
        P = np.concatenate([np.zeros((c.shape[0], 1, m)), np.cumsum(c, axis=1)], axis=1)  # prefix sums
        if table:   # the linear term and the totals are differences of prefix sums too
            Pi, Pn, Pl = P.astype(np.int64), P.sum(axis=2).astype(np.int64), (P * lp).sum(axis=2)
        S = np.full((c.shape[0], T), -np.inf)
        for j in range(min(window, T)):                  # window of the newest j+1 epochs
            if table:
                sc = (table[0][Pi[:, j + 1:] - Pi[:, :T - j]].sum(axis=-1) - table[1][Pn[:, j + 1:] - Pn[:, :T - j]]
                      - (Pl[:, j + 1:] - Pl[:, :T - j]))
            else:
                sc = _score(P[:, j + 1:] - P[:, :T - j], lp, variant)   # sums over [t-j, t], t = j..T-1
            S[:, j:] = np.maximum(S[:, j:], sc)
        out[r0:r0 + chunk] = np.maximum(S, 0.0)
    return out[0] if squeeze else out


def analytic_threshold(m: int, window: int, horizon: int, delta: float, n_max: int | None = None,
                       variant: str = "glr") -> float:
    """Threshold with P_inf(false alarm before `horizon`) <= delta.
    glr: h = log(T W / delta) + (m-1) log(N_max + 1) (method of types + union bound; N_max = max window count).
    kt:  h = log(T / delta) (each start is a nonnegative H0-martingale; Ville + union over starts)."""
    if variant == "kt":
        return float(np.log(horizon / delta))
    if n_max is None:
        raise ValueError("n_max (largest window count) is needed for the GLR bound")
    return float(np.log(horizon * window / delta) + (m - 1) * np.log(n_max + 1))


def calibrate_threshold(p0, n_per_epoch: int, window: int, horizon: int, alpha: float, runs: int = 200,
                        seed=None, variant: str = "glr", reference_epochs: int | None = None) -> dict:
    """Monte Carlo threshold: the (1-alpha) quantile of max_{t<=horizon} S_t under p0 (multinomial
    counts, n_per_epoch units per epoch), next to the analytic bound. Returns a dict with
    "threshold", "bound", "max_statistics", and the standard error of the quantile's false-alarm level.
    With `reference_epochs`, the detector's own law is estimated as the detectors here estimate it (counts of
    that many H0 epochs + 1/2): each run draws its reference too, so the threshold covers the estimate's
    error (a parametric bootstrap around p0), not only the runs' noise."""
    p0 = _clean_p0(p0)
    rng = np.random.default_rng(seed)
    counts = rng.multinomial(n_per_epoch, p0, size=(runs, horizon)).astype(np.float64)
    law = p0
    if reference_epochs:
        law = rng.multinomial(n_per_epoch * int(reference_epochs), p0, size=runs) + 0.5
    mx = glr_statistics(counts, law, window, variant).max(axis=1)
    h = float(np.quantile(mx, 1.0 - alpha))
    if np.mean(mx >= h) > alpha:
        # ties at the quantile (S is floored at 0: with many categories KT's mixture cost keeps it there
        # under p0): an alarm must need more than the tied value, or every run would alarm
        h = float(np.nextafter(h, np.inf))
    bound = analytic_threshold(len(p0), window, horizon, alpha, n_max=window * n_per_epoch, variant=variant)
    return {"threshold": h, "bound": bound, "max_statistics": mx, "alpha": alpha, "runs": runs,
            "level_se": float(np.sqrt(alpha * (1 - alpha) / runs)), "variant": variant,
            "reference_epochs": int(reference_epochs or 0)}


def default_threshold(reference_counts, window: int, horizon: int, alpha: float = 0.05, variant: str = "kt",
                      runs: int = 2000, seed=0, estimated: bool = True) -> dict:
    """The default threshold for a detector whose pre-change law is estimated from `reference_counts`
    (epochs × m; law = their sum + 1/2): Monte Carlo calibrated (`calibrate_threshold`, P(false alarm before
    `horizon`) ≈ alpha; 2000 runs put its binomial standard error "level_se" below 0.5 pp at alpha = 0.05) with
    the analytic bound beside it in "bound". `estimated` (default) calibrates over the estimate's error too
    (each run re-estimates the law from as many epochs): calibrated as if the estimate were the truth, a
    10-epoch reference put the realised level at 0.19–0.99 for a nominal 0.05 (benchmarks/bench_detect.py
    --level-spread)."""
    ref = np.atleast_2d(np.asarray(reference_counts, dtype=np.float64))
    p0 = ref.sum(axis=0) + 0.5
    n = max(1, int(round(float(ref.sum(axis=1).mean()))))
    out = calibrate_threshold(p0, n, window, horizon, alpha, runs=runs, seed=seed, variant=variant,
                              reference_epochs=len(ref) if estimated else None)
    out.pop("max_statistics")
    return {**out, "n_per_epoch": n, "window": int(window), "horizon": int(horizon)}


def false_alarm_rate(p0, n_per_epoch: int, window: int, horizon: int, threshold: float, runs: int,
                     seed=None, variant: str = "glr") -> float:
    """Fraction of H0 runs of length `horizon` with an alarm (fresh draws, independent of calibration)."""
    p0 = _clean_p0(p0)
    rng = np.random.default_rng(seed)
    counts = rng.multinomial(n_per_epoch, p0, size=(runs, horizon)).astype(np.float64)
    mx = glr_statistics(counts, p0, window, variant).max(axis=1)
    return float(np.mean(mx >= threshold))
