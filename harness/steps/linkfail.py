"""Link-failure and link-flap studies during MoE all-to-all replay (issue: Spectrum-X metrics).

`link_failures`: MixNet's greedy circuits for the trace's demand are wired, then for each f in `fail_pct`
(`rounds` times, each round in a seeded random order, so that no f always runs first on a warming bench)
ceil(f·L) of the L circuits (seeded choice) are pulled — an OCS disconnect through the run's CircuitGuard,
the fibre pull of a real bench — and every phase of the trace runs over what survives; the circuits are
restored before the next f. Per f: effective-bandwidth fraction (busBW / the intact fabric's modelled
busBW), latency inflation (p50, p99 of the phase times ÷ at 0 %), proportionality to surviving capacity.

`link_flaps`: one phase of the trace repeated back to back; `flaps` times, ceil(f·L) circuits are pulled for
`down_ms` and restored. Each operation is stamped on the harness clock (start, end) with its goodput (the
tool's bytes / the tool's time); the reaction time per flap is bounded by `analysis.linkfail.reaction_time`.

Both leave their tables in `linkfail_<step>.json` (and the per-phase Parquet) for `spectrumx_verdict`.
"""
from __future__ import annotations

import math
from concurrent.futures import ThreadPoolExecutor

import numpy as np
import pandas as pd

from analysis import linkfail as lf
from devices.errors import DeviceError
from devices.timing import now_ns
from harness.config import register_step
from harness.specs import Annotated, AtLeastOne, Expect, Field, Positive
from harness.errors import InputError
from harness.steps import StepOutcome
from harness.steps.moe_traffic import SCHEMA as MOE_SCHEMA
from harness.steps.moe_traffic import MoeTrafficRun, PhaseFailed, circuit_mapping

Percentages = Annotated[list[Annotated[float, Field(ge=0, lt=100)]], Field(min_length=1),
                        Expect("a list of percentages in [0, 100)")]
Ops = Annotated[int, Field(ge=2), Expect("a value >= 2")]
FAILURE_SCHEMA = {**MOE_SCHEMA, "reconfigure": (MOE_SCHEMA["reconfigure"][0], "none"),
                  "fail_pct": (Percentages, [0, 10, 25, 50]),
                  "rounds": (AtLeastOne, 1)}  # each round: every f once, in a seeded random order (no f always first)
FLAP_SCHEMA = {**MOE_SCHEMA, "reconfigure": (MOE_SCHEMA["reconfigure"][0], "none"), "fail_pct": (Percentages, [10]),
               "down_ms": (Positive, 200.0), "flaps": (AtLeastOne, 2), "ops_before": (Ops, 4), "ops_down": (Ops, 8),
               "ops_after": (Ops, 4)}


