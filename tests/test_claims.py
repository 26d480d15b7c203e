"""Claim evaluation: output contract, determinism, verdicts decided by the numbers."""
from __future__ import annotations

import json

import numpy as np
import pytest

from analysis import claims
from analysis import mixnet as mx
from analysis import moe_models as mm

PAR = {
    "mixtral-8x7b": mm.Parallelism(ep=8, tp=4, pp=2, micro_batches=2, micro_batch_sequences=1, seq_len=2048),
    "deepseek-moe-16b": mm.Parallelism(ep=16, tp=2, pp=2, micro_batches=2, micro_batch_sequences=1,
                                       seq_len=2048),
}
FAST = dict(n_reps=8, n_boot=20)


# the released simulator's harsher choices, so that every trigger switches ports and delays matter
HARSH = dict(overlap="simulator", reconfigure="always")


@pytest.fixture(scope="module")
def scenarios():
    return claims.build_scenarios(models=list(PAR), parallelism=PAR, seed=0, **HARSH)


@pytest.fixture(scope="module")
def measured():
    rng = np.random.default_rng(11)
    ocs = rng.lognormal(np.log(0.043), 0.17, 120)
    return {"ocs": ocs, "total": ocs + rng.lognormal(np.log(5.6), 0.05, 120)}


def test_contract_json_and_determinism(scenarios, measured):
    a = claims.evaluate_claims(measured, scenarios=scenarios, seed=5, **FAST)
    b = claims.evaluate_claims(measured, scenarios=scenarios, seed=5, **FAST)
    assert json.dumps(a, sort_keys=True) == json.dumps(b, sort_keys=True)
    assert json.loads(json.dumps(a, allow_nan=False)) == a
    assert [c["id"] for c in a["claims"]] == ["iteration_time_within_fat_tree", "cost_efficiency_100g",
                                               "cost_efficiency_400g"]
    for c in a["claims"]:
        assert set(c) == {"id", "statement", "criterion", "verdict", "evidence"}
        assert c["verdict"] in {"holds", "falsified", "inconclusive"}
        for row in c["evidence"]["scenarios"]:       # only a calibrated model may falsify
            cal = row["calibration"]
            assert row["verdict"] != "falsified" or (cal["reproduced"] and cal["reproduced_as_built"])
            assert cal["reproduced_as_built"] == (row["verdict_by_delay"]["paper_25ms"] == "holds")
    for kind in ("ocs", "total"):
        m = a["measured"][f"{kind}_ms"]
        assert m["n"] == 120 and m["mean"] == pytest.approx(measured[kind].mean() * 1e3)
        assert m["p50"] == pytest.approx(np.median(measured[kind]) * 1e3)
    assert set(a["break_even_ms"]) == set(PAR)
    other = claims.evaluate_claims(measured, scenarios=scenarios, seed=6, **FAST)
    first = a["claims"][0]["evidence"]["scenarios"][0]["t_mixnet_ocs_s"]["mean"]
    assert other["claims"][0]["evidence"]["scenarios"][0]["t_mixnet_ocs_s"]["mean"] != first


def test_scenarios_are_reproducible_from_the_seed(scenarios):
    again = claims.build_scenarios(models=list(PAR), parallelism=PAR, seed=0, **HARSH)
    other = claims.build_scenarios(models=["mixtral-8x7b"], links=[100], parallelism=PAR, seed=1, **HARSH)
    for a, b in zip(scenarios, again):
        assert np.array_equal(a.mixnet.fwd_base, b.mixnet.fwd_base)
        assert np.array_equal(a.mixnet.trig_window, b.mixnet.trig_window)
        assert a.cost_mixnet == b.cost_mixnet and a.t_fat_tree == b.t_fat_tree
    assert not np.array_equal(other[0].mixnet.fwd_base, scenarios[0].mixnet.fwd_base)
    for sc in scenarios:   # rail-optimized is never faster than the non-blocking fat-tree
        assert sc.rail_optimized.times(np.zeros((1, 0)))[0] >= sc.t_fat_tree * (1 - 1e-12)


def test_zero_delay_verdicts_follow_the_zero_delay_timeline(scenarios):
    out = claims.evaluate_claims({"ocs": np.zeros(10), "total": np.zeros(10)}, scenarios=scenarios, **FAST)
    rows = out["claims"][0]["evidence"]["scenarios"]
    for sc, row in zip(scenarios, rows):
        t0 = mx.constant_delay_times(sc.mixnet, [0.0])[0]
        assert row["t_mixnet_total_s"]["mean"] == pytest.approx(t0)
        assert row["verdict"] == ("holds" if t0 <= 1.05 * sc.t_fat_tree else "falsified")
        ce = sc.t_fat_tree * sc.cost_fat_tree / (t0 * sc.cost_mixnet)
        assert row["cost_efficiency"]["zero_delay"] == pytest.approx(ce)


def _rejects_paper_at_25ms(sc, threshold) -> bool:
    return mx.constant_delay_times(sc.mixnet.with_overlap("all_hidden"), [0.025])[0] > threshold


