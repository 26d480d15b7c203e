"""Training-iteration DAG of an expert-parallel MoE region (spec algorithms.md §1, §2.1, §6.3).

Nodes are events, arcs are tasks: compute arcs (fixed seconds), all-to-all arcs (one per endpoint pair
with traffic; length fixed + bytes / (B_eps + x_e B_ocs), x_e the circuits on that pair) and
reconfiguration arcs (length d, the measured delay; a random variable). Per (MoE layer l, micro-batch b):

forward   s -> g -(attn)-> a -> q -(d, trigger F: exposed)-> r =(dispatch pairs)=> dd -(expert)-> e
          =(combine pairs)=> c = start of layer l+1
backward  sb -> gb -(aggregate)-> ag ----------------------------\
                gb -> qb -(d, trigger B: overlaps aggregate)-> rb -> jb =(combine-bwd pairs)=> cb
          -(expert bwd)-> eb =(dispatch-bwd pairs)=> db -(attn bwd)-> ab = start of layer l-1
Serialisation (0-length arcs): attention compute of (l, b) after that of (l, b-1); a reconfiguration of
(l, b) only after the circuits' previous use (combine of (l, b-1)) is done. After every micro-batch's
backward: gradient all-reduce and optimizer (fixed). Per iteration 2 L m reconfigurations (N_r, §6.3).
Nodes are created in topological order (arcs always point to a later node); source 0, sink last.
"""
from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from .critical_path import DagPlan, smoothed_critical_path
from .wiring import WiringProblem, complete_graph_edges

__all__ = ["MoEConfig", "TrainingDag", "build_training_dag", "traffic_from_frame",
           "traffic_from_expert_counts", "KIND_NAMES", "candidate_wirings",
           "iteration_cost_builder"]

KIND_NAMES = ("compute", "dispatch", "combine", "reconfig", "sync")
COMPUTE, DISPATCH, COMBINE, RECONFIG, SYNC = range(5)


@dataclass
class MoEConfig:
    """Model/parallelism timing for one region (expert-parallel group) and one pipeline stage.

    Times in seconds per (layer, micro-batch); arrays of length num_layers are accepted.
    Backward defaults: 2x the forward compute. `aggregate_bwd_s` is the backward computation that the
    backward-trigger reconfiguration overlaps (W_k of §6.3)."""

    num_layers: int
    micro_batches: int = 1
    attn_fwd_s: float | np.ndarray = 1e-3
    expert_fwd_s: float | np.ndarray = 1e-3
    attn_bwd_s: float | np.ndarray | None = None
    expert_bwd_s: float | np.ndarray | None = None
    aggregate_bwd_s: float | np.ndarray = 0.0
    a2a_latency_s: float = 0.0
    allreduce_s: float = 0.0
    optimizer_s: float = 0.0

    def per_layer(self, name: str) -> np.ndarray:
        v = getattr(self, name)
        if v is None:
            v = 2.0 * np.asarray(getattr(self, name.replace("bwd", "fwd")), dtype=np.float64)
        return np.broadcast_to(np.asarray(v, dtype=np.float64), (self.num_layers,))


