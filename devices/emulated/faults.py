"""Fault injection on the emulated bench: faults as data, armed per cycle, with their own ground truth.

A fault plan is a list of entries `{kind, cycles: [..] | probability: p, ...params}` (from a profile's
`faults: {inject: [...]}` or a turnaround step's `faults:`). `plan_faults` turns it into {cycle: [Fault]}
with a seeded generator, for every cycle up front, so a resumed run meets the same faults.
`FaultInjector.arm()` sets a cycle's faults up just before its OCS command; `disarm()` undoes what
outlasts the cycle. Every fault that actually fired is appended to `injector.fired` (the injection's
ground truth: kind, cycle, target, harness-clock time).

The kinds are declared below, one model each (parameters, defaults, ranges, what it does): `FaultEntry`
is what a playbook's or profile's entry may hold, and the JSON Schemas show it. Targets default to one
drawn from the step's ports or hosts.
"""
from __future__ import annotations

import errno
import os
import signal
import threading
from dataclasses import dataclass, field
from typing import Annotated, Any, Literal, Union

import numpy as np
from pydantic import Field, TypeAdapter, ValidationError, model_validator

from devices.specs import AtLeastOne, Expect, Positive, Seconds, Spec
from devices.timing import now_ns

class _FaultEntry(Spec):
    """When a fault fires: on the listed cycles, or each cycle with `probability` (a seeded draw)."""

    cycles: list[AtLeastOne] | None = Field(None, description="cycle numbers (1..the run's cycles)")
    probability: Annotated[float, Field(ge=0, le=1), Expect("a probability in [0, 1]")] = 0.0

    @model_validator(mode="after")
    def _scheduled(self):
        if self.cycles is None and self.probability == 0:
            raise ValueError("give `cycles: [...]` or `probability: p`")
        return self


Target = Annotated[str, Field(description='a host, or "host:netdev" for port faults; empty: drawn by the '
                                          "run's seeded generator from the step's hosts or ports")]
Times = Annotated[AtLeastOne, Field(description="how many changes or replies it affects")]


class SshDrop(_FaultEntry):
    """The host's SSH server drops every connection `after_ms` after arming (0: at once, before the command)."""
    kind: Literal["ssh_drop"]
    target: Target = ""
    after_ms: Seconds = 2.0


class OcsDeny(_FaultEntry):
    """The switch refuses the next `count` changes (TL1 DENY SNVS / SCPI -213)."""
    kind: Literal["ocs_deny"]
    count: Times = 1


class OcsSilence(_FaultEntry):
    """The switch swallows the next `count` changes: no effect, no reply (a timeout)."""
    kind: Literal["ocs_silence"]
    count: Times = 1


class LineGarbage(_FaultEntry):
    """Noise bytes between the lines of the next `count` replies (serial/TCP line noise)."""
    kind: Literal["line_garbage"]
    count: Times = 1


class LineDrop(_FaultEntry):
    """`count` replies lose 1-3 characters each (a framing error eats them)."""
    kind: Literal["line_drop"]
    count: Times = 1


class PortNeverUp(_FaultEntry):
    """The port's PHY never trains after CDR lock, for this cycle."""
    kind: Literal["port_never_up"]
    target: Target = ""


class PortFlap(_FaultEntry):
    """Light stays, the carrier drops and retrains `flaps` times (`flap_ms` each)."""
    kind: Literal["port_flap"]
    target: Target = ""
    flaps: AtLeastOne = 3
    flap_ms: Positive = 1.0


class ClockStep(_FaultEntry):
    """The host's clock jumps by `step_ms` (an NTP step; negative steps back)."""
    kind: Literal["clock_step"]
    target: Target = ""
    step_ms: float = 50.0


class SlowHost(_FaultEntry):
    """Every output write of the host's commands is delayed `delay_ms` (a loaded host)."""
    kind: Literal["slow_host"]
    target: Target = ""
    delay_ms: Seconds = 20.0


class WatchStall(_FaultEntry):
    """The host's agent watches print nothing (no line, no heartbeat) for `stall_ms` from arming, their streams
    left open (a stopped or starved agent); then each prints what changed meanwhile, as a poller resumed."""
    kind: Literal["watch_stall"]
    target: Target = ""
    stall_ms: Positive = 500.0


class HarnessKill(_FaultEntry):
    """The harness process gets `signal` when the first mirror moves."""
    kind: Literal["harness_kill"]
    signal: Literal["SIGKILL", "SIGINT", "SIGTERM"] = "SIGKILL"