def test_uncalibrated_scenarios_are_inconclusive_not_falsified(scenarios):
    # these small micro-batches (2048 tokens per EP rank) hide < 1 ms of a 25 ms reconfiguration
    assert all(_rejects_paper_at_25ms(sc, 1.05 * sc.t_fat_tree) for sc in scenarios)
    out = claims.evaluate_claims({"ocs": np.full(5, 10.0), "total": np.full(5, 12.0)}, scenarios=scenarios,
                                 **FAST)
    time_claim = out["claims"][0]
    assert time_claim["verdict"] == "inconclusive"
    assert time_claim["evidence"]["calibration_reason"] == claims.NOT_CALIBRATED
    for row in time_claim["evidence"]["scenarios"]:
        assert row["calibration"]["reproduced"] is False
        assert row["verdict_uncalibrated"] == "falsified"       # what the numbers alone would say
        assert row["verdict"] == "inconclusive" and row["verdict_reason"] == claims.NOT_CALIBRATED
        assert row["verdict_by_delay"]["total"] == "inconclusive"
    cal = out["calibration"]
    assert cal["reproduces_paper_at_25ms"] is False and cal["scenarios_reproduced"] == 0
    assert cal["of"] == len(scenarios) and cal["overlap"] == "all_hidden" and cal["delay_ms"] == 25.0
    for c in out["claims"][1:]:                # cost-efficiency claims follow the same rule
        assert c["verdict"] != "falsified"
        for row in c["evidence"]["scenarios"]:
            t25 = mx.constant_delay_times(
                next(sc for sc in scenarios if (sc.model, sc.link_gbps) == (row["model"], row["link_gbps"]))
                .mixnet.with_overlap("all_hidden"), [0.025])[0]
            assert row["calibration"]["reproduced"] == (t25 <= row["threshold_s"])
            if not row["calibration"]["reproduced"]:
                assert row["verdict"] != "falsified"


# a layout whose expert compute per (layer, micro-batch) exceeds 25 ms: the paper's claim holds at 25 ms
BIG_WINDOW = {"mixtral-8x7b": mm.Parallelism(ep=8, tp=4, pp=1, micro_batches=2, micro_batch_sequences=16,
                                             seq_len=4096)}


@pytest.fixture(scope="module")
def calibrated():
    return claims.build_scenarios(models=list(BIG_WINDOW), parallelism=BIG_WINDOW, seed=0, reconfigure="always")


def test_calibrated_scenario_is_falsified_by_large_delays(calibrated):
    for sc in calibrated:
        assert sc.mixnet.trig_window.min() > 0.025          # precondition: every reconfiguration hides 25 ms
        # so T(25 ms) = T(0): the model reproduces the paper exactly when MixNet matches at zero delay
        assert mx.constant_delay_times(sc.mixnet, [0.025])[0] == pytest.approx(
            mx.constant_delay_times(sc.mixnet, [0.0])[0], rel=1e-12)
    out = claims.evaluate_claims({"ocs": np.full(5, 10.0), "total": np.full(5, 12.0)}, scenarios=calibrated,
                                 **FAST)
    assert out["calibration"]["reproduces_paper_at_25ms"] is True
    assert out["calibration"]["scenarios_reproduced"] == out["calibration"]["of"] == len(calibrated)
    assert [c["verdict"] for c in out["claims"]] == ["falsified"] * 3
    for c in out["claims"]:
        assert "calibration_reason" not in c["evidence"]
        assert all(r["verdict_reason"] is None for r in c["evidence"]["scenarios"])


def test_calibration_uses_the_paper_overlap_whatever_the_scenario_overlap():
    harsh = claims.build_scenarios(models=list(BIG_WINDOW), parallelism=BIG_WINDOW, seed=0, **HARSH)
    out = claims.evaluate_claims({"ocs": np.full(5, 10.0), "total": np.full(5, 12.0)}, scenarios=harsh, **FAST)
    assert out["calibration"]["reproduces_paper_at_25ms"] is True      # paper's overlap hides the 25 ms
    assert out["calibration"]["scenarios_reproduced_as_built"] == 0
    rows = out["claims"][0]["evidence"]["scenarios"]
    assert all(r["verdict_by_delay"]["paper_25ms"] == "falsified" for r in rows)   # the simulator's does not
    # so the verdict timeline itself misses the paper at 25 ms: its falsification is withheld
    assert all(r["verdict_uncalibrated"] == "falsified" and r["verdict"] == "inconclusive" for r in rows)
    assert out["claims"][0]["verdict"] == "inconclusive"
    sim = claims.evaluate_claims({"ocs": np.full(5, 10.0), "total": np.full(5, 12.0)}, scenarios=harsh,
                                 calibration_overlap="simulator", **FAST)
    assert sim["calibration"]["scenarios_reproduced"] == 0 and sim["claims"][0]["verdict"] == "inconclusive"
    with pytest.raises(claims.ClaimInputError):
        claims.evaluate_claims({"ocs": [0.1], "total": [0.1]}, scenarios=harsh, calibration_overlap="x", **FAST)


