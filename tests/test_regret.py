"""Spec §3 oracles: DP vs brute force, threshold policy, regret, measured switching cost, experiment."""
import numpy as np
import pandas as pd
import pytest
from hypothesis import given, settings, strategies as st

from analysis.regret import (best_static, brute_force_schedule, default_threshold, estimate_variation,
                             exposed_reconfiguration_samples, free_switching, lognormal_from_mean_p99,
                             offline_optimum, regime_costs, regret_curves, regret_experiment, regret_report,
                             schedule_cost, threshold_policy)

ORACLE = np.array([[1.0, 2.0]] * 5 + [[2.0, 1.0]] * 5)


def test_spec_oracle():
    tot, sched = threshold_policy(ORACLE, 1.5, 2.0, start=0)
    assert tot == pytest.approx(13.5)
    assert np.count_nonzero(np.diff(sched)) == 1
    assert best_static(ORACLE) == (15.0, 0)
    opt, osched = offline_optimum(ORACLE, 1.5, start=0)
    assert opt == pytest.approx(11.5)
    np.testing.assert_array_equal(osched, [0] * 5 + [1] * 5)
    assert free_switching(ORACLE)[0] == pytest.approx(10.0)
    assert brute_force_schedule(ORACLE, 1.5, 0)[0] == pytest.approx(11.5)
    rep = regret_report(ORACLE, 1.5, threshold=2.0)
    assert rep["regret_static"] == pytest.approx(-1.5) and rep["regret_offline"] == pytest.approx(2.0)
    assert rep["regret_oracle"] == pytest.approx(3.5)


@settings(max_examples=30, deadline=None)
@given(T=st.integers(1, 7), W=st.integers(1, 3), seed=st.integers(0, 10_000), matrix=st.booleans(),
       start=st.sampled_from([0, None]))
def test_dp_equals_brute_force(T, W, seed, matrix, start):
    rng = np.random.default_rng(seed)
    costs = rng.uniform(0, 3, (T, W))
    C = rng.uniform(0, 2, (W, W)) if matrix else float(rng.uniform(0, 2))
    opt, sched = offline_optimum(costs, C, start)
    bf, _ = brute_force_schedule(costs, C, start)
    assert opt == pytest.approx(bf, abs=1e-12)
    assert schedule_cost(costs, sched, C, start)[0] == pytest.approx(opt, abs=1e-12)
    # ordering: free switching <= OPT_C <= best static (start-free) and <= the policy
    assert free_switching(costs)[0] <= opt + 1e-12
    if start is None:
        assert opt <= best_static(costs)[0] + 1e-12
    pol, psched = threshold_policy(costs, C, float(rng.uniform(0, 3)), start=0)
    assert pol >= offline_optimum(costs, C, 0)[0] - 1e-12
    assert pol == pytest.approx(schedule_cost(costs, psched, C, 0)[0])


def test_policy_never_reconfigures_under_symmetric_costs():
    """Symmetry principle (§2.2): the symmetric wiring is best every epoch -> no switch, any C."""
    rng = np.random.default_rng(0)
    costs = 1.0 + 0.2 * rng.random((200, 4))
    costs[:, 2] = 0.9 + 0.05 * rng.random(200)       # wiring 2 (the prior) is always best
    for C in (0.0, 0.01, 1.0):
        tot, sched = threshold_policy(costs, C, None, start=2)
        assert np.all(sched == 2)
        tot, sched = threshold_policy(costs, C, 0.0, start=2, alarms=np.ones(200, bool))
        assert np.all(sched == 2)


def test_alarm_trigger_and_sampled_switch_costs():
    tot, sched, det = threshold_policy(ORACLE, 1.5, 100.0, start=0, alarms=np.r_[[False] * 5, [True] * 5],
                                       return_details=True)
    assert det["switch_epochs"].tolist() == [5]      # alarm at t=5 (0-based), gain 1 * 4 epochs > 1.5
    assert tot == pytest.approx(5 + 2 + 1.5 + 4)
    tot2, _ = threshold_policy(ORACLE, 1.5, 100.0, start=0, alarms=np.r_[[False] * 5, [True] * 5],
                               switch_cost_draws=[0.25])
    assert tot2 == pytest.approx(5 + 2 + 0.25 + 4)


def test_default_threshold_and_variation():
    assert default_threshold(2.0, 0.5, 100, 4) == pytest.approx(np.sqrt(2 * 0.5 * 100 / 4))
    costs, regime = regime_costs(400, 3, 4, gap=0.2, noise=0.0, seed=1)
    V1, G = estimate_variation(costs, regime)
    assert G == 4 and V1 == pytest.approx(0.0)
    V1b, Gb = estimate_variation(costs)
    assert Gb == 4


