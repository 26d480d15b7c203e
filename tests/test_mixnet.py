"""MixNet circuits, all-to-all models, MoE traffic and the iteration timeline, against independent oracles."""
from __future__ import annotations

import itertools

import numpy as np
import pytest
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st
from scipy.optimize import linprog

from analysis import mixnet as mx
from analysis import moe_models as mm
from analysis.critical_path import longest_path

SPEC_D = np.array([[0, .67, .93, .88], [.67, 0, .97, 1.08], [.93, .97, 0, 1.24], [.88, 1.08, 1.24, 0]])


def _symmetric(n: int, values: list[float]) -> np.ndarray:
    d = np.zeros((n, n))
    iu, ju = np.triu_indices(n, 1)
    d[iu, ju] = values
    return d + d.T


# demands are 0 or >= 1e-3: the LP/MILP oracles have ~1e-7 feasibility tolerances
DEMAND = st.one_of(st.just(0.0), st.floats(1e-3, 10))


@st.composite
def instances(draw, max_n: int = 6, symmetric: bool = True):
    n = draw(st.integers(2, max_n))
    k = n * (n - 1) // 2
    vals = draw(st.lists(DEMAND, min_size=k, max_size=k))
    d = _symmetric(n, vals)
    if not symmetric:
        noise = draw(st.lists(DEMAND, min_size=n * n, max_size=n * n))
        d = d + np.array(noise).reshape(n, n)
        np.fill_diagonal(d, 0)
    ports = draw(st.lists(st.integers(0, 4), min_size=n, max_size=n))
    return d, np.array(ports)


# ---------------------------------------------------------------------------------------------- circuits

def test_spec_counterexample_greedy_vs_exact():
    c = mx.greedy_circuits(SPEC_D, 2, 1.0, 0.5)
    expected = np.zeros((4, 4), dtype=int)
    for i, j in [(2, 3), (1, 3), (1, 2)]:
        expected[i, j] = expected[j, i] = 1
    assert np.array_equal(c, expected)
    assert mx.all_to_all_time(SPEC_D, c, 1.0, 0.5) == pytest.approx(4.96)
    for method in ("milp", "brute"):
        best, t = mx.exact_circuits(SPEC_D, 2, 1.0, 0.5, method=method)
        assert t == pytest.approx(1.94)
        cycle = {(0, 1), (0, 2), (1, 3), (2, 3)}
        assert {(i, j) for i, j in zip(*np.nonzero(np.triu(best)))} == cycle


def test_code_compat_repeated_division_changes_the_choice():
    # pair 0-1 (10) vs 0-2 (2.5): after 3 circuits the paper has 10/3 = 3.33 > 2.5, the code 10/1/2/3 = 1.67
    d = np.zeros((3, 3))
    d[0, 1] = d[1, 0] = 10
    d[0, 2] = d[2, 0] = 2.5
    paper = mx.greedy_circuits(d, [4, 4, 1], 1.0, 1.0)
    code = mx.greedy_circuits(d, [4, 4, 1], 1.0, 1.0, code_compat=True)
    assert (paper[0, 1], paper[0, 2]) == (4, 0)
    assert (code[0, 1], code[0, 2]) == (3, 1)


@settings(max_examples=60, deadline=None)
@given(instances(), st.booleans(), st.floats(0.1, 4), st.floats(0.1, 4))
@example((np.array([[0, 5e-324, 0], [5e-324, 0, 0], [0, 0, 0.]]), np.array([1, 1, 0])), False, 1.0, 2.0)
def test_greedy_feasible_and_maximal(inst, code_compat, b_ocs, b_eps):
    d, ports = inst
    c = mx.greedy_circuits(d, ports, b_ocs, b_eps, code_compat=code_compat)
    assert c.dtype.kind == "i" and np.array_equal(c, c.T) and np.all(c >= 0) and np.all(np.diag(c) == 0)
    assert np.all(c.sum(axis=1) <= ports)
    free = ports - c.sum(axis=1)
    # the loop only stops when no pair with demand has a free port at both ends
    pair = np.maximum(d, d.T)
    blocked = (free[:, None] > 0) & (free[None, :] > 0) & (pair > 0)
    np.fill_diagonal(blocked, False)
    assert not blocked.any()


