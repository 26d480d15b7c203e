"""MixNet (regionally reconfigurable OCS for MoE training): circuits, all-to-all time, iteration timeline.

Spec: algorithms.md §6. Units: bytes, bytes/s, seconds. Pure numpy/scipy; no I/O.

- `greedy_circuits`: the paper's Algorithm 1, one walk over the pairs sorted by T plus a re-insertion
  heap (`code_compat=True` reproduces the released simulator's repeated division); `exact_circuits`: MILP (HiGHS) or brute force; `greedy_gap_report`.
- `all_to_all_time`: dedicated circuits for paired servers, the rest over each server's EPS NICs;
  `hybrid_all_to_all_time`: paired servers may also spill onto the EPS.
- `moe_dispatch_bytes` / `server_demand`: the regional demand matrix of one MoE layer and micro-batch.
- `build_timeline` → `Timeline`: per-iteration pipeline timeline with one reconfiguration per
  (region, layer, micro-batch, direction); `Timeline.times(delays)` evaluates it for any per-trigger delays,
  `sample_iteration_times` draws each delay from `CycleDelays` (whole cycles, or shared + per-port parts).
"""
from __future__ import annotations

import heapq
import itertools
import math
from dataclasses import dataclass, field, replace
from functools import cached_property, lru_cache
from typing import Callable, Literal

import numpy as np

from analysis import moe_models as mm

GBPS = 1.25e8  # bytes/s per Gb/s

__all__ = [
    "MixnetInputError", "greedy_circuits", "all_to_all_time", "hybrid_all_to_all_time", "exact_circuits",
    "greedy_gap_report", "expert_popularity", "moe_dispatch_bytes", "server_demand", "rank_servers", "Fabric",
    "fabric_a2a_time", "ports_switched", "Timeline", "build_timeline", "traffic_from_matrices", "CycleDelays",
    "delay_model_of", "draw_delays", "sample_iteration_times", "sample_iteration_times_many",
    "same_reconfigurations", "constant_delay_times", "break_even_delay",
]


class MixnetInputError(ValueError):
    """Invalid demand matrix, circuit matrix, port budget or bandwidth."""


# ----------------------------------------------------------------------------------------------------------
# validation helpers

def _demand(demand) -> np.ndarray:
    d = np.asarray(demand, dtype=float)
    if d.ndim != 2 or d.shape[0] != d.shape[1]:
        raise MixnetInputError(f"demand must be a square matrix, got shape {d.shape}")
    if not np.all(np.isfinite(d)) or np.any(d < 0):
        raise MixnetInputError("demand must be finite and non-negative")
    d = d.copy()
    np.fill_diagonal(d, 0.0)  # a server's traffic to itself never crosses the network
    return d


def _per_server(value, n: int, what: str, integer: bool = False) -> np.ndarray:
    v = np.full(n, float(value)) if np.ndim(value) == 0 else np.asarray(value, dtype=float)
    if v.shape != (n,):
        raise MixnetInputError(f"{what} must be a scalar or have length {n}, got shape {v.shape}")
    if not np.all(np.isfinite(v)) or np.any(v < 0):
        raise MixnetInputError(f"{what} must be finite and non-negative")
    if integer:
        if np.any(v != np.round(v)):
            raise MixnetInputError(f"{what} must be integers")
        return v.astype(np.int64)
    return v


@lru_cache(maxsize=256)
def _scalar_per_server(value: float, n: int, what: str, integer: bool = False) -> np.ndarray:
    """`_per_server` of a scalar, one read-only array per value and size (the memoised paths ask again and
    again)."""
    v = _per_server(value, n, what, integer)
    v.setflags(write=False)
    return v


def _positive(x: float, what: str) -> float:
    x = float(x)
    if not np.isfinite(x) or x <= 0:
        raise MixnetInputError(f"{what} must be a positive finite number, got {x}")
    return x


def _pair_demand(d: np.ndarray) -> np.ndarray:
    # circuits are full duplex: a pair's transfer time is set by its heavier direction
    return np.maximum(d, d.T)


# ----------------------------------------------------------------------------------------------------------
# circuits

def greedy_circuits(demand, ports_per_server, b_ocs: float, b_eps, code_compat: bool = False,
                    method: Literal["heap", "argmax"] = "heap") -> np.ndarray:
    """Algorithm 1: repeatedly give one more circuit to the pair whose transfer is currently slowest.

    Returns an n×n symmetric int matrix of circuit counts, zero diagonal, row sums ≤ ports_per_server.
    Paper reading: T starts at D/B_eps and becomes D/(c·B_ocs); `code_compat` starts at raw D and divides
    the current value by c·B_ocs each time (the released simulator). Ties go to the lowest (i, j).
    `method="argmax"` is the literal O(n²)-per-step loop of the spec (reference for tests/benchmarks).
    """
    d = _demand(demand)
    n = d.shape[0]
    scalar = np.ndim(ports_per_server) == 0 and np.ndim(b_eps) == 0
    per_server = _scalar_per_server if scalar else _per_server
    ports = per_server(ports_per_server, n, "ports_per_server", True)
    b_ocs = _positive(b_ocs, "b_ocs")
    eps = per_server(b_eps, n, "b_eps")
    pair = _pair_demand(d)
    if code_compat:
        t0 = pair.copy()
    else:
        if np.any(eps <= 0):
            raise MixnetInputError("b_eps must be positive (the paper's T = D/B_eps)")
        t0 = pair / np.minimum.outer(eps, eps)
    np.fill_diagonal(t0, 0.0)
    circuits = np.zeros((n, n), dtype=np.int64)
    free = ports.copy()

    def next_time(i: int, j: int, current: float) -> float:
        c = circuits[i, j]
        return current / (c * b_ocs) if code_compat else pair[i, j] / (c * b_ocs)

    # a pair stays a candidate while it has demand and both ends have a free port; liveness is decided on D,
    # not on T, so that a T that underflows to 0 (subnormal demand) does not end the loop early
    if method == "argmax":
        t = t0.copy()
        while True:
            live = (pair > 0) & (free[:, None] > 0) & (free[None, :] > 0)
            if not live.any():
                break
            flat = int(np.argmax(np.where(live, t, -1.0)))
            i, j = divmod(flat, n)
            circuits[i, j] += 1
            circuits[j, i] += 1
            free[i] -= 1
            free[j] -= 1
            t[i, j] = t[j, i] = next_time(i, j, t[i, j])
        return circuits
    if method != "heap":
        raise MixnetInputError(f"unknown method {method!r}")

    # Pairs i<j in descending (T, then lowest (i, j)) order, walked once; a pair that got a circuit goes back,
    # with its smaller T, into a small heap of (-T, i, j). The next pick is the better of the two heads, so
    # the order is exactly Algorithm 1's; pairs whose ends are full are skipped as the walk reaches them.
    iu, ju = _pairs(n)
    live = (pair[iu, ju] > 0) & (free[iu] > 0) & (free[ju] > 0)
    iu, ju = iu[live], ju[live]
    neg = -t0[iu, ju]
    order = np.lexsort((ju, iu, neg))
    walk_t, walk_i, walk_j = neg[order].tolist(), iu[order].tolist(), ju[order].tolist()
    left = free.tolist()
    again: list[tuple[float, int, int]] = []
    p, end = 0, len(walk_t)
    while True:
        while p < end and (left[walk_i[p]] == 0 or left[walk_j[p]] == 0):
            p += 1
        while again and (left[again[0][1]] == 0 or left[again[0][2]] == 0):
            heapq.heappop(again)
        if p < end and (not again or (walk_t[p], walk_i[p], walk_j[p]) < again[0]):
            neg_t, i, j = walk_t[p], walk_i[p], walk_j[p]
            p += 1
        elif again:
            neg_t, i, j = heapq.heappop(again)
        else:
            break
        circuits[i, j] += 1
        circuits[j, i] += 1
        left[i] -= 1
        left[j] -= 1
        if left[i] > 0 and left[j] > 0:
            heapq.heappush(again, (-next_time(i, j, -neg_t), i, j))
    return circuits


def _check_circuits(circuits, n: int) -> np.ndarray:
    c = np.asarray(circuits)
    if c.shape != (n, n):
        raise MixnetInputError(f"circuits must have shape {(n, n)}, got {c.shape}")
    if np.any(c < 0) or np.any(c != np.round(c)) or np.any(c != c.T) or np.any(np.diag(c) != 0):
        raise MixnetInputError("circuits must be a symmetric non-negative integer matrix with zero diagonal")
    return c.astype(np.int64)


