"""Smoothed critical path U_beta of a DAG and its arc marginals (spec algorithms.md §1).

U_beta = (1/beta) log sum_{paths s->t} exp(beta L(path)); dU/dl_a = mu_a, the probability that arc a lies
on a path drawn from the Gibbs law. Forward-backward recursion in the log domain, vectorised level by
level: arcs are grouped by the (longest-hop) level of their head node, and each level is one
`np.maximum.reduceat` / `np.add.reduceat` over a contiguous slice. O(|N|+|A|) per evaluation; the plan
(levels, sort orders) depends only on the graph and is cached in `DagPlan` for repeated evaluations.

beta = np.inf gives the hard (max-plus) critical path; its marginals are one-hot on one longest path.
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np

__all__ = ["DagPlan", "smoothed_critical_path", "longest_path", "log_num_paths", "check_unit_flow"]


def _segment_starts(keys: np.ndarray) -> np.ndarray:
    """Start indices of runs of equal values in a sorted key array."""
    if keys.size == 0:
        return np.zeros(0, dtype=np.int64)
    return np.flatnonzero(np.r_[True, keys[1:] != keys[:-1]])


class _Level:
    """Arcs of one level, grouped into segments (one per node being computed)."""

    __slots__ = ("arcs", "other", "starts", "rep", "nodes", "singleton")

    def __init__(self, arcs, other, starts, nodes):
        self.arcs = arcs
        self.other = other                      # the already-computed endpoint of each arc
        self.starts = starts
        self.nodes = nodes
        self.singleton = starts.size == arcs.size
        self.rep = np.repeat(np.arange(starts.size), np.diff(np.r_[starts, arcs.size]))


@dataclass
class DagPlan:
    """Graph-only precomputation: node levels and the two arc orders used by the recursions."""

    num_nodes: int
    src: np.ndarray
    dst: np.ndarray
    level: np.ndarray           # longest hop distance from any root
    fwd_order: np.ndarray       # arcs sorted by (level[dst], dst)
    fwd_level_bounds: np.ndarray  # slice bounds into fwd_order per level (levels 1..max)
    fwd_seg_starts: list        # per level: _Level (arcs, their tails, segment starts/ids, head nodes)
    fwd_seg_nodes: list         # per level: the dst node of each segment
    bwd_order: np.ndarray       # arcs sorted by (level[src] desc, src)
    bwd_level_bounds: np.ndarray
    bwd_seg_starts: list        # per level: _Level (arcs, their heads, segment starts/ids, tail nodes)
    bwd_seg_nodes: list

    @classmethod
    def build(cls, num_nodes: int, src, dst) -> "DagPlan":
        src = np.asarray(src, dtype=np.int64)
        dst = np.asarray(dst, dtype=np.int64)
        if src.shape != dst.shape or src.ndim != 1:
            raise ValueError("src and dst must be 1-D arrays of equal length")
        if src.size and (src.min() < 0 or dst.max() >= num_nodes):
            raise ValueError("arc endpoints out of range")
        if np.any(src >= dst):
            raise ValueError("nodes must be numbered in topological order (src < dst on every arc)")
        level = _levels(num_nodes, src, dst)
        # forward: group arcs by head level, then head node
        order = np.lexsort((dst, level[dst]))
        fl = level[dst][order]
        fwd_bounds = np.searchsorted(fl, np.arange(1, level.max(initial=0) + 2))
        fwd_starts, fwd_nodes = [], []
        d_sorted = dst[order]
        for k in range(len(fwd_bounds) - 1):
            a, b = fwd_bounds[k], fwd_bounds[k + 1]
            st = _segment_starts(d_sorted[a:b])
            fwd_starts.append(_Level(order[a:b], src[order[a:b]], st, d_sorted[a:b][st]))
            fwd_nodes.append(d_sorted[a:b][st])
        # backward: group arcs by tail level (descending), then tail node
        maxlev = level.max(initial=0)
        border = np.lexsort((src, maxlev - level[src]))
        bl = (maxlev - level[src])[border]
        bwd_bounds = np.searchsorted(bl, np.arange(0, maxlev + 1))
        bwd_bounds = np.r_[bwd_bounds, src.size]
        bwd_starts, bwd_nodes = [], []
        s_sorted = src[border]
        for k in range(len(bwd_bounds) - 1):
            a, b = bwd_bounds[k], bwd_bounds[k + 1]
            st = _segment_starts(s_sorted[a:b])
            bwd_starts.append(_Level(border[a:b], dst[border[a:b]], st, s_sorted[a:b][st]))
            bwd_nodes.append(s_sorted[a:b][st])
        return cls(num_nodes, src, dst, level, order, fwd_bounds, fwd_starts, fwd_nodes,
                   border, bwd_bounds, bwd_starts, bwd_nodes)


def _levels(num_nodes: int, src: np.ndarray, dst: np.ndarray) -> np.ndarray:
    """Longest hop distance from a root, by vectorised Kahn rounds (one round per level)."""
    indeg = np.bincount(dst, minlength=num_nodes)
    out_order = np.argsort(src, kind="stable")
    out_ptr = np.r_[0, np.cumsum(np.bincount(src, minlength=num_nodes))]
    level = np.zeros(num_nodes, dtype=np.int64)
    frontier = np.flatnonzero(indeg == 0)
    remaining = indeg.copy()
    lev = 0
    seen = frontier.size
    while frontier.size:
        level[frontier] = lev
        starts, ends = out_ptr[frontier], out_ptr[frontier + 1]
        cnt = ends - starts
        if cnt.sum() == 0:
            break
        idx = np.repeat(starts - np.r_[0, np.cumsum(cnt)[:-1]], cnt) + np.arange(cnt.sum())
        heads = dst[out_order[idx]]
        dec = np.bincount(heads, minlength=num_nodes)
        touched = np.flatnonzero(dec)
        remaining[touched] -= dec[touched]
        frontier = touched[remaining[touched] == 0]
        seen += frontier.size
        lev += 1
    if seen != num_nodes:  # pragma: no cover - src<dst already excludes cycles
        raise ValueError("graph has a cycle")
    return level


def _lse_segments(x: np.ndarray, starts: np.ndarray) -> np.ndarray:
    """log-sum-exp of each segment of x (segments start at `starts`), -inf safe."""
    m = np.maximum.reduceat(x, starts)
    m_safe = np.where(np.isfinite(m), m, 0.0)
    seg_len = np.diff(np.r_[starts, x.size])
    with np.errstate(invalid="ignore", under="ignore"):
        s = np.add.reduceat(np.exp(x - np.repeat(m_safe, seg_len)), starts)
    with np.errstate(divide="ignore"):
        return np.where(np.isfinite(m), m_safe + np.log(s), m)


def _sweep(levels, pot: np.ndarray, w: np.ndarray, hard: bool) -> np.ndarray:
    """pot[node] = LSE (or max) over the level's arcs of pot[other end] + w; in place, level by level."""
    with np.errstate(invalid="ignore", under="ignore", divide="ignore"):
        for lv in levels:
            if lv.arcs.size == 0:
                continue
            x = pot[lv.other] + w[lv.arcs]
            if lv.singleton:
                pot[lv.nodes] = x
                continue
            m = np.maximum.reduceat(x, lv.starts)
            if hard:
                pot[lv.nodes] = m
                continue
            m_safe = np.where(m == -np.inf, 0.0, m)
            s = np.add.reduceat(np.exp(x - m_safe[lv.rep]), lv.starts)
            pot[lv.nodes] = m_safe + np.log(s)
    return pot


