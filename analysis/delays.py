"""Delay distributions as data — the one reading of a timing profile's delay mapping, shared by the
emulator (devices/emulated/profile.py), the regret analysis and the profile fit. Pure: specs in, numbers out.

Forms (all in ms): `fixed` (ms), `lognormal` (mean_ms + p99_ms, or median_ms + sigma), `gamma` (mean_ms + cv,
or shape + scale_ms), `uniform` (low_ms, high_ms), `empirical` (quantiles_ms at equally spaced levels).
"""
from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any, Mapping

import numpy as np
from scipy import special

Z99 = float(special.ndtri(0.99))
MAX_DELAY_MS = 3_600_000.0  # an hour: the longest delay parameter a profile may give
MAX_LOGNORMAL_P99_RATIO = math.exp(Z99**2 / 2)  # the mean/p99 form of a lognormal exists only below this ratio

# dist -> the parameter sets it takes (one of them, exactly)
FORMS: dict[str, tuple[tuple[str, ...], ...]] = {
    "fixed": (("ms",),),
    "lognormal": (("mean_ms", "p99_ms"), ("median_ms", "sigma")),
    "gamma": (("mean_ms", "cv"), ("shape", "scale_ms")),
    "uniform": (("low_ms", "high_ms"),),
    "empirical": (("quantiles_ms",),),
}


def lognormal_from_mean_p99(mean: float, p99: float) -> tuple[float, float]:
    """(mu, sigma) with mean = exp(mu + s²/2) and p99 = exp(mu + z·s): s²/2 − z·s + ln(p99/mean) = 0, the
    smaller root. ValueError where no lognormal has that mean and p99."""
    if not 0 < mean < p99:
        raise ValueError("lognormal needs 0 < mean_ms < p99_ms")
    disc = Z99**2 - 2 * math.log(p99 / mean)
    if disc < 0:
        raise ValueError(f"p99/mean = {p99 / mean:.2f} is too wide for a lognormal (max {MAX_LOGNORMAL_P99_RATIO:.1f})")
    sigma = Z99 - math.sqrt(disc)
    return math.log(mean) - sigma**2 / 2, sigma


def form_of(spec: Mapping[str, Any]) -> tuple[str, ...]:
    """The parameter set `spec` gives for its dist; ValueError naming what the dist takes otherwise."""
    kind = spec.get("dist")
    if kind not in FORMS:
        raise ValueError(f"unknown dist {kind!r}; expected one of {', '.join(FORMS)}")
    given = tuple(sorted(k for k in spec if k != "dist"))
    for form in FORMS[kind]:
        if given == tuple(sorted(form)):
            return form
    takes = ", or ".join(" and ".join(form) for form in FORMS[kind])
    raise ValueError(f"{kind} takes {takes}; found {', '.join(given) or 'no parameters'}")


def _positive(x: float, name: str) -> float:
    if not x > 0:
        raise ValueError(f"{name} must be > 0, found {x:g}")
    return x


