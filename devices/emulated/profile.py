"""Timing profiles of the emulated bench: delay distributions as data (YAML in devices/profiles/).

A profile names where its numbers come from (`source`). Distributions are parameterised the way papers
report delays (mean and p99) and are seeded by the caller's numpy Generator.
"""
from __future__ import annotations

import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import yaml
from scipy import stats

from analysis.stages import NIC_PROFILE_KEYS

PROFILE_DIR = Path(__file__).resolve().parent.parent / "profiles"
_Z99 = float(stats.norm.ppf(0.99))

OCS_KEYS = ("switch", "dark")
NIC_KEYS = NIC_PROFILE_KEYS  # from the one stage table


class ProfileError(ValueError):
    """A profile file is malformed. The message names the file and key."""


@dataclass(frozen=True)
class Delay:
    """A delay distribution in seconds, backed by a frozen scipy distribution (or a constant)."""

    spec: dict[str, Any]
    _dist: Any = field(repr=False, compare=False)
    _const: float | None = field(default=None, repr=False, compare=False)

    def sample(self, rng: np.random.Generator) -> float:
        return self._const if self._const is not None else self.at_quantile(rng.random())

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
            fast = _fast_ppf(self._dist)
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

    @classmethod
    def fixed(cls, seconds: float) -> "Delay":
        return cls({"dist": "fixed", "ms": seconds * 1e3}, None, float(seconds))

    @classmethod
    def from_spec(cls, spec: Any, where: str = "delay") -> "Delay":
        if not isinstance(spec, dict) or "dist" not in spec:
            raise ProfileError(f"{where}: expected a mapping with 'dist' (fixed, lognormal, gamma, uniform, "
                               f"empirical), got {spec!r}")
        kind = spec["dist"]
        try:
            ms = {k: float(v) for k, v in spec.items() if k.endswith("_ms") or k in ("ms", "sigma", "cv",
                                                                                   "shape")}
        except (TypeError, ValueError):
            if kind != "empirical":
                raise ProfileError(f"{where}: parameters must be numbers, got {spec!r}") from None
            ms = {}
        try:
            if kind == "fixed":
                if not ms["ms"] >= 0:
                    raise ProfileError(f"{where}: fixed delay must be >= 0 ms, got {ms['ms']}")
                return cls(dict(spec), None, ms["ms"] / 1e3)
            if kind == "lognormal":
                if "mean_ms" in ms and "p99_ms" in ms:
                    mu, sigma = _lognormal_from_mean_p99(ms["mean_ms"] / 1e3, ms["p99_ms"] / 1e3, where)
                else:
                    mu, sigma = math.log(_positive(ms["median_ms"], where) / 1e3), _positive(ms["sigma"], where)
                return cls(dict(spec), stats.lognorm(s=sigma, scale=math.exp(mu)))
            if kind == "gamma":
                if "mean_ms" in ms:
                    mean, cv = _positive(ms["mean_ms"], where) / 1e3, _positive(ms["cv"], where)
                    shape = 1.0 / cv**2
                    return cls(dict(spec), stats.gamma(a=shape, scale=mean / shape))
                return cls(dict(spec), stats.gamma(a=_positive(ms["shape"], where),
                                                   scale=_positive(ms["scale_ms"], where) / 1e3))
            if kind == "uniform":
                lo, hi = ms["low_ms"] / 1e3, ms["high_ms"] / 1e3
                if not 0 <= lo <= hi:
                    raise ProfileError(f"{where}: need 0 <= low_ms <= high_ms, got {spec!r}")
                return cls(dict(spec), stats.uniform(loc=lo, scale=hi - lo))
            if kind == "empirical":
                q = np.asarray(spec["quantiles_ms"], dtype=float) / 1e3
                if q.ndim != 1 or len(q) < 2 or np.any(np.diff(q) < 0) or q[0] < 0:
                    raise ProfileError(f"{where}: quantiles_ms must be >= 2 non-decreasing values >= 0")
                return cls(dict(spec), _Empirical(q))
        except KeyError as missing:
            raise ProfileError(f"{where}: {kind} needs parameter {missing.args[0]!r}, got {spec!r}") from None
        except (TypeError, ValueError) as exc:
            if isinstance(exc, ProfileError):
                raise
            raise ProfileError(f"{where}: bad parameters {spec!r}: {exc}") from None
        raise ProfileError(f"{where}: unknown dist {kind!r}; expected fixed, lognormal, gamma, uniform, empirical")