@settings(max_examples=60, deadline=None)
@given(instances(max_n=7), st.booleans())
def test_heap_matches_literal_argmax_loop(inst, code_compat):
    d, ports = inst
    a = mx.greedy_circuits(d, ports, 1.3, 0.7, code_compat=code_compat, method="heap")
    b = mx.greedy_circuits(d, ports, 1.3, 0.7, code_compat=code_compat, method="argmax")
    assert np.array_equal(a, b)


@pytest.mark.parametrize("seed", range(4))
@pytest.mark.parametrize("code_compat", [False, True])
def test_walk_matches_literal_loop_on_larger_instances_with_ties(seed, code_compat):
    """40 servers, uneven ports, integer demands (many ties) and some zero pairs: the sorted walk with its
    re-insertion heap picks exactly the pairs the literal argmax loop picks."""
    rng = np.random.default_rng(seed)
    n = 40
    upper = np.triu(rng.integers(0, 4, (n, n)).astype(float), 1)
    d = upper + upper.T * rng.integers(0, 2, (n, n))       # asymmetric: the heavier direction counts
    ports = rng.integers(0, 7, n)
    a = mx.greedy_circuits(d, ports, 1.3, 0.7, code_compat=code_compat)
    b = mx.greedy_circuits(d, ports, 1.3, 0.7, code_compat=code_compat, method="argmax")
    assert np.array_equal(a, b) and a.sum() > 0


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(instances(max_n=4), st.floats(0.2, 2))
def test_exact_is_optimal_and_no_worse_than_greedy(inst, b_eps):
    d, ports = inst
    ports = np.maximum(ports, 1)
    c_opt, t_opt = mx.exact_circuits(d, ports, 1.0, b_eps, method="milp")
    assert np.array_equal(c_opt, c_opt.T) and np.all(c_opt.sum(axis=1) <= ports)
    _, t_brute = mx.exact_circuits(d, ports, 1.0, b_eps, method="brute")
    assert t_opt == pytest.approx(t_brute, rel=1e-6)
    t_greedy = mx.all_to_all_time(d, mx.greedy_circuits(d, ports, 1.0, b_eps), 1.0, b_eps)
    assert t_greedy >= t_opt - 1e-12


def test_gap_report_worst_instance_reproduces_its_ratio():
    rep = mx.greedy_gap_report(25, 4, 2, 1.0, 0.5, seed=3, method="brute")
    assert rep["n_instances"] == 25 and 0 <= rep["fraction_optimal"] <= 1
    assert 1.0 <= rep["p50_ratio"] <= rep["worst_ratio"]
    d = np.array(rep["worst_instance"]["demand"])
    g = mx.all_to_all_time(d, mx.greedy_circuits(d, 2, 1.0, 0.5), 1.0, 0.5)
    _, opt = mx.exact_circuits(d, 2, 1.0, 0.5, method="milp")
    assert g / opt == pytest.approx(rep["worst_ratio"], rel=1e-4)


def test_input_errors():
    with pytest.raises(mx.MixnetInputError):
        mx.greedy_circuits(np.ones((2, 3)), 2, 1, 1)
    with pytest.raises(mx.MixnetInputError):
        mx.greedy_circuits(-SPEC_D, 2, 1, 1)
    with pytest.raises(mx.MixnetInputError):
        mx.greedy_circuits(SPEC_D, [1, 2], 1, 1)
    with pytest.raises(mx.MixnetInputError):
        mx.greedy_circuits(SPEC_D, 1.5, 1, 1)
    with pytest.raises(mx.MixnetInputError):
        mx.all_to_all_time(SPEC_D, np.triu(np.ones((4, 4), dtype=int), 1), 1, 1)   # not symmetric
    with pytest.raises(mx.MixnetInputError):
        mx.exact_circuits(np.ones((7, 7)), 6, 1, 1, method="brute", max_combinations=1000)


# ---------------------------------------------------------------------------------------------- a2a models

def test_all_to_all_time_hand_computed():
    d = np.array([[0, 4, 2], [4, 0, 1], [2, 1, 0.]])
    c = np.array([[0, 2, 0], [2, 0, 0], [0, 0, 0]])
    # circuits: 4/(2*1) = 2; EPS: server 0 sends 2, server 2 sends 3 → 3/0.5 = 6
    assert mx.all_to_all_time(d, c, 1.0, 0.5) == pytest.approx(6.0)
    assert mx.all_to_all_time(d, c, 1.0, [0.5, 0.5, 3.0]) == pytest.approx(4.0)   # server 0: 2/0.5


