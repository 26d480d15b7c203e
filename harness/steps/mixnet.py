"""The `mixnet_verdict` step: feed the measured turnaround into MixNet's iteration-time and cost models and
evaluate its claims over a declared assumption grid (analysis.claims). Writes verdict.json, report.md and
PNG plots into the run folder; `harness report RUN_DIR --recompute` rebuilds verdict.json from the events.

Delays from the run's event log (cycles > 0), kept per cycle and port (the cycle is the unit of replication):
- OCS only: light_detected − ocs_command_sent (mirrors settled, light at the receiver);
- total: first_packet − ocs_command_sent (OCS + CDR + NIC link ready + first packet through);
- shared component of a cycle: its ocs_command_completed − ocs_command_sent (one switch draw per cycle).
"""
from __future__ import annotations

import json
import math
import typing

import numpy as np

from analysis.cost import BASES, DEFAULT_PRICES
from analysis.moe_models import GPUS, MODELS
from harness.config import register_step
from harness.errors import InputError
from harness.specs import Annotated, AtLeastOne, Expect, Field, Literal, Positive, Seconds, Spec, create_model
from harness.steps import StepResult

STAGE_OF = {"ocs": "light_detected", "total": "first_packet"}
Fraction = Annotated[float, Field(gt=0, le=1), Expect("a value in (0, 1]")]


class Assumption(Spec):
    """One point of the modelling assumptions (analysis.claims.Assumptions); a key left out keeps the
    analysis's baseline value."""

    gpu: Literal[tuple(GPUS)] | None = None
    skew: Annotated[float, Field(ge=0), Expect("a Zipf skew >= 0")] | None = None
    mfu: Fraction | None = Field(None, description="model FLOP utilisation")
    overlap: Literal["all_hidden", "simulator"] | None = None
    greedy: Literal["simulator", "paper"] | None = None
    alpha: AtLeastOne | None = Field(None, description="NICs per server on the regional OCS")


# The robustness grid: per assumption, the values it takes (each at least one).
AssumptionGrid = create_model("AssumptionGrid", __base__=Spec, **{
    name: (Annotated[list[typing.get_args(info.annotation)[0]], Field(min_length=1), Expect("at least one value")]
           | None, None)
    for name, info in Assumption.model_fields.items()})


class MixnetParams(Spec):
    """Feed the run's measured turnaround into MixNet's models and judge its claims over an assumption grid."""

    models: list[Literal[tuple(MODELS)]] = Field([], description="empty: every model in analysis/moe_models.py")
    links_gbps: Annotated[list[Literal[tuple(DEFAULT_PRICES)]], Field(min_length=1)] = [100, 400]
    tolerance_pct: Seconds = Field(5.0, description='"iteration time within X % of fat-tree"')
    ce_target_100g: Positive = 1.2
    ce_target_400g: Positive = 1.9
    verdict_delay: Literal[tuple(STAGE_OF)] = Field("total", description='"total": OCS + CDR + NIC; "ocs": the '
                                                                           "paper's omission")
    reconfigure: Literal["on_change", "always"] = Field("on_change", description='"on_change": only ports whose '
                                                        'circuit changes; "always": as the simulator')
    cost_basis: Literal[BASES] = Field("paper", description='"paper": EPS switch ports charged')
    calibration_ratio_tolerance_pct: Seconds = Field(5.0, description="T_mix/T_ft at 25 ms vs the authors' ratio")
    calibration_ce_tolerance_pct: Seconds = Field(0.0, description="widening of the paper's cost-efficiency ranges")
    baseline: Assumption = Assumption()
    grid: AssumptionGrid = Field(AssumptionGrid(), description="empty: analysis.claims.DEFAULT_GRID")
    design: Literal["one_at_a_time", "full"] = Field("one_at_a_time", description='"full": every combination')
    workers: AtLeastOne = Field(2, description="local process pool for the grid (1: serial; identical results)")
    n_reps: AtLeastOne = 32
    n_boot: AtLeastOne = 200
    fail_on_falsified: bool = False




