"""Evaluate MixNet's claims against measured reconfiguration delays (spec algorithms.md §6.3 protocol).

Claims are declared data (`Claim`: id, statement, quantity, criterion, the link speeds it applies to), the
criteria validators in the OpenHTF spirit (`InRange`, `WithinPercent`). For each model × link speed
(`Scenario`) the MixNet timeline is evaluated with every reconfiguration's delay drawn from the measured
delays *with the bench's structure* (`analysis.mixnet.CycleDelays`: whole cycles resampled, or a fitted
shared OCS + per-port NIC decomposition beyond the bench's port count), by seeded Monte Carlo inside a
cluster bootstrap over cycles, and compared with the fat-tree.

Per scenario and claim:
- **not applicable** when the model never moves a circuit (no reconfiguration delay can enter its time);
- **inconclusive** ("not calibrated") when the model does not reproduce the paper at the paper's own 25 ms
  on both sides — its iteration-time ratio within a declared tolerance of the authors' own figure AND its
  cost-efficiency inside the paper's range for the link speed (`Calibration`);
- otherwise from the numbers: "holds" when the CI of E[T_mix] is within the claim's bound, "falsified" when
  entirely beyond, "inconclusive" when it straddles it or the CI of the mean delay straddles the critical
  delay at which the claim flips.
A claim at one point of the assumption grid is falsified if a calibrated, applicable scenario falsifies
it, holds if all such scenarios hold. Over the declared grid (`Assumptions`, `assumption_grid`):
"falsified" only when every calibrated point falsifies, "falsified if …" naming the points that do, "holds"
when every calibrated point holds, "inconclusive" otherwise. Grid points run on a local process pool; the
result is identical to a serial run (each point is seeded the same way wherever it runs).
The output is JSON-serialisable and identical for identical inputs and seed.
"""
from __future__ import annotations

import math
import multiprocessing
from concurrent.futures import ProcessPoolExecutor
from dataclasses import asdict, dataclass, field, fields, replace
from typing import Literal, Mapping, Sequence

import numpy as np

from analysis import cost as cost_model
from analysis import mixnet as mx
from analysis import moe_models as mm

DELAY_KINDS = ("ocs", "total")
PAPER_DELAY_S = 0.025
PAPER_DELAY_SOURCE = "the MixNet paper's simulation assumption (25 ms per reconfiguration), not a measurement"
MODEL_DELAY_SOURCE = "model output: the constant delay per reconfiguration at which the claim's bound is met"

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
# The paper's cost-efficiency ranges per link speed (spec §0/§6.4: "1.2–2.3x better cost").
PAPER_CE_RANGES: dict[int, tuple[float, float]] = {100: (1.2, 1.5), 400: (1.9, 2.3)}


def paper_reported_ratio(model: str, link_gbps: int) -> float | None:
    """T_mix / T_fat_tree in the authors' own simulation, or None when they did not publish it."""
    pair = PAPER_REPORTED_NORMALIZED.get((model, int(link_gbps)))
    return None if pair is None else pair[1] / pair[0]


class ClaimInputError(ValueError):
    """Missing or invalid measured delays or evaluation options."""


# ---------------------------------------------------------------------------------------------- validators

@dataclass(frozen=True)
class InRange:
    """lo <= value <= hi (either side may be open)."""

    lo: float | None = None
    hi: float | None = None

    def ok(self, value: float) -> bool:
        return (self.lo is None or value >= self.lo) and (self.hi is None or value <= self.hi)

    def describe(self) -> str:
        if self.lo is None:
            return f"<= {self.hi:g}"
        if self.hi is None:
            return f">= {self.lo:g}"
        return f"in [{self.lo:g}, {self.hi:g}]"


def at_most(limit: float) -> InRange:
    return InRange(hi=float(limit))


def at_least(limit: float) -> InRange:
    return InRange(lo=float(limit))


@dataclass(frozen=True)
class WithinPercent:
    """|value − expected| <= percent % of |expected| (both sides)."""

    expected: float
    percent: float

    def ok(self, value: float) -> bool:
        return abs(value - self.expected) <= self.percent / 100 * abs(self.expected) * (1 + 1e-12)

    def describe(self) -> str:
        return f"within ±{self.percent:g} % of {self.expected:.4g}"


# ---------------------------------------------------------------------------------------------- claims

QUANTITIES = {"iteration_ratio": "E[T_mix] / T_fat_tree",
              "cost_efficiency": "(T_ft x Cost_ft) / (E[T_mix] x Cost_mix)"}


