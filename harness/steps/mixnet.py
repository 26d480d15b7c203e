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
from analysis.stages import UP_PROFILE_KEYS
from harness.config import register_step
from harness.errors import InputError
from harness.specs import Annotated, AtLeastOne, Expect, Field, Fraction, Literal, Positive, Seconds, Spec, create_model
from harness.outcome import Check, ClaimRow, ClaimsTable, ScenarioCell, ScenarioRow, StepResult
from harness.provenance import evidence_words

STAGE_OF = {"ocs": "light_detected", "total": "first_packet"}


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
    reconfigure: Literal["on_change", "always"] = Field("always", description='"always": as the released simulator '
                                                        '(the better fit to the record on the train links); '
                                                        '"on_change": only ports whose circuit changes')
    cost_basis: Literal[BASES] = Field("paper", description='"paper": EPS switch ports charged')
    calibration_ratio_tolerance_pct: Seconds = Field(5.0, description="T_mix/T_ft at 25 ms vs the authors' ratio")
    calibration_ce_tolerance_pct: Seconds = Field(0.0, description="widening of the paper's cost-efficiency ranges")
    bound_k: Positive = Field(1.0, description="reconfigurations per iteration that cannot be hidden (the bound)")
    bound_window_ms: Annotated[float, Field(ge=0), Expect("milliseconds >= 0")] = Field(
        0.0, description="compute each unhidden reconfiguration may still overlap (the bound)")
    bound_mfu: Fraction = Field(0.05, description="declared low MFU: T_ft,max from the iteration's FLOPs (the bound)")
    bound_gpu: Literal[tuple(GPUS)] = Field("a100-sxm", description="GPU of T_ft,max (the slower: a larger bound)")
    baseline: Assumption = Assumption()
    grid: AssumptionGrid = Field(AssumptionGrid(), description="empty: analysis.claims.DEFAULT_GRID")
    design: Literal["one_at_a_time", "full"] = Field("one_at_a_time", description='"full": every combination')
    workers: AtLeastOne = Field(2, description="processes for the grid, this one included (1: serial; identical "
                                               "results)")
    n_reps: AtLeastOne = 32
    n_boot: AtLeastOne = 200
    fail_on_falsified: bool = False




def measured_delays(events, source: str = "unspecified", shorten: dict[int, float] | None = None) -> dict:
    """Per (cycle, port) OCS-only and total delays as analysis.mixnet.CycleDelays, from cycles > 0; `shorten`:
    {cycle: seconds} taken off every delay of those cycles (at least 0)."""
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
        if shorten:
            by = wide.index.to_series().map(shorten).fillna(0.0).to_numpy()
            wide = (wide - by[:, None]).clip(lower=0.0)
            shared = (shared - by).clip(lower=0.0)
        keep = np.isfinite(wide.to_numpy()).any(axis=1) & np.isfinite(shared.to_numpy())
        out[kind] = CycleDelays(wide.to_numpy()[keep], shared.to_numpy()[keep], source)
    return out


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
                     n_reps=params["n_reps"], n_boot=params["n_boot"],
                     bound=cl.BoundAssumptions(k=params["bound_k"], window_s=params["bound_window_ms"] / 1e3,
                                               mfu=params["bound_mfu"], gpu=params["bound_gpu"]))
    baseline = cl.Assumptions(**{k: v for k, v in params["baseline"].items() if v is not None})
    axes = {k: v for k, v in params["grid"].items() if v is not None}
    grid = cl.assumption_grid(axes or None, baseline, params["design"])
    for a in grid:      # bad values fail here, before any worker starts
        cl.check_assumptions(a)
    for model in setup.models:
        get_model(model)
    return setup, grid


LATE_RULE = ("the emulated bench realised a delay on the path from the command to traffic (the stamps the delays "
             "are measured between) later than drawn by more than max(0.1 ms, 5 % of the stage's p99 delay): its "
             "switch began moving after the command arrived, or a change realised in a kernel ran late "
             "(analysis.accuracy.late_cycles; a change the emulator shows itself appears at its due time however late "
             "its thread ran)")


