"""Claim evaluation: declared claims and validators, the scorecard and its gate, the bound, no vacuous verdicts,
the grid rule, the process pool, determinism. Mostly on hand-built timelines whose iteration time is known in
closed form: T(d) = T0 + max(0, d − W) when the reconfiguration switches ports."""
from __future__ import annotations

import json

import numpy as np
import pytest

from analysis import claims
from analysis import mixnet as mx
from analysis import moe_models as mm

FAST = dict(n_reps=4, n_boot=20)


def timeline(t0: float, window: float = 0.0, ports: int = 4) -> mx.Timeline:
    base = np.full((1, 1), t0)
    return mx.Timeline(fabric=mx.Fabric("mixnet", 100), overlap="all_hidden", fwd_base=base, bwd_base=np.zeros((1, 1)),
                       p2p_s=0.0, dp=1, trig_stage=np.array([0]), trig_dir=np.array([0]), trig_mb=np.array([0]),
                       trig_window=np.array([window]), trig_ports=np.array([ports]),
                       trig_expert_s=np.array([window]))


def scenario(ratio_at_25ms: float, cost_ratio: float, *, moves: bool = True, model: str = "mixtral-8x22b",
             link: int = 100, t_ft: float = 10.0) -> claims.Scenario:
    """T_ft = 10 s and T_mix(25 ms) = ratio · T_ft exactly (n exposed reconfigurations in one slot)."""
    extra = (ratio_at_25ms - 1) * t_ft          # seconds added by one 25 ms reconfiguration ...
    fat = mx.Timeline(fabric=mx.Fabric("fat_tree", 100), overlap="all_hidden", fwd_base=np.full((1, 1), t_ft),
                      bwd_base=np.zeros((1, 1)), p2p_s=0.0, dp=1, trig_stage=np.zeros(0, int),
                      trig_dir=np.zeros(0, int), trig_mb=np.zeros(0, int), trig_window=np.zeros(0),
                      trig_ports=np.zeros(0, int))
    # ... so scale: a 1-trigger timeline adds d; use `extra / 0.025` identical triggers in one slot
    n = max(1, round(extra / 0.025)) if moves else 1
    base = np.full((1, 1), t_ft + (extra - n * 0.025 if moves else 0.0))
    mix = mx.Timeline(fabric=mx.Fabric("mixnet", link), overlap="all_hidden", fwd_base=base,
                      bwd_base=np.zeros((1, 1)), p2p_s=0.0, dp=1, trig_stage=np.zeros(n, int),
                      trig_dir=np.zeros(n, int), trig_mb=np.zeros(n, int), trig_window=np.zeros(n),
                      trig_ports=np.full(n, 4 if moves else 0), trig_expert_s=np.zeros(n))
    return claims.Scenario(model, link, fat, mix, cost_fat_tree=cost_ratio, cost_mixnet=1.0, region_servers=8,
                           alpha=6)


def cycles(value_s: float, n_cycles: int = 6, ports: int = 4, spread: float = 0.0) -> dict:
    rng = np.random.default_rng(0)
    per_port = value_s * (1 + spread * rng.standard_normal((n_cycles, ports)))
    d = mx.CycleDelays(np.abs(per_port), np.zeros(n_cycles), "test")
    return {"ocs": d, "total": d}


def test_validators_and_claims_as_data():
    assert claims.at_most(1.05).ok(1.05) and not claims.at_most(1.05).ok(1.0501)
    assert claims.at_least(1.2).ok(1.2) and not claims.at_least(1.2).ok(1.19)
    assert claims.InRange(1.9, 2.3).ok(2.3) and not claims.InRange(1.9, 2.3).ok(2.31)
    w = claims.WithinPercent(1.058, 5)
    assert w.ok(1.058 * 1.05) and w.ok(1.058 * 0.95) and not w.ok(1.058 * 1.051) and not w.ok(1.058 * 0.949)
    time_claim, ce100, ce400 = claims.paper_claims()
    assert (time_claim.quantity, ce100.links, ce400.criterion) == ("iteration_ratio", (100,), claims.at_least(1.9))
    assert not ce100.applies_to(400) and time_claim.applies_to(400)
    # the time bound is exactly where the criterion flips
    for c in (time_claim, ce100):
        bound = c.time_bound(10.0, 1.5)
        assert c.criterion.ok(c.value(bound, 10.0, 1.5)) and not c.criterion.ok(c.value(bound * 1.001, 10.0, 1.5))
    with pytest.raises(claims.ClaimInputError):
        claims.Claim("x", "x", "cost_efficiency", claims.at_most(2.0))


