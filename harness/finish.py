"""End of a run: Parquet from the log, ground truth (emulated benches), summary, then one immutable
RunRecord handed to the writers (harness.record).

Cycle 0 of a turnaround step brings the bench into the pattern's first state from whatever it was: it is
logged, but not summarised.
"""
from __future__ import annotations

from datetime import datetime, timezone

import pandas as pd

from analysis.stages import OPTIONAL_STAGES
from harness import record as rec
from harness.bench.emulated import emulated_clocks, truth_frame
from harness.clock import source_warnings
from harness.eventlog import GroundTruth, read_parquet_events
def _with_earlier(ctx, frame: pd.DataFrame, name: str) -> pd.DataFrame:
    """A resumed run's table holds every cycle: the rows an earlier attempt recorded up to the resume
    point (per step where the table names it), then this attempt's."""
    path = ctx.run_dir / name
    if not ctx.resume_after or not path.exists():
        return frame
    earlier = pd.read_parquet(path)
    if "step" in earlier:
        keep = earlier["cycle"] <= earlier["step"].map(ctx.resume_after).fillna(0)
    else:
        keep = earlier["cycle"] <= min(ctx.resume_after.values())
    return pd.concat([earlier[keep], frame], ignore_index=True) if len(frame) else earlier[keep]


def write_ground_truth(ctx, truth: pd.DataFrame) -> None:
    gt = GroundTruth()
    for row in truth.itertuples(index=False):
        gt.add(row.cycle, row.stage, row.host, row.port, row.t_ns)
    gt.write(ctx.run_dir / "ground_truth.parquet")
    # Every delay the emulator drew, keyed (command, port, stage): the same seed gives the same file.
    draws = ctx.emulated.physics.draws_frame()
    draws.drop(columns="late_ns").to_parquet(ctx.run_dir / "ground_truth_delays.parquet", index=False)


def build_summary(ctx, events: pd.DataFrame, status: str, wall_s: float) -> dict:
    from analysis.stats import summarize_events

    measured = events[events["cycle"] > 0]
    summary = {"status": status, "wall_s": round(wall_s, 3), "bench": ctx.bench.name,
               "faults": int((events["stage"] == "fault").sum()),
               "steps": {name: {"ok": r.ok, "checks": r.checks, "artifacts": list(r.artifacts)}
                         for name, r in ctx.results.items()}}
    if len(measured):
        summary["delays_ms"] = summarize_events(measured, ctx.seed)
    stalls = events[(events["stage"] == "fault") & events["source"].astype(str).str.startswith("watch-stall:")]
    if len(stalls):  # a host's watch went silent: those cycles' unreported stages are unobserved, not inferred
        summary["watch_stalls"] = {"cycles": int(stalls["cycle"].nunique()),
                                   "hosts": {str(h): int(n) for h, n in stalls.groupby("host")["cycle"].nunique().items()}}
    from analysis.accuracy import OCS_TRUTH_STAGES
    from harness.events import STAGES

    # the recorded stages' truth and the switch's own record, from one copy of the emulator's truth
    truth = truth_frame(ctx.emulated, [tuple(w) for r in ctx.results.values() for w in r.truth_windows],
                        STAGES + OCS_TRUTH_STAGES)
    if truth is not None:
        from analysis.accuracy import (KEY, accuracy_table, match, ocs_command_check, ocs_command_table,
                                       unrecorded, watched_truth)

        of_switch = truth["stage"].isin(OCS_TRUTH_STAGES)
        truth, switch_truth = truth[~of_switch], truth[of_switch]
        truth = _with_earlier(ctx, truth, "ground_truth.parquet")
        write_ground_truth(ctx, truth)
        summary["emulator"] = ctx.emulated.physics.schedule_report()
        matched = match(measured, truth)
        if len(matched):
            summary["accuracy"] = accuracy_table(matched).to_dict(orient="records")
        # this process's cycles, each while it watched: true events without a recorded one
        # an optional stage (CMIS states) the bench's tools never showed in this run is unobservable here, not lost
        unseen = set(OPTIONAL_STAGES) - set(measured["stage"].astype(str))
        watched = watched_truth(truth[~truth["stage"].isin(unseen)],
                                {o.cycle: o.done_ns for r in ctx.results.values() for o in r.cycles})
        if len(watched):
            lost = unrecorded(measured, watched)
            silent = lost[~lost["cycle"].isin(measured.loc[measured["stage"] == "fault", "cycle"])]
            summary["lost_events"] = {"true": len(watched), "in_ok_cycles": len(silent),
                                      "in_faulted_cycles": len(lost) - len(silent),
                                      "first_in_ok_cycles": [[int(c), str(st), str(h), str(p)] for c, st, h, p in
                                                             silent[KEY].head(5).itertuples(index=False)]}
        # this process's switch record only: a resumed run's earlier cycles have none (their n says so)
        check = ocs_command_check(measured, switch_truth)
        if len(check):
            summary["ocs_command"] = ocs_command_table(check)
    for name, r in ctx.results.items():
        if r.summary:
            summary.setdefault("results", {})[name] = r.summary
    return summary


