"""Evaluate MixNet's claims against measured reconfiguration delays (spec algorithms.md §6.3 protocol).

Input: measured per-port delay samples (seconds) for "ocs" (mirror switching only) and "total"
(OCS + CDR + NIC link ready). For each model × link speed the MixNet timeline is evaluated with every
reconfiguration's delay drawn from the samples (max over the ports switched), by seeded Monte Carlo with a
bootstrap confidence interval, and compared with the fat-tree (no reconfiguration).

Verdicts come from the numbers only: "holds" when the CI of E[T_mix] is within the claim's threshold,
"falsified" when it is entirely beyond, "inconclusive" when it straddles the threshold or when the CI of the
per-reconfiguration delay straddles the critical delay d_c at which the claim flips. A claim over several
scenarios is falsified if any scenario falsifies it, holds if all hold, and is inconclusive otherwise.
Calibration: a scenario's verdict can only be "falsified" if the model reproduces the paper's own claim
under the paper's own assumptions (constant 25 ms, reconfiguration hidden behind the expert compute);
otherwise a falsification would be evidence against our workload model, not against MixNet, and the
verdict is reported as "inconclusive" with that reason.
The output dict is JSON-serialisable and identical for identical inputs and seed.
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Literal, Mapping, Sequence

import numpy as np

from analysis import cost as cost_model
from analysis import mixnet as mx
from analysis import moe_models as mm

DELAY_KINDS = ("ocs", "total")
PAPER_DELAY_S = 0.025
PAPER_OVERLAP = "all_hidden"     # the paper: reconfiguration hidden in the expert computation (spec §6.3)
NOT_CALIBRATED = "model does not reproduce the paper's claim at its own 25 ms assumption"

# The authors' own simulated iteration times, normalised (lower is faster), fat-tree vs MixNet at 25 ms:
# github.com/mixnet-project/mixnet-project.github.io data/normalized_performance.csv. "Qwen-MoE" is taken
# to be Qwen1.5-MoE-A2.7B and "Llama-MoE" LLaMA-MoE-v1-3.5B (2/8) (assumptions: the site names no variant).
PAPER_REPORTED_NORMALIZED: dict[tuple[str, int], tuple[float, float]] = {
    ("mixtral-8x22b", 100): (1.3743484582184033, 1.4541709245236023),
    ("mixtral-8x22b", 200): (1.1940221720447362, 1.2006052855934743),
    ("mixtral-8x22b", 400): (1.0816994101601314, 1.1138412705013914),
    ("mixtral-8x22b", 800): (1.0241518770911373, 1.0126344225828576),
    ("mixtral-8x7b", 100): (1.2098142915084984, 1.2487696208629178),
    ("mixtral-8x7b", 200): (1.0786571639450722, 1.0975801537020935),
    ("mixtral-8x7b", 400): (1.0302239853908406, 1.0309467182793302),
    ("mixtral-8x7b", 800): (1.0002911778848984, 1.0012663602248657),
    ("qwen1.5-moe-a2.7b", 100): (5.09418619126068, 6.173743766918513),
    ("qwen1.5-moe-a2.7b", 200): (2.730045083711109, 3.204935316618282),
    ("qwen1.5-moe-a2.7b", 400): (1.563193883429469, 1.7643737444680594),
    ("qwen1.5-moe-a2.7b", 800): (1.0, 1.0534585618520547),
    ("llama-moe-3.5b", 100): (3.9323615746392275, 5.009859032475658),
    ("llama-moe-3.5b", 200): (2.18810393086488, 2.7265517950688967),
    ("llama-moe-3.5b", 400): (1.3461747361073735, 1.599192937232423),
    ("llama-moe-3.5b", 800): (1.0, 1.1916720240604728),
}


def paper_reported_ratio(model: str, link_gbps: int) -> float | None:
    """T_mix / T_fat_tree in the authors' own simulation, or None when they did not publish it."""
    pair = PAPER_REPORTED_NORMALIZED.get((model, int(link_gbps)))
    return None if pair is None else pair[1] / pair[0]