class DiskFull(_FaultEntry):
    """The event log's file fails with ENOSPC (harness side: see `FullDiskFile`)."""
    kind: Literal["disk_full"]


FAULT_MODELS = (SshDrop, OcsDeny, OcsSilence, LineGarbage, LineDrop, PortNeverUp, PortFlap, ClockStep, SlowHost,
                WatchStall, HarnessKill, DiskFull)
FaultEntry = Annotated[Union[FAULT_MODELS], Field(discriminator="kind")]
FaultEntries = TypeAdapter(list[FaultEntry])
FAULT_KINDS = tuple(m.model_fields["kind"].annotation.__args__[0] for m in FAULT_MODELS)
HOST_FAULTS = ("ssh_drop", "clock_step", "slow_host", "watch_stall")
PORT_FAULTS = ("port_never_up", "port_flap")
_OCS_FAULTS = {"ocs_deny": "deny", "ocs_silence": "silence", "line_garbage": "garbage", "line_drop": "drop_chars"}
_WHEN = tuple(_FaultEntry.model_fields)


class FaultSpecError(ValueError):
    """A fault entry that cannot work. `index` is the entry's position, `key` the offending key."""

    def __init__(self, message: str, index: int, key: str | None = None):
        super().__init__(message)
        self.index, self.key = index, key


@dataclass(frozen=True)
class Fault:
    kind: str
    params: dict[str, Any] = field(default_factory=dict)

    def describe(self) -> str:
        shown = ", ".join(f"{k}={v}" for k, v in self.params.items() if v not in ("", None))
        return f"{self.kind}({shown})" if shown else self.kind


def parse_fault_plan(entries: list, cycles: int) -> list[tuple[Fault, set[int] | None, float]]:
    """Validate entries (the declared fault kinds) → [(fault, explicit cycles or None, probability)].
    Raises FaultSpecError at the first problem (the harness reports every one at load, at its line)."""
    try:
        parsed = FaultEntries.validate_python(entries)
    except ValidationError as exc:
        error = exc.errors(include_url=False)[0]
        loc = error["loc"]
        index = loc[0] if loc and isinstance(loc[0], int) else -1
        tag = error["type"] in ("union_tag_invalid", "union_tag_not_found")
        key = "kind" if tag else next((p for p in loc[2:] if isinstance(p, str)), None)  # loc[1]: the kind
        raise FaultSpecError(f"faults[{index}]{'.' + key if key else ''}: {error['msg']}", index, key) from None
    out = []
    for i, entry in enumerate(parsed):
        if entry.cycles is not None and any(c > cycles for c in entry.cycles):
            raise FaultSpecError(f"faults[{i}].cycles: expected cycle numbers 1..{cycles}", i, "cycles")
        params = {k: getattr(entry, k) for k in type(entry).model_fields if k not in ("kind", *_WHEN)}
        out.append((Fault(entry.kind, params), None if entry.cycles is None else set(entry.cycles), entry.probability))
    return out


def plan_faults(entries: list, cycles: int, rng: np.random.Generator) -> dict[int, list[Fault]]:
    """{cycle: faults} for cycles 1..`cycles`: explicit schedules plus one seeded draw per cycle and entry."""
    parsed = parse_fault_plan(entries, cycles)
    draws = rng.random((cycles, len(parsed))) if parsed else np.zeros((cycles, 0))
    plan: dict[int, list[Fault]] = {}
    for c in range(1, cycles + 1):
        for j, (fault, when, probability) in enumerate(parsed):
            if (when is not None and c in when) or draws[c - 1, j] < probability:
                plan.setdefault(c, []).append(fault)
    return plan


class FullDiskFile:
    """Wraps a binary file: once `armed`, every write fails with ENOSPC (disk full), as the OS would."""

    def __init__(self, inner):
        self._inner = inner
        self.armed = False
        self.failures = 0

    def write(self, data) -> int:
        if self.armed:
            self.failures += 1
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
        return self._inner.write(data)

    def __getattr__(self, name: str):
        return getattr(self._inner, name)


