"""End of a run: Parquet from the log, ground truth (emulated benches), summary, then one immutable
RunRecord handed to the writers (harness.record).

Cycle 0 of a turnaround step brings the bench into the pattern's first state from whatever it was: it is
logged, but not summarised.
"""
from __future__ import annotations

from datetime import datetime, timezone

import numpy as np
import pandas as pd
import pyarrow as pa

from analysis.stages import OPTIONAL_STAGES
from harness import record as rec
from harness.bench.emulated import emulated_clocks
from harness.clock import source_warnings
from harness.eventlog import (EVENT_DTYPES, GROUND_TRUTH_DTYPES, _fsync_replace, _typed_frame)
from harness.events import EVENT_COLUMNS, GROUND_TRUTH_COLUMNS
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


BLOCK_CYCLES = 512  # cycles read at once at a run's end: memory holds a block's events and truth (~35 MB), not a campaign's


class EventBlocks:
    """events.parquet a block of cycles at a time (typed as `read_parquet_events` gives them), in cycle order:
    every summary of a run is per cycle, or a reduction of per-cycle tables. A block reads the row groups whose
    cycles meet it (their statistics say which) and keeps them for the next block, which mostly begins inside the
    last of them: each row group is decoded about once, not once per block that meets it."""

    def __init__(self, path):
        import pyarrow.dataset as ds
        import pyarrow.parquet as pq

        self.dataset = ds.dataset(path, format="parquet")
        self.file = pq.ParquetFile(path)
        meta, column = self.file.metadata, EVENT_COLUMNS.index("cycle")
        self.ranges = []  # per row group: (lowest, highest) cycle, None where the statistics do not say
        for g in range(meta.num_row_groups):
            st = meta.row_group(g).column(column).statistics
            self.ranges.append((st.min, st.max) if st is not None and st.has_min_max else None)
        known = [r for r in self.ranges if r is not None]
        self.first = min((lo for lo, _ in known), default=0)
        self.last = max((hi for _, hi in known), default=-1)
        self._groups: dict[int, pa.Table] = {}

    def blocks(self, first: int | None = None, last: int | None = None):
        """(events of cycles [a, b), a, b) for consecutive blocks from `first` to `last` (default: the first and
        the last cycle recorded)."""
        for a in range(self.first if first is None else first, (self.last if last is None else last) + 1,
                       BLOCK_CYCLES):
            yield self.of_cycles(a, a + BLOCK_CYCLES), a, a + BLOCK_CYCLES

    def of_cycles(self, a: int, b: int) -> pd.DataFrame:
        import pyarrow.compute as pc

        wanted = [g for g, r in enumerate(self.ranges) if r is None or (r[0] < b and r[1] >= a)]
        self._groups = {g: self._groups.get(g) or self.file.read_row_group(g) for g in wanted}
        if not wanted:
            return _typed_frame([], EVENT_COLUMNS, EVENT_DTYPES)
        table = pa.concat_tables([self._groups[g] for g in wanted])
        cycle = table.column("cycle")
        table = table.filter(pc.and_(pc.greater_equal(cycle, a), pc.less(cycle, b)))
        return self._typed(table)

    def frame(self, where) -> pd.DataFrame:
        return self._typed(self.dataset.to_table(filter=where))

    @staticmethod
    def _typed(table: pa.Table) -> pd.DataFrame:
        if not len(table):
            return _typed_frame([], EVENT_COLUMNS, EVENT_DTYPES)
        strings = pd.StringDtype("pyarrow")
        frame = table.to_pandas(types_mapper=lambda t: strings if t in (pa.string(), pa.large_string()) else None)
        return frame[list(EVENT_COLUMNS)].astype(EVENT_DTYPES)

    def stages(self, where) -> set[str]:
        """The distinct stages of the events where `where` holds (one column read, a batch at a time)."""
        import pyarrow.compute as pc

        seen: set[str] = set()
        for batch in self.dataset.to_batches(columns=["stage"], filter=where):
            seen.update(pc.unique(batch.column(0)).to_pylist())
        return seen


TRUTH_ROWS = 1 << 16  # rows of the emulator's truth log read at once (~1 000 cycles of an 8-port bench)