class ClaimInputError(ValueError):
    """Missing or invalid measured delays or evaluation options."""


@dataclass
class Scenario:
    """One model at one link speed: both timelines and both fabric costs."""

    model: str
    link_gbps: int
    fat_tree: mx.Timeline
    mixnet: mx.Timeline
    cost_fat_tree: float
    cost_mixnet: float
    rail_optimized: mx.Timeline | None = None

    @property
    def t_fat_tree(self) -> float:
        return float(self.fat_tree.times(np.zeros((1, 0)))[0])


def build_scenarios(models: Sequence[str] = tuple(mm.MODELS), links: Sequence[int] = (100, 400), *,
                    gpu: str = "h100-sxm", parallelism: Mapping[str, mm.Parallelism] | None = None,
                    alpha: int = 6, overlap: Literal["simulator", "all_hidden"] = PAPER_OVERLAP,
                    reconfigure: Literal["always", "on_change"] = "on_change",
                    cost_basis: Literal["spec", "calculator"] = "calculator",
                    prices: dict[int, cost_model.Prices] | None = None, skew: float = 0.5,
                    seed: int = 0) -> list[Scenario]:
    """Timelines and costs per model × link speed. Costs are for the job's servers (pp·dp regions).

    Defaults (docs/mixnet.md): the paper's overlap ("all_hidden") and "on_change" reconfiguration (a port
    whose circuit is unchanged keeps its light, so it costs nothing); "simulator"/"always" are the
    released simulator's harsher choices.
    """
    par_table = dict(mm.DEFAULT_PARALLELISM)
    if parallelism:
        par_table.update(parallelism)
    if gpu not in mm.GPUS:
        raise ClaimInputError(f"unknown gpu {gpu!r}; known: {sorted(mm.GPUS)}")
    scenarios = []
    for name in models:
        model = mm.get_model(name)
        par = par_table.get(name)
        if par is None:
            raise ClaimInputError(f"no parallelism for model {name!r}")
        for link in links:
            common = dict(overlap=overlap, skew=skew, seed=seed)
            ft = mx.build_timeline(model, par, mm.GPUS[gpu], mx.Fabric("fat_tree", link), **common)
            mix = mx.build_timeline(model, par, mm.GPUS[gpu], mx.Fabric("mixnet", link, alpha=alpha),
                                    reconfigure=reconfigure, **common)
            rail = mx.build_timeline(model, par, mm.GPUS[gpu], mx.Fabric("rail_optimized", link), **common)
            costs = cost_model.fabric_costs(par.servers, link, alpha=alpha, nics_per_server=par.gpus_per_server,
                                            basis=cost_basis, prices=prices)
            scenarios.append(Scenario(name, int(link), ft, mix, costs["fat_tree"], costs["mixnet"], rail))
    return scenarios


def _samples(values, what: str) -> np.ndarray:
    a = np.asarray(values, dtype=float).ravel()
    if a.size == 0 or not np.all(np.isfinite(a)) or np.any(a < 0):
        raise ClaimInputError(f"{what}: need a non-empty array of finite, non-negative seconds")
    return a


def _measured_by_link(measured: Mapping, links: Sequence[int]
                      ) -> tuple[dict[int, dict[str, np.ndarray]], dict[str, np.ndarray]]:
    """Accept {"ocs": a, "total": b} for every link, or {link: {"ocs": a, "total": b}}; also return the pool."""
    if all(k in measured for k in DELAY_KINDS):
        shared = {k: _samples(measured[k], f"measured[{k!r}]") for k in DELAY_KINDS}
        return {int(link): shared for link in links}, shared
    out = {}
    for link in links:
        entry = measured.get(link, measured.get(str(link)))
        if entry is None or any(k not in entry for k in DELAY_KINDS):
            raise ClaimInputError(f"measured delays need keys {DELAY_KINDS} (for all links or for {link} Gb/s)")
        out[int(link)] = {k: _samples(entry[k], f"measured[{link}][{k!r}]") for k in DELAY_KINDS}
    if not out:
        raise ClaimInputError("no scenarios to evaluate")
    return out, {k: np.concatenate([out[link][k] for link in out]) for k in DELAY_KINDS}


