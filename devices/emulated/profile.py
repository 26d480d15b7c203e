"""Timing profiles of the emulated bench: delay distributions as data (YAML in devices/profiles/).

A profile names where its numbers come from (`source`). Distributions are parameterised the way papers
report delays (mean and p99) and are seeded by the caller's numpy Generator.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Annotated, Any, Literal

import yaml
from pydantic import Field, ValidationError, create_model, model_validator

from analysis.delays import Delay
from analysis.stages import NIC_PROFILE_KEYS, OPTIONAL_NIC_PROFILE_KEYS
from devices.emulated.faults import FaultEntry
from devices.specs import AtLeastOne, Spec, ranged

PROFILE_DIR = Path(__file__).resolve().parent.parent / "profiles"

OCS_KEYS = ("switch", "dark")
NIC_KEYS = NIC_PROFILE_KEYS  # from the one stage table
# Stages a port has only if its profile gives their delays (CMIS module / data-path states): unset, none drawn.
OPTIONAL_NIC_KEYS = OPTIONAL_NIC_PROFILE_KEYS


class ProfileError(ValueError):
    """A profile file is malformed. The message names the file and every problem's key; `validation` holds
    the declared spec's errors (the harness maps them to file:line)."""

    def __init__(self, message: str, validation: ValidationError | None = None):
        super().__init__(message)
        self.validation = validation


Ms = ranged(float, "a delay in ms >= 0", ge=0)
PositiveNumber = ranged(float, "a value > 0", gt=0)


class DelaySpec(Spec):
    """A delay distribution (analysis/delays.py): `fixed` (ms), `lognormal` (mean_ms + p99_ms, or median_ms +
    sigma), `gamma` (mean_ms + cv, or shape + scale_ms), `uniform` (low_ms, high_ms), `empirical`
    (quantiles_ms at equally spaced probability levels)."""

    dist: Literal["fixed", "lognormal", "gamma", "uniform", "empirical"]
    ms: Ms | None = None
    mean_ms: PositiveNumber | None = None
    p99_ms: PositiveNumber | None = None
    median_ms: PositiveNumber | None = None
    sigma: PositiveNumber | None = None
    cv: PositiveNumber | None = None
    shape: PositiveNumber | None = None
    scale_ms: PositiveNumber | None = None
    low_ms: Ms | None = None
    high_ms: Ms | None = None
    quantiles_ms: Annotated[list[Ms], Field(min_length=2)] | None = None

    @model_validator(mode="after")
    def _exists(self):
        Delay.from_spec(self.given())  # the one reading of a delay: its form, and whether it can exist
        return self

    def given(self) -> dict[str, Any]:
        return {k: getattr(self, k) for k in type(self).model_fields if k in self.model_fields_set}

    def delay(self) -> Delay:
        return Delay.from_spec(self.given())


def _delays(name: str, keys: tuple[str, ...], defaults: dict | None, optional: tuple[str, ...] = ()) -> type[Spec]:
    """A section of delays by key; `defaults` None: every key optional (a per-port override); `optional`: keys
    that stay unset unless given."""
    fields = {k: (DelaySpec | None, None) if defaults is None else (DelaySpec, DelaySpec(**defaults[k]))
              for k in keys}
    fields.update({k: (DelaySpec | None, None) for k in optional})
    return create_model(name, __base__=Spec, **fields)


_DEFAULT_OCS = {"switch": {"dist": "fixed", "ms": 0.0}, "dark": {"dist": "fixed", "ms": 0.1}}
_DEFAULT_NIC = {"los_clear": {"dist": "fixed", "ms": 0.05}, "cdr_lock": {"dist": "fixed", "ms": 0.0},
                "phy_up": {"dist": "fixed", "ms": 0.0}, "port_active": {"dist": "fixed", "ms": 0.0},
                "link_down": {"dist": "fixed", "ms": 1.0}}