def compute_verdict(events, params: dict, seed: int, prov: dict, late: list[dict] | None = None) -> dict:
    """The whole verdict (with plot series) from a run's events, the step's params and provenance; `late`: the
    cycles in which the emulator ran late (analysis.accuracy.late_cycles; an input, so a recompute reproduces it).
    Raises analysis.claims.ClaimInputError / ValueError on bad params, LookupError without delays.

    Late cycles are judged twice: the verdict is re-evaluated with each late cycle's delays shortened by its
    lateness (the most a late action can have added to any stamp in it: a follow-up is timed from its due time).
    If no verdict moves, every cycle is kept; if one does, the late cycles are excluded and the verdict is the one
    without them (kept, and said to be unresolved, if fewer than 2 cycles would remain)."""
    from analysis import claims as cl

    late = list(late or [])
    measured = measured_delays(events, prov["delays"])
    if any(v is None for v in measured.values()):
        raise LookupError("no cycle recorded both light_detected and first_packet")
    setup, grid = _setup(params, seed)
    sensitivity = None
    if late:
        sensitivity = {"label": "each late cycle's delays shortened by its lateness",
                       "measured": measured_delays(events, prov["delays"],
                                                   {r["cycle"]: r["late_ms"] / 1e3 for r in late})}
    verdict = cl.evaluate_claims(measured, setup=setup, grid=grid, max_workers=params["workers"],
                                 sensitivity=sensitivity)
    changes = (verdict.pop("sensitivity") or {}).get("changes") or []
    lateness = {"applies": bool(prov.get("emulated")), "rule": LATE_RULE, "cycles": late,
                "check": sensitivity and sensitivity["label"], "changes": changes,
                "decision": "none late" if not late else "kept: shown not to move any verdict" if not changes
                else "excluded"}
    if changes:
        on_time = events[~events["cycle"].isin([r["cycle"] for r in late])]
        kept = measured_delays(on_time, prov["delays"])
        if all(v is not None and v.n_cycles >= 2 for v in kept.values()):
            verdict = cl.evaluate_claims(kept, setup=setup, grid=grid, max_workers=params["workers"])
            verdict.pop("sensitivity")
        else:
            lateness["decision"] = "unresolved: fewer than 2 cycles ran on time; every cycle kept"
    if not prov.get("emulated"):
        lateness["decision"] = "not applicable: delays measured on a bench"
    verdict["lateness"] = lateness
    verdict["provenance"] = prov
    verdict["inputs"] = {"params": params, "seed": seed, "late_cycles": late}
    return verdict


def late_cycles(ctx) -> list[dict]:
    """The run's cycles whose delays the emulated bench realised late (analysis.accuracy.late_cycles); none on a
    real bench."""
    from analysis.accuracy import late_cycles as late

    if ctx.bench.truth is None:
        return []
    return late(ctx.bench.truth.draws(), [w for r in ctx.results.values() for w in r.truth_windows],
                stages=UP_PROFILE_KEYS)


PUBLIC_KEYS = ("provenance", "headline", "claims", "lateness", "bound", "seed_test", "scorecard", "robustness",
               "measured", "paper_delay", "calibration", "break_even_ms", "baseline", "options", "inputs")


