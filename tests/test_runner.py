"""The runner end to end on the emulated bench: run records, ground truth, restore, dry run, SIGINT,
SIGKILL + resume. Bounds are loose: these check behaviour, benchmarks check speed. Runs go through the
project's pytest plugin (`run_playbook`, `hil_bench`: the session's emulated bench behind its inventory),
as a lab's tests do; SIGINT and SIGKILL need a `harness run` process of their own."""
from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pandas as pd
import pytest
import yaml

from analysis.accuracy import match
from devices.emulated.formats import CURRENT_TOOLS, MLX5_PRIV_FLAGS
from harness.cli import main
from harness.events import EVENT_COLUMNS, GROUND_TRUTH_COLUMNS, STAGES_UP

FAST = {
    "name": "test-fast",
    "ocs": {"switch": {"dist": "uniform", "low_ms": 3, "high_ms": 6}, "dark": {"dist": "fixed", "ms": 0.2}},
    "nic": {"los_clear": {"dist": "fixed", "ms": 0.05}, "cdr_lock": {"dist": "uniform", "low_ms": 0.5, "high_ms": 1},
            "phy_up": {"dist": "uniform", "low_ms": 2, "high_ms": 4}, "port_active": {"dist": "fixed", "ms": 1},
            "link_down": {"dist": "fixed", "ms": 0.5}},
    "hosts": {"clock_offset_ms": [-30, 30], "drift_ppm": [-20, 20]},
    "topology": {"hosts": 2, "nics_per_host": 2, "ocs_size": [8, 8]},
}


def playbook(tmp_path: Path, cycles: int = 3, **step) -> Path:
    params = {"type": "turnaround", "name": "measure", "cycle_timeout_s": 20, "clock_warmup_s": 0.3, **step}
    path = tmp_path / "pb.yaml"
    path.write_text(yaml.safe_dump({"name": "t", "bench": "emulated:instant", "seed": 3, "cycles": cycles,
                                    "steps": [params]}))
    return path


@pytest.fixture
def fast_profile(tmp_path) -> Path:
    path = tmp_path / "fast.yaml"
    path.write_text(yaml.safe_dump(FAST))
    return path


@pytest.fixture
def shared_bench(hil_bench):
    """The session's emulated bench (the plugin's), reached through its inventory as a lab's bench is: shared
    like a real one, so these tests leave it as they found it."""
    if hil_bench.emulator is None:
        pytest.skip(f"needs an emulated session bench (--bench emulated:PROFILE), not {hil_bench.spec}")
    return hil_bench


def left_by_another_user(bench, first: int) -> dict[int, int]:
    """Two fibres cross-connected as another user might have left them: NIC port i's TX to port i+1's RX."""
    a, b = bench.resources.nic_ports[first:first + 2]
    return {a.ocs_tx: b.ocs_rx, b.ocs_tx: a.ocs_rx}