def summary_markdown(ctx, summary: dict) -> str:
    lines = [f"# Run {ctx.run_id}", "", f"Playbook `{ctx.playbook.name}` on `{ctx.bench.name}`: "
             f"**{summary['status']}** in {summary['wall_s']:.1f} s; faults: {summary['faults']}.", ""]
    if summary.get("delays_ms"):
        lines.append(rec.summary_markdown(summary["delays_ms"], title="Delays after ocs_command_sent")
                     .replace("# Delays", "## Delays", 1))
    if summary.get("accuracy"):
        lines += ["## Timestamps against emulator ground truth", "",
                  "| stage | n | abs error p50 (ms) | p99 (ms) | bias (ms) | true time within ± uncertainty |",
                  "|---|---:|---:|---:|---:|---:|"]
        for r in summary["accuracy"]:
            lines.append(f"| {r['stage']} | {r['n']} | {r['abs_err_p50_ms']:.4f} | {r['abs_err_p99_ms']:.4f} | "
                         f"{r['bias_ms']:+.4f} | {100 * r['coverage']:.2f} % |")
        lines.append("")
    if summary.get("lost_events"):
        lines += [lost_line(summary["lost_events"]), ""]
    if summary.get("watch_stalls"):
        w = summary["watch_stalls"]
        lines += [f"⚠ watch stalled (no line or heartbeat within its deadline) in {w['cycles']} cycles "
                  f"({', '.join(f'{h}: {n}' for h, n in w['hosts'].items())}): those cycles are faulted and their "
                  "ports' unreported stages unobserved, never inferred.", ""]
    for line in ctx.manifest_extra.get("unobserved_stages") or []:  # the preflight's: never silent
        lines += [f"⚠ stages not observed: {line}", ""]
    for host, r in (summary.get("clock_replies_by_read") or {}).items():
        lines += [f"⚠ clock probe replies of `{host}` dated by their read, not the kernel's receive stamp "
                  f"({read_dated(r)}): their samples count the SSH hub's backlog in their delay (wider bounds, "
                  "still bounds).", ""]
    for warning in summary.get("clock_source_warnings", ()):
        lines += [f"⚠ {warning}", ""]
    if summary.get("ocs_command"):
        lines += ["## OCS command against the switch's record", "", ocs_command_line(summary["ocs_command"]), ""]
    if summary.get("emulator"):
        lines += ["## Emulator schedule", "", emulator_line(summary["emulator"]), "",
                  "| stage | n | profile p50 (ms) | profile p99 | realised p50 | realised p99 | lateness p99 | KS p |",
                  "|---|---:|---:|---:|---:|---:|---:|---:|"]
        for stage, r in summary["emulator"]["stages"].items():
            ks = "–" if r["ks_p"] is None else f"{r['ks_p']:.3g}"
            lines.append(f"| {stage}{' ⚠' if r['missed'] else ''} | {r['n']} | {r['profile_p50_ms']:.4f} | "
                         f"{r['profile_p99_ms']:.4f} | {r['realised_p50_ms']:.4f} | {r['realised_p99_ms']:.4f} | "
                         f"{r['late_p99_ms']:.4f} | {ks} |")
        lines.append("")
    from harness.gpu_view import markdown as gpu_markdown

    lines += gpu_markdown(ctx.manifest_extra.get("gpu_view") or {})
    checks = [(n, c) for n, s in summary["steps"].items() for c in s["checks"]]
    if checks:
        lines += ["## Checks", ""] + [f"- {'✔' if c['ok'] else '✘'} {n}: {c['name']} — {c.get('detail', '')}"
                                      for n, c in checks] + [""]
    files = [(n, s["artifacts"]) for n, s in summary["steps"].items() if s.get("artifacts")]
    if files:
        lines += ["## Step files", ""] + [f"- {n}: {', '.join(f'`{a}`' for a in names)}" for n, names in files] + [""]
    lines += [r.summary_md for r in ctx.results.values() if r.summary_md]
    return "\n".join(lines) + "\n"


