"""What every switch driver shares: the port allowlist, the check that a reported switch state is
physically possible, the reconcile plan behind `apply` (planned from a read, or from the driver's own last
confirmed read while nothing it knows of can have changed the switch), and the queue of what the switch said
on its own."""
from __future__ import annotations

from collections import deque
from dataclasses import dataclass, field
from typing import Iterable, Mapping, NamedTuple

from devices.errors import DeviceError, PortNotAllowed
from devices.timing import CommandTiming

# Autonomous messages kept per switch until the harness takes them; older ones are counted as dropped.
MAX_EVENTS = 1024


class ImpossibleState(DeviceError):
    """The switch reported a cross-connect map that cannot exist on it (port out of range, an egress
    fed twice, ...). Such a state is never believed, so it can never become a restore target."""


def check_state(pairs: Iterable[tuple[int, int]], size: tuple[int, int], what: str) -> dict[int, int]:
    """`pairs` (ingress, egress) as the switch reported them -> ingress -> egress, or ImpossibleState.

    A Polatis N x M switch numbers ingress 1..N and egress N+1..N+M, and a beam goes from one ingress to
    one egress: no ingress or egress appears twice. With an unknown size (0) only port >= 1 is checked.
    """
    n, m = size
    patches: dict[int, int] = {}
    owner: dict[int, int] = {}
    for ingress, egress in pairs:
        if n and m:
            if not 1 <= ingress <= n:
                raise ImpossibleState(f"{what}: ingress {ingress} out of range 1-{n} on this {n}x{m} switch")
            if not n < egress <= n + m:
                raise ImpossibleState(f"{what}: egress {egress} out of range {n + 1}-{n + m} "
                                      f"on this {n}x{m} switch")
        elif ingress < 1 or egress < 1:
            raise ImpossibleState(f"{what}: port {min(ingress, egress)} (ports start at 1)")
        if ingress in patches:
            raise ImpossibleState(f"{what}: ingress {ingress} connected twice (to {patches[ingress]} and "
                                  f"{egress}) on a 1:1 switch")
        if egress in owner:
            raise ImpossibleState(f"{what}: egress {egress} fed by both ingress {owner[egress]} and "
                                  f"{ingress} on a 1:1 switch")
        patches[ingress], owner[egress] = egress, ingress
    return patches


@dataclass(frozen=True)
class DeviceEvent:
    """Something a switch said on its own (a TL1 autonomous message, an SCPI error-queue entry found
    before our own command): evidence about the bench, stamped on the harness clock when it arrived."""

    t_ns: int
    device: str
    kind: str  # e.g. "REPT EVT PATCH", "REPT ALM EQPT", "error-queue", "unsolicited"
    severity: str = ""  # TL1 alarm code: "*C" critical, "**" major, "*^" minor, "A" not an alarm
    tag: str = ""  # TL1 atag (a gap in the sequence shows lost messages)
    text: tuple[str, ...] = ()  # the message's lines as received


class DeviceEvents:
    """A bounded queue of DeviceEvents: `take()` hands them over, `dropped` counts those that did not fit,
    `added` counts every one ever added (taken or not)."""

    def __init__(self, maxlen: int = MAX_EVENTS):
        self._events: deque[DeviceEvent] = deque(maxlen=maxlen)
        self.dropped = 0
        self.added = 0

    def add(self, event: DeviceEvent) -> None:
        if len(self._events) == self._events.maxlen:
            self.dropped += 1
        self._events.append(event)
        self.added += 1

    def take(self) -> list[DeviceEvent]:
        events = list(self._events)
        self._events.clear()
        return events


def check_allowed(allowed: frozenset[int], ports: Iterable[int], what: str) -> None:
    """Raise PortNotAllowed (before anything is sent) when `ports` leave the allowlist."""
    outside = sorted({int(p) for p in ports} - allowed)
    if outside:
        raise PortNotAllowed(
            f"{what} would touch port(s) {','.join(map(str, outside))}, not in the allowed ports "
            f"({format_ports(allowed) or 'none'}); nothing was sent")