def test_turnaround_run_record_matches_ground_truth(tmp_path, fast_profile, run_playbook, capsys, monkeypatch):
    import gc

    from harness.bench.circuits import CircuitGuard
    from harness.bench.observe import ObservationLog

    order = []  # what the harness did, in order: fsyncs of events.jsonl, switch commands, raw cycle records
    real_fsync, real_begin, real_raw = os.fsync, CircuitGuard.begin, ObservationLog.cycle

    def fsync(fd):
        real_fsync(fd)
        if os.readlink(f"/proc/self/fd/{fd}").endswith("events.jsonl"):
            order.append(("fsync", os.fstat(fd).st_size))

    frozen = []  # objects the cyclic GC leaves alone at each command

    def begin(self, *args, **kwargs):  # every command goes out here (`apply` is `begin` + `finish`)
        frozen.append(gc.get_freeze_count())
        written = tmp_path.glob("run-*/events.jsonl")
        order.append(("command", max((p.stat().st_size for p in written), default=0)))
        return real_begin(self, *args, **kwargs)

    monkeypatch.setattr("harness.eventlog.os.fsync", fsync)
    monkeypatch.setattr(CircuitGuard, "begin", begin)
    monkeypatch.setattr(ObservationLog, "cycle", lambda self, cycle, *a, **k: (order.append(("raw", cycle)),
                                                                              real_raw(self, cycle, *a, **k)))
    result = run_playbook(playbook(tmp_path, cycles=4), bench=f"emulated:{fast_profile}")
    assert result.exit_code == 0 and result.ok, result
    # Every command goes out with the events written before it fsynced (cycle N durable before N+1's
    # command), by one fsync per cycle; a cycle's raw record is written only after the next command.
    commands = [i for i, (what, _) in enumerate(order) if what == "command"]
    assert len(commands) == 6, order  # cycle 0 (unmeasured), cycles 1-4, the restore at teardown
    for n, (before, at) in enumerate(zip(commands, commands[1:])):
        between = order[before + 1:at]
        assert [what for what, _ in between].count("fsync") == (1 if n else 0), between
        synced = [size for what, size in order[:at] if what == "fsync"]
        assert order[at][1] == (synced[-1] if synced else 0)  # nothing written that is not on disk
    # the step's cycles run with what set-up left alive frozen (no full collection rescans it inside a
    # cycle); the step unfreezes it when it ends, before the restore at teardown
    assert all(n > 0 for n in frozen[:5]) and frozen[5] == 0, frozen
    raws = [i for i, (what, _) in enumerate(order) if what == "raw"]
    assert [order[i][1] for i in raws] == [1, 2, 3, 4]
    assert all(raws[k] > commands[k + 2] for k in range(3)) and commands[4] < raws[3] < commands[5]
    run = result.run_dir
    events = result.events()
    assert tuple(events.columns) == EVENT_COLUMNS
    truth = result.ground_truth()
    assert tuple(truth.columns) == GROUND_TRUTH_COLUMNS
    assert sorted(events["cycle"].unique()) == [1, 2, 3, 4]
    # every port, every cycle, every up-stage, exactly once
    per = events[events["stage"].isin(STAGES_UP[2:])].groupby(["cycle", "host", "port", "stage"]).size()
    assert len(per) == 4 * 4 * 5 and (per == 1).all()
    assert not (events["stage"] == "fault").any()
    # the OCS command's events carry their stamps' bounds and provenance (TL1 over TCP: the write, the
    # kernel's receive time of the COMPLD); tests/test_ocs_lines.py checks them against the switch's truth
    ocs = events[events["stage"].isin(["ocs_command_sent", "ocs_command_completed"])]
    assert len(ocs) == 2 * 4 and (ocs["uncertainty_ns"] > 0).all(), ocs
    assert sorted(set(ocs["source"])) == ["harness:kernel", "harness:write"], ocs
    summary = result.summary()
    assert summary["outcome"] == "completed"
    # device identity, where the bench can tell: the switch's RTRV-NETYPE, transceivers, GPUs
    devices = result.manifest()["extra"]["devices"]
    assert devices["ocs"]["ocs1"].startswith("POLATIS,")
    port = devices["hosts"]["gpu1"]["nics"]["ens1f0np0"]
    assert port["transceiver"]["part"] and port["transceiver"]["serial"] and port["transceiver"]["vendor"]
    assert port["link"] == {"autoneg": True, "priv_flags": dict(MLX5_PRIV_FLAGS)}  # link-up settings, as exposed
    assert all(g["name"] and g["uuid"].startswith("GPU-") for g in devices["hosts"]["gpu1"]["gpus"])
    assert devices["hosts"]["gpu1"]["agent_python"] == CURRENT_TOOLS.python  # the emulated host's python3
    acc = {r["stage"]: r for r in summary["summary"]["accuracy"]}
    # Recorded times agree with the emulator's truth far inside one profile delay (0.5-6 ms),
    # and the stated uncertainty covers the truth.
    assert acc["all"]["n"] >= 4 * 4 * 5
    assert acc["all"]["abs_err_p99_ms"] < 2.0
    assert acc["all"]["coverage"] >= 0.95
    # no true stage event of a watched cycle is without its recorded one, and the summary says so
    assert summary["summary"]["lost_events"] == {"true": acc["all"]["n"], "in_ok_cycles": 0, "in_faulted_cycles": 0,
                                                 "first_in_ok_cycles": []}
    assert f"Of {acc['all']['n']} true stage events while their cycles were watched, 0 in ok cycles" in \
        (run / "summary.md").read_text()
    # each cycle's recorded send precedes its command's arrival at the switch (its kernel stamp), and the TL1
    # switch, which answers once its mirrors settled, is never recorded as answering before they did
    ocs_check = summary["summary"]["ocs_command"]
    assert ocs_check["n"] == 4 and ocs_check["not_causal"] == 0 and ocs_check["completed_before_settled"] == 0
    assert ocs_check["arrived_by"] == {"kernel": 4}  # the TL1 server's kernel receive stamps
    assert ocs_check["settled_to_completed_n"] == 4
    assert "## OCS command against the switch's record" in (run / "summary.md").read_text()
    # every delay the emulator drew, keyed by switch command, port and stage; its schedule report
    draws = pd.read_parquet(run / "ground_truth_delays.parquet")
    assert list(draws.columns) == ["command", "port", "stage", "delay_ns"]
    los = draws[draws["stage"] == "los_clear"]
    assert len(los) >= 4 * 4 and (los["delay_ns"] == int(FAST["nic"]["los_clear"]["ms"] * 1e6)).all()
    emulator = summary["summary"]["emulator"]
    assert emulator["lateness_ms"]["n"] > 0 and set(emulator["stages"]) >= {"switch", "los_clear", "phy_up"}
    assert "## Emulator schedule" in (run / "summary.md").read_text()
    # stage order per port is physical: light, lock, PHY, active, first packet
    nic = events[events["stage"].isin(STAGES_UP[2:])]
    wide = nic.pivot_table(index=["cycle", "host", "port"], columns="stage", values="t_ns")
    for a, b in zip(STAGES_UP[2:], STAGES_UP[3:]):
        assert (wide[b] + 1_000_000 >= wide[a]).all(), (a, b)
    manifest = result.manifest()
    assert manifest["seed"] == 3 and manifest["extra"]["restored"] == {"ocs1": True}
    # every host's clock probe replies were dated by the kernel's receive stamp, none by a late read
    assert len(manifest["clock"]) == len(set(events.loc[events["host"] != "", "host"])) and \
        all(c["reply_stamps"] == {"stamp": "kernel", "fallbacks": 0, "reason": ""} for c in manifest["clock"])
    assert "clock_replies_by_read" not in summary["summary"]
    assert len(manifest["clock"]) == 2
    # the report converts the raw observations again with the final clock fit: same events, still covered
    capsys.readouterr()
    assert main(["report", str(run)]) == 0
    assert "| re-corrected (final clock fit) | " in capsys.readouterr().out
    again = pd.read_parquet(run / "events.recorrected.parquet")
    assert len(again) == len(events)
    assert match(again[again["cycle"] > 0], truth)["covered"].mean() >= 0.95