def _hybrid_lp(d, c, b_ocs, b_eps):
    """LP oracle: min T s.t. EPS share x_ij >= d_ij - c_ij*b*T, per-server EPS egress/ingress <= b_eps*T."""
    n = d.shape[0]
    off = [(i, j) for i in range(n) for j in range(n) if i != j]
    nv = len(off) + 1
    a_ub, b_ub = [], []
    for k, (i, j) in enumerate(off):
        row = np.zeros(nv)
        row[k] = -1
        row[-1] = -c[i, j] * b_ocs
        a_ub.append(row)
        b_ub.append(-d[i, j])
    for s in range(n):
        for side in (0, 1):
            row = np.zeros(nv)
            for k, pair in enumerate(off):
                if pair[side] == s:
                    row[k] = 1
            row[-1] = -b_eps
            a_ub.append(row)
            b_ub.append(0.0)
    obj = np.zeros(nv)
    obj[-1] = 1
    res = linprog(obj, A_ub=np.array(a_ub), b_ub=b_ub, bounds=[(0, None)] * nv, method="highs")
    return res.fun


@settings(max_examples=40, deadline=None)
@given(instances(max_n=5, symmetric=False), st.floats(0.3, 3))
def test_hybrid_matches_lp_and_never_exceeds_dedicated(inst, b_eps):
    d, ports = inst
    c = mx.greedy_circuits(d, ports, 1.0, b_eps)
    hybrid = mx.hybrid_all_to_all_time(d, c, 1.0, b_eps)
    assert hybrid == pytest.approx(_hybrid_lp(d, c, 1.0, b_eps), rel=1e-6, abs=1e-9)
    assert hybrid <= mx.all_to_all_time(d, c, 1.0, b_eps) + 1e-12


def test_fabric_times():
    d = _symmetric(3, [8.0, 4.0, 2.0]) * 1e9
    ft = mx.Fabric("fat_tree", 100)
    assert mx.fabric_a2a_time(d, ft) == pytest.approx(12e9 / (8 * 100 * 1.25e8))
    assert mx.fabric_a2a_time(d, mx.Fabric("rail_optimized", 100)) >= mx.fabric_a2a_time(d, ft)
    slow_nvlink = mx.Fabric("rail_optimized", 400, nvlink_bytes_per_s=1e9)
    assert mx.fabric_a2a_time(d, slow_nvlink) == pytest.approx(12e9 * 7 / 8 / 8e9)
    mix = mx.Fabric("mixnet", 100, alpha=6, a2a_model="dedicated")
    c = np.array([[0, 3, 3], [3, 0, 3], [3, 3, 0]])
    assert mx.fabric_a2a_time(d, mix, c) == pytest.approx(8e9 / (3 * 1.25e10))
    with pytest.raises(mx.MixnetInputError):
        mx.Fabric("mixnet", 100, alpha=8)


def test_ports_switched_counts_new_circuit_endpoints():
    old = np.array([[0, 2, 0], [2, 0, 1], [0, 1, 0]])
    new = np.array([[0, 1, 1], [1, 0, 1], [1, 1, 0]])
    assert mx.ports_switched(old, new) == 2   # one new 0-2 circuit: two ports re-pointed
    assert mx.ports_switched(new, new) == 0


# ---------------------------------------------------------------------------------------------- MoE traffic

def test_dispatch_bytes_expected_and_sampled_totals():
    rng = np.random.default_rng(0)
    placement = np.repeat(np.arange(4), 2)                     # 8 experts on 4 ranks
    pop = mx.expert_popularity(1, 8, 1.0, rng)[0]
    exp = mx.moe_dispatch_bytes(100, 2, 16, 2, placement, pop)
    assert exp.shape == (4, 4)
    assert exp.sum() == pytest.approx(4 * 100 * 2 * 16 * 2)
    per_rank = np.bincount(placement, weights=pop)
    assert np.allclose(exp[0], 100 * 2 * per_rank * 32)
    sampled = mx.moe_dispatch_bytes(100, 2, 16, 2, placement, pop, rng=rng)
    assert np.allclose(sampled.sum(axis=1), 100 * 2 * 32)        # every rank routes all its pairs
    assert np.allclose(sampled % 32, 0)