def disconnect_ports(switch, ingresses: Iterable[int], current: Mapping[int, int] | None = None) -> list[int]:
    """The ingresses of a `disconnect`, checked before anything changes: at least one, all allowed, and the
    far end of each of their patches (`current`, else read from `switch`) allowed too — a patch has two ends."""
    ingresses = [int(i) for i in ingresses]
    if not ingresses:
        raise ValueError("disconnect needs at least one port")
    check_allowed(switch.allowed, ingresses, "disconnect")
    if current is None:
        current = switch.patches()
    check_allowed(switch.allowed, [current[i] for i in ingresses if i in current], "disconnect")
    return ingresses


def power_ports(switch, ports: Iterable[int]) -> list[int]:
    """The ports of a `port_power` call, all checked against the allowlist before anything is sent."""
    ports = [int(p) for p in ports]
    check_allowed(switch.allowed, ports, "port power")
    return ports


class ConfirmedState:
    """The switch's state as the driver's own read showed it right after its last change (the read that
    confirmed it), so that the next change can be planned without a read round trip.

    It stands only while nothing the driver knows of can have changed the switch since: the same session
    (`forget()` on reconnect and close), no error and no command other than a read since (`forget()` in the
    driver's command path), and no autonomous message since (`take(events_added)`: the driver drains what
    arrived, without a round trip, and passes its `DeviceEvents.added`). It is handed out once: `apply`
    keeps it again only after its own confirming read. A change nobody announced (another operator, a
    front panel) between two applies is caught by that read, which compares every patch on an allowed port
    with the plan's expectation (`confirm`, StateMismatch): the caller's retry then plans from a fresh read.
    """

    def __init__(self) -> None:
        self._patches: dict[int, int] | None = None
        self._events_added = 0
        self._ahead: tuple[dict[int, int], bool, Planned] | None = None  # `plan_ahead`'s, made from _patches

    def keep(self, patches: Mapping[int, int], events_added: int) -> None:
        self._patches, self._events_added, self._ahead = dict(patches), events_added, None

    def forget(self) -> None:
        self._patches = self._ahead = None

    def take(self, events_added: int) -> dict[int, int] | None:
        patches, self._patches = self._patches, None
        return patches if patches is not None and events_added == self._events_added else None

    def peek(self) -> dict[int, int] | None:
        """The kept state, left kept (`plan_ahead` plans from it)."""
        return self._patches

    def hold_ahead(self, mapping: dict[int, int], exclusive: bool, planned: "Planned") -> None:
        self._ahead = (mapping, exclusive, planned)

    def take_ahead(self, mapping: Mapping[int, int], exclusive: bool) -> "Planned | None":
        """The plan made ahead for this very `mapping` (handed out once), if any; `plan_for` uses it only if
        it was made from the state `take` then hands out."""
        ahead, self._ahead = self._ahead, None
        return ahead[2] if ahead is not None and ahead[1] == exclusive and ahead[0] == mapping else None


class Planned(NamedTuple):
    """A reconcile plan and what it was planned from: `current` (the state), `read` (the read's timing, or
    None when `current` is the driver's own last confirmed read)."""

    plan: "ReconcilePlan"
    current: dict[int, int]
    read: CommandTiming | None

    @property
    def expected(self) -> dict[int, int]:
        """The whole switch state once the plan is carried out."""
        return {i: e for i, e in self.current.items() if i not in self.plan.removes} | self.plan.adds


def plan_for(switch, mapping: Mapping[int, int], exclusive: bool) -> Planned:
    """The first half of every driver's `apply`: `mapping` checked against the allowlist, and the plan —
    from the driver's own last confirmed state (`switch._confirmed`, given the autonomous messages counted
    by `switch._events_added()`) if it still stands, the inventory allows it
    (`OcsResource.plan_from_confirmed_read`) and it leaves something to change; else from one read of the
    switch (its `_read_patches()`): "nothing to change" is always the switch's word."""
    ahead = switch._confirmed.take_ahead(mapping, exclusive)
    if ahead is None:  # else its ports were checked when it was made (the allowlist does not change)
        check_allowed(switch.allowed, [p for pair in mapping.items() for p in pair], "apply")
    known = switch._confirmed.take(switch._events_added())
    if known is not None and switch.resource.plan_from_confirmed_read:
        if ahead is not None and ahead.current is known:
            return ahead  # made from this very state: nothing said or done since
        plan = plan_apply(known, mapping, switch.allowed, exclusive)
        if not plan.empty:
            return Planned(plan, known, None)
    current, read_timing = switch._read_patches()
    return Planned(plan_apply(current, mapping, switch.allowed, exclusive), current, read_timing)