def test_inventory_bench_is_restored_and_dry_run_touches_nothing(tmp_path, shared_bench, run_playbook, capsys,
                                                                 monkeypatch):
    import harness.config

    parsed = []  # every inventory parse: a run parses its inventory once (lease, recovery and run share it)
    parse = harness.config.bench_from_data
    monkeypatch.setattr(harness.config, "bench_from_data", lambda *a, **k: parsed.append(a[1]) or parse(*a, **k))
    physics = shared_bench.emulator.physics
    physics.ocs_apply(left_by_another_user(shared_bench, 0))
    original = physics.ocs_patches()
    pb = playbook(tmp_path, cycles=2, probes=False)
    inventory = str(shared_bench.inventory)
    before = sorted(tmp_path.iterdir())
    dry = run_playbook(pb, bench=inventory, dry_run=True, quiet=False)
    assert dry.exit_code == 0 and dry.ok and dry.run_dir is None
    assert physics.ocs_patches() == original
    assert "cycle 1:" in capsys.readouterr().err
    assert sorted(tmp_path.iterdir()) == before  # a dry run writes nothing
    parsed.clear()
    run = run_playbook(pb, bench=inventory)
    assert run.exit_code == 0 and run.ok, run
    assert parsed == [inventory]
    assert physics.ocs_patches() == original
    assert run.manifest()["extra"]["restored"] == {"ocs1": True} and run.ground_truth() is None
    assert (run.run_dir / "inputs" / "bench.yaml").read_bytes() == Path(inventory).read_bytes()


def _wait_for_cycle(log: Path, cycle: int, proc: subprocess.Popen, timeout: float = 60) -> None:
    end = time.monotonic() + timeout
    while time.monotonic() < end:
        assert proc.poll() is None, proc.stderr.read().decode()
        if log.exists() and any(json.loads(l)["cycle"] >= cycle for l in log.read_text().splitlines() if l):
            return
        time.sleep(0.05)
    raise AssertionError(f"cycle {cycle} never logged")


def _harness(*args: str) -> subprocess.Popen:
    return subprocess.Popen([sys.executable, "-m", "harness", *args], stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE)


def test_sigint_mid_run_restores_the_switch(tmp_path, shared_bench):
    physics = shared_bench.emulator.physics
    physics.ocs_apply(left_by_another_user(shared_bench, 2))
    original = physics.ocs_patches()
    out = tmp_path / "runs"
    proc = _harness("run", str(playbook(tmp_path, cycles=500)), "--bench", str(shared_bench.inventory),
                    "--out", str(out / "run"), "-q")
    run_log = None
    end = time.monotonic() + 60
    while run_log is None and time.monotonic() < end:
        runs = [p for p in out.glob("*/events.jsonl")] if out.exists() else []
        run_log = runs[0] if runs else None
        time.sleep(0.05)
    _wait_for_cycle(run_log, 2, proc)
    proc.send_signal(signal.SIGINT)
    assert proc.wait(timeout=60) == 130
    assert physics.ocs_patches() == original
    manifest = json.loads((run_log.parent / "manifest.json").read_text())
    assert manifest["status"] == "aborted" and manifest["extra"]["restored"] == {"ocs1": True}