@dataclass(frozen=True)
class Claim:
    """A claim of the paper as data: `criterion` on `quantity`, for the scenarios at `links` (None: all)."""

    id: str
    statement: str
    quantity: Literal["iteration_ratio", "cost_efficiency"]
    criterion: InRange
    links: tuple[int, ...] | None = None

    def __post_init__(self) -> None:
        if self.quantity not in QUANTITIES:
            raise ClaimInputError(f"claim {self.id}: unknown quantity {self.quantity!r}")
        upper = self.quantity == "iteration_ratio"
        if (self.criterion.hi is None) != (not upper) or (self.criterion.lo is None) != upper:
            raise ClaimInputError(f"claim {self.id}: an iteration-ratio claim needs an upper bound, a "
                                  "cost-efficiency claim a lower bound")

    def applies_to(self, link_gbps: int) -> bool:
        return self.links is None or int(link_gbps) in self.links

    def value(self, t_mix: float, t_ft: float, cost_ratio: float) -> float:
        return t_mix / t_ft if self.quantity == "iteration_ratio" else cost_ratio * t_ft / t_mix

    def time_bound(self, t_ft: float, cost_ratio: float) -> float:
        """The largest E[T_mix] (s) that meets the criterion."""
        if self.quantity == "iteration_ratio":
            return self.criterion.hi * t_ft
        return cost_ratio * t_ft / self.criterion.lo

    def describe(self) -> str:
        where = "every model and link speed" if self.links is None else \
            "every model at " + ", ".join(f"{lk} Gb/s" for lk in self.links)
        return f"{QUANTITIES[self.quantity]} {self.criterion.describe()} for {where}"


def paper_claims(tolerance: float = 0.05, ce_targets: Mapping[int, float] | None = None) -> tuple[Claim, ...]:
    """MixNet's headline claims: iteration time within `tolerance` of the fat-tree, cost-efficiency targets."""
    targets = {100: 1.2, 400: 1.9} if ce_targets is None else {int(k): float(v) for k, v in ce_targets.items()}
    out = [Claim("iteration_time_within_fat_tree",
                 f"MixNet's iteration time is within {tolerance:.0%} of a non-blocking fat-tree's",
                 "iteration_ratio", at_most(1 + tolerance))]
    for link, target in sorted(targets.items()):
        out.append(Claim(f"cost_efficiency_{link}g",
                         f"MixNet's cost-efficiency is at least {target:g}x the fat-tree's at {link} Gb/s",
                         "cost_efficiency", at_least(target), (link,)))
    return tuple(out)


@dataclass(frozen=True)
class Calibration:
    """Does a scenario reproduce the paper at its own `delay_s`? Both sides, both quantities:
    T_mix/T_ft within `ratio_tolerance_pct` of the authors' own ratio, and the cost-efficiency inside the
    paper's range for the link speed (`ce_ranges`, widened by `ce_tolerance_pct` of each bound)."""

    delay_s: float = PAPER_DELAY_S
    ratio_tolerance_pct: float = 5.0
    ce_ranges: tuple[tuple[int, float, float], ...] = tuple((k, lo, hi) for k, (lo, hi) in PAPER_CE_RANGES.items())
    ce_tolerance_pct: float = 0.0

    def ce_range(self, link_gbps: int) -> InRange | None:
        for link, lo, hi in self.ce_ranges:
            if int(link) == int(link_gbps):
                w = self.ce_tolerance_pct / 100
                return InRange(lo * (1 - w), hi * (1 + w))
        return None

    def describe(self) -> str:
        ranges = ", ".join(f"{lo:g}–{hi:g} at {k} Gb/s" for k, lo, hi in self.ce_ranges)
        return (f"at a constant {self.delay_s * 1e3:g} ms: T_mix/T_ft within ±{self.ratio_tolerance_pct:g} % "
                f"of the authors' own ratio and cost-efficiency inside the paper's range ({ranges}"
                f"{f', ±{self.ce_tolerance_pct:g} %' if self.ce_tolerance_pct else ''})")

    def check(self, sc: "Scenario") -> dict:
        t = float(mx.constant_delay_times(sc.mixnet, [self.delay_s])[0])
        ratio, ce = t / sc.t_fat_tree, sc.cost_ratio * sc.t_fat_tree / t
        paper = paper_reported_ratio(sc.model, sc.link_gbps)
        ce_rng = self.ce_range(sc.link_gbps)
        ratio_ok = paper is not None and WithinPercent(paper, self.ratio_tolerance_pct).ok(ratio)
        ce_ok = ce_rng is not None and ce_rng.ok(ce)
        why, short = [], []
        if paper is None:
            why.append("the paper reports no iteration time for this model")
            short.append("no paper ratio")
        elif not ratio_ok:
            why.append(f"T_mix/T_ft {ratio:.3f} at {self.delay_s * 1e3:g} ms is not "
                       f"{WithinPercent(paper, self.ratio_tolerance_pct).describe()} (the authors' own)")
            short.append(f"ratio {ratio:.3f} vs paper {paper:.3f} ±{self.ratio_tolerance_pct:g} %")
        if ce_rng is None:
            why.append(f"the paper gives no cost-efficiency range at {sc.link_gbps} Gb/s")
            short.append("no paper CE range")
        elif not ce_ok:
            why.append(f"cost-efficiency {ce:.2f} at {self.delay_s * 1e3:g} ms is not {ce_rng.describe()} "
                       f"(the paper's, {sc.cost_basis} cost basis)")
            short.append(f"CE {ce:.2f} not in [{ce_rng.lo:g}, {ce_rng.hi:g}]")
        return {"calibrated": bool(ratio_ok and ce_ok), "delay_ms": self.delay_s * 1e3, "t_mixnet_s": t,
                "ratio": ratio, "paper_ratio": paper, "ratio_ok": bool(ratio_ok), "cost_efficiency": ce,
                "paper_ce_range": None if ce_rng is None else [ce_rng.lo, ce_rng.hi], "ce_ok": bool(ce_ok),
                "reason": None if not why else "not calibrated: " + "; ".join(why),
                "short": None if not short else "not calibrated at 25 ms: " + "; ".join(short)}


