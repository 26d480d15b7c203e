"""Fault matrix: one run on the emulated bench per fault kind, scored against the emulator's ground truth.

For each fault: cycles ok / faulted, true physical events (ground truth) the harness should have recorded
and did not — within each cycle's watch window (its start to the moment it stopped watching), in
cycles it called ok ("lost", goal 0) and in cycles it labelled faulted (allowed, with the
cause recorded) — whether every injected fault left a `fault` event in its cycle, the exit code, and
whether the switch was restored (the runner's check of `patches()` against its start snapshot).
`harness_kill` is a SIGKILL in the middle of a reconfiguration followed by `--resume`.

    .venv/bin/python benchmarks/fault_matrix.py [--profile burst-mode] [--cycles 8] [--only KIND ...]
"""
from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import pandas as pd
import yaml

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from analysis.accuracy import unrecorded, watched_truth  # noqa: E402

# fault kind -> extra params; each is injected at cycle 3 (harness_kill: 4, disk_full: 5)
MATRIX: dict[str, dict] = {
    "none": {},
    "ssh_drop": {"after_ms": 3},
    "ocs_deny": {"count": 2},
    "ocs_silence": {"count": 1},
    "line_garbage": {"count": 3},
    "line_drop": {"count": 3},
    "port_never_up": {},
    "port_flap": {"flaps": 3, "flap_ms": 1.0},
    "clock_step": {"step_ms": 50},
    "slow_host": {"delay_ms": 20},
    "harness_kill": {},
    "disk_full": {},
    "mixed": {},  # every transient kind at once, each with probability MIXED_P per cycle (seeded)
}
MIXED = ("ssh_drop", "ocs_deny", "ocs_silence", "line_garbage", "line_drop", "port_never_up", "port_flap",
         "clock_step", "slow_host")
MIXED_P = 0.1


def playbook(path: Path, kind: str, cycles: int, params: dict) -> Path:
    step = {"type": "turnaround", "name": "measure", "cycle_timeout_s": 5, "ocs_timeout_s": 1.0,
            "clock_warmup_s": 0.5}
    if kind == "mixed":
        step["faults"] = [{"kind": k, "probability": MIXED_P, **MATRIX[k]} for k in MIXED]
    elif kind != "none":
        at = {"harness_kill": 4, "disk_full": 5}.get(kind, 3)
        step["faults"] = [{"kind": kind, "cycles": [at], **params}]
    path.write_text(yaml.safe_dump({"name": f"faults-{kind}", "seed": 7, "cycles": cycles, "steps": [step]}))
    return path


def harness(*args: str, timeout: float = 300) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "harness", *args], capture_output=True, timeout=timeout, cwd=ROOT)


def score(run: Path) -> dict:
    events = pd.read_parquet(run / "events.parquet")
    truth = pd.read_parquet(run / "ground_truth.parquet") if (run / "ground_truth.parquet").exists() else None
    manifest = json.loads((run / "manifest.json").read_text())
    summary = json.loads((run / "summary.json").read_text())
    measured = events[events["cycle"] > 0]
    cycles = sorted(measured["cycle"].unique())
    faulted = sorted(measured.loc[measured["stage"] == "fault", "cycle"].unique())
    row = {"cycles_ok": len(cycles) - len(faulted), "cycles_faulted": len(faulted)}
    lost_ok = lost_faulted = true_events = 0
    if truth is not None:
        truth = truth[truth["cycle"].isin(cycles)]  # cycles never recorded (run stopped) are reported apart
        # a cycle's watch window ends when it stops watching (the restore after the last one is no event)
        watched = watched_truth(truth, pd.read_parquet(run / "cycles.parquet").set_index("cycle")["done_ns"].to_dict())
        missing = unrecorded(measured, watched)
        true_events = len(watched)
        lost_faulted = int(missing["cycle"].isin(faulted).sum())
        lost_ok = len(missing) - lost_faulted
    row.update(true_events=true_events, lost=lost_ok, missed_in_faulted=lost_faulted)
    step = summary["summary"]["steps"].get("measure", {})
    row["restored"] = manifest.get("extra", {}).get("restored", {})
    row["status"] = manifest.get("status")
    row["checks"] = [c["detail"] for c in step.get("checks", [])]
    row["sources"] = sorted({s.split(":")[0] for s in measured.loc[measured["stage"] == "fault", "source"]})
    fired = manifest.get("extra", {}).get("faults_injected", {}).get("measure", [])
    fired = [f for f in fired if f["kind"] not in ("harness_kill", "disk_full")]  # these stop the process
    row["injected"] = len(fired)
    row["labelled"] = sum(1 for f in fired if f["cycle"] in faulted)
    return row


