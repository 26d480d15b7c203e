"""Multi-job generalized-mean fairness (spec algorithms.md §5).

M_r(U) = (sum_j p_j U_j^r)^(1/r), p = normalised weights (default 1/J), r >= 1 (r=1 mean, r->inf makespan).
Minimising sum_j U_j^r is alpha-fair throughput allocation (x_j = 1/U_j) with alpha = r + 1.
"""
from __future__ import annotations

import numpy as np
from scipy.special import logsumexp

__all__ = ["generalized_mean", "generalized_mean_grad", "alpha_from_r", "r_from_alpha",
           "combined_gradient", "two_job_optimal_share"]


def _weights(J, weights):
    if weights is None:
        return np.full(J, 1.0 / J)
    p = np.asarray(weights, dtype=np.float64)
    return p / p.sum()


def generalized_mean(times, r: float, weights=None) -> float:
    """M_r = exp((LSE_j(r log U_j + log p_j)) / r); r = inf gives max_j U_j. Times must be > 0."""
    U = np.asarray(times, dtype=np.float64)
    if np.any(U <= 0):
        raise ValueError("times must be positive")
    if np.isinf(r):
        return float(U.max())
    p = _weights(U.size, weights)
    return float(np.exp(logsumexp(r * np.log(U) + np.log(p)) / r))


def generalized_mean_grad(times, r: float, weights=None) -> np.ndarray:
    """dM_r/dU_j = p_j (U_j / M_r)^(r-1) (for r = inf: indicator of the argmax, a subgradient)."""
    U = np.asarray(times, dtype=np.float64)
    if np.isinf(r):
        g = np.zeros_like(U)
        g[np.argmax(U)] = 1.0
        return g
    p = _weights(U.size, weights)
    M = generalized_mean(U, r, weights)
    return p * np.exp((r - 1.0) * (np.log(U) - np.log(M)))


def combined_gradient(times, job_gradients, r: float, weights=None) -> np.ndarray:
    """Chain rule for the wiring step: g = sum_j dM_r/dU_j * grad_w U_j (job_gradients: J x |E|)."""
    return generalized_mean_grad(times, r, weights) @ np.asarray(job_gradients, dtype=np.float64)


def alpha_from_r(r: float) -> float:
    """alpha-fairness exponent equivalent to minimising sum U^r: alpha = r + 1 (r >= 1 -> alpha >= 2)."""
    return r + 1.0


def r_from_alpha(alpha: float) -> float:
    return alpha - 1.0


def two_job_optimal_share(a: float, b: float, r: float) -> float:
    """Oracle: U1 = a/x, U2 = b/(1-x); argmin_x U1^r + U2^r = a^(r/(r+1)) / (a^(r/(r+1)) + b^(r/(r+1)))."""
    if np.isinf(r):
        return a / (a + b)
    k = r / (r + 1.0)
    return a ** k / (a ** k + b ** k)