def _fast_ppf(dist):
    """A cheap quantile function equal to dist.ppf for the families profiles use."""
    from scipy import special

    if isinstance(dist, _Empirical):
        return dist.ppf
    name = dist.dist.name
    kw = dist.kwds
    if name == "lognorm":
        s, scale = kw["s"], kw["scale"]
        return lambda q: scale * math.exp(s * special.ndtri(q))
    if name == "uniform":
        loc, width = kw.get("loc", 0.0), kw.get("scale", 1.0)
        return lambda q: loc + width * q
    if name == "gamma":
        a, scale = kw["a"], kw.get("scale", 1.0)
        return lambda q: scale * special.gammaincinv(a, q)
    return dist.ppf


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


def _positive(x: float, where: str) -> float:
    if not x > 0:
        raise ProfileError(f"{where}: parameters must be > 0, got {x}")
    return x


def _lognormal_from_mean_p99(mean: float, p99: float, where: str) -> tuple[float, float]:
    """mean = exp(mu + s²/2), p99 = exp(mu + z·s)  =>  s²/2 − z·s + ln(p99/mean) = 0 (smaller root)."""
    if not 0 < mean < p99:
        raise ProfileError(f"{where}: lognormal needs 0 < mean_ms < p99_ms")
    gap = math.log(p99 / mean)
    disc = _Z99**2 - 2 * gap
    if disc < 0:
        raise ProfileError(f"{where}: p99/mean = {p99 / mean:.2f} is too wide for a lognormal "
                           f"(max {math.exp(_Z99**2 / 2):.1f})")
    sigma = _Z99 - math.sqrt(disc)
    return math.log(mean) - sigma**2 / 2, sigma


@dataclass(frozen=True)
class Topology:
    """Shape of the emulated bench: hosts × NIC ports, one N×M switch. NIC port i (0-based, in host order)
    has TX on ingress i+1 and RX on egress N+i+1."""

    hosts: int = 4
    nics_per_host: int = 2
    ocs_size: tuple[int, int] = (16, 16)

    @property
    def nic_count(self) -> int:
        return self.hosts * self.nics_per_host


@dataclass(frozen=True)
class Profile:
    name: str
    description: str
    source: str
    ocs: dict[str, Delay]
    nic: dict[str, Delay]
    per_port: dict[str, dict[str, Delay]]
    clock_offset_ms: tuple[float, float]
    drift_ppm: tuple[float, float]
    topology: Topology
    faults: dict[str, Any]
    path: str | None = None
    tools: dict[str, str] = field(default_factory=dict)  # pinned tool versions, e.g. {ethtool: "5.16"}
    copies: str | None = None  # the published figures this profile copies (a verdict on it says so first)
    # Packet fabric (multiplane load balancing): how long after a link loses light the fabric detects it and
    # re-spreads that link's traffic over the surviving planes; until then the traffic sent onto it is lost.
    fabric_detection: Delay = field(default_factory=lambda: Delay.from_spec(FABRIC_DETECTION_DEFAULT))
    fabric_source: str = ""

    def nic_delay(self, port_key: str, stage: str) -> Delay:
        return self.per_port.get(port_key, {}).get(stage) or self.nic[stage]


_DEFAULT_OCS = {"switch": {"dist": "fixed", "ms": 0.0}, "dark": {"dist": "fixed", "ms": 0.1}}
_DEFAULT_NIC = {"los_clear": {"dist": "fixed", "ms": 0.05}, "cdr_lock": {"dist": "fixed", "ms": 0.0},
                "phy_up": {"dist": "fixed", "ms": 0.0}, "port_active": {"dist": "fixed", "ms": 0.0},
                "link_down": {"dist": "fixed", "ms": 1.0}}


# No public Spectrum-X detection figure was retrievable (spec algorithms.md §8: the seed paper was not found):
# 1 ms is OUR ASSUMPTION (ten times the emulated burst-mode `link_down`), named as such wherever it is used.
FABRIC_DETECTION_DEFAULT = {"dist": "fixed", "ms": 1.0}
FABRIC_SOURCE_DEFAULT = ("assumed: 1 ms detection and re-spread (no public Spectrum-X figure retrieved; "
                         "spec algorithms.md §8)")


def list_profiles() -> list[str]:
    return sorted(p.stem for p in PROFILE_DIR.glob("*.yaml"))


def load_profile(name_or_path: str) -> Profile:
    """A built-in profile by name, or a YAML file by path."""
    path = Path(name_or_path)
    if not path.suffix:
        path = PROFILE_DIR / f"{name_or_path}.yaml"
        if not path.exists():
            raise ProfileError(f"unknown profile {name_or_path!r}; built-in: {', '.join(list_profiles())} "
                               f"(or give a path to a .yaml file)")
    try:
        data = yaml.safe_load(path.read_text())
    except OSError as exc:
        raise ProfileError(f"{path}: cannot read profile: {exc.strerror}") from None
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        line = f":{mark.line + 1}" if mark else ""
        raise ProfileError(f"{path}{line}: not valid YAML") from None
    return profile_from_dict(data, str(path))


