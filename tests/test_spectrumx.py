"""The Spectrum-X verdict on synthetic link studies, and both studies end to end on the emulated bench."""
import json

import numpy as np
import pandas as pd
import pytest
import yaml

from harness.cli import main
from harness.steps.spectrumx import compute_verdict, latency_claim, line_rate_claim, reaction_claim

PARAMS = {"line_rate_fraction": 0.98, "latency_inflation": 1.07, "at_failed_pct": 10.0, "reaction_bound_ms": 0.0,
          "n_boot": 500, "emulator_lateness_tolerance": 0.05}


def _frame(fraction: float, inflation: float, n: int = 60, links: int = 10, seed: int = 0) -> pd.DataFrame:
    rng = np.random.default_rng(seed)
    rows = []
    for pct, failed, scale in ((0.0, 0, 1.0), (10.0, 1, inflation)):
        t = 0.01 * scale * rng.lognormal(0, 0.01, n)
        rows.append(pd.DataFrame({"fail_pct": pct, "failed_links": failed, "links": links, "max_rank_bytes": 1e8,
                                  "measured_s": t, "modelled_intact_s": 0.01 * fraction, "line_s": 0.01 * fraction, "round": 0,
                                  "iteration": np.arange(n)}))
    return pd.concat(rows, ignore_index=True)



def _run_ok(tmp_path, playbook: dict):
    """Run `playbook` on its bench; it must end ok. The run directory."""
    path = tmp_path / "pb.yaml"
    path.write_text(yaml.safe_dump(playbook))
    run = tmp_path / "run"
    assert main(["run", str(path), "--out", str(run), "-q"]) == 0
    return run

def test_claims_hold_fail_and_straddle_by_their_intervals():
    rng = np.random.default_rng(1)
    assert line_rate_claim(_frame(0.99, 1.0), 0.98, rng, 500)["verdict"] == "holds"
    assert line_rate_claim(_frame(0.90, 1.0), 0.98, rng, 500)["verdict"] == "falsified"
    c = latency_claim(_frame(0.99, 1.02, n=500), 1.07, 10.0)
    assert c["verdict"] == "holds" and c["p50"]["value"] == pytest.approx(1.02, abs=0.01)
    assert latency_claim(_frame(0.99, 1.20), 1.07, 10.0)["verdict"] == "falsified"
    # a 10 % claim judged at 25 % realised: a violation there does not falsify the 10 % claim
    c = latency_claim(_frame(0.99, 1.20, links=4), 1.07, 10.0)
    assert c["verdict"] == "inconclusive" and c["realised_failed_fraction"] == 0.25 and "note" in c
    assert latency_claim(_frame(0.99, 1.0)[lambda f: f.fail_pct == 0], 1.07, 10.0)["verdict"] \
        == "not applicable"


def test_a_late_emulator_judges_nothing():
    emulated = {"emulated": True, "detection": None, "data_plane": "emulated"}
    v = compute_verdict(_frame(0.90, 1.20), [], PARAMS, 0, emulated)  # the tools 11 % slower than the model
    assert not v["emulator_calibration"]["calibrated"]
    assert [c["verdict"] for c in v["claims"]] == ["inconclusive", "inconclusive", "not applicable"]
    assert "not calibrated" in v["claims"][0]["reason"]
    v = compute_verdict(_frame(0.99, 1.20), [], PARAMS, 0, emulated)
    assert v["emulator_calibration"]["calibrated"]
    assert [c["verdict"] for c in v["claims"]][:2] == ["holds", "falsified"]
    v = compute_verdict(_frame(0.90, 1.20), [], PARAMS, 0, {"emulated": False})  # a real bench: judged as is
    assert v["emulator_calibration"] is None and v["claims"][0]["verdict"] == "falsified"


def test_reaction_needs_a_bound_and_uses_both_ends():
    flaps = [{"reaction_low_ms": 2.0, "reaction_high_ms": 5.0}, {"reaction_low_ms": 3.0, "reaction_high_ms": 8.0}]
    assert reaction_claim([], 10)["verdict"] == "not applicable"
    assert reaction_claim(flaps, 0)["verdict"] == "inconclusive"
    assert reaction_claim(flaps, 10)["verdict"] == "holds"
    assert reaction_claim(flaps, 6)["verdict"] == "inconclusive"
    assert reaction_claim(flaps, 1)["verdict"] == "falsified"
    never = [{"reaction_low_ms": 2.0, "reaction_high_ms": None}]
    assert reaction_claim(never, 10)["verdict"] == "inconclusive"
    v = compute_verdict(None, flaps, PARAMS, 0, {"detection": {"ms": 1.0, "source": "assumed"}})
    assert [c["verdict"] for c in v["claims"]] == ["not applicable", "not applicable", "inconclusive"]
    json.dumps(v, allow_nan=False)