# ---------------------------------------------------------------------------------------------- scenarios

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
    region_servers: int = 0
    alpha: int = 6
    cost_basis: str = "paper"

    @property
    def name(self) -> str:
        return f"{self.model}@{self.link_gbps}G"

    @property
    def t_fat_tree(self) -> float:
        return float(self.fat_tree.times(np.zeros((1, 0)))[0])

    @property
    def cost_ratio(self) -> float:
        return self.cost_fat_tree / self.cost_mixnet

    @property
    def moves_circuits(self) -> bool:
        return bool(np.any(self.mixnet.trig_ports > 0))

    def not_applicable_reason(self) -> str | None:
        """Why no reconfiguration delay can enter this scenario's iteration time (None: it can)."""
        if self.moves_circuits:
            return None
        n, a = self.region_servers, self.alpha
        mesh = f" >= n − 1 = {n - 1}, so the greedy wires a full mesh once" if n and a >= n - 1 else ""
        return (f"its {n}-server region with α = {a} OCS ports per server{mesh}; the model never moves a "
                "circuit, so no reconfiguration delay enters its iteration time")

    def not_applicable_short(self) -> str | None:
        return None if self.moves_circuits else \
            f"{self.region_servers}-server region, α = {self.alpha}: circuits never move"


def build_scenarios(models: Sequence[str] = tuple(mm.MODELS), links: Sequence[int] = (100, 400), *,
                    gpu: str = "h100-sxm", mfu: float | None = None,
                    parallelism: Mapping[str, mm.Parallelism] | None = None,
                    alpha: int = 6, overlap: Literal["simulator", "all_hidden"] = "all_hidden",
                    reconfigure: Literal["always", "on_change"] = "on_change",
                    greedy: Literal["simulator", "paper"] = "simulator",
                    cost_basis: Literal["paper", "calculator", "spec"] = "paper",
                    prices: dict[int, cost_model.Prices] | None = None, skew: float = 0.5,
                    seed: int = 0) -> list[Scenario]:
    """Timelines and costs per model × link speed. Costs are for the job's servers (pp·dp regions).

    Defaults (docs/mixnet.md): the paper's overlap ("all_hidden"), "on_change" reconfiguration (a port whose
    circuit is unchanged keeps its light), the released simulator's greedy (`greedy="paper"`: Algorithm 1 as
    the paper words it), and the "paper" cost basis (EPS switch ports charged).
    """
    par_table = dict(mm.DEFAULT_PARALLELISM)
    if parallelism:
        par_table.update(parallelism)
    if gpu not in mm.GPUS:
        raise ClaimInputError(f"unknown gpu {gpu!r}; known: {sorted(mm.GPUS)}")
    if greedy not in ("simulator", "paper"):
        raise ClaimInputError(f"greedy must be 'simulator' or 'paper', got {greedy!r}")
    if cost_basis not in cost_model.BASES:
        raise ClaimInputError(f"cost_basis must be one of {cost_model.BASES}, got {cost_basis!r}")
    spec = mm.GPUS[gpu] if mfu is None else replace(mm.GPUS[gpu], mfu=float(mfu))
    if not 0 < spec.mfu <= 1:
        raise ClaimInputError(f"mfu must be in (0, 1], got {spec.mfu}")
    scenarios = []
    for name in models:
        model = mm.get_model(name)
        par = par_table.get(name)
        if par is None:
            raise ClaimInputError(f"no parallelism for model {name!r}")
        for link in links:
            common = dict(overlap=overlap, skew=skew, seed=seed)
            ft = mx.build_timeline(model, par, spec, mx.Fabric("fat_tree", link), **common)
            mix = mx.build_timeline(model, par, spec, mx.Fabric("mixnet", link, alpha=alpha,
                                                                code_compat_greedy=greedy == "simulator"),
                                    reconfigure=reconfigure, **common)
            rail = mx.build_timeline(model, par, spec, mx.Fabric("rail_optimized", link), **common)
            costs = cost_model.fabric_costs(par.servers, link, alpha=alpha, nics_per_server=par.gpus_per_server,
                                            basis=cost_basis, prices=prices)
            scenarios.append(Scenario(name, int(link), ft, mix, costs["fat_tree"], costs["mixnet"], rail,
                                      region_servers=par.region_servers, alpha=alpha, cost_basis=cost_basis))
    return scenarios


# ---------------------------------------------------------------------------------------------- delays

