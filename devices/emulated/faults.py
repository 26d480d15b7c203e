"""Fault injection on the emulated bench: faults as data, armed per cycle, with their own ground truth.

A fault plan is a list of entries `{kind, cycles: [..] | probability: p, ...params}` (from a profile's
`faults: {inject: [...]}` or a turnaround step's `faults:`). `plan_faults` turns it into {cycle: [Fault]}
with a seeded generator, for every cycle up front, so a resumed run meets the same faults.
`FaultInjector.arm()` sets a cycle's faults up just before its OCS command; `disarm()` undoes what
outlasts the cycle. Every fault that actually fired is appended to `injector.fired` (the injection's
ground truth: kind, cycle, target, harness-clock time).

Kinds (targets default to one drawn from the step's ports or hosts):
- ssh_drop       the host's SSH server drops every connection `after_ms` after arming (mid-command;
                 0: at once, before the cycle's command)
- ocs_deny       the switch refuses the next `count` changes (TL1 DENY SNVS / SCPI -213)
- ocs_silence    the switch swallows the next `count` changes: no effect, no reply (a timeout)
- line_garbage   noise bytes between the lines of the next `count` replies (serial/TCP line noise)
- line_drop      `count` replies lose 1-3 characters each (a framing error eats them)
- port_never_up  the port's PHY never trains after CDR lock, for this cycle
- port_flap      light stays, the carrier drops and retrains `flaps` times (`flap_ms` each)
- clock_step     the host's clock jumps by `step_ms` (an NTP step)
- slow_host      every output write of the host's commands is delayed `delay_ms` (a loaded host)
- harness_kill   the harness process gets `signal` (default SIGKILL) when the first mirror moves
- disk_full      the event log's file fails with ENOSPC (harness side: see `FullDiskFile`)
"""
from __future__ import annotations

import errno
import os
import signal
import threading
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from devices.timing import now_ns

# kind -> {param: (type, default)}; `target` is a host or "host:netdev" (empty: drawn by the seeded rng)
FAULT_PARAMS: dict[str, dict[str, tuple[type | tuple[type, ...], Any]]] = {
    "ssh_drop": {"target": (str, ""), "after_ms": ((int, float), 2.0)},
    "ocs_deny": {"count": (int, 1)},
    "ocs_silence": {"count": (int, 1)},
    "line_garbage": {"count": (int, 1)},
    "line_drop": {"count": (int, 1)},
    "port_never_up": {"target": (str, "")},
    "port_flap": {"target": (str, ""), "flaps": (int, 3), "flap_ms": ((int, float), 1.0)},
    "clock_step": {"target": (str, ""), "step_ms": ((int, float), 50.0)},
    "slow_host": {"target": (str, ""), "delay_ms": ((int, float), 20.0)},
    "harness_kill": {"signal": (str, "SIGKILL")},
    "disk_full": {},
}
FAULT_KINDS = tuple(FAULT_PARAMS)
HOST_FAULTS = ("ssh_drop", "clock_step", "slow_host")
PORT_FAULTS = ("port_never_up", "port_flap")
_OCS_FAULTS = {"ocs_deny": "deny", "ocs_silence": "silence", "line_garbage": "garbage", "line_drop": "drop_chars"}


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


def _type_ok(value: Any, types) -> bool:
    types = types if isinstance(types, tuple) else (types,)
    return isinstance(value, types) and not isinstance(value, bool)


def parse_fault_plan(entries: list, cycles: int) -> list[tuple[Fault, set[int] | None, float]]:
    """Validate entries → [(fault, explicit cycles or None, probability)]. Raises FaultSpecError."""
    if not isinstance(entries, list):
        raise FaultSpecError("faults: expected a list of {kind: ..., cycles: [...] | probability: p}", -1)
    out = []
    for i, entry in enumerate(entries):
        if not isinstance(entry, dict):
            raise FaultSpecError(f"faults[{i}]: expected a mapping", i)
        kind = entry.get("kind")
        if kind not in FAULT_PARAMS:
            raise FaultSpecError(f"faults[{i}].kind: expected one of {', '.join(FAULT_KINDS)}, found {kind!r}",
                                 i, "kind")
        schema = FAULT_PARAMS[kind]
        params = {name: default for name, (_, default) in schema.items()}
        when: set[int] | None = None
        probability = 0.0
        for key, value in entry.items():
            if key == "kind":
                continue
            if key == "cycles":
                if not isinstance(value, list) or not all(_type_ok(c, int) and 1 <= c <= cycles for c in value):
                    raise FaultSpecError(f"faults[{i}].cycles: expected a list of cycle numbers 1..{cycles}",
                                         i, key)
                when = set(value)
            elif key == "probability":
                if not _type_ok(value, (int, float)) or not 0 <= value <= 1:
                    raise FaultSpecError(f"faults[{i}].probability: expected a number in [0, 1]", i, key)
                probability = float(value)
            elif key in schema:
                if not _type_ok(value, schema[key][0]):
                    raise FaultSpecError(f"faults[{i}].{key}: wrong type {type(value).__name__}", i, key)
                negative = key != "step_ms" and isinstance(value, (int, float)) and value < 0  # clocks step back too
                if negative or (key in ("count", "flaps") and value < 1) or (key == "flap_ms" and value <= 0):
                    raise FaultSpecError(f"faults[{i}].{key}: out of range ({value})", i, key)
                params[key] = value
            else:
                known = ", ".join(["kind", "cycles", "probability", *schema])
                raise FaultSpecError(f"faults[{i}]: unknown key {key!r} for {kind} (expected one of: {known})",
                                     i, key)
        if kind == "harness_kill" and params["signal"] not in ("SIGKILL", "SIGINT", "SIGTERM"):
            raise FaultSpecError(f"faults[{i}].signal: expected SIGKILL, SIGINT or SIGTERM", i, "signal")
        if when is None and probability == 0:
            raise FaultSpecError(f"faults[{i}]: give `cycles: [...]` or `probability: p`", i)
        out.append((Fault(kind, params), when, probability))
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
                servers.faults.arm(_OCS_FAULTS[kind], count=int(p["count"]))
                self._undo.append(servers.faults.clear)
                self._fired(cycle, fault, "ocs1")
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

        def remove():
            with physics._lock:  # the scheduler iterates on_mirror under this lock
                if on_mirror in physics.on_mirror:
                    physics.on_mirror.remove(on_mirror)

        self._undo.append(remove)

    def disarm(self) -> None:
        """Undo the faults that outlast a cycle (pending drops are cancelled)."""
        for timer in self._timers:
            timer.cancel()
        self._timers = []
        undo, self._undo = self._undo, []
        for action in reversed(undo):
            action()
