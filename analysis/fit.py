"""Fit a delay distribution to samples, in the timing-profile format. Pure: arrays in, dicts out.

Selection rule:
1. all samples equal → `fixed`;
2. fewer than `min_parametric` samples, or any sample <= 0 → `empirical`;
3. otherwise fit lognormal and gamma by maximum likelihood (location 0) and test each with a
   Kolmogorov–Smirnov statistic whose p-value comes from a parametric bootstrap that re-fits every
   synthetic sample (Lilliefors' correction: the plain KS table is far too lenient when parameters are
   estimated from the same data);
4. among the candidates with p >= alpha, the lower AIC wins (both have two parameters, so this is the
   higher likelihood); if neither passes → `empirical` (quantiles at equally spaced levels).

Parameter confidence intervals: percentile bootstrap that resamples whole cycles when the samples' cycles
are given (the ports of one cycle share one OCS draw: they are not independent), then re-fits the chosen
family. The KS p-value treats samples as independent; it decides the family, not an interval.
"""
from __future__ import annotations

import math
from dataclasses import dataclass, field

import numpy as np
from scipy import special, stats

from analysis.delays import MAX_LOGNORMAL_P99_RATIO as _MAX_LOGNORMAL_P99_RATIO, Z99 as _Z99


class FitError(ValueError):
    """No usable samples."""


@dataclass(frozen=True)
class DelayFit:
    spec: dict  # profile delay mapping, e.g. {"dist": "lognormal", "mean_ms": 44.0, "p99_ms": 64.0}
    choice: str
    n: int
    candidates: dict = field(default_factory=dict)  # family -> {params, loglik, aic, ks_stat, ks_p}
    ci95: dict = field(default_factory=dict)  # reported parameter -> [low, high]
    notes: tuple[str, ...] = ()

    def to_dict(self) -> dict:
        return {"spec": self.spec, "choice": self.choice, "n": self.n, "candidates": self.candidates,
                "ci95": self.ci95, "notes": list(self.notes)}