def _forward(plan: DagPlan, w: np.ndarray, source: int, hard: bool) -> np.ndarray:
    """alpha[v] = LSE (or max) over in-arcs of alpha[u] + w_uv; alpha[source] = 0; w = beta*l.
    The source has no in-arcs (src < dst), so it is never overwritten."""
    alpha = np.full(plan.num_nodes, -np.inf)
    alpha[source] = 0.0
    return _sweep(plan.fwd_seg_starts, alpha, w, hard)


def _backward(plan: DagPlan, w: np.ndarray, sink: int, hard: bool) -> np.ndarray:
    """gamma[u] = LSE (or max) over out-arcs of w_uv + gamma[v]; gamma[sink] = 0 (no out-arcs)."""
    gamma = np.full(plan.num_nodes, -np.inf)
    gamma[sink] = 0.0
    return _sweep(plan.bwd_seg_starts, gamma, w, hard)


def check_unit_flow(num_nodes: int, src, dst, mu, source: int = 0, sink: int | None = None,
                    atol: float = 1e-8) -> float:
    """Max violation of the unit s->t flow conditions (out of s = 1, into t = 1, conservation)."""
    sink = num_nodes - 1 if sink is None else sink
    outflow = np.bincount(src, weights=mu, minlength=num_nodes)
    inflow = np.bincount(dst, weights=mu, minlength=num_nodes)
    net = outflow - inflow
    target = np.zeros(num_nodes)
    target[source] += 1.0
    target[sink] -= 1.0
    viol = float(np.max(np.abs(net - target))) if num_nodes else 0.0
    viol = max(viol, float(-min(mu.min(initial=0.0), 0.0)), float(max(mu.max(initial=0.0) - 1.0, 0.0)))
    return viol