@dataclass
class TrainingDag:
    num_nodes: int
    src: np.ndarray
    dst: np.ndarray
    kind: np.ndarray            # KIND_NAMES index per arc
    fixed_length: np.ndarray    # compute/sync seconds; a2a fixed latency; 0 for reconfig arcs
    arc_bytes: np.ndarray       # all-to-all arcs: symmetrised bytes of the pair; else 0
    arc_edge: np.ndarray        # all-to-all arcs: index into `edges`; else -1
    arc_layer: np.ndarray       # MoE layer of the arc (-1 for the iteration-level arcs)
    reconfig_trigger: np.ndarray  # for reconfig arcs: 0 = forward (exposed), 1 = backward (overlapped); else -1
    edges: np.ndarray
    num_endpoints: int
    b_ocs: float
    b_eps: float
    config: MoEConfig
    plan: DagPlan = field(default=None, repr=False)

    def __post_init__(self):
        if self.plan is None:
            self.plan = DagPlan.build(self.num_nodes, self.src, self.dst)

    @property
    def reconfig_arcs(self) -> np.ndarray:
        return np.flatnonzero(self.kind == RECONFIG)

    @property
    def num_reconfigurations(self) -> int:
        return int(np.count_nonzero(self.kind == RECONFIG))

    def circuits_on_arcs(self, x) -> np.ndarray:
        """x: circuits per edge (E,) or per layer (L, E); see `circuits_from_matrix` for n x n input."""
        x = np.asarray(x, dtype=np.float64)
        comm = self.arc_edge >= 0
        out = np.zeros(self.src.size)
        if x.ndim == 1:
            out[comm] = x[self.arc_edge[comm]]
        else:
            out[comm] = x[self.arc_layer[comm], self.arc_edge[comm]]
        return out

    def circuits_from_matrix(self, c) -> np.ndarray:
        """n x n circuit-count matrix (or L x n x n) -> per-edge counts (E,) (or (L, E))."""
        c = np.asarray(c, dtype=np.float64)
        return c[..., self.edges[:, 0], self.edges[:, 1]]

    def lengths(self, x, reconfig_delay=0.0) -> np.ndarray:
        """Arc lengths (s) for wiring x and reconfiguration delay(s) d (scalar or one per reconfig arc)."""
        ell = self.fixed_length.copy()
        comm = self.arc_edge >= 0
        den = self.b_eps + self.circuits_on_arcs(x)[comm] * self.b_ocs
        with np.errstate(divide="ignore"):
            ell[comm] += self.arc_bytes[comm] / den
        ell[self.kind == RECONFIG] = reconfig_delay
        return ell

    def iteration_time(self, x, reconfig_delay=0.0, beta=np.inf) -> float:
        v, _ = smoothed_critical_path(self.num_nodes, self.src, self.dst, self.lengths(x, reconfig_delay), beta,
                                      plan=self.plan, check=not np.isinf(beta))
        return v

    def critical_breakdown(self, x, reconfig_delay=0.0) -> dict:
        """Seconds on the hard critical path by arc kind (compute, dispatch, combine, reconfig, sync)."""
        ell = self.lengths(x, reconfig_delay)
        v, mu = smoothed_critical_path(self.num_nodes, self.src, self.dst, ell, np.inf, plan=self.plan,
                                       check=False)
        out = {k: float(np.sum((mu * ell)[self.kind == i])) for i, k in enumerate(KIND_NAMES)}
        out["total"] = v
        out["reconfigs_on_path"] = int(np.sum(mu[self.kind == RECONFIG] > 0.5))
        return out

    def iteration_time_samples(self, x, delay_samples, n_draws: int = 1000, seed=None) -> np.ndarray:
        """Iteration time (s) with every reconfiguration arc drawing an independent delay from the
        measured samples (a distribution, not a constant). Returns n_draws iteration times."""
        rng = np.random.default_rng(seed)
        samples = np.asarray(delay_samples, dtype=np.float64).ravel()
        base = self.lengths(x, 0.0)
        idx = self.reconfig_arcs
        out = np.empty(n_draws)
        for k in range(n_draws):
            ell = base.copy()
            ell[idx] = rng.choice(samples, idx.size)
            out[k], _ = smoothed_critical_path(self.num_nodes, self.src, self.dst, ell, np.inf, plan=self.plan,
                                               check=False)
        return out

    def to_wiring_problem(self, degree, reconfig_delay: float = 0.0, prior=None,
                          num_circuits=None) -> WiringProblem:
        """One wiring shared by all layers (Paper A's setting); reconfig arcs fixed at `reconfig_delay`."""
        fixed = self.fixed_length.copy()
        fixed[self.kind == RECONFIG] = reconfig_delay
        deg = np.broadcast_to(np.asarray(degree, dtype=np.float64), (self.num_endpoints,)).copy()
        return WiringProblem(self.num_nodes, self.src, self.dst, fixed, self.arc_bytes, self.arc_edge, self.edges,
                             deg, b_ocs=self.b_ocs, b_eps=self.b_eps, num_circuits=num_circuits, prior=prior,
                             plan=self.plan)


class _Builder:
    def __init__(self):
        self.n = 0
        self.arcs = []  # (u, v, kind, fixed, bytes, edge, layer, trigger)

    def node(self) -> int:
        self.n += 1
        return self.n - 1

    def arc(self, u, v, kind=COMPUTE, fixed=0.0, nbytes=0.0, edge=-1, layer=-1, trigger=-1):
        assert u < v
        self.arcs.append((u, v, kind, fixed, nbytes, edge, layer, trigger))


