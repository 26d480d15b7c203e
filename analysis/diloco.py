"""Serving-aware DiLoCo synchronisation (spec algorithms.md §0 Paper D, §7): the score-based controller, its
baselines, and the exact paired sign-flip test over seeds. Pure functions over arrays; all parameters are data.

Time is trace seconds on a grid of control cycles (`cycle_s`). The sidecar's serving pressure is the busy
fraction b_t of each cycle: the service work of the requests arriving in it over the service capacity,
capped at 1 (§7.3: "queue depth / capacity"). It is computed from the trace's arrivals, not from replayed
latencies, so every policy's schedule is a pure function of (trace, seed, parameters) and every policy is
then replayed on the same footing.

Policies (each returns sync start times; the k-th sync of every policy lasts `durations[k]`, the measured
sync cost of that seed's k-th sync, so the sync budget differs only by count):
- `wa` / `wa_ewma`: the §7.1 controller; WA reads p_inf = b of the last finished cycle, WA+EWMA adds
  the §7.3 one-step forecast b̂_{t+1|t} as the serving-sync-cost term (w_ssc = 1).
- `random_policy`: §7.2(a), same horizons, defers with probability 0.7 per cycle inside them.
- `random_schedule`: §7.2(b), K = the controller's sync count, K starts uniform with minimum gaps.
- `random_spaced`: the spacing-matched null: K starts uniform under the controller's own spacing as well —
  none before min_h steps, consecutive starts min_h steps apart (its gaps, not `min_gap_s`'s) — so a
  difference from it is timing, not spacing.
- `fixed_period`: a sync every `fixed_period_steps` learner steps.
- `no_sync`: no sync at all (the load match: sync-excess = rate − this).
- `offline_bound`: K starts minimising the in-window busy fraction with hindsight (non-deployable).

Learner-progress model [R, ours; the artifact reads it from real learners]: `n_learners` islands each run
one inner step per `step_time_s`; steps since the last merge h, tokens h·tokens_per_step, a loss-improvement
proxy Δloss = loss_gain·(1 − exp(−h/loss_h))·noise (noise lognormal per learner and merge round, seeded),
staleness = seconds since the merge. The coordinator merges when ≥ min_ready learners vote to.
"""
from __future__ import annotations

import functools
import itertools
import math
from dataclasses import asdict, dataclass, field

import numpy as np

POLICIES = ("wa", "wa_ewma", "random_policy", "random_schedule", "random_spaced", "fixed_period", "no_sync",
            "offline_bound")
DEPLOYABLE = {p: p != "offline_bound" for p in POLICIES}


@dataclass(frozen=True)
class ControllerParams:
    """§7.1 run values [P, artifact `config.py`, stage-7 configs]."""

    min_h: int = 128
    max_h: int = 512
    w_loss: float = 0.5
    w_tok: float = 0.5
    w_net: float = 0.5
    w_inf: float = 0.75
    w_ckpt: float = 0.25
    w_stale: float = 0.25
    w_ssc: float = 0.0  # 1 in the calibrated / EWMA variant
    loss_ref: float = 0.05  # cap(Δloss / loss_ref)
    tokens_ref: float = 1e6  # cap(tokens / tokens_ref)
    stale_ref_s: float = 1800.0
    ssc_scale: float = 1.0
    threshold: float = 0.0
    p_net: float = 0.0  # sidecar inputs without a source here: constants (data)
    p_ckpt: float = 0.0
    defer_probability: float = 0.7  # matched random deferral, policy level (§7.2a)

    def __post_init__(self):
        if not 1 <= self.min_h <= self.max_h:
            raise ValueError(f"need 1 <= min_h <= max_h, got {self.min_h}, {self.max_h}")
        if not 0 <= self.defer_probability <= 1:
            raise ValueError("defer_probability must be in [0, 1]")


@dataclass(frozen=True)
class LearnerModel:
    """The learner-progress model [R]; see the module docstring."""

    n_learners: int = 4
    min_ready: int = 2
    step_time_s: float = 0.5
    tokens_per_step: int = 4096
    loss_gain: float = 0.08
    loss_h: float = 256.0
    noise_sigma: float = 0.3

    def __post_init__(self):
        if not 1 <= self.min_ready <= self.n_learners or self.step_time_s <= 0:
            raise ValueError("need 1 <= min_ready <= n_learners and step_time_s > 0")