def all_to_all_time(demand, circuits, b_ocs: float, b_eps) -> float:
    """T = max(max over circuit pairs of D/(c·B_ocs), max over servers of uncovered egress/ingress / B_eps).

    For a symmetric D this is exactly the spec's model; for an asymmetric D a circuit pair is limited by
    its heavier direction and a server's EPS NICs by the larger of egress and ingress.
    """
    d = _demand(demand)
    n = d.shape[0]
    return _dedicated_time(d, _check_circuits(circuits, n), _positive(b_ocs, "b_ocs"), _per_server(b_eps, n, "b_eps"))


def _dedicated_time(d: np.ndarray, c: np.ndarray, b_ocs: float, eps: np.ndarray) -> float:
    pair = _pair_demand(d)
    with_circuit = c > 0
    circuit_time = float(np.max(pair[with_circuit] / (c[with_circuit] * b_ocs), initial=0.0))
    uncovered = np.where(with_circuit, 0.0, d)
    load = np.maximum(uncovered.sum(axis=1), uncovered.sum(axis=0))
    with np.errstate(divide="ignore", invalid="ignore"):
        eps_time = np.where(load > 0, load / eps, 0.0)
    return max(circuit_time, float(eps_time.max(initial=0.0)))


def _eps_root(m: np.ndarray, cap: np.ndarray, eps: np.ndarray) -> np.ndarray:
    """Per row i: least T with sum_j max(0, m_ij - cap_ij*T) <= eps_i*T (exact, piecewise linear).

    Pair j stops spilling at its breakpoint m_ij/cap_ij (never without a circuit). Between consecutive
    sorted breakpoints the spill is linear, A − S·T, so each segment has one candidate root A/(S + eps);
    the answer is the candidate that lies inside its own segment (the spill minus eps·T is decreasing).
    """
    n = m.shape[0]
    with np.errstate(divide="ignore", invalid="ignore"):
        bp = np.where(cap > 0, m / np.where(cap > 0, cap, 1.0), np.inf)
    order = np.argsort(bp, axis=1, kind="stable")
    bp = np.take_along_axis(bp, order, axis=1)
    mi = np.take_along_axis(m, order, axis=1)
    ci = np.take_along_axis(cap, order, axis=1)
    zero = np.zeros((n, 1))
    a = np.concatenate([np.cumsum(mi[:, ::-1], axis=1)[:, ::-1], zero], axis=1)   # spill still active from r
    s = np.concatenate([np.cumsum(ci[:, ::-1], axis=1)[:, ::-1], zero], axis=1)
    lower = np.concatenate([zero, bp], axis=1)
    upper = np.concatenate([bp, np.full((n, 1), np.inf)], axis=1)
    with np.errstate(divide="ignore", invalid="ignore"):
        t = np.where(a > 0, a / (s + eps[:, None]), 0.0)
    ok = (t >= lower * (1 - 1e-12)) & (t <= upper * (1 + 1e-12))
    first = np.argmax(ok, axis=1)
    return np.where(ok.any(axis=1), t[np.arange(n), first], np.inf)


def hybrid_all_to_all_time(demand, circuits, b_ocs: float, b_eps) -> float:
    """All-to-all time when a pair's bytes may be split between its circuits and the EPS.

    The EPS is non-blocking and limited only by each server's EPS NICs (egress and ingress); a pair's
    spill at time T is max(0, D_ij − c_ij·B_ocs·T), which is the least any schedule must send over the
    EPS, so T* = max over servers and directions of the root of spill(T) = B_eps,i·T. Never slower than
    `all_to_all_time`.
    """
    d = _demand(demand)
    n = d.shape[0]
    return _hybrid_time(d, _check_circuits(circuits, n), _positive(b_ocs, "b_ocs"), _per_server(b_eps, n, "b_eps"))


def _hybrid_time(d: np.ndarray, c: np.ndarray, b_ocs: float, eps: np.ndarray) -> float:
    cap = c * b_ocs
    return float(max(_eps_root(d, cap, eps).max(initial=0.0), _eps_root(d.T, cap, eps).max(initial=0.0)))


@lru_cache(maxsize=64)
def _pairs(n: int) -> tuple[np.ndarray, np.ndarray]:
    """The pairs i < j of n servers (read-only)."""
    iu, ju = np.triu_indices(n, 1)
    iu.setflags(write=False)
    ju.setflags(write=False)
    return iu, ju


def _exact_milp(d: np.ndarray, ports: np.ndarray, b_ocs: float, eps: np.ndarray) -> np.ndarray:
    from scipy.optimize import Bounds, LinearConstraint, milp   # only here: the verdict's workers never solve one

    n = d.shape[0]
    if d.max(initial=0.0) > 0:
        # times scale linearly with D: solve at unit scale so HiGHS's absolute tolerances do not dominate
        d = d / (d.max() / b_ocs)
    iu, ju = _pairs(n)
    n_pairs = iu.size
    k_max = int(ports.max(initial=0))
    width = k_max + 1
    n_var = n_pairs * width + 1  # one-hot z[e, k] for k = 0..k_max, then T
    t_col = n_var - 1
    pair = _pair_demand(d)[iu, ju]
    rows, lo, hi = [], [], []

    def add_row(coeffs: dict[int, float], lower: float, upper: float) -> None:
        row = np.zeros(n_var)
        for idx, v in coeffs.items():
            row[idx] += v
        rows.append(row)
        lo.append(lower)
        hi.append(upper)

    for e in range(n_pairs):                                      # exactly one count per pair
        add_row({e * width + k: 1.0 for k in range(width)}, 1.0, 1.0)
    for i in range(n):                                            # port budgets
        coeffs: dict[int, float] = {}
        for e in np.flatnonzero((iu == i) | (ju == i)):
            for k in range(1, width):
                coeffs[e * width + k] = float(k)
        add_row(coeffs, -np.inf, float(ports[i]))
    for e in range(n_pairs):                                      # T >= D_e / (k B_ocs) for the chosen k
        if pair[e] > 0:
            coeffs = {t_col: 1.0}
            for k in range(1, width):
                coeffs[e * width + k] = -pair[e] / (k * b_ocs)
            add_row(coeffs, 0.0, np.inf)
    for i in range(n):                                            # T >= uncovered egress / ingress over EPS
        for direction in (d[i, :], d[:, i]):
            coeffs = {t_col: 1.0}
            for e in np.flatnonzero((iu == i) | (ju == i)):
                other = ju[e] if iu[e] == i else iu[e]
                if direction[other] > 0:
                    if eps[i] <= 0:
                        raise MixnetInputError("b_eps must be positive when demand can stay on the EPS")
                    coeffs[e * width] = -direction[other] / eps[i]
            add_row(coeffs, 0.0, np.inf)
    upper = np.ones(n_var)
    upper[t_col] = np.inf
    for e in range(n_pairs):                                      # a pair cannot exceed either budget
        cap = min(ports[iu[e]], ports[ju[e]])
        upper[e * width + cap + 1:(e + 1) * width] = 0.0
    objective = np.zeros(n_var)
    objective[t_col] = 1.0
    integrality = np.ones(n_var)
    integrality[t_col] = 0
    res = milp(objective, constraints=LinearConstraint(np.array(rows), lo, hi), integrality=integrality,
               bounds=Bounds(np.zeros(n_var), upper), options={"mip_rel_gap": 1e-9})
    if not res.success:
        raise RuntimeError(f"MILP failed: {res.message}")
    z = np.round(res.x[:t_col]).reshape(n_pairs, width)
    counts = z.argmax(axis=1)
    c = np.zeros((n, n), dtype=np.int64)
    c[iu, ju] = counts
    c[ju, iu] = counts
    return c


def _exact_brute(d: np.ndarray, ports: np.ndarray, b_ocs: float, eps: np.ndarray,
                 max_combinations: int) -> np.ndarray:
    n = d.shape[0]
    iu, ju = _pairs(n)
    k_max = int(ports.max(initial=0))
    total = (k_max + 1) ** iu.size
    if total > max_combinations:
        raise MixnetInputError(f"brute force needs {total} combinations (> {max_combinations}); use milp")
    pair = _pair_demand(d)[iu, ju]
    incidence = np.zeros((n, iu.size))
    incidence[iu, np.arange(iu.size)] = 1
    incidence[ju, np.arange(iu.size)] = 1
    egress = np.zeros((n, iu.size))
    ingress = np.zeros((n, iu.size))
    egress[iu, np.arange(iu.size)] = d[iu, ju]
    egress[ju, np.arange(iu.size)] = d[ju, iu]
    ingress[iu, np.arange(iu.size)] = d[ju, iu]
    ingress[ju, np.arange(iu.size)] = d[iu, ju]
    best_t, best = np.inf, None
    combos = itertools.product(range(k_max + 1), repeat=iu.size)
    while True:
        chunk = np.array(list(itertools.islice(combos, 200_000)), dtype=float)
        if chunk.size == 0:
            break
        chunk = chunk[np.all(chunk @ incidence.T <= ports, axis=1)]
        if chunk.size == 0:
            continue
        with np.errstate(divide="ignore"):
            circ = np.where(chunk > 0, pair / (np.maximum(chunk, 1) * b_ocs), 0.0).max(axis=1)
        off = (chunk == 0).astype(float)
        load = np.maximum(off @ egress.T, off @ ingress.T)
        with np.errstate(divide="ignore", invalid="ignore"):
            eps_t = np.where(load > 0, load / eps, 0.0).max(axis=1)
        t = np.maximum(circ, eps_t)
        k = int(np.argmin(t))
        if t[k] < best_t:
            best_t, best = t[k], chunk[k]
    c = np.zeros((n, n), dtype=np.int64)
    c[iu, ju] = best.astype(np.int64)
    c[ju, iu] = best.astype(np.int64)
    return c