def smoothed_critical_path(num_nodes: int, src, dst, length, beta, *, plan: DagPlan | None = None,
                           check: bool = True, atol: float = 1e-7, return_potentials: bool = False):
    """U_beta (same units as `length`) and the arc marginals mu = dU_beta/dlength.

    Nodes 0..num_nodes-1 are in topological order (src < dst), source 0, sink num_nodes-1.
    `beta` > 0 in 1/(length unit); `np.inf` gives the hard critical path with one-hot marginals.
    Raises ValueError if the sink is unreachable. With `check`, asserts that mu is a unit flow.
    `return_potentials` adds (alpha, gamma) (log domain, scaled by beta; for beta=inf in length units).
    """
    length = np.asarray(length, dtype=np.float64)
    if plan is None:
        plan = DagPlan.build(num_nodes, src, dst)
    src, dst = plan.src, plan.dst
    if length.shape != src.shape:
        raise ValueError("length must have one entry per arc")
    sink = num_nodes - 1
    beta = float(beta)
    if not beta > 0:
        raise ValueError("beta must be > 0")
    hard = np.isinf(beta)
    w = length if hard else beta * length
    alpha = _forward(plan, w, 0, hard)
    if not np.isfinite(alpha[sink]):
        raise ValueError("sink is not reachable from source")
    if hard:
        value = float(alpha[sink])
        mu = _hard_path_marginals(plan, length, alpha)
        gamma = None
        if return_potentials:
            gamma = _backward(plan, w, sink, True)
    else:
        gamma = _backward(plan, w, sink, False)
        value = float(alpha[sink] / beta)
        with np.errstate(invalid="ignore", under="ignore"):
            logmu = alpha[src] + w + gamma[dst] - alpha[sink]
        mu = np.where(np.isfinite(logmu), np.exp(np.minimum(logmu, 0.0)), 0.0)
    if check:
        viol = check_unit_flow(num_nodes, src, dst, mu, 0, sink)
        assert viol <= atol * max(1.0, np.sqrt(len(mu))), f"marginals are not a unit flow (violation {viol:.3g})"
    if return_potentials:
        return value, mu, (alpha, gamma)
    return value, mu


def _hard_path_marginals(plan: DagPlan, length: np.ndarray, alpha: np.ndarray) -> np.ndarray:
    """One-hot marginals on one longest path, traced back from the sink through tight arcs."""
    src, dst = plan.src, plan.dst
    n = plan.num_nodes
    slack = alpha[dst] - (alpha[src] + length)          # >= 0 (up to rounding) on reachable arcs
    tol = 1e-9 * max(1.0, float(np.abs(alpha[np.isfinite(alpha)]).max(initial=1.0)))
    tight = np.isfinite(slack) & (np.abs(slack) <= tol)
    # for each node the tight in-arc of smallest index
    best_in = np.full(n, -1, dtype=np.int64)
    arcs = np.flatnonzero(tight)[::-1]
    best_in[dst[arcs]] = arcs                            # last write wins -> smallest arc index
    mu = np.zeros(src.size)
    v = n - 1
    while v != 0:
        a = best_in[v]
        if a < 0:  # pragma: no cover - numerical corner; fall back to argmax of in-arcs
            cand = np.flatnonzero(dst == v)
            a = cand[np.argmax(alpha[src[cand]] + length[cand])]
        mu[a] = 1.0
        v = src[a]
    return mu


def longest_path(num_nodes: int, src, dst, length, *, plan: DagPlan | None = None):
    """Hard critical path: (value, arc indicator of one longest path)."""
    return smoothed_critical_path(num_nodes, src, dst, length, np.inf, plan=plan)


def log_num_paths(num_nodes: int, src, dst, *, plan: DagPlan | None = None) -> float:
    """log N_paths(s -> t) by the same recursion with l = 0 (beta >= log N / eps gives eps-accuracy)."""
    if plan is None:
        plan = DagPlan.build(num_nodes, src, dst)
    alpha = _forward(plan, np.zeros(plan.src.size), 0, False)
    return float(alpha[num_nodes - 1])