def test_sigkill_then_resume_completes_every_cycle_once(tmp_path, fast_profile, run_playbook):
    out = tmp_path / "runs"
    pb = playbook(tmp_path, cycles=6)
    proc = _harness("run", str(pb), "--bench", f"emulated:{fast_profile}", "--out", str(out / "run"), "-q")
    end = time.monotonic() + 60
    while not list(out.glob("*/events.jsonl")) and time.monotonic() < end:
        time.sleep(0.05)
    run = list(out.glob("*/events.jsonl"))[0].parent
    _wait_for_cycle(run / "events.jsonl", 2, proc)
    os.kill(proc.pid, signal.SIGKILL)
    proc.wait(timeout=30)
    # A crash mid-write leaves a torn line; simulate the worst case on top of the kill.
    with open(run / "events.jsonl", "ab") as f:
        f.write(b'{"run_id": "x", "cycle": 99, "stage": "phy')
    pb.write_text(pb.read_text().replace("cycles: 6", "cycles: 9"))  # the record, not the file, says 6
    resumed = run_playbook(resume=run)  # `harness run --resume RUN_DIR --json`: its machine-readable result
    assert resumed.status == "ok" and resumed.exit_code == 0 and resumed.run_dir == run, resumed
    events = pd.read_parquet(run / "events.parquet")
    assert sorted(events["cycle"].unique()) == [1, 2, 3, 4, 5, 6]
    sent = events[events["stage"] == "ocs_command_sent"].groupby("cycle").size()
    assert (sent == 1).all()
    assert (run / "events.incomplete.jsonl").exists()
    manifest = json.loads((run / "manifest.json").read_text())
    assert manifest["extra"]["resumed"] and manifest["run"]["cycles"] == 6 and manifest["status"] == "ok"
    # every cycle's bookkeeping, the killed attempt's rebuilt from its events
    cycles = pd.read_parquet(run / "cycles.parquet")
    assert list(cycles["cycle"]) == [1, 2, 3, 4, 5, 6]
    assert set(cycles["recorded"]) == {"events", "live"}
    first_sent = events[events["stage"] == "ocs_command_sent"].groupby("cycle")["t_ns"].min()
    rebuilt = cycles[cycles["recorded"] == "events"].set_index("cycle")["sent_ns"]
    assert (rebuilt == first_sent.loc[rebuilt.index]).all()
    assert (run / "inputs" / "playbook.yaml").exists() and oct((run / "manifest.json").stat().st_mode)[-3:] == "644"
    # a finished run is not extended
    again = run_playbook(resume=run)
    assert again.exit_code == 2 and "the run is finished (status ok)" in again.error


def test_bad_bench_and_playbook_exit_2(tmp_path, run_playbook, capsys):
    pb = playbook(tmp_path)
    unknown = run_playbook(pb, bench="emulated:no-such-profile")
    assert unknown.exit_code == 2 and "unknown profile" in unknown.error
    assert "unknown profile" in capsys.readouterr().err
    assert run_playbook(pb, bench=str(tmp_path / "missing.yaml")).exit_code == 2
    bad = tmp_path / "bad.yaml"
    bad.write_text("name: x\nsteps:\n  - type: turnaround\n    pattern: 3\n")
    broken = run_playbook(bad)
    assert broken.exit_code == 2 and broken.run_dir is None and "bad.yaml:4" in broken.error
    err = capsys.readouterr().err
    assert "bad.yaml:4" in err and "Traceback" not in err


def test_summary_names_hosts_whose_clock_replies_were_dated_by_their_read():
    """The summary's markdown warns per host whose probe replies were dated by their read (always, or some
    reads), with the reason, and says nothing when every reply had its kernel stamp."""
    from types import SimpleNamespace

    from harness.finish import summary_markdown

    ctx = SimpleNamespace(run_id="r", playbook=SimpleNamespace(name="p"), inventory=SimpleNamespace(name="b"),
                          manifest_extra={}, results={})
    base = {"status": "ok", "wall_s": 1.0, "faults": 0, "steps": {}}
    assert "dated by their read" not in summary_markdown(ctx, base)
    text = summary_markdown(ctx, {**base, "clock_replies_by_read": {
        "gpu2": {"stamp": "kernel", "fallbacks": 3, "reason": "CLOCK_REALTIME stepped by 5 ns since the last read"},
        "gpu7": {"stamp": "read", "fallbacks": 0, "reason": "the socket does not give kernel receive stamps"}}})
    warned = [line for line in text.splitlines() if "dated by their read" in line]
    assert len(warned) == 2 and "`gpu2`" in warned[0] and "3 reads: CLOCK_REALTIME stepped" in warned[0]
    assert "`gpu7`" in warned[1] and "always: the socket does not give" in warned[1]
