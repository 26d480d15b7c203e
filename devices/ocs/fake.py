"""`FakeSwitch`: an in-memory CircuitSwitch for dry runs and unit tests of callers (no I/O, no delays).

It validates like the switch does and raises the same DeviceDenied codes as the emulator: IIAC for a
port that is not an ingress/egress of this size, SROF for a busy port, IDNV for deleting a missing patch
(IIAC and IDNV permanent, as the TL1 driver classifies them).
"""
from __future__ import annotations

from typing import Mapping, Sequence

from devices.errors import DeviceDenied
from devices.ocs.base import Planned, check_allowed, confirm, plan_apply
from devices.protocols import CircuitSwitch
from devices.resources import OcsResource
from devices.timing import CommandTiming, now_ns


class FakeSwitch(CircuitSwitch):
    def __init__(self, resource: OcsResource, dark_dbm: float = -60.0, lit_dbm: float = -3.5):
        self.resource = resource
        self.allowed = frozenset(resource.allowed_ports)
        self.ingress_count, self.egress_count = resource.size
        self._patches: dict[int, int] = {}
        self._dark_dbm, self._lit_dbm = dark_dbm, lit_dbm
        self.commands: list[str] = []  # what a real switch would have been sent, for assertions

    def _is_ingress(self, port: int) -> bool:
        return 1 <= port <= self.ingress_count

    def _is_egress(self, port: int) -> bool:
        return self.ingress_count < port <= self.ingress_count + self.egress_count

    def _timed(self, command: str) -> CommandTiming:
        sent = now_ns()
        self.commands.append(command)
        return CommandTiming(sent, now_ns())

    def identify(self) -> str:
        return f"FAKE,{self.ingress_count}x{self.egress_count},{self.resource.name}"

    def patches(self) -> dict[int, int]:
        return dict(self._patches)

    def connect(self, ingress: int, egress: int) -> CommandTiming:
        command = f"connect {ingress} {egress}"
        check_allowed(self.allowed, (ingress, egress), command)
        if not self._is_ingress(ingress) or not self._is_egress(egress):
            raise DeviceDenied(command, "IIAC", "invalid port", permanent=True)
        # like the switch, a second ENT-PATCH of an existing pair is refused too (the ingress is busy)
        if ingress in self._patches or egress in self._patches.values():
            raise DeviceDenied(command, "SROF", "port already connected")
        self._patches[ingress] = egress
        return self._timed(command)

    def disconnect(self, ingresses: Sequence[int]) -> CommandTiming:
        ingresses = [int(i) for i in ingresses]
        command = "disconnect " + " ".join(map(str, ingresses))
        check_allowed(self.allowed, ingresses, command)
        check_allowed(self.allowed, [self._patches[i] for i in ingresses if i in self._patches], command)
        # the switch checks every port first, then duplicates, then that each patch exists
        if not all(self._is_ingress(i) for i in ingresses):
            raise DeviceDenied(command, "IIAC", "invalid port", permanent=True)
        if len(set(ingresses)) != len(ingresses):
            raise DeviceDenied(command, "IDNV", "port listed twice", permanent=True)
        for i in ingresses:
            if i not in self._patches:
                raise DeviceDenied(command, "IDNV", f"port {i} has no patch", permanent=True)
        for i in ingresses:
            del self._patches[i]
        return self._timed(command)

    def apply(self, mapping: Mapping[int, int], *, exclusive: bool = False) -> CommandTiming:
        plan = plan_apply(self._patches, mapping, self.allowed, exclusive)
        for i, e in plan.adds.items():
            if not self._is_ingress(i) or not self._is_egress(e):
                raise DeviceDenied(f"apply {dict(mapping)}", "IIAC", f"invalid port in {i}->{e}",
                                   permanent=True)
        if plan.empty:
            return self._timed("read")
        expected = Planned(plan, self._patches, None).expected
        for i in plan.removes:
            del self._patches[i]
        self._patches.update(plan.adds)
        # the drivers' check after a change (base.confirm); the fake plans from its state, always the truth
        confirm(self._patches, mapping, plan.removes, expected=expected, allowed=self.allowed)
        return self._timed(f"apply {dict(sorted(plan.adds.items()))} remove {sorted(plan.removes)}")

    def port_power(self, ports: Sequence[int]) -> dict[int, float]:
        ports = [int(p) for p in ports]
        check_allowed(self.allowed, ports, "port power")
        lit = set(self._patches) | set(self._patches.values())
        for p in ports:
            if not (self._is_ingress(p) or self._is_egress(p)):
                raise DeviceDenied(f"port power {p}", "IIAC", "invalid port", permanent=True)
        return {p: self._lit_dbm if p in lit else self._dark_dbm for p in ports}