def test_server_demand_aggregates_and_drops_intra_server():
    r = np.arange(16, dtype=float).reshape(4, 4)
    servers = mx.rank_servers(4, tp=4, gpus_per_server=8)      # ranks 0,1 -> server 0; 2,3 -> server 1
    assert servers.tolist() == [0, 0, 1, 1]
    s = mx.server_demand(r, servers)
    manual = np.zeros((2, 2))
    for a, b in itertools.product(range(4), range(4)):
        if servers[a] != servers[b]:
            manual[servers[a], servers[b]] += r[a, b]
    assert np.allclose(s, manual)


# ---------------------------------------------------------------------------------------------- timeline

def _manual_timeline(fwd, bwd, p2p):
    s_count, m = fwd.shape
    return mx.Timeline(fabric=mx.Fabric("fat_tree", 100), overlap="simulator", fwd_base=fwd, bwd_base=bwd,
                       p2p_s=p2p, dp=1, trig_stage=np.zeros(0, int), trig_dir=np.zeros(0, int),
                       trig_mb=np.zeros(0, int), trig_window=np.zeros(0), trig_ports=np.zeros(0, int))


def _gpipe_dag(fwd, bwd, p2p):
    """The GPipe schedule as a DAG (node = task start/end), for the critical-path oracle."""
    s_count, m = fwd.shape
    ids = {}
    for key in itertools.product(("f", "b"), range(s_count), range(m), ("start", "end")):
        ids[key] = len(ids) + 1
    sink = len(ids) + 1
    src, dst, length = [], [], []

    def arc(u, v, w):
        src.append(u)
        dst.append(v)
        length.append(w)

    for s, b in itertools.product(range(s_count), range(m)):
        arc(0, ids["f", s, b, "start"], 0.0)
        arc(ids["f", s, b, "start"], ids["f", s, b, "end"], fwd[s, b])
        arc(ids["b", s, b, "start"], ids["b", s, b, "end"], bwd[s, b])
        arc(ids["f", s, m - 1, "end"], ids["b", s, b, "start"], 0.0)
        if s > 0:
            arc(ids["f", s - 1, b, "end"], ids["f", s, b, "start"], p2p)
            arc(ids["b", s, b, "end"], ids["b", s - 1, b, "start"], p2p)
        if b > 0:
            arc(ids["f", s, b - 1, "end"], ids["f", s, b, "start"], 0.0)
            arc(ids["b", s, b - 1, "end"], ids["b", s, b, "start"], 0.0)
        arc(ids["b", s, b, "end"], sink, 0.0)
    # renumber in topological order for the DAG routine (src < dst)
    order = _topo(sink + 1, src, dst)
    rank = np.empty(sink + 1, int)
    rank[order] = np.arange(sink + 1)
    return sink + 1, rank[src], rank[dst], np.array(length)


def _topo(n, src, dst):
    indeg = np.bincount(dst, minlength=n)
    out = [[] for _ in range(n)]
    for u, v in zip(src, dst):
        out[u].append(v)
    ready, order = [u for u in range(n) if indeg[u] == 0], []
    while ready:
        u = ready.pop()
        order.append(u)
        for v in out[u]:
            indeg[v] -= 1
            if indeg[v] == 0:
                ready.append(v)
    return np.array(order)


@settings(max_examples=25, deadline=None)
@given(st.integers(1, 4), st.integers(1, 4), st.floats(0, 2), st.integers(0, 2 ** 32 - 1))
def test_gpipe_matches_critical_path_oracle(stages, micro, p2p, seed):
    rng = np.random.default_rng(seed)
    fwd, bwd = rng.random((stages, micro)), rng.random((stages, micro)) * 2
    t = _manual_timeline(fwd, bwd, p2p).times(np.zeros((1, 0)))[0]
    n, src, dst, length = _gpipe_dag(fwd, bwd, p2p)
    value, _ = longest_path(n, src, dst, length)
    assert t == pytest.approx(value, rel=1e-12)


def test_gpipe_uniform_closed_form():
    s_count, m, f, b, p = 4, 6, 1.0, 2.0, 0.25
    t = _manual_timeline(np.full((s_count, m), f), np.full((s_count, m), b), p).times(np.zeros((1, 0)))[0]
    assert t == pytest.approx((m + s_count - 1) * (f + b) + 2 * (s_count - 1) * p)


