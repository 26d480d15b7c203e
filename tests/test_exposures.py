"""Issue 38, reproduction 10 (exposures): the emulator's password comes from the variable its inventory names,
and `harness bench restore` of a run that restored its switch itself leaves the switch alone."""
from __future__ import annotations

import yaml

from devices.emulated.bench import PASSWORD_ENV, EmulatedBench
from devices.emulated.profile import profile_from_dict
from harness.cli import main

PROFILE = {"name": "exposures", "ocs": {"switch": {"dist": "fixed", "ms": 2}},
           "topology": {"hosts": 2, "nics_per_host": 1, "ocs_size": [4, 4]}}


def _playbook(tmp_path):
    pb = tmp_path / "pb.yaml"
    pb.write_text(yaml.safe_dump({"name": "x", "cycles": 2, "steps": [
        {"type": "turnaround", "clock_warmup_s": 0.2, "cycle_timeout_s": 10, "probes": False}]}))
    return pb


def _clean_run(tmp_path, bench, capsys):
    run = tmp_path / "run"
    assert main(["run", str(_playbook(tmp_path)), "--bench", str(bench.inventory_path), "--out", str(run),
                 "-q"]) == 0, capsys.readouterr().err
    capsys.readouterr()
    return run


def test_the_emulator_takes_its_password_from_the_variable_its_inventory_names(tmp_path, monkeypatch, capsys):
    monkeypatch.setenv("OCS_HIL_LOCK_DIR", str(tmp_path / "locks"))
    monkeypatch.setenv(PASSWORD_ENV, "not-the-default-7")
    with EmulatedBench(profile_from_dict(PROFILE), seed=1, workdir=tmp_path / "bench") as bench:
        inventory = yaml.safe_load(bench.inventory_path.read_text())
        assert inventory["ocs"]["ocs1"]["password_env"] == PASSWORD_ENV
        _clean_run(tmp_path, bench, capsys)
    monkeypatch.setenv(PASSWORD_ENV, "")  # empty: the emulator's default, set for the inventory to name
    with EmulatedBench(profile_from_dict(PROFILE), seed=1, workdir=tmp_path / "bench2"):
        import os

        assert os.environ[PASSWORD_ENV]


def test_restore_of_a_run_that_restored_its_switch_itself_changes_nothing(tmp_path, monkeypatch, capsys):
    monkeypatch.setenv("OCS_HIL_LOCK_DIR", str(tmp_path / "locks"))
    with EmulatedBench(profile_from_dict(PROFILE), seed=1, workdir=tmp_path / "bench") as bench:
        run = _clean_run(tmp_path, bench, capsys)
        bench.physics.ocs_apply({1: 6})  # a later configuration, after the run restored the switch
        assert bench.physics.wait_idle(5)
        later = bench.physics.ocs_patches()
        assert main(["bench", "restore", str(run)]) == 0
        assert "nothing to restore" in capsys.readouterr().out
        assert bench.physics.ocs_patches() == later  # not rolled back