def build_training_dag(traffic, config: MoEConfig, *, b_ocs: float, b_eps: float, reconfigure: bool = True,
                       edges=None) -> TrainingDag:
    """Build the iteration DAG. `traffic`: dispatch bytes i -> j per MoE layer, shape (L, n, n), or per
    layer and micro-batch (L, m, n, n). The combine all-to-all carries the transpose; a pair's arc uses
    max(D_ij, D_ji) (full-duplex circuits). `reconfigure=False` drops the reconfiguration arcs (static
    wiring / fat-tree baseline)."""
    D = np.asarray(traffic, dtype=np.float64)
    L, m = config.num_layers, config.micro_batches
    if D.ndim == 3:
        D = np.broadcast_to(D[:, None], (D.shape[0], m) + D.shape[1:])
    if D.shape[:2] != (L, m) or D.shape[2] != D.shape[3]:
        raise ValueError(f"traffic must be (L, n, n) or (L, m, n, n) with L={L}, m={m}")
    n = D.shape[2]
    edges = complete_graph_edges(n) if edges is None else np.asarray(edges, dtype=np.int64)
    sym = np.maximum(D, np.swapaxes(D, 2, 3))
    pair_bytes = sym[:, :, edges[:, 0], edges[:, 1]]          # (L, m, E)
    attn_f, exp_f = config.per_layer("attn_fwd_s"), config.per_layer("expert_fwd_s")
    attn_b, exp_b = config.per_layer("attn_bwd_s"), config.per_layer("expert_bwd_s")
    agg_b = config.per_layer("aggregate_bwd_s")
    lat = config.a2a_latency_s
    B = _Builder()
    source = B.node()

    def a2a(u, l, b, kind):
        v = B.node()
        nz = np.flatnonzero(pair_bytes[l, b] > 0)
        if nz.size == 0:
            B.arc(u, v, kind, lat, layer=l)
        for e in nz:
            B.arc(u, v, kind, lat, pair_bytes[l, b, e], int(e), l)
        return v

    def reconf(u, trigger, l):
        v = B.node()
        if reconfigure:
            B.arc(u, v, RECONFIG, 0.0, layer=l, trigger=trigger)
        else:
            B.arc(u, v, COMPUTE, 0.0, layer=l)
        return v

    start = {}
    for b in range(m):
        start[b] = B.node()
        B.arc(source, start[b])
    prev_a, prev_c = {}, {}
    for l in range(L):
        for b in range(m):
            g = B.node()
            B.arc(start[b], g)
            if b > 0:
                B.arc(prev_a[l, b - 1], g)
            a = B.node()
            B.arc(g, a, COMPUTE, attn_f[l], layer=l)
            prev_a[l, b] = a
            q = B.node()
            B.arc(a, q)
            if b > 0:
                B.arc(prev_c[l, b - 1], q)
            r = reconf(q, 0, l)
            dd = a2a(r, l, b, DISPATCH)
            e = B.node()
            B.arc(dd, e, COMPUTE, exp_f[l], layer=l)
            c = a2a(e, l, b, COMBINE)
            prev_c[l, b] = c
            start[b] = c
    prev_ag, prev_db = {}, {}
    for l in reversed(range(L)):
        for b in range(m):
            gb = B.node()
            B.arc(start[b], gb)
            if b > 0:
                B.arc(prev_ag[l, b - 1], gb)
            ag = B.node()
            B.arc(gb, ag, COMPUTE, agg_b[l], layer=l)
            prev_ag[l, b] = ag
            qb = B.node()
            B.arc(gb, qb)
            if b > 0:
                B.arc(prev_db[l, b - 1], qb)
            rb = reconf(qb, 1, l)
            jb = B.node()
            B.arc(ag, jb)
            B.arc(rb, jb)
            cb = a2a(jb, l, b, COMBINE)
            eb = B.node()
            B.arc(cb, eb, COMPUTE, exp_b[l], layer=l)
            db = a2a(eb, l, b, DISPATCH)
            prev_db[l, b] = db
            ab = B.node()
            B.arc(db, ab, COMPUTE, attn_b[l], layer=l)
            start[b] = ab
    done = B.node()
    for b in range(m):
        B.arc(start[b], done)
    ar = B.node()
    B.arc(done, ar, SYNC, config.allreduce_s)
    sink = B.node()
    B.arc(ar, sink, SYNC, config.optimizer_s)
    cols = list(zip(*B.arcs))
    return TrainingDag(num_nodes=B.n, src=np.array(cols[0], dtype=np.int64), dst=np.array(cols[1], dtype=np.int64),
                       kind=np.array(cols[2], dtype=np.int64), fixed_length=np.array(cols[3], dtype=np.float64),
                       arc_bytes=np.array(cols[4], dtype=np.float64), arc_edge=np.array(cols[5], dtype=np.int64),
                       arc_layer=np.array(cols[6], dtype=np.int64), reconfig_trigger=np.array(cols[7], dtype=np.int64),
                       edges=edges, num_endpoints=n, b_ocs=float(b_ocs), b_eps=float(b_eps), config=config)