def run_one(kind: str, profile: str, cycles: int, work: Path) -> dict:
    pb = playbook(work / f"{kind}.yaml", kind, cycles * (3 if kind == "mixed" else 1), MATRIX[kind])
    out = work / kind
    started = time.monotonic()
    first = harness("run", str(pb), "--bench", f"emulated:{profile}", "--out", str(out / "run"), "-q")
    rc = first.returncode
    (run,) = [p for p in out.iterdir() if p.is_dir()]
    resumed = None
    if kind == "harness_kill":
        resumed = harness("run", str(pb), "--bench", f"emulated:{profile}", "--resume", str(run), "-q")
    wall = time.monotonic() - started
    row = {"fault": kind, "exit": rc if resumed is None else f"{rc}->{resumed.returncode}", "wall_s": wall}
    if not (run / "summary.json").exists():
        row["error"] = (first.stderr.decode()[-300:] or "no run record")
        return row
    row.update(score(run))
    lines = (resumed or first).stderr.decode().strip().splitlines()
    row["stderr"] = lines[-1][:300] if lines else ""
    return row


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--profile", default="burst-mode")
    ap.add_argument("--cycles", type=int, default=8)
    ap.add_argument("--only", nargs="*", choices=list(MATRIX))
    args = ap.parse_args()
    rows = []
    with tempfile.TemporaryDirectory(prefix="fault-matrix-") as tmp:
        for kind in args.only or MATRIX:
            rows.append(run_one(kind, args.profile, args.cycles, Path(tmp)))
            r = rows[-1]
            print(f"{kind}: exit {r['exit']}, {r.get('error') or ''}", file=sys.stderr, flush=True)
    print(f"\nFault matrix: emulated:{args.profile}, {args.cycles} cycles per run, fault at cycle 3 "
          f"(harness_kill 4, disk_full 5); mixed: {3 * args.cycles} cycles, each of {len(MIXED)} kinds with "
          f"p={MIXED_P} per cycle. harness_kill: true events of the resumed part (the killed emulator's "
          f"truth dies with it); disk_full: cycles before the failed write.\n")
    print("| fault | exit | cycles ok | cycles faulted | injected / cycle labelled | true events | lost (ok cycles) "
          "| missed in faulted cycles | fault sources recorded | bench restored | wall s |")
    print("|---|---|---:|---:|---:|---:|---:|---:|---|---|---:|")
    for r in rows:
        if "error" in r:
            print(f"| {r['fault']} | {r['exit']} | – | – | – | – | – | – | {r['error']} | – | {r['wall_s']:.1f} |")
            continue
        restored = "yes" if r["restored"] and all(r["restored"].values()) else "NO"
        print(f"| {r['fault']} | {r['exit']} | {r['cycles_ok']} | {r['cycles_faulted']} | "
              f"{r['injected']} / {r['labelled']} | {r['true_events']} | "
              f"{r['lost']} | {r['missed_in_faulted']} | {', '.join(r['sources']) or '–'} | {restored} | "
              f"{r['wall_s']:.1f} |")
    notes = [f"- {r['fault']}: {r['stderr']}" for r in rows if r.get("stderr")]
    if notes:
        print("\nLast stderr line per run:\n" + "\n".join(notes))
    return 0 if all(r.get("lost", 1) == 0 for r in rows) else 1


if __name__ == "__main__":
    sys.exit(main())