def exact_circuits(demand, ports_per_server, b_ocs: float, b_eps,
                   method: Literal["milp", "brute"] = "milp",
                   max_combinations: int = 5_000_000) -> tuple[np.ndarray, float]:
    """Circuits minimising `all_to_all_time`: MILP with one-hot circuit counts, or brute force (small n)."""
    d = _demand(demand)
    n = d.shape[0]
    ports = _per_server(ports_per_server, n, "ports_per_server", integer=True)
    b_ocs = _positive(b_ocs, "b_ocs")
    eps = _per_server(b_eps, n, "b_eps")
    if method == "milp":
        c = _exact_milp(d, ports, b_ocs, eps)
    elif method == "brute":
        c = _exact_brute(d, ports, b_ocs, eps, max_combinations)
    else:
        raise MixnetInputError(f"unknown method {method!r}")
    return c, all_to_all_time(d, c, b_ocs, eps)


def greedy_gap_report(n_instances: int, n_servers: int, ports_per_server: int, b_ocs: float, b_eps: float,
                      seed: int = 0, method: Literal["milp", "brute"] = "milp",
                      code_compat: bool = False) -> dict:
    """Greedy vs exact all-to-all time on random symmetric U(0,1) demands: ratio statistics and worst case."""
    rng = np.random.default_rng(seed)
    ratios = np.empty(n_instances)
    worst: dict = {}
    for k in range(n_instances):
        upper = np.triu(rng.random((n_servers, n_servers)), 1)
        d = upper + upper.T
        g = all_to_all_time(d, greedy_circuits(d, ports_per_server, b_ocs, b_eps, code_compat), b_ocs, b_eps)
        _, opt = exact_circuits(d, ports_per_server, b_ocs, b_eps, method=method)
        ratios[k] = g / opt
        if ratios[k] >= ratios[: k + 1].max():
            worst = {"demand": d.round(6).tolist(), "greedy_time": float(g), "exact_time": float(opt)}
    return {
        "n_instances": int(n_instances), "n_servers": int(n_servers), "ports_per_server": int(ports_per_server),
        "b_ocs": float(b_ocs), "b_eps": float(b_eps), "seed": int(seed), "code_compat": bool(code_compat),
        "worst_ratio": float(ratios.max()), "mean_ratio": float(ratios.mean()),
        "p50_ratio": float(np.percentile(ratios, 50)), "p99_ratio": float(np.percentile(ratios, 99)),
        "fraction_optimal": float(np.mean(ratios <= 1 + 1e-9)), "worst_instance": worst,
    }


# ----------------------------------------------------------------------------------------------------------
# MoE traffic

def expert_popularity(n_layers: int, n_experts: int, skew: float, rng: np.random.Generator) -> np.ndarray:
    """Per-layer routing probabilities: Zipf(skew) over experts, randomly permuted per layer (skew 0 = uniform)."""
    if n_layers < 0 or n_experts < 1 or skew < 0:
        raise MixnetInputError("need n_layers >= 0, n_experts >= 1, skew >= 0")
    base = np.arange(1, n_experts + 1, dtype=float) ** -float(skew)
    base /= base.sum()
    return np.stack([base[rng.permutation(n_experts)] for _ in range(n_layers)]) if n_layers else \
        np.zeros((0, n_experts))


def moe_dispatch_bytes(tokens_per_rank: int, top_k: int, hidden: int, dtype_bytes: int,
                       expert_rank, popularity, rng: np.random.Generator | None = None,
                       n_ranks: int | None = None) -> np.ndarray:
    """Rank-to-rank dispatch bytes of one MoE layer and micro-batch (combine is the transpose).

    Each EP rank routes tokens_per_rank·top_k (token, expert) pairs with probabilities `popularity`;
    expected counts, or multinomial draws when `rng` is given (top-k sampled with replacement).
    `expert_rank[e]` is the EP rank hosting expert e. Entry [src, dst] includes src == dst (local).
    """
    expert_rank = np.asarray(expert_rank, dtype=np.int64)
    p = np.asarray(popularity, dtype=float)
    if p.shape != expert_rank.shape or p.ndim != 1:
        raise MixnetInputError("popularity and expert_rank must be 1-D with one entry per expert")
    if np.any(p < 0) or p.sum() <= 0 or np.any(expert_rank < 0):
        raise MixnetInputError("popularity must be non-negative with a positive sum; ranks >= 0")
    if min(tokens_per_rank, top_k, hidden, dtype_bytes) < 1:
        raise MixnetInputError("tokens_per_rank, top_k, hidden and dtype_bytes must be >= 1")
    p = p / p.sum()
    ranks = int(expert_rank.max()) + 1 if n_ranks is None else int(n_ranks)
    pairs = tokens_per_rank * top_k
    if rng is None:
        per_expert = np.broadcast_to(pairs * p, (ranks, p.size))
    else:
        per_expert = rng.multinomial(pairs, p, size=ranks).astype(float)
    placement = np.zeros((p.size, ranks))
    placement[np.arange(p.size), expert_rank] = 1.0
    return per_expert @ placement * float(hidden * dtype_bytes)


def rank_servers(n_ranks: int, tp: int, gpus_per_server: int = 8) -> np.ndarray:
    """Server index of each EP rank when rank r holds GPUs r·tp .. r·tp+tp−1."""
    return (np.arange(n_ranks) * tp) // gpus_per_server


def server_demand(rank_bytes, rank_server) -> np.ndarray:
    """Aggregate a rank×rank bytes matrix to servers; intra-server traffic (NVLink) is dropped."""
    r = np.asarray(rank_bytes, dtype=float)
    rank_server = np.asarray(rank_server, dtype=np.int64)
    if r.ndim != 2 or r.shape[0] != r.shape[1] or rank_server.shape != (r.shape[0],):
        raise MixnetInputError("rank_bytes must be square with one server index per rank")
    onehot = np.zeros((r.shape[0], int(rank_server.max()) + 1))
    onehot[np.arange(r.shape[0]), rank_server] = 1.0
    s = onehot.T @ r @ onehot
    np.fill_diagonal(s, 0.0)
    return s


# ----------------------------------------------------------------------------------------------------------
# fabrics

@dataclass(frozen=True)
class Fabric:
    """A network fabric for the iteration model. `alpha` of the NICs go to the regional OCS (MixNet only)."""

    kind: Literal["fat_tree", "rail_optimized", "mixnet"]
    link_gbps: float
    alpha: int = 6
    nics_per_server: int = 8
    nvlink_bytes_per_s: float = 450e9     # per GPU; rail-optimized forwards cross-rail bytes over NVLink
    code_compat_greedy: bool = True   # the simulator's greedy: spreads circuits, MixNet's best case here
    a2a_model: Literal["hybrid", "dedicated"] = "hybrid"   # may circuit pairs also use the EPS?
    greedy_eps: Literal["nic", "server"] = "nic"   # B_eps in the greedy's T = D/B_eps: one NIC or all EPS NICs
    # rail-optimized: traffic between GPUs of different rails crosses the spine, which carries this share of a
    # server's NIC bandwidth (1: never binds; a free parameter fitted on 100/400 Gb/s, claims.fit_rail_share)
    rail_spine_share: float = 1.0

    def __post_init__(self) -> None:
        if self.kind not in ("fat_tree", "rail_optimized", "mixnet"):
            raise MixnetInputError(f"unknown fabric {self.kind!r}")
        _positive(self.link_gbps, "link_gbps")
        if self.greedy_eps not in ("nic", "server"):
            raise MixnetInputError(f"unknown greedy_eps {self.greedy_eps!r}")
        if self.a2a_model not in ("hybrid", "dedicated"):
            raise MixnetInputError(f"unknown a2a_model {self.a2a_model!r}")
        if not 0 < self.rail_spine_share <= 1:
            raise MixnetInputError(f"rail_spine_share must be in (0, 1], got {self.rail_spine_share}")
        if self.kind == "mixnet" and not 1 <= self.alpha < self.nics_per_server:
            raise MixnetInputError(f"alpha must be in [1, {self.nics_per_server - 1}], got {self.alpha}")

    @property
    def nic_bytes_per_s(self) -> float:
        return self.link_gbps * GBPS

    @property
    def eps_bytes_per_s(self) -> float:
        """Per-server bandwidth into the packet-switched fabric."""
        eps_nics = self.nics_per_server - (self.alpha if self.kind == "mixnet" else 0)
        return eps_nics * self.nic_bytes_per_s