class TruthBlocks:
    """The emulator's ground truth of `stages` with each row's cycle (`analysis.accuracy.assign_cycles`, cycles ≥ 1
    only), handed out a block of cycles at a time in the order it happened. The truth log is read a chunk of rows at
    a time; what is kept per row is its cycle, on disk (a campaign's ~10^7 rows), and per chunk the cycles it spans."""

    def __init__(self, emulated, cycle_starts: list[tuple[int, int]], stages):
        from analysis.accuracy import CycleIndex
        from devices.emulated.columns import Column

        self.emulated, self.stages = emulated, stages
        self.cycles = Column("i")  # each kept-stage row's cycle, in log order
        self.chunks: list[tuple[int, int, int, int, int]] = []  # log rows [start, stop), first cycle row, cycles
        self._read: dict[int, tuple] = {}  # the last block's chunks as read, by their first row
        self.last = 0
        cycle_of = CycleIndex(cycle_starts)  # sorted once, not once a chunk (a campaign: ~10^5 starts, ~150 chunks)
        n = emulated.physics.truth_rows()  # rows logged later (the bench still runs) are not this run's
        rows = TRUTH_ROWS
        for start in range(0, n, rows):
            t = emulated.ground_truth_columns(stages, start, min(n, start + rows))[0]
            cycle = cycle_of(t)
            at = len(self.cycles)
            self.cycles.extend(np.maximum(cycle, -1))  # (before the first start: -1, dropped as cycles < 1 are)
            kept = cycle[cycle >= 1]
            if len(kept):
                self.chunks.append((start, min(n, start + rows), at, int(kept.min()), int(kept.max())))
                self.last = max(self.last, int(kept.max()))

    def of_cycles(self, a: int, b: int) -> pd.DataFrame:
        from devices.emulated.truth import truth_frame

        parts, read = [], {}
        for start, stop, at, lowest, highest in self.chunks:
            if lowest < b and highest >= a:  # (kept for the next block, which mostly begins in the last chunk)
                read[start] = self._read.get(start) or self.emulated.ground_truth_columns(self.stages, start, stop)
                t, code, keys, halfwidth = read[start]
                cycle = self.cycles.numpy(at, at + len(t))
                rows = (cycle >= max(a, 1)) & (cycle < b)
                parts.append((t[rows], code[rows], keys, None if halfwidth is None else halfwidth[rows], cycle[rows]))
        self._read = read
        if not parts:
            t, code, keys, halfwidth = self.emulated.ground_truth_columns(self.stages, 0, 0)
            parts = [(t, code, keys, halfwidth, np.array([], dtype=np.int64))]
        keys = parts[-1][2]  # the codes index one growing list of keys: the latest read holds every earlier code
        frame = truth_frame(np.concatenate([p[0] for p in parts]), np.concatenate([p[1] for p in parts]), keys,
                            None if parts[0][3] is None else np.concatenate([p[3] for p in parts]))
        frame["cycle"] = np.concatenate([p[4] for p in parts]).astype("int64")
        return frame


class GroundTruthFile:
    """ground_truth.parquet written a block at a time (a resumed run's: the earlier attempt's rows up to the resume
    point first, as `_with_earlier` keeps them), replacing the earlier file once complete."""

    def __init__(self, ctx):
        import pyarrow.parquet as pq

        self.path = ctx.run_dir / "ground_truth.parquet"
        self.tmp = self.path.with_name(self.path.name + ".tmp")
        self.schema = pa.Schema.from_pandas(_typed_frame([], GROUND_TRUTH_COLUMNS, GROUND_TRUTH_DTYPES),
                                            preserve_index=False)
        self.writer = pq.ParquetWriter(self.tmp, self.schema)
        self.earlier = None
        if ctx.resume_after and self.path.exists():
            import pyarrow.dataset as ds

            self.earlier = ds.dataset(self.path, format="parquet")
            limit = min(ctx.resume_after.values())
            for batch in self.earlier.to_batches(filter=pc_field("cycle") <= limit):
                self.write(batch.to_pandas())
            self.earlier_limit = limit

    def earlier_of(self, a: int, b: int) -> pd.DataFrame | None:
        """The earlier attempt's rows of cycles [a, b) (kept: up to the resume point), or None."""
        if self.earlier is None or a > self.earlier_limit:
            return None
        cycle = pc_field("cycle")
        table = self.earlier.to_table(filter=(cycle >= a) & (cycle < b) & (cycle <= self.earlier_limit))
        return table.to_pandas() if len(table) else None

    def write(self, truth: pd.DataFrame) -> None:
        if "truth_halfwidth_ns" not in truth:  # exact truth
            truth = truth.assign(truth_halfwidth_ns=0)
        frame = truth[list(GROUND_TRUTH_COLUMNS)].astype(GROUND_TRUTH_DTYPES)
        if len(frame):
            self.writer.write_table(pa.Table.from_pandas(frame, schema=self.schema, preserve_index=False))

    def close(self) -> None:
        self.writer.close()
        _fsync_replace(self.tmp, self.path)


