"""The emulated switch: one N×M bank of mirrors and the light through it. A command is validated (refused with a
neutral `OcsRefusal` kind each protocol server words its own way), then its mirror moves are put on the schedule,
timed by the profile's `dark` and `switch` delays; an egress is lit while a settled mirror points a lit ingress
at it. The composition (devices/emulated/physics.py) owns the lock, the schedule and the NIC ports the light
reaches."""
from __future__ import annotations

from typing import Callable

from devices.emulated.draws import NIC, OCS
from devices.emulated.nic import DARK_DBM
from devices.emulated.schedule import Schedule
from devices.emulated.truth import TruthLog


class OcsRefusal(Exception):
    """The switch refuses a command, for a reason of `kind` (one of KINDS; each protocol server says it in its
    own words: TL1 error codes, SCPI error numbers, NETCONF error tags); `text` is the switch's comment."""

    KINDS = frozenset({
        "invalid_port",  # not a port of this switch, or not of the side the command needs
        "port_in_use",  # an ingress already connected
        "egress_in_use",  # an egress already connected, or named twice in one command
        "no_patch",  # removing a connection that is not there
        "listed_twice",  # an ingress named twice in one command
        "lists_differ",  # ingress and egress lists of different lengths
        "unsupported",  # a request the emulated switch does not offer
        "not_equipped",  # the unit lacks the hardware (e.g. no optical power monitor)
    })

    def __init__(self, kind: str, text: str):
        if kind not in self.KINDS:
            raise TypeError(f"unknown refusal kind {kind!r}; expected one of {sorted(self.KINDS)}")
        super().__init__(f"{kind}: {text}")
        self.kind, self.text = kind, text