class LinkStudy:
    """The bench side both studies share: the circuits wired, pulled and restored through the guard."""

    def __init__(self, ctx, step):
        self.ctx, self.step, self.p = ctx, step, step.params
        self.moe = MoeTrafficRun(ctx, step)
        self.fail_pct = [float(v) for v in self.p["fail_pct"]]  # in [0, 100): the spec
        self.rng = np.random.default_rng([int(ctx.seed), 13])

    def setup(self):
        from analysis.mixnet import greedy_circuits

        moe = self.moe
        trace = moe.load_trace()
        self.phases, demand = moe.phases(trace)
        self.n = self.phases[0].matrix.shape[0]
        hosts = moe.open_bench(self.n)
        self.full = np.zeros_like(moe.current)
        self.full[: self.n, : self.n] = greedy_circuits(sum(demand.values()), 1, moe.b_ocs, moe.b_eps)
        self.links = [(int(i), int(j)) for i, j in zip(*np.nonzero(np.triu(self.full, 1)))]
        if not self.links:
            raise InputError(f"step {self.step.name}: the trace's demand wires no circuit", self.step.file,
                             self.step.line)
        return hosts

    def wire_intact(self) -> None:
        """Every circuit wired and trained (a study measures against an intact fabric, not a half-trained one)."""
        _, up = self.moe.reconfigure(self.full)
        if not up:
            raise PhaseFailed(f"links not up {self.p['link_timeout_s']} s after wiring the intact fabric")

    def pick(self, pct: float) -> list[tuple[int, int]]:
        k = math.ceil(pct / 100 * len(self.links) - 1e-9)
        idx = sorted(self.rng.choice(len(self.links), size=k, replace=False).tolist()) if k else []
        return [self.links[i] for i in idx]

    def without(self, failed) -> np.ndarray:
        c = self.full.copy()
        for i, j in failed:
            c[i, j] = c[j, i] = 0
        return c

    def pull(self, failed) -> int:
        """Disconnect the failed circuits (a fibre pull); the harness ns the command was first sent."""
        moe = self.moe
        circuits = self.without(failed)
        applied = moe.guard.apply(moe.others | circuit_mapping(circuits, moe.endpoints), moe.policy)
        moe.current = circuits
        return applied.first_sent_ns

    def phase_row(self, matrix: np.ndarray, circuits: np.ndarray) -> dict:
        from analysis.mixnet import all_to_all_time

        moe, n = self.moe, self.n
        begin = now_ns()
        rank_s, _ = moe.run_phase(matrix)
        end = now_ns()
        off = matrix - np.diag(np.diag(matrix))
        size = float(max(off.sum(axis=1).max(), off.sum(axis=0).max()))
        measured = max(rank_s)
        intact = all_to_all_time(matrix, self.full[:n, :n], moe.b_ocs, moe.b_eps)
        surviving = all_to_all_time(matrix, circuits[:n, :n], moe.b_ocs, moe.b_eps)
        return {"start_ns": begin, "end_ns": end, "max_rank_bytes": size, "measured_s": measured,
                "bus_bw": float(lf.bus_bandwidth(size, measured, n)),
                "line_bus_bw": float(lf.bus_bandwidth(size, intact, n)),
                "modelled_intact_s": intact, "modelled_surviving_s": surviving}


def _provenance(ctx) -> dict:
    from harness.steps.mixnet import _bench_name, _profile_of, provenance

    prov = provenance({"profile": _profile_of(ctx), "extra": {"bench": _bench_name(ctx)}})
    if ctx.emulated:
        prof = ctx.emulated.profile
        prov["detection"] = {"ms": prof.fabric_detection.mean_s * 1e3, "source": prof.fabric_source}
        prov["data_plane"] = ("emulated: the hosts' alltoall_perf times from the emulator's data-plane model "
                              "(circuits, packet fabric, multiplane re-spread after the detection delay)")
    else:
        prov["detection"] = {"ms": None, "source": "the real fabric's own (not modelled)"}
        prov["data_plane"] = f"measured by the transfer tool on bench {prov['bench']}"
    return prov


def failure_table(frame: pd.DataFrame) -> list[dict]:
    """Per f: busBW fraction of line rate, latency inflation vs f = 0, proportionality."""
    base = frame[frame["fail_pct"] == 0]
    rows = []
    for pct, g in frame.groupby("fail_pct", sort=True):
        bus = float(lf.bus_bandwidth(g["max_rank_bytes"].sum(), g["measured_s"].sum(), int(g["n"].iloc[0])))
        line = float(lf.bus_bandwidth(g["max_rank_bytes"].sum(), g["modelled_intact_s"].sum(), int(g["n"].iloc[0])))
        row = {"fail_pct": float(pct), "failed_links": int(g["failed_links"].iloc[0]),
               "links": int(g["links"].iloc[0]), "phases": int(len(g)),
               "bus_bw_gbps": bus * 8 / 1e9, "line_fraction": float(lf.effective_bandwidth_fraction(bus, line)),
               "p50_ms": float(g["measured_s"].quantile(0.5) * 1e3),
               "p99_ms": float(g["measured_s"].quantile(0.99) * 1e3),
               "capacity_fraction": float(g["modelled_intact_s"].sum() / g["modelled_surviving_s"].sum())}
        if len(base):
            infl = lf.latency_inflation(g["measured_s"], base["measured_s"])
            bus0 = float(lf.bus_bandwidth(base["max_rank_bytes"].sum(), base["measured_s"].sum(),
                                          int(base["n"].iloc[0])))
            cap0 = float(base["modelled_intact_s"].sum() / base["modelled_surviving_s"].sum())
            row.update({"p50_inflation": infl["p50"], "p99_inflation": infl["p99"],
                        "proportionality": lf.proportionality(bus, bus0, row["capacity_fraction"], cap0)})
        rows.append(row)
    return rows


