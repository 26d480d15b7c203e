"""Training-iteration DAG: structure, delay model of §6.3, wiring coupling, measured-delay distribution."""
import numpy as np
import pandas as pd
import pytest

from analysis.critical_path import smoothed_critical_path
from analysis.dag import (MoEConfig, build_training_dag, traffic_from_expert_counts, traffic_from_frame,
                          RECONFIG)
from analysis.wiring import exact_wiring_milp, optimize_wiring, polish_wiring, round_wiring


def small(L=3, m=1, n=4, agg=2e-3, seed=0):
    rng = np.random.default_rng(seed)
    D = rng.gamma(0.7, 5e6, (L, n, n))
    cfg = MoEConfig(num_layers=L, micro_batches=m, attn_fwd_s=2e-3, expert_fwd_s=3e-3, aggregate_bwd_s=agg,
                    allreduce_s=1e-3, optimizer_s=5e-4)
    return build_training_dag(D, cfg, b_ocs=12.5e9, b_eps=1.25e9), D


def test_structure_and_reconfiguration_count():
    for L, m in [(1, 1), (3, 2), (4, 4)]:
        dag, _ = small(L, m)
        assert np.all(dag.src < dag.dst)
        assert dag.num_reconfigurations == 2 * L * m                     # N_r = 2 L m
        assert np.count_nonzero(dag.reconfig_trigger == 0) == L * m
        comm = dag.arc_edge >= 0
        assert np.all(dag.arc_bytes[comm] > 0)
        # every node lies on some source -> sink path
        _, mu = smoothed_critical_path(dag.num_nodes, dag.src, dag.dst, np.zeros(dag.src.size), 1.0)
        into = np.bincount(dag.dst, mu, dag.num_nodes)
        assert np.all(into[1:] > 0)


@pytest.mark.parametrize("d", [0.0005, 0.001, 0.005, 0.05])
def test_delay_model_matches_section_6_3(d):
    """m = 1: forward reconfigurations fully exposed, backward ones hidden behind the aggregate
    computation W: T(d) = T(0) + L d + L max(0, d - W)."""
    L, W = 3, 2e-3
    dag, _ = small(L, 1, agg=W)
    x = np.ones(len(dag.edges))
    T0 = dag.iteration_time(x, 0.0)
    assert dag.iteration_time(x, d) == pytest.approx(T0 + L * d + L * max(0.0, d - W), rel=1e-12)
    static = build_training_dag(_, dag.config, b_ocs=dag.b_ocs, b_eps=dag.b_eps, reconfigure=False)
    assert static.num_reconfigurations == 0
    assert static.iteration_time(x) == pytest.approx(T0, rel=1e-12)
    br = dag.critical_breakdown(x, d)
    assert br["total"] == pytest.approx(sum(br[k] for k in ("compute", "dispatch", "combine", "reconfig", "sync")))


def test_circuits_speed_up_all_to_all_and_optimizer_runs_on_dag():
    dag, D = small(2, 2, n=4)
    E = len(dag.edges)
    assert dag.iteration_time(np.zeros(E)) > dag.iteration_time(np.ones(E)) > dag.iteration_time(3 * np.ones(E))
    prob = dag.to_wiring_problem(degree=3, reconfig_delay=0.04)
    res = optimize_wiring(prob, 1e4, 1e4, anneal=(1e2, 1e3), max_iter=300)
    # naive rounding of the relaxation can lose to the symmetric wiring (fractional circuits round to
    # EPS-only pairs); the degree-preserving local search repairs it here (it reaches the MILP optimum).
    x, info = polish_wiring(prob, round_wiring(res.w, prob.edges, prob.degree))
    x_sym = round_wiring(prob.prior, prob.edges, prob.degree)
    assert prob.makespan(x) <= prob.makespan(x_sym) + 1e-12
    milp = exact_wiring_milp(prob)
    assert milp["makespan"] <= prob.makespan(x) + 1e-12
    assert res.U[-1] <= milp["makespan"] + 1e-9                 # relaxation below the integer optimum here
    assert prob.makespan(x) == pytest.approx(dag.iteration_time(x, 0.04), rel=1e-12)
    per_layer = np.stack([x, x])
    assert dag.iteration_time(per_layer, 0.04) == pytest.approx(dag.iteration_time(x, 0.04))