def test_exposed_reconfiguration_samples_from_events():
    rows = []
    for cyc, (d_a, d_b) in enumerate([(40e6, 45e6), (50e6, 41e6), (60e6, 62e6)]):
        t0 = 1_000_000_000 * (cyc + 1)
        rows.append(dict(run_id="r", cycle=cyc, stage="ocs_command_sent", host="", port="", t_ns=t0))
        rows.append(dict(run_id="r", cycle=cyc, stage="port_active", host="h1", port="p", t_ns=t0 + d_a - 1e6))
        rows.append(dict(run_id="r", cycle=cyc, stage="first_packet", host="h1", port="p", t_ns=t0 + d_a))
        rows.append(dict(run_id="r", cycle=cyc, stage="port_active", host="h2", port="p", t_ns=t0 + d_b))
    s = exposed_reconfiguration_samples(pd.DataFrame(rows))
    np.testing.assert_allclose(s, [0.045, 0.050, 0.062])        # h2 has no first_packet: port_active
    np.testing.assert_allclose(exposed_reconfiguration_samples(pd.DataFrame(rows), overlap_s=0.048),
                               [0.0, 0.002, 0.014], atol=1e-12)


def test_lognormal_profile_matches_mean_and_p99():
    s = lognormal_from_mean_p99(0.04144, 0.060, 200_000, seed=0)
    assert s.mean() == pytest.approx(0.04144, rel=0.01)
    assert np.quantile(s, 0.99) == pytest.approx(0.060, rel=0.02)


def test_regret_experiment_table_and_sqrt_scaling():
    costs, regime = regime_costs(2000, 3, 5, gap=0.05, noise=0.02, seed=2)
    samples = lognormal_from_mean_p99(0.045, 0.065, 500, seed=3)
    out = regret_experiment(None, costs, samples, regimes=regime, cost_scales=(0.25, 1, 4, 16), seed=0,
                            n_draws=100)
    tb = out["table"]
    assert list(tb["scale"]) == [0.25, 1, 4, 16]
    assert np.all(tb["regret_offline"] >= -1e-9)
    assert np.all(tb["regret_static_p05"] <= tb["regret_static_p95"])
    assert out["heuristic_slope"] == 0.5 and np.isfinite(out["slope_offline"])
    assert (tb["exceeds_heuristic_offline"] == (tb["regret_offline"] > tb["heuristic_scale"])).all()
    assert tb["heuristic_scale"].to_numpy() == pytest.approx(2 * np.sqrt(out["Gamma"] * tb["C_mean"] * out["V1"] * 2000))
    cur = regret_curves(out)
    assert cur["C"].shape == (4,) and len(cur["regret_offline_band"]) == 2
    # cost builder + GLR-CUSUM alarms path
    rng = np.random.default_rng(0)
    traffic = np.vstack([rng.multinomial(200, [.5, .3, .2], 100), rng.multinomial(200, [.2, .3, .5], 100)])
    builder = lambda tr: np.stack([tr[:, 0] / 200.0, tr[:, 2] / 200.0], axis=1)
    out2 = regret_experiment(traffic, None, samples, cost_builder=builder, use_alarms=True, cost_scales=(1, 4),
                             n_draws=20)
    assert out2["alarms"].any() and len(out2["table"]) == 2


def test_switch_cost_from_profile_yaml():
    import yaml
    from pathlib import Path
    from analysis.regret import switch_cost_from_profile
    root = Path(__file__).resolve().parents[1] / "devices" / "profiles"
    sim = {"ocs": {"switch": {"dist": "fixed", "ms": 25.0}},
           "nic": {k: {"dist": "fixed", "ms": 0.01} for k in ("los_clear", "cdr_lock", "phy_up", "port_active")}}
    np.testing.assert_allclose(switch_cost_from_profile(sim, 5, ports=4), 0.02504)
    np.testing.assert_allclose(switch_cost_from_profile(sim, 5, include_nic=False, overlap_s=0.01), 0.015)
    spec = {"ocs": {"switch": {"dist": "empirical", "quantiles_ms": [40, 44, 60]}},
            "nic": {"phy_up": {"dist": "uniform", "low_ms": 1, "high_ms": 2},
                    "cdr_lock": {"dist": "gamma", "mean_ms": 2.0, "cv": 0.5},
                    "port_active": {"dist": "lognormal", "median_ms": 1.0, "sigma": 0.1}}}
    s = switch_cost_from_profile(spec, 20_000, ports=3, seed=0)
    assert 0.040 + 0.001 < s.min() and s.max() < 0.060 + 0.020
    one = switch_cost_from_profile(spec, 20_000, ports=1, seed=0)
    assert s.mean() > one.mean()                       # the last of several ports is later
    p = root / "mixnet-testbed.yaml"
    if p.exists():
        m = switch_cost_from_profile(yaml.safe_load(p.read_text()), 4000, ports=2, seed=1)
        assert 5.0 < np.mean(m) < 7.5                   # NIC activation (~5.67 s) dominates


def test_regret_experiment_accepts_builder_positionally():
    costs, regime = regime_costs(300, 2, 3, gap=0.1, noise=0.01, seed=0)
    out = regret_experiment(costs, lambda tr: tr, [0.05], cost_scales=(1, 2), n_draws=10)
    assert len(out["table"]) == 2