def _md_table(rows: list[dict], cols: list[tuple[str, str, str]]) -> list[str]:
    out = ["| " + " | ".join(c[1] for c in cols) + " |", "|" + "---|" * len(cols)]
    for r in rows:
        out.append("| " + " | ".join("–" if r.get(k) is None else format(r[k], f) for k, _, f in cols) + " |")
    return out


FAILURE_COLS = [("fail_pct", "f %", "g"), ("failed_links", "failed", "d"), ("links", "links", "d"),
                ("phases", "phases", "d"), ("bus_bw_gbps", "busBW Gb/s", ".1f"),
                ("line_fraction", "busBW / line", ".3f"), ("p50_ms", "p50 ms", ".3f"), ("p99_ms", "p99 ms", ".3f"),
                ("p50_inflation", "p50 ÷ 0 %", ".3f"), ("p99_inflation", "p99 ÷ 0 %", ".3f"),
                ("capacity_fraction", "capacity kept", ".3f"), ("proportionality", "BW kept ÷ capacity kept", ".3f")]
FLAP_COLS = [("flap", "flap", "d"), ("failed_links", "links pulled", "d"), ("down_ms", "down ms", ".0f"),
             ("steady_fraction", "steady goodput ÷ before", ".3f"), ("reaction_low_ms", "reaction > ms", ".2f"),
             ("reaction_high_ms", "reaction ≤ ms", ".2f"), ("recovered_high_ms", "back ≤ ms after restore", ".2f")]


def _write(ctx, step, kind: str, frame: pd.DataFrame, table: list[dict], prov: dict, failure: str | None) -> dict:
    from harness import record as rec

    parquet = ctx.run_dir / f"linkfail_{step.name}.parquet"
    frame.to_parquet(parquet, index=False)
    summary = {"kind": kind, "table": table, "provenance": prov, "failure": failure, "parquet": parquet.name,
               "n_endpoints": int(frame["n"].iloc[0]) if len(frame) else 0}
    rec.write_json_atomic(ctx.run_dir / f"linkfail_{step.name}.json", summary)
    return summary


@register_step("link_failures", FAILURE_SCHEMA)
def link_failures(ctx, step) -> StepOutcome:
    study = LinkStudy(ctx, step)
    if ctx.dry_run:
        return StepOutcome(ok=True, summary_md=f"(dry run: link failures at {study.fail_pct} %, not run)")
    study.setup()
    records, failure = [], None
    with ThreadPoolExecutor(max_workers=max(study.n, 1), thread_name_prefix=f"linkfail-{step.name}") as pool:
        study.moe.pool = pool
        try:
            order = [float(pct) for _ in range(step.params["rounds"]) for pct in study.rng.permutation(study.fail_pct)]
            for pct in order:
                failed = study.pick(pct)
                study.wire_intact()
                study.pull(failed)
                circuits = study.without(failed)
                for ph in study.phases:
                    row = study.phase_row(ph.matrix, circuits)
                    records.append({"fail_pct": pct, "failed_links": len(failed), "links": len(study.links),
                                    "n": study.n, "iteration": ph.iteration, "layer": ph.layer, "phase": ph.phase,
                                    **row})
        except (DeviceError, PhaseFailed) as exc:
            failure = str(exc)
    frame = pd.DataFrame.from_records(records)
    table = failure_table(frame) if len(frame) else []
    summary = _write(ctx, step, "failures", frame, table, _provenance(ctx), failure)
    md = [f"## Link failures ({step.name})", "", f"{len(study.links)} OCS-carried links between {study.n} "
          f"endpoints; f % of them pulled (ceil), every phase of the trace per f.", ""]
    md += _md_table(table, FAILURE_COLS) + [""] + ([f"**Stopped:** {failure}", ""] if failure else [])
    checks = [{"name": "every fraction ran", "ok": failure is None and len(table) == len(set(study.fail_pct)),
               "detail": failure or f"{len(table)}/{len(study.fail_pct)}"}]
    return StepOutcome(ok=checks[0]["ok"], checks=checks, summary=summary, summary_md="\n".join(md),
                       artifacts=[summary["parquet"], f"linkfail_{step.name}.json"], data={"linkfail": summary})