def measured_delays(events, source: str = "unspecified") -> dict:
    """Per (cycle, port) OCS-only and total delays as analysis.mixnet.CycleDelays, from cycles > 0."""
    from analysis.mixnet import CycleDelays
    from analysis.stats import stage_table

    table = stage_table(events[events["cycle"] > 0])
    out = {}
    for kind, stage in STAGE_OF.items():
        wide = (table[stage] / 1e9).unstack(["host", "port"]) if len(table) else None
        if wide is None or wide.empty or not np.isfinite(wide.to_numpy()).any():
            out[kind] = None
            continue
        shared = (table["ocs_command_completed"] / 1e9).groupby(level="cycle").first().reindex(wide.index)
        # The shared OCS part is in every port's delay (per port: shared + its own part), so it is at most the
        # cycle's fastest port. A completion that arrived after a port was already through (a reply delivered
        # late: a loaded machine, a slow management plane) is a delivery time, not the switch's; taken as is it
        # made `per_port - shared` negative, and the decomposition added one cycle's late reply to another's
        # residual (reconfigurations of 50-90 ms from a 5 ms switch).
        shared = np.minimum(shared, wide.min(axis=1))
        keep = np.isfinite(wide.to_numpy()).any(axis=1) & np.isfinite(shared.to_numpy())
        out[kind] = CycleDelays(wide.to_numpy()[keep], shared.to_numpy()[keep], source)
    return out


def provenance(manifest: dict) -> dict:
    """Where the delays come from, from the run's manifest: an emulated profile, or a real bench."""
    profile = manifest.get("profile")
    bench = (manifest.get("extra") or {}).get("bench") or (manifest.get("playbook") or {}).get("bench")
    if profile:
        copies = profile.get("copies")
        return {"emulated": True, "bench": bench, "profile": profile.get("name"),
                "profile_source": (profile.get("source") or "").strip(), "copies_published_figures": copies,
                "delays": f"emulated from profile {profile.get('name')}" +
                          (f" (copies published figures: {copies})" if copies else "")}
    return {"emulated": False, "bench": bench, "profile": None, "copies_published_figures": None,
            "delays": f"measured on bench {bench}"}


def _setup(params: dict, seed: int):
    from analysis import claims as cl
    from analysis.moe_models import MODELS, get_model

    claims = cl.paper_claims(params["tolerance_pct"] / 100, {100: params["ce_target_100g"],
                                                             400: params["ce_target_400g"]})
    calibration = cl.Calibration(ratio_tolerance_pct=params["calibration_ratio_tolerance_pct"],
                                 ce_tolerance_pct=params["calibration_ce_tolerance_pct"])
    setup = cl.Setup(models=tuple(params["models"] or MODELS), links=tuple(int(x) for x in params["links_gbps"]),
                     reconfigure=params["reconfigure"], cost_basis=params["cost_basis"], claims=claims,
                     calibration=calibration, seed=seed, verdict_delay=params["verdict_delay"],
                     n_reps=params["n_reps"], n_boot=params["n_boot"])
    baseline = cl.Assumptions(**{k: v for k, v in params["baseline"].items() if v is not None})
    axes = {k: v for k, v in params["grid"].items() if v is not None}
    grid = cl.assumption_grid(axes or None, baseline, params["design"])
    for a in grid:      # bad values fail here, before any worker starts
        cl.check_assumptions(a)
    for model in setup.models:
        get_model(model)
    return setup, grid


def compute_verdict(events, params: dict, seed: int, prov: dict) -> dict:
    """The whole verdict (with plot series) from a run's events, the step's params and provenance.
    Raises analysis.claims.ClaimInputError / ValueError on bad params, LookupError without delays."""
    from analysis import claims as cl

    measured = measured_delays(events, prov["delays"])
    if any(v is None for v in measured.values()):
        raise LookupError("no cycle recorded both light_detected and first_packet")
    setup, grid = _setup(params, seed)
    verdict = cl.evaluate_claims(measured, setup=setup, grid=grid, max_workers=params["workers"])
    verdict["provenance"] = prov
    verdict["inputs"] = {"params": params, "seed": seed}
    return verdict


PUBLIC_KEYS = ("provenance", "claims", "robustness", "measured", "paper_delay", "calibration", "break_even_ms",
               "baseline", "options", "inputs")


def verdict_json_text(verdict: dict) -> str:
    """verdict.json as bytes-stable text: fixed key order, floats by repr."""
    return json.dumps({k: verdict[k] for k in PUBLIC_KEYS}, indent=1, allow_nan=False) + "\n"


def _f(v, fmt: str = ".3g") -> str:
    return "—" if v is None or (isinstance(v, float) and not math.isfinite(v)) else format(v, fmt)


def provenance_lines(prov: dict) -> list[str]:
    if prov["emulated"]:
        lines = [f"> **Emulated bench, not a hardware measurement.** Every measured delay below was drawn by the "
                 f"emulator from profile `{prov['profile']}`."]
        if prov.get("copies_published_figures"):
            lines.append(f"> That profile **copies published figures** ({prov['copies_published_figures']}): "
                         "this verdict re-uses the paper's own numbers, it does not measure them.")
        return lines + [""]
    return [f"> Delays measured on bench `{prov['bench']}`.", ""]