@dataclass(frozen=True)
class Delay:
    """A delay distribution in seconds, backed by a frozen scipy distribution (or a constant)."""

    spec: dict[str, Any]
    _family: Any = field(repr=False, compare=False)  # (scipy.stats name, its kwargs), or an _Empirical
    _const: float | None = field(default=None, repr=False, compare=False)

    @property
    def _dist(self):
        """The frozen scipy distribution, built on first use: scipy.stats costs half a second to import, and
        a process that only samples (the emulator) never needs it."""
        if isinstance(self._family, _Empirical):
            return self._family
        dist = getattr(self, "_frozen", None)
        if dist is None:
            from scipy import stats

            name, kwargs = self._family
            dist = getattr(stats, name)(**kwargs)
            object.__setattr__(self, "_frozen", dist)
        return dist

    @classmethod
    def fixed(cls, seconds: float) -> "Delay":
        return cls({"dist": "fixed", "ms": seconds * 1e3}, None, float(seconds))

    @classmethod
    def from_spec(cls, spec: Mapping[str, Any]) -> "Delay":
        """The distribution a delay mapping describes; ValueError where it cannot exist."""
        form = form_of(spec)
        kind = spec["dist"]
        try:
            p = {k: float(spec[k]) for k in form if k != "quantiles_ms"}
        except (TypeError, ValueError):
            raise ValueError(f"{kind}: parameters must be numbers, found {dict(spec)!r}") from None
        for name, value in p.items():  # a delay past an hour is a typo (1e30), and would overflow the clock
            if not math.isfinite(value) or (name.endswith("ms") and abs(value) > MAX_DELAY_MS):
                raise ValueError(f"{kind}: {name} must be a finite number of at most {MAX_DELAY_MS:g} ms, "
                                 f"found {value:g}")
        if kind == "fixed":
            if not p["ms"] >= 0:
                raise ValueError(f"fixed delay must be >= 0 ms, found {p['ms']:g}")
            return cls(dict(spec), None, p["ms"] / 1e3)
        if kind == "lognormal":
            if "mean_ms" in p:
                mu, sigma = lognormal_from_mean_p99(p["mean_ms"] / 1e3, p["p99_ms"] / 1e3)
            else:
                mu, sigma = math.log(_positive(p["median_ms"], "median_ms") / 1e3), _positive(p["sigma"], "sigma")
            return cls(dict(spec), ("lognorm", {"s": sigma, "scale": math.exp(mu)}))
        if kind == "gamma":
            if "mean_ms" in p:
                shape = 1.0 / _positive(p["cv"], "cv") ** 2
                return cls(dict(spec), ("gamma", {"a": shape, "scale": _positive(p["mean_ms"], "mean_ms") / 1e3 / shape}))
            return cls(dict(spec), ("gamma", {"a": _positive(p["shape"], "shape"),
                                              "scale": _positive(p["scale_ms"], "scale_ms") / 1e3}))
        if kind == "uniform":
            lo, hi = p["low_ms"] / 1e3, p["high_ms"] / 1e3
            if not 0 <= lo <= hi:
                raise ValueError(f"uniform needs 0 <= low_ms <= high_ms, found {p['low_ms']:g}, {p['high_ms']:g}")
            return cls(dict(spec), ("uniform", {"loc": lo, "scale": hi - lo}))
        try:
            q = np.asarray(spec["quantiles_ms"], dtype=float) / 1e3
        except (TypeError, ValueError):
            raise ValueError("empirical: quantiles_ms must be a list of numbers") from None
        if q.ndim != 1 or len(q) < 2 or np.any(np.diff(q) < 0) or q[0] < 0 or not np.isfinite(q).all() \
                or q[-1] > MAX_DELAY_MS / 1e3:
            raise ValueError(f"empirical: quantiles_ms must be >= 2 non-decreasing values in 0..{MAX_DELAY_MS:g}")
        return cls(dict(spec), _Empirical(q))

    def sample(self, rng: np.random.Generator) -> float:
        return self._const if self._const is not None else self.at_quantile(rng.random())

    def samples(self, rng: np.random.Generator, size) -> np.ndarray:
        """`size` draws at once (inverse CDF of one uniform block)."""
        if self._const is not None:
            return np.full(size, self._const)
        return np.maximum(0.0, np.asarray(self._dist.ppf(rng.random(size)), dtype=float))

    def at_quantile(self, q: float) -> float:
        """The delay at probability level q: inverse-CDF sampling from a (keyed) uniform stream."""
        if self._const is not None:
            return self._const
        # numpy's own special functions: scipy's frozen ppf costs ~80 µs a call, which would add up to
        # sub-millisecond lateness on every emulated stage.
        return max(0.0, float(self._ppf(q)))

    @property
    def _ppf(self):
        fast = getattr(self, "_fast_ppf", None)
        if fast is None:
            fast = _fast_ppf(self._family) if not isinstance(self._family, _Empirical) else self._family.ppf
            object.__setattr__(self, "_fast_ppf", fast)
        return fast

    @property
    def mean_s(self) -> float:
        return self._const if self._const is not None else float(self._dist.mean())

    def cdf(self, seconds):
        """P(delay <= seconds); None for a fixed delay (a point mass has no useful KS test)."""
        if self._const is not None:
            return None
        return self._dist.cdf(seconds)

    def quantile(self, q: float) -> float:
        return self._const if self._const is not None else float(self._dist.ppf(q))


def _fast_ppf(family):
    """A cheap quantile function equal to scipy's ppf for the families profiles use."""
    name, kw = family
    if name == "lognorm":
        s, scale = kw["s"], kw["scale"]
        return lambda q: scale * math.exp(s * special.ndtri(q))
    if name == "uniform":
        loc, width = kw.get("loc", 0.0), kw.get("scale", 1.0)
        return lambda q: loc + width * q
    if name == "gamma":
        a, scale = kw["a"], kw.get("scale", 1.0)
        return lambda q: scale * special.gammaincinv(a, q)
    raise ValueError(f"no quantile function for {name}")


class _Empirical:
    """Piecewise-linear quantile function through values at equally spaced probability levels."""

    def __init__(self, values: np.ndarray):
        self.values = values
        self.levels = np.linspace(0.0, 1.0, len(values))

    def ppf(self, q):
        return np.interp(q, self.levels, self.values)

    def cdf(self, x):
        return np.interp(x, self.values, self.levels)

    def mean(self):
        # The mean of a piecewise-linear quantile function is the trapezoid integral over [0, 1].
        return float(np.trapezoid(self.values, self.levels))