@pytest.mark.parametrize("pp, m", [(1, 2), (3, 4)])
def test_many_replicates_give_each_replicate_s_own_time(pp, m):
    """`Timeline.times` over R replicates (the vectorised schedule) against one replicate at a time (its Python
    twin for R = 1): the same numbers, bit for bit, NaN included."""
    model, par, gpu, _ = _small(pp=pp, m=m)
    tl = mx.build_timeline(model, par, gpu, mx.Fabric("mixnet", 100), reconfigure="on_change")
    rng = np.random.default_rng(pp * 10 + m)
    draws = rng.exponential(0.03, size=(7, tl.n_triggers))
    draws[3, 0] = np.nan
    many = tl.times(draws)
    one = np.array([tl.times(draws[i:i + 1])[0] for i in range(len(draws))])
    assert np.array_equal(many, one, equal_nan=True) and np.isnan(many[3]) and np.isfinite(many[:3]).all()


def _small(model="mixtral-8x7b", pp=1, m=2, **fabric):
    par = mm.Parallelism(ep=8, tp=4, pp=pp, micro_batches=m, micro_batch_sequences=1, seq_len=1024)
    return mm.get_model(model), par, mm.GPUS["h100-sxm"], fabric


@pytest.mark.parametrize("overlap", ["simulator", "all_hidden"])
def test_single_stage_delay_adds_exposed_reconfiguration_time(overlap):
    model, par, gpu, _ = _small()
    tl = mx.build_timeline(model, par, gpu, mx.Fabric("mixnet", 100), overlap=overlap)
    assert tl.n_triggers == 2 * model.n_moe_layers * par.micro_batches == tl.reconfigurations_per_region
    assert np.all(tl.trig_ports == 6 * par.region_servers)
    t0 = mx.constant_delay_times(tl, [0.0])[0]
    for d in (0.0005, 0.003, 0.025):
        exposed = np.clip(d - tl.trig_window, 0, None).sum()     # one stage: everything is on the path
        assert mx.constant_delay_times(tl, [d])[0] == pytest.approx(t0 + exposed, rel=1e-12)
    if overlap == "simulator":
        assert np.all(tl.trig_window[tl.trig_dir == 0] == 0)
    assert np.all(tl.trig_window[tl.trig_dir == 1] > 0)


def test_on_change_reconfiguration_skips_unchanged_circuits():
    model, par, gpu, _ = _small()
    tl = mx.build_timeline(model, par, gpu, mx.Fabric("mixnet", 100), reconfigure="on_change")
    assert np.all(tl.trig_ports <= 6 * par.region_servers)
    t = mx.constant_delay_times(tl, [0.0, 1.0])
    exposed = (np.clip(1.0 - tl.trig_window, 0, None) * (tl.trig_ports > 0)).sum()
    assert t[1] - t[0] == pytest.approx(exposed, rel=1e-12)


def test_fat_tree_has_no_reconfiguration_and_mixnet_d0_uses_same_compute():
    model, par, gpu, _ = _small(pp=2, m=3)
    ft = mx.build_timeline(model, par, gpu, mx.Fabric("fat_tree", 400))
    mix = mx.build_timeline(model, par, gpu, mx.Fabric("mixnet", 400))
    assert ft.n_triggers == 0
    t_ft = ft.times(np.zeros((1, 0)))[0]
    assert t_ft > 0 and mx.constant_delay_times(mix, [0.0])[0] >= t_ft * 0.99
    # the all-to-all is where MixNet differs: equal per-layer traffic, so per-layer a2a can only be slower
    assert np.all(mix.a2a_time >= ft.a2a_time * (1 - 1e-9))


def test_break_even_delay_solves_the_timeline():
    model, par, gpu, _ = _small(pp=2, m=2)
    mix = mx.build_timeline(model, par, gpu, mx.Fabric("mixnet", 400))
    t0 = mx.constant_delay_times(mix, [0.0])[0]
    target = t0 * 1.2
    d = mx.break_even_delay(mix, target)
    assert mx.constant_delay_times(mix, [d])[0] == pytest.approx(target, rel=1e-9)
    assert mx.constant_delay_times(mix, [d * 0.99])[0] < target
    assert mx.break_even_delay(mix, t0 * 0.5) is None