def verdict_markdown(verdict: dict) -> str:
    from analysis.stats import p99_interval_text

    prov = verdict["provenance"]
    scen = [s["scenario"] for s in verdict["baseline"]["scenarios"]]
    claims = verdict["claims"]

    def label(v: dict) -> str:
        return v["verdict"] + (" " + " or ".join(v["conditions"]) if v["verdict"] == "falsified if" else "")

    lines = provenance_lines(prov) + [
        "## Claims × scenarios", "",
        "| | " + " | ".join(c["statement"] for c in claims) + " |", "|---|" + "---|" * len(claims),
        "| **verdict** | " + " | ".join(f"**{label(c)}**" for c in claims) + " |",
        "| why | " + " | ".join(c["summary"] for c in claims) + " |"]
    for name in scen:
        cells = []
        for c in claims:
            cell = c["by_scenario"].get(name)
            cells.append("—" if cell is None else f"{label(cell)}: {cell['short']}")
        lines.append(f"| {name} | " + " | ".join(cells) + " |")
    lines += ["", "Verdicts over the assumption grid (Robustness below). *not applicable*: the model never moves a "
              "circuit, so no delay can matter; *inconclusive*: the numbers straddle the bound, or the scenario is "
              "not calibrated and cannot carry a verdict; *falsified if …*: only at the grid points named.", ""]
    for name in scen:
        reasons = {c["by_scenario"][name]["reason"] for c in claims if name in c["by_scenario"]}
        lines += [f"- {name}: " + " / ".join(sorted(reasons))]
    m = verdict["measured"]
    lines += ["", "## Delays and where they come from", "",
              "| delay | value | source |", "|---|---|---|"]
    for kind in ("ocs", "total"):
        d = m[f"{kind}_ms"]
        s = d["per_cycle_slowest_port_ms"]
        ci = s.get("mean_ci95")
        lines.append(f"| measured {kind} (per cycle, slowest of {d['ports_per_cycle']} ports; {d['cycles']} cycles) | "
                     f"mean {s['mean']:.1f} ms{f' (95 % CI {ci[0]:.1f}–{ci[1]:.1f})' if ci else ''}, median "
                     f"{s['median']:.1f}, range {s['min']:.1f}–{s['max']:.1f}; p99: {p99_interval_text(s, ' ms', 1)}; "
                     f"shared part (OCS command completion, at most the cycle's fastest port) mean {d['shared_component_ms']['mean']:.1f} ms | {d['source']} |")
    lines.append(f"| paper's delay | {verdict['paper_delay']['ms']:g} ms | {verdict['paper_delay']['source']} |")
    be = verdict["break_even_ms"]
    lines.append("| break-even d* (T_mix = bound) | " + ", ".join(
        f"{k} {_f(v, '.1f')} ms" for k, v in be["by_scenario"].items() if v is not None) + f" | {be['source']} |")
    lines += ["", "## Robustness", "",
              f"{verdict['robustness']['design_points']} grid points (baseline first; each other point changes "
              "the assumptions named). A claim is *falsified* only when every calibrated point falsifies it.", "",
              "| grid point | calibrated scenarios | " + " | ".join(c["id"] for c in verdict["claims"]) + " |",
              "|---|---|" + "---|" * len(verdict["claims"])]
    for row in verdict["robustness"]["table"]:
        cells = []
        for c in verdict["claims"]:
            v = row["claims"][c["id"]]
            by = row["falsified_by"][c["id"]]
            cells.append(v + (f" ({', '.join(by)})" if by else ""))
        lines.append(f"| {row['point']} | {', '.join(row['calibrated']) or 'none'} | " + " | ".join(cells) + " |")
    lines += ["", "## Calibration at the paper's own 25 ms", "", verdict["calibration"]["criterion"] + ".", "",
              "| scenario | T_mix/T_ft | authors' ratio | cost-efficiency | paper's range | calibrated |",
              "|---|---|---|---|---|---|"]
    for name, cal in verdict["calibration"]["scenarios"].items():
        rng = cal["paper_ce_range"]
        lines.append(f"| {name} | {cal['ratio']:.3f} | {_f(cal['paper_ratio'], '.3f')} | {cal['cost_efficiency']:.2f} | "
                     f"{'—' if rng is None else f'{rng[0]:g}–{rng[1]:g}'} | "
                     f"{'yes' if cal['calibrated'] else cal['reason']} |")
    lines += ["", "## Baseline numbers", "",
              "| scenario | T fat-tree (s) | T MixNet d=0 | E[T] measured OCS | E[T] measured total | delay model (total) | "
              "d* (ms, model output) |", "|---|---|---|---|---|---|---|"]
    for s in verdict["baseline"]["scenarios"]:
        dm = s["delay_model"]["total"]
        model = {"none": "no reconfiguration", "joint": f"whole cycles (k ≤ {dm['bench_ports']} bench ports)",
                 "decomposed": f"shared + per-port fit (k up to {dm['max_ports_switched']} > {dm['bench_ports']} "
                               "bench ports)",
                 "mixed": f"whole cycles for {dm['joint']}, shared + per-port fit for {dm['decomposed']} "
                          f"reconfigurations (k up to {dm['max_ports_switched']} > {dm['bench_ports']})"}[dm["method"]]
        lines.append(f"| {s['scenario']} | {s['t_fat_tree_s']:.3f} | {s['t_mixnet_zero_delay_s']:.3f} | "
                     f"{s['t_mixnet_s']['ocs']['mean']:.3f} | {s['t_mixnet_s']['total']['mean']:.3f} | {model} | "
                     f"{_f(s['break_even_ms'], '.1f')} |")
    return "\n".join(lines) + "\n"