def read_dated(r: dict) -> str | None:
    """Which of a host's probe replies (`SshTransport.receive_stamps`) were dated by their read, and why: "always:
    REASON", "N reads: REASON", or None when the kernel's receive stamp dated every one."""
    if r["stamp"] != "kernel":
        return f"always: {r['reason']}"
    return f"{r['fallbacks']} reads: {r['reason']}" if r["fallbacks"] else None


def ocs_command_line(r: dict) -> str:
    """One line: did each cycle's recorded send precede the command's arrival at the switch, and by how much?"""
    verdict = "every recorded send precedes" if r["not_causal"] == 0 else \
        f"**{r['not_causal']} recorded sends come after**"
    by = r.get("arrived_by") or {}
    dated = "its kernel receive stamp" if set(by) == {"kernel"} else \
        "when the switch handled it, after it arrived: the transits are upper bounds" if set(by) == {"handled"} \
        else ", ".join(f"{n} by {'its kernel receive stamp' if k == 'kernel' else 'when handled'}" for k, n in by.items())
    line = (f"Over {r['n']} cycles, {verdict} the first changing command's arrival at the switch ({dated}): "
            f"transit p50 {r['transit_p50_ms']:.4f} ms, p99 {r['transit_p99_ms']:.4f} ms, max "
            f"{r['transit_max_ms']:.4f} ms — counted in every turnaround, which starts at the send.")
    if r["settled_to_completed_n"]:
        line += (f" The completion came p50 {r['settled_to_completed_p50_ms']:.4f} ms, p99 "
                 f"{r['settled_to_completed_p99_ms']:.4f} ms after the cycle's last mirror settled"
                 + (f" ({r['completed_before_settled']} cycles' completions, bound included, before it)."
                    if r["completed_before_settled"] else "."))
    return line


def lost_line(lost: dict) -> str:
    """The true stage events, while their cycles were watched, that have no recorded event."""
    head = (f"of {lost['true']} true stage events while their cycles were watched, {lost['in_ok_cycles']} in ok "
            f"cycles and {lost['in_faulted_cycles']} in faulted cycles (each with its fault events) have no recorded event")
    if lost["in_ok_cycles"]:
        return f"WARNING: {head}; lost silently: {', '.join(':'.join(map(str, k)) for k in lost['first_in_ok_cycles'])}"
    return head[0].upper() + head[1:] + "."


def emulator_line(report) -> str:
    """One line: did the emulated bench keep its own profile on this machine?"""
    late = report["lateness_ms"]
    head = (f"lateness p50 {late['p50_ms']:.3f} ms, p99 {late['p99_ms']:.3f} ms, max {late['max_ms']:.3f} ms "
            f"over {late['n']} scheduled actions")
    if report.get("warning"):
        return f"WARNING: {report['warning']} ({head}; stage times are due times, deliveries ran late)"
    return f"on schedule: realised delays match the profile in every stage ({head})"


def write_markdown(ctx, summary: dict):
    def writer(record: rec.RunRecord):
        return rec.write_text_atomic(record.run_dir / "summary.md", summary_markdown(ctx, summary))
    return writer


def write_cycles(ctx, events: pd.DataFrame) -> None:
    """Per-cycle bookkeeping of measuring steps (harness clock): begin, command sent/completed, done. On a
    resumed run the earlier cycles come from the earlier attempt's table, or, where a SIGKILL left none,
    from the event log (`recorded: events`: command times and status only)."""
    rows = [{"step": name, **c.row(), "recorded": "live"} for name, r in ctx.results.items() for c in r.cycles]
    frame = pd.DataFrame(rows)
    frame = _with_earlier(ctx, frame, "cycles.parquet")
    for step, last in ctx.resume_after.items():
        known = set(frame.loc[frame["step"] == step, "cycle"]) if len(frame) else set()
        missing = [c for c in range(1, last + 1) if c not in known]
        if missing and len(ctx.resume_after) == 1:  # events carry no step name: unambiguous with one step
            frame = pd.concat([frame, _cycles_from_events(events, step, missing)], ignore_index=True)
    if len(frame):
        for column in ("begin_ns", "sent_ns", "completed_ns", "done_ns"):
            frame[column] = frame[column].astype("Int64")
        frame.sort_values(["step", "cycle"], kind="stable").to_parquet(ctx.run_dir / "cycles.parquet", index=False)


def _cycles_from_events(events: pd.DataFrame, step: str, cycles: list[int]) -> pd.DataFrame:
    rows = []
    for cycle in cycles:
        e = events[events["cycle"] == cycle]
        sent = e.loc[e["stage"] == "ocs_command_sent", "t_ns"]
        done = e.loc[e["stage"] == "ocs_command_completed", "t_ns"]
        rows.append({"step": step, "cycle": cycle, "status": "faulted" if (e["stage"] == "fault").any() else "ok",
                     "begin_ns": pd.NA, "sent_ns": int(sent.min()) if len(sent) else pd.NA,
                     "completed_ns": int(done.max()) if len(done) else pd.NA, "done_ns": pd.NA,
                     "recorded": "events"})
    return pd.DataFrame(rows)