# The parts of verdict.json that come from measured stamps (or the machine's timing: the emulator's lateness):
# the only parts that may differ between two runs with the same seed. "*": any key or list item; a path names
# its whole subtree (a dict or list is masked whole: how many late cycles there are is the machine's); numbers in
# strings are masked too (mask_measured).
MEASURED_FIELDS = (
    "headline.d_s", "headline.bound_ratio", "claims.*.summary", "claims.*.model_verdict.summary",
    "claims.*.by_scenario.*.reason", "claims.*.by_scenario.*.short", "lateness", "inputs.late_cycles",
    "bound.delay_s", "bound.rows.*.delay_s", "bound.rows.*.bound_ratio", "bound.rows.*.claims.*.value",
    "bound.rows.*.claims.*.flips.k", "bound.rows.*.claims.*.flips.mfu", "bound.rows.*.claims.*.flips.window_s",
    "measured", "baseline.scenarios.*.t_mixnet_s", "baseline.scenarios.*.delay_per_reconfiguration_ms",
    "baseline.scenarios.*.claims.*.reason", "baseline.scenarios.*.claims.*.short",
    "baseline.scenarios.*.claims.*.numbers", "baseline.scenarios.*.claims.*.numbers_short",
    "baseline.scenarios.*.claims.*.value", "baseline.scenarios.*.claims.*.value_ci",
    "baseline.claims.*.reason")


def mask_measured(data, fields=MEASURED_FIELDS):
    """verdict.json's data with every MEASURED_FIELDS value masked: a dict or list -> "(measured)", a number ->
    None, numbers in a string -> "#"."""
    import re

    def blank(x):
        if isinstance(x, (dict, list)):
            return "(measured)"
        if isinstance(x, str):
            return re.sub(r"[-+]?\d[\d.e+-]*", "#", x)
        return None if isinstance(x, (int, float)) and not isinstance(x, bool) else x

    def walk(x, parts):
        if not parts:
            return blank(x)
        head, rest = parts[0], parts[1:]
        if isinstance(x, dict):
            return {k: walk(v, rest) if head in ("*", k) else v for k, v in x.items()}
        if isinstance(x, list) and head == "*":
            return [walk(v, rest) for v in x]
        return x

    for path in fields:
        data = walk(data, path.split("."))
    return data


def verdict_json_text(verdict: dict) -> str:
    """verdict.json as bytes-stable text: fixed key order, floats by repr."""
    from harness.record import RECORD_SCHEMA_VERSION

    return json.dumps({"schema_version": RECORD_SCHEMA_VERSION, **{k: verdict[k] for k in PUBLIC_KEYS}}, indent=1,
                      allow_nan=False) + "\n"


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


def lateness_lines(verdict: dict) -> list[str]:
    """The report's note on cycles whose delays the emulated bench realised late, and what was done about them."""
    late = verdict.get("lateness") or {}
    if not late.get("applies"):
        return []
    if not late["cycles"]:
        return [f"> The emulated bench realised the delays of every measured cycle as drawn (late means: "
                f"{late['rule']}).", ""]
    names = "; ".join(f"{r['cycle']} ({r['late_ms']:.3g} ms late: {r['stage']} on {r['port']}, resolution "
                      f"{r['threshold_ms']:.3g} ms)" for r in late["cycles"])
    changes = late["changes"]
    moved = "; ".join(changes[:3]) + (f"; … {len(changes) - 3} more" if len(changes) > 3 else "")
    decision = late["decision"]
    what = (f"re-evaluated with {late['check']}, no verdict moves: every cycle is kept" if decision.startswith("kept")
            else f"re-evaluated with {late['check']}, {len(changes)} verdict(s) move ({moved}): those cycles are "
                 "**excluded**, every number below is from the cycles that ran on time" if decision == "excluded"
            else f"re-evaluated with {late['check']}, {len(changes)} verdict(s) move ({moved}) and fewer than 2 "
                 "cycles ran on time: every cycle is kept, and the verdict is **not resolved** against the "
                 "emulator's lateness (rerun on a less loaded machine)")
    return [f"> **The emulated bench realised delays late in {len(late['cycles'])} cycle(s)**: {names}. Late means "
            f"{late['rule']}; {what}.", ""]


def say(verdict: str, words: dict[str, str]) -> str:
    return words.get(verdict, verdict)