def fabric_a2a_time(demand, fabric: Fabric, circuits=None, cross_rail=None) -> float:
    """All-to-all time of a server-level demand on `fabric` (MixNet needs `circuits`). `cross_rail`: the part
    of `demand` between GPUs on different rails (rail-optimized only; None: none)."""
    d = _demand(demand)
    if fabric.kind == "mixnet":
        if circuits is None:
            raise MixnetInputError("mixnet needs circuits")
        circuits = _check_circuits(circuits, d.shape[0])
    return _fabric_time(d, fabric, circuits, None if cross_rail is None else _demand(cross_rail))


def _fabric_time(d: np.ndarray, fabric: Fabric, circuits: np.ndarray | None, cross: np.ndarray | None) -> float:
    """`fabric_a2a_time` on checked input: demands with a zero diagonal, circuits as `_check_circuits` gives."""
    if fabric.kind == "mixnet":
        model = _hybrid_time if fabric.a2a_model == "hybrid" else _dedicated_time
        return model(d, circuits, _positive(fabric.nic_bytes_per_s, "b_ocs"),
                     _scalar_per_server(fabric.eps_bytes_per_s, d.shape[0], "b_eps"))
    load = float(np.maximum(d.sum(axis=1), d.sum(axis=0)).max(initial=0.0))
    t = load / fabric.eps_bytes_per_s     # non-blocking: only the server's NICs limit
    if fabric.kind == "rail_optimized":
        # all but 1/g of a server's traffic changes rail: one NVLink hop first (PXN)
        g = fabric.nics_per_server
        t = max(t, load * (g - 1) / g / (g * fabric.nvlink_bytes_per_s))
        if cross is not None:
            most = float(np.maximum(cross.sum(axis=1), cross.sum(axis=0)).max(initial=0.0))
            t = max(t, most / (fabric.rail_spine_share * fabric.eps_bytes_per_s))
    return t


def ports_switched(old, new) -> int:
    """OCS ports re-pointed when moving from circuit matrix `old` to `new` (kept circuits stay put)."""
    return int(np.maximum(np.asarray(new) - np.asarray(old), 0).sum())


# ----------------------------------------------------------------------------------------------------------
# iteration timeline

@dataclass
class Timeline:
    """One training iteration on one fabric; evaluate with per-trigger delays.

    Pipeline (GPipe): stage s runs forward of micro-batches 0..m−1, then backward 0..m−1; activations and
    gradients cross stages over the EPS (`p2p_s`). Triggers (MixNet only) are the reconfigurations, one per
    (stage, MoE layer, micro-batch, direction); trigger k adds max(0, d_k − window_k) to its
    (stage, direction, micro-batch) when ports_k > 0.
    """

    fabric: Fabric
    overlap: str
    fwd_base: np.ndarray           # (S, m) seconds at d = 0
    bwd_base: np.ndarray           # (S, m)
    p2p_s: float
    dp: int
    trig_stage: np.ndarray         # (K,)
    trig_dir: np.ndarray           # (K,) 0 forward, 1 backward
    trig_mb: np.ndarray            # (K,)
    trig_window: np.ndarray        # (K,) seconds of compute that overlaps the reconfiguration
    trig_ports: np.ndarray         # (K,) OCS ports switched
    a2a_time: np.ndarray = field(default_factory=lambda: np.zeros(0))   # (K_layers,) for reporting
    circuits: list = field(default_factory=list)                         # per forward trigger
    trig_expert_s: np.ndarray = field(default_factory=lambda: np.zeros(0))  # (K,) expert compute next to k
    # the network's share of fwd_base / bwd_base (all-to-all and pipeline transfers); the rest is compute
    fwd_comm: np.ndarray | None = None     # (S, m)
    bwd_comm: np.ndarray | None = None     # (S, m)

    def scaled(self, compute: float = 1.0, comm: float = 1.0) -> "Timeline":
        """The same iteration with every compute time × `compute` (expert windows included) and every transfer
        × `comm` (all-to-alls and pipeline hops); reconfiguration delays are not scaled."""
        if compute <= 0 or comm <= 0:
            raise MixnetInputError(f"scales must be positive, got compute={compute}, comm={comm}")
        if self.fwd_comm is None or self.bwd_comm is None:
            raise MixnetInputError("this timeline does not separate compute from transfers (build it with "
                                   "build_timeline, or pass fwd_comm / bwd_comm)")
        def mix(base, net):
            return compute * (base - net) + comm * net
        expert = self.trig_expert_s * compute if self.trig_expert_s.size else self.trig_expert_s
        return replace(self, fwd_base=mix(self.fwd_base, self.fwd_comm), bwd_base=mix(self.bwd_base, self.bwd_comm),
                       fwd_comm=self.fwd_comm * comm, bwd_comm=self.bwd_comm * comm, p2p_s=self.p2p_s * comm,
                       trig_window=self.trig_window * compute, trig_expert_s=expert)

    def with_overlap(self, overlap: Literal["simulator", "all_hidden"]) -> "Timeline":
        """The same timeline under another overlap variant (windows re-derived from `trig_expert_s`)."""
        if overlap not in ("simulator", "all_hidden"):
            raise MixnetInputError(f"unknown overlap {overlap!r}")
        if self.trig_expert_s.shape != self.trig_window.shape:
            raise MixnetInputError("this timeline has no per-trigger expert compute times (build it with "
                                   "build_timeline, or pass trig_expert_s)")
        hidden = (self.trig_dir == 1) | (overlap == "all_hidden")
        return replace(self, overlap=overlap, trig_window=np.where(hidden, self.trig_expert_s, 0.0))

    @property
    def n_triggers(self) -> int:
        return int(self.trig_stage.size)

    @property
    def reconfigurations_per_region(self) -> int:
        """N_r = 2·L_r·m for the stage with the most MoE layers."""
        if not self.n_triggers:
            return 0
        return int(np.bincount(self.trig_stage).max())

    @cached_property
    def _slots(self) -> tuple[np.ndarray | None, np.ndarray, np.ndarray, bool]:
        """Triggers grouped by (stage, direction, micro-batch) slot: order (None: already in slot order),
        segment starts, slot ids, and whether every trigger switches ports."""
        m = self.fwd_base.shape[1]
        slot = (self.trig_stage * 2 + self.trig_dir) * m + self.trig_mb
        order = np.argsort(slot, kind="stable")
        starts = np.flatnonzero(np.r_[True, np.diff(slot[order]) != 0]) if slot.size else np.zeros(0, int)
        in_order = bool(np.array_equal(order, np.arange(order.size)))
        return None if in_order else order, starts, slot[order][starts], bool(np.all(self.trig_ports > 0))

    def times(self, delays) -> np.ndarray:
        """Iteration time (s) for per-trigger delays of shape (R, K) or (K,); returns (R,)."""
        s_count, m = self.fwd_base.shape
        d = np.atleast_2d(np.asarray(delays, dtype=float))
        if d.shape[1] != self.n_triggers:
            raise MixnetInputError(f"need {self.n_triggers} delays per replicate, got {d.shape[1]}")
        reps = d.shape[0]
        extra = np.zeros((s_count * 2 * m, reps))       # replicates last: _gpipe's steps are contiguous
        if self.n_triggers:
            order, starts, slots, all_switch = self._slots
            exposed = d - self.trig_window
            np.maximum(exposed, 0.0, out=exposed)
            if not all_switch:
                exposed *= self.trig_ports > 0
            # summed along the contiguous trigger axis (a slot's sum in numpy's pairwise order)
            extra[slots] = np.add.reduceat(exposed if order is None else exposed[:, order], starts, axis=1).T
        extra = extra.reshape(s_count, 2, m, reps)
        fwd = self.fwd_base[:, :, None] + extra[:, 0]
        bwd = self.bwd_base[:, :, None] + extra[:, 1]
        if reps == 1:
            return np.array([_gpipe_one(fwd[:, :, 0].tolist(), bwd[:, :, 0].tolist(), float(self.p2p_s))])
        return _gpipe(fwd, bwd, self.p2p_s)