def pc_field(name: str):
    import pyarrow.compute as pc

    return pc.field(name)


def write_draws(ctx) -> None:
    """Every delay the emulator drew, keyed (command, port, stage): the same seed gives the same file. Written a
    block of draws at a time (a campaign draws ~10^7)."""
    import pyarrow.parquet as pq
    from devices.emulated.physics import DRAW_BLOCK

    physics, writer = ctx.emulated.physics, None
    n = physics.draw_count()
    try:
        for start in range(0, max(n, 1), DRAW_BLOCK):
            frame = physics.draws_frame(start, min(n, start + DRAW_BLOCK)).drop(columns=["late_ns", "due_ns"])
            table = pa.Table.from_pandas(frame, preserve_index=False)
            if writer is None:
                writer = pq.ParquetWriter(ctx.run_dir / "ground_truth_delays.parquet", table.schema)
            writer.write_table(table)
    finally:
        if writer is not None:
            writer.close()


class Spool:
    """A run's per-row and per-cycle values for its summary, on disk, a column a name (devices.emulated.columns):
    appended a block of cycles at a time, read back whole one column at a time for the exact statistics at the end
    (a column of 10^5 cycles × 8 ports is ~6 MB)."""

    CHUNK = 1 << 13  # values a column keeps in memory before they go to its file

    def __init__(self):
        self.columns: dict = {}

    def add(self, name: str, values, typecode: str = "d") -> None:
        from devices.emulated.columns import Column

        column = self.columns.get(name)
        if column is None:
            column = self.columns[name] = Column(typecode, self.CHUNK)
        column.extend(values)

    def __call__(self, name: str):
        column = self.columns.get(name)
        return column.numpy() if column is not None else np.array([], dtype=np.float64)