def as_cycle_delays(measured: Mapping) -> dict[str, mx.CycleDelays]:
    """{"ocs": CycleDelays, "total": CycleDelays}; plain arrays are accepted as (cycles, ports) matrices
    with no shared component (1-D: one port per cycle)."""
    out = {}
    for kind in DELAY_KINDS:
        if kind not in measured:
            raise ClaimInputError(f"measured delays need keys {DELAY_KINDS}")
        value = measured[kind]
        if isinstance(value, mx.CycleDelays):
            out[kind] = value
            continue
        a = np.asarray(value, dtype=float)
        a = a[:, None] if a.ndim == 1 else a
        try:
            out[kind] = mx.CycleDelays(a, np.zeros(a.shape[0]) if a.size else np.zeros(0), "unspecified")
        except mx.MixnetInputError as exc:
            raise ClaimInputError(f"measured[{kind!r}]: {exc}") from None
    return out


def delay_summary(delays: mx.CycleDelays) -> dict:
    """What was measured, counted once per cycle: the cycle's slowest port (with analysis.stats' intervals,
    whose unit is the cycle) and the shared component."""
    from analysis.stats import summarize

    slowest = delays.cycle_max() * 1e3
    return {"source": delays.source, "cycles": delays.n_cycles, "ports_per_cycle": delays.bench_ports,
            "per_cycle_slowest_port_ms": {"median": float(np.median(slowest)), "min": float(slowest.min()),
                                          **summarize(slowest, 0)},
            "shared_component_ms": {"mean": float(delays.shared.mean() * 1e3)},
            "per_port_mean_ms": float(delays.samples().mean() * 1e3)}


