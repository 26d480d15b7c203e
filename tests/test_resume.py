"""A resumed run is the same run: the record's identity against what a resume is given (no bench started),
the run-directory lock, and the run-record rules of `harness run` that need no run (--out, --dry-run,
validation failures, --json, --version)."""
from __future__ import annotations

import json
import os
from dataclasses import asdict
from pathlib import Path

import pytest
import yaml

from harness import resume
from harness.cli import main
from harness.config import load_inventory, load_playbook
from harness.errors import InputError
from harness.lock import RunDirLock, RunDirLocked

PROFILE = {"name": "r", "ocs": {"switch": {"dist": "fixed", "ms": 2}},
           "topology": {"hosts": 2, "nics_per_host": 1, "ocs_size": [4, 4]}}
STEP = {"type": "turnaround", "name": "measure", "cycle_timeout_s": 5}


def write_playbook(path: Path, **step) -> Path:
    path.write_text(yaml.safe_dump({"name": "t", "bench": "emulated:instant", "seed": 3, "cycles": 4,
                                    "steps": [{**STEP, **step}]}))
    return path


def recorded_run(tmp_path: Path, bench: str, status: str | None = None) -> tuple[Path, Path]:
    """A run directory as the runner leaves it at the start of a run (manifest + inputs)."""
    pb = write_playbook(tmp_path / "pb.yaml")
    playbook = load_playbook(pb)
    run = tmp_path / "run"
    run.mkdir()
    source = resume.read_bench(bench)
    resume.keep_inputs(run, playbook, source)
    manifest = {"run": asdict(resume.identity(playbook, source, 4, 3)),
                "playbook": {"source": str(pb), "sha256": playbook.sha256}}
    if status:
        manifest["status"] = status
    (run / "manifest.json").write_text(json.dumps(manifest))
    return run, pb


@pytest.fixture
def profile(tmp_path) -> Path:
    path = tmp_path / "prof.yaml"
    path.write_text(yaml.safe_dump(PROFILE))
    return path


def plan(run, **given):
    return resume.plan_resume(run, **{"playbook_path": None, "bench": None, "cycles": None, "seed": None, **given})


def test_resume_takes_everything_from_the_record(tmp_path, profile):
    run, pb = recorded_run(tmp_path, f"emulated:{profile}")
    write_playbook(pb, cycle_timeout_s=99)  # the original file changed since: the copy is what ran
    got = plan(run)
    assert (got.identity.bench, got.identity.cycles, got.identity.seed) == (f"emulated:{profile}", 4, 3)
    assert got.playbook.steps[0].params["cycle_timeout_s"] == 5
    assert got.playbook.source == str(pb)
    # the same values given explicitly are the same run; so is an identical copy of the playbook elsewhere
    same = write_playbook(tmp_path / "copy.yaml")
    assert plan(run, playbook_path=str(same), bench=f"emulated:{profile}", cycles=4, seed=3).identity.cycles == 4


@pytest.mark.parametrize("given,why", [
    ({"cycles": 20}, "this run has 4 cycles, not 20"),
    ({"seed": 4}, "this run has seed 3, not 4"),
    ({"bench": "emulated:instant"}, "is a different bench"),
])
def test_resume_refuses_another_run(tmp_path, profile, given, why):
    run, _ = recorded_run(tmp_path, f"emulated:{profile}")
    with pytest.raises(InputError, match=why):
        plan(run, **given)


def test_resume_refuses_a_changed_playbook_profile_or_kind_of_bench(tmp_path, profile):
    run, pb = recorded_run(tmp_path, f"emulated:{profile}")
    with pytest.raises(InputError, match="is not the playbook this run ran"):
        plan(run, playbook_path=str(write_playbook(pb, pattern="random-matching")))
    for other in (f"emulated-netns:{profile}", f"emulated:{profile}?ocs=polatis-scpi"):
        with pytest.raises(InputError, match="different bench"):
            plan(run, bench=other)
    assert plan(run, bench=f"emulated:{profile}?ocs=polatis-tl1").identity.cycles == 4  # the default, spelt out
    profile.write_text(yaml.safe_dump({**PROFILE, "ocs": {"switch": {"dist": "fixed", "ms": 3}}}))
    with pytest.raises(InputError, match="or it changed since"):
        plan(run)
    profile.unlink()  # gone: the run's copy stands in
    assert plan(run).identity.bench == f"emulated:{run / 'inputs' / 'profile.yaml'}"


def test_resume_of_an_inventory_bench(tmp_path):
    from devices.emulated.bench import EmulatedBench
    from devices.emulated.profile import profile_from_dict

    with EmulatedBench(profile_from_dict(PROFILE), seed=1, workdir=tmp_path / "bench") as bench:
        inventory = tmp_path / "inv.yaml"
        inventory.write_bytes(bench.inventory_path.read_bytes())
        run, _ = recorded_run(tmp_path, str(inventory))
        # an external emulated bench (emulated: true, what `harness emulate` writes) is leased like a real one
        from harness.runner import _acquire_lease

        assert yaml.safe_load(inventory.read_text())["bench"]["emulated"] is True
        lease = _acquire_lease(load_inventory(inventory), str(inventory), "first")
        with pytest.raises(InputError, match="bench is locked.*first"):
            _acquire_lease(load_inventory(inventory), str(inventory), "second")
        lease.release()
        assert (run / "inputs" / "bench.yaml").read_bytes() == inventory.read_bytes()
        assert plan(run).identity.bench == str(inventory)
        assert plan(run, bench=str(run / "inputs" / "bench.yaml")).identity.cycles == 4  # same content
        with pytest.raises(InputError, match="different bench"):
            plan(run, bench="emulated:instant")
        inventory.unlink()  # the original is gone: its copy stands in
        assert plan(run).identity.bench == str(run / "inputs" / "bench.yaml")
        changed = yaml.safe_load(bench.inventory_path.read_text())
        changed["bench"]["name"] = "another"
        inventory.write_text(yaml.safe_dump(changed))
        with pytest.raises(InputError, match="or it changed since"):
            plan(run)