def plan_ahead(switch, mapping: Mapping[int, int], exclusive: bool) -> None:
    """Plan the next `apply` of `mapping` now, from the driver's kept state (`plan_for`), while the last
    change settles and nothing is asked of the switch: the plan — its ports checked — waits for `plan_for`,
    which uses it only if that state still stands when it is asked for the same mapping (no command, error,
    reconnect or autonomous message since), so the command goes out without planning between the cycles.
    Nothing is sent; a mapping the allowlist refuses is left for `apply` to refuse."""
    confirmed = getattr(switch, "_confirmed", None)
    known = confirmed.peek() if confirmed is not None and switch.resource.plan_from_confirmed_read else None
    if known is None:
        return
    try:
        check_allowed(switch.allowed, [p for pair in mapping.items() for p in pair], "apply")
        plan = plan_apply(known, mapping, switch.allowed, exclusive)
    except (PortNotAllowed, ValueError):
        return
    if not plan.empty:
        confirmed.hold_ahead(dict(mapping), exclusive, Planned(plan, known, None))


def confirm_planned(switch, planned: Planned, mapping: Mapping[int, int]) -> None:
    """The second half of `apply`: read the switch back, check it shows the change (`confirm`), and keep
    that read as the state the next change may be planned from — unless the switch says something on its
    own from the read's start on (counted before it: an autonomous message that comes with the read's reply
    may report a change made after it)."""
    events_added = switch._events_added()
    keep_confirmed(switch, planned, mapping, switch.patches(), events_added)


def keep_confirmed(switch, planned: Planned, mapping: Mapping[int, int], patches: Mapping[int, int],
                   events_added: int) -> None:
    """`confirm` the read `patches` against the plan (StateMismatch if it does not show it) and keep it as the
    next plan's state; `events_added`: the autonomous messages counted before the read began."""
    confirm(patches, mapping, planned.plan.removes, expected=planned.expected, allowed=switch.allowed)
    switch._confirmed.keep(patches, events_added)


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


def parse_port_ranges(text: str | Iterable[str], limit: int | None = None) -> frozenset[int]:
    """`"1-8,17-24"` (or a list of such items) -> the set of ports, each at most `limit` (the switch's port
    count: a range is never expanded beyond the switch). Raises ValueError."""
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
            if limit is not None and b > limit:
                raise ValueError(f"port range {part!r} goes beyond the switch's {limit} ports")
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


class StateMismatch(DeviceError):
    """The switch's state read back after a change is not what the change should have left: the change
    did not (fully) happen, or something else changed the switch. A retry plans again from a fresh read."""


def _on_ports(patches: Mapping[int, int], ports: frozenset[int]) -> dict[int, int]:
    return {i: e for i, e in patches.items() if i in ports or e in ports}


def confirm(patches: Mapping[int, int], wanted: Mapping[int, int], removed: Iterable[int] = (), *,
            expected: Mapping[int, int] | None = None, allowed: frozenset[int] = frozenset()) -> None:
    """Raise StateMismatch if the switch's reported state does not show what we asked for — and, given the
    plan's `expected` state, if any patch with an end on an `allowed` port differs from it (a patch that
    appeared, went or moved there since the state the plan was made from)."""
    missing = {i: e for i, e in wanted.items() if patches.get(i) != e}
    lingering = [i for i in removed if i in patches and i not in wanted]
    if missing or lingering:
        raise StateMismatch(f"switch state does not confirm the change: missing {missing}, "
                            f"still patched {lingering}; switch reports {dict(sorted(patches.items()))}")
    if expected is not None:
        seen, planned = _on_ports(patches, allowed), _on_ports(expected, allowed)
        if seen != planned:
            unplanned = {i: e for i, e in seen.items() if planned.get(i) != e}
            gone = {i: e for i, e in planned.items() if seen.get(i) != e}
            raise StateMismatch(f"switch state on allowed ports differs from the plan's: unplanned "
                                f"{dict(sorted(unplanned.items()))}, gone {dict(sorted(gone.items()))} "
                                f"(changed by someone else since it was read?)")
