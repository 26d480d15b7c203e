"""The `spectrumx_verdict` step: the Spectrum-X seed's claims (spec algorithms.md §8; the paper itself was
not retrievable, the claims are the issue's reading of its abstract) judged on this run's link studies
(`link_failures`, `link_flaps` steps), in the MixNet verdict's vocabulary — holds / falsified / inconclusive /
not applicable — with the provenance of every delay. Writes verdict.json and report.md.

- `line_rate`: busBW / line rate ≥ 98 % with no link failed — the median phase, on its bootstrap interval
  (phases resampled); "line rate" is the NICs' physical rate from the inventory when the study pulls
  leaf–spine links (pull: fabric), else the intact circuits' busBW as analysis.mixnet.all_to_all_time
  composes them;
- `latency_10pct`: p50 and p99 of the iteration times (an iteration's phases summed: the independent unit)
  at the smallest pulled fraction ≥ 10 % ÷ at 0 % are ≤ 1.07 — on distribution-free intervals
  (analysis.linkfail.inflation_interval); a p99 needs hundreds of iterations, and says so; the realised
  fraction is named (ceil of f·links);
- `flap_reaction`: every flap's reaction (link down → goodput ≥ 95 % of the new steady state) within
  `reaction_bound_ms`; the seed states no figure, so without a bound the verdict is inconclusive.
"holds" when the interval lies within the bound, "falsified" when entirely beyond, else "inconclusive"; on an
emulated bench they are said "consistent / inconsistent with the emulator's model" (the provenance's words);
on an emulated bench that ran slower than its own model at 0 % ("not calibrated"), inconclusive.
"""
from __future__ import annotations

import json

import numpy as np
import pandas as pd

from analysis import linkfail as lf
from harness.config import register_step
from harness.specs import Annotated, Expect, Field, Seconds, Spec
from harness.outcome import StepOutcome
from harness.bench.linkstudy import iteration_units, link_provenance

class SpectrumxParams(Spec):
    """Judge the Spectrum-X claims on the link studies of this run."""

    line_rate_fraction: Annotated[float, Field(gt=0, le=1), Expect("0 < line_rate_fraction <= 1")] = 0.98
    latency_inflation: Annotated[float, Field(ge=1), Expect("a value >= 1")] = 1.07
    at_failed_pct: float = 10.0
    reaction_bound_ms: Seconds = Field(0.0, description="0: none given (the seed states none) -> inconclusive")
    n_boot: Annotated[int, Field(ge=100), Expect("at least 100 resamples")] = 2000
    # emulated bench: the tools print what the fabric realised (devices/emulated/dataplane.py), however late
    # their threads run; when the median 0 % phase is still slower than the all-to-all model by more than
    # this (links not trained, a model mismatch), the bench did not keep its own model and every verdict is
    # inconclusive (what was judged would not be the data plane the claims are about).
    emulator_lateness_tolerance: Annotated[float, Field(ge=0), Expect("a value >= 0")] = 0.05


CLAIMS = {
    "line_rate": "effective bandwidth ≥ 98 % of line rate (busBW / line rate, no link failed)",
    "latency_10pct": "≤ 7 % latency increase (p50 and p99) with 10 % of the fabric links failed",
    "flap_reaction": "rapid reaction to link flaps (link down → goodput ≥ 95 % of the new steady state)",
}


def _judge(ci: tuple[float, float], bound: float, at_most: bool) -> str:
    lo, hi = ci
    if at_most:
        return "holds" if hi <= bound else "falsified" if lo > bound else "inconclusive"
    return "holds" if lo >= bound else "falsified" if hi < bound else "inconclusive"