def test_calibration_is_two_sided_on_ratio_and_cost_efficiency():
    cal = claims.Calibration()
    paper = claims.paper_reported_ratio("mixtral-8x22b", 100)           # 1.058
    ok = cal.check(scenario(paper, 1.4 * paper))                        # CE at 25 ms = 1.4
    assert ok["calibrated"] and ok["ratio"] == pytest.approx(paper) and ok["cost_efficiency"] == pytest.approx(1.4)
    too_cheap = cal.check(scenario(paper, 1.8 * paper))                  # CE 1.8 > 1.5: a ">=" gate would pass it
    assert not too_cheap["calibrated"] and too_cheap["ratio_ok"] and not too_cheap["ce_ok"]
    assert "cost-efficiency 1.80" in too_cheap["reason"]
    too_fast = cal.check(scenario(1.0, 1.4))                             # ratio 1.0 vs 1.058: outside ±5 %
    assert not too_fast["calibrated"] and not too_fast["ratio_ok"] and too_fast["ce_ok"]
    unknown = cal.check(scenario(1.05, 1.4, model="deepseek-moe-16b"))
    assert not unknown["calibrated"] and "reports no iteration time" in unknown["reason"]
    assert claims.Calibration(ratio_tolerance_pct=10).check(scenario(1.0, 1.4))["calibrated"]


NOT_BACKED = {"mixtral-8x22b": {"carries_verdict": False, "error": 0.04, "reason": "no better than trivial"}}
BACKED = {"mixtral-8x22b": {"carries_verdict": True, "error": 0.0, "reason": "better than trivial"}}


def test_a_model_the_scorecard_does_not_back_cannot_carry_a_verdict():
    measured = cycles(10.0)                                               # 10 s per reconfiguration: hopeless
    out = claims.evaluate_point(measured, [scenario(1.058, 1.4)], gate=NOT_BACKED, **FAST)
    cell = out["scenarios"][0]["claims"]["iteration_time_within_fat_tree"]
    assert cell["value"] > 1.05 and cell["verdict"] == "inconclusive"     # the numbers point one way; no verdict
    assert cell["reason"] == "no model verdict: no better than trivial"
    assert out["claims"]["iteration_time_within_fat_tree"]["verdict"] == "no verdict"
    backed = claims.evaluate_point(measured, [scenario(1.058, 1.4)], gate=BACKED, **FAST)
    assert backed["claims"]["iteration_time_within_fat_tree"]["verdict"] == "falsified"
    assert backed["claims"]["iteration_time_within_fat_tree"]["falsified_by"] == ["mixtral-8x22b@100G"]
    # a model the authors published nothing for is not scored, so it cannot speak either
    assert claims.evaluate_point(measured, [scenario(1.058, 1.4)], gate={}, **FAST)["claims"][
        "iteration_time_within_fat_tree"]["verdict"] == "no verdict"


def test_the_models_measured_error_widens_the_interval_so_a_thin_margin_cannot_decide():
    at_paper = cycles(claims.PAPER_DELAY_S)                  # every reconfiguration exactly 25 ms: a tight CI
    sc = [scenario(1.06, 1.4)]                              # 1.06 against 1.05: 0.01 beyond the bound
    exact = claims.evaluate_point(at_paper, sc, gate=BACKED, **FAST)
    assert exact["scenarios"][0]["claims"]["iteration_time_within_fat_tree"]["verdict"] == "falsified"
    err = {"mixtral-8x22b": {**BACKED["mixtral-8x22b"], "error": 0.02}}   # the model misses the paper by 0.02
    widened = claims.evaluate_point(at_paper, sc, gate=err, **FAST)["scenarios"][0]["claims"][
        "iteration_time_within_fat_tree"]
    assert widened["verdict"] == "inconclusive" and widened["model_error"] == 0.02
    assert widened["value_ci"][0] < 1.05 < widened["value_ci"][1]


