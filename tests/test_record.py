"""Run directory helpers: atomic JSON, manifest, summaries, immutable record and writers."""
from __future__ import annotations

import json
import math
import os
from datetime import datetime, timezone

import numpy as np
import pandas as pd
import pytest

from analysis.stats import summarize_events
from devices.resources import OcsResource
from harness import record
from harness.config import Playbook, Step
from harness.record import (RecordWriteError, RunRecord, build_manifest, new_run_dir, publish, summary_markdown,
                            write_json_atomic)

PLAYBOOK = Playbook(name="smoke", description="", bench="emulated:mixnet-testbed", seed=3, cycles=2,
                    steps=[Step("wait", "w", {"seconds": 1.0}, 4)], source="playbooks/smoke.yaml", sha256="ab" * 32)


def test_new_run_dir_names_and_collisions(tmp_path):
    when = datetime(2026, 1, 2, 3, 4, 5, tzinfo=timezone.utc)
    a = new_run_dir(tmp_path / "runs", "smoke test/../x", when=when)
    b = new_run_dir(tmp_path / "runs", "smoke test/../x", when=when)
    assert a.name == "20260102T030405Z-smoke_test_.._x" and a.parent == tmp_path / "runs"
    assert b.name == a.name + "-2" and a.is_dir() and b.is_dir()


def test_write_json_atomic_replaces_and_sanitises(tmp_path):
    path = tmp_path / "x.json"
    write_json_atomic(path, {"a": 1})
    obj = {"nan": float("nan"), "np": np.int64(3), "arr": np.arange(3), "path": tmp_path, "set": {2, 1},
           "ocs": OcsResource("o", "polatis-tl1", "tcp://h:1", (4, 4), frozenset({1}), password="pw")}
    write_json_atomic(path, obj)
    back = json.loads(path.read_text())
    assert back["nan"] is None and back["np"] == 3 and back["arr"] == [0, 1, 2] and back["set"] == [1, 2]
    assert "password" not in back["ocs"] and "pw" not in path.read_text()
    assert [p.name for p in tmp_path.iterdir()] == ["x.json"]  # no temp files left


def test_write_json_atomic_keeps_old_file_on_failure(tmp_path, monkeypatch):
    path = tmp_path / "x.json"
    write_json_atomic(path, {"old": True})
    monkeypatch.setattr(os, "replace", lambda *a: (_ for _ in ()).throw(OSError(28, "No space left")))
    with pytest.raises(OSError):
        write_json_atomic(path, {"new": True})
    assert json.loads(path.read_text()) == {"old": True} and len(list(tmp_path.iterdir())) == 1


def test_manifest_contents(tmp_path, monkeypatch):
    monkeypatch.setattr(record, "git_describe", lambda root=record.PROJECT_ROOT: "v0-1-gabc-dirty")
    m = build_manifest(PLAYBOOK, inventory_text="bench: {}\n", seed=None,
                       clock_table=[{"host": "gpu1", "segments": [], "steps": []}], extra={"station": "s1"})
    assert m["playbook"]["sha256"] == "ab" * 32 and m["seed"] == 3 and m["git"] == "v0-1-gabc-dirty"
    assert m["inventory"]["sha256"] == record.sha256_text("bench: {}\n")
    assert m["versions"]["packages"]["numpy"] == np.__version__ and m["versions"]["python"]
    assert m["extra"] == {"station": "s1"} and m["clock"][0]["host"] == "gpu1"
    json.dumps(m, allow_nan=False)


def test_git_describe_outside_a_checkout(tmp_path):
    assert record.git_describe(tmp_path) is None


def summary_fixture():
    rows = []
    for c in range(4):
        base = 10**12 * (c + 1)
        rows += [(c, "ocs_command_sent", "h", "ocs1", base), (c, "ocs_command_completed", "h", "ocs1", base + 44 * 10**6)]
        for stage, dt in (("light_detected", 45), ("cdr_locked", 47), ("phy_up", 5700), ("port_active", 5720),
                          ("first_packet", 5721 + c)):
            rows.append((c, stage, "gpu1", "p0", base + dt * 10**6))
    events = pd.DataFrame(rows, columns=["cycle", "stage", "host", "port", "t_ns"])
    return summarize_events(events, rng_seed=1)


def test_summary_markdown_table():
    summary = summary_fixture()
    text = summary_markdown(summary)
    lines = [l for l in text.splitlines() if l.startswith("| turnaround")]
    assert len(lines) == 1
    cells = [c.strip() for c in lines[0].split("|")[1:-1]]
    assert cells[1] == "4" and cells[2] == "4" and float(cells[3]) == pytest.approx(5722.5)
    assert float(cells[7]) == pytest.approx(5724)
    # 4 cycles support no two-sided p99 interval: said once, the column holds the one-sided bound; nor a mean one
    assert "A two-sided 95 % interval of a p99 needs ≥ 368 cycles" in text and "| p99 ≥ (95 %) |" in text
    assert cells[9] == f"{summary['turnaround']['p99_bound95']['lower']:.3f}" and cells[8] == "needs ≥ 5 cycles"
    assert cells[3] == "5722.500"  # ms at a fixed µs precision, not %g
    assert "| chain: phy_up | 4 | 4 |" in text and "Cycles: 4" in text


def test_a_negative_chain_duration_is_explained_where_it_appears():
    rows = []
    for c in range(3):
        base = 10**12 * (c + 1)
        rows += [(c, "ocs_command_sent", "h", "ocs1", base), (c, "ocs_command_completed", "h", "ocs1", base + 44 * 10**6)]
        rows += [(c, stage, "gpu1", "p0", base + dt * 10**6) for stage, dt in
                 (("light_detected", 41), ("cdr_locked", 42), ("phy_up", 50), ("port_active", 51), ("first_packet", 52))]
    text = summary_markdown(summarize_events(pd.DataFrame(rows, columns=["cycle", "stage", "host", "port", "t_ns"]), 1))
    assert "| chain: los_clear | 3 | 3 | -3.000 |" in text
    assert "chain: los_clear is negative: light_detected was seen before ocs_command_completed" in text
    assert "chain: phy_up is negative" not in text


def test_record_is_immutable_and_writers_run(tmp_path, monkeypatch):
    monkeypatch.setattr(record, "git_describe", lambda root=record.PROJECT_ROOT: None)
    summary = summary_fixture()
    rec = RunRecord(run_id="r1", run_dir=tmp_path, playbook="smoke", outcome="completed", started_utc="a",
                    ended_utc="b", manifest=build_manifest(PLAYBOOK, seed=3), summary=summary)
    with pytest.raises(TypeError):
        rec.summary["turnaround"] = {}
    with pytest.raises(AttributeError):
        rec.outcome = "failed"
    seen = []
    publish(rec, [*record.DEFAULT_WRITERS, seen.append])
    assert seen == [rec]
    assert json.loads((tmp_path / "manifest.json").read_text())["seed"] == 3
    js = json.loads((tmp_path / "summary.json").read_text())
    assert js["summary"]["turnaround"]["n"] == 4 and js["outcome"] == "completed"
    assert math.isclose(js["summary"]["turnaround"]["mean"], 5722.5)
    assert "outcome **completed**" in (tmp_path / "summary.md").read_text()

    def broken(_):
        raise OSError("disk full")
    after = []
    with pytest.raises(RecordWriteError, match="broken: disk full"):
        publish(rec, [broken, after.append])
    assert after == [rec]  # a failing writer does not stop the others
