"""The `moe_traffic` step: a MoE trace's all-to-all phases as real transfers over the current circuits.

Endpoints are NIC ports ("host:netdev") of one OCS region; EP rank r of the trace's first group runs on
endpoint r. Before the phases of each iteration (`reconfigure: per_iteration`) or each regime
(`per_regime`: the trace's regime changes), MixNet's greedy circuits (one port per endpoint) are computed
on that demand, applied with `apply(..., exclusive=True)`, and the step waits until every re-pointed port
has trained a new link (`carrier_up_count` grew and the RDMA port is ACTIVE). `none` keeps the circuits
found at start.

Each phase runs the transfer command once per endpoint, all in parallel (one SSH connection per host), and
parses the tool's output (nccl-tests or perftest format). Per phase it records the measured time (the
slowest rank), the model's prediction (`analysis.mixnet.all_to_all_time` with the circuits in place),
bytes and circuits: `moe_traffic_<step>.parquet`, `moe_traffic_<step>.json`.

Each phase's row is appended to `moe_traffic_<step>.jsonl` and fsynced before the next phase starts (its first
line names the trace: "generate", or the sha256 of the trace file). A resumed run (`harness run --resume`)
continues after the last durable phase, with the circuits the plan gives that phase (re-applied if the switch
no longer shows them); it is refused when the trace file changed since.
"""
from __future__ import annotations

import contextlib
import json
import os
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import numpy as np
import pandas as pd

from devices.errors import DeviceError
from harness.bench.traffic import MoeTraffic, MoeTrafficParams, PhaseFailed, circuit_labels, circuits_from_patches, trace_id
from harness.config import register_step
from harness.errors import InputError
from harness.gpu_view import gpu_view
from harness.outcome import Check, StepOutcome


def rows_path(run_dir, step) -> Path:
    return Path(run_dir) / f"moe_traffic_{step.name}.jsonl"


def durable_rows(run_dir, step) -> tuple[str | None, list[dict]]:
    """(the trace id the rows were measured on, the phase rows on disk). A last line the run died writing (no
    newline) is moved to `moe_traffic_<step>.incomplete.jsonl` (kept, not lost): that phase runs again."""
    path = rows_path(run_dir, step)
    raw = path.read_bytes() if path.exists() else b""
    if not raw:
        return None, []
    lines = raw.split(b"\n")
    if lines.pop() != b"":
        with open(path.with_suffix(".incomplete.jsonl"), "ab") as f:
            f.write(raw.rsplit(b"\n", 1)[-1] + b"\n")
        from harness.record import write_text_atomic

        write_text_atomic(path, b"".join(line + b"\n" for line in lines).decode())
    header, *rows = (json.loads(line) for line in lines)
    return header.get("trace"), rows


def resume_point(run_dir, step, _last_logged_cycle: int) -> int:
    """How many phases the interrupted run made durable; refuses (InputError) rows measured on another trace."""
    measured_on, rows = durable_rows(run_dir, step)
    origin = json.loads((Path(run_dir) / "manifest.json").read_text())["playbook"]["source"]
    if measured_on is not None and measured_on != trace_id(step.params, step, origin):
        raise InputError(f"--resume: step {step.name}: the trace {step.params['trace']!r} changed since the run "
                         f"measured {len(rows)} phases on it; start a new run", step.file, step.line)
    return len(rows)


class _RowLog:
    """Phase rows appended as JSON lines, each fsynced before `append` returns (the run moves on after it)."""

    def __init__(self, path: Path, header: dict | None):
        self._file = open(path, "a", encoding="utf-8")
        if header is not None:
            self.append(header)

    def append(self, row: dict) -> None:
        self._file.write(json.dumps(row, separators=(",", ":")) + "\n")
        self._file.flush()
        os.fsync(self._file.fileno())

    def close(self) -> None:
        self._file.close()