@dataclass(frozen=True)
class StudyParams:
    """Everything one seed's schedules depend on besides the trace."""

    duration_s: float = 600.0
    cycle_s: float = 1.0
    ewma_span: int = 5  # λ = 2 / (span + 1)
    min_gap_s: float = 18.0  # matched random: minimum gap between sync starts
    draws: int = 5  # matched random draws per seed
    fixed_period_steps: int = 256
    controller: ControllerParams = field(default_factory=ControllerParams)
    learner: LearnerModel = field(default_factory=LearnerModel)

    @property
    def ewma_lambda(self) -> float:
        return 2.0 / (self.ewma_span + 1)

    def as_dict(self) -> dict:
        return asdict(self)


# ---- sidecar signal -----------------------------------------------------------------------------------------
def busy_fraction(arrival_s: np.ndarray, work_s: np.ndarray, capacity: float, cycle_s: float,
                  duration_s: float) -> np.ndarray:
    """b_t per control cycle: service work (slot-seconds) arriving in the cycle / (capacity · cycle_s),
    capped at 1. `capacity` is the number of service slots."""
    n = int(math.ceil(duration_s / cycle_s - 1e-9))
    cells = np.clip((np.asarray(arrival_s, dtype=float) // cycle_s).astype(np.int64), 0, n - 1)
    offered = np.bincount(cells, weights=np.asarray(work_s, dtype=float), minlength=n)[:n]
    return np.minimum(1.0, offered / (capacity * cycle_s))


def ewma_forecast(b: np.ndarray, lam: float, initial: float = 0.0) -> np.ndarray:
    """One-step EWMA forecasts (§7.3): out[t] = b̂_{t|t−1}, the forecast for cycle t made after cycle t−1;
    b̂_{t+1|t} = λ·b_t + (1−λ)·b̂_{t|t−1}, out[0] = `initial`. len(out) = len(b) + 1."""
    if not 0 < lam <= 1:
        raise ValueError(f"EWMA λ must be in (0, 1], got {lam}")
    out = np.empty(len(b) + 1)
    out[0] = initial
    for t, value in enumerate(np.asarray(b, dtype=float)):
        out[t + 1] = lam * value + (1 - lam) * out[t]
    return out


# ---- the controller and the policy-level baselines -------------------------------------------------------
def _cap(x):
    return np.clip(x, 0.0, 1.0)


def _learner_noise(seed: int, n_learners: int, rounds: int, sigma: float) -> np.ndarray:
    rng = np.random.default_rng([seed, 1])
    return np.exp(sigma * rng.standard_normal((rounds, n_learners)) - sigma**2 / 2)


def simulate_policy(policy: str, b: np.ndarray, durations: np.ndarray, params: StudyParams, seed: int
                    ) -> dict:
    """Run one cycle-driven policy (wa, wa_ewma, random_policy, fixed_period) over the busy fractions `b`.
    Returns {"starts": sync start times (s), "scores": per-decision record (for the report)}. A sync starts
    at the beginning of the cycle in which it is decided; decisions pause while it runs."""
    c, lm = params.controller, params.learner
    if policy == "wa_ewma":
        c = ControllerParams(**{**asdict(c), "w_ssc": 1.0})
    forecast = ewma_forecast(b, params.ewma_lambda)
    noise = _learner_noise(seed, lm.n_learners, len(durations) + 1, lm.noise_sigma)
    rng = np.random.default_rng([seed, 2])
    uniforms = rng.random(len(b))  # one draw per cycle, used or not: same seed, same draws
    starts, decisions = [], 0
    last_sync_s, busy_until = 0.0, 0.0
    for t in range(len(b)):
        now = t * params.cycle_s
        if now < busy_until - 1e-9:
            continue
        k = len(starts)
        if k >= len(durations) or now + durations[k] > params.duration_s + 1e-9:
            break
        h = (now - last_sync_s) / lm.step_time_s
        if h < c.min_h:
            continue
        if h >= c.max_h:
            sync = True
        elif policy == "random_policy":
            sync = uniforms[t] >= c.defer_probability
        elif policy == "fixed_period":
            sync = h >= params.fixed_period_steps
        elif policy in ("wa", "wa_ewma"):
            decisions += 1
            loss = lm.loss_gain * (1 - math.exp(-h / lm.loss_h)) * noise[k]
            progress = c.w_loss * _cap(loss / c.loss_ref) + c.w_tok * _cap(h * lm.tokens_per_step / c.tokens_ref)
            p_inf = b[t - 1] if t > 0 else 0.0
            pressure = (c.w_net * c.p_net + c.w_inf * p_inf + c.w_ckpt * c.p_ckpt
                        + c.w_ssc * _cap(forecast[t] / c.ssc_scale) + c.w_stale * _cap((now - last_sync_s) / c.stale_ref_s))
            votes = int(np.sum(progress - pressure > c.threshold))
            sync = votes >= lm.min_ready
        else:
            raise ValueError(f"not a cycle-driven policy: {policy!r}")
        if sync:
            starts.append(now)
            last_sync_s, busy_until = now, now + float(durations[k])
    return {"starts": np.asarray(starts, dtype=float), "decisions": decisions}


# ---- schedule-level baselines ------------------------------------------------------------------------------
def random_starts(rng: np.random.Generator, count: int, duration_s: float, window_s: float, min_gap_s: float,
                  first_s: float = 0.0) -> np.ndarray:
    """`count` sync starts uniform on [first_s, duration_s − window_s] subject to consecutive starts ≥ gap apart
    (gap = max(min_gap_s, window_s), so windows never overlap): uniform order statistics on the interval
    shrunk by the gaps, shifted back, which is exactly the uniform law on the constrained set (what the
    artifact's rejection sampling draws from)."""
    gap = max(min_gap_s, window_s)
    slack = duration_s - first_s - window_s - (count - 1) * gap
    if count < 0 or slack < 0:
        raise ValueError(f"{count} windows of {window_s:g} s with gaps {gap:g} s after {first_s:g} s do not fit "
                         f"in {duration_s:g} s")
    return first_s + np.sort(rng.uniform(0.0, slack, size=count)) + np.arange(count) * gap


def offline_bound_starts(b: np.ndarray, durations: np.ndarray, cycle_s: float, duration_s: float,
                         min_gap_s: float) -> np.ndarray:
    """K = len(durations) starts on the cycle grid minimising the summed in-window busy fraction, with
    hindsight of the whole trace (non-deployable); ties broken by distance to evenly spaced targets.
    Exact dynamic programme over (sync k, start cell)."""
    k_total, n = len(durations), len(b)
    if k_total == 0:
        return np.empty(0)
    prefix = np.r_[0.0, np.cumsum(b)]
    cells = np.arange(n)
    gap_cells = int(math.ceil(max(min_gap_s, float(np.max(durations))) / cycle_s - 1e-9))
    targets = (np.arange(k_total) + 0.5) * n / k_total
    inf = float("inf")
    dp = np.full((k_total, n), inf)
    arg = np.zeros((k_total, n), dtype=np.int64)
    for k in range(k_total):
        width = max(1, int(math.ceil(durations[k] / cycle_s - 1e-9)))
        end = np.minimum(cells + width, n)
        cost = (prefix[end] - prefix[cells]) / width + 1e-9 * np.abs(cells - targets[k]) / n
        cost[cells * cycle_s + durations[k] > duration_s + 1e-9] = inf
        if k == 0:
            dp[0] = cost
            continue
        # best previous start at least gap_cells earlier: running minimum of dp[k-1]
        prev = dp[k - 1]
        run_min = np.minimum.accumulate(prev)
        run_arg = np.zeros(n, dtype=np.int64)
        best = 0
        for j in range(n):
            if prev[j] < prev[best]:
                best = j
            run_arg[j] = best
        shifted = cells - gap_cells
        ok = shifted >= 0
        dp[k, ok] = cost[ok] + run_min[shifted[ok]]
        arg[k, ok] = run_arg[shifted[ok]]
    j = int(np.argmin(dp[-1]))
    if not math.isfinite(dp[-1, j]):
        raise ValueError(f"{k_total} syncs with gaps of {gap_cells} cycles do not fit in {n} cycles")
    out = [j]
    for k in range(k_total - 1, 0, -1):
        j = int(arg[k, j])
        out.append(j)
    return np.asarray(out[::-1], dtype=float) * cycle_s


def seed_schedules(b: np.ndarray, durations: np.ndarray, params: StudyParams, seed: int) -> dict[str, list]:
    """Every policy's schedule(s) for one seed: {policy: [starts array per draw]} (one draw for all but
    random_schedule and random_spaced). They and offline_bound use K = the WA+EWMA controller's sync count."""
    out = {p: [simulate_policy(p, b, durations, params, seed)["starts"]]
           for p in ("wa", "wa_ewma", "random_policy", "fixed_period")}
    k = len(out["wa_ewma"][0])
    window = float(np.max(durations[:k])) if k else 0.0
    out["random_schedule"] = [random_starts(np.random.default_rng([seed, 3, draw]), k, params.duration_s, window,
                                            params.min_gap_s) for draw in range(params.draws)]
    spacing = params.controller.min_h * params.learner.step_time_s  # the controller's own first start and gap
    out["random_spaced"] = [random_starts(np.random.default_rng([seed, 4, draw]), k, params.duration_s, window,
                                          max(params.min_gap_s, spacing), first_s=spacing)
                            for draw in range(params.draws)]
    out["no_sync"] = [np.empty(0)]
    out["offline_bound"] = [offline_bound_starts(b, durations[:k], params.cycle_s, params.duration_s,
                                                 params.min_gap_s)]
    return out


# ---- paired tests over seeds ---------------------------------------------------------------------------------
def _subset_sums(values: np.ndarray) -> np.ndarray:
    """Σ ε_i·v_i for every ε ∈ {±1}^len(v)."""
    sums = np.zeros(1)
    for v in values:
        sums = np.concatenate([sums + v, sums - v])
    return sums


def sign_flip_test(d, *, max_exact: int = 20, n_mc: int = 200_000, seed: int = 0) -> dict:
    """Exact paired sign-flip test of mean(d) (§7.4): under H0 each d_s is symmetric about 0.
    p_less = #{ε : mean(ε⊙d) ≤ mean(d)} / 2^n, p_greater with ≥, two-sided with |·| ≥ |·|.
    n ≤ max_exact: all 2^n patterns (meet in the middle: two halves' sign sums, sorted and counted);
    above: `n_mc` seeded random patterns, p = (count + 1)/(n_mc + 1) with its Monte Carlo standard error."""
    d = np.asarray(d, dtype=float)
    n = len(d)
    if n == 0 or not np.all(np.isfinite(d)):
        raise ValueError("sign-flip test needs finite differences for at least one seed")
    total = float(d.sum())
    tol = 1e-9 * max(1.0, float(np.abs(d).sum()))  # equal sums up to rounding count as equal
    if n <= max_exact:
        left, right = _subset_sums(d[: n // 2]), np.sort(_subset_sums(d[n // 2:]))

        def count_le(x):  # #{(a, b): a + b <= x}
            return int(np.searchsorted(right, x - left + tol, side="right").sum())

        def count_ge(x):
            return int((len(right) - np.searchsorted(right, x - left - tol, side="left")).sum())

        patterns = 2**n
        le, ge = count_le(total), count_ge(total)
        two = count_ge(abs(total)) + count_le(-abs(total))
        if abs(total) <= tol:  # every pattern is at least as extreme: don't count the middle twice
            two = patterns
        return {"n": n, "method": "exact", "patterns": patterns, "p_less": le / patterns,
                "p_greater": ge / patterns, "p_two_sided": min(1.0, two / patterns), "mc_se": 0.0,
                "count_less": le, "count_greater": ge, "count_two_sided": min(two, patterns)}
    rng = np.random.default_rng([seed, 4])
    counts = np.zeros(3, dtype=np.int64)
    for start in range(0, n_mc, 20_000):
        m = min(20_000, n_mc - start)
        sums = (rng.integers(0, 2, size=(m, n)) * 2 - 1) @ d
        counts += [(sums <= total + tol).sum(), (sums >= total - tol).sum(), (np.abs(sums) >= abs(total) - tol).sum()]
    p = (counts + 1) / (n_mc + 1)
    return {"n": n, "method": "monte_carlo", "patterns": n_mc, "p_less": float(p[0]), "p_greater": float(p[1]),
            "p_two_sided": float(p[2]), "mc_se": float(np.sqrt(p * (1 - p) / n_mc).max())}


def sign_flip_brute_force(d) -> dict:
    """Oracle: every pattern enumerated one by one (small n only)."""
    d = np.asarray(d, dtype=float)
    total, tol = d.sum(), 1e-9 * max(1.0, float(np.abs(d).sum()))
    sums = np.asarray([np.dot(e, d) for e in itertools.product((1.0, -1.0), repeat=len(d))])
    return {"p_less": float(np.mean(sums <= total + tol)), "p_greater": float(np.mean(sums >= total - tol)),
            "p_two_sided": float(np.mean(np.abs(sums) >= abs(total) - tol))}


def sign_test(d) -> dict:
    """Plain sign test on the nonzero differences (binomial, p = 1/2): one-sided for "d < 0" and "d > 0",
    two-sided."""
    from scipy.stats import binomtest

    d = np.asarray(d, dtype=float)
    neg, pos = int((d < 0).sum()), int((d > 0).sum())
    m = neg + pos
    if m == 0:
        return {"n_nonzero": 0, "negative": 0, "positive": 0, "p_less": 1.0, "p_greater": 1.0, "p_two_sided": 1.0}
    return {"n_nonzero": m, "negative": neg, "positive": pos,
            "p_less": float(binomtest(neg, m, 0.5, alternative="greater").pvalue),
            "p_greater": float(binomtest(pos, m, 0.5, alternative="greater").pvalue),
            "p_two_sided": float(binomtest(pos, m, 0.5).pvalue)}


@functools.lru_cache(maxsize=None)
def interval_coverage(n: int, *, reps: int = 4000, confidence: float = 0.95) -> tuple[float, float]:
    """(coverage, its standard error): how often `analysis.stats.mean_interval` (bootstrap-t), the interval
    every comparison here states, holds the true mean of n normal values. The interval is scale-free, so this
    is a function of n alone: one fixed stream, the same answer for every study seed, and enough repetitions
    that its standard error is below 0.4 pp near 95 % (the percentile bootstrap this replaced covered 90.4 % at
    10 seeds, a coin flip against a 90 % gate when estimated from 400 repetitions)."""
    from analysis.stats import MIN_MEAN_UNITS, mean_interval

    if n < MIN_MEAN_UNITS:
        return float("nan"), float("nan")
    data = np.random.default_rng([n, 6]).normal(0.0, 1.0, size=(reps, n))
    hits = 0
    for r, x in enumerate(data):
        lo, hi = mean_interval(x, confidence, rng_seed=r, n_resamples=999)
        hits += lo <= 0.0 <= hi
    coverage = hits / reps
    return coverage, math.sqrt(coverage * (1 - coverage) / reps)


def paired_comparison(a, b, *, seed: int = 0, max_exact: int = 20, n_mc: int = 200_000) -> dict:
    """a vs b per seed (percentage points): d = a − b; sign-flip and sign tests, effect size, and the mean's
    bootstrap-t interval over seeds (None below MIN_MEAN_UNITS seeds) with its realised coverage at this n."""
    from analysis.stats import mean_interval

    d = np.asarray(a, dtype=float) - np.asarray(b, dtype=float)
    sd = float(d.std(ddof=1)) if len(d) > 1 else float("nan")
    coverage, coverage_se = interval_coverage(len(d))
    return {"d_pp": d.tolist(), "mean_pp": float(d.mean()), "sd_pp": sd,
            "effect_size_dz": float(d.mean() / sd) if sd > 0 else None,
            "wins": int((d < 0).sum()), "losses": int((d > 0).sum()), "ties": int((d == 0).sum()),
            "sign_flip": sign_flip_test(d, max_exact=max_exact, n_mc=n_mc, seed=seed), "sign_test": sign_test(d),
            "bootstrap_ci_pp": mean_interval(d, rng_seed=seed), "bootstrap_coverage": coverage,
            "bootstrap_coverage_se": coverage_se}


# ---- verdict --------------------------------------------------------------------------------------------------
@dataclass(frozen=True)
class VerdictRule:
    alpha: float = 0.05
    min_effect_pp: float = 0.5  # an improvement smaller than this is no improvement
    regime_pp: tuple[float, float] = (2.0, 6.5)  # no-sync violation rate the paper's regime implies
    min_coverage: float = 0.90  # the bootstrap CI is used only if its realised coverage is at least this


def claim_verdict(comparison: dict, no_sync_rate_pp: float, rule: VerdictRule = VerdictRule()) -> dict:
    """The claim "WA+EWMA beats matched random" (d = WA+EWMA − matched random < 0), in the MixNet verdict's
    vocabulary. holds: calibrated, p_less ≤ α and the CI entirely below 0; falsified: calibrated, p_less > α
    and the CI entirely above −min_effect (any improvement is smaller than that); inconclusive otherwise.
    Calibration: the no-sync rate must lie in `regime_pp` (else the study is not in the paper's regime) and
    the CI's realised coverage at this n must be ≥ min_coverage."""
    n = comparison["sign_flip"]["n"]
    p = comparison["sign_flip"]["p_less"]
    lo, hi = comparison["bootstrap_ci_pp"] or (-math.inf, math.inf)
    reasons = [] if comparison["bootstrap_ci_pp"] else [f"n={n} seeds: too few for an interval that holds its level"]
    in_regime = rule.regime_pp[0] <= no_sync_rate_pp <= rule.regime_pp[1]
    if not in_regime:
        reasons.append(f"no-sync violation rate {no_sync_rate_pp:.2f} % is outside the paper's regime "
                       f"[{rule.regime_pp[0]:g}, {rule.regime_pp[1]:g}] %")
    coverage = comparison.get("bootstrap_coverage")
    se = comparison.get("bootstrap_coverage_se") or 0.0
    # the gate is passed only beyond its own estimate's noise: two standard errors clear of min_coverage
    ci_ok = comparison["bootstrap_ci_pp"] is not None and (
        coverage is None or not math.isfinite(coverage) or coverage - 2 * se >= rule.min_coverage)
    if comparison["bootstrap_ci_pp"] is not None and not ci_ok:
        reasons.append(f"the interval covers {coverage:.1%} ± {se:.1%} at n={n}, not clearly ≥ {rule.min_coverage:.0%}")
    n_needed = max(1, math.ceil(math.log2(1 / rule.alpha)))
    if n < n_needed:
        reasons.append(f"n={n} seeds cannot reach p ≤ {rule.alpha:g} (the smallest sign-flip p is 1/2^n; "
                       f"need n ≥ {n_needed})")
    calibrated = in_regime and ci_ok and n >= n_needed
    if calibrated and p <= rule.alpha and hi < 0:
        verdict = "holds"
    elif calibrated and p > rule.alpha and lo > -rule.min_effect_pp:
        verdict = "falsified"
    else:
        verdict = "inconclusive"
        if calibrated:
            reasons.append(f"p_less = {p:.4f}, CI [{lo:+.2f}, {hi:+.2f}] pp: neither an improvement nor its "
                           f"absence (≥ {rule.min_effect_pp:g} pp) is established")
    return {"id": "wa_ewma_beats_matched_random", "statement": "WA+EWMA has fewer SLO violations than "
            "matched random deferral (same sync count, random timing)", "verdict": verdict,
            "criterion": f"sign-flip p_less ≤ {rule.alpha:g} and bootstrap CI < 0 → holds; p_less > "
                         f"{rule.alpha:g} and CI > −{rule.min_effect_pp:g} pp → falsified; no-sync rate in "
                         f"[{rule.regime_pp[0]:g}, {rule.regime_pp[1]:g}] %",
            "calibrated": calibrated, "reasons": reasons, "rule": asdict(rule)}