# ------------------------------------------------------------------ vectorised MLE (rows = samples)
def _lognormal_mle(x: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    logs = np.log(x)
    return logs.mean(axis=-1), logs.std(axis=-1)


def _gamma_mle(x: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(shape, scale) per row: Newton on log(a) − ψ(a) = log(mean) − mean(log)."""
    mean = x.mean(axis=-1)
    s = np.maximum(np.log(mean) - np.log(x).mean(axis=-1), 1e-12)
    a = (3 - s + np.sqrt((s - 3) ** 2 + 24 * s)) / (12 * s)  # Minka's starting point
    for _ in range(8):
        f = np.log(a) - special.digamma(a) - s
        a = np.maximum(a - f / (1 / a - special.polygamma(1, a)), 1e-8)
    return a, mean / a


def _cdf(family: str, sorted_x: np.ndarray, p1: np.ndarray, p2: np.ndarray) -> np.ndarray:
    if family == "lognormal":
        return special.ndtr((np.log(sorted_x) - p1[..., None]) / p2[..., None])
    return special.gammainc(p1[..., None], sorted_x / p2[..., None])


def _mle(family: str, x: np.ndarray):
    return _lognormal_mle(x) if family == "lognormal" else _gamma_mle(x)


def _ks(family: str, x: np.ndarray, p1, p2) -> np.ndarray:
    xs = np.sort(x, axis=-1)
    n = xs.shape[-1]
    cdf = _cdf(family, xs, np.asarray(p1), np.asarray(p2))
    i = np.arange(1, n + 1)
    return np.maximum((i / n - cdf).max(axis=-1), (cdf - (i - 1) / n).max(axis=-1))


def _draw(family: str, rng: np.random.Generator, p1: float, p2: float, size) -> np.ndarray:
    if family == "lognormal":
        return rng.lognormal(p1, p2, size=size)
    return rng.gamma(p1, p2, size=size)


def _loglik(family: str, x: np.ndarray, p1: float, p2: float) -> float:
    if family == "lognormal":
        return float(stats.lognorm.logpdf(x, s=p2, scale=math.exp(p1)).sum())
    return float(stats.gamma.logpdf(x, a=p1, scale=p2).sum())


def ks_pvalue(family: str, x: np.ndarray, rng: np.random.Generator, n_mc: int = 300) -> tuple[float, float]:
    """(KS statistic, parametric-bootstrap p-value) for `family` with parameters fitted to x."""
    p1, p2 = _mle(family, x)
    observed = float(_ks(family, x, p1, p2))
    sims = _draw(family, rng, float(p1), float(p2), (n_mc, x.size))
    s1, s2 = _mle(family, sims)
    simulated = _ks(family, sims, s1, s2)
    return observed, float((1 + np.sum(simulated >= observed)) / (n_mc + 1))


# ------------------------------------------------------------------------------- reporting forms
def _sig(v: float, digits: int = 6) -> float:
    return float(f"{v:.{digits}g}")


def _lognormal_report(mu: np.ndarray, sigma: np.ndarray) -> dict[str, np.ndarray]:
    return {"mean_ms": np.exp(mu + sigma**2 / 2), "p99_ms": np.exp(mu + _Z99 * sigma),
            "median_ms": np.exp(mu), "sigma": sigma}


def _gamma_report(shape: np.ndarray, scale: np.ndarray) -> dict[str, np.ndarray]:
    return {"mean_ms": shape * scale, "cv": 1 / np.sqrt(shape), "shape": shape, "scale_ms": scale,
            "p99_ms": np.asarray(stats.gamma.ppf(0.99, shape, scale=scale))}


def _spec(family: str, report: dict[str, float]) -> dict:
    if family == "lognormal":
        if report["p99_ms"] / report["mean_ms"] < 0.999 * _MAX_LOGNORMAL_P99_RATIO:
            return {"dist": "lognormal", "mean_ms": _sig(report["mean_ms"]), "p99_ms": _sig(report["p99_ms"])}
        return {"dist": "lognormal", "median_ms": _sig(report["median_ms"]), "sigma": _sig(report["sigma"])}
    return {"dist": "gamma", "mean_ms": _sig(report["mean_ms"]), "cv": _sig(report["cv"])}


def empirical_spec(x: np.ndarray, n_quantiles: int = 21) -> tuple[dict, bool]:
    """Quantiles at equally spaced levels 0..1 (clipped at 0: a delay cannot be negative)."""
    values = np.quantile(x, np.linspace(0.0, 1.0, max(2, min(n_quantiles, x.size))))
    clipped = bool(np.any(values < 0))
    values = np.maximum.accumulate(np.maximum(values, 0.0))
    return {"dist": "empirical", "quantiles_ms": [_sig(v) for v in values]}, clipped


# ------------------------------------------------------------------------------------------- fit
def fit_delay(samples_ms, rng_seed: int, *, cycles=None, alpha: float = 0.05, n_mc: int = 300,
              n_boot: int = 300, n_quantiles: int = 21, min_parametric: int = 8) -> DelayFit:
    """Fit samples (ms) and return the profile spec, the candidates' statistics and 95 % bootstrap CIs.
    `cycles` (aligned with the samples) makes the bootstrap resample whole cycles."""
    from analysis.stats import resample_cycles

    x = np.asarray(samples_ms, dtype=float)
    finite = np.isfinite(x)
    cycles = None if cycles is None else np.asarray(cycles)[finite]
    x = x[finite]
    n = int(x.size)
    if n == 0:
        raise FitError("no finite samples to fit")
    rng = np.random.default_rng(rng_seed)
    if np.ptp(x) <= 1e-12 * max(1.0, abs(float(x[0]))):
        return DelayFit({"dist": "fixed", "ms": _sig(max(float(x[0]), 0.0))}, "fixed", n)
    notes: list[str] = []
    candidates: dict[str, dict] = {}
    if n >= min_parametric and x.min() > 0:
        for family in ("lognormal", "gamma"):
            p1, p2 = (float(v) for v in _mle(family, x))
            stat, p = ks_pvalue(family, x, rng, n_mc)
            loglik = _loglik(family, x, p1, p2)
            candidates[family] = {"params": [p1, p2], "loglik": loglik, "aic": 4 - 2 * loglik, "ks_stat": stat,
                                  "ks_p": p}
        accepted = [f for f, c in candidates.items() if c["ks_p"] >= alpha]
    else:
        accepted = []
        notes.append("too few samples for a parametric fit" if n < min_parametric
                     else "samples <= 0: parametric families need positive delays")
    if cycles is None:
        boot = x[rng.integers(0, n, size=(n_boot, n))]  # rows: vectorised fits
    else:
        boot = resample_cycles(x, cycles, rng, n_boot)
    if accepted:
        family = min(accepted, key=lambda f: candidates[f]["aic"])
        p1, p2 = candidates[family]["params"]
        make = _lognormal_report if family == "lognormal" else _gamma_report
        report = {k: float(v) for k, v in make(np.asarray(p1), np.asarray(p2)).items()}
        spec = _spec(family, report)
        b1, b2 = (_mle(family, boot) if isinstance(boot, np.ndarray)
                  else (np.array(v) for v in zip(*(_mle(family, b) for b in boot))))
        boot_report = make(b1, b2)
        ci = {k: [_sig(float(np.quantile(v, 0.025))), _sig(float(np.quantile(v, 0.975)))]
              for k, v in boot_report.items()}
        return DelayFit(spec, family, n, candidates, ci, tuple(notes))
    if candidates:
        notes.append(f"no family passed KS at alpha={alpha}")
    spec, clipped = empirical_spec(x, n_quantiles)
    if clipped:
        notes.append("negative quantiles clipped to 0")
    qs = (np.quantile(boot, [0.5, 0.99], axis=1) if isinstance(boot, np.ndarray)
          else np.array([np.quantile(b, [0.5, 0.99]) for b in boot]).T)
    ci = {"p50_ms": [_sig(float(np.quantile(qs[0], 0.025))), _sig(float(np.quantile(qs[0], 0.975)))],
          "p99_ms": [_sig(float(np.quantile(qs[1], 0.025))), _sig(float(np.quantile(qs[1], 0.975)))]}
    return DelayFit(spec, "empirical", n, candidates, ci, tuple(notes))


def ports_differ(groups: dict[str, np.ndarray], alpha: float = 0.01) -> tuple[bool, float]:
    """Kruskal–Wallis across ports: (differ?, p). Ports with fewer than 2 samples are left out."""
    usable = [np.asarray(g, dtype=float) for g in groups.values()]
    usable = [g[np.isfinite(g)] for g in usable]
    usable = [g for g in usable if g.size >= 2]
    if len(usable) < 2 or np.ptp(np.concatenate(usable)) == 0:  # all equal: nothing to tell apart
        return False, 1.0
    p = float(stats.kruskal(*usable).pvalue)
    return p < alpha, p