OcsDelays = _delays("OcsDelays", OCS_KEYS, _DEFAULT_OCS)
NicDelays = _delays("NicDelays", NIC_KEYS, _DEFAULT_NIC, OPTIONAL_NIC_KEYS)
PortDelays = _delays("PortDelays", NIC_KEYS + OPTIONAL_NIC_KEYS, None)
Pair = Annotated[list[float], Field(min_length=2, max_length=2, description="[low, high]")]


class HostClocks(Spec):
    """Each emulated host's clock: an offset and a drift drawn uniformly from these ranges."""

    clock_offset_ms: Pair = [0.0, 0.0]
    drift_ppm: Pair = [0.0, 0.0]


class TopologySpec(Spec):
    """hosts × nics_per_host NIC ports on one ingress × egress switch."""

    hosts: AtLeastOne = 4
    nics_per_host: AtLeastOne = 2
    ocs_size: Annotated[list[AtLeastOne], Field(min_length=2, max_length=2, description="[ingress, egress]")] = [16, 16]

    @model_validator(mode="after")
    def _fits(self):
        if self.hosts * self.nics_per_host > min(self.ocs_size):
            raise ValueError(f"hosts·nics_per_host = {self.hosts * self.nics_per_host} NIC ports do not fit a "
                             f"{self.ocs_size[0]}×{self.ocs_size[1]} switch (at most {min(self.ocs_size)})")
        return self


class ProfileFaults(Spec):
    """Faults the emulated bench always has: fibres swapped at OCS port pairs, ports that never come up or
    flap ("host:netdev"), and fault entries injected into every turnaround step (devices/emulated/faults.py)."""

    miscable: list[Annotated[list[AtLeastOne], Field(min_length=2, max_length=2)]] = []
    never_up: list[str] = []
    flap: list[str] = []
    inject: list[FaultEntry] = []


class FabricSpec(Spec):
    """The packet fabric's detection and re-spread of a link that lost light (multiplane load balancing)."""

    detection: DelaySpec | None = None
    source: str = Field("", description="where the detection figure comes from (required with detection)")

    @model_validator(mode="after")
    def _sourced(self):
        if self.detection is not None and not self.source.strip():
            raise ValueError("fabric.detection needs a fabric.source (where the figure comes from)")
        return self


class ToolPins(Spec):
    """The tool versions emulated hosts print the layouts of (quote them: "6.1" is not 6.1)."""

    ethtool: str | None = None
    iproute2: str | None = None
    nccl_tests: str | None = None
    perftest: str | None = None
    mft: str | None = None
    python: str | None = None  # python3's version: below the agent's minimum (RHEL 8's "3.6.8"), the agent refuses

    @model_validator(mode="after")
    def _known(self):
        from devices.emulated.formats import ToolVersions

        ToolVersions(**self.pins())  # raises ValueError on a version it cannot read
        return self

    def pins(self) -> dict[str, str]:
        return {k: getattr(self, k) for k in type(self).model_fields if getattr(self, k) is not None}


class ProfileSpec(Spec):
    """A timing profile of the emulated bench (devices/profiles/*.yaml): delays by stage, with their source."""

    name: str | None = Field(None, description="default: the file's stem")
    description: str = ""
    source: str = Field("", description="where the numbers come from")
    copies: str | None = Field(None, description="the published figures this profile copies, if any")
    ocs: OcsDelays = OcsDelays()
    nic: NicDelays = NicDelays()
    per_port: dict[str, PortDelays] = Field({}, description='"host:netdev" -> NIC stage delays of that port')
    hosts: HostClocks = HostClocks()
    topology: TopologySpec = TopologySpec()
    faults: ProfileFaults = ProfileFaults()
    tools: ToolPins = ToolPins()
    fabric: FabricSpec = FabricSpec()

    @model_validator(mode="after")
    def _cmis_pairs(self):
        for where, section in [("nic", self.nic)] + [(f"per_port.{k}", v) for k, v in self.per_port.items()]:
            given = [k for k in OPTIONAL_NIC_KEYS if getattr(section, k) is not None]
            if given and len(given) != len(OPTIONAL_NIC_KEYS):
                raise ValueError(f"{where}: a CMIS module needs both {' and '.join(OPTIONAL_NIC_KEYS)} delays "
                                 f"(got only {given[0]})")
        return self


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

    def has_cmis(self, port_key: str) -> bool:
        """Whether this port's module shows CMIS module / data-path states (their delays given, in `nic` or the
        port's own): both or neither."""
        return all(k in self.nic or k in self.per_port.get(port_key, {}) for k in OPTIONAL_NIC_KEYS)