def _summary_ms(samples: np.ndarray) -> dict:
    ms = samples * 1e3
    return {"mean": float(ms.mean()), "p50": float(np.percentile(ms, 50)), "p99": float(np.percentile(ms, 99)),
            "n": int(ms.size)}


def bootstrap_mixnet(timeline: mx.Timeline, samples: np.ndarray, rng: np.random.Generator, *, n_reps: int,
                     n_boot: int, per_port_max: bool = True, confidence: float = 0.95) -> dict:
    """E[T_mix] and the mean effective per-reconfiguration delay, each with a bootstrap percentile CI.

    Each bootstrap replicate resamples the measured samples, then runs `n_reps` Monte Carlo iterations.
    """
    point_t = mx.sample_iteration_times(timeline, samples, n_reps * max(1, n_boot // 4), rng, per_port_max)
    resampled = np.sort(samples[rng.integers(0, samples.size, size=(n_boot, samples.size))], axis=1)
    boot_t = np.empty(n_boot)
    dp = timeline.dp
    chunk = max(1, 4096 // (n_reps * dp))              # bootstrap replicates per vectorised batch
    for lo in range(0, n_boot, chunk):
        hi = min(n_boot, lo + chunk)
        if timeline.n_triggers == 0:
            boot_t[lo:hi] = timeline.times(np.zeros((1, 0)))[0]
            continue
        rows = np.repeat(np.arange(lo, hi), n_reps * dp)
        d = mx.draw_delays(timeline, resampled, rows.size, rng, per_port_max, sample_row=rows)
        t = timeline.times(d).reshape(hi - lo, n_reps, dp).max(axis=2)
        boot_t[lo:hi] = t.mean(axis=1)
    # mean over switching reconfigurations of E[max of k draws] per resample: P(max = s_(i)) = (i/n)^k − ((i−1)/n)^k
    switching = timeline.trig_ports > 0
    if switching.any():
        k = np.maximum(timeline.trig_ports, 1) if per_port_max else np.ones_like(timeline.trig_ports)
        ks, counts = np.unique(k[switching], return_counts=True)
        n = samples.size
        weights = (np.arange(1, n + 1) / n)[None, :] ** ks[:, None] - (np.arange(n) / n)[None, :] ** ks[:, None]
        boot_d = (resampled @ weights.T) @ counts / counts.sum()
    else:
        boot_d = np.zeros(n_boot)
    tail = (1 - confidence) / 2 * 100
    lo_t, hi_t = np.percentile(boot_t, [tail, 100 - tail])
    lo_d, hi_d = np.percentile(boot_d, [tail, 100 - tail])
    return {"t_mean_s": float(point_t.mean()), "t_ci_s": [float(lo_t), float(hi_t)],
            "delay_mean_s": float(boot_d.mean()), "delay_ci_s": [float(lo_d), float(hi_d)]}


def _verdict(ci: Sequence[float], threshold: float, delay_ci: Sequence[float] | None,
             critical_delay: float | None) -> str:
    if delay_ci is not None and critical_delay is not None and math.isfinite(critical_delay) \
            and delay_ci[0] <= critical_delay <= delay_ci[1]:
        return "inconclusive"
    if ci[1] <= threshold:
        return "holds"
    if ci[0] > threshold:
        return "falsified"
    return "inconclusive"


def _combine(verdicts: Sequence[str]) -> str:
    if not verdicts:
        return "inconclusive"
    if "falsified" in verdicts:
        return "falsified"
    if all(v == "holds" for v in verdicts):
        return "holds"
    return "inconclusive"


def _calibration_note(rows: Sequence[dict]) -> dict:
    """Claim-level calibration summary; a reason when some scenario's falsification was withheld."""
    missing = [f"{r['model']}@{r['link_gbps']}G" for r in rows
               if not (r["calibration"]["reproduced"] and r["calibration"]["reproduced_as_built"])]
    note = {"calibration": {"scenarios_reproduced": len(rows) - len(missing), "of": len(rows),
                            "not_reproduced": missing}}
    if any(r["verdict_reason"] for r in rows):
        note["calibration_reason"] = NOT_CALIBRATED
    return note


def delay_table(scenarios: Sequence[Scenario], delays_s: Sequence[float] = (0.0, 0.025, 0.045, 5.7), *,
                tolerance: float = 0.05, overlap: Literal["simulator", "all_hidden"] | None = None) -> list[dict]:
    """Per scenario: T_ft, T_mix at each constant delay, and the break-even delays (plain numbers, s / ms).

    `overlap` re-derives the mixnet timeline under another overlap variant (None: as built).
    """
    rows = []
    for sc in scenarios:
        mix = sc.mixnet if overlap is None else sc.mixnet.with_overlap(overlap)
        t_ft = sc.t_fat_tree
        t_mix = mx.constant_delay_times(mix, delays_s)
        loose, strict = mx.break_even_delay(mix, (1 + tolerance) * t_ft), mx.break_even_delay(mix, t_ft)
        rows.append(_plain({
            "model": sc.model, "link_gbps": sc.link_gbps, "overlap": mix.overlap, "t_fat_tree_s": t_ft,
            "delays_ms": [d * 1e3 for d in delays_s], "t_mixnet_s": t_mix, "ratio": t_mix / t_ft,
            "break_even_ms": _ms(loose), "break_even_strict_ms": _ms(strict),
            # None above means either "slower even at d = 0" or "never reached" (no port ever switches)
            "break_even_never_reached": loose is not None and math.isinf(loose),
            "reconfigurations_per_region": mix.reconfigurations_per_region,
            "paper_reported_ratio": paper_reported_ratio(sc.model, sc.link_gbps)}))
    return rows


def _plain(x):
    """Plain JSON types; non-finite floats become None."""
    if isinstance(x, dict):
        return {str(k): _plain(v) for k, v in x.items()}
    if isinstance(x, (list, tuple, np.ndarray)):
        return [_plain(v) for v in x]
    if isinstance(x, (bool, np.bool_)):
        return bool(x)
    if isinstance(x, (int, np.integer)):
        return int(x)
    if isinstance(x, (float, np.floating)):
        return float(x) if math.isfinite(x) else None
    return x


def _ms(seconds: float | None) -> float | None:
    return None if seconds is None or not math.isfinite(seconds) else seconds * 1e3


def evaluate_claims(measured: Mapping, *, scenarios: Sequence[Scenario] | None = None, seed: int = 0,
                    tolerance: float = 0.05, ce_targets: Mapping[int, float] | None = None,
                    paper_delay_s: float = PAPER_DELAY_S, verdict_delay: str = "total",
                    n_reps: int = 32, n_boot: int = 200, confidence: float = 0.95,
                    per_port_max: bool = True, plot_points: int = 48,
                    calibration_overlap: Literal["simulator", "all_hidden"] = PAPER_OVERLAP) -> dict:
    """Evaluate the iteration-time and cost-efficiency claims; see the module docstring.

    Returns {"claims": [...], "measured": {"ocs_ms", "total_ms"}, "break_even_ms": {model: d* (min over
    links)}, "break_even_ms_by_link": {model: {link: d*}}, "break_even_ms_strict_by_link", "plot": [...],
    "options"}. d* is the constant per-reconfiguration delay at which T_mix(d*) = (1 + tolerance)·T_ft,
    i.e. where the iteration-time claim flips; the strict variant uses T_ft itself (spec §6.3). None means
    MixNet misses the target even at d = 0.

    Calibration: each scenario's mixnet timeline is also evaluated at the constant `paper_delay_s` under
    `calibration_overlap` (the paper's variant by default) and as built. Where a claim's criterion fails
    under either, the model does not reproduce the paper under its own assumptions, so that scenario's
    verdict against the measured delays is "inconclusive" instead of "falsified" (`verdict_reason` says
    why). The top-level "calibration" summarises the iteration-time claim (`by_claim`: every claim);
    `reproduces_paper_at_25ms` refers to `calibration_overlap`.
    """
    if verdict_delay not in DELAY_KINDS:
        raise ClaimInputError(f"verdict_delay must be one of {DELAY_KINDS}")
    if calibration_overlap not in ("simulator", "all_hidden"):
        raise ClaimInputError("calibration_overlap must be 'simulator' or 'all_hidden'")
    if not 0 < confidence < 1 or n_reps < 1 or n_boot < 2 or tolerance < 0 or paper_delay_s < 0:
        raise ClaimInputError("need 0 < confidence < 1, n_reps >= 1, n_boot >= 2, tolerance >= 0, paper delay >= 0")
    ce_targets = {100: 1.2, 400: 1.9} if ce_targets is None else {int(k): float(v) for k, v in ce_targets.items()}
    scenarios = list(build_scenarios(seed=seed) if scenarios is None else scenarios)
    links = sorted({s.link_gbps for s in scenarios})
    delays, pooled = _measured_by_link(measured, links)
    seeds = np.random.SeedSequence(seed).spawn(len(scenarios) * len(DELAY_KINDS))

    per_scenario = []
    for si, sc in enumerate(scenarios):
        t_ft = sc.t_fat_tree
        t0, t_paper = (float(v) for v in mx.constant_delay_times(sc.mixnet, [0.0, paper_delay_s]))
        t_calibration = float(mx.constant_delay_times(sc.mixnet.with_overlap(calibration_overlap),
                                                      [paper_delay_s])[0])
        stats = {}
        for ki, kind in enumerate(DELAY_KINDS):
            rng = np.random.default_rng(seeds[si * len(DELAY_KINDS) + ki])
            stats[kind] = bootstrap_mixnet(sc.mixnet, delays[sc.link_gbps][kind], rng, n_reps=n_reps,
                                           n_boot=n_boot, per_port_max=per_port_max, confidence=confidence)
        ce_factor = t_ft * sc.cost_fat_tree / sc.cost_mixnet     # CE = ce_factor / T_mix
        per_scenario.append({"sc": sc, "t_ft": t_ft, "t0": t0, "t_paper": t_paper, "t_calibration": t_calibration,
                             "stats": stats, "ce_factor": ce_factor,
                             "break_even_s": mx.break_even_delay(sc.mixnet, (1 + tolerance) * t_ft),
                             "break_even_strict_s": mx.break_even_delay(sc.mixnet, t_ft)})

    def evaluate(threshold_of, applies) -> tuple[str, list]:
        rows = []
        for row in per_scenario:
            sc = row["sc"]
            if not applies(sc):
                continue
            thr = threshold_of(row)
            d_c = mx.break_even_delay(sc.mixnet, thr)
            by_delay = {"paper_25ms": "holds" if row["t_paper"] <= thr else "falsified", "zero_delay":
                        "holds" if row["t0"] <= thr else "falsified"}
            # every criterion here is "T_mix <= threshold". The paper's claim must be reproduced at 25 ms both
            # under the paper's overlap and by the timeline the verdict uses (which may be built harsher)
            reproduced = row["t_calibration"] <= thr
            reproduced_as_built = row["t_paper"] <= thr
            calibrated = reproduced and reproduced_as_built
            raw = {}
            for kind in DELAY_KINDS:
                st = row["stats"][kind]
                raw[kind] = _verdict(st["t_ci_s"], thr, st["delay_ci_s"], d_c)
                # an uncalibrated model cannot falsify the paper on its own
                by_delay[kind] = "inconclusive" if raw[kind] == "falsified" and not calibrated else raw[kind]
            gated = by_delay[verdict_delay] != raw[verdict_delay]
            rows.append({
                "model": sc.model, "link_gbps": sc.link_gbps, "threshold_s": thr,
                "critical_delay_ms": _ms(d_c), "critical_delay_never_reached": d_c is not None and math.isinf(d_c),
                "t_fat_tree_s": row["t_ft"], "t_mixnet_zero_delay_s": row["t0"],
                "t_rail_optimized_s": None if sc.rail_optimized is None else
                float(sc.rail_optimized.times(np.zeros((1, 0)))[0]),
                "t_mixnet_paper_s": row["t_paper"],
                **{f"t_mixnet_{k}_s": {"mean": row["stats"][k]["t_mean_s"], "ci": row["stats"][k]["t_ci_s"]}
                   for k in DELAY_KINDS},
                **{f"delay_per_reconfiguration_{k}_ms": {
                    "mean": row["stats"][k]["delay_mean_s"] * 1e3,
                    "ci": [v * 1e3 for v in row["stats"][k]["delay_ci_s"]]} for k in DELAY_KINDS},
                "cost_efficiency": {"zero_delay": row["ce_factor"] / row["t0"],
                                    "paper_25ms": row["ce_factor"] / row["t_paper"],
                                    **{k: row["ce_factor"] / row["stats"][k]["t_mean_s"] for k in DELAY_KINDS}},
                "cost_fat_tree_usd": sc.cost_fat_tree, "cost_mixnet_usd": sc.cost_mixnet,
                "reconfigurations_per_region": sc.mixnet.reconfigurations_per_region,
                "calibration": {"reproduced": reproduced, "reproduced_as_built": reproduced_as_built,
                                "overlap": calibration_overlap, "overlap_as_built": sc.mixnet.overlap,
                                "delay_ms": paper_delay_s * 1e3, "t_mixnet_s": row["t_calibration"],
                                "paper_reported_ratio": paper_reported_ratio(sc.model, sc.link_gbps)},
                "verdict_by_delay": by_delay, "verdict": by_delay[verdict_delay],
                "verdict_uncalibrated": raw[verdict_delay],
                "verdict_reason": NOT_CALIBRATED if gated else None,
            })
        return _combine([r["verdict"] for r in rows]), rows

    claims = []
    verdict, rows = evaluate(lambda r: (1 + tolerance) * r["t_ft"], lambda sc: True)
    claims.append({
        "id": "iteration_time_within_fat_tree",
        "statement": f"MixNet's iteration time is within {tolerance:.0%} of a non-blocking fat-tree's",
        "criterion": f"E[T_mix(d)] <= {1 + tolerance:g} x T_fat_tree for every model and link speed, "
                     f"d ~ measured {verdict_delay} delay (max over ports switched)",
        "verdict": verdict, "evidence": {"delay_kind": verdict_delay, "scenarios": rows, **_calibration_note(rows)}})
    for link, target in sorted(ce_targets.items()):
        verdict, rows = evaluate(lambda r, t=target: r["ce_factor"] / t, lambda sc, lk=link: sc.link_gbps == lk)
        claims.append({
            "id": f"cost_efficiency_{link}g",
            "statement": f"MixNet's cost-efficiency is at least {target:g}x the fat-tree's at {link} Gb/s",
            "criterion": f"(T_ft x Cost_ft) / (E[T_mix(d)] x Cost_mix) >= {target:g} for every model at "
                         f"{link} Gb/s, d ~ measured {verdict_delay} delay",
            "verdict": verdict if rows else "inconclusive",
            "evidence": {"delay_kind": verdict_delay, "scenarios": rows, **_calibration_note(rows),
                         **({} if rows else {"reason": f"no scenario at {link} Gb/s"})}})

    break_even_by_link: dict[str, dict[str, float | None]] = {}
    break_even_strict: dict[str, dict[str, float | None]] = {}
    for row in per_scenario:
        break_even_by_link.setdefault(row["sc"].model, {})[str(row["sc"].link_gbps)] = _ms(row["break_even_s"])
        break_even_strict.setdefault(row["sc"].model, {})[str(row["sc"].link_gbps)] = \
            _ms(row["break_even_strict_s"])
    break_even = {}
    for model, by_link in break_even_by_link.items():
        if any(v is None for v in by_link.values()):
            # MixNet is slower than the fat-tree at d = 0 on some link: no delay breaks even
            break_even[model] = None
        else:
            break_even[model] = min(by_link.values())

    plot = []
    for row in per_scenario:
        sc = row["sc"]
        markers = {"paper_ms": paper_delay_s * 1e3,
                   "ocs_mean_ms": float(delays[sc.link_gbps]["ocs"].mean() * 1e3),
                   "total_mean_ms": float(delays[sc.link_gbps]["total"].mean() * 1e3),
                   "break_even_ms": _ms(row["break_even_s"])}
        top = max([paper_delay_s, float(np.percentile(delays[sc.link_gbps]["total"], 99))]
                  + ([row["break_even_s"]] if row["break_even_s"] and math.isfinite(row["break_even_s"]) else []))
        grid = np.unique(np.concatenate([np.linspace(0.0, 1.2 * top, plot_points),
                                         [v / 1e3 for v in markers.values() if v is not None]]))
        plot.append({"model": sc.model, "link_gbps": sc.link_gbps, "delay_ms": grid * 1e3,
                     "t_mixnet_s": mx.constant_delay_times(sc.mixnet, grid), "t_fat_tree_s": row["t_ft"],
                     "t_mixnet_measured_s": {k: row["stats"][k]["t_mean_s"] for k in DELAY_KINDS},
                     "markers": markers})
    by_claim = {c["id"]: c["evidence"]["calibration"] for c in claims}
    time_rows = claims[0]["evidence"]["scenarios"]
    calibration = {
        "reproduces_paper_at_25ms": bool(time_rows) and all(r["calibration"]["reproduced"] for r in time_rows),
        "scenarios_reproduced": sum(r["calibration"]["reproduced"] for r in time_rows), "of": len(time_rows),
        "scenarios_reproduced_as_built": sum(r["calibration"]["reproduced_as_built"] for r in time_rows),
        "overlap": calibration_overlap, "delay_ms": paper_delay_s * 1e3, "claim": claims[0]["id"],
        "scenarios": [{"model": r["model"], "link_gbps": r["link_gbps"], "t_fat_tree_s": r["t_fat_tree_s"],
                       "t_mixnet_s": r["calibration"]["t_mixnet_s"],
                       "ratio": r["calibration"]["t_mixnet_s"] / r["t_fat_tree_s"],
                       "reproduced": r["calibration"]["reproduced"],
                       "reproduced_as_built": r["calibration"]["reproduced_as_built"],
                       "paper_reported_ratio": r["calibration"]["paper_reported_ratio"]} for r in time_rows],
        "by_claim": by_claim,
    }
    return _plain({
        "claims": claims,
        "calibration": calibration,
        "measured": {f"{k}_ms": _summary_ms(pooled[k]) for k in DELAY_KINDS},
        "break_even_ms": break_even,
        "break_even_ms_by_link": break_even_by_link,
        "break_even_ms_strict_by_link": break_even_strict,
        "plot": [{**p, "delay_ms": p["delay_ms"].tolist(), "t_mixnet_s": p["t_mixnet_s"].tolist()} for p in plot],
        "options": {"seed": seed, "tolerance": tolerance, "ce_targets": {str(k): v for k, v in ce_targets.items()},
                    "paper_delay_ms": paper_delay_s * 1e3, "verdict_delay": verdict_delay, "n_reps": n_reps,
                    "n_boot": n_boot, "confidence": confidence, "per_port_max": per_port_max,
                    "calibration_overlap": calibration_overlap},
    })