def blend_timelines(a: Timeline, b: Timeline, weight: float) -> Timeline:
    """Timeline `a` with every all-to-all time moved `weight` of the way to `b`'s (0: a, 1: b). Both must be the
    same iteration with the same reconfigurations (they differ only in how an all-to-all uses the fabric)."""
    if not 0 <= weight <= 1:
        raise MixnetInputError(f"weight must be in [0, 1], got {weight}")
    same = a.fwd_base.shape == b.fwd_base.shape and np.array_equal(a.trig_ports, b.trig_ports) and \
        np.array_equal(a.trig_window, b.trig_window) and a.p2p_s == b.p2p_s
    if not same or a.fwd_comm is None or b.fwd_comm is None:
        raise MixnetInputError("blend_timelines needs two builds of one iteration with the same reconfigurations")
    def mix(x, y):
        return (1 - weight) * x + weight * y
    return replace(a, fwd_base=mix(a.fwd_base, b.fwd_base), bwd_base=mix(a.bwd_base, b.bwd_base),
                   fwd_comm=mix(a.fwd_comm, b.fwd_comm), bwd_comm=mix(a.bwd_comm, b.bwd_comm),
                   a2a_time=mix(a.a2a_time, b.a2a_time) if a.a2a_time.shape == b.a2a_time.shape else a.a2a_time)


def _gpipe(fwd: np.ndarray, bwd: np.ndarray, p2p: float) -> np.ndarray:
    """Finish time of a GPipe schedule, vectorised over replicates: fwd, bwd of shape (S, m, R). A micro-batch
    starts when the previous stage has handed it over (+ p2p) and its stage is done with the previous one;
    what comes from the previous stage is known for all its micro-batches at once."""
    s_count, m, reps = fwd.shape
    fe = np.empty((s_count, m, reps))
    for s in range(s_count):
        ready = np.maximum(0.0, fe[s - 1] + p2p) if s > 0 else np.zeros((m, reps))
        np.add(ready[0], fwd[s, 0], out=fe[s, 0])
        for b in range(1, m):
            np.add(np.maximum(ready[b], fe[s, b - 1]), fwd[s, b], out=fe[s, b])
    be = np.empty((s_count, m, reps))
    for s in reversed(range(s_count)):
        ready = np.maximum(fe[s, m - 1], be[s + 1] + p2p) if s < s_count - 1 else \
            np.broadcast_to(fe[s, m - 1], (m, reps))
        np.add(ready[0], bwd[s, 0], out=be[s, 0])
        for b in range(1, m):
            np.add(np.maximum(ready[b], be[s, b - 1]), bwd[s, b], out=be[s, b])
    return be[:, m - 1].max(axis=0)


def _max(a: float, b: float) -> float:
    return a if a != a or a >= b else b        # np.maximum's: NaN wins


def _gpipe_one(fwd: list, bwd: list, p2p: float) -> float:
    """`_gpipe` of one replicate on Python floats (the same operations; numpy's per-call cost is most of a
    one-replicate schedule): fwd, bwd as (S, m) nested lists."""
    s_count, m = len(fwd), len(fwd[0])
    fe = [[0.0] * m for _ in range(s_count)]
    for s in range(s_count):
        for b in range(m):
            ready = _max(0.0, fe[s - 1][b] + p2p) if s > 0 else 0.0
            fe[s][b] = (_max(ready, fe[s][b - 1]) if b > 0 else ready) + fwd[s][b]
    be = [[0.0] * m for _ in range(s_count)]
    for s in reversed(range(s_count)):
        for b in range(m):
            ready = _max(fe[s][m - 1], be[s + 1][b] + p2p) if s < s_count - 1 else fe[s][m - 1]
            be[s][b] = (_max(ready, be[s][b - 1]) if b > 0 else ready) + bwd[s][b]
    out = be[0][m - 1]
    for s in range(1, s_count):
        out = _max(out, be[s][m - 1])
    return out


TrafficFn = Callable[[int, int, int], np.ndarray]


def traffic_from_matrices(matrices, model: mm.MoeModel, par: mm.Parallelism) -> TrafficFn:
    """A `build_timeline` traffic function from {(moe_layer, micro_batch): rank×rank bytes} (global MoE
    layer index, e.g. the forward "dispatch_fwd" phases of one iteration of a `traces` MoE trace)."""
    offsets = np.cumsum([0] + [n_moe for _, n_moe in mm.stage_layers(model, par.pp)])
    table = {(int(k[0]), int(k[1])): v for k, v in dict(matrices).items()}

    def traffic(stage: int, layer: int, micro_batch: int) -> np.ndarray:
        key = (int(offsets[stage] + layer), micro_batch)
        if key not in table:
            raise MixnetInputError(f"no traffic matrix for MoE layer {key[0]}, micro-batch {key[1]} "
                                   f"(have {len(table)} matrices; the layout needs {model.n_moe_layers} layers "
                                   f"x {par.micro_batches} micro-batches)")
        return table[key]
    return traffic


# Pure functions of their arguments, memoised by value: a robustness grid rebuilds the same routing and
# circuits under other GPU/MFU/overlap assumptions, and the results are bit-identical either way.
_A2A_MEMO: dict[tuple, float] = {}
_A2A_MEMO_MAX = 1 << 16


def _a2a_key(demand: np.ndarray, fabric: Fabric, circuits, cross_rail=None) -> tuple:
    d = np.ascontiguousarray(demand, dtype=float)
    c = None if circuits is None else np.ascontiguousarray(circuits, dtype=np.int64).tobytes()
    x = None if cross_rail is None else np.ascontiguousarray(cross_rail, dtype=float).tobytes()
    return d.tobytes(), d.shape[0], fabric, c, x


def _remember(key: tuple, value: float) -> float:
    if len(_A2A_MEMO) >= _A2A_MEMO_MAX:
        _A2A_MEMO.clear()
    _A2A_MEMO[key] = value
    return value


def _memo_a2a(demand: np.ndarray, fabric: Fabric, circuits, cross_rail=None) -> float:
    key = _a2a_key(demand, fabric, circuits, cross_rail)
    if (value := _A2A_MEMO.get(key)) is not None:
        return value
    demand_bytes, n, _, c, x = key
    d = np.frombuffer(demand_bytes).reshape(n, n)
    return _remember(key, _fabric_time(d, fabric, None if c is None else np.frombuffer(c, dtype=np.int64).reshape(n, n),
                                       None if x is None else np.frombuffer(x).reshape(n, n)))


def _prefetch_hybrid_a2a(fabric: Fabric, pairs: list[tuple[np.ndarray, np.ndarray]]) -> None:
    """The hybrid all-to-all times of (demand, circuits) pairs not yet memoised, in one pass: `_eps_root` works
    row by row, so the pairs' matrices stacked give each pair's rows exactly as alone (the same numbers)."""
    todo: dict[tuple, tuple[np.ndarray, np.ndarray]] = {}
    for demand, circuits in pairs:
        key = _a2a_key(demand, fabric, circuits)
        if key not in _A2A_MEMO and key not in todo:
            todo[key] = (demand, circuits)
    if not todo:
        return
    n = next(iter(todo))[1]
    d = np.concatenate([np.ascontiguousarray(m, dtype=float) for m, _ in todo.values()])
    d_t = np.concatenate([np.ascontiguousarray(m, dtype=float).T for m, _ in todo.values()])
    cap = np.concatenate([c for _, c in todo.values()]) * _positive(fabric.nic_bytes_per_s, "b_ocs")
    eps = np.tile(_per_server(fabric.eps_bytes_per_s, n, "b_eps"), len(todo))
    out = _eps_root(d, cap, eps).reshape(len(todo), n).max(axis=1, initial=0.0)
    back = _eps_root(d_t, cap, eps).reshape(len(todo), n).max(axis=1, initial=0.0)
    for key, a, b in zip(todo, out, back):
        _remember(key, float(max(a, b)))


@lru_cache(maxsize=1 << 14)
def _greedy_by_bytes(demand: bytes, n: int, alpha: int, b_ocs: float, greedy_eps: float,
                     code_compat: bool) -> np.ndarray:
    c = greedy_circuits(np.frombuffer(demand).reshape(n, n), alpha, b_ocs, greedy_eps, code_compat=code_compat)
    c.setflags(write=False)
    return c