QUANTITY = {"iteration_ratio": "T_mix/T_ft", "cost_efficiency": "CE"}


def short_words(prov: dict) -> dict[str, str]:
    """evidence_words in a table cell's length (the table's legend gives the full words once)."""
    if not prov.get("emulated"):
        return {"falsified": "falsified", "holds": "holds"}
    return {"falsified": "inconsistent", "holds": "consistent"}


def delay_words(prov: dict) -> str:
    if not prov.get("emulated"):
        return f"measured on bench {prov['bench']}"
    return f"emulated from profile {prov['profile']}" + (", which copies the paper's published figures"
                                                          if prov.get("copies_published_figures") else "")


def _duration(s: float) -> str:
    return f"{s * 1e3:.3g} ms" if s < 1 else f"{s:.3g} s"


def claim_label(claim: dict, words: dict[str, str]) -> str:
    return say(claim["verdict"], words) + (" " + " or ".join(claim["conditions"])
                                           if claim["verdict"] == "falsified if" else "")


def claim_sentences(verdict: dict) -> list[str]:
    """One causal sentence per claim, the same in report.md, summary.md, the console and the HTML page: the
    verdict, then what was measured (with its interval and provenance) against the delay at which the claim's
    threshold is reached, in the scenario that shows it most clearly."""
    prov, b = verdict["provenance"], verdict["bound"]
    words = evidence_words(prov)
    measured = (f"the measured {verdict['options']['verdict_delay']} delay per reconfiguration, at least "
                f"{_duration(b['delay_s'])} ({verdict['options']['confidence'] * 100:g} % lower bound on its mean; "
                f"{delay_words(prov)})")
    out = []
    for c in verdict["claims"]:
        cells = [(r["scenario"], r["claims"][c["id"]]) for r in b["rows"] if c["id"] in r["claims"]]
        r25 = {r["scenario"]: r["r25"] for r in b["rows"]}
        beyond = [f"{name} (r25 = {r25[name]:.3f})" for name, cell in cells
                  if cell["falsified"] and cell["flips"]["already_beyond"]]
        decided = sorted((cell["flips"]["delay_s"], name, cell) for name, cell in cells
                         if cell["falsified"] and not cell["flips"]["already_beyond"])
        if decided:
            d_star, name, cell = decided[0]
            why = (f"{measured}, is {b['delay_s'] / d_star:.0f}× the d* = {_duration(d_star)} at which the bound "
                   f"reaches the claim's threshold in {name}, where {QUANTITY[c['quantity']]} "
                   f"{'≥' if cell['value_kind'] == 'at least' else '≤'} {cell['value']:.3f} against the claim's "
                   f"{c['criterion']}")
            if beyond:
                why += f" (the authors' own figures at 25 ms are already beyond it in {', '.join(beyond)})"
        elif beyond:
            why = (f"the authors' own figures at 25 ms are already beyond the claim's {c['criterion']} in "
                   f"{', '.join(beyond)}; {measured} only adds to it")
        else:
            silent = cells and all(cell["value"] is None for _, cell in cells)
            why = ("no scenario of this run's models and links falls under it" if not cells else
                   f"the bound is silent at {measured}, below the paper's 25 ms" if silent else
                   f"the bound does not decide it at {measured}") + \
                f"; the model's estimate: {c['model_verdict']['summary']}"
        out.append(f"{c['statement']}: {claim_label(c, words)} — {why}.")
    return out