def line_rate_claim(frame: pd.DataFrame, bound: float, rng, n_boot: int) -> dict:
    base = frame[frame["fail_pct"] == 0]
    if len(base) < 2:
        return {"verdict": "not applicable", "reason": "no phases with 0 % of the links failed"}
    # per phase busBW / line busBW = modelled intact time / measured time; the median phase (a busy host's
    # late wake-up inflates single phases; the run's aggregate stays in the link_failures table)
    frac = base["line_s"].to_numpy(dtype=float) / base["measured_s"].to_numpy(dtype=float)
    point = float(np.median(frac))
    idx = rng.integers(0, frac.size, size=(n_boot, frac.size))
    ci = tuple(float(x) for x in np.quantile(np.median(frac[idx], axis=1), [0.025, 0.975]))
    return {"verdict": _judge(ci, bound, at_most=False), "value": point, "ci95": list(ci), "bound": bound,
            "n_phases": int(len(base)), "statistic": "median phase"}


def latency_claim(frame: pd.DataFrame, bound: float, at_pct: float) -> dict:
    base = frame[frame["fail_pct"] == 0]
    realised = frame["failed_links"] / frame["links"]
    cand = frame[(realised >= at_pct / 100 - 1e-9) & (frame["failed_links"] > 0)]
    if len(base) < 1 or len(cand) < 1:
        return {"verdict": "not applicable", "reason": f"needs phases at 0 % and at >= {at_pct:g} % failed"}
    pct = float(cand["fail_pct"].min())
    g = frame[frame["fail_pct"] == pct]
    failed_units, base_units = iteration_units(g), iteration_units(base)
    out = {"at_fail_pct": pct, "realised_failed_fraction": float(g["failed_links"].iloc[0] / g["links"].iloc[0]),
           "bound": bound, "n_iterations": [int(base_units.size), int(failed_units.size)],
           "unit": ("round: one draw of failed links, its phases summed" if "unit" in g else
                    "iteration (its phases summed)")}
    # the claim is on both quantiles: either one's interval beyond the bound falsifies it, "holds" needs both
    # within; each quantile is judged only on an interval whose coverage is verified, and says what it lacks
    units = "rounds" if "unit" in g else "iterations"
    verdicts, said = [], []
    for q, name in ((0.5, "p50"), (0.99, "p99")):
        iv = lf.inflation_interval(failed_units, base_units, q)
        out[name] = {"value": iv["value"], "ci95": iv["ci"], "lower95": iv["lower"], "upper95": iv["upper"],
                     "needs_iterations": iv["needs_n"]}
        if iv["ci"] is not None:
            verdicts.append(_judge(tuple(iv["ci"]), bound, at_most=True))
            said.append(f"{name} {verdicts[-1]} on its interval {iv['ci'][0]:.3f}–{iv['ci'][1]:.3f}")
        elif iv["lower"] is not None and iv["lower"] > bound:
            verdicts.append("falsified")
            said.append(f"{name} falsified on its lower bound {iv['lower']:.3f}")
        else:
            verdicts.append("inconclusive")
            said.append(f"{name} needs >= {iv['needs_n']} {units} a side for an interval "
                        f"({min(out['n_iterations'])} ran)")
    out["verdict"] = ("falsified" if "falsified" in verdicts else "holds" if all(v == "holds" for v in verdicts)
                      else "inconclusive")
    out["per_quantile"] = dict(zip(("p50", "p99"), verdicts))
    if out["verdict"] == "inconclusive":
        out["reason"] = "; ".join(said)
    if out["realised_failed_fraction"] > at_pct / 100 + 1e-9:
        out["note"] = (f"{out['realised_failed_fraction']:.0%} of the links realised (the smallest pull >= "
                       f"{at_pct:g} % on this bench); a 'holds' carries over to {at_pct:g} %, a 'falsified' may not")
        if out["verdict"] == "falsified":
            out["verdict"] = "inconclusive"
    return out