def test_link_failures_and_flaps_on_the_emulated_bench(tmp_path):
    small = {"trace": "generate", "iterations": 2, "layers": 1, "regime_changes": 0, "tokens_per_micro_batch": 1024,
             "hidden_size": 1024, "max_phases": 2}
    playbook = {"name": "lf", "bench": "emulated:burst-mode", "seed": 5, "cycles": 1, "steps": [
        {"type": "link_failures", "name": "failures", "pull": "circuits", "fail_pct": [0, 10, 50], **small},
        {"type": "link_flaps", "name": "flaps", "pull": "circuits", "fail_pct": [25], "down_ms": 30, "flaps": 1, "ops_before": 2,
         "lead_ms": 20, "tail_ms": 30, "sample_us": 500, **small, "tokens_per_micro_batch": 8192,
         "hidden_size": 4096},  # ~5 ms transfers: a few dozen in the long one
        {"type": "spectrumx_verdict", "name": "verdict", "reaction_bound_ms": 60000, "n_boot": 200}]}
    run = _run_ok(tmp_path, playbook)
    failures = json.loads((run / "linkfail_failures.json").read_text())
    table = failures["table"]
    links = table[0]["links"]
    assert links >= 2 and [r["failed_links"] for r in table] == [0, 1, int(np.ceil(0.5 * links))]
    assert table[0]["p50_inflation"] == 1.0 and table[0]["proportionality"] == 1.0
    frame = pd.read_parquet(run / failures["parquet"])
    assert len(frame) == 3 * 2 and (frame["measured_s"] > 0).all()
    # pulling circuits never adds capacity in the model; the failed fraction's modelled time is not shorter
    kept = frame.groupby("fail_pct").apply(lambda g: (g.modelled_surviving_s >= g.modelled_intact_s - 1e-12).all())
    assert kept.all()
    flaps = json.loads((run / "linkfail_flaps.json").read_text())["table"]
    assert len(flaps) == 1 and flaps[0]["failed_links"] == 1 and flaps[0]["down_ms"] >= 30
    # the reaction (carrier down, watched, → goodput back, from the counters) contains the emulator's truth:
    # the pulled ports' first link down to their loss detected (light lost + the profile's 1 ms detection, due
    # times); resolved to the samples (0.5 ms) and the clocks, not to a tool run
    row = flaps[0]
    assert row["reaction_low_ms"] < row["truth_reaction_ms"] <= row["reaction_high_ms"]
    assert 0 < row["truth_reaction_ms"] <= 1.0
    assert row["reaction_high_ms"] - row["reaction_low_ms"] < 1.0 + 4 * row["clock_ms"] + 3 * 0.5
    assert json.loads((run / "summary.json").read_text())  # the run record is whole
    verdict = json.loads((run / "verdict.json").read_text())
    assert [c["id"] for c in verdict["claims"]] == ["line_rate", "latency_10pct", "flap_reaction"]
    assert {c["verdict"] for c in verdict["claims"]} <= {"holds", "falsified", "inconclusive", "not applicable"}
    assert verdict["provenance"]["emulated"] and "assumed" in verdict["provenance"]["detection"]["source"]
    assert "Emulated bench" in (run / "report.md").read_text()


def test_emulated_leafspine_collective_is_the_fabric_models_answer():
    # the emulator's ranks, joined as one collective, finish when analysis.fabric says (intact and with links
    # shut before the start), ECMP and spraying alike; each rank's counters reach its bytes
    from analysis import fabric as fb
    from devices.emulated import leafspine as ls
    from tests.test_leafspine import Bench

    n, pair = 8, 1e6
    for lb in ("ecmp", "spray"):
        for dark in ((), ((0, 0, 1), (1, 1, 0))):
            bench = Bench(n)
            links = ls.links_of(bench, 0.0)  # detected at once: the collective runs routed around them
            for link in dark:
                links.set_state(link, up=False)
            declared = ls.Declared(2, 4, 2, lb, 3)
            for p in bench.ports:
                group = ls.join(bench, declared, p.key, [[(q.key, pair, pair) for q in bench.ports if q is not p]],
                                0, 1.0, 400.0)
            coll = group["collective"]
            views = [ls.RankView(coll, p.key) for p in bench.ports]
            views[0].advance(coll.start_ns + 10**10)
            took = max(v.finish_ns for v in views) - coll.start_ns
            want = fb.alltoall_time(fb.LeafSpine(n, 2, 4, 2, 400.0), pair, lb, dark, seed=3)
            assert took == pytest.approx(want * 1e9, abs=2)
            assert views[3].delivered(coll.start_ns + 10**10) == pytest.approx(((n - 1) * pair,) * 2)


