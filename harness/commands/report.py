"""`harness report RUN_DIR`: print a run's summary; rebuild events.parquet from the event log if the run was
interrupted before it could. `--recompute` rebuilds verdict.json (and report.md, plots) from the recorded
events and the verdict's recorded inputs, and says whether it is bit-identical to the one on disk."""
from __future__ import annotations


def register(sub) -> None:
    p = sub.add_parser("report", help="print a run's summary (rebuilds events.parquet if missing)",
                       description=__doc__)
    p.add_argument("run_dir", nargs="+", help="a run directory; several: their differences against the first, "
                   "per stage and claim, with intervals (cycle as unit)")
    p.add_argument("--recompute", action="store_true",
                   help="rebuild verdict.json from the recorded events; exit 1 if it differs from the old one")
    p.add_argument("--html", action="store_true",
                   help="write one self-contained HTML page: RUN_DIR/report.html, or comparison.html for several")
    p.add_argument("--out", help="with --html: where to write the page")
    p.add_argument("--junit", metavar="FILE", help="write the run's checks and claims as JUnit XML to FILE")
    p.set_defaults(func=_report)


def _report(args) -> int:
    from pathlib import Path

    from harness.errors import InputError
    from harness.eventlog import to_parquet

    for run in map(Path, args.run_dir):
        log = run / "events.jsonl"
        if not log.exists():
            raise InputError("not a run directory (no events.jsonl)", str(run))
        if not (run / "events.parquet").exists():
            frame = to_parquet(log, run / "events.parquet")
            print(f"rebuilt {run / 'events.parquet'} from the event log: {len(frame)} events")
    if args.html:
        from harness.html_report import write_html

        print(f"wrote {write_html([Path(d) for d in args.run_dir], Path(args.out) if args.out else None)}")
        return 0
    if args.out:
        raise InputError("--out goes with --html")
    if args.junit:
        if len(args.run_dir) > 1 or not (run / "summary.json").is_file():
            raise InputError("--junit takes one RUN_DIR with a run record (summary.json)")
        from harness.junit import write_junit

        print(f"wrote {write_junit(run, Path(args.junit))}")
        return 0
    if len(args.run_dir) > 1:
        if args.recompute:
            raise InputError("--recompute takes one RUN_DIR")
        from harness.html_report import difference_markdown, load_run

        print(difference_markdown([load_run(Path(d)) for d in args.run_dir]))
        return 0
    if args.recompute:
        return _recompute(run)
    for name in ("summary.md", *_step_reports(run)):
        if (run / name).exists():
            print((run / name).read_text())
    if not (run / "summary.md").exists():
        from analysis.stats import summarize_events
        from harness.eventlog import read_parquet_events
        from harness.record import summary_markdown

        events = read_parquet_events(run / "events.parquet")
        print(summary_markdown(summarize_events(events[events["cycle"] > 0], 0), title=f"Run {run.name} (partial)"))
    _recorrect(run)
    return 0


def _step_reports(run) -> list[str]:
    """The Markdown reports the run's steps declared (summary.json: steps.<name>.artifacts)."""
    import json

    path = run / "summary.json"
    steps = (json.loads(path.read_text()).get("summary") or {}).get("steps") or {} if path.exists() else {}
    declared = [a for s in steps.values() for a in s.get("artifacts", []) if a.endswith(".md")]
    return declared or ["report.md"]  # a run recorded before steps declared their files


def _recorrect(run) -> None:
    """Timestamps re-corrected with the final clock fit, from observations.jsonl (events.recorrected.parquet),
    with their accuracy before and after on an emulated bench."""
    from harness.bench.recorrect import accuracy_lines, recorrected_events
    from harness.eventlog import read_parquet_events

    again = recorrected_events(run)
    if again is None:
        return
    again.to_parquet(run / "events.recorrected.parquet", index=False)
    print(f"timestamps re-corrected with the final clock fit: {run / 'events.recorrected.parquet'} "
          f"({len(again)} events)")
    for line in accuracy_lines(run, read_parquet_events(run / "events.parquet"), again):
        print(line)


def _recompute(run) -> int:
    import json

    from harness.errors import InputError
    from harness.eventlog import read_parquet_events
    from harness.steps import mixnet as step

    path = run / "verdict.json"
    if not path.exists():
        raise InputError("--recompute: no verdict.json (the run never evaluated claims)", str(path))
    old_text = path.read_text()
    try:
        old = json.loads(old_text)
        inputs, prov = old["inputs"], old["provenance"]
        params, seed = dict(inputs["params"]), int(inputs["seed"])
    except (ValueError, KeyError, TypeError):
        raise InputError("--recompute: verdict.json has no recorded inputs (written by an older version?)",
                         str(path)) from None
    events = read_parquet_events(run / "events.parquet")
    verdict = step.compute_verdict(events, params, seed, prov, inputs.get("late_cycles"))
    new_text = step.verdict_json_text(verdict)
    step.write_outputs(run, events, verdict)
    if new_text == old_text:
        print(f"{path}: recomputed from {len(events)} recorded events: bit-identical")
        return 0
    print(f"{path}: recomputed from {len(events)} recorded events: DIFFERS from the previous verdict.json "
          f"(the new one is written)")
    return 1