def write_outputs(run_dir, events, verdict: dict) -> list[str]:
    """verdict.json, report.md and the plots; returns the file names (the step's artifacts)."""
    from harness import record as rec
    from harness.plots import plot_iteration_vs_delay, plot_stage_breakdown

    markers = {"paper_ms": verdict["paper_delay"]["ms"],
               "ocs_mean_ms": verdict["measured"]["ocs_ms"]["per_cycle_slowest_port_ms"]["mean"],
               "total_mean_ms": verdict["measured"]["total_ms"]["per_cycle_slowest_port_ms"]["mean"]}
    calibrated = {s["scenario"] for s in verdict["baseline"]["scenarios"] if s["calibration"]["calibrated"]}
    plots = [plot_iteration_vs_delay(verdict["plot"], markers, run_dir / "iteration_vs_delay.png", calibrated).name]
    if events is not None:
        plots.append(plot_stage_breakdown(events[events["cycle"] > 0], run_dir / "turnaround_stages.png").name)
    rec.write_text_atomic(run_dir / "verdict.json", verdict_json_text(verdict))
    rec.write_text_atomic(run_dir / "report.md", "# Falsification report\n\n" + verdict_markdown(verdict) +
                          "".join(f"\n![{p}]({p})\n" for p in plots))
    return ["verdict.json", "report.md", *plots]


@register_step("mixnet_verdict", MixnetParams)
def mixnet_verdict(ctx, step) -> StepResult:
    from analysis.claims import ClaimInputError

    p = dict(step.params)
    ctx.log.flush()
    if ctx.dry_run:
        return StepResult(ok=True, summary_md="(dry run: no verdict)")
    events = ctx.log.events()  # the run's events, in memory (events.jsonl stays the durable record)
    prov = provenance({"profile": _profile_of(ctx), "extra": {"bench": _bench_name(ctx)}})
    try:
        verdict = compute_verdict(events, p, ctx.seed, prov)
    except LookupError as exc:
        return StepResult(ok=False, checks=[{"name": "measured delays available", "ok": False, "detail": str(exc)}])
    except (ClaimInputError, ValueError, TypeError) as exc:
        raise InputError(f"step {step.name}: {exc}", step.file, step.line) from None
    artifacts = write_outputs(ctx.run_dir, events, verdict)
    md = verdict_markdown(verdict)
    falsified = [c["id"] for c in verdict["claims"] if c["verdict"] == "falsified"]
    # Verdicts are results, not failures of the run, unless the playbook asks for that.
    checks = [{"name": f"claim {c['id']} not falsified", "ok": c["verdict"] != "falsified",
               "detail": c["verdict"]} for c in verdict["claims"]] if p["fail_on_falsified"] else []
    return StepResult(ok=not (falsified and p["fail_on_falsified"]), checks=checks, summary_md=md,
                      summary={c["id"]: c["verdict"] + (" " + " or ".join(c["conditions"])
                                                        if c["verdict"] == "falsified if" else "")
                               for c in verdict["claims"]}, artifacts=artifacts,
                      data={"break_even_ms": verdict["break_even_ms"]["by_scenario"]})


def _profile_of(ctx) -> dict | None:
    if not ctx.emulated:
        return None
    prof = ctx.emulated.profile
    return {"name": prof.name, "source": prof.source, "copies": getattr(prof, "copies", None)}


def _bench_name(ctx) -> str:
    return getattr(getattr(ctx.bench, "name", None), "__str__", lambda: None)() or str(ctx.playbook.bench)