def test_break_even_matches_spec_formula_on_one_stage():
    # one stage, simulator overlap: for d below every backward window only the N_F forward triggers count,
    # so d* = (T_target - T(0)) / N_F  (spec: W + (T_ft - T_mix(0)) / N_r with W = 0 for the exposed ones)
    model, par, gpu, _ = _small()
    mix = mx.build_timeline(model, par, gpu, mx.Fabric("mixnet", 100))
    t0 = mx.constant_delay_times(mix, [0.0])[0]
    n_f = int((mix.trig_dir == 0).sum())
    gap = 0.5 * mix.trig_window[mix.trig_dir == 1].min() * n_f
    assert mx.break_even_delay(mix, t0 + gap) == pytest.approx(gap / n_f, rel=1e-9)


def test_sampling_constant_samples_equals_constant_delay():
    model, par, gpu, _ = _small(pp=2)
    mix = mx.build_timeline(model, par, gpu, mx.Fabric("mixnet", 100))
    t = mx.sample_iteration_times(mix, mx.CycleDelays(np.full((5, 2), 0.04), np.full(5, 0.03)), 5,
                                  np.random.default_rng(0))
    assert np.allclose(t, mx.constant_delay_times(mix, [0.04])[0])


def _one_trigger(k: int) -> mx.Timeline:
    fwd = np.zeros((1, 1))
    return mx.Timeline(fabric=mx.Fabric("mixnet", 100), overlap="simulator", fwd_base=fwd, bwd_base=fwd.copy(),
                       p2p_s=0.0, dp=1, trig_stage=np.array([0]), trig_dir=np.array([0]), trig_mb=np.array([0]),
                       trig_window=np.array([0.0]), trig_ports=np.array([k]))


def test_a_reconfiguration_waits_for_the_slowest_port_of_one_cycle():
    # every port of cycle c is c + 1 s, so the slowest of any k ports of one cycle is a cycle value; a model
    # drawing ports of different cycles independently (pseudo-replication) would give a max biased upwards
    cycles = np.arange(1.0, 6.0)[:, None] * np.ones((5, 4))
    delays = mx.CycleDelays(cycles, np.zeros(5))
    for k in (1, 2, 4):
        t = mx.sample_iteration_times(_one_trigger(k), delays, 20000, np.random.default_rng(k))
        assert set(np.unique(t)) <= set(range(1, 6))
        assert abs(t.mean() - 3.0) < 5 * np.sqrt(2.0 / 20000)          # uniform over cycles: mean 3, var 2
    iid = np.random.default_rng(0).choice(cycles.ravel(), (20000, 4)).max(axis=1).mean()
    assert iid > 3.8                                                       # what i.i.d. ports would say


def test_within_a_cycle_the_slowest_of_a_random_k_subset_follows_the_rank_law():
    # one cycle, ports 0..3 s: the max of a random 2-subset is rank i with P = C(i-1, 1) / C(4, 2)
    delays = mx.CycleDelays(np.array([[0.0, 1.0, 2.0, 3.0]]), np.zeros(1))
    t = mx.sample_iteration_times(_one_trigger(2), delays, 60000, np.random.default_rng(3))
    share = np.array([np.mean(t == v) for v in (1.0, 2.0, 3.0)])
    assert np.allclose(share, [1 / 6, 2 / 6, 3 / 6], atol=0.01) and np.mean(t == 0.0) == 0


def test_more_ports_than_the_bench_use_the_shared_plus_per_port_decomposition():
    # shared OCS part 10 or 20 s per cycle, per-port part 0 or 1 s: for k = 6 > 2 bench ports the delay is the
    # cycle's shared part + the max of 6 i.i.d. per-port parts (1 s with probability 1 − 2^-6)
    per_port = np.array([[10.0, 11.0], [20.0, 21.0]])
    delays = mx.CycleDelays(per_port, np.array([10.0, 20.0]))
    t = mx.sample_iteration_times(_one_trigger(6), delays, 40000, np.random.default_rng(5))
    assert set(np.unique(t)) <= {10.0, 11.0, 20.0, 21.0}
    assert abs(np.mean((t == 10.0) | (t == 20.0)) - 2.0 ** -6) < 5 * np.sqrt(2.0 ** -6 / 40000)
    assert abs(np.mean(t >= 20.0) - 0.5) < 0.02
    assert mx.delay_model_of(np.array([0, 2, 6]), delays.bench_ports) == {
        "method": "mixed", "bench_ports": 2, "max_ports_switched": 6, "switching_reconfigurations": 2,
        "joint": 1, "decomposed": 1}
    with pytest.raises(mx.MixnetInputError):
        mx.sample_iteration_times(_one_trigger(1), np.array([1.0, 2.0]), 10, np.random.default_rng(0))