@pytest.mark.parametrize("status,ok", [(None, True), ("aborted", True), ("error", True), ("ok", False),
                                       ("failed", False), ("broken", False)])
def test_only_an_unfinished_run_resumes(tmp_path, status, ok):
    run, _ = recorded_run(tmp_path, "emulated:instant", status)
    if ok:
        assert plan(run).identity.seed == 3
    else:
        with pytest.raises(InputError, match=f"finished \\(status {status}\\)"):
            plan(run)


def test_resume_of_something_that_is_not_a_run(tmp_path, capsys):
    with pytest.raises(InputError, match="no manifest.json"):
        plan(tmp_path)
    (tmp_path / "manifest.json").write_text(json.dumps({"seed": 1}))
    with pytest.raises(InputError, match="no run identity"):
        plan(tmp_path)
    assert main(["run", "--resume", str(tmp_path), "--cycles", "3"]) == 2
    assert "no run identity" in capsys.readouterr().err


def test_run_directory_lock_names_its_holder_and_dies_with_it(tmp_path):
    lock = RunDirLock(tmp_path).acquire("r1")
    with pytest.raises(RunDirLocked, match=f"pid\": {os.getpid()}"):
        RunDirLock(tmp_path).acquire("r1")
    lock.release()
    RunDirLock(tmp_path).acquire("r1").release()
    # a holder that died (here: a child that exits while holding it) leaves it free
    pid = os.fork()
    if pid == 0:
        RunDirLock(tmp_path).acquire("child")
        os._exit(0)
    os.waitpid(pid, 0)
    RunDirLock(tmp_path).acquire("r1").release()


def test_a_second_resume_of_a_held_run_is_refused(tmp_path, capsys):
    run, _ = recorded_run(tmp_path, "emulated:instant", "aborted")
    held = RunDirLock(run).acquire(run.name)
    try:
        assert main(["run", "--resume", str(run), "-q"]) == 2
        assert "run directory in use" in capsys.readouterr().err
    finally:
        held.release()


def test_no_run_directory_for_bad_input_and_out_is_the_run_directory(tmp_path, capsys):
    pb = write_playbook(tmp_path / "pb.yaml")
    out = tmp_path / "o" / "run"
    assert main(["run", str(pb), "--bench", "emulated:no-such-profile", "--out", str(out)]) == 2
    assert main(["run", str(pb), "--bench", str(tmp_path / "missing.yaml"), "--out", str(out)]) == 2
    assert main(["run", str(pb), "--cycles", "0", "--out", str(out)]) == 2
    assert not out.exists()
    out.mkdir(parents=True)
    (out / "events.jsonl").write_text("")
    assert main(["run", str(pb), "--out", str(out)]) == 2
    assert "not an empty directory" in capsys.readouterr().err
    assert main(["run"]) == 2
    assert "PLAYBOOK is required" in capsys.readouterr().err


def test_json_line_for_input_errors_and_version(capsys, tmp_path):
    assert main(["run", str(tmp_path / "missing.yaml"), "--json"]) == 2
    out, err = capsys.readouterr()
    result = json.loads(out)
    assert result["status"] == "input_error" and result["exit_code"] == 2 and "missing.yaml" in result["error"]
    with pytest.raises(SystemExit) as exc:
        main(["--version"])
    assert exc.value.code == 0 and capsys.readouterr().out.startswith("harness (ocs-hil) ")


def test_a_full_disk_at_the_start_is_one_line_and_no_run_directory(tmp_path, monkeypatch, capsys):
    import errno

    def full(*args, **kwargs):
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(resume, "keep_inputs", full)
    out = tmp_path / "run"
    assert main(["run", str(write_playbook(tmp_path / "pb.yaml")), "--out", str(out), "-q"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "No space left on device" in err and "Traceback" not in err
    assert not out.exists()


def test_a_playbook_s_environment_values_are_kept_as_their_names(tmp_path, monkeypatch):
    """Issue 38, reproduction 10: a `${TOKEN}` in a playbook was stored in plain text in inputs/playbook.yaml.
    The copy keeps `${NAME}`; a resume reads it back through the same environment, as the same run."""
    secret = "s3cr3t-token-7f1e"
    monkeypatch.setenv("HIL_TEST_TOKEN", secret)
    pb = tmp_path / "pb.yaml"
    pb.write_text(yaml.safe_dump({"name": "t", "bench": "emulated:instant", "seed": 3, "cycles": 4,
                                  "description": "${HIL_TEST_TOKEN}", "steps": [STEP]}))
    playbook = load_playbook(pb)
    assert playbook.description == secret  # the run itself sees the value
    run = tmp_path / "run"
    run.mkdir()
    source = resume.read_bench("emulated:instant")
    resume.keep_inputs(run, playbook, source)
    kept = (run / "inputs" / "playbook.yaml").read_text()
    assert secret not in kept and "${HIL_TEST_TOKEN}" in kept
    again = load_playbook(run / "inputs" / "playbook.yaml")
    assert resume.playbook_digest(again) == resume.playbook_digest(playbook)