def test_delay_table_matches_the_timelines(scenarios):
    rows = claims.delay_table(scenarios, (0.0, 0.025, 5.7), overlap="all_hidden")
    assert json.loads(json.dumps(rows, allow_nan=False)) == rows
    for sc, row in zip(scenarios, rows):
        mix = sc.mixnet.with_overlap("all_hidden")
        assert row["t_mixnet_s"] == pytest.approx(list(mx.constant_delay_times(mix, [0.0, 0.025, 5.7])))
        assert row["t_fat_tree_s"] == sc.t_fat_tree and row["overlap"] == "all_hidden"
        d_star = row["break_even_ms"]
        if d_star is not None:
            assert mx.constant_delay_times(mix, [d_star / 1e3])[0] == pytest.approx(1.05 * sc.t_fat_tree, rel=1e-6)


def test_delay_interval_straddling_the_critical_delay_is_inconclusive(scenarios):
    sc = scenarios[0]
    threshold = 1.05 * sc.t_fat_tree
    d_c = mx.break_even_delay(sc.mixnet, threshold)
    assert d_c is not None and 0 < d_c < np.inf
    z = np.random.default_rng(0).standard_normal(100)
    samples = d_c * (1 + 0.05 * np.concatenate([z, -z]))          # sample mean exactly d_c
    out = claims.evaluate_claims({"ocs": samples, "total": samples}, scenarios=[sc], per_port_max=False,
                                 n_reps=8, n_boot=50)
    row = out["claims"][0]["evidence"]["scenarios"][0]
    lo, hi = row["delay_per_reconfiguration_total_ms"]["ci"]
    assert lo <= d_c * 1e3 <= hi
    assert row["critical_delay_ms"] == pytest.approx(d_c * 1e3)
    assert out["claims"][0]["verdict"] == "inconclusive"


def test_verdict_rule():
    assert claims._verdict([1.0, 2.0], 2.5, [0.01, 0.02], 0.05) == "holds"
    assert claims._verdict([3.0, 4.0], 2.5, [0.01, 0.02], 0.05) == "falsified"
    assert claims._verdict([2.0, 3.0], 2.5, None, None) == "inconclusive"
    assert claims._verdict([3.0, 4.0], 2.5, [0.04, 0.06], 0.05) == "inconclusive"
    assert claims._combine(["holds", "inconclusive"]) == "inconclusive"
    assert claims._combine(["holds", "falsified", "inconclusive"]) == "falsified"
    assert claims._combine(["holds", "holds"]) == "holds"


def test_break_even_and_plot_series(scenarios, measured):
    out = claims.evaluate_claims(measured, scenarios=scenarios, **FAST)
    for sc in scenarios:
        d_star = out["break_even_ms_by_link"][sc.model][str(sc.link_gbps)]
        assert d_star is not None      # these small layouts are within 5 % at zero delay
        t = mx.constant_delay_times(sc.mixnet, [d_star / 1e3])[0]
        assert t == pytest.approx(1.05 * sc.t_fat_tree, rel=1e-6)
        strict = out["break_even_ms_strict_by_link"][sc.model][str(sc.link_gbps)]
        t0 = mx.constant_delay_times(sc.mixnet, [0.0])[0]
        if t0 > sc.t_fat_tree:
            assert strict is None
        else:
            assert mx.constant_delay_times(sc.mixnet, [strict / 1e3])[0] == pytest.approx(sc.t_fat_tree, rel=1e-6)
    for model, by_link in out["break_even_ms_by_link"].items():
        values = list(by_link.values())
        assert out["break_even_ms"][model] == (None if None in values else min(values))
    for p in out["plot"]:
        assert len(p["delay_ms"]) == len(p["t_mixnet_s"]) and p["delay_ms"] == sorted(p["delay_ms"])
        assert np.all(np.diff(p["t_mixnet_s"]) >= -1e-12)
        assert 25.0 in p["delay_ms"] and p["markers"]["ocs_mean_ms"] in p["delay_ms"]
        assert p["delay_ms"][-1] >= p["markers"]["total_mean_ms"]


def test_per_link_measurements_and_bad_input(scenarios, measured):
    per_link = {100: measured, "400": {"ocs": measured["ocs"] * 2, "total": measured["total"]}}
    out = claims.evaluate_claims(per_link, scenarios=scenarios, **FAST)
    assert out["measured"]["ocs_ms"]["n"] == 240
    with pytest.raises(claims.ClaimInputError):
        claims.evaluate_claims({"ocs": measured["ocs"]}, scenarios=scenarios, **FAST)
    with pytest.raises(claims.ClaimInputError):
        claims.evaluate_claims({"ocs": [-1.0], "total": [1.0]}, scenarios=scenarios, **FAST)
    with pytest.raises(claims.ClaimInputError):
        claims.evaluate_claims({"ocs": [], "total": [1.0]}, scenarios=scenarios, **FAST)
    with pytest.raises(claims.ClaimInputError):
        claims.evaluate_claims(measured, scenarios=scenarios, verdict_delay="nic", **FAST)