def build_summary(ctx, events: EventBlocks, status: str, wall_s: float) -> dict:
    """The run's summary, from events.parquet and the emulator's truth read once, a block of cycles at a time: each
    table below is per cycle (or per port of a cycle), so its blocks, in cycle order, are the table. What the
    summary needs of each block goes to disk (`Spool`) or into counts: memory holds a block, not a campaign."""
    from analysis.accuracy import KEY, OCS_TRUTH_STAGES, accuracy_rows, add_counts, match, ocs_command_check, \
        ocs_command_numbers, ocs_command_parts, unrecorded, watched_truth
    from analysis.stats import cycle_columns, cycle_tables, summarize_columns
    from harness.events import STAGES

    truth = switch_truth = file = None
    last = events.last
    if ctx.emulated is not None:  # the recorded stages' truth and the switch's own record
        windows = [tuple(w) for r in ctx.results.values() for w in r.truth_windows]
        recorded = set(STAGES)
        if ctx.emulated.netns is not None:  # real frames cross the namespaces: the modelled first packet is not truth
            recorded.discard("first_packet")
        truth = TruthBlocks(ctx.emulated, windows, recorded)
        switch_truth = TruthBlocks(ctx.emulated, windows, set(OCS_TRUTH_STAGES))
        last = max([last] + [t.last for t in (truth, switch_truth) if t.chunks])
        file = GroundTruthFile(ctx)
        # an optional stage (CMIS states) the bench's tools never showed in this run is unobservable here, not lost
        unseen = set(OPTIONAL_STAGES) - events.stages(pc_field("cycle") > 0)
        watched_until = pd.Series({o.cycle: o.done_ns for r in ctx.results.values() for o in r.cycles})
    stage_names = sorted(STAGES)
    spool, n_cycles, n_tables = Spool(), 0, 0
    faults, stalled_cycles, stalled_hosts = 0, 0, {}
    n_watched, lost_ok, lost_faulted, first_lost, command_counts = 0, 0, 0, [], {}
    for block, a, b in events.blocks(min(events.first, 1), last):
        faulted = block[(block["stage"] == "fault").to_numpy(bool, na_value=False)]
        faults += len(faulted)
        stalls = faulted[faulted["source"].astype(str).str.startswith("watch-stall:")]
        stalled_cycles += int(stalls["cycle"].nunique())  # blocks are disjoint sets of cycles: their counts add
        for host, n in stalls.groupby("host")["cycle"].nunique().items():
            stalled_hosts[str(host)] = stalled_hosts.get(str(host), 0) + int(n)
        measured = block[block["cycle"] > 0]
        if len(measured):
            part = cycle_tables(measured)
            for name, values in cycle_columns(part).items():
                spool.add(name, values, "q" if name == "cycle" else "d")
            n_cycles, n_tables = n_cycles + part["cycles"], n_tables + 1
        if truth is None or b <= 1:
            continue
        true = truth.of_cycles(a, b)
        file.write(true)
        earlier = file.earlier_of(a, b)
        if earlier is not None:  # a resumed run's earlier cycles: their truth from the earlier attempt
            true = pd.concat([earlier, true], ignore_index=True)
        pairs = match(measured, true)
        stage, error, covered = pairs["stage"].astype(str).to_numpy(), pairs["error_ns"].to_numpy("int64"), \
            pairs["covered"].to_numpy(bool)
        spool.add("error:all", error, "q")
        spool.add("covered:all", covered, "b")
        for name in stage_names:  # each stage's rows in their order, as a groupby of the whole run's gives them
            rows = stage == name
            if rows.any():
                spool.add(f"error:{name}", error[rows], "q")
                spool.add(f"covered:{name}", covered[rows], "b")
        # this process's cycles, each while it watched: true events without a recorded one
        watched = watched_truth(true[~true["stage"].isin(unseen)], watched_until)
        if len(watched):
            n_watched += len(watched)
            lost = unrecorded(measured, watched)
            silent = lost[~lost["cycle"].isin(faulted["cycle"])]
            lost_ok, lost_faulted = lost_ok + len(silent), lost_faulted + len(lost) - len(silent)
            first_lost += [[int(c), str(st), str(h), str(p)] for c, st, h, p in
                           silent[KEY].head(5 - len(first_lost)).itertuples(index=False)]
        # this process's switch record only: a resumed run's earlier cycles have none (their n says so)
        counts, transit, after = ocs_command_parts(ocs_command_check(measured, switch_truth.of_cycles(a, b)))
        add_counts(command_counts, counts)
        spool.add("transit", transit)
        spool.add("after", after)
    summary = {"status": status, "wall_s": round(wall_s, 3), "bench": ctx.inventory.name, "faults": faults,
               "steps": {name: {"ok": r.ok, "checks": r.checks, "artifacts": list(r.artifacts)}
                         for name, r in ctx.results.items()}}
    if n_tables:
        summary["delays_ms"] = summarize_columns(spool, n_cycles, ctx.seed)
    if stalled_cycles:  # a host's watch went silent: those cycles' unreported stages are unobserved, not inferred
        summary["watch_stalls"] = {"cycles": stalled_cycles, "hosts": dict(sorted(stalled_hosts.items()))}
    if truth is not None:
        file.close()
        write_draws(ctx)
        summary["emulator"] = ctx.emulated.physics.schedule_report()
        if "error:all" in spool.columns and len(spool.columns["error:all"]):
            read = lambda name: lambda: (spool(f"error:{name}"), spool(f"covered:{name}").astype(bool))  # noqa: E731
            summary["accuracy"] = accuracy_rows([(name, read(name)) for name in stage_names
                                                 if f"error:{name}" in spool.columns] + [("all", read("all"))]
                                                ).to_dict(orient="records")
        if n_watched:
            summary["lost_events"] = {"true": n_watched, "in_ok_cycles": lost_ok, "in_faulted_cycles": lost_faulted,
                                      "first_in_ok_cycles": first_lost}
        if command_counts.get("n"):
            summary["ocs_command"] = ocs_command_numbers(command_counts, spool("transit"), spool("after"))
    for name, r in ctx.results.items():
        if r.summary:
            summary.setdefault("results", {})[name] = r.summary
    return summary