@pytest.mark.parametrize("delay_s", [0.0, 0.001, 10.0])
def test_a_vacuous_scenario_is_not_applicable_never_holds(delay_s):
    static = scenario(1.0, 1.4, moves=False)
    assert not static.moves_circuits
    out = claims.evaluate_point(cycles(delay_s), [static], **FAST)
    row = out["scenarios"][0]
    assert row["applicable"] is False and "8-server region" in row["not_applicable_reason"]
    for claim_id, cell in row["claims"].items():
        assert cell["verdict"] == "not applicable", claim_id
        assert out["claims"][claim_id]["verdict"] == "no verdict"
    rob = claims.robustness(claims.Setup(), [claims.Assumptions()], [out])
    for c in rob["claims"]:
        assert c["verdict"] != "holds"
        assert all(v["verdict"] == "not applicable" for v in c["by_scenario"].values())


def test_real_four_server_regions_never_move_a_circuit():
    par = {"mixtral-8x7b": mm.Parallelism(ep=8, tp=4, pp=1, micro_batches=1, micro_batch_sequences=1, seq_len=512)}
    sc = claims.build_scenarios(["mixtral-8x7b"], [100], parallelism=par, seed=0)[0]
    assert sc.region_servers == 4 and not sc.moves_circuits
    assert "α = 6 OCS ports per server >= n − 1 = 3" in sc.not_applicable_reason()
    out = claims.evaluate_point(cycles(5.0), [sc], **FAST)
    assert {c["verdict"] for c in out["scenarios"][0]["claims"].values()} == {"not applicable"}


def test_verdict_rule_and_grid_aggregation():
    assert claims._verdict([1.0, 2.0], 2.5, [0.01, 0.02], 0.05) == "holds"
    assert claims._verdict([3.0, 4.0], 2.5, [0.01, 0.02], 0.05) == "falsified"
    assert claims._verdict([2.0, 3.0], 2.5, None, None) == "inconclusive"
    assert claims._verdict([3.0, 4.0], 2.5, [0.04, 0.06], 0.05) == "inconclusive"
    assert claims._aggregate([("baseline", "falsified"), ("gpu=a100-sxm", "falsified")]) == \
        ("falsified", ["baseline", "gpu=a100-sxm"])
    assert claims._aggregate([("baseline", "falsified"), ("gpu=a100-sxm", "holds")]) == \
        ("falsified if", ["baseline"])
    assert claims._aggregate([("baseline", "holds"), ("x", "holds")]) == ("holds", [])
    assert claims._aggregate([("baseline", "holds"), ("x", "inconclusive")]) == ("inconclusive", [])
    assert claims._aggregate([]) == ("inconclusive", [])


def test_robustness_falsified_only_where_every_point_with_a_model_verdict_falsifies():
    slow, fast = cycles(10.0), cycles(0.0)
    good = [scenario(1.058, 1.4 * 1.058)]
    points = [claims.evaluate_point(m, good, gate=BACKED, **FAST) for m in (slow, fast, slow)]
    points.append(claims.evaluate_point(slow, good, gate=NOT_BACKED, **FAST))   # no model verdict there
    grid = [claims.Assumptions(), claims.Assumptions(gpu="a100-sxm"), claims.Assumptions(skew=0.3),
            claims.Assumptions(mfu=0.3)]
    rob = claims.robustness(claims.Setup(), grid, points)
    time_claim = rob["claims"][0]
    assert time_claim["verdict"] == "falsified if" and time_claim["conditions"] == ["baseline", "skew=0.3"]
    assert "not at gpu=a100-sxm (holds)" in time_claim["summary"]
    assert time_claim["by_point"]["mfu=0.3"] == "no verdict"            # does not count either way
    assert time_claim["by_scenario"]["mixtral-8x22b@100G"]["verdict"] == "falsified if"
    every = claims.robustness(claims.Setup(), grid[:1] + grid[2:], points[:1] + points[2:])
    assert every["claims"][0]["verdict"] == "falsified"
    assert [r["point"] for r in rob["table"]] == ["baseline", "gpu=a100-sxm", "skew=0.3", "mfu=0.3"]


def test_assumption_grid_designs():
    base = claims.Assumptions()
    oat = claims.assumption_grid({"gpu": ["h100-sxm", "a100-sxm"], "skew": [0.3, 0.5, 0.8]}, base)
    assert [p.label(base) for p in oat] == ["baseline", "gpu=a100-sxm", "skew=0.3", "skew=0.8"]
    full = claims.assumption_grid({"gpu": ["h100-sxm", "a100-sxm"], "skew": [0.3, 0.5]}, base, "full")
    assert len(full) == 4 and full[0] == base
    assert len(claims.assumption_grid(None, base)) == 1 + 1 + 2 + 2 + 1 + 1 + 1
    assert {p.greedy for p in claims.assumption_grid(None, base)} == {"simulator", "paper"}
    with pytest.raises(claims.ClaimInputError):
        claims.assumption_grid({"colour": ["red"]}, base)