def _memo_greedy(demand: np.ndarray, fabric: Fabric, greedy_eps: float) -> np.ndarray:
    # keyed by what the greedy reads: fabrics that differ only in how an all-to-all uses the circuits share it
    d = np.ascontiguousarray(demand, dtype=float)
    return _greedy_by_bytes(d.tobytes(), d.shape[0], fabric.alpha, float(fabric.nic_bytes_per_s),
                            float(greedy_eps), bool(fabric.code_compat_greedy))


def _cross_rail(par: mm.Parallelism) -> np.ndarray:
    """Rank pairs on different rails: a rank's GPUs sit on rails (r·tp mod g) .. +tp−1."""
    rail = (np.arange(par.ep) * par.tp) % par.gpus_per_server
    return rail[:, None] != rail[None, :]


def _rank_traffic(mat: np.ndarray, token_bytes: int, servers_of_rank: np.ndarray, cross_rail: np.ndarray | None):
    """A rank×rank bytes matrix as a timeline reads it: (the most (token, expert) pairs one rank receives, the
    server demand, its cross-rail part — None without `cross_rail`)."""
    most = float((mat.sum(axis=0) / token_bytes).max())
    cross = None if cross_rail is None else server_demand(np.where(cross_rail, mat, 0.0), servers_of_rank)
    return most, server_demand(mat, servers_of_rank), cross


@lru_cache(maxsize=16)
def _routed_traffic(model: mm.MoeModel, par: mm.Parallelism, skew: float, seed: int, sampled_routing: bool,
                    dtype_bytes: int) -> tuple[dict, ...]:
    """`build_timeline`'s default traffic, per stage {(MoE layer, micro-batch): (the most (token, expert)
    pairs one rank receives, server demand, its cross-rail part)}: the routing depends on neither the fabric
    nor the GPU, so every fabric and link of one model and seed reads the same draws, made once."""
    rng = np.random.default_rng(seed)
    popularity = expert_popularity(model.n_moe_layers, model.n_experts, skew, rng)
    expert_rank = np.arange(model.n_experts) // (model.n_experts // par.ep)
    servers_of_rank = rank_servers(par.ep, par.tp, par.gpus_per_server)
    cross_rail = _cross_rail(par)
    out, offset = [], 0
    for _, n_moe in mm.stage_layers(model, par.pp):
        stage = {}
        for b in range(par.micro_batches):
            for l in range(n_moe):
                mat = moe_dispatch_bytes(par.tokens_per_rank, model.top_k, model.hidden, dtype_bytes, expert_rank,
                                         popularity[offset + l], rng if sampled_routing else None, n_ranks=par.ep)
                most, demand, cross = _rank_traffic(mat, model.hidden * dtype_bytes, servers_of_rank, cross_rail)
                demand.setflags(write=False)
                cross.setflags(write=False)
                stage[l, b] = (most, demand, cross)
        out.append(stage)
        offset += n_moe
    return tuple(out)


def _stage_network(traffic: dict, n_moe: int, m: int, fabric: Fabric, reconfigure: str,
                   region_servers: int) -> tuple[dict, list]:
    """One stage's network side of `build_timeline`, which no GPU, MFU or overlap assumption changes, from its
    traffic {(MoE layer, micro-batch): (the most (token, expert) pairs one rank receives, server demand, its
    cross-rail part)}: ({(l, b): most}, per trigger in the order the stage's region meets them — forward (b, l),
    then backward (b, l↓) — (direction, b, l, all-to-all time on the new circuits, on the previous ones, ports
    switched, the new circuits; the last two None off MixNet))."""
    sequence = [(0, b, l) for b in range(m) for l in range(n_moe)] + \
               [(1, b, l) for b in range(m) for l in reversed(range(n_moe))]
    mixnet = fabric.kind == "mixnet"
    circuits = {}
    if mixnet:
        greedy_eps = fabric.nic_bytes_per_s if fabric.greedy_eps == "nic" else fabric.eps_bytes_per_s
        for lb, (_, demand, _) in traffic.items():
            circuits[lb] = _memo_greedy(demand, fabric, greedy_eps)
    previous = circuits[sequence[-1][2], sequence[-1][1]] if circuits and sequence else None
    if mixnet and fabric.a2a_model == "hybrid":
        wanted, before = [], previous
        for _, b, l in sequence:
            wanted += [(traffic[l, b][1], circuits[l, b]), (traffic[l, b][1], before)]
            before = circuits[l, b]
        _prefetch_hybrid_a2a(fabric, wanted)
    steps = []
    for direction, b, l in sequence:
        _, demand, cross = traffic[l, b]
        if mixnet:
            now = circuits[l, b]
            a2a_new = _memo_a2a(demand, fabric, now)
            a2a_old = a2a_new if np.array_equal(previous, now) else _memo_a2a(demand, fabric, previous)
            ports = fabric.alpha * region_servers if reconfigure == "always" else ports_switched(previous, now)
            steps.append((direction, b, l, a2a_new, a2a_old, ports, now))
            previous = now
        else:
            a2a = _memo_a2a(demand, fabric, None, cross if fabric.kind == "rail_optimized" else None)
            steps.append((direction, b, l, a2a, a2a, None, None))
    return {lb: most for lb, (most, _, _) in traffic.items()}, steps


@lru_cache(maxsize=512)
def _routed_network(model: mm.MoeModel, par: mm.Parallelism, fabric: Fabric, reconfigure: str, skew: float,
                    seed: int, sampled_routing: bool, dtype_bytes: int) -> tuple:
    """`_stage_network` of every stage on the default routing: a grid's points under other GPU, MFU or overlap
    assumptions share it."""
    routed = _routed_traffic(model, par, skew, seed, sampled_routing, dtype_bytes)
    return tuple(_stage_network(routed[s], n_moe, par.micro_batches, fabric, reconfigure, par.region_servers)
                 for s, (_, n_moe) in enumerate(mm.stage_layers(model, par.pp)))


