"""Convert a run's host observations again, with the final clock fit (`harness report`).

During the run each cycle is converted when it ends, with the clock samples known then. Afterwards every
host's tracker can be rebuilt from all its samples (`observations.jsonl` keeps them, with each cycle's
arrivals), so every event is bounded by samples on both sides of it."""
from __future__ import annotations

import json
from pathlib import Path

import pandas as pd

from harness.bench.stages import Arrivals, OcsCommand, OcsStamps, PortRef, stage_events
from harness.clock import ClockSample, ClockTracker
from harness.events import EVENT_COLUMNS
from harness.bench.hosts import Observation


def read_observations(path: Path) -> tuple[dict[str, ClockTracker], list[dict]]:
    """Clock trackers rebuilt from every sample, and the cycle records, from observations.jsonl. A torn
    last line (the run died while writing it) is skipped."""
    trackers: dict[str, ClockTracker] = {}
    cycles = []
    for line in path.read_text(encoding="utf-8").splitlines():
        try:
            record = json.loads(line)
        except json.JSONDecodeError:
            continue
        kind = record.pop("k", None)
        if kind == "clock":
            host = record.pop("host")
            tracker = trackers.setdefault(host, ClockTracker(host))
            sample = ClockSample(**record)
            if not tracker.segments or sample.t_ns >= tracker.segments[-1].last_t:
                tracker.add(sample)
        elif kind == "cycle":
            cycles.append(record)
    return trackers, cycles


def recorrected_events(run_dir: Path, run_id: str | None = None) -> pd.DataFrame | None:
    """The run's events as the final clock fit converts them (None: the run kept no observations)."""
    path = Path(run_dir) / "observations.jsonl"
    if not path.exists():
        return None
    trackers, cycles = read_observations(path)
    convert = lambda host, host_ns: trackers[host].to_harness(host_ns)  # noqa: E731
    rows = []
    for c in cycles:
        ports = {k: PortRef(**p) for k, p in c["ports"].items()}
        arrivals = Arrivals(kept={(k, s): Observation(**o) for k, s, o in c["kept"]},
                            not_yet={(k, s): Observation(**o) for k, s, o in c["not_yet"]},
                            missing=c["missing"], lost=c["lost"], flaps=c["flaps"],
                            causes=[tuple(x) for x in c["causes"]], done_ns=c["done_ns"],
                            unobserved=c.get("unobserved", {}))
        rows += [e.to_dict() for e in stage_events(run_id or Path(run_dir).name, c["cycle"], ports, c["ocs"],
                                                   c["first_sent_ns"], c["completed_ns"], arrivals, convert,
                                                   ocs_stamps=OcsStamps(*c.get("ocs_stamps", ())),
                                                   commands=tuple(OcsCommand(ocs, sent, completed, OcsStamps(*stamps))
                                                                  for ocs, sent, completed, stamps in
                                                                  c.get("commands", ())))]
    return pd.DataFrame(rows, columns=list(EVENT_COLUMNS))


def accuracy_lines(run_dir: Path, events: pd.DataFrame, recorrected: pd.DataFrame) -> list[str]:
    """Accuracy against the emulator's ground truth, as recorded and as re-corrected (emulated runs)."""
    from analysis.accuracy import accuracy_table, match

    truth_path = Path(run_dir) / "ground_truth.parquet"
    if not truth_path.exists():
        return []
    truth = pd.read_parquet(truth_path)
    lines = ["| timestamps | n | abs error p50 (ms) | p99 (ms) | median half-width (ms) | within ± uncertainty |",
             "|---|---:|---:|---:|---:|---:|"]
    for label, frame in (("as recorded", events), ("re-corrected (final clock fit)", recorrected)):
        host = frame[(frame["cycle"] > 0) & (frame["host"] != "") & (frame["stage"] != "fault")]
        matched = match(host, truth)
        if matched.empty:
            continue
        a = accuracy_table(matched).set_index("stage").loc["all"]
        lines.append(f"| {label} | {int(a['n'])} | {a['abs_err_p50_ms']:.4f} | {a['abs_err_p99_ms']:.4f} | "
                     f"{matched['uncertainty_ns'].median() / 1e6:.4f} | {100 * a['coverage']:.2f} % |")
    return lines
