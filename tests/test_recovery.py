"""Pending-restore notes (harness.recovery) without a switch: who refuses, who adopts, who clears."""
from __future__ import annotations

import json

import pytest

from devices.resources import Bench, OcsResource
from harness import recovery
from harness.errors import InputError


def bench(url: str = "tcp://127.0.0.1:3082") -> Bench:
    ocs = OcsResource(name="ocs1", protocol="polatis-tl1", url=url, size=(8, 8), allowed_ports=frozenset(range(1, 17)))
    return Bench(name="b", emulated=True, ocs={"ocs1": ocs}, hosts={}, nic_ports=())


def dead_run(tmp_path, name: str, snapshot: dict | None) -> "object":
    run = tmp_path / name
    run.mkdir()
    if snapshot is not None:
        (run / "restore.json").write_text(json.dumps({"ocs1": snapshot}))
    recovery.mark_pending(bench(), run, name)
    return run


def test_a_dead_runs_note_refuses_a_fresh_run_unless_adopted(tmp_path):
    dead = dead_run(tmp_path, "dead", {"2": 11})
    warnings = []
    fresh = tmp_path / "fresh"
    with pytest.raises(InputError, match=f"harness bench restore {dead.resolve()}"):
        recovery.check_pending(bench(), fresh, adopt=False, warn=warnings.append)
    assert "ended without restoring the switch" in warnings[0] and "restore.json" in warnings[0]
    adopted = recovery.check_pending(bench(), fresh, adopt=True, warn=warnings.append)
    assert adopted == {"ocs1": {"from_run": "dead", "run_dir": str(dead.resolve())}}
    # the same run (a resume) is not refused; another switch is not affected
    assert recovery.check_pending(bench(), dead, adopt=False, warn=warnings.append) == {}
    assert recovery.check_pending(bench("tcp://127.0.0.1:9"), fresh, adopt=False, warn=warnings.append) == {}


def test_a_note_is_cleared_only_when_the_switch_is_back(tmp_path):
    run = dead_run(tmp_path, "run", {"2": 11})
    recovery.clear_pending(bench(), run, {"ocs1": False})  # the restore failed: the note stays
    assert recovery.read_pending(bench().ocs["ocs1"])["run_id"] == "run"
    recovery.clear_pending(bench(), tmp_path / "other", {"ocs1": True})  # not its note
    assert recovery.read_pending(bench().ocs["ocs1"]) is not None
    recovery.clear_pending(bench(), run, {"ocs1": True})
    assert recovery.read_pending(bench().ocs["ocs1"]) is None


def test_a_run_that_never_snapshotted_moved_nothing(tmp_path):
    dead_run(tmp_path, "early", None)
    warnings = []
    assert recovery.check_pending(bench(), tmp_path / "fresh", adopt=False, warn=warnings.append) == {}
    assert "never snapshotted" in warnings[0] and recovery.read_pending(bench().ocs["ocs1"]) is None


def test_a_note_left_through_one_name_of_the_switch_is_found_through_another(tmp_path):
    """Issue 38, reproduction 1: a run killed while driving `tcp://127.0.0.1:P` must refuse a fresh run
    reaching the same switch as `tcp://localhost:P` (the note is the switch's, not its spelling's)."""
    run = tmp_path / "dead"
    run.mkdir()
    (run / "restore.json").write_text(json.dumps({"ocs1": {"2": 11}}))
    recovery.mark_pending(bench("tcp://127.0.0.1:3082"), run, "dead")
    with pytest.raises(InputError, match="left changed"):
        recovery.check_pending(bench("tcp://localhost:3082"), tmp_path / "fresh", adopt=False, warn=[].append)
    recovery.clear_pending(bench("tcp://localhost:3082"), run, {"ocs1": True})
    assert recovery.read_pending(bench("tcp://127.0.0.1:3082").ocs["ocs1"]) is None