SMALL = (("mixtral-8x22b", mm.Parallelism(ep=8, tp=8, pp=1, micro_batches=1, micro_batch_sequences=1,
                                          seq_len=256)),)


def test_grid_on_a_process_pool_is_identical_to_serial():
    setup = claims.Setup(models=("mixtral-8x22b",), links=(400,), parallelism=SMALL, n_reps=2, n_boot=4, seed=3)
    grid = claims.assumption_grid({"greedy": ["simulator", "paper"]}, claims.Assumptions())
    measured = cycles(0.05, spread=0.1)
    serial = claims.evaluate_claims(measured, setup=setup, grid=grid, max_workers=1)
    pooled = claims.evaluate_claims(measured, setup=setup, grid=grid, max_workers=2)
    assert json.dumps(serial, sort_keys=True) == json.dumps(pooled, sort_keys=True)
    assert json.loads(json.dumps(serial, allow_nan=False)) == serial
    again = claims.evaluate_claims(measured, setup=setup, grid=grid)
    assert again == serial
    other = claims.evaluate_claims(measured, setup=claims.Setup(**{**setup.__dict__, "seed": 4}), grid=grid)
    row = lambda v: v["baseline"]["scenarios"][0]["t_mixnet_s"]["total"]["mean"]  # noqa: E731
    assert row(other) != row(serial)


def test_cluster_bootstrap_resamples_whole_cycles():
    # two cycles: every port 1 s or every port 3 s; a replicate of whole cycles has mean delay 1, 2 or 3 s
    # exactly; resampling ports independently would give other values
    d = mx.CycleDelays(np.array([[1.0] * 4, [3.0] * 4]), np.zeros(2))
    out = claims.bootstrap_mixnet(timeline(0.0, ports=2), d, np.random.default_rng(0), n_reps=400, n_boot=40)
    lo, hi = out["delay_ci_s"]
    assert 1.0 <= lo and hi <= 3.0 and out["t_ci_s"][0] >= 1.0


def test_timelines_bootstrapped_together_get_the_numbers_each_gets_alone():
    # one iteration's reconfigurations under other windows and compute: the draws are made once for all of them,
    # each timeline's intervals are those of its own bootstrap from the same stream; other ports are refused
    rng = np.random.default_rng(2)
    d = mx.CycleDelays(rng.gamma(2.0, 0.01, (7, 3)), np.full(7, 0.001), "test")
    tls = [timeline(1.0, 0.0, ports=5), timeline(1.3, 0.012, ports=5), timeline(0.7, 0.03, ports=5)]
    together = claims.bootstrap_many(tls, d, np.random.default_rng(9), n_reps=6, n_boot=30)
    alone = [claims.bootstrap_mixnet(t, d, np.random.default_rng(9), n_reps=6, n_boot=30) for t in tls]
    assert together == alone and len({r["t_mean_s"] for r in alone}) == 3
    with pytest.raises(mx.MixnetInputError):
        claims.bootstrap_many([tls[0], timeline(1.0, ports=4)], d, np.random.default_rng(9), n_reps=6, n_boot=30)


def test_workers_return_every_task_in_order_wherever_it_ran():
    import math as m

    workers = claims.Workers(2)
    try:
        assert workers.map(m.factorial, range(9)) == [m.factorial(i) for i in range(9)]
        assert workers.map(m.isqrt, [49, 50]) == [7, 7]       # the pool serves a second map
    finally:
        workers.close()
    assert claims.Workers(1).map(m.factorial, [3]) == [6]


def test_bad_measured_input():
    with pytest.raises(claims.ClaimInputError):
        claims.as_cycle_delays({"ocs": [0.1]})
    with pytest.raises(claims.ClaimInputError):
        claims.as_cycle_delays({"ocs": [-1.0], "total": [1.0]})
    with pytest.raises(claims.ClaimInputError):
        claims.evaluate_point(cycles(0.1), [scenario(1.0, 1.4)], verdict_delay="nic")
    m = claims.as_cycle_delays({"ocs": [[0.1, 0.2], [0.3, np.nan]], "total": [0.5, 0.6]})
    assert m["ocs"].bench_ports == 2 and m["total"].n_cycles == 2