def test_resampled_draws_are_each_replicates_draws_on_its_resample_in_turn():
    # the oracle is the definition: per replicate, resample the cycles, then draw_delays on the resample — with
    # NaN ports, ties, k both within and beyond the bench's ports, and k = 0
    g = np.random.default_rng(1)
    for trial in range(60):
        n_cycles, n_ports = int(g.integers(1, 12)), int(g.integers(1, 9))
        per_port = g.gamma(2.0, 1.0, (n_cycles, n_ports))
        per_port[g.random((n_cycles, n_ports)) < 0.3] = np.nan
        per_port[:, 0] = np.where(np.isnan(per_port[:, 0]), 1.0, per_port[:, 0])
        if trial % 3 == 0:
            per_port = np.round(per_port, 1)
        delays = mx.CycleDelays(per_port, np.nanmin(per_port, axis=1) * g.random(n_cycles))
        ports = g.integers(0, 2 * n_ports + 3, int(g.integers(1, 20)))
        rows, n_boot = int(g.integers(1, 40)), int(g.integers(1, 8))
        one_by_one, together = np.random.default_rng(trial), np.random.default_rng(trial)
        expected = np.stack([mx.draw_delays(ports, delays.take(one_by_one.integers(0, delays.n_cycles,
                                                                                   delays.n_cycles)),
                                            rows, one_by_one) for _ in range(n_boot)])
        assert np.array_equal(mx.draw_resampled_delays(ports, delays, n_boot, rows, together), expected), trial
        assert one_by_one.random() == together.random()        # the stream left where the sequential one is


def test_data_parallel_replicas_wait_for_the_slowest():
    model, par, gpu, _ = _small()
    par_dp = mm.with_overrides(par, dp=4)
    one = mx.build_timeline(model, par, gpu, mx.Fabric("mixnet", 100))
    four = mx.build_timeline(model, par_dp, gpu, mx.Fabric("mixnet", 100))
    samples = mx.CycleDelays.independent(np.random.default_rng(1).exponential(0.02, 200))
    t1 = mx.sample_iteration_times(one, samples, 400, np.random.default_rng(2)).mean()
    t4 = mx.sample_iteration_times(four, samples, 400, np.random.default_rng(2)).mean()
    assert t4 > t1


def test_external_traffic_matrix_feeds_the_timeline():
    model, par, gpu, _ = _small()
    uniform = np.full((par.ep, par.ep), 1e6)
    tl = mx.build_timeline(model, par, gpu, mx.Fabric("fat_tree", 100), traffic=lambda s, l, b: uniform)
    server = mx.server_demand(uniform, mx.rank_servers(par.ep, par.tp))
    assert np.allclose(tl.a2a_time, mx.fabric_a2a_time(server, mx.Fabric("fat_tree", 100)))
    tl_srv = mx.build_timeline(model, par, gpu, mx.Fabric("fat_tree", 100), traffic=lambda s, l, b: server,
                               traffic_level="server")
    assert np.allclose(tl_srv.a2a_time, tl.a2a_time)


def test_traffic_from_matrices_maps_global_layers_to_stages():
    model, par, gpu, _ = _small(pp=2, m=2)
    rng = np.random.default_rng(4)
    mats = {(layer, b): rng.random((par.ep, par.ep)) * 1e7 for layer in range(model.n_moe_layers) for b in range(2)}
    stages = mm.stage_layers(model, 2)
    direct = mx.build_timeline(model, par, gpu, mx.Fabric("fat_tree", 100),
                               traffic=lambda s, l, b: mats[sum(n for _, n in stages[:s]) + l, b])
    mapped = mx.build_timeline(model, par, gpu, mx.Fabric("fat_tree", 100),
                               traffic=mx.traffic_from_matrices(mats, model, par))
    assert np.array_equal(direct.a2a_time, mapped.a2a_time) and np.array_equal(direct.fwd_base, mapped.fwd_base)
    partial = {k: v for k, v in mats.items() if k[0] != 3}
    with pytest.raises(mx.MixnetInputError, match="MoE layer 3"):
        mx.build_timeline(model, par, gpu, mx.Fabric("fat_tree", 100),
                          traffic=mx.traffic_from_matrices(partial, model, par))