def reaction_claim(flaps: list[dict], bound_ms: float) -> dict:
    if not flaps:
        return {"verdict": "not applicable", "reason": "no link_flaps step in this run"}
    lows = [f["reaction_low_ms"] for f in flaps]
    highs = [f["reaction_high_ms"] if f["reaction_high_ms"] is not None else float("inf") for f in flaps]
    out = {"reaction_ms": [[lo, hi if hi != float("inf") else None] for lo, hi in zip(lows, highs)],
           "bound_ms": bound_ms or None,
           "n_flaps": len(flaps)}
    if not bound_ms:
        out.update(verdict="inconclusive", reason="the seed gives no reaction-time figure; set reaction_bound_ms")
    elif max(highs) <= bound_ms:
        out["verdict"] = "holds"
    elif min(lows) > bound_ms:
        out["verdict"] = "falsified"
    else:
        out["verdict"] = "inconclusive"
    return out


def compute_verdict(failures: pd.DataFrame | None, flaps: list[dict], params: dict, seed: int, prov: dict) -> dict:
    rng = np.random.default_rng([int(seed), 8])
    empty = pd.DataFrame(columns=["fail_pct", "failed_links", "links", "max_rank_bytes", "measured_s",
                                  "line_s", "round", "iteration"])
    frame = failures if failures is not None and len(failures) else empty
    claims = [
        {"id": "line_rate", **line_rate_claim(frame, params["line_rate_fraction"], rng, params["n_boot"])},
        {"id": "latency_10pct", **latency_claim(frame, params["latency_inflation"], params["at_failed_pct"])},
        {"id": "flap_reaction", **reaction_claim(flaps, params["reaction_bound_ms"])},
    ]
    words = prov.get("words") or {}
    for c in claims:
        c["statement"] = CLAIMS[c["id"]]
        c["said"] = words.get(c["verdict"], c["verdict"])
    calibration = None
    base = frame[frame["fail_pct"] == 0]
    if prov.get("emulated") and len(base) and "modelled_intact_s" in base and base["modelled_intact_s"].notna().all():
        late = float(np.median(base["measured_s"].to_numpy(dtype=float) /
                               base["modelled_intact_s"].to_numpy(dtype=float))) - 1
        calibration = {"median_phase_lateness": late, "tolerance": params["emulator_lateness_tolerance"],
                       "calibrated": late <= params["emulator_lateness_tolerance"]}
        if not calibration["calibrated"]:
            for c in claims:
                if c["verdict"] in ("holds", "falsified"):
                    c["reason"] = (f"not calibrated: the emulated tools ran {late:.0%} slower than their own model "
                                   f"at 0 % (the machine was busy); the numbers say {c['verdict']}")
                    c["verdict"] = c["said"] = "inconclusive"
    return {"claims": claims, "provenance": prov, "emulator_calibration": calibration,
            "delays": {"detection": prov.get("detection"), "phase_times": prov.get("data_plane"),
                       "reaction": "hosts' agents, on the harness clock (CLOCK_MONOTONIC) with each host's clock "
                                   "uncertainty: the pulled ports' carrier drop (watch) → the first counter "
                                   "window (RDMA port_xmit_data) at >= 95 % of the new steady state"},
            "source_of_claims": "issue reading of the Spectrum-X abstract (spec algorithms.md §8: paper not found)"}


def interval_text(q: dict) -> str:
    if q["ci95"] is not None:
        return f"{q['ci95'][0]:.3f}–{q['ci95'][1]:.3f}"
    if q["lower95"] is not None:
        return f"≥ {q['lower95']:.3f} (needs {q['needs_iterations']} units a side for both ends)"
    return f"none (needs {q['needs_iterations']} units a side)"


