"""The regret step end to end: measured switching cost in, regret table and plot out."""
from __future__ import annotations

import json

import yaml


def test_regret_step_against_offline_optimum(tmp_path, run_playbook):
    prof = tmp_path / "p.yaml"
    prof.write_text(yaml.safe_dump({
        "name": "p", "ocs": {"switch": {"dist": "uniform", "low_ms": 20, "high_ms": 30}},
        "nic": {"phy_up": {"dist": "fixed", "ms": 2}},
        "topology": {"hosts": 2, "nics_per_host": 2, "ocs_size": [4, 4]}}))
    playbook = tmp_path / "r.yaml"
    playbook.write_text(yaml.safe_dump({
        "name": "r", "bench": f"emulated:{prof}", "seed": 4, "cycles": 5,
        "steps": [{"type": "turnaround", "name": "measure", "clock_warmup_s": 0.3},
                  {"type": "regret", "name": "regret", "iterations": 60, "regime_changes": 2,
                   "iterations_per_epoch": 50, "cost_scales": [0.5, 1, 4, 64, 1024]}]}))
    result = run_playbook(playbook, bench=f"emulated:{prof}")
    assert result.exit_code == 0, result
    run = result.run_dir
    out = json.loads((run / "regret_regret.json").read_text())
    table = out["table"]
    assert [r["scale"] for r in table] == [0.5, 1, 4, 64, 1024]
    # C is the measured exposed reconfiguration time (20-30 ms switching + ~2 ms NIC), scaled
    assert 0.02 < out["switch_cost_s"]["mean"] < 0.2
    for r in table:
        assert r["regret_offline"] >= -1e-9  # nothing beats the offline optimum with the same C
        assert r["offline_opt"] <= r["best_static"] + r["C_mean"] + 1e-9  # at most one switch from the start
    # Costlier switching never makes the offline optimum switch more often
    switches = [r["offline_switches"] for r in table]
    assert switches == sorted(switches, reverse=True)
    assert len(out["true_regime_changes"]) == 2
    assert (run / out["plot"]).stat().st_size > 5_000