class FaultInjector:
    """Arms faults on one EmulatedBench. `ports` are "host:netdev" keys the targets are drawn from."""

    def __init__(self, bench, ports: list[str], rng: np.random.Generator):
        self.bench = bench
        self.ports = list(ports)
        self.hosts = sorted({p.partition(":")[0] for p in self.ports})
        self.rng = rng
        self.fired: list[dict[str, Any]] = []
        self._undo: list = []
        self._timers: list[threading.Timer] = []

    def _target(self, fault: Fault) -> str:
        target = fault.params.get("target") or ""
        pool = self.hosts if fault.kind in HOST_FAULTS else self.ports
        if not target:
            return str(pool[int(self.rng.integers(len(pool)))])
        if target not in pool:
            raise ValueError(f"{fault.kind}: target {target!r} is not one of {', '.join(pool)}")
        return target

    def _fired(self, cycle: int, fault: Fault, target: str = "", **extra) -> None:
        self.fired.append({"cycle": cycle, "kind": fault.kind, "target": target, "t_ns": now_ns(), **extra})

    def arm(self, cycle: int, faults: list[Fault]) -> None:
        """Set this cycle's faults up (call just before the cycle's OCS command)."""
        physics = self.bench.physics
        for fault in faults:
            kind, p = fault.kind, fault.params
            if kind in _OCS_FAULTS:
                servers = self.bench.ocs_servers
                start = len(servers.faults.fired)
                servers.faults.arm(_OCS_FAULTS[kind], count=int(p["count"]))
                self._undo.append(servers.faults.clear)
                self._fired(cycle, fault, "ocs1")
                # the commands the switch actually met it with (in order), recorded when the cycle disarms
                self._undo.append(lambda record=self.fired[-1], start=start, k=_OCS_FAULTS[kind]: record.update(
                    commands=[command for _, fired, command in servers.faults.fired[start:] if fired == k]))
            elif kind in PORT_FAULTS:
                target = self._target(fault)
                host, _, netdev = target.partition(":")
                if kind == "port_flap":
                    physics.set_port_fault(host, netdev, "flap", flaps=int(p["flaps"]), flap_ms=float(p["flap_ms"]))
                else:
                    physics.set_port_fault(host, netdev, "never_up")
                self._undo.append(lambda h=host, n=netdev: physics.set_port_fault(h, n, None))
                self._fired(cycle, fault, target)
            elif kind == "clock_step":
                target = self._target(fault)
                physics.step_host_clock(target, int(float(p["step_ms"]) * 1e6))
                self._fired(cycle, fault, target)
            elif kind == "slow_host":
                target = self._target(fault)
                server = self.bench.host_servers[target]
                server.reply_delay_s = float(p["delay_ms"]) / 1e3
                self._undo.append(lambda s=server: setattr(s, "reply_delay_s", 0.0))
                self._fired(cycle, fault, target)
            elif kind == "watch_stall":  # outlasts the cycle by design: it ends on its own
                target = self._target(fault)
                self.bench.host_servers[target].watch_stalled_until_ns = now_ns() + int(float(p["stall_ms"]) * 1e6)
                self._fired(cycle, fault, target)
            elif kind == "ssh_drop":
                target = self._target(fault)
                server = self.bench.host_servers[target]

                def drop(server=server, target=target, fault=fault):
                    dropped = server.drop_connections()
                    self._fired(cycle, fault, target, connections=dropped)

                if float(p["after_ms"]) == 0:
                    drop()  # at once, just before the cycle's command: the cycle is sure to see it
                    continue
                timer = threading.Timer(float(p["after_ms"]) / 1e3, drop)
                timer.daemon = True
                timer.start()
                self._timers.append(timer)
            elif kind == "harness_kill":
                self._arm_kill(cycle, fault)
            elif kind == "disk_full":
                pass  # harness side: the caller arms a FullDiskFile
            else:  # pragma: no cover - parse_fault_plan rejects unknown kinds
                raise ValueError(kind)

    def _arm_kill(self, cycle: int, fault: Fault) -> None:
        """Deliver the signal from the emulator's scheduler when the first mirror is released: the
        harness is then in the middle of a reconfiguration."""
        physics = self.bench.physics
        signum = getattr(signal, fault.params["signal"])
        done = threading.Event()

        def on_mirror(t_ns: int, ingress: int, egress: int, settled: bool) -> None:
            if settled or done.is_set():
                return
            done.set()
            self._fired(cycle, fault, "harness")
            os.kill(os.getpid(), signum)

        physics.on_mirror.append(on_mirror)
        self._undo.append(lambda: physics.unwatch_mirror(on_mirror))

    def disarm(self) -> None:
        """Undo the faults that outlast a cycle (pending drops are cancelled)."""
        for timer in self._timers:
            timer.cancel()
        self._timers = []
        undo, self._undo = self._undo, []
        for action in reversed(undo):
            action()