def test_a_scenario_vacuous_at_baseline_stays_not_applicable_where_no_point_carries_a_verdict():
    slow = cycles(10.0)
    static = claims.evaluate_point(slow, [scenario(1.0, 1.4, moves=False)], gate=BACKED, **FAST)
    moving_unbacked = claims.evaluate_point(slow, [scenario(1.0, 1.4)], gate=NOT_BACKED, **FAST)
    moving_backed = claims.evaluate_point(slow, [scenario(1.058, 1.4 * 1.058)], gate=BACKED, **FAST)
    grid = [claims.Assumptions(), claims.Assumptions(alpha=4)]
    rob = claims.robustness(claims.Setup(), grid, [static, moving_unbacked])
    cell = rob["claims"][0]["by_scenario"]["mixtral-8x22b@100G"]
    assert cell["verdict"] == "not applicable" and "circuits move only at alpha=4: no model verdict" in cell["short"]
    assert rob["claims"][0]["verdict"] == "inconclusive"
    rob = claims.robustness(claims.Setup(), grid, [static, moving_backed])
    assert rob["claims"][0]["by_scenario"]["mixtral-8x22b@100G"]["verdict"] == "falsified"
    assert rob["claims"][0]["verdict"] == "falsified" and rob["claims"][0]["conditions"] == ["alpha=4"]


def test_the_step_refuses_a_bad_grid_before_it_runs():
    """The declared parameters refuse what a file can get wrong (at load, at its line); _setup what only the
    models can tell (9 of 8 NICs on the OCS)."""
    from pydantic import ValidationError

    from harness.steps import mixnet as step

    params = step.MixnetParams().model_dump()
    setup, grid = step._setup(params, 1)
    assert len(grid) == 9 and setup.cost_basis == "paper" and setup.calibration.ratio_tolerance_pct == 5.0
    for bad in ({"grid": {"gpu": ["x100"]}}, {"grid": {"overlap": ["none"]}}, {"baseline": {"colour": "red"}},
                {"design": "latin"}, {"models": ["gpt-5"]}, {"grid": {"mfu": [0]}}, {"grid": {"skew": []}}):
        with pytest.raises(ValidationError):
            step.MixnetParams.model_validate(bad)
    with pytest.raises(ValueError, match="alpha"):
        step._setup({**params, "grid": {**params["grid"], "alpha": [9]}}, 1)


# ---------------------------------------------------------------------------------------------- scorecard

def test_the_scorecard_is_computed_from_the_published_record_and_gates_on_held_out_points():
    paper = claims.paper_times()
    assert len(claims.record_quantities(paper)) == 16 + 12 + 16      # T_mix/T_ft, fat-tree scaling, rail/fat-tree
    # a "model" that is the authors' own data: no error anywhere, and it carries a verdict for every model
    perfect = claims.scorecard({k: {f: 7.0 * v for f, v in t.items()} for k, t in paper.items()})
    assert all(r["mae_model"] == pytest.approx(0.0) for r in perfect["summary"])
    assert all(g["carries_verdict"] and g["error"] == pytest.approx(0.0) for g in perfect["per_model"].values())
    assert {p["split"] for p in perfect["points"] if p["link_gbps"] in claims.HELD_OUT_LINKS} == {"held-out"}
    # the trivial predictor itself ties with the trivial predictor: it never carries a verdict
    trivial = claims.scorecard({k: {f: 1.0 for f in t} for k, t in paper.items()})
    assert not any(g["carries_verdict"] for g in trivial["per_model"].values())
    # the gate reads the held-out points only: spoiling the train links' MixNet times changes the MAE there and
    # the carried error, never who carries a verdict; spoiling a held-out link does
    spoil = lambda links: {(m, lk): {**t, "mixnet": t["mixnet"] * (3.0 if lk in links else 1.0)}  # noqa: E731
                           for (m, lk), t in paper.items()}
    train_spoiled = claims.scorecard(spoil(claims.TRAIN_LINKS))
    assert all(g["carries_verdict"] and g["error"] > 1 for g in train_spoiled["per_model"].values())
    assert not any(g["carries_verdict"] for g in claims.scorecard(spoil((200,)))["per_model"].values())
    row = next(r for r in train_spoiled["summary"] if r["quantity"] == "mixnet_over_fat_tree" and r["split"] == "train")
    assert row["mae_model"] > row["mae_trivial"] and row["n"] == 8