def claims_table(verdict: dict) -> ClaimsTable:
    """The claims × scenarios table as data, each reason once: per claim its verdict and basis; per scenario
    and claim the bound's and the model's short verdicts with a note number; the notes (reasons) once each."""
    prov = verdict["provenance"]
    short = short_words(prov)
    claims, b = verdict["claims"], verdict["bound"]
    bound_cells = {(r["scenario"], cid): cell for r in b["rows"] for cid, cell in r["claims"].items()}
    notes: list[str] = []

    def note(reason: str) -> int:
        if reason not in notes:
            notes.append(reason)
        return notes.index(reason) + 1

    def model_words(v: str, conditions: list[str]) -> str:
        text = {"falsified": short["falsified"], "holds": short["holds"], "not applicable": "n/a",
                "falsified if": f"{short['falsified']} if"}.get(v, v)
        return text + ((" " if v == "falsified if" else " at ") + " or ".join(conditions) if conditions else "")

    summary = []
    for c in claims:
        falsified = b["claims"].get(c["id"], {}).get("falsified_by", [])
        scenarios = b["claims"].get(c["id"], {}).get("scenarios", [])
        carrying = [lab for lab, v in c["by_point"].items() if v != "no verdict"]
        mv = c["model_verdict"]
        model = (f"{model_words(mv['verdict'], mv['conditions'])} ({len(carrying)} of {len(c['by_point'])} grid "
                 "points let the model carry a verdict)") if carrying else "no grid point lets the model carry a verdict"
        summary.append(ClaimRow(id=c["id"], statement=c["statement"], verdict=claim_label(c, evidence_words(prov)),
                                verdict_class=c["verdict"],
                                bound=f"{short['falsified']} in {len(falsified)} of {len(scenarios)} scenarios"
                                      if falsified else "does not decide it", model=model))
    rows = []
    for s in verdict["baseline"]["scenarios"]:
        name = s["scenario"]
        cells, refs = [], []
        for c in claims:
            cell = c["by_scenario"].get(name)
            if cell is None:
                cells.append(None)
                continue
            bc = bound_cells.get((name, c["id"]))
            bound = "no r25" if bc is None else "silent (d < 25 ms)" if bc["value"] is None else \
                short["falsified"] if bc["falsified"] else "not shown"
            ref = note(cell["reason"])
            refs.append(ref)
            cells.append(ScenarioCell(bound=bound, model=model_words(cell["verdict"], cell["conditions"]), note=ref,
                                      verdict_class="falsified" if bc is not None and bc["falsified"]
                                      else cell["verdict"]))
        rows.append(ScenarioRow(scenario=name, cells=tuple(cells), notes=tuple(sorted(set(refs)))))
    legend = (f"Each cell: the bound's conclusion, then the model's estimate over the assumption grid; "
              f"[n]: its reason, below. *{short['falsified']}*: {say('falsified', evidence_words(prov))}; "
              "*not shown*: the bound does not reach the threshold there; *no r25*: the authors published no "
              "ratio for it, so the bound cannot speak; *n/a*: the model never moves a circuit, "
              "so no delay can matter; *inconclusive*: the numbers straddle the threshold, or no grid point lets "
              "the model carry a verdict (scorecard); *… at / if P*: only at the grid points named.")
    return ClaimsTable(claims=tuple(summary), rows=tuple(rows), notes=tuple(notes), legend=legend,
                       assumptions=f"The bound assumes {b['assumptions_text']} (its table below).")


def claims_markdown(verdict: dict) -> list[str]:
    t = claims_table(verdict)
    lines = ["## Claims × scenarios", "", "| claim | verdict | the bound | the model's estimate |", "|---|---|---|---|"]
    lines += [f"| {c.statement} (`{c.id}`) | **{c.verdict}** | {c.bound} | {c.model} |" for c in t.claims]
    lines += ["", t.assumptions, "", "| scenario | " + " | ".join(f"`{c.id}`" for c in t.claims) + " |",
              "|---|" + "---|" * len(t.claims)]
    for r in t.rows:
        cells = ["—" if c is None else f"bound: {c.bound}; model: {c.model} [{c.note}]" for c in r.cells]
        lines.append(f"| {r.scenario} | " + " | ".join(cells) + " |")
    lines += ["", t.legend, ""] + [f"{i}. {reason}" for i, reason in enumerate(t.notes, 1)] + [""]
    return lines


