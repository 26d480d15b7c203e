"""A multiplane leaf–spine packet fabric at flow level: max-min fair rates over links, per-flow ECMP hashing or
packet spraying, leaf–spine links failed or flapped (the Spectrum-X setup of arXiv 2605.21187: every NIC has
2 or 4 planes, each plane its own leaf–spine fabric).

Topology (`LeafSpine`): `endpoints` NICs; in every plane NIC e has one port on leaf e // per_leaf, at
nic_gbps / planes; every leaf has one link to every spine of its plane, at `uplink_gbps` (default: the plane
port's rate, a 1:1 leaf when spines = per_leaf). Links are directed: NIC→leaf, leaf→NIC, leaf→spine and
spine→leaf; a fabric link (plane, leaf, spine) is the cable, both directions.

Routing of a flow (src, dst, queue pair q) over the usable paths — within its leaf in each plane when src and
dst share the leaf, else every (plane, spine) whose two leaf–spine links are usable:
- "ecmp": per-flow hashing; each flow is pinned to one path by rendezvous (highest-random-weight) hashing, so
  losing a path moves only the flows that were on it (resilient hashing). Collisions put more flows on some
  links than on others: bandwidth falls below what the capacity allows;
- "spray": packet spraying; each flow is split evenly over every usable path (oblivious to load: a plane
  that lost links takes a smaller share of every flow, the other planes' NIC ports a larger one);
- "adaptive": adaptive routing at its best; each flow is split over the usable paths so that the collective
  ends soonest (a maximum concurrent flow, solved as a linear program).
A flow's weight on a link is the share of its bytes that crosses it (W: flows × links).

Rates are max-min fair over the links (progressive filling, `max_min_rates`); a transfer is a fluid: rates
are solved again whenever a flow ends or the fabric changes (`fluid`). A link that went dark carries
nothing; until the fabric detects it, routes still use it and the flows on it stall.
Pure: numbers in, numbers out.
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Iterable, Iterator, Sequence

import numpy as np

MODES = ("ecmp", "spray", "adaptive")
BYTES_PER_GBIT = 1e9 / 8

FabricLink = tuple[int, int, int]  # (plane, leaf, spine)


@dataclass(frozen=True)
class LeafSpine:
    endpoints: int
    planes: int
    per_leaf: int
    spines: int
    nic_gbps: float
    uplink_gbps: float | None = None

    def __post_init__(self):
        if self.endpoints < 2 or self.planes < 1 or self.per_leaf < 1 or self.spines < 1:
            raise ValueError("need >= 2 endpoints and >= 1 plane, NIC per leaf and spine")
        if not self.nic_gbps > 0 or (self.uplink_gbps is not None and not self.uplink_gbps > 0):
            raise ValueError("rates must be > 0")

    @property
    def leaves(self) -> int:
        return -(-self.endpoints // self.per_leaf)

    @property
    def plane_gbps(self) -> float:
        return self.nic_gbps / self.planes

    @property
    def link_gbps(self) -> float:
        return self.plane_gbps if self.uplink_gbps is None else self.uplink_gbps

    def leaf_of(self, endpoint: int) -> int:
        return endpoint // self.per_leaf

    def fabric_links(self) -> list[FabricLink]:
        return [(p, leaf, s) for p in range(self.planes) for leaf in range(self.leaves) for s in range(self.spines)]

    # directed link indices: NIC→leaf, leaf→NIC, leaf→spine, spine→leaf
    @property
    def n_links(self) -> int:
        return 2 * self.planes * self.endpoints + 2 * self.planes * self.leaves * self.spines

    def up(self, p: int, e: int) -> int:
        return p * self.endpoints + e

    def down(self, p: int, e: int) -> int:
        return (self.planes + p) * self.endpoints + e

    def to_spine(self, p: int, leaf: int, s: int) -> int:
        return 2 * self.planes * self.endpoints + (p * self.leaves + leaf) * self.spines + s

    def from_spine(self, p: int, leaf: int, s: int) -> int:
        return self.to_spine(p, leaf, s) + self.planes * self.leaves * self.spines

    def capacities(self, dark: Iterable[FabricLink] = ()) -> np.ndarray:
        """Bytes/s of every directed link; a dark fabric link carries nothing either way."""
        cap = np.full(self.n_links, self.link_gbps * BYTES_PER_GBIT)
        cap[: 2 * self.planes * self.endpoints] = self.plane_gbps * BYTES_PER_GBIT
        for p, leaf, s in dark:
            cap[self.to_spine(p, leaf, s)] = cap[self.from_spine(p, leaf, s)] = 0.0
        return cap

    def fabric_capacity(self, dark: Iterable[FabricLink] = ()) -> float:
        """The raw leaf–spine capacity (bytes/s, one direction) left with `dark` links down."""
        return (len(self.fabric_links()) - len(set(dark))) * self.link_gbps * BYTES_PER_GBIT

    def paths(self, src: int, dst: int, out: frozenset = frozenset()) -> list[tuple[int, list[int]]]:
        """(path id, its directed links) of every path src → dst that avoids the fabric links in `out`."""
        a, b = self.leaf_of(src), self.leaf_of(dst)
        found = []
        for p in range(self.planes):
            if a == b:
                found.append((p * self.spines, [self.up(p, src), self.down(p, dst)]))
                continue
            for s in range(self.spines):
                if (p, a, s) in out or (p, b, s) in out:
                    continue
                found.append((p * self.spines + s, [self.up(p, src), self.to_spine(p, a, s),
                                                    self.from_spine(p, b, s), self.down(p, dst)]))
        return found


@dataclass(frozen=True)
class Flows:
    """The flows of a collective: (src, dst, qp) per row, and the bytes each carries."""

    pairs: np.ndarray  # (F, 3) int: src, dst, qp
    bytes: np.ndarray  # (F,)


def alltoall_flows(endpoints: int, pair_bytes: float | np.ndarray, qps: int = 1) -> Flows:
    """Every ordered pair of distinct endpoints, `qps` queue pairs each carrying an equal share; `pair_bytes`
    a scalar (uniform all-to-all) or an endpoints × endpoints matrix."""
    if qps < 1:
        raise ValueError("qps must be >= 1")
    m = np.broadcast_to(np.asarray(pair_bytes, dtype=float), (endpoints, endpoints))
    rows = [(i, j, q) for i in range(endpoints) for j in range(endpoints) if i != j for q in range(qps)]
    pairs = np.asarray(rows, dtype=int).reshape(-1, 3)
    return Flows(pairs, m[pairs[:, 0], pairs[:, 1]] / qps)


def hash_weights(n_flows: int, n_paths: int, seed: int) -> np.ndarray:
    """The rendezvous-hash weight of every (flow, path id): fixed per seed, so a flow keeps its path while
    that path lives."""
    return np.random.default_rng([int(seed), 2605]).random((n_flows, n_paths))


def route_matrix(fabric: LeafSpine, flows: Flows, mode: str, out: Iterable[FabricLink] = (),
                 seed: int = 0) -> np.ndarray:
    """W[f, k]: the share of flow f's bytes crossing directed link k, routed around the fabric links in `out`
    (those the fabric knows are down). A flow without a usable path has an all-zero row."""
    if mode not in MODES:
        raise ValueError(f"load balancing {mode!r}: expected one of {', '.join(MODES)}")
    out = frozenset(out)
    if mode == "adaptive":
        return _adaptive(fabric, flows, out)
    w = np.zeros((len(flows.bytes), fabric.n_links))
    u = hash_weights(len(flows.bytes), fabric.planes * fabric.spines, seed) if mode == "ecmp" else None
    for f, (src, dst, _) in enumerate(flows.pairs):
        paths = fabric.paths(int(src), int(dst), out)
        if not paths:
            continue
        if mode == "ecmp":
            _, links = max(paths, key=lambda pl: u[f, pl[0]])
            w[f, links] += 1.0
        else:
            for _, links in paths:
                w[f, links] += 1.0 / len(paths)
    return w


def _adaptive(fabric: LeafSpine, flows: Flows, out: frozenset) -> np.ndarray:
    """Path shares that maximise the concurrent throughput λ (every flow moves λ·its bytes per s) within the
    capacities of the links not routed around: max λ s.t. Σ_paths r_fp = λ·bytes_f, Σ r over a link ≤ its
    capacity (HiGHS)."""
    from scipy.optimize import linprog
    from scipy.sparse import coo_matrix

    cap = fabric.capacities(out)
    cols, link_rows, link_cols, owner = [], [], [], []
    for f, (src, dst, _) in enumerate(flows.pairs):
        for _, links in fabric.paths(int(src), int(dst), out):
            c = len(cols)
            cols.append(links)
            owner.append(f)
            link_rows += links
            link_cols += [c] * len(links)
    n = len(cols)
    w = np.zeros((len(flows.bytes), fabric.n_links))
    if n == 0:
        return w
    owner = np.asarray(owner)
    size = flows.bytes / flows.bytes.max()  # scaled to 1: unscaled (1e6 B, 5e10 B/s), HiGHS reports "unbounded"
    a_ub = coo_matrix((np.ones(len(link_rows)), (link_rows, link_cols)), shape=(fabric.n_links, n + 1))
    eq = coo_matrix((np.r_[np.ones(n), -size], (np.r_[owner, np.arange(len(flows.bytes))],
                                                       np.r_[np.arange(n), np.full(len(flows.bytes), n)])),
                    shape=(len(flows.bytes), n + 1))
    routable = np.bincount(owner, minlength=len(flows.bytes)) > 0
    res = linprog(np.r_[np.zeros(n), -1.0], A_ub=a_ub, b_ub=cap / cap.max(), A_eq=eq.tocsr()[routable],
                  b_eq=np.zeros(int(routable.sum())), bounds=(0, None), method="highs")
    if res.status != 0 or not res.x[n] > 0:
        raise ValueError(f"adaptive routing: no concurrent flow ({res.message})")
    share = res.x[:n] / (res.x[n] * size[owner])
    for c, links in enumerate(cols):
        w[owner[c], links] += share[c]
    return w


def max_min_rates(w: np.ndarray, cap: np.ndarray, rtol: float = 1e-12) -> np.ndarray:
    """Max-min fair rates by progressive filling: every unfrozen flow's rate grows alike until a link fills;
    the flows crossing a full link are frozen. Flows crossing a link of capacity 0, or with no route (an
    all-zero row), get 0."""
    w, cap = np.asarray(w, dtype=float), np.asarray(cap, dtype=float)
    return _max_min(_Sparse.of(w), cap, np.ones(w.shape[0], dtype=bool), rtol)


@dataclass(frozen=True)
class _Sparse:
    """W's nonzeros: a flow crosses a handful of the links (4 with ECMP), so progressive filling over them is
    O(nonzeros) a round instead of O(flows × links)."""

    rows: np.ndarray
    cols: np.ndarray
    vals: np.ndarray
    n_flows: int

    @classmethod
    def of(cls, w: np.ndarray) -> "_Sparse":
        rows, cols = np.nonzero(w > 0)
        return cls(rows, cols, w[rows, cols], w.shape[0])


def _max_min(w: _Sparse, cap: np.ndarray, among: np.ndarray, rtol: float = 1e-12) -> np.ndarray:
    """`max_min_rates` of the flows `among` (the others get 0 and load nothing)."""
    rates = np.zeros(w.n_flows)
    active = among & (np.bincount(w.rows, minlength=w.n_flows) > 0)
    active[w.rows[cap[w.cols] <= 0]] = False
    left = cap.copy()
    tol = rtol * np.maximum(cap, 1.0)
    for _ in range(cap.size + 1):  # every round fills at least one more link
        on = active[w.rows]
        if not on.any():
            break
        load = np.bincount(w.cols[on], weights=w.vals[on], minlength=cap.size)
        used = load > 0
        step = float(np.min(left[used] / load[used]))
        rates[active] += step
        left[used] -= step * load[used]
        full = used & (left <= tol)
        left[full] = 0.0
        active[w.rows[full[w.cols]]] = False
    return rates


def fluid_steps(w: np.ndarray, cap: np.ndarray, remaining: np.ndarray, horizon: float = math.inf
                ) -> Iterator[tuple[float, float, np.ndarray, np.ndarray]]:
    """`fluid` one segment at a time, as (start s, end s, rates, bytes left at its end): a caller that needs
    the flows only until the fabric changes again stops there and pays for no more max-min solves."""
    left = np.asarray(remaining, dtype=float).copy()
    sparse = _Sparse.of(np.asarray(w, dtype=float))
    cap = np.asarray(cap, dtype=float)
    t = 0.0
    while t < horizon:
        moving = left > 0
        if not moving.any():
            return
        rates = _max_min(sparse, cap, moving)
        going = rates > 0
        if not going.any():
            yield t, horizon, rates, left
            return
        dt = min(float(np.min(left[going] / rates[going])), horizon - t)
        left = np.where(going, left - rates * dt, left)
        left[left <= 1e-9 * np.maximum(remaining, 1.0)] = 0.0
        yield t, t + dt, rates, left
        t += dt


def fluid(w: np.ndarray, cap: np.ndarray, remaining: np.ndarray, horizon: float = math.inf
          ) -> tuple[list[tuple[float, float, np.ndarray]], np.ndarray]:
    """Flows with `remaining` bytes under fixed routes and capacities for at most `horizon` s: rates are
    max-min fair and solved again whenever a flow ends. Returns the segments (start s, end s, rates) and the
    bytes left at the end; flows that cannot move (rate 0) stay."""
    segments, left = [], np.asarray(remaining, dtype=float).copy()
    for a, b, rates, left in fluid_steps(w, cap, remaining, horizon):
        segments.append((a, b, rates))
    return segments, left


@dataclass(frozen=True)
class FabricState:
    """From `t_s` on: the fabric links dark (carrying nothing) and those the fabric has routed around."""

    t_s: float
    dark: frozenset = frozenset()
    routed_out: frozenset = frozenset()


def flap_states(down: Sequence[tuple[FabricLink, float, float]], detection_s: float) -> list[FabricState]:
    """States over time for links going down at t and up at t + down_s each ((link, t, down_s)): dark while
    down, routed around from detection_s after going down until they are up again."""
    events = sorted({0.0} | {t for _, t0, d in down for t in (t0, t0 + min(detection_s, d), t0 + d)})
    states = []
    for t in events:
        dark = frozenset(link for link, t0, d in down if t0 <= t < t0 + d)
        out = frozenset(link for link, t0, d in down if t0 + detection_s <= t < t0 + d)
        states.append(FabricState(t, dark, out))
    return states


def simulate(fabric: LeafSpine, flows: Flows, mode: str, states: Sequence[FabricState] = (FabricState(0.0),),
             seed: int = 0) -> np.ndarray:
    """Each flow's finish time (s, inf if it never finishes) over fabric states changing at their times."""
    left = flows.bytes.astype(float).copy()
    finish = np.full(left.shape, math.inf)
    finish[left <= 0] = 0.0
    for k, st in enumerate(states):
        end = states[k + 1].t_s if k + 1 < len(states) else math.inf
        w = route_matrix(fabric, flows, mode, st.routed_out, seed)
        segments, after = fluid(w, fabric.capacities(st.dark), left, end - st.t_s)
        for t0, t1, rates in segments:
            if not math.isfinite(t1):  # nothing can move any more
                break
            done = (left > 0) & (rates > 0) & (left <= rates * (t1 - t0) * (1 + 1e-9))
            finish[done & ~np.isfinite(finish)] = st.t_s + t1
            left = np.where(rates > 0, np.maximum(left - rates * (t1 - t0), 0.0), left)
        left = after
        if not (left > 0).any():
            break
    return finish


def alltoall_time(fabric: LeafSpine, pair_bytes: float, mode: str, dark: Iterable[FabricLink] = (), *,
                  qps: int = 1, seed: int = 0) -> float:
    """Seconds of a uniform all-to-all (`pair_bytes` per ordered pair) with `dark` fabric links down and
    routed around: the last flow's finish."""
    dark = frozenset(dark)
    flows = alltoall_flows(fabric.endpoints, pair_bytes, qps)
    return float(simulate(fabric, flows, mode, [FabricState(0.0, dark, dark)], seed).max())


def line_time(fabric: LeafSpine, pair_bytes: float) -> float:
    """Seconds of the uniform all-to-all at the NIC's physical rate: (n − 1) pairs' bytes through one NIC."""
    return (fabric.endpoints - 1) * pair_bytes / (fabric.nic_gbps * BYTES_PER_GBIT)