class MoeTrafficRun(MoeTraffic):
    """The step: every phase run and recorded, each row durable before the next phase."""

    def run(self) -> StepOutcome:
        from analysis.mixnet import all_to_all_time, greedy_circuits
        from harness import record as rec

        ctx, p, step = self.ctx, self.p, self.step
        trace = self.load_trace()
        phases, demand = self.phases(trace)
        plan = self.plan(trace, phases, demand)
        n = phases[0].matrix.shape[0]
        if ctx.dry_run:
            return StepOutcome(ok=True, summary_md=f"(dry run: {len(phases)} phases on {n} endpoints, not run)")
        hosts = self.open_bench(n)
        initial = circuits_from_patches(self.guard.snapshot, self.endpoints)[:n, :n]  # at the run's start
        measured_on, records = durable_rows(ctx.run_dir, step)
        done = ctx.resume_after.get(step.name, 0)  # phases a resumed run already made durable
        records = records[:done]
        for row, ph in zip(records, phases):
            if (row["iteration"], row["layer"], row["micro_batch"], row["phase"]) != \
                    (ph.iteration, ph.layer, ph.micro_batch, ph.phase):
                raise InputError(f"--resume: step {step.name}: the recorded phases are not this trace's; "
                                 "start a new run", step.file, step.line)
        reconfigurations: list[dict] = [
            {"iteration": r["iteration"], "seconds": r["reconfiguration_s"], "links_up": r["links_up"],
             "circuits": r["circuits"]} for r in records if r["reconfigured"]]
        failure = None
        zero = np.zeros((n, n), dtype=np.int64)
        rows = _RowLog(rows_path(ctx.run_dir, step),
                       None if measured_on else {"trace": trace_id(p, step, ctx.playbook.source),
                                                 "phases": len(phases)})
        with contextlib.closing(rows), ThreadPoolExecutor(max_workers=max(n, len(hosts)),
                                                          thread_name_prefix=f"moe-{step.name}") as pool:
            self.pool = pool
            wired_for = None  # the plan entry the circuits were last computed for (by this process)
            for ph in phases[done:]:
                reconf_s, links_up, reconfigured = 0.0, True, False
                # the latest plan entry due (a regime may start on an idle iteration); after a resume, the
                # first phase's entry is wired again if the switch no longer shows it
                target = max((it for it in plan if it <= ph.iteration), default=None)
                if target is not None and target != wired_for:
                    wired_for = target
                    wanted = np.zeros_like(self.current)
                    wanted[:n, :n] = greedy_circuits(plan[target], 1, self.b_ocs, self.b_eps)
                    if not np.array_equal(wanted, self.current):
                        try:
                            reconf_s, links_up = self.reconfigure(wanted)
                        except DeviceError as exc:
                            failure = f"reconfiguration before iteration {ph.iteration}: {exc}"
                            break
                        reconfigured = True
                        reconfigurations.append({"iteration": ph.iteration, "seconds": reconf_s,
                                                 "links_up": links_up,
                                                 "circuits": circuit_labels(wanted, self.endpoints)})
                circuits = self.current[:n, :n]
                try:
                    rank_s, wall_s = self.run_phase(ph.matrix)
                except PhaseFailed as exc:
                    failure = f"iteration {ph.iteration} layer {ph.layer} {ph.phase}: {exc}"
                    break
                measured = max(rank_s)
                modelled = all_to_all_time(ph.matrix, circuits, self.b_ocs, self.b_eps)
                off = ph.matrix - np.diag(np.diag(ph.matrix))
                records.append({
                    "iteration": ph.iteration, "layer": ph.layer, "micro_batch": ph.micro_batch, "phase": ph.phase,
                    "bytes": int(off.sum()), "max_rank_bytes": int(max(off.sum(axis=1).max(), off.sum(axis=0).max())),
                    "circuits": circuit_labels(circuits, self.endpoints), "n_circuits": int(np.triu(circuits).sum()),
                    "circuit_bytes": int(off[circuits > 0].sum()),
                    "measured_s": measured, "modelled_s": float(modelled),
                    "ratio": measured / modelled if modelled > 0 else float("nan"),
                    "modelled_initial_s": float(all_to_all_time(ph.matrix, initial, self.b_ocs, self.b_eps)),
                    "modelled_packet_only_s": float(all_to_all_time(ph.matrix, zero, self.b_ocs, self.b_eps)),
                    "rank_s": rank_s, "wall_s": wall_s, "reconfigured": reconfigured,
                    "reconfiguration_s": reconf_s, "links_up": links_up})
                rows.append(records[-1])  # durable before the next phase
        frame = pd.DataFrame.from_records(records, columns=[
            "iteration", "layer", "micro_batch", "phase", "bytes", "max_rank_bytes", "circuits", "n_circuits",
            "circuit_bytes", "measured_s", "modelled_s", "ratio", "modelled_initial_s", "modelled_packet_only_s",
            "rank_s", "wall_s", "reconfigured", "reconfiguration_s", "links_up"])
        parquet = ctx.run_dir / f"moe_traffic_{step.name}.parquet"
        frame.to_parquet(parquet, index=False)
        summary = summarize(frame, reconfigurations)
        summary.update({"endpoints": [e.key for e in self.endpoints[:n]], "reconfigure": p["reconfigure"],
                        "launch": p["launch"],
                        "command": self.template, "link_gbps": p["link_gbps"], "eps_gbps": p["eps_gbps"],
                        "phases_planned": len(phases), "failure": failure,
                        "regime_changes": [int(c) for c in trace.regime_changes], "parquet": parquet.name,
                        "resumed_after_phases": done})
        rec.write_json_atomic(ctx.run_dir / f"moe_traffic_{step.name}.json", summary)
        checks = [Check(name="every phase ran", ok=failure is None and len(frame) == len(phases),
                        detail=failure or f"{len(frame)}/{len(phases)} phases"),
                  Check(name="links up after every reconfiguration", ok=all(r["links_up"] for r in reconfigurations),
                        detail=f"{sum(r['links_up'] for r in reconfigurations)}/{len(reconfigurations)}")]
        return StepOutcome(ok=all(c["ok"] for c in checks), summary=summary, checks=checks,
                           summary_md=markdown(step.name, summary, frame),
                           artifacts=[parquet.name, f"moe_traffic_{step.name}.json", rows_path(".", step).name])