def build_timeline(model: mm.MoeModel, par: mm.Parallelism, gpu: mm.GpuSpec, fabric: Fabric, *,
                   overlap: Literal["simulator", "all_hidden"] = "simulator",
                   reconfigure: Literal["always", "on_change"] = "always",
                   skew: float = 0.5, sampled_routing: bool = True, seed: int = 0,
                   traffic: TrafficFn | None = None, traffic_level: Literal["rank", "server"] = "rank",
                   dtype_bytes: int = mm.DTYPE_BYTES) -> Timeline:
    """Per-iteration timeline of `model` under `par` on `fabric` (see `Timeline`).

    Traffic per (stage, MoE layer within stage, micro-batch) is `traffic(s, l, b)` — a rank×rank bytes
    matrix (`traffic_level="rank"`) or a server×server one — or, by default, `moe_dispatch_bytes` with
    per-layer Zipf(skew) popularity and contiguous expert placement, seeded by `seed`.
    Overlap windows: "simulator" = forward exposed, backward hidden behind the backward expert compute;
    "all_hidden" = both directions hidden behind the expert compute (the paper's claim).
    Reconfiguration: "always" = every trigger re-applies the region's topology and waits for all its
    α·n OCS ports (the simulator pauses the region at every trigger); "on_change" = only ports whose
    circuit changes are switched, and a trigger that changes nothing costs nothing.
    """
    mm.validate(model, par)
    if overlap not in ("simulator", "all_hidden"):
        raise MixnetInputError(f"unknown overlap {overlap!r}")
    if reconfigure not in ("always", "on_change"):
        raise MixnetInputError(f"unknown reconfigure {reconfigure!r}")
    stages = mm.stage_layers(model, par.pp)
    m = par.micro_batches
    rate = par.tp * gpu.flops                        # FLOP/s of one EP rank (a TP group)
    tokens = par.tokens_per_rank
    t_attn = tokens * mm.attention_flops_per_token(model, par.seq_len) / rate
    t_shared = tokens * mm.local_ffn_flops_per_token(model, dense=False) / rate
    t_dense = tokens * mm.local_ffn_flops_per_token(model, dense=True) / rate
    t_head = tokens * mm.head_flops_per_token(model) / rate
    per_assignment = mm.expert_flops_per_assignment(model) / rate
    servers_of_rank = rank_servers(par.ep, par.tp, par.gpus_per_server)
    network = _routed_network(model, par, fabric, reconfigure, skew, seed, sampled_routing, dtype_bytes) \
        if traffic is None else None
    ranks_per_server = par.gpus_per_server // par.tp
    cross_rail = _cross_rail(par)
    rails = fabric.kind == "rail_optimized"
    p2p = ranks_per_server * tokens * model.hidden * dtype_bytes / fabric.eps_bytes_per_s if par.pp > 1 else 0.0

    fwd_base = np.zeros((par.pp, m))
    bwd_base = np.zeros((par.pp, m))
    fwd_comm = np.zeros((par.pp, m))
    bwd_comm = np.zeros((par.pp, m))
    trig = {k: [] for k in ("stage", "dir", "mb", "window", "ports", "expert")}
    a2a_log, circuit_log = [], []
    for s, (n_dense, n_moe) in enumerate(stages):
        head = t_head if s == par.pp - 1 else 0.0
        fwd_base[s] += n_dense * (t_attn + t_dense) + head
        bwd_base[s] += 2 * (n_dense * (t_attn + t_dense) + head)
        if network is not None:
            most_of, steps = network[s]
        else:
            given = {}
            for b in range(m):
                for l in range(n_moe):
                    if traffic_level == "rank":
                        given[l, b] = _rank_traffic(np.asarray(traffic(s, l, b), dtype=float),
                                                    model.hidden * dtype_bytes, servers_of_rank,
                                                    cross_rail if rails else None)
                    else:
                        demand = _demand(np.asarray(traffic(s, l, b), dtype=float))
                        # unknown per rank: balanced; ranks spread evenly over rails: the share of rank pairs on
                        # other rails
                        given[l, b] = (float(tokens * model.top_k), demand,
                                       demand * float(cross_rail.mean()) if rails else None)
            most_of, steps = _stage_network(given, n_moe, m, fabric, reconfigure, par.region_servers)
        expert_times = {lb: most * per_assignment for lb, most in most_of.items()}
        for direction, b, l, a2a_new, a2a_old, ports, now in steps:
            t_exp = expert_times[l, b]
            if fabric.kind == "mixnet":
                trig["stage"].append(s)
                trig["dir"].append(direction)
                trig["mb"].append(b)
                # the expert compute beside the reconfiguration: forward t_exp, backward 2·t_exp
                trig["expert"].append(t_exp if direction == 0 else 2 * t_exp)
                hidden = direction == 1 or overlap == "all_hidden"
                trig["window"].append(trig["expert"][-1] if hidden else 0.0)
                trig["ports"].append(ports)
                if direction == 0:
                    circuit_log.append(now)
            if direction == 0:
                fwd_base[s, b] += t_attn + t_shared + 2 * a2a_new + t_exp
                fwd_comm[s, b] += 2 * a2a_new
                a2a_log.append(a2a_new)
            else:  # combine-grad all-to-all still runs on the previous circuits
                bwd_base[s, b] += 2 * (t_attn + t_shared) + a2a_old + 2 * t_exp + a2a_new
                bwd_comm[s, b] += a2a_old + a2a_new
    as_array = {k: np.asarray(v, dtype=float if k in ("window", "expert") else np.int64) for k, v in trig.items()}
    return Timeline(fabric=fabric, overlap=overlap, fwd_base=fwd_base, bwd_base=bwd_base, p2p_s=p2p,
                    dp=par.dp, trig_stage=as_array["stage"], trig_dir=as_array["dir"], trig_mb=as_array["mb"],
                    trig_window=as_array["window"], trig_ports=as_array["ports"],
                    a2a_time=np.asarray(a2a_log), circuits=circuit_log, trig_expert_s=as_array["expert"],
                    fwd_comm=fwd_comm, bwd_comm=bwd_comm)


def constant_delay_times(timeline: Timeline, delays_s) -> np.ndarray:
    """Iteration time for each constant delay d (every reconfiguration that switches ports takes d)."""
    d = np.atleast_1d(np.asarray(delays_s, dtype=float))
    return timeline.times(np.repeat(d[:, None], timeline.n_triggers, axis=1))


@dataclass(frozen=True)
class CycleDelays:
    """Measured reconfiguration delays with the bench's structure: the cycle is the unit of replication.

    `per_port` (C, P): each port's delay (s) in cycle c, NaN where a port gave no sample; `shared` (C,): the
    cycle's shared OCS component (one switch draw per cycle, e.g. its command completion), so
    `per_port − shared` is each port's own (NIC) component. `source` names where the numbers come from.
    """

    per_port: np.ndarray
    shared: np.ndarray
    source: str = "unspecified"

    def __post_init__(self) -> None:
        pp = np.atleast_2d(np.asarray(self.per_port, dtype=float))
        sh = np.asarray(self.shared, dtype=float).ravel()
        if pp.ndim != 2 or sh.shape != (pp.shape[0],):
            raise MixnetInputError(f"per_port must be (cycles, ports) and shared (cycles,), got {pp.shape} and "
                                   f"{sh.shape}")
        keep = np.isfinite(pp).any(axis=1)
        pp, sh = pp[keep], sh[keep]
        finite = pp[np.isfinite(pp)]
        if pp.shape[0] == 0 or np.any(finite < 0) or np.any(~np.isfinite(pp) & ~np.isnan(pp)):
            raise MixnetInputError("delays need at least one cycle of finite, non-negative seconds")
        if not np.all(np.isfinite(sh)) or np.any(sh < 0):
            raise MixnetInputError("the shared component must be finite and non-negative")
        object.__setattr__(self, "per_port", pp)
        object.__setattr__(self, "shared", sh)

    @classmethod
    def independent(cls, samples, source: str = "unspecified") -> "CycleDelays":
        """Each sample its own one-port cycle with no shared component (only for data that truly is i.i.d.)."""
        a = np.asarray(samples, dtype=float).ravel()
        return cls(a[:, None], np.zeros(a.size), source)

    @property
    def n_cycles(self) -> int:
        return int(self.per_port.shape[0])

    @property
    def bench_ports(self) -> int:
        """Ports observed together in one cycle (the most the joint distribution can speak for)."""
        return int(np.isfinite(self.per_port).sum(axis=1).max())

    def samples(self) -> np.ndarray:
        return self.per_port[np.isfinite(self.per_port)]

    def cycle_max(self) -> np.ndarray:
        """Per cycle: the slowest port (the cycle's own reconfiguration delay)."""
        return np.nanmax(self.per_port, axis=1)

    def take(self, cycles) -> "CycleDelays":
        """The delays of the given cycles (a cluster-bootstrap resample when drawn with replacement)."""
        idx = np.asarray(cycles, dtype=np.int64)
        return replace(self, per_port=self.per_port[idx], shared=self.shared[idx])


def delay_model_of(ports, bench_ports: int) -> dict:
    """Which delay model serves reconfigurations switching `ports`: whole cycles ("joint") while k is at most
    the bench's ports, the fitted shared + per-port decomposition beyond."""
    k = np.asarray(ports)
    k = k[k > 0]
    joint = int(np.sum(k <= bench_ports))
    method = "none" if k.size == 0 else "joint" if joint == k.size else "decomposed" if joint == 0 else "mixed"
    return {"method": method, "bench_ports": int(bench_ports), "max_ports_switched": int(k.max(initial=0)),
            "switching_reconfigurations": int(k.size), "joint": joint, "decomposed": int(k.size - joint)}


@lru_cache(maxsize=64)
def _max_rank_cdf(p_max: int) -> np.ndarray:
    """F[p, k, i] = P(the slowest of a random k-subset of p ports has rank <= i+1) = C(i+1, k) / C(p, k)."""
    f = np.ones((p_max + 1, p_max + 1, p_max))
    for p in range(1, p_max + 1):
        for k in range(1, p + 1):
            for i in range(p):
                f[p, k, i] = math.comb(i + 1, k) / math.comb(p, k)
    return f


def draw_delays(ports, delays: CycleDelays, n_rows: int, rng: np.random.Generator) -> np.ndarray:
    """Per-reconfiguration delays (n_rows, K) for reconfigurations that switch `ports[k]` ports each.

    k <= the ports of a drawn cycle: the slowest of a random k-subset of that one cycle's ports (the
    measured joint distribution, resampled by cycle — never a max over ports of different cycles).
    k beyond: the drawn cycle's shared component + the max of k i.i.d. per-port components from the pool
    of every cycle's `per_port − shared` (exact inverse CDF of the max: index floor(n·U^(1/k))).
    A reconfiguration switching no port takes 0.
    """
    k = np.asarray(ports, dtype=np.int64).ravel()
    c = rng.integers(0, delays.n_cycles, size=(n_rows, k.size))
    u = rng.random((n_rows, k.size))
    return _DelayPool(delays).draw(k, np.arange(delays.n_cycles)[None], c[None], u[None])[0]