def test_the_rail_share_is_fitted_on_the_train_links_only():
    truth = {(m, lk): claims.paper_reported_ratio(m, lk, "rail_optimized") for m in claims.PAPER_MODELS
             for lk in claims.PAPER_LINKS}
    # share 0.5 reproduces the train links exactly, share 0.3 the held-out ones: the fit must take 0.5
    curves = {(m, lk, sh): truth[m, lk] + (0.0 if (sh == 0.5) == (lk in claims.TRAIN_LINKS) else 0.3)
              for (m, lk) in truth for sh in (0.3, 0.5)}
    assert claims.fit_rail_share(curves) == 0.5
    assert claims.RAIL_SPINE_SHARE in claims.RAIL_SHARE_GRID


def _record_timelines(c: float, k: float, g_dedicated: float, window: float) -> dict:
    """One hand-built model per link: compute c, transfers k/link on the fat-tree, k·g/link on MixNet (g = 1 hybrid,
    g_dedicated dedicated), one reconfiguration hidden behind `window` of compute."""
    def tl(kind: str, comm: float, trig: bool) -> mx.Timeline:
        n = 1 if trig else 0
        return mx.Timeline(fabric=mx.Fabric(kind, 100), overlap="all_hidden", fwd_base=np.full((1, 1), c + comm),
                           bwd_base=np.zeros((1, 1)), p2p_s=0.0, dp=1, trig_stage=np.zeros(n, int),
                           trig_dir=np.zeros(n, int), trig_mb=np.zeros(n, int), trig_window=np.full(n, window),
                           trig_ports=np.full(n, 4), trig_expert_s=np.full(n, window),
                           fwd_comm=np.full((1, 1), comm), bwd_comm=np.zeros((1, 1)))
    return {link: {"fat_tree": tl("fat_tree", k / link, False), "mixnet": tl("mixnet", k / link, True),
                   "dedicated": tl("mixnet", g_dedicated * k / link, True),
                   "rail_optimized": tl("rail_optimized", 1.1 * k / link, False)} for link in claims.PAPER_LINKS}


def test_the_record_fit_recovers_known_parameters_from_the_train_links_and_never_reads_the_others():
    """Oracle: a record made by the model itself at known β, κ, τ; the fit must find them from 100/400 Gb/s, and
    spoiling 200/800 Gb/s must change nothing."""
    tls = {"a": _record_timelines(0.05, 2.0, 1.5, 0.001), "b": _record_timelines(0.02, 6.0, 1.3, 0.002)}
    truth = claims.RecordFit(blend=0.4, scales=(("a", 2.0, 3.0), ("b", 0.5, 1.7)))
    record = claims.fitted_times(tls, truth)
    fitted = claims.fit_record(tls, tau_max=25.0, blends=(0.0, 0.4, 1.0), paper=record)["fit"]
    assert fitted.blend == 0.4
    for (name, k, t), (_, k0, t0) in zip(fitted.scales, truth.scales):
        assert k == pytest.approx(k0, rel=1e-6) and t == pytest.approx(t0, rel=1e-3)
    spoiled = {(m, lk): {f: v * (0.5 if lk in claims.HELD_OUT_LINKS and f == "mixnet" else 1.0)
                         for f, v in t.items()} for (m, lk), t in record.items()}
    assert claims.fit_record(tls, tau_max=25.0, blends=(0.0, 0.4, 1.0), paper=spoiled)["fit"] == fitted
    card = claims.scorecard(claims.fitted_times(tls, fitted), paper=spoiled)
    assert not any(g["carries_verdict"] for g in card["per_model"].values())   # judged on what it never saw
    # the cap binds: the model may not run its compute slower than the bound's declared MFU
    capped = claims.fit_record(tls, tau_max=2.0, blends=(0.4,), paper=record)["fit"]
    assert capped.of("a")[0] <= 2.0 + 1e-9
    assert claims.time_scale_max(mm.GPUS["h100-sxm"], claims.BoundAssumptions()) == pytest.approx(
        989e12 * 0.4 / (312e12 * 0.05))


# ---------------------------------------------------------------------------------------------- the bound