class MirrorSwitch:
    """The mirrors and the light of one `size` = (N ingress, M egress) switch (ingress 1..N, egress N+1..N+M).

    What it needs of the bench it is part of: `schedule` (devices.emulated.schedule.Schedule), `draw(domain,
    command, stage, delay)` → (delay ns, draw index) of a profile delay of the switch, `truth` (the ground truth
    it appends mirror moves to), and `light(t, egress, on, changed, source, command, domain)`: at `t` egress
    `egress` is lit (`on`, by ingress `source`) or dark, `changed` whether it was the other before. Not thread-safe: the bench
    holds its lock around every call."""

    def __init__(self, size: tuple[int, int], delays: dict, *, schedule: Schedule,
                 draw: Callable[[int, int, str, object], tuple[int, int]], truth: TruthLog,
                 light: Callable[[int, int, bool, bool, int | None, int, int], None]):
        self.size = size
        self._delays, self._schedule, self._draw, self._truth, self._light = delays, schedule, draw, truth, light
        # switch commands that moved a mirror, counted per switch: the "cycle" part of the stream keys, so that two
        # switches over this physics draw the same whichever command reaches its server first
        self._commands: dict[int, int] = {}
        self._patches: dict[int, int] = {}  # commanded: ingress -> egress
        self._settled: dict[int, int] = {}  # mirrors in place: ingress -> egress
        self._settled_to: dict[int, int] = {}  # mirrors in place: egress -> ingress (O(1) peer lookup)
        self._lit_ingress: set[int] = set()
        self._lit_egress: set[int] = set()
        # Observers of mirror moves, called (t_ns, ingress, egress, settled) on the scheduler thread with
        # the bench lock held: they must return quickly and not call back into the bench.
        self.on_mirror: list[Callable[[int, int, int, bool], None]] = []

    def patches(self) -> dict[int, int]:
        """The commanded connections, ingress -> egress."""
        return dict(self._patches)

    def source_of(self, egress: int) -> int | None:
        """The ingress whose settled mirror points at `egress`, None if none."""
        return self._settled_to.get(egress)

    def target_of(self, ingress: int) -> int | None:
        """The egress `ingress`'s settled mirror points at, None if none."""
        return self._settled.get(ingress)

    def lit(self, egress: int) -> bool:
        return egress in self._lit_egress

    def transmit(self, ingress: int, on: bool) -> None:
        """Light enters `ingress` (its transmitter is on) or not; the caller then `set_light`s the egress it reaches."""
        (self._lit_ingress.add if on else self._lit_ingress.discard)(ingress)

    def apply(self, adds: dict[int, int], removes: list[int], at_ns: int | None, switch: int) -> int:
        """Validate, then schedule the mirror moves (OpticalBench.ocs_apply says what `at_ns` and `switch` are).
        Returns the monotonic ns when every moved mirror has settled."""
        n, m = self.size
        for port in list(removes) + list(adds):
            if not 1 <= port <= n:
                raise OcsRefusal("invalid_port", f"Invalid ingress port {port}")
        for egress in adds.values():
            if not n < egress <= n + m:
                raise OcsRefusal("invalid_port", f"Invalid egress port {egress}")
        if len(set(removes)) != len(removes):
            raise OcsRefusal("listed_twice", "Port listed twice")
        for ingress in removes:
            if ingress not in self._patches:
                raise OcsRefusal("no_patch", f"No patch on port {ingress}")
        remaining = {i: e for i, e in self._patches.items() if i not in set(removes)}
        used_egress = set(remaining.values())
        if len(set(adds.values())) != len(adds):
            raise OcsRefusal("egress_in_use", "Egress port used twice in one command")
        for ingress, egress in adds.items():
            if ingress in remaining:
                raise OcsRefusal("port_in_use", f"Port {ingress} already connected to {remaining[ingress]}")
            if egress in used_egress:
                raise OcsRefusal("egress_in_use", f"Port {egress} already connected")
        schedule = self._schedule
        t0 = schedule.now()
        if not (adds or removes):
            return t0
        count = self._commands[switch] = self._commands.get(switch, 0) + 1
        command = count + (switch << 40)
        # when the command had surely reached the switch (the server's kernel stamp plus its conversion's bound;
        # else when it was handled, later — `port` says which): what the harness's recorded send must precede
        # (analysis.accuracy.ocs_command_check)
        self._truth.append(t0 if at_ns is None else at_ns, "ocs_command_arrived", "ocs",
                           "handled" if at_ns is None else "kernel", 0)
        dark, dark_draw = self._draw(OCS, command, "dark", self._delays["dark"]) if removes else (0, -1)
        base, base_draw = self._draw(OCS, command, "switch", self._delays["switch"]) if adds else (0, -1)
        started_late = 0  # how much later than the command's arrival the mirrors began to move
        if at_ns is not None:
            first = min(d for d, on in ((dark, removes), (base, adds)) if on)
            t0 = min(t0, max(at_ns, max(schedule.observed_ns, schedule.ran_ns) - first + 1))
            started_late = max(0, t0 - at_ns)
        for ingress in removes:
            egress = self._patches.pop(ingress)
            schedule.at(t0 + dark, lambda t, i=ingress, e=egress: self._mirror_away(t, i, e, command), dark_draw,
                        started_late)
        settle = t0
        if adds:
            settle = t0 + base
            for ingress, egress in adds.items():
                self._patches[ingress] = egress
                schedule.at(settle, lambda t, i=ingress, e=egress: self._mirror_settled(t, i, e, command), base_draw,
                            started_late)
        return settle

    def port_power(self, port: int) -> float:
        """The optical power (dBm) the switch's monitor reads at `port`."""
        if port <= self.size[0]:
            return 1.0 if port in self._lit_ingress else DARK_DBM
        if port in self._lit_egress:
            return -3.0 - 0.05 * (port % 7)  # a per-port insertion loss, stable across runs
        return DARK_DBM

    def _mirror_away(self, t: int, ingress: int, egress: int, command: int) -> None:
        if self._settled.get(ingress) == egress:
            del self._settled[ingress]
            if self._settled_to.get(egress) == ingress:
                del self._settled_to[egress]
                # another mirror may already have settled onto this egress (a fast switch, a slow release)
                for other, e in self._settled.items():
                    if e == egress:
                        self._settled_to[egress] = other
        self._truth.append(t, "mirror_released", "ocs", str(egress), egress)
        for observer in self.on_mirror:
            observer(t, ingress, egress, False)
        self.set_light(t, egress, command)

    def _mirror_settled(self, t: int, ingress: int, egress: int, command: int) -> None:
        if self._patches.get(ingress) != egress:
            return  # superseded before it settled
        self._settled[ingress] = egress
        self._settled_to[egress] = ingress
        self._truth.append(t, "mirror_settled", "ocs", str(egress), egress)
        for observer in self.on_mirror:
            observer(t, ingress, egress, True)
        self.set_light(t, egress, command)

    def set_light(self, t: int, egress: int, command: int, domain: int = NIC) -> None:
        """Egress `egress` is lit iff a settled mirror points a lit ingress at it; `command` and `domain` key the
        draws of what the light change sets off."""
        source = self._settled_to.get(egress)
        on = source is not None and source in self._lit_ingress
        changed = on != (egress in self._lit_egress)
        if changed:
            (self._lit_egress.add if on else self._lit_egress.discard)(egress)
        self._light(t, egress, on, changed, source, command, domain)