def bound_markdown(verdict: dict) -> list[str]:
    b = verdict["bound"]
    words = evidence_words(verdict["provenance"])
    lines = ["## The bound (fewest assumptions)", "",
             f"`{b['formula']}`, granting the authors' own r25. Assumptions: {b['assumptions_text']}. "
             f"d = {b['delay_s']:.4g} s ({b['delay_source']}). Each flip column is the value of that one assumption "
             "at which the conclusion changes (the claim is beyond the bound for k above, MFU above, window below, "
             "d above it; \"beyond at 25 ms\": the authors' own figure already is).", "",
             "| scenario | claim | r25 | T_ft,max (s) | bound | conclusion | flips at k / MFU / window / d |",
             "|---|---|---|---|---|---|---|"]
    for r in b["rows"]:
        for cid, c in r["claims"].items():
            f = c["flips"]
            flips = "beyond at 25 ms" if f["already_beyond"] else \
                f"k {_f(f['k'], '.3g')} / MFU {_f(f['mfu'], '.3g')} / window {_f(f['window_s'], '.3g')} s / " \
                f"d {_f(f['delay_s'], '.3g')} s"
            lines.append(f"| {r['scenario']} | {cid} | {r['r25']:.3f} | {r['t_fat_tree_max_s']:.1f} | "
                         f"{'— (d < 25 ms: silent)' if c['value'] is None else c['value_kind'] + ' ' + format(c['value'], '.3f')} | "
                         f"{say('falsified', words) if c['falsified'] else 'not shown by the bound'} | {flips} |")
    return lines + [""]


def seed_test_markdown(verdict: dict) -> list[str]:
    t = verdict["seed_test"]
    lines = ["## The seed's test", "",
             f"NIC 5.67 s (mean) and 6.33 s (p99), each plus OCS 41 ms (mean) and 68 ms (p99) ({t['source']}), "
             f"against the fat-tree and rail-optimized at 100 and 400 Gb/s; limit T_mix/T_x <= {t['limit']:g}. "
             "Bound: the authors' own r25 and rail/fat-tree ratio with the bound's assumptions; model: the "
             "baseline timeline at that constant delay (*not scored*: its scorecard gives it no verdict; *never "
             "moves a circuit*: in the model no delay enters, the bound still applies).", "",
             "| model | link | NIC + OCS (s) | bound vs fat-tree | bound vs rail | model vs fat-tree | model vs rail |",
             "|---|---|---|---|---|---|---|"]
    for r in t["rows"]:
        tag = " (not scored)" if not r["model_carries_verdict"] else \
            " (never moves a circuit)" if r["model_moves_circuits"] is False else ""
        lines.append(f"| {r['model']} | {r['link_gbps']} | {r['nic_s']:g} + {r['ocs_s']:g} | "
                     f"≥ {r['bound_vs_fat_tree']:.3f} | ≥ {r['bound_vs_rail']:.3f} | "
                     f"{_f(r['model_vs_fat_tree'], '.3g')}{tag if r['model_vs_fat_tree'] is not None else ''} | "
                     f"{_f(r['model_vs_rail'], '.3g')}{tag if r['model_vs_rail'] is not None else ''} |")
    return lines + [""]