# No public Spectrum-X detection figure was retrievable (spec algorithms.md §8: the seed paper was not found):
# 1 ms is OUR ASSUMPTION (ten times the emulated burst-mode `link_down`), named as such wherever it is used.
FABRIC_DETECTION_DEFAULT = {"dist": "fixed", "ms": 1.0}
FABRIC_SOURCE_DEFAULT = ("assumed: 1 ms detection and re-spread (no public Spectrum-X figure retrieved; "
                         "spec algorithms.md §8)")


def list_profiles() -> list[str]:
    return sorted(p.stem for p in PROFILE_DIR.glob("*.yaml"))


def profile_path(name_or_path: str) -> Path:
    """The file of a built-in profile by name, or the path given."""
    path = Path(name_or_path)
    if not path.suffix:
        path = PROFILE_DIR / f"{name_or_path}.yaml"
        if not path.exists():
            raise ProfileError(f"unknown profile {name_or_path!r}; built-in: {', '.join(list_profiles())} "
                               f"(or give a path to a .yaml file)")
    return path


def load_profile(name_or_path: str) -> Profile:
    """A built-in profile by name, or a YAML file by path (the harness loads profiles through its own YAML
    loader, for file:line errors, `${ENV}` and `include:`)."""
    path = profile_path(name_or_path)
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
    """A Profile from a loaded mapping, validated against ProfileSpec (every problem at once)."""
    if not isinstance(data, dict):
        raise ProfileError(f"{where}: expected a mapping at the top level")
    try:
        spec = ProfileSpec.model_validate(data)
    except ValidationError as exc:
        problems = "; ".join(f"{'.'.join(str(p) for p in e['loc'])}: {e['msg']}" for e in exc.errors(include_url=False))
        raise ProfileError(f"{where}: {problems}", exc) from None
    return profile_from_spec(spec, where)


def profile_from_spec(spec: ProfileSpec, where: str) -> Profile:
    def delays(section: Spec) -> dict[str, Delay]:
        return {k: getattr(section, k).delay() for k in type(section).model_fields if getattr(section, k) is not None}

    faults = spec.faults.model_dump(exclude_defaults=True)
    faults.pop("inject", None)
    if spec.faults.inject:  # the entries as written (fault plans validate them again per step)
        faults["inject"] = [e.model_dump(exclude_unset=True) for e in spec.faults.inject]
    return Profile(name=spec.name if spec.name is not None else Path(where).stem, description=spec.description,
                   source=spec.source, ocs=delays(spec.ocs), nic=delays(spec.nic),
                   per_port={port: delays(stages) for port, stages in spec.per_port.items()},
                   clock_offset_ms=tuple(spec.hosts.clock_offset_ms), drift_ppm=tuple(spec.hosts.drift_ppm),
                   topology=Topology(spec.topology.hosts, spec.topology.nics_per_host, tuple(spec.topology.ocs_size)),
                   faults=faults, path=where, tools=spec.tools.pins(), copies=spec.copies,
                   fabric_detection=(spec.fabric.detection.delay() if spec.fabric.detection is not None
                                     else Delay.from_spec(FABRIC_DETECTION_DEFAULT)),
                   fabric_source=(spec.fabric.source or FABRIC_SOURCE_DEFAULT).strip())