def claim_sentences(summary: dict) -> list[str]:
    """Every step's causal sentence per claim (a step's summary `claims`), in step order."""
    return [x for r in (summary.get("results") or {}).values() for x in r.get("claims") or [] if isinstance(x, str)]


def summary_markdown(ctx, summary: dict) -> str:
    from harness import glossary

    lines = [f"# Run {ctx.run_id}", "", f"Playbook `{ctx.playbook.name}` on `{ctx.inventory.name}`: "
             f"**{summary['status']}** in {summary['wall_s']:.1f} s; faults: {summary['faults']}.", ""]
    opening = [f"- **{x}**" for x in claim_sentences(summary)]
    lines += opening + [""] if opening else []
    at = len(lines)  # the terms go under the opening, naming what the whole summary uses
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
    lines[at:at] = glossary.markdown("\n".join(lines))
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
    head = (f"its thread ran {late['n']} actions p50 {late['p50_ms']:.3f} ms, p99 {late['p99_ms']:.3f} ms, max "
            f"{late['max_ms']:.3f} ms after due; a change it shows itself appears at its due time")
    if report.get("warning"):
        return f"WARNING: {report['warning']} ({head})"
    return f"on schedule: realised delays match the profile in every stage ({head})"


def write_markdown(ctx, summary: dict):
    def writer(record: rec.RunRecord):
        return rec.write_text_atomic(record.run_dir / "summary.md", summary_markdown(ctx, summary))
    return writer


def write_cycles(ctx, events: EventBlocks) -> None:
    """Per-cycle bookkeeping of measuring steps (harness clock): begin, command sent/completed, done. On a
    resumed run the earlier cycles come from the earlier attempt's table, or, where a SIGKILL left none,
    from the event log (`recorded: events`: command times and status only)."""
    from harness.outcome import CycleOutcomes

    parts = [(r.cycles.frame() if isinstance(r.cycles, CycleOutcomes) else pd.DataFrame([c.row() for c in r.cycles]))
             .assign(recorded="live") for r in ctx.results.values()]
    frame = pd.concat([p.assign(step=name)[["step"] + list(p.columns)] for name, p in zip(ctx.results, parts)
                       if len(p)], ignore_index=True) if any(len(p) for p in parts) else pd.DataFrame()
    frame = _with_earlier(ctx, frame, "cycles.parquet")
    for step, last in ctx.resume_after.items():
        known = set(frame.loc[frame["step"] == step, "cycle"]) if len(frame) else set()
        missing = [c for c in range(1, last + 1) if c not in known]
        if missing and len(ctx.resume_after) == 1:  # events carry no step name: unambiguous with one step
            logged = events.frame(pc_field("cycle").isin(missing))
            frame = pd.concat([frame, _cycles_from_events(logged, step, missing)], ignore_index=True)
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
    events = EventBlocks(ctx.run_dir / "events.parquet")
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
    from rich.markup import escape
    from rich.table import Table

    from harness import logs

    def say(text) -> None:  # quiet: into console.log only
        logs.echo(text, quiet=ctx.quiet)

    summary = record.summary
    for sentence in claim_sentences(summary):
        say(f"[bold]{escape(sentence)}[/]")
    delays = summary.get("delays_ms")
    if delays:
        rows = [("OCS command → completed", delays["ocs_switch"])] + list(delays["stages"].items())[1:] + [
            ("turnaround (last first packet)", delays["turnaround"])]
        head, note = rec.p99_column([s for _, s in rows if s["n"]])
        table = Table(title=f"{ctx.playbook.name}: delays after ocs_command_sent (ms)", title_justify="left")
        for column in ("stage", "n", "cycles", "mean", "p50", "p99", head):
            table.add_column(column, justify="left" if column == "stage" else "right")
        for name, s in rows:
            if s["n"]:
                table.add_row(name, str(s["n"]), str(s.get("n_cycles", "–")), f"{s['mean']:.3f}", f"{s['p50']:.3f}",
                              f"{s['p99']:.3f}", rec.p99_cell(s, head))
        say(table)
        if note:
            say(note)
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
