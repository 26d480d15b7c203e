"""Smoothed critical path U_beta of a DAG and its arc marginals (spec algorithms.md §1).

U_beta = (1/beta) log sum_{paths s->t} exp(beta L(path)); dU/dl_a = mu_a, the probability that arc a lies
on a path drawn from the Gibbs law. Forward-backward recursion in the log domain, vectorised level by
level: arcs are grouped by the (longest-hop) level of their head node; a wide level is one
`np.maximum.reduceat` / `np.add.reduceat` over a contiguous slice; short runs of narrow levels are swept node
by node, long ones as chained chunk transfer matrices (`_Chunks`), so both wide and deep DAGs cost O(|N|+|A|)
per evaluation with few Python steps. The plan (levels, blocks) depends only on the
graph and is cached in `DagPlan` for repeated evaluations.

beta = np.inf gives the hard (max-plus) critical path; its marginals are one-hot on one longest path.
"""
from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

__all__ = ["DagPlan", "smoothed_critical_path", "longest_path", "log_num_paths", "check_unit_flow"]


# Levels with at least this many arcs are swept with numpy; runs of smaller levels are swept node by node
# in plain Python, so a deep, narrow DAG costs O(arcs) instead of a few numpy calls per level.
VECTOR_MIN_ARCS = 48


def _segment_starts(keys: np.ndarray) -> np.ndarray:
    """Start indices of runs of equal values in a sorted key array."""
    if keys.size == 0:
        return np.zeros(0, dtype=np.int64)
    return np.flatnonzero(np.r_[True, keys[1:] != keys[:-1]])


class _Level:
    """Arcs of one wide level, grouped into segments (one per node being computed), swept with numpy."""

    __slots__ = ("arcs", "other", "starts", "rep", "nodes", "singleton")

    def __init__(self, arcs, other, nodes_sorted):
        starts = _segment_starts(nodes_sorted)
        self.arcs = arcs
        self.other = other                      # the already-computed endpoint of each arc
        self.starts = starts
        self.nodes = nodes_sorted[starts]
        self.singleton = starts.size == arcs.size
        self.rep = np.repeat(np.arange(starts.size), np.diff(np.r_[starts, arcs.size]))


class _Run:
    """Consecutive narrow levels, swept node by node in order (each node's inputs are already final).

    Values stay in Python floats: an arc's other end inside the run is read from the run's own list (`local`),
    one outside it is gathered with numpy before the loop; no numpy scalar is touched per arc."""

    __slots__ = ("arcs", "nodes", "bounds", "outside", "outside_other", "local")

    def __init__(self, arcs, other, nodes_sorted, slot):
        starts = _segment_starts(nodes_sorted)
        nodes = nodes_sorted[starts]
        self.arcs = arcs
        self.nodes = nodes
        self.bounds = np.r_[starts, arcs.size].tolist()
        slot[nodes] = np.arange(nodes.size)                 # slot: -1 everywhere but on this run's nodes
        pos = slot[other]
        slot[nodes] = -1
        self.outside = np.flatnonzero(pos < 0)
        self.outside_other = other[self.outside]
        self.local = np.where(pos < 0, nodes.size, pos).tolist()   # nodes.size: a slot that holds 0.0