def bootstrap_mixnet(timeline: mx.Timeline, delays: mx.CycleDelays, rng: np.random.Generator, *, n_reps: int,
                     n_boot: int, confidence: float = 0.95) -> dict:
    """E[T_mix] and the mean delay per switching reconfiguration, each with a cluster-bootstrap percentile CI:
    every replicate resamples whole cycles, then runs `n_reps` Monte Carlo iterations on them."""
    point_t = mx.sample_iteration_times(timeline, delays, n_reps * max(1, n_boot // 4), rng)
    switching = timeline.trig_ports > 0
    rows = n_reps * timeline.dp
    boot_t, boot_d = np.empty(n_boot), np.zeros(n_boot)
    chunk = max(1, 2048 // rows)
    for lo in range(0, n_boot, chunk):
        hi = min(n_boot, lo + chunk)
        if timeline.n_triggers == 0:
            boot_t[lo:hi] = timeline.times(np.zeros((1, 0)))[0]
            continue
        draws = np.concatenate([mx.draw_delays(timeline.trig_ports,
                                               delays.take(rng.integers(0, delays.n_cycles, delays.n_cycles)),
                                               rows, rng) for _ in range(lo, hi)])
        boot_t[lo:hi] = timeline.times(draws).reshape(hi - lo, n_reps, timeline.dp).max(axis=2).mean(axis=1)
        if switching.any():
            boot_d[lo:hi] = draws.reshape(hi - lo, rows, -1)[:, :, switching].mean(axis=(1, 2))
    tail = (1 - confidence) / 2 * 100
    return {"t_mean_s": float(point_t.mean()), "t_ci_s": [float(v) for v in np.percentile(boot_t, [tail, 100 - tail])],
            "delay_mean_s": float(boot_d.mean()),
            "delay_ci_s": [float(v) for v in np.percentile(boot_d, [tail, 100 - tail])]}


def _verdict(ci: Sequence[float], bound: float, delay_ci: Sequence[float] | None,
             critical_delay: float | None) -> str:
    if delay_ci is not None and critical_delay is not None and math.isfinite(critical_delay) \
            and delay_ci[0] <= critical_delay <= delay_ci[1]:
        return "inconclusive"
    if ci[1] <= bound:
        return "holds"
    if ci[0] > bound:
        return "falsified"
    return "inconclusive"


# ---------------------------------------------------------------------------------------------- one point

def evaluate_point(measured: Mapping, scenarios: Sequence[Scenario], *, claims: Sequence[Claim] | None = None,
                   calibration: Calibration = Calibration(), seed: int = 0, verdict_delay: str = "total",
                   n_reps: int = 32, n_boot: int = 200, confidence: float = 0.95, full: bool = True) -> dict:
    """Every scenario's numbers and per-claim verdicts at one set of assumptions, and the claims' verdicts
    there: {"scenarios": [...], "claims": {id: {"verdict", "falsified_by", "reason"}}}.

    `full=False` (the grid's other points) runs the Monte Carlo only where it can decide a verdict: the
    `verdict_delay` kind of calibrated scenarios that move circuits."""
    if verdict_delay not in DELAY_KINDS:
        raise ClaimInputError(f"verdict_delay must be one of {DELAY_KINDS}")
    if not 0 < confidence < 1 or n_reps < 1 or n_boot < 2:
        raise ClaimInputError("need 0 < confidence < 1, n_reps >= 1, n_boot >= 2")
    claims = tuple(paper_claims() if claims is None else claims)
    delays = as_cycle_delays(measured)
    seeds = np.random.SeedSequence(seed).spawn(len(scenarios) * len(DELAY_KINDS))
    rows = []
    for si, sc in enumerate(scenarios):
        t_ft = sc.t_fat_tree
        t0 = float(mx.constant_delay_times(sc.mixnet, [0.0])[0])
        na = sc.not_applicable_reason()
        row = {"scenario": sc.name, "model": sc.model, "link_gbps": sc.link_gbps, "t_fat_tree_s": t_ft,
               "t_mixnet_zero_delay_s": t0, "t_rail_optimized_s": None if sc.rail_optimized is None else
               float(sc.rail_optimized.times(np.zeros((1, 0)))[0]),
               "cost_fat_tree_usd": sc.cost_fat_tree, "cost_mixnet_usd": sc.cost_mixnet,
               "cost_ratio": sc.cost_ratio, "cost_basis": sc.cost_basis,
               "region_servers": sc.region_servers, "reconfigurations_per_region": sc.mixnet.reconfigurations_per_region,
               "applicable": na is None, "not_applicable_reason": na, "calibration": calibration.check(sc),
               "break_even_ms": _ms(mx.break_even_delay(sc.mixnet, claims[0].time_bound(t_ft, sc.cost_ratio)))
               if claims and claims[0].quantity == "iteration_ratio" else None,
               "delay_model": {}, "t_mixnet_s": {}, "delay_per_reconfiguration_ms": {}, "claims": {},
               "delay_sources": {**{f"measured_{k}": delays[k].source for k in DELAY_KINDS},
                                 "calibration_delay": PAPER_DELAY_SOURCE, "break_even_ms": MODEL_DELAY_SOURCE,
                                 "critical_delay_ms": MODEL_DELAY_SOURCE}}
        stats = {}
        decides = na is None and row["calibration"]["calibrated"]
        for ki, kind in enumerate(DELAY_KINDS):
            row["delay_model"][kind] = mx.delay_model_of(sc.mixnet.trig_ports, delays[kind].bench_ports)
            if na is not None:      # nothing switches: the delay never enters, T_mix = T_mix(0)
                stats[kind] = {"t_mean_s": t0, "t_ci_s": [t0, t0], "delay_mean_s": 0.0, "delay_ci_s": [0.0, 0.0]}
            elif not full and not (decides and kind == verdict_delay):
                stats[kind] = {"t_mean_s": math.nan, "t_ci_s": [math.nan, math.nan], "delay_mean_s": math.nan,
                               "delay_ci_s": [math.nan, math.nan]}
            else:
                rng = np.random.default_rng(seeds[si * len(DELAY_KINDS) + ki])
                stats[kind] = bootstrap_mixnet(sc.mixnet, delays[kind], rng, n_reps=n_reps, n_boot=n_boot,
                                               confidence=confidence)
            row["t_mixnet_s"][kind] = {"mean": stats[kind]["t_mean_s"], "ci": stats[kind]["t_ci_s"]}
            row["delay_per_reconfiguration_ms"][kind] = {"mean": stats[kind]["delay_mean_s"] * 1e3,
                                                         "ci": [v * 1e3 for v in stats[kind]["delay_ci_s"]]}
        for claim in claims:
            if not claim.applies_to(sc.link_gbps):
                continue
            bound = claim.time_bound(t_ft, sc.cost_ratio)
            d_c = mx.break_even_delay(sc.mixnet, bound)
            st = stats[verdict_delay]
            raw = _verdict(st["t_ci_s"], bound, st["delay_ci_s"], d_c) if math.isfinite(st["t_mean_s"]) \
                else "not evaluated"
            value = claim.value(st["t_mean_s"], t_ft, sc.cost_ratio)
            ci = sorted(claim.value(t, t_ft, sc.cost_ratio) for t in st["t_ci_s"])
            numbers = (f"{QUANTITIES[claim.quantity]} = {value:.3g} [{ci[0]:.3g}, {ci[1]:.3g}] vs "
                       f"{claim.criterion.describe()} at the measured {verdict_delay} delay")
            symbol = "T_mix/T_ft" if claim.quantity == "iteration_ratio" else "CE"
            numbers_short = f"{symbol} {value:.3g} [{ci[0]:.3g}, {ci[1]:.3g}] vs {claim.criterion.describe()}"
            if na is not None:
                verdict, reason, short = "not applicable", na, sc.not_applicable_short()
            elif not row["calibration"]["calibrated"]:
                verdict, reason, short = "inconclusive", row["calibration"]["reason"], row["calibration"]["short"]
            else:
                verdict, reason, short = raw, numbers, numbers_short
            row["claims"][claim.id] = {"verdict": verdict, "reason": reason, "short": short, "numbers_alone": raw,
                                       "numbers_short": numbers_short,
                                       "counts": na is None and row["calibration"]["calibrated"],
                                       "numbers": numbers, "value": value, "value_ci": ci, "time_bound_s": bound,
                                       "critical_delay_ms": _ms(d_c)}
        rows.append(row)
    out = {}
    for claim in claims:
        cells = [(r["scenario"], r["claims"][claim.id]) for r in rows if claim.id in r["claims"]]
        eligible = [(name, c) for name, c in cells if c["counts"]]
        falsified_by = [name for name, c in eligible if c["verdict"] == "falsified"]
        if not cells:
            verdict, reason = "no verdict", "no scenario at " + ", ".join(f"{lk} Gb/s" for lk in claim.links or ())
        elif not eligible:
            verdict = "no verdict"
            reason = "no calibrated scenario in which the model moves a circuit"
        elif falsified_by:
            verdict, reason = "falsified", "falsified by " + ", ".join(falsified_by)
        elif all(c["verdict"] == "holds" for _, c in eligible):
            verdict, reason = "holds", "holds in " + ", ".join(n for n, _ in eligible)
        else:
            verdict = "inconclusive"
            reason = "inconclusive in " + ", ".join(n for n, c in eligible if c["verdict"] == "inconclusive")
        out[claim.id] = {"verdict": verdict, "falsified_by": falsified_by, "reason": reason,
                         "calibrated_scenarios": [n for n, _ in eligible]}
    return _plain({"scenarios": rows, "claims": out})


# ---------------------------------------------------------------------------------------------- robustness

@dataclass(frozen=True)
class Assumptions:
    """The modelling assumptions a verdict rests on: one point of the robustness grid."""

    gpu: str = "h100-sxm"
    skew: float = 0.5
    mfu: float = 0.40
    overlap: str = "all_hidden"
    greedy: str = "simulator"
    alpha: int = 6

    def label(self, baseline: "Assumptions | None" = None) -> str:
        base = Assumptions() if baseline is None else baseline
        diff = [f"{f.name}={getattr(self, f.name):g}" if isinstance(getattr(self, f.name), float)
                else f"{f.name}={getattr(self, f.name)}" for f in fields(self) if getattr(self, f.name) != getattr(base, f.name)]
        return ", ".join(diff) if diff else "baseline"


GRID_AXES = tuple(f.name for f in fields(Assumptions))


def check_assumptions(a: Assumptions) -> None:
    """Raise ClaimInputError when a grid point names an unknown GPU, overlap or greedy, or an impossible value."""
    if a.gpu not in mm.GPUS:
        raise ClaimInputError(f"unknown gpu {a.gpu!r}; known: {sorted(mm.GPUS)}")
    if a.overlap not in ("all_hidden", "simulator"):
        raise ClaimInputError(f"overlap must be 'all_hidden' or 'simulator', got {a.overlap!r}")
    if a.greedy not in ("simulator", "paper"):
        raise ClaimInputError(f"greedy must be 'simulator' or 'paper', got {a.greedy!r}")
    if not 0 < a.mfu <= 1 or a.skew < 0:
        raise ClaimInputError(f"need 0 < mfu <= 1 and skew >= 0, got mfu={a.mfu:g}, skew={a.skew:g}")
    try:
        mx.Fabric("mixnet", 100, alpha=a.alpha)
    except mx.MixnetInputError as exc:
        raise ClaimInputError(str(exc)) from None
# The declared default grid: the paper's prototype GPU and ours, routing skew, MFU, the paper's overlap and the
# released simulator's, the paper's Algorithm 1 and the simulator's greedy, and the OCS share α of the NICs.
DEFAULT_GRID: dict[str, tuple] = {"gpu": ("h100-sxm", "a100-sxm"), "skew": (0.3, 0.5, 0.8),
                                  "mfu": (0.3, 0.4, 0.5), "overlap": ("all_hidden", "simulator"),
                                  "greedy": ("simulator", "paper"), "alpha": (4, 6)}


def assumption_grid(axes: Mapping[str, Sequence] | None = None, baseline: Assumptions = Assumptions(),
                    design: Literal["one_at_a_time", "full"] = "one_at_a_time") -> list[Assumptions]:
    """The grid's points, baseline first: every axis value varied alone ("one_at_a_time") or every
    combination ("full")."""
    axes = DEFAULT_GRID if axes is None else axes
    unknown = set(axes) - set(GRID_AXES)
    if unknown:
        raise ClaimInputError(f"unknown assumption axes {sorted(unknown)}; known: {', '.join(GRID_AXES)}")
    cast = {f.name: type(getattr(baseline, f.name)) for f in fields(Assumptions)}
    try:
        values = {k: [cast[k](v) for v in vs] for k, vs in axes.items()}
    except (TypeError, ValueError) as exc:
        raise ClaimInputError(f"assumption grid: {exc}") from None
    if any(not vs for vs in values.values()):
        raise ClaimInputError("assumption grid: every axis needs at least one value")
    points = [baseline]
    if design == "one_at_a_time":
        for k, vs in values.items():
            points += [replace(baseline, **{k: v}) for v in vs if v != getattr(baseline, k)]
    elif design == "full":
        import itertools
        keys = list(values)
        for combo in itertools.product(*(values[k] for k in keys)):
            p = replace(baseline, **dict(zip(keys, combo)))
            if p != baseline:
                points.append(p)
    else:
        raise ClaimInputError(f"design must be 'one_at_a_time' or 'full', got {design!r}")
    return list(dict.fromkeys(points))


@dataclass(frozen=True)
class Setup:
    """Everything but the assumptions that a grid point needs (picklable for the process pool)."""

    models: tuple[str, ...] = tuple(mm.MODELS)
    links: tuple[int, ...] = (100, 400)
    parallelism: tuple = ()                 # ((model, Parallelism), ...) overrides
    reconfigure: str = "on_change"
    cost_basis: str = "paper"
    claims: tuple[Claim, ...] = field(default_factory=paper_claims)
    calibration: Calibration = Calibration()
    seed: int = 0
    verdict_delay: str = "total"
    n_reps: int = 32
    n_boot: int = 200
    confidence: float = 0.95

    def scenarios(self, a: Assumptions) -> list[Scenario]:
        return build_scenarios(self.models, self.links, gpu=a.gpu, mfu=a.mfu, parallelism=dict(self.parallelism),
                               alpha=a.alpha, overlap=a.overlap, reconfigure=self.reconfigure, greedy=a.greedy,
                               cost_basis=self.cost_basis, skew=a.skew, seed=self.seed)


def _run_points(task: tuple) -> list[dict]:
    """Points that share routing and circuits (same skew, α, greedy) run together: the circuit and all-to-all
    memo of analysis.mixnet then serves the GPU/MFU/overlap variants."""
    setup, points, measured = task
    out = []
    for index, assumptions in points:
        scenarios = setup.scenarios(assumptions)
        res = evaluate_point(measured, scenarios, claims=setup.claims, calibration=setup.calibration,
                             seed=setup.seed, verdict_delay=setup.verdict_delay, n_reps=setup.n_reps,
                             n_boot=setup.n_boot, confidence=setup.confidence, full=index == 0)
        if index == 0:
            res["plot"] = plot_series(scenarios, setup.claims)
        out.append((index, res))
    return out


def plot_series(scenarios: Sequence[Scenario], claims: Sequence[Claim], lo_ms: float = 0.1,
                hi_ms: float = 100.0, points: int = 61) -> list[dict]:
    """T_mix(d)/T_ft on a log grid of constant delays (the region where verdicts flip), with d*."""
    grid = np.logspace(np.log10(lo_ms), np.log10(hi_ms), points) / 1e3
    bound = claims[0].criterion.hi if claims and claims[0].quantity == "iteration_ratio" else None
    out = []
    for sc in scenarios:
        t = mx.constant_delay_times(sc.mixnet, grid) / sc.t_fat_tree
        d_star = mx.break_even_delay(sc.mixnet, bound * sc.t_fat_tree) if bound else None
        out.append(_plain({"scenario": sc.name, "moves_circuits": sc.moves_circuits, "delay_ms": grid * 1e3,
                           "ratio": t, "break_even_ms": _ms(d_star), "bound": bound}))
    return out


def run_grid(setup: Setup, grid: Sequence[Assumptions], measured: Mapping, *,
             max_workers: int | None = 1) -> list[dict]:
    """Evaluate every grid point (the first in full, with plot series); on a local process pool when
    max_workers > 1. The results do not depend on where or in which order the points ran."""
    measured = as_cycle_delays(measured)
    families: dict[tuple, list] = {}
    for i, a in enumerate(grid):
        families.setdefault((a.skew, a.alpha, a.greedy), []).append((i, a))
    tasks = [(setup, points, measured) for points in families.values()]
    if max_workers is None or max_workers > 1 and len(tasks) > 1:
        # spawn: the caller may hold threads (an emulated bench), which fork would copy mid-lock
        with ProcessPoolExecutor(max_workers=max_workers,
                                 mp_context=multiprocessing.get_context("spawn")) as pool:
            done = [r for chunk in pool.map(_run_points, tasks) for r in chunk]
    else:
        done = [r for t in tasks for r in _run_points(t)]
    return [res for _, res in sorted(done, key=lambda r: r[0])]


def _aggregate(outcomes: Sequence[tuple[str, str]]) -> tuple[str, list[str]]:
    """(verdict, labels where falsified) from (label, verdict) pairs of the calibrated points."""
    if not outcomes:
        return "inconclusive", []
    falsified = [label for label, v in outcomes if v == "falsified"]
    if len(falsified) == len(outcomes):
        return "falsified", falsified
    if falsified:
        return "falsified if", falsified
    if all(v == "holds" for _, v in outcomes):
        return "holds", []
    return "inconclusive", []


def robustness(setup: Setup, grid: Sequence[Assumptions], results: Sequence[dict]) -> dict:
    """Claim verdicts over the grid, the claims × scenarios table and the robustness table."""
    labels = [a.label(grid[0]) for a in grid]
    claims_out = []
    for claim in setup.claims:
        at = [(lab, r["claims"][claim.id]) for lab, r in zip(labels, results)]
        calibrated = [(lab, c["verdict"]) for lab, c in at if c["verdict"] != "no verdict"]
        verdict, conditions = _aggregate(calibrated)
        others = [f"{lab} ({v})" for lab, v in calibrated if v != "falsified"]
        if not calibrated:
            summary = f"inconclusive: {at[0][1]['reason']}" + (", at any grid point" if len(at) > 1 else "")
        elif verdict == "falsified if":
            summary = f"falsified if {' or '.join(conditions)}; not at {', '.join(others)}"
        elif verdict == "falsified":
            summary = f"falsified at every one of {len(calibrated)} calibrated grid points"
        else:
            summary = f"{verdict} at the {len(calibrated)} calibrated grid points" + \
                (f" ({', '.join(others)})" if verdict == "inconclusive" else "")
        by_scenario = {}
        for si, row in enumerate(results[0]["scenarios"]):
            if claim.id not in row["claims"]:
                continue
            cells = [(lab, r["scenarios"][si]["claims"][claim.id]) for lab, r in zip(labels, results)]
            base = cells[0][1]
            if all(c["verdict"] == "not applicable" for _, c in cells):
                by_scenario[row["scenario"]] = {"verdict": "not applicable", "conditions": [],
                                                "reason": base["reason"], "short": base["short"]}
                continue
            usable = [(lab, c["verdict"]) for lab, c in cells if c["counts"]]
            if not usable:      # no grid point can carry a verdict here: say what the baseline is, and elsewhere
                moving = [(lab, c) for lab, c in cells if c["verdict"] != "not applicable"]
                if base["verdict"] == "not applicable":
                    cell_verdict, short = "not applicable", base["short"]
                    elsewhere = "; ".join(f"{lab}: {c['short']}" for lab, c in moving)
                    short += f" (circuits move only at {elsewhere})"
                    reason = base["reason"] + f"; circuits move only at {elsewhere}"
                else:
                    cell_verdict, short, reason = "inconclusive", base["short"], base["reason"]
                    if len(cells) > 1:
                        short += " (baseline; no grid point calibrated)"
                        reason += " (baseline; no grid point is calibrated)"
                by_scenario[row["scenario"]] = {"verdict": cell_verdict, "conditions": [], "reason": reason,
                                                "short": short}
                continue
            v, where = _aggregate(usable)
            reason, short = (base["numbers"], base["numbers_short"]) if base["counts"] else \
                (base["reason"], base["short"])
            if len(usable) < len(cells):
                short += f"; {len(usable)} of {len(cells)} grid points calibrated"
            by_scenario[row["scenario"]] = {"verdict": v, "conditions": where, "reason": reason, "short": short}
        claims_out.append({"id": claim.id, "statement": claim.statement, "criterion": claim.describe(),
                           "quantity": claim.quantity, "applies_to": "all" if claim.links is None else list(claim.links),
                           "verdict": verdict, "conditions": conditions, "summary": summary,
                           "by_point": {lab: c["verdict"] for lab, c in at},
                           "by_scenario": by_scenario})
    table = []
    for lab, a, r in zip(labels, grid, results):
        cal = [s["scenario"] for s in r["scenarios"] if s["calibration"]["calibrated"]]
        moving = [s["scenario"] for s in r["scenarios"] if s["applicable"]]
        table.append({"point": lab, "assumptions": asdict(a), "calibrated": cal, "moves_circuits": moving,
                      "claims": {c.id: r["claims"][c.id]["verdict"] for c in setup.claims},
                      "falsified_by": {c.id: r["claims"][c.id]["falsified_by"] for c in setup.claims}})
    return _plain({"claims": claims_out, "table": table})


def evaluate_claims(measured: Mapping, *, setup: Setup = Setup(), grid: Sequence[Assumptions] | None = None,
                    max_workers: int | None = 1) -> dict:
    """The verdict: claims over the assumption grid (baseline first) with their evidence."""
    grid = [Assumptions()] if grid is None else list(grid)
    if not grid:
        raise ClaimInputError("the assumption grid is empty")
    results = run_grid(setup, grid, measured, max_workers=max_workers)
    rob = robustness(setup, grid, results)
    delays = as_cycle_delays(measured)
    return _plain({
        "claims": rob["claims"],
        "robustness": {"design_points": len(grid), "table": rob["table"]},
        "measured": {f"{k}_ms": delay_summary(delays[k]) for k in DELAY_KINDS},
        "paper_delay": {"ms": setup.calibration.delay_s * 1e3, "source": PAPER_DELAY_SOURCE},
        "calibration": {"criterion": setup.calibration.describe(),
                        "scenarios": {s["scenario"]: s["calibration"] for s in results[0]["scenarios"]}},
        "baseline": {"assumptions": asdict(grid[0]), "scenarios": results[0]["scenarios"],
                     "claims": results[0]["claims"]},
        "break_even_ms": {"source": MODEL_DELAY_SOURCE,
                          "by_scenario": {s["scenario"]: s["break_even_ms"] for s in results[0]["scenarios"]}},
        "plot": results[0].get("plot", []),
        "options": {"seed": setup.seed, "verdict_delay": setup.verdict_delay, "n_reps": setup.n_reps,
                    "n_boot": setup.n_boot, "confidence": setup.confidence, "reconfigure": setup.reconfigure,
                    "cost_basis": setup.cost_basis, "models": list(setup.models), "links": list(setup.links)},
    })


# ---------------------------------------------------------------------------------------------- helpers

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