def test_link_failures_pull_leafspine_links_on_the_emulated_bench(tmp_path):
    small = {"trace": "generate", "iterations": 1, "layers": 1, "regime_changes": 0, "tokens_per_micro_batch": 2048,
             "hidden_size": 1024, "max_phases": 1, "zipf_s": 0.0}
    out = {}
    for lb in ("ecmp", "spray"):
        playbook = {"name": "lf", "bench": "emulated:burst-mode", "seed": 5, "cycles": 1, "steps": [
            {"type": "link_failures", "name": "failures", "fail_pct": [0, 25], "rounds": 2, "planes": 2,
             "per_leaf": 4, "spines": 2, "load_balancing": lb, **small}]}
        path = tmp_path / f"{lb}.yaml"
        path.write_text(yaml.safe_dump(playbook))
        assert main(["run", str(path), "--out", str(tmp_path / lb), "-q"]) == 0
        out[lb] = json.loads((tmp_path / lb / "linkfail_failures.json").read_text())
    for lb, s in out.items():
        table = s["table"]
        assert s["provenance"]["fabric"]["links"] == 8 == table[0]["links"]  # 2 planes × 2 leaves × 2 spines
        assert [r["failed_links"] for r in table] == [0, 2]
        assert table[1]["capacity_fraction"] == pytest.approx(6 / 8)  # the raw surviving leaf–spine capacity
        assert 0 < table[0]["line_fraction"] <= 1.0 + 1e-6  # line = the NICs' physical rate (inventory)
    # per-flow hashing collides on the intact fabric, spraying does not: below and at line rate
    assert out["ecmp"]["table"][0]["line_fraction"] < out["spray"]["table"][0]["line_fraction"] - 0.05


def test_link_flaps_shut_leafspine_links_on_the_emulated_bench(tmp_path):
    # a flap shuts ceil(f) of the leaf–spine links through the fabric command (one line), the NICs on their
    # leaves are sampled; the emulator's reroute (the last shut link dark → routed around) is the profile's
    # 1 ms detection after the shut the harness sent; the goodput reaction is bounded, not before the shut
    playbook = {"name": "lf", "bench": "emulated:burst-mode", "seed": 5, "cycles": 1, "steps": [
        {"type": "link_flaps", "name": "flaps", "fail_pct": [25], "planes": 2, "per_leaf": 4, "spines": 2,
         "load_balancing": "spray", "down_ms": 30, "flaps": 1, "ops_before": 2, "lead_ms": 20, "tail_ms": 30,
         "sample_us": 500, "trace": "generate", "iterations": 1, "layers": 1, "regime_changes": 0,
         "max_phases": 1, "zipf_s": 0.0, "tokens_per_micro_batch": 65536, "hidden_size": 4096},  # few long
        # transfers: the emulator integrates each one, a loaded machine keeps up
        {"type": "spectrumx_verdict", "name": "verdict", "reaction_bound_ms": 60000, "n_boot": 200}]}
    run = _run_ok(tmp_path, playbook)
    s = json.loads((run / "linkfail_flaps.json").read_text())
    assert s["provenance"]["fabric"]["links"] == 8
    (row,) = s["table"]
    assert row["failed_links"] == 2 and 1 <= row["ports"] <= 2  # one NIC a leaf of the shut links
    assert row["reroute_ms"] == pytest.approx(1.0, abs=1e-6) and row["reached"]
    assert 0 <= row["reaction_low_ms"] < row["reaction_high_ms"]
    assert row["down_seen_ns"][0] <= row["down_seen_ns"][1]  # link down between the line's sending and return
    # the emulator's own reaction (true sample instants, true shut) lies within the measured bounds
    assert row["reaction_low_ms"] <= row["truth_low_ms"] < row["truth_high_ms"] <= row["reaction_high_ms"]
    frame = pd.read_parquet(run / s["parquet"])
    assert frame["endpoint"].nunique() == row["ports"]
    verdict = json.loads((run / "verdict.json").read_text())
    flap = next(c for c in verdict["claims"] if c["id"] == "flap_reaction")
    assert flap["said"] == "consistent with the emulator's model"