def summarize(frame: pd.DataFrame, reconfigurations: list[dict]) -> dict:
    """Measured vs modelled ratio quantiles and total times with and without the reconfigurations."""
    ratio = frame["ratio"].to_numpy(dtype=float) if len(frame) else np.empty(0)
    ratio = ratio[np.isfinite(ratio)]
    q = (lambda x: float(np.quantile(ratio, x)) if ratio.size else None)  # noqa: E731
    transfer = float(frame["measured_s"].sum()) if len(frame) else 0.0
    reconf = float(sum(r["seconds"] for r in reconfigurations))
    return {
        "phases": int(len(frame)), "ratio_p50": q(0.5), "ratio_p99": q(0.99),
        "ratio_min": q(0.0), "ratio_max": q(1.0),
        "measured_transfer_s": transfer, "reconfiguration_s": reconf,
        "measured_total_s": transfer + reconf,
        "modelled_transfer_s": float(frame["modelled_s"].sum()) if len(frame) else 0.0,
        "modelled_without_reconfiguration_s": float(frame["modelled_initial_s"].sum()) if len(frame) else 0.0,
        "modelled_packet_only_s": float(frame["modelled_packet_only_s"].sum()) if len(frame) else 0.0,
        "reconfigurations": len(reconfigurations), "reconfiguration_list": reconfigurations,
    }


def markdown(name: str, s: dict, frame: pd.DataFrame) -> str:
    fmt = (lambda v: "–" if v is None else f"{v:.3f}")  # noqa: E731
    ms = (lambda v: f"{v * 1e3:.2f}")  # noqa: E731
    lines = [f"## MoE traffic ({name})", "",
             f"{s['phases']} all-to-all phases on {len(s['endpoints'])} endpoints, reconfigure "
             f"`{s['reconfigure']}` ({s['reconfigurations']} reconfigurations); circuits {s['link_gbps']:g} Gb/s, "
             f"packet fabric {s['eps_gbps']:g} Gb/s per NIC.", "",
             "| quantity | value |", "|---|---|",
             f"| measured / modelled, p50 | {fmt(s['ratio_p50'])} |",
             f"| measured / modelled, p99 | {fmt(s['ratio_p99'])} |",
             f"| measured transfer time (ms) | {ms(s['measured_transfer_s'])} |",
             f"| reconfiguration time (ms) | {ms(s['reconfiguration_s'])} |",
             f"| total with reconfiguration (ms) | {ms(s['measured_total_s'])} |",
             f"| modelled transfer time (ms) | {ms(s['modelled_transfer_s'])} |",
             f"| modelled without reconfiguration (circuits at start) (ms) | "
             f"{ms(s['modelled_without_reconfiguration_s'])} |",
             f"| modelled, packet fabric only (ms) | {ms(s['modelled_packet_only_s'])} |", ""]
    if len(frame):
        lines += ["| phase | n | measured mean (ms) | modelled mean (ms) | ratio p50 |", "|---|---|---|---|---|"]
        for phase, g in frame.groupby("phase", sort=False):
            lines.append(f"| {phase} | {len(g)} | {ms(g['measured_s'].mean())} | {ms(g['modelled_s'].mean())} | "
                         f"{fmt(float(g['ratio'].median()))} |")
        lines.append("")
    if s.get("failure"):
        lines += [f"**Stopped:** {s['failure']}", ""]
    return "\n".join(lines)


@register_step("moe_traffic", MoeTrafficParams, resume_point=resume_point)
def moe_traffic(ctx, step) -> StepOutcome:
    run = MoeTrafficRun(ctx, step)
    with gpu_view(ctx, step, {e.host for e in run.endpoints}) as run.gpu_view:  # GPUs around each reconfiguration
        return run.run()