@register_step("link_flaps", FLAP_SCHEMA)
def link_flaps(ctx, step) -> StepOutcome:
    p = step.params
    study = LinkStudy(ctx, step)
    if ctx.dry_run:
        return StepOutcome(ok=True, summary_md=f"(dry run: {p['flaps']} flaps of {p['down_ms']} ms, not run)")
    study.setup()
    matrix = study.phases[0].matrix
    records, table, failure = [], [], None
    pct = max(study.fail_pct)
    with ThreadPoolExecutor(max_workers=max(study.n, 1), thread_name_prefix=f"linkflap-{step.name}") as pool:
        study.moe.pool = pool
        try:
            study.wire_intact()
            for flap in range(p["flaps"]):
                failed = study.pick(pct)
                rows = []

                def op(label, circuits):
                    rows.append({"flap": flap, "part": label, **study.phase_row(matrix, circuits)})

                for _ in range(p["ops_before"]):
                    op("before", study.full)
                down_ns = study.pull(failed)
                pulled = study.without(failed)
                up_due = down_ns + int(p["down_ms"] * 1e6)
                k = 0
                while k < p["ops_down"] or now_ns() < up_due:
                    op("down", pulled)
                    k += 1
                up_ns = now_ns()
                study.wire_intact()  # restore: reconnect and wait until the links trained
                for _ in range(p["ops_after"]):
                    op("after", study.full)
                f = pd.DataFrame(rows)
                good = f["max_rank_bytes"] / f["measured_s"]
                t = lambda col: (f[col].to_numpy(dtype=float) - down_ns) / 1e9  # noqa: E731
                down_rows = f[f["part"] == "down"]
                steady_from = (down_rows["start_ns"].iloc[len(down_rows) // 2] - down_ns) / 1e9
                r = lf.reaction_time(t("start_ns"), t("end_ns"), good, 0.0, steady_from, (up_ns - down_ns) / 1e9)
                before = float(good[f["part"] == "before"].median())
                after_rows = f[f["part"] == "after"]
                back = after_rows[good[f["part"] == "after"] >= 0.95 * before]
                table.append({"flap": flap, "failed_links": len(failed), "down_ms": (up_ns - down_ns) / 1e6,
                              "steady_fraction": r.steady / before, "reaction_low_ms": r.low_s * 1e3,
                              "reaction_high_ms": r.high_s * 1e3 if r.reached else None, "reached": r.reached,
                              "recovered_high_ms": (float(back["end_ns"].iloc[0] - up_ns) / 1e6) if len(back)
                              else None})
                for row in rows:
                    records.append({"n": study.n, "failed_links": len(failed), **row})
        except (DeviceError, PhaseFailed) as exc:
            failure = str(exc)
    frame = pd.DataFrame.from_records(records)
    summary = _write(ctx, step, "flaps", frame, table, _provenance(ctx), failure)
    md = [f"## Link flaps ({step.name})", "", f"{p['flaps']} flaps of ceil({pct:g} %) of {len(study.links)} "
          f"OCS-carried links, {p['down_ms']:g} ms down; reaction = link down → goodput ≥ 95 % of the new "
          "steady state, bounded by the operations around it.", ""]
    md += _md_table(table, FLAP_COLS) + [""] + ([f"**Stopped:** {failure}", ""] if failure else [])
    checks = [{"name": "every flap ran", "ok": failure is None and len(table) == p["flaps"],
               "detail": failure or f"{len(table)}/{p['flaps']}"}]
    return StepOutcome(ok=checks[0]["ok"], checks=checks, summary=summary, summary_md="\n".join(md),
                       artifacts=[summary["parquet"], f"linkfail_{step.name}.json"], data={"linkfail": summary})
