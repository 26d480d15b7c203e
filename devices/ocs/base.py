"""What every switch driver shares: the port allowlist and the reconcile plan behind `apply`."""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Iterable, Mapping

from devices.errors import DeviceError, PortNotAllowed


def check_allowed(allowed: frozenset[int], ports: Iterable[int], what: str) -> None:
    """Raise PortNotAllowed (before anything is sent) when `ports` leave the allowlist."""
    outside = sorted({int(p) for p in ports} - allowed)
    if outside:
        raise PortNotAllowed(
            f"{what} would touch port(s) {','.join(map(str, outside))}, not in the allowed ports "
            f"({format_ports(allowed) or 'none'}); nothing was sent")


def format_ports(ports: Iterable[int]) -> str:
    """Compact range text, e.g. `1-8,17-24`."""
    values = sorted(set(ports))
    parts: list[str] = []
    start = prev = None
    for p in values:
        if start is None:
            start = prev = p
        elif p == prev + 1:
            prev = p
        else:
            parts.append(f"{start}-{prev}" if prev != start else str(start))
            start = prev = p
    if start is not None:
        parts.append(f"{start}-{prev}" if prev != start else str(start))
    return ",".join(parts)


def parse_port_ranges(text: str | Iterable[str]) -> frozenset[int]:
    """`"1-8,17-24"` (or a list of such items) -> the set of ports. Raises ValueError."""
    items = [text] if isinstance(text, str) else list(text)
    ports: set[int] = set()
    for item in items:
        for part in str(item).replace(" ", "").split(","):
            if not part:
                continue
            lo, sep, hi = part.partition("-")
            try:
                a, b = int(lo), int(hi) if sep else int(lo)
            except ValueError:
                raise ValueError(f"bad port range {part!r} (expected N or N-M)") from None
            if a < 1 or b < a:
                raise ValueError(f"bad port range {part!r} (ports start at 1, N-M needs N <= M)")
            ports.update(range(a, b + 1))
    return frozenset(ports)


@dataclass(frozen=True)
class ReconcilePlan:
    """Patches to delete (by ingress) and to add, so that the wanted mapping holds."""

    removes: dict[int, int] = field(default_factory=dict)  # ingress -> egress it had
    adds: dict[int, int] = field(default_factory=dict)

    @property
    def empty(self) -> bool:
        return not self.removes and not self.adds

    def touched_ports(self) -> set[int]:
        return set(self.removes) | set(self.removes.values()) | set(self.adds) | set(self.adds.values())


def plan_apply(current: Mapping[int, int], wanted: Mapping[int, int], allowed: frozenset[int],
               exclusive: bool) -> ReconcilePlan:
    """Diff `current` against `wanted`: drop conflicting patches (same ingress elsewhere, or another
    ingress on a wanted egress) and, with `exclusive`, every other patch whose ingress is allowed.
    Raises PortNotAllowed if the plan touches a port outside `allowed`, ValueError if `wanted` maps two
    ingresses to one egress."""
    wanted = {int(i): int(e) for i, e in wanted.items()}
    egress_owner: dict[int, int] = {}
    for i, e in wanted.items():
        if e in egress_owner:
            raise ValueError(f"mapping sends ingress {egress_owner[e]} and {i} to the same egress {e}")
        egress_owner[e] = i
    check_allowed(allowed, list(wanted) + list(wanted.values()), "apply")
    removes: dict[int, int] = {}
    for i, e in current.items():
        if i in wanted:
            if wanted[i] != e:
                removes[i] = e
        elif e in egress_owner or (exclusive and i in allowed):
            removes[i] = e
    adds = {i: e for i, e in wanted.items() if current.get(i) != e}
    plan = ReconcilePlan(removes=removes, adds=adds)
    check_allowed(allowed, plan.touched_ports(), "apply")
    return plan


def confirm(patches: Mapping[int, int], wanted: Mapping[int, int], removed: Iterable[int] = ()) -> None:
    """Raise DeviceError if the switch's reported state does not show what we asked for."""
    missing = {i: e for i, e in wanted.items() if patches.get(i) != e}
    lingering = [i for i in removed if i in patches and i not in wanted]
    if missing or lingering:
        raise DeviceError(f"switch state does not confirm the change: missing {missing}, "
                          f"still patched {lingering}; switch reports {dict(sorted(patches.items()))}")