def traffic_from_frame(df, num_layers: int, num_endpoints: int, *, micro_batches: int | None = None,
                       bytes_col: str = "bytes") -> np.ndarray:
    """Long-format trace (columns layer, src, dst, bytes[, micro_batch]) -> (L, n, n) or (L, m, n, n) bytes,
    summed over duplicate rows."""
    layer = df["layer"].to_numpy(dtype=np.int64)
    s = df["src"].to_numpy(dtype=np.int64)
    d = df["dst"].to_numpy(dtype=np.int64)
    v = df[bytes_col].to_numpy(dtype=np.float64)
    if micro_batches is None:
        out = np.zeros((num_layers, num_endpoints, num_endpoints))
        np.add.at(out, (layer, s, d), v)
    else:
        mb = df["micro_batch"].to_numpy(dtype=np.int64)
        out = np.zeros((num_layers, micro_batches, num_endpoints, num_endpoints))
        np.add.at(out, (layer, mb, s, d), v)
    return out


def traffic_from_expert_counts(tokens_to_expert, expert_to_endpoint, num_endpoints: int,
                               bytes_per_token: float) -> np.ndarray:
    """Routing counts (L, n_src, n_experts) — tokens each source endpoint sends to each expert, e.g. the
    `expert distribution` column of per-rank MoE traces — and expert placement -> dispatch bytes (L, n, n).
    Tokens routed to an expert on the sender itself stay local (diagonal zeroed)."""
    c = np.asarray(tokens_to_expert, dtype=np.float64)
    place = np.asarray(expert_to_endpoint, dtype=np.int64)
    P = np.zeros((place.size, num_endpoints))
    P[np.arange(place.size), place] = 1.0
    D = c @ P * bytes_per_token                           # (L, n_src, n_dst)
    idx = np.arange(num_endpoints)
    D[:, idx, idx] = 0.0
    return D


def candidate_wirings(regime_traffic, config: MoEConfig, degree, *, b_ocs: float, b_eps: float,
                      reconfig_delay: float = 0.0, b1: float = 1e6, schedule: str = "fast") -> np.ndarray:
    """Candidate set W of §3: the rounded symmetric prior plus, per traffic regime ((L, n, n) bytes each),
    `wiring.solve_wiring`'s integer wiring (the exact MILP on small regions, else the optimizer's rounded and
    polished wiring). Returns (W, E) integer circuits, duplicates removed, prior first."""
    from .wiring import round_wiring, solve_wiring

    out = []
    for D in regime_traffic:
        dag = build_training_dag(D, config, b_ocs=b_ocs, b_eps=b_eps)
        prob = dag.to_wiring_problem(degree, reconfig_delay)
        if not out:
            out.append(round_wiring(prob.prior, prob.edges, prob.degree))
        x, _ = solve_wiring(prob, b1=b1, schedule=schedule)
        out.append(x)
    uniq = []
    for x in out:
        if not any(np.array_equal(x, u) for u in uniq):
            uniq.append(x)
    return np.array(uniq, dtype=np.int64)


def iteration_cost_builder(config: MoEConfig, candidates, *, b_ocs: float, b_eps: float,
                           reconfig_delay: float = 0.0):
    """Cost builder for `regret_experiment`: f(traffic_epochs) -> T x W iteration times (s), where
    traffic_epochs is (T, L, n, n) (or (T, L, m, n, n)) bytes and candidates is (W, E) circuits."""
    cands = np.asarray(candidates)

    def build(traffic_epochs):
        T = len(traffic_epochs)
        out = np.empty((T, len(cands)))
        for t in range(T):
            dag = build_training_dag(traffic_epochs[t], config, b_ocs=b_ocs, b_eps=b_eps)
            for k, x in enumerate(cands):
                out[t, k] = dag.iteration_time(x, reconfig_delay)
        return out

    return build
