"""Files a step names are found next to the playbook, whatever the current directory."""
from __future__ import annotations

from pathlib import Path

import yaml

from harness.cli import main
from harness.config import Step


def test_step_paths_resolve_against_the_playbook_folder(tmp_path):
    step = Step("turnaround", "measure", {}, 3, str(tmp_path / "pbs" / "pb.yaml"))
    assert step.resolve_path("sched.yaml") == (tmp_path / "pbs" / "sched.yaml").resolve()
    assert step.resolve_path("/abs/sched.yaml") == Path("/abs/sched.yaml")
    assert step.resolve_path("~/s.yaml") == Path("~/s.yaml").expanduser()
    assert Step("t", "n", {}, None, "<memory>").resolve_path("s.yaml") == Path("s.yaml")


def test_turnaround_schedule_is_read_from_the_playbook_folder(tmp_path, monkeypatch, capsys):
    folder = tmp_path / "pbs"
    folder.mkdir()
    (folder / "sched.yaml").write_text(yaml.safe_dump({"cycles": [[["no-such-port", "other-port"]]]}))
    (folder / "pb.yaml").write_text(yaml.safe_dump({
        "name": "sched", "bench": "emulated:instant", "cycles": 1,
        "steps": [{"type": "turnaround", "name": "measure", "pattern": "schedule", "schedule": "sched.yaml",
                   "probes": False, "clock_warmup_s": 0.1}]}))
    monkeypatch.chdir(tmp_path)  # not the playbook's folder
    assert main(["run", str(folder / "pb.yaml"), "--out", str(tmp_path / "runs"), "--dry-run", "-q"]) == 2
    err = capsys.readouterr().err
    # the schedule was found and read (its content is what is wrong), at the playbook's folder
    assert "unknown port 'no-such-port'" in err and str(folder / "sched.yaml") in err
    known = err.split("(known: ")[1].split(")")[0].split(", ")
    a, b, c, d = known[:4]
    (folder / "sched.yaml").write_text(yaml.safe_dump({"cycles": [[f"{a} <-> {b}", f"{c} <-> {d}"],
                                                                  [f"{a} <-> {c}", f"{b} <-> {d}"]]}))
    assert main(["run", str(folder / "pb.yaml"), "--out", str(tmp_path / "runs"), "--dry-run", "--cycles", "2"]) == 0
    assert "cycle 2:" in capsys.readouterr().err