def test_the_bound_and_its_flip_points_are_where_it_meets_the_claim():
    a = claims.BoundAssumptions(k=2, window_s=0.01, mfu=0.05, gpu="a100-sxm")
    t_max = claims.t_fat_tree_max("mixtral-8x22b", a)
    par = mm.DEFAULT_PARALLELISM["mixtral-8x22b"]
    assert t_max == pytest.approx(mm.iteration_flops(mm.get_model("mixtral-8x22b"), par) /
                                  (mm.gpus(par) * mm.GPUS["a100-sxm"].peak_flops * 0.05))
    r25, d = 1.01, 3.0
    b = claims.bound_ratio(r25, d, t_max, a)
    assert b == pytest.approx(r25 + 2 * (3.0 - 0.025 - 0.01) / t_max)
    assert claims.bound_ratio(r25, 0.02, t_max, a) is None          # below 25 ms a faster switch may beat r25
    flips = claims.bound_flips(r25, d, t_max, a, 1.05)
    # each flip value, put back alone, brings the bound exactly to the threshold
    from dataclasses import replace
    assert claims.bound_ratio(r25, d, t_max, replace(a, k=flips["k"])) == pytest.approx(1.05)
    assert claims.bound_ratio(r25, d, t_max, replace(a, window_s=flips["window_s"])) == pytest.approx(1.05)
    assert claims.bound_ratio(r25, flips["delay_s"], t_max, a) == pytest.approx(1.05)
    t_at_mfu = claims.t_fat_tree_max("mixtral-8x22b", replace(a, mfu=flips["mfu"]))
    assert claims.bound_ratio(r25, d, t_at_mfu, a) == pytest.approx(1.05)
    assert claims.bound_flips(1.06, d, t_max, a, 1.05)["already_beyond"]


def test_the_bound_finding_and_the_seed_test_use_the_authors_own_ratios():
    a = claims.BoundAssumptions()
    time_claim, ce100, ce400 = claims.paper_claims()
    out = claims.bound_finding(claims.paper_claims(), ["mixtral-8x7b", "deepseek-moe-16b"], [100, 400], 6.0, a)
    assert [r["scenario"] for r in out["rows"]] == ["mixtral-8x7b@100G", "mixtral-8x7b@400G"]  # DeepSeek: no r25
    for r in out["rows"]:
        assert r["r25"] == claims.paper_reported_ratio("mixtral-8x7b", r["link_gbps"])
        cell = r["claims"][time_claim.id]
        assert cell["falsified"] == (r["bound_ratio"] > 1.05)
        ce = r["claims"][(ce100 if r["link_gbps"] == 100 else ce400).id]
        assert ce["value"] == pytest.approx(r["cost_ratio"] / r["bound_ratio"])
    silent = claims.bound_finding(claims.paper_claims(), ["mixtral-8x7b"], [400], 0.005, a)
    assert silent["claims"][time_claim.id]["verdict"] == "not shown by the bound"
    rows = claims.seed_test(claims.paper_claims(), [], a, {})
    assert len(rows) == len(claims.PAPER_MODELS) * 2 * 4
    assert {(r["nic_s"], r["ocs_s"]) for r in rows} == {(5.67, 0.041), (5.67, 0.068), (6.33, 0.041), (6.33, 0.068)}
    for r in rows:
        rail = claims.paper_reported_ratio(r["model"], r["link_gbps"], "rail_optimized")
        assert r["bound_vs_rail"] == pytest.approx(r["bound_vs_fat_tree"] / rail)
        assert r["model_vs_fat_tree"] is None                           # no baseline rows given: no model numbers


def test_small_samples_widen_the_bootstrap_tail_and_large_ones_do_not():
    tails = [claims.expanded_tail(0.95, n) for n in (5, 10, 20, 80, 10**6)]
    assert tails == sorted(tails) and tails[1] < 0.01 < tails[2] < 0.025      # 10 cycles: 0.86 % per tail
    assert tails[-1] == pytest.approx(0.025, abs=1e-4)
    assert claims.expanded_tail(0.95, 1) == pytest.approx(0.025)


@pytest.mark.slow
def test_the_declared_rail_share_is_the_fit_on_the_train_links():
    """≈ 5 s: the model's rail/fat-tree ratios on 100/400 Gb/s for every share of the grid, fitted again."""
    assert claims.fit_rail_share(claims.rail_curves()) == claims.RAIL_SPINE_SHARE