def draw_resampled_delays(ports, delays: CycleDelays, n_boot: int, n_rows: int,
                          rng: np.random.Generator) -> np.ndarray:
    """(n_boot, n_rows, K): per replicate, `draw_delays` on a cluster-bootstrap resample of the cycles (drawn
    with replacement). The same numbers, from the same stream, as drawing each replicate in turn with
    `draw_delays(ports, delays.take(rng.integers(0, C, C)), n_rows, rng)`, computed together."""
    k = np.asarray(ports, dtype=np.int64).ravel()
    n = delays.n_cycles
    takes = np.empty((n_boot, n), dtype=np.int64)
    c = np.empty((n_boot, n_rows, k.size), dtype=np.int64)
    u = np.empty((n_boot, n_rows, k.size))
    for b in range(n_boot):     # the stream's order: each replicate's resample, then its draws
        takes[b] = rng.integers(0, n, n)
        c[b] = rng.integers(0, n, size=(n_rows, k.size))
        rng.random(out=u[b])
    return _DelayPool(delays).draw(k, takes, c, u)


class _DelayPool:
    """`draw_delays`' sorted tables of one set of cycles, shared by every resample of them: a resample's rows
    are rows of these, and its pool of per-port components is this pool with each cycle's part repeated as
    often as the resample took the cycle."""

    def __init__(self, delays: CycleDelays):
        self.values = np.sort(delays.per_port, axis=1)             # NaN last
        self.counts = np.isfinite(self.values).sum(axis=1)
        self.shared = delays.shared
        finite = np.isfinite(delays.per_port)
        resid = (delays.per_port - delays.shared[:, None])[finite]
        owner = np.nonzero(finite)[0]
        order = np.argsort(resid, kind="stable")
        self.resid, self.owner = resid[order], owner[order]

    def _pools(self, takes: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """Each replicate's pool of per-port components: the sorted pool with every element repeated as often
        as its cycle was taken, the replicates' pools one after the other; (pools, sizes, starts)."""
        taken = np.stack([np.bincount(t, minlength=self.counts.size) for t in takes])[:, self.owner]
        pools = np.repeat(np.tile(self.resid, takes.shape[0]), taken.ravel())
        sizes = taken.sum(axis=1)
        return pools, sizes, np.cumsum(sizes) - sizes

    def draw(self, k: np.ndarray, takes: np.ndarray, c: np.ndarray, u: np.ndarray) -> np.ndarray:
        """Per replicate b: `takes[b]` the cycles resampled, c[b] and u[b] (rows, K) its draws."""
        n_ports = self.values.shape[1]
        out = np.zeros(c.shape)
        pools = None
        # a reconfiguration switching more ports than any cycle has is always the decomposition: no rank to
        # find, and the same k over many of them (a region re-applied whole) is one pass
        for kv in np.unique(k[k > n_ports]):
            cols = k == kv
            if pools is None:
                pools = self._pools(takes)
            res = self._beyond(kv, takes, *((c, u) if cols.all() else (c[..., cols], u[..., cols])), pools)
            if cols.all():
                return res
            out[..., cols] = res
        cols = (k > 0) & (k <= n_ports)
        if cols.any():
            out[..., cols] = self._within(k[cols], takes, c[..., cols], u[..., cols], pools)
        return out

    def _beyond(self, k, takes: np.ndarray, c: np.ndarray, u: np.ndarray, pools) -> np.ndarray:
        """The drawn cycle's shared part + the max of k of its replicate's pool (exact inverse CDF)."""
        pools, sizes, starts = pools
        n_boot = takes.shape[0]
        shared = np.take_along_axis(self.shared[takes], c.reshape(n_boot, -1), axis=1).reshape(c.shape)
        size = sizes[:, None, None]
        idx = np.minimum((size * u ** (1.0 / k)).astype(np.int64), size - 1)
        idx += starts[:, None, None]
        return np.maximum(shared + pools[idx], 0.0)

    def _within(self, k: np.ndarray, takes: np.ndarray, c: np.ndarray, u: np.ndarray, pools) -> np.ndarray:
        """0 < k <= the bench's ports: the slowest of a random k-subset of the drawn cycle's ports (the
        decomposition where that cycle has fewer than k)."""
        n_boot, n_ports = takes.shape[0], self.values.shape[1]
        cycle = np.take_along_axis(takes, c.reshape(n_boot, -1), axis=1).reshape(c.shape)
        pc = self.counts[cycle]
        # the rank of the slowest of k of the cycle's p ports: how many of F[p, k, :] lie below u, one
        # inverse CDF per (p, k)
        table = _max_rank_cdf(n_ports)
        group = pc * (n_ports + 1) + k
        rank = np.zeros(c.shape, dtype=np.int64)
        for g in np.flatnonzero(np.bincount(group.ravel())):
            p, kg = divmod(int(g), n_ports + 1)
            if kg > p:          # the decomposition's, below
                continue
            sel = group == g
            below = np.zeros(np.count_nonzero(sel), dtype=np.int64)
            u_sel = u[sel]
            for f in table[p, kg, :p]:          # F = 1 beyond p: never below u < 1
                below += f < u_sel
            rank[sel] = below
        out = self.values[cycle, np.minimum(rank, np.maximum(pc - 1, 0))]
        kk = np.broadcast_to(k, c.shape)
        beyond = kk > pc
        if beyond.any():
            pools, sizes, starts = self._pools(takes) if pools is None else pools
            size = np.broadcast_to(sizes[:, None, None], c.shape)[beyond]
            start = np.broadcast_to(starts[:, None, None], c.shape)[beyond]
            idx = np.minimum((size * u[beyond] ** (1.0 / kk[beyond])).astype(np.int64), size - 1)
            out[beyond] = np.maximum(self.shared[cycle[beyond]] + pools[start + idx], 0.0)
        return out


def sample_iteration_times(timeline: Timeline, delays: CycleDelays, n_reps: int,
                           rng: np.random.Generator) -> np.ndarray:
    """Monte Carlo iteration times, each reconfiguration's delay from `draw_delays`. Data-parallel replicas
    draw independently; the iteration waits for the slowest."""
    return sample_iteration_times_many([timeline], delays, n_reps, rng)[0]


def sample_iteration_times_many(timelines, delays: CycleDelays, n_reps: int,
                                rng: np.random.Generator) -> list[np.ndarray]:
    """`sample_iteration_times` of timelines that switch the same ports with the same data-parallel replicas
    (one iteration under other compute or overlap assumptions), each on the draws it would make alone."""
    if not isinstance(delays, CycleDelays):
        raise MixnetInputError("delays must be CycleDelays (per cycle and port); CycleDelays.independent() "
                               "for i.i.d. samples")
    first = same_reconfigurations(timelines)
    if first.n_triggers == 0:
        return [t.times(np.zeros((n_reps, 0))) for t in timelines]
    draws = draw_delays(first.trig_ports, delays, n_reps * first.dp, rng)
    return [t.times(draws).reshape(n_reps, t.dp).max(axis=1) for t in timelines]


def same_reconfigurations(timelines) -> Timeline:
    """The first of `timelines` after checking that they all switch the same ports with the same replicas
    (so one set of drawn delays serves each of them)."""
    first = timelines[0]
    for t in timelines[1:]:
        if t.dp != first.dp or not np.array_equal(t.trig_ports, first.trig_ports):
            raise MixnetInputError("timelines drawn together must switch the same ports with the same replicas")
    return first


def break_even_delay(timeline: Timeline, target_s: float, d_max: float = 1e4) -> float | None:
    """Constant delay d at which the iteration time reaches `target_s` (None if even d = 0 exceeds it).

    T(d) is continuous, convex and non-decreasing (a max of sums of max(0, d − W)), so bisection is exact
    up to the tolerance. Returns inf if the target is never reached (no triggers).
    """
    t0 = float(constant_delay_times(timeline, [0.0])[0])
    if t0 > target_s:
        return None
    if timeline.n_triggers == 0 or not np.any(timeline.trig_ports > 0):
        return float("inf")
    lo, hi = 0.0, 1e-3
    while float(constant_delay_times(timeline, [hi])[0]) < target_s:
        lo, hi = hi, hi * 2
        if hi > d_max:
            return float("inf")
    steps = 80
    while steps:
        # the next `depth` halvings at once: every midpoint they could visit, evaluated together, then the
        # path the one-at-a-time bisection takes through them (the same midpoints, so the same answer)
        depth = min(6, steps)
        tree = [(lo, hi)]
        for i in range((1 << (depth - 1)) - 1):
            a, b = tree[i]
            mid = 0.5 * (a + b)
            tree += [(a, mid), (mid, b)]
        below = constant_delay_times(timeline, [0.5 * (a + b) for a, b in tree]) < target_s
        node = 0
        for _ in range(depth):
            a, b = tree[node]
            mid = 0.5 * (a + b)
            lo, hi = (mid, b) if below[node] else (a, mid)
            node = 2 * node + (2 if below[node] else 1)
            if node >= len(tree):
                break
        steps -= depth
    return 0.5 * (lo + hi)