def test_with_overlap_rederives_the_windows():
    model, par, gpu, _ = _small(pp=2)
    sim = mx.build_timeline(model, par, gpu, mx.Fabric("mixnet", 100), overlap="simulator")
    hidden = mx.build_timeline(model, par, gpu, mx.Fabric("mixnet", 100), overlap="all_hidden")
    assert np.array_equal(sim.with_overlap("all_hidden").trig_window, hidden.trig_window)
    assert np.array_equal(hidden.with_overlap("simulator").trig_window, sim.trig_window)
    assert np.array_equal(hidden.trig_window, hidden.trig_expert_s)
    # backward windows are twice the forward expert compute of the same (layer, micro-batch)
    fwd = hidden.trig_dir == 0
    assert np.allclose(np.sort(hidden.trig_expert_s[~fwd]), np.sort(2 * hidden.trig_expert_s[fwd]))
    assert sim.with_overlap("all_hidden").overlap == "all_hidden"
    d = [0.0, 0.01, 0.03]
    assert np.array_equal(mx.constant_delay_times(sim.with_overlap("all_hidden"), d),
                          mx.constant_delay_times(hidden, d))
    with pytest.raises(mx.MixnetInputError):
        sim.with_overlap("none")


def test_scaling_transfers_is_a_slower_link_and_scaling_everything_is_a_slower_clock():
    """Oracles: on the fat-tree every transfer takes bytes/rate, so transfers x 2 is the same iteration at half
    the link speed; GPipe is positively homogeneous, so compute and transfers x 2 with the delays x 2 doubles T."""
    model, par = mm.get_model("mixtral-8x7b"), mm.with_overrides(mm.DEFAULT_PARALLELISM["mixtral-8x7b"],
                                                                  micro_batches=2)
    gpu = mm.GPUS["h100-sxm"]
    ft = mx.build_timeline(model, par, gpu, mx.Fabric("fat_tree", 200), seed=1)
    slow = mx.build_timeline(model, par, gpu, mx.Fabric("fat_tree", 100), seed=1)
    assert ft.scaled(1.0, 2.0).times(np.zeros((1, 0)))[0] == pytest.approx(slow.times(np.zeros((1, 0)))[0])
    mix = mx.build_timeline(model, par, gpu, mx.Fabric("mixnet", 100, alpha=2), overlap="simulator",
                            reconfigure="on_change", seed=1)
    d = np.full(mix.n_triggers, 0.03)
    assert mix.scaled(2.0, 2.0).times(2 * d)[0] == pytest.approx(2 * mix.times(d)[0])
    assert mix.scaled(1.0, 1.0).times(d)[0] == pytest.approx(mix.times(d)[0])
    assert np.allclose(mix.scaled(3.0, 1.0).trig_window, 3 * mix.trig_window)
    with pytest.raises(mx.MixnetInputError):
        _manual_timeline(np.ones((1, 1)), np.ones((1, 1)), 0.0).scaled(2.0, 1.0)   # no compute/transfer split


def test_blending_two_readings_of_one_iteration_moves_every_transfer_between_them():
    model, par = mm.get_model("mixtral-8x7b"), mm.with_overrides(mm.DEFAULT_PARALLELISM["mixtral-8x7b"],
                                                                  micro_batches=2)
    gpu = mm.GPUS["h100-sxm"]
    hyb = mx.build_timeline(model, par, gpu, mx.Fabric("mixnet", 100, alpha=2), seed=1)
    ded = mx.build_timeline(model, par, gpu, mx.Fabric("mixnet", 100, alpha=2, a2a_model="dedicated"), seed=1)
    z = np.zeros(hyb.n_triggers)
    assert mx.blend_timelines(ded, hyb, 0.0).times(z)[0] == pytest.approx(ded.times(z)[0])
    assert mx.blend_timelines(ded, hyb, 1.0).times(z)[0] == pytest.approx(hyb.times(z)[0])
    half = mx.blend_timelines(ded, hyb, 0.5)
    assert np.allclose(half.fwd_comm, (ded.fwd_comm + hyb.fwd_comm) / 2)
    assert np.allclose(half.fwd_base - half.fwd_comm, hyb.fwd_base - hyb.fwd_comm)    # compute untouched
    other = mx.build_timeline(model, par, gpu, mx.Fabric("mixnet", 100, alpha=3), seed=1)
    with pytest.raises(mx.MixnetInputError):
        mx.blend_timelines(ded, other, 0.5)