def verdict_markdown(v: dict) -> str:
    prov = v["provenance"]
    lines = ["## Spectrum-X claims", ""]
    if prov.get("emulated"):
        lines += [f"**Emulated bench** (profile {prov.get('profile')}): these verdicts test the emulator's "
                  "data-plane model, not a Spectrum-X fabric; they say (in)consistent with the emulator's model.", ""]
    lines += ["| claim | verdict | value | 95 % interval | bound |", "|---|---|---|---|---|"]
    for c in v["claims"]:
        if c["id"] == "latency_10pct" and "p50" in c:
            value = f"p50 {c['p50']['value']:.3f}, p99 {c['p99']['value']:.3f} (at {c['at_fail_pct']:g} %)"
            ci = ", ".join(f"{q} {interval_text(c[q])}" for q in ("p50", "p99")) + \
                f" ({c['n_iterations'][1]} vs {c['n_iterations'][0]} units: {c['unit']})"
            bound = f"≤ {c['bound']:g}"
        elif c["id"] == "line_rate" and "value" in c:
            value, ci, bound = f"{c['value']:.3f}", f"{c['ci95'][0]:.3f}–{c['ci95'][1]:.3f}", f"≥ {c['bound']:g}"
        elif c["id"] == "flap_reaction" and "reaction_ms" in c:
            value = "; ".join(f"({lo:.2f}, {'∞' if hi is None else f'{hi:.2f}'}] ms" for lo, hi in c["reaction_ms"])
            ci, bound = "bounds per flap", "–" if not c["bound_ms"] else f"≤ {c['bound_ms']:g} ms"
        else:
            value, ci, bound = "–", "–", "–"
        lines.append(f"| {c['id']}: {c['statement']} | **{c.get('said', c['verdict'])}** | {value} | {ci} | {bound} |")
    lines.append("")
    cal = v.get("emulator_calibration")
    if cal:
        lines += [f"Emulator calibration: median 0 % phase {cal['median_phase_lateness']:+.1%} against the model "
                  f"(tolerance {cal['tolerance']:.0%}): {'calibrated' if cal['calibrated'] else 'NOT calibrated'}.",
                  ""]
    for c in v["claims"]:
        for key in ("reason", "note"):
            if c.get(key):
                lines.append(f"- {c['id']}: {c[key]}")
    lines += ["", "Provenance:", f"- claims: {v['source_of_claims']}",
              f"- detection delay: {json.dumps(v['delays']['detection'], ensure_ascii=False)}",
              f"- phase times: {v['delays']['phase_times']}", f"- reaction times: {v['delays']['reaction']}", ""]
    return "\n".join(lines)


@register_step("spectrumx_verdict", SpectrumxParams)
def spectrumx_verdict(ctx, step) -> StepOutcome:
    from harness import record as rec

    p = dict(step.params)
    if ctx.dry_run:
        return StepOutcome(ok=True, summary_md="(dry run: no verdict)")
    studies = [r.data["linkfail"] for r in ctx.results.values() if "linkfail" in (r.data or {})]
    frames = [pd.read_parquet(ctx.run_dir / s["parquet"]) for s in studies if s["kind"] == "failures"]
    failures = pd.concat(frames, ignore_index=True) if frames else None
    flaps = [row for s in studies if s["kind"] == "flaps" for row in s["table"]]
    prov = link_provenance(ctx.bench)
    for s in studies:  # a study over the leaf–spine names its fabric and data plane
        if s["provenance"].get("fabric"):
            prov.update(fabric=s["provenance"]["fabric"], data_plane=s["provenance"]["data_plane"])
    verdict = compute_verdict(failures, flaps, p, ctx.seed, prov)
    rec.write_text_atomic(ctx.run_dir / "verdict.json", json.dumps(
        {"schema_version": rec.RECORD_SCHEMA_VERSION, **verdict}, indent=1, allow_nan=False) + "\n")
    from harness import glossary

    md = verdict_markdown(verdict)
    rec.write_text_atomic(ctx.run_dir / "report.md", "# Spectrum-X falsification report\n\n" +
                          "\n".join(glossary.markdown(md)) + "\n" + md)
    return StepOutcome(ok=True, summary={c["id"]: c["verdict"] for c in verdict["claims"]}, summary_md=md,
                       artifacts=["verdict.json", "report.md"])