def profile_from_dict(data: Any, where: str = "<profile>") -> Profile:
    if not isinstance(data, dict):
        raise ProfileError(f"{where}: expected a mapping at the top level")
    unknown = set(data) - {"name", "description", "source", "copies", "ocs", "nic", "per_port", "hosts",
                           "topology", "faults", "tools", "fabric"}
    if unknown:
        raise ProfileError(f"{where}: unknown keys {sorted(unknown)}")

    def delays(section: str, keys: tuple[str, ...], defaults: dict) -> dict[str, Delay]:
        given = data.get(section) or {}
        if not isinstance(given, dict) or set(given) - set(keys):
            raise ProfileError(f"{where}: {section} must be a mapping with keys among {', '.join(keys)}")
        return {k: Delay.from_spec(given.get(k, defaults[k]), f"{where}: {section}.{k}") for k in keys}

    per_port = {}
    for port, stages in (data.get("per_port") or {}).items():
        if not isinstance(stages, dict) or set(stages) - set(NIC_KEYS):
            raise ProfileError(f"{where}: per_port.{port} must map NIC stages ({', '.join(NIC_KEYS)}) to delays")
        per_port[str(port)] = {k: Delay.from_spec(v, f"{where}: per_port.{port}.{k}") for k, v in stages.items()}
    hosts = data.get("hosts") or {}
    topo = data.get("topology") or {}
    try:
        offset = tuple(float(x) for x in hosts.get("clock_offset_ms", (0.0, 0.0)))
        drift = tuple(float(x) for x in hosts.get("drift_ppm", (0.0, 0.0)))
        topology = Topology(hosts=int(topo.get("hosts", 4)), nics_per_host=int(topo.get("nics_per_host", 2)),
                            ocs_size=tuple(int(x) for x in topo.get("ocs_size", (16, 16))))
    except (TypeError, ValueError, AttributeError):
        raise ProfileError(f"{where}: hosts/topology values must be numbers") from None
    if len(offset) != 2 or len(drift) != 2 or len(topology.ocs_size) != 2:
        raise ProfileError(f"{where}: clock_offset_ms, drift_ppm and ocs_size take two numbers each")
    n, m = topology.ocs_size
    if topology.nic_count > min(n, m) or topology.hosts < 1 or topology.nics_per_host < 1:
        raise ProfileError(f"{where}: topology needs 1 <= hosts·nics_per_host <= min(ocs_size)")
    tools = _tool_pins(data.get("tools"), where)
    fabric = data.get("fabric") or {}
    if not isinstance(fabric, dict) or set(fabric) - {"detection", "source"}:
        raise ProfileError(f"{where}: fabric must be a mapping with keys among detection, source")
    if "detection" in fabric and not str(fabric.get("source") or "").strip():
        raise ProfileError(f"{where}: fabric.detection needs a fabric.source (where the figure comes from)")
    return Profile(name=str(data.get("name", Path(where).stem)), description=str(data.get("description", "")),
                   source=str(data.get("source", "")), ocs=delays("ocs", OCS_KEYS, _DEFAULT_OCS),
                   nic=delays("nic", NIC_KEYS, _DEFAULT_NIC), per_port=per_port, clock_offset_ms=offset,
                   drift_ppm=drift, topology=topology, faults=dict(data.get("faults") or {}), path=where,
                   tools=tools, copies=None if data.get("copies") is None else str(data["copies"]),
                   fabric_detection=Delay.from_spec(fabric.get("detection", FABRIC_DETECTION_DEFAULT),
                                                    f"{where}: fabric.detection"),
                   fabric_source=str(fabric.get("source") or FABRIC_SOURCE_DEFAULT).strip())


def _tool_pins(given: Any, where: str) -> dict[str, str]:
    """`tools: {ethtool: "5.16", iproute2: "6.1", ...}`: the versions whose output layout emulated hosts print."""
    from devices.emulated.formats import ToolVersions

    if given is None:
        return {}
    if not isinstance(given, dict) or set(given) - set(ToolVersions.KNOWN):
        raise ProfileError(f"{where}: tools must map tool names ({', '.join(ToolVersions.KNOWN)}) to versions, "
                           f"got {given!r}")
    pins = {str(k): str(v) for k, v in given.items()}
    try:
        ToolVersions(**pins)
    except ValueError as exc:
        raise ProfileError(f"{where}: tools: {exc}") from None
    return pins