def finish_run(ctx, manifest: dict, *, status: str, wall_s: float, started_utc: str) -> rec.RunRecord:
    ctx.log.write_parquet(ctx.run_dir / "events.parquet")
    events = read_parquet_events(ctx.run_dir / "events.parquet")
    write_cycles(ctx, events)
    summary = build_summary(ctx, events, status, wall_s)
    clocks = ctx.clock_tables()
    # hosts whose clock probes' replies were (sometimes) dated by their read, not by the kernel: still bounds,
    # wider by the hub's backlog then
    by_read = {c["host"]: c["reply_stamps"] for c in clocks if c.get("reply_stamps") and read_dated(c["reply_stamps"])}
    if by_read:
        summary["clock_replies_by_read"] = by_read
    warnings = source_warnings(clocks)
    if warnings:
        summary["clock_source_warnings"] = warnings
    manifest = {**manifest, "clock": clocks or manifest.get("clock"), "status": status,
                "extra": {**manifest.get("extra", {}), **ctx.manifest_extra}}
    if ctx.emulated is not None:
        manifest["emulated_clocks"] = emulated_clocks(ctx.emulated)
    record = rec.RunRecord(run_id=ctx.run_id, run_dir=ctx.run_dir, playbook=ctx.playbook.name,
                           outcome={"ok": "completed"}.get(status, status), started_utc=started_utc,
                           ended_utc=datetime.now(timezone.utc).isoformat(timespec="seconds"),
                           manifest=rec.to_jsonable(manifest), summary=rec.to_jsonable(summary),
                           error=ctx.manifest_extra.get("error"),
                           artifacts=[a for r in ctx.results.values() for a in r.artifacts])
    rec.publish(record, (rec.write_manifest, rec.write_summary_json, write_markdown(ctx, summary)))
    return record


def console_summary(ctx, record: rec.RunRecord) -> None:
    """One screen at the end of a run: stage delays, accuracy against truth, checks."""
    from rich.table import Table

    from analysis.stats import p99_interval_text
    from harness import logs

    def say(text) -> None:  # quiet: into console.log only
        logs.echo(text, quiet=ctx.quiet)

    summary = record.summary
    delays = summary.get("delays_ms")
    if delays:
        table = Table(title=f"{ctx.playbook.name}: delays after ocs_command_sent (ms)", title_justify="left")
        for column in ("stage", "n", "mean", "p50", "p99", "p99 95 % CI"):
            table.add_column(column, justify="left" if column == "stage" else "right")
        rows = [("OCS command → completed", delays["ocs_switch"])] + list(delays["stages"].items())[1:] + [
            ("turnaround (last first packet)", delays["turnaround"])]
        for name, s in rows:
            if s["n"]:
                table.add_row(name, str(s["n"]), f"{s['mean']:.3f}", f"{s['p50']:.3f}", f"{s['p99']:.3f}",
                              p99_interval_text(s))
        say(table)
    accuracy = {r["stage"]: r for r in summary.get("accuracy", ())}
    if "all" in accuracy:
        a = accuracy["all"]
        say(f"vs emulator truth: |error| p50 {a['abs_err_p50_ms']:.3f} ms, p99 {a['abs_err_p99_ms']:.3f} ms, "
            f"{100 * a['coverage']:.1f} % within ±uncertainty (n={a['n']})")
    if summary.get("lost_events"):
        line = lost_line(summary["lost_events"])
        say(f"lost events: {'[yellow]' + line + '[/]' if line.startswith('WARNING') else line}")
    for warning in summary.get("clock_source_warnings", ()):
        say(f"[yellow]WARNING: {warning}[/]")
    if summary.get("emulator"):
        line = emulator_line(summary["emulator"])
        say(f"emulator: {'[yellow]' + line + '[/]' if line.startswith('WARNING') else line}")
    for name, results in summary.get("results", {}).items():
        say(f"{name}: " + ", ".join(f"{k} [bold]{v:.3g}[/]" if isinstance(v, float) else f"{k} [bold]{v}[/]"
                                    for k, v in results.items() if isinstance(v, (str, int, float))))
    for name, step in summary.get("steps", {}).items():
        for check in step["checks"]:
            mark = "[green]✔[/]" if check["ok"] else "[red]✘[/]"
            say(f"{mark} {name}: {check['name']} — {check.get('detail', '')}")