def test_measured_delay_distribution():
    dag, _ = small(3, 2)
    x = np.ones(len(dag.edges))
    samples = np.array([0.040, 0.045, 0.050, 0.068])
    T = dag.iteration_time_samples(x, samples, n_draws=200, seed=0)
    assert T.min() >= dag.iteration_time(x, samples.min()) - 1e-12
    assert T.max() <= dag.iteration_time(x, samples.max()) + 1e-12
    assert T.std() > 0


def test_trace_adapters():
    df = pd.DataFrame({"layer": [0, 0, 1], "src": [0, 1, 2], "dst": [1, 0, 0], "bytes": [5.0, 7.0, 1.0]})
    D = traffic_from_frame(df, 2, 3)
    assert D.shape == (2, 3, 3) and D[0, 0, 1] == 5 and D[1, 2, 0] == 1
    counts = np.array([[[4, 2, 0, 1], [0, 3, 3, 0]]])                  # 1 layer, 2 ranks, 4 experts
    Dx = traffic_from_expert_counts(counts, [0, 0, 1, 1], 2, bytes_per_token=10.0)
    np.testing.assert_allclose(Dx[0], [[0, 10], [30, 0]])
    dag = build_training_dag(Dx, MoEConfig(num_layers=1), b_ocs=1.0, b_eps=0.5)
    assert dag.arc_bytes.max() == 30.0                                  # symmetrised max(D01, D10)


def test_symmetry_principle_on_the_dag_and_policy_never_reconfigures():
    """Uniform all-to-all on K_n with uniform ports: the optimizer returns the prior, the symmetric
    wiring is the best candidate every epoch, and the threshold policy never switches."""
    from analysis.regret import threshold_policy
    n, L = 5, 2
    D = np.ones((L, n, n)) * 4e6
    D[:, np.arange(n), np.arange(n)] = 0
    cfg = MoEConfig(num_layers=L, attn_fwd_s=1e-3, expert_fwd_s=1e-3)
    dag = build_training_dag(D, cfg, b_ocs=12.5e9, b_eps=1.25e9)
    prob = dag.to_wiring_problem(degree=n - 1, reconfig_delay=0.01)
    for b1 in (10.0, 1e4):
        r = optimize_wiring(prob, b1, 1e3)
        np.testing.assert_allclose(r.w, prob.prior, atol=1e-9)
    x_sym = round_wiring(prob.prior, prob.edges, prob.degree)
    np.testing.assert_array_equal(x_sym, np.ones(len(prob.edges)))
    rng = np.random.default_rng(0)
    cands = [x_sym]
    for _ in range(3):                           # other integer wirings within the budgets
        y = np.zeros(len(prob.edges), int)
        cands.append(polish_wiring(prob, y, max_evals=5)[0])
    volume = rng.uniform(0.5, 2.0, 60)           # per-epoch traffic volume, always uniform in shape
    costs = np.array([[build_training_dag(D * v, cfg, b_ocs=12.5e9, b_eps=1.25e9).iteration_time(c, 0.01)
                       for c in cands] for v in volume[:6]])
    costs = np.vstack([costs] * 10)
    assert np.all(np.argmin(costs, axis=1) == 0)
    _, sched = threshold_policy(costs, 0.01, None, start=0)
    assert np.all(sched == 0)


def test_candidates_and_cost_builder_feed_regret_experiment():
    from analysis.dag import candidate_wirings, iteration_cost_builder
    from analysis.regret import regret_experiment
    rng = np.random.default_rng(1)
    n, L = 4, 1
    cfg = MoEConfig(num_layers=L, attn_fwd_s=1e-3, expert_fwd_s=1e-3)
    A = rng.gamma(0.5, 8e6, (L, n, n))
    B = rng.gamma(0.5, 8e6, (L, n, n))
    cands = candidate_wirings([A, B], cfg, 2, b_ocs=12.5e9, b_eps=1.25e9)
    assert cands.shape[1] == n * (n - 1) // 2 and 1 <= len(cands) <= 3
    traffic = np.stack([A * rng.uniform(0.9, 1.1) for _ in range(20)] + [B * rng.uniform(0.9, 1.1) for _ in range(20)])
    f = iteration_cost_builder(cfg, cands, b_ocs=12.5e9, b_eps=1.25e9)
    out = regret_experiment(traffic, f, [0.045, 0.05], cost_scales=(1, 4), n_draws=10)
    assert out["table"].shape[0] == 2 and np.all(out["table"]["regret_offline"] >= -1e-12)
    out2 = regret_experiment(traffic, f, [0.045, 0.05], cost_scales=(1,), n_draws=10, use_alarms=True)
    assert out2["alarms"][20:26].any() and not out2["alarms"][:20].any()   # the regime change is detected