class _Chunks:
    """A long run of narrow levels swept in chunks of `C` consecutive nodes, all chunks at once.

    The recursion is linear in the (max, +) / (logsumexp, +) semiring, so a chunk's values are a transfer
    matrix applied to its boundary (the outside nodes its arcs read): each chunk's matrix is built by sweeping
    the chunk with one unit input per boundary node, node k of every chunk in the same numpy step (C steps);
    the chunks are then chained in order, one small matrix-vector product each (n / C steps). A deep DAG
    thus costs ~2 sqrt(n) numpy calls instead of one Python iteration per arc. Used where every chunk reads
    few boundary nodes and no node has many in-arcs (`build` returns None otherwise)."""

    __slots__ = ("nodes", "C", "B", "nc", "pos", "arcidx", "bnode", "bmask", "counts")

    MIN_NODES = 2048        # below, the Python loop is as fast
    MAX_WORK = 64           # in-degree × boundary per node step: above, the chunk sweep does too much work
    CHUNK = (64, 1024)      # chunk length sqrt(2 n) clipped to this range (numpy steps: C + n / C)

    @classmethod
    def build(cls, arcs, other, nodes_sorted, slot):
        starts = _segment_starts(nodes_sorted)
        nodes = nodes_sorted[starts]
        nn = nodes.size
        if nn < cls.MIN_NODES:
            return None
        indeg = np.diff(np.r_[starts, arcs.size])
        D = int(indeg.max())
        C = int(min(cls.CHUNK[1], max(cls.CHUNK[0], round(math.sqrt(nn * 2)))))
        rank = np.repeat(np.arange(nn), indeg)                  # node rank (in sweep order) of each arc
        d = np.arange(arcs.size) - np.repeat(starts, indeg)    # the arc's slot among its node's in-arcs
        c, k = np.divmod(rank, C)
        slot[nodes] = np.arange(nn)
        orank = slot[other]
        slot[nodes] = -1
        local = (orank >= 0) & (orank // C == c)
        bnd = np.flatnonzero(~local)
        span = slot.size                                        # > every node id
        key = c[bnd] * span + other[bnd]
        ukey, inv = np.unique(key, return_inverse=True)
        uc = ukey // span
        ustart = _segment_starts(uc)
        per = np.diff(np.r_[ustart, ukey.size])
        j_of_u = np.arange(ukey.size) - np.repeat(ustart, per)
        B = int(per.max()) if per.size else 1
        if D * B > cls.MAX_WORK:
            return None
        nc = -(-nn // C)
        self = cls.__new__(cls)
        self.nodes, self.C, self.B, self.nc = nodes, C, B, nc
        pos = np.full((C, D, nc), B + C, dtype=np.int64)          # B + C: the row that stays -inf (padding)
        pos[k, d, c] = np.where(local, B + orank % C, 0)
        pos[k[bnd], d[bnd], c[bnd]] = j_of_u[inv]
        self.pos = pos
        arcidx = np.full((C, D, nc), -1, dtype=np.int64)
        arcidx[k, d, c] = arcs
        self.arcidx = arcidx
        bnode = np.zeros((nc, B), dtype=np.int64)
        bmask = np.zeros((nc, B), dtype=bool)
        bnode[uc, j_of_u] = ukey - uc * span
        bmask[uc, j_of_u] = True
        self.bnode, self.bmask = bnode, bmask
        self.counts = np.minimum(C, nn - np.arange(nc) * C).tolist()
        return self

    def sweep(self, pot: np.ndarray, w: np.ndarray, hard: bool) -> None:
        C, B, nc = self.C, self.B, self.nc
        V = np.full((nc, B + C + 1, B), -np.inf)
        V[:, np.arange(B), np.arange(B)] = 0.0                  # unit input at each boundary node
        W = np.where(self.arcidx >= 0, w[self.arcidx], -np.inf)[..., None]   # (C, D, nc, 1)
        ci = np.arange(nc)
        for k in range(C):
            X = V[ci, self.pos[k]] + W[k]                        # (D, nc, B): each in-arc's path sums
            m = X.max(axis=0)
            if hard or X.shape[0] == 1:
                V[:, B + k] = m
                continue
            m_safe = np.where(m == -np.inf, 0.0, m)
            V[:, B + k] = m_safe + np.log(np.exp(X - m_safe).sum(axis=0))
        lo = 0
        for c in range(nc):         # chain the chunks in order: a boundary node is final when its chunk is read
            X = V[c, B:B + self.counts[c]] + np.where(self.bmask[c], pot[self.bnode[c]], -np.inf)
            m = X.max(axis=1)
            if hard or B == 1:
                vals = m
            else:
                m_safe = np.where(m == -np.inf, 0.0, m)
                vals = m_safe + np.log(np.exp(X - m_safe[:, None]).sum(axis=1))
            hi = lo + self.counts[c]
            pot[self.nodes[lo:hi]] = vals
            lo = hi


def _blocks(order: np.ndarray, level_key: np.ndarray, other: np.ndarray, node: np.ndarray,
            vector_min: int) -> list:
    """Split arcs (already sorted by level, then node) into wide `_Level`s and narrow `_Run`s."""
    if order.size == 0:
        return []
    keys = level_key[order]
    starts = _segment_starts(keys)
    sizes = np.diff(np.r_[starts, order.size])
    wide = sizes >= vector_min
    # block boundaries: every wide level is its own block; consecutive narrow levels merge into one
    new_block = wide | np.r_[True, wide[:-1]]
    bstarts = starts[new_block]
    bends = np.r_[bstarts[1:], order.size]
    bwide = wide[new_block]
    blocks, slot = [], None
    for a, b, is_wide in zip(bstarts.tolist(), bends.tolist(), bwide.tolist()):
        arcs = order[a:b]
        if is_wide:
            blocks.append(_Level(arcs, other[arcs], node[arcs]))
        else:
            if slot is None:  # node -> place in its run, shared by the runs (each resets its own entries)
                slot = np.full(max(node.max(), other.max()) + 1, -1, dtype=np.int64)
            blocks.append(_Chunks.build(arcs, other[arcs], node[arcs], slot)
                          or _Run(arcs, other[arcs], node[arcs], slot))
    return blocks


@dataclass
class DagPlan:
    """Graph-only precomputation: node levels and the blocks used by the two recursions."""

    num_nodes: int
    src: np.ndarray
    dst: np.ndarray
    level: np.ndarray           # longest hop distance from any root
    fwd_blocks: list            # arcs by (level[dst], dst): _Level / _Run, swept in order
    bwd_blocks: list            # arcs by (level[src] desc, src)

    @classmethod
    def build(cls, num_nodes: int, src, dst, *, vector_min_arcs: int = VECTOR_MIN_ARCS) -> "DagPlan":
        src = np.asarray(src, dtype=np.int64)
        dst = np.asarray(dst, dtype=np.int64)
        if src.shape != dst.shape or src.ndim != 1:
            raise ValueError("src and dst must be 1-D arrays of equal length")
        if src.size and (src.min() < 0 or dst.max() >= num_nodes):
            raise ValueError("arc endpoints out of range")
        if np.any(src >= dst):
            raise ValueError("nodes must be numbered in topological order (src < dst on every arc)")
        level = _levels(num_nodes, src, dst)
        maxlev = level.max(initial=0)
        fwd = np.lexsort((dst, level[dst]))
        bwd = np.lexsort((src, maxlev - level[src]))
        return cls(num_nodes, src, dst, level,
                   _blocks(fwd, level[dst], src, dst, vector_min_arcs),
                   _blocks(bwd, maxlev - level[src], dst, src, vector_min_arcs))


def _levels(num_nodes: int, src: np.ndarray, dst: np.ndarray) -> np.ndarray:
    """Longest hop distance from a root.

    Vectorised Kahn rounds while the frontier is wide; once it narrows, the remaining nodes are finished
    by one pass over their arcs in tail order (src < dst, so a tail's level is final when its arcs are
    read). Each round costs O(frontier + its arcs), so the whole is linear in arcs for any depth.
    """
    indeg = np.bincount(dst, minlength=num_nodes)
    out_order = np.argsort(src, kind="stable")
    out_ptr = np.r_[0, np.cumsum(np.bincount(src, minlength=num_nodes))]
    level = np.zeros(num_nodes, dtype=np.int64)
    done = np.zeros(num_nodes, dtype=bool)
    remaining = indeg.copy()
    frontier = np.flatnonzero(indeg == 0)
    lev = 0
    while frontier.size >= 32:
        level[frontier] = lev
        done[frontier] = True
        starts, ends = out_ptr[frontier], out_ptr[frontier + 1]
        cnt = ends - starts
        total = int(cnt.sum())
        if total == 0:
            frontier = frontier[:0]
            break
        idx = np.repeat(starts - np.r_[0, np.cumsum(cnt)[:-1]], cnt) + np.arange(total)
        tails_heads = dst[out_order[idx]]
        if total * 8 >= num_nodes:          # a wide round: one dense count beats sorting
            dec = np.bincount(tails_heads, minlength=num_nodes)
            heads = np.flatnonzero(dec)
            dec = dec[heads]
        else:
            heads, dec = np.unique(tails_heads, return_counts=True)
        remaining[heads] -= dec
        frontier = heads[remaining[heads] == 0]
        lev += 1
    level[frontier] = lev
    done[frontier] = True
    if not done.all():
        # finish the narrow rest: every open node's level is max over its in-arcs of (tail's level + 1), the
        # same (max, +) recursion as a sweep, in node order (src < dst); chunked where that pays
        open_arcs = np.flatnonzero(~done[dst])
        open_arcs = open_arcs[np.argsort(dst[open_arcs], kind="stable")]
        chunks = _Chunks.build(open_arcs, src[open_arcs], dst[open_arcs], np.full(num_nodes, -1, dtype=np.int64))
        if chunks is not None:
            pot = np.where(done, level, -np.inf)
            chunks.sweep(pot, np.ones(src.size), True)
            return pot.astype(np.int64)
        from_done = open_arcs[done[src[open_arcs]]]
        np.maximum.at(level, dst[from_done], level[src[from_done]] + 1)
        rest = open_arcs[~done[src[open_arcs]]]
        rest = rest[np.argsort(src[rest], kind="stable")]
        lv = level.tolist()
        for u, v in zip(src[rest].tolist(), dst[rest].tolist()):
            x = lv[u] + 1
            if x > lv[v]:
                lv[v] = x
        level = np.asarray(lv, dtype=np.int64)
    return level


def _sweep(blocks, pot: np.ndarray, w: np.ndarray, hard: bool) -> np.ndarray:
    """pot[node] = LSE (or max) over the block's arcs of pot[other end] + w; in place, block by block."""
    exp, log, inf = math.exp, math.log, math.inf
    with np.errstate(invalid="ignore", under="ignore", divide="ignore"):
        for lv in blocks:
            if isinstance(lv, _Chunks):
                lv.sweep(pot, w, hard)
                continue
            if isinstance(lv, _Run):
                base = w[lv.arcs]                            # w, plus the tail's value when it is outside
                base[lv.outside] += pot[lv.outside_other]
                base = base.tolist()
                local, bounds = lv.local, lv.bounds
                vals = [0.0] * (len(bounds) - 1) + [0.0]    # the last slot: "outside", adds nothing
                for i in range(len(bounds) - 1):
                    lo, hi = bounds[i], bounds[i + 1]
                    if hi - lo == 1:
                        vals[i] = base[lo] + vals[local[lo]]
                        continue
                    xs = [base[k] + vals[local[k]] for k in range(lo, hi)]
                    m = max(xs)
                    if hard or m == -inf:
                        vals[i] = m
                    else:
                        vals[i] = m + log(sum([exp(x - m) for x in xs]))
                pot[lv.nodes] = vals[:-1]
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
    return _sweep(plan.fwd_blocks, alpha, w, hard)


def _backward(plan: DagPlan, w: np.ndarray, sink: int, hard: bool) -> np.ndarray:
    """gamma[u] = LSE (or max) over out-arcs of w_uv + gamma[v]; gamma[sink] = 0 (no out-arcs)."""
    gamma = np.full(plan.num_nodes, -np.inf)
    gamma[sink] = 0.0
    return _sweep(plan.bwd_blocks, gamma, w, hard)


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