def scorecard_markdown(card: dict) -> list[str]:
    """The model against the authors' published record, per point, next to the trivial predictor."""
    names = card["quantities"]
    lines = ["## Scorecard: the model against the authors' published record", "",
             f"Trivial predictor: {card['trivial_predictor']}. Free parameters fitted on "
             f"{'/'.join(map(str, card['train_links']))} Gb/s only; {'/'.join(map(str, card['held_out_links']))} "
             f"Gb/s are held out. *within*: within ±{card['within_pct']:g} % of the paper.", "",
             "| quantity | split | points | MAE model | MAE trivial | within (model) | within (trivial) |",
             "|---|---|---|---|---|---|---|"]
    for r in card["summary"]:
        lines.append(f"| {names[r['quantity']]} | {r['split']} | {r['n']} | {r['mae_model']:.3f} | "
                     f"{r['mae_trivial']:.3f} | {r['within_model']}/{r['n']} | {r['within_trivial']}/{r['n']} |")
    fit = card.get("fit")
    if fit:
        lines += ["", f"Fitted on {'/'.join(map(str, fit['fitted_on_links']))} Gb/s (analysis.claims.fit_record): "
                  f"all-to-all blend β = {fit['blend']:g} (share of the hybrid reading; 1 − β the released "
                  f"simulator's dedicated circuits), per model the transfer scale κ (fat-tree link scaling) and "
                  f"the time scale τ (T_mix/T_ft at 25 ms; at most {fit['time_scale_max']:.3g}, the bound's MFU).",
                  "", "| model | κ (transfers) | τ (iteration) |", "|---|---|---|"]
        lines += [f"| {m} | {v['comm_scale']:.3g} | {v['time_scale']:.3g} |" for m, v in fit["models"].items()]
    lines += ["", "| model | carries a verdict | held-out MAE model / trivial (T_mix/T_ft) | error carried |",
              "|---|---|---|---|"]
    for m, g in card["per_model"].items():
        lines.append(f"| {m} | {'yes' if g['carries_verdict'] else 'no'} | {_f(g['held_out_mae_model'], '.3f')} / "
                     f"{_f(g['held_out_mae_trivial'], '.3f')} | ±{_f(g['error'], '.3f')} |")
    lines += ["", "| quantity | model | link | split | model | paper | trivial |", "|---|---|---|---|---|---|---|"]
    for p in card["points"]:
        lines.append(f"| {names[p['quantity']]} | {p['model']} | {p['link_gbps']} | {p['split']} | "
                     f"{p['model_value']:.3f} | {p['paper']:.3f} | {p['trivial']:g} |")
    return lines + [""]


def verdict_markdown(verdict: dict) -> str:
    from analysis.stats import p99_interval_text

    prov = verdict["provenance"]
    words = evidence_words(prov)
    lines = provenance_lines(prov) + lateness_lines(verdict) + claims_markdown(verdict)
    lines += bound_markdown(verdict) + seed_test_markdown(verdict) + scorecard_markdown(verdict["scorecard"])
    m = verdict["measured"]
    lines += ["## Delays and where they come from", "",
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
              "the assumptions named). By the model, a claim is *falsified* only when every point where it carries a "
              "verdict falsifies it.", "",
              "| grid point | scenarios with a model verdict | " + " | ".join(c["id"] for c in verdict["claims"]) + " |",
              "|---|---|" + "---|" * len(verdict["claims"])]
    for row in verdict["robustness"]["table"]:
        cells = []
        for c in verdict["claims"]:
            v = row["claims"][c["id"]]
            by = row["falsified_by"][c["id"]]
            cells.append(say(v, words) + (f" ({', '.join(by)})" if by else ""))
        lines.append(f"| {row['point']} | {', '.join(row['model_verdict_scenarios']) or 'none'} | " + " | ".join(cells) + " |")
    lines += ["", "## The model at the paper's own 25 ms", "", verdict["calibration"]["criterion"] + ".", "",
              "| scenario | T_mix/T_ft | authors' ratio | cost-efficiency | paper's range | reproduces both |",
              "|---|---|---|---|---|---|"]
    for name, cal in verdict["calibration"]["scenarios"].items():
        rng = cal["paper_ce_range"]
        lines.append(f"| {name} | {cal['ratio']:.3f} | {_f(cal['paper_ratio'], '.3f')} | {cal['cost_efficiency']:.2f} | "
                     f"{'—' if rng is None else f'{rng[0]:g}–{rng[1]:g}'} | "
                     f"{'yes' if cal['calibrated'] else cal['short']} |")
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
                     f"{_f(s['t_mixnet_s']['ocs']['mean'], '.4g')} | {_f(s['t_mixnet_s']['total']['mean'], '.4g')} | {model} | "
                     f"{_f(s['break_even_ms'], '.1f')} |")
    return "\n".join(lines) + "\n"