def test_latency_claim_decides_on_the_quantile_with_an_interval_and_names_what_the_other_lacks():
    # 8 units a side: p50 has a verified interval, p99 none (needs hundreds). Either beyond the bound falsifies
    # the claim (p50 and p99); "holds" needs both; each quantile says what it found or lacks
    c = latency_claim(_frame(0.99, 1.20, n=8), 1.07, 10.0)
    assert c["verdict"] == "falsified" and c["per_quantile"] == {"p50": "falsified", "p99": "inconclusive"}
    c = latency_claim(_frame(0.99, 1.0, n=8), 1.07, 10.0)
    assert c["verdict"] == "inconclusive" and c["per_quantile"]["p50"] == "holds"
    needs = c["p99"]["needs_iterations"]
    assert needs > 8 and c["reason"].startswith("p50 holds on its interval")
    assert f"p99 needs >= {needs} iterations a side for an interval (8 ran)" in c["reason"]
    rounds = _frame(0.99, 1.0, n=8).assign(unit=lambda f: f["iteration"].astype(str))  # the round as the unit
    assert "p99 needs >= " in latency_claim(rounds, 1.07, 10.0)["reason"] and \
        "rounds a side" in latency_claim(rounds, 1.07, 10.0)["reason"]


def test_fabric_study_refuses_an_emulated_bench_served_by_host_workers(tmp_path, capsys, monkeypatch):
    # the emulated leaf–spine lives in the bench's process: hosts served by worker processes (harness emulate
    # --workers N writes bench.host_workers) would run ranks and fabric_link that never meet
    monkeypatch.setenv("OCS_PASSWORD", "x")
    nics = lambda first: [{"netdev": f"e{k}", "rdma_dev": f"mlx5_{k}", "ocs": "ocs1", "tx": first + k,
                           "rx": 16 + first + k, "gbps": 400} for k in range(2)]
    inventory = {"bench": {"name": "pod", "emulated": True, "host_workers": 2},
                 "ocs": {"ocs1": {"protocol": "polatis-tl1", "url": "tcp://127.0.0.1:9", "size": [16, 16],
                                  "allowed_ports": ["1-32"], "user": "admin", "password_env": "OCS_PASSWORD"}},
                 "hosts": {f"gpu{h}": {"address": "127.0.0.1", "port": 9, "user": "lab", "nics": nics(1 + 2 * h)}
                           for h in range(2)}}
    step = {"type": "link_failures", "name": "failures", "planes": 2, "per_leaf": 2, "spines": 2, "trace": "generate",
            "iterations": 1, "layers": 1, "regime_changes": 0, "max_phases": 1, "tokens_per_micro_batch": 1024,
            "hidden_size": 1024}
    (tmp_path / "inv.yaml").write_text(yaml.safe_dump(inventory))
    for pull, rc in (("fabric", 2), ("circuits", 0)):
        (tmp_path / "pb.yaml").write_text(yaml.safe_dump({"name": "lf", "seed": 5, "steps": [{**step, "pull": pull}]}))
        assert main(["run", str(tmp_path / "pb.yaml"), "--bench", str(tmp_path / "inv.yaml"), "--dry-run", "-q"]) == rc
    err = capsys.readouterr().err
    assert "pb.yaml:" in err and "host_workers" in err and "--workers 0" in err and "Traceback" not in err


def test_flap_bounds_hold_for_the_true_down_anywhere_in_the_shut_lines_span():
    # a NIC's goodput: full before the true down D, stalled until the reroute, then a lower rate with a slow
    # tail in every transfer (its flows end at different times); sampled every 0.5 ms at a random phase. The
    # step knows only that D lies in the shut line's span [sent, returned]: its bounds must contain the
    # reaction judged from the true D on the same samples and steady state (the oracle the emulated bench
    # checks), wherever D is in the span
    from harness.steps.linkfail import flap_reaction

    rng = np.random.default_rng(0)
    interval, full, step = 500_000, 1e10, 10_000
    for _ in range(60):
        lo = 10**9 + int(rng.integers(0, interval))
        hi = lo + int(rng.integers(0, 20_000_000))
        down = int(rng.integers(lo, hi + 1))
        stall, after = int(rng.uniform(0, 3e6)), full * rng.uniform(0.4, 1.0)
        period, tail = int(rng.uniform(1.5e6, 4e6)), rng.uniform(0.2, 0.5)
        up = down + 300_000_000
        grid = np.arange(0, up + 50_000_000, step)
        since = grid - down - stall
        rate = np.where(grid < down, full, np.where(since < 0, 0.0, np.where(since % period < (1 - tail) * period,
                                                                                after, 0.3 * after)))
        rate[grid >= up] = full
        t = np.arange(int(rng.integers(0, interval)), up + 40_000_000, interval)
        octets = np.interp(t, grid, np.r_[0.0, np.cumsum(rate[:-1]) * step / 1e9])
        samples = {"p": (t, octets, 0)}
        got = flap_reaction(samples, 0, lo, up, interval / 1e9, (hi, lo))
        truth = flap_reaction(samples, 0, lo, up, interval / 1e9, (down, down), got["steady_bytes_s"])
        assert got["reaction_low_ms"] <= truth["reaction_low_ms"] + 1e-9
        assert truth["reaction_high_ms"] <= got["reaction_high_ms"] + 1e-9