def opening_markdown(verdict: dict) -> str:
    """A report's first lines: each claim's causal sentence, then the terms they and the report use."""
    from harness import glossary

    sentences = claim_sentences(verdict)
    return "\n".join([f"- **{x}**" for x in sentences] + [""] +
                     glossary.markdown("\n".join(sentences) + verdict_markdown(verdict))) + "\n"


def write_outputs(run_dir, events, verdict: dict) -> list[str]:
    """verdict.json, report.md and the plots; returns the file names (the step's artifacts)."""
    from harness import record as rec
    from harness.plots import plot_iteration_vs_delay, plot_stage_breakdown

    markers = {"paper_ms": verdict["paper_delay"]["ms"],
               "ocs_mean_ms": verdict["measured"]["ocs_ms"]["per_cycle_slowest_port_ms"]["mean"],
               "total_mean_ms": verdict["measured"]["total_ms"]["per_cycle_slowest_port_ms"]["mean"]}
    calibrated = {s["scenario"] for s in verdict["baseline"]["scenarios"]
                  if any(c["counts"] for c in s["claims"].values())}
    plots = [plot_iteration_vs_delay(verdict["plot"], markers, run_dir / "iteration_vs_delay.png", calibrated).name]
    if events is not None:
        plots.append(plot_stage_breakdown(events[events["cycle"] > 0], run_dir / "turnaround_stages.png").name)
    rec.write_text_atomic(run_dir / "verdict.json", verdict_json_text(verdict))
    rec.write_text_atomic(run_dir / "report.md", "# Falsification report\n\n" + opening_markdown(verdict) +
                          verdict_markdown(verdict) + "".join(f"\n![{p}]({p})\n" for p in plots))
    return ["verdict.json", "report.md", *plots]


@register_step("mixnet_verdict", MixnetParams)
def mixnet_verdict(ctx, step) -> StepResult:
    from analysis.claims import ClaimInputError

    p = dict(step.params)
    ctx.log.flush()
    if ctx.dry_run:
        return StepResult(ok=True, summary_md="(dry run: no verdict)")
    events = ctx.log.events()  # the run's events, in memory (events.jsonl stays the durable record)
    prov = ctx.bench.provenance()
    try:
        verdict = compute_verdict(events, p, ctx.seed, prov, late_cycles(ctx))
    except LookupError as exc:
        return StepResult(ok=False, checks=[Check(name="measured delays available", ok=False, detail=str(exc))])
    except (ClaimInputError, ValueError, TypeError) as exc:
        raise InputError(f"step {step.name}: {exc}", step.file, step.line) from None
    artifacts = write_outputs(ctx.run_dir, events, verdict)
    md = verdict_markdown(verdict)  # summary.md opens with the claims' sentences (the step's summary) and terms
    falsified = [c["id"] for c in verdict["claims"] if c["verdict"] == "falsified"]
    # Verdicts are results, not failures of the run, unless the playbook asks for that.
    checks = [Check(name=f"claim {c['id']} not falsified", ok=c["verdict"] != "falsified", detail=c["verdict"])
              for c in verdict["claims"]] if p["fail_on_falsified"] else []
    return StepResult(ok=not (falsified and p["fail_on_falsified"]), checks=checks, summary_md=md,
                      summary={"claims": claim_sentences(verdict),
                               **{c["id"]: say(c["verdict"], evidence_words(prov)) +
                                  (" " + " or ".join(c["conditions"]) if c["verdict"] == "falsified if" else "")
                                  for c in verdict["claims"]}}, artifacts=artifacts,
                      data={"break_even_ms": verdict["break_even_ms"]["by_scenario"]})

