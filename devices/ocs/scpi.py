"""Polatis SCPI driver over TCP (5025) or a serial line (any pyserial URL or device path).

Commands that change state are sent as `<command>;*OPC?` (one line, one write): the `1` marks completion.
The error queue (`:SYST:ERR?`) is then read; a non-zero entry raises DeviceDenied with the switch's
code and text. Channel lists use `(@1,2,3)` and accept `a:b` ranges when parsing.
"""
from __future__ import annotations

import re
import threading
from typing import Generator, Mapping, Sequence

from devices.errors import DeviceDenied, DeviceError, DeviceTimeout, TransportClosed
from devices.ocs.base import (ConfirmedState, DeviceEvent, DeviceEvents, ImpossibleState, Planned, check_allowed,
                              check_state, confirm_planned, disconnect_ports, plan_for, power_ports)
from devices.ocs.lines import MAX_REPLY_LINES, LineChannel, LineTooLong, excerpt
from devices.protocols import Pending, SteppedSwitch
from devices.resources import OcsResource
from devices.timing import CommandTiming, Deadline, Receipt, now_ns

_STATE = re.compile(r"\(@([^)]*)\)\s*,\s*\(@([^)]*)\)")
_ERROR = re.compile(r'^\s*([+-]?\d{1,6})\s*,\s*"?(.*?)"?\s*$')
# SCPI-99 error classes that retrying will not clear: command errors (-100..-199: syntax, undefined
# header, missing parameter) and parameter errors (-220 parameter, -222 data out of range, -224 illegal
# value). Execution errors such as -213 "init ignored" (busy) or -221 "settings conflict" may clear.
_PERMANENT_PARAMETER = frozenset({-220, -222, -224})
_PORT_ITEM = re.compile(r"(\d{1,9})(?::(\d{1,9}))?")
_MAX_PORTS = 4096  # ranges expand only within the switch size; this when the size is unknown
_MAX_ERRORS = 32  # a queue deeper than this is drained over several commands


def is_permanent(code: str) -> bool:
    """Whether an SCPI error code names a refusal that retrying will not clear."""
    try:
        value = int(code)
    except ValueError:
        return False
    return -199 <= value <= -100 or value in _PERMANENT_PARAMETER


def channel_list(ports: Sequence[int]) -> str:
    return "(@" + ",".join(str(int(p)) for p in ports) + ")"


def parse_channel_list(text: str, top: int = 0) -> list[int]:
    """`1,2,5:7` -> [1, 2, 5, 6, 7]. With `top` (the highest port of the switch), a port or range end
    outside 1..top is an ImpossibleState before anything is expanded, so `1:30000000` costs nothing."""
    ports: list[int] = []
    for part in text.replace(" ", "").split(","):
        if not part:
            continue
        bounds = _PORT_ITEM.fullmatch(part)
        if bounds is None:
            raise DeviceError(f"channel list item {excerpt(part, 40)} is not a port or a range a:b")
        lo = int(bounds.group(1))
        hi = int(bounds.group(2)) if bounds.group(2) is not None else lo
        if lo < 1 or hi < lo or hi > (top or _MAX_PORTS):
            raise ImpossibleState(f"channel list item {part!r} is not a range of ports within "
                                  f"1-{top or _MAX_PORTS}")
        ports.extend(range(lo, hi + 1))
    return ports


def parse_state(text: str, size: tuple[int, int] = (0, 0)) -> dict[int, int]:
    """`(@1,2),(@17,18)` -> {1: 17, 2: 18}; several groups may be joined by `;`. The state is checked
    against the switch `size` (ports in range, 1:1) before it is believed (base.check_state)."""
    groups = _STATE.findall(text)
    if not groups:
        raise DeviceError(f"cannot parse connection state {excerpt(text)}")
    top = sum(size)
    most = size[0] or MAX_REPLY_LINES  # a 1:1 switch has no more cross-connects than ingresses
    pairs: list[tuple[int, int]] = []
    for ins, outs in groups:
        ingress, egress = parse_channel_list(ins, top), parse_channel_list(outs, top)
        if len(ingress) != len(egress):
            raise ImpossibleState(f"connection state lists differ in length: {excerpt(text)}")
        pairs += zip(ingress, egress)
        if len(pairs) > most:  # checked as they grow: one 64 KiB line of ranges must not expand unbounded
            raise ImpossibleState(f"connection state lists more than {most} cross-connects: {excerpt(text)}")
    return check_state(pairs, size, "connection state")


class ScpiSwitch(SteppedSwitch):
    """A Polatis switch over SCPI."""


    def __init__(self, resource: OcsResource, channel: LineChannel, *, timeout_s: float = 30.0):
        self.resource = resource
        self.allowed = frozenset(resource.allowed_ports)
        self._channel = channel
        self.timeout_s = float(timeout_s)  # default deadline of one command (s)
        self._lock = threading.Lock()
        self.last_timing: CommandTiming | None = None
        self._broken = False
        self.events = DeviceEvents()
        self._confirmed = ConfirmedState()  # what the read after our last change showed (base.plan_for)
        self._start_session()

    def _start_session(self) -> None:
        """Set aside what the error/event queue holds from before us (evidence, not our errors), then
        start from an empty queue."""
        with self._lock:
            deadline = Deadline(self.timeout_s)
            for code, text in self._errors(deadline):
                self.events.add(DeviceEvent(now_ns(), self.resource.name, "error-queue", tag=code,
                                            text=(text,)))
            self._write("*CLS")

    def reconnect(self) -> None:
        """Reopen the line after a timeout (SCPI replies carry no tag, so the old stream is abandoned)."""
        with self._lock:
            self._confirmed.forget()
            self._channel.reopen()
            self._broken = False
        self._start_session()

    def take_events(self) -> list[DeviceEvent]:
        """Error-queue entries found at (re)connect and lines nobody asked for, oldest first."""
        with self._lock:
            try:
                if not self._broken:
                    self._take_backlog()
            except DeviceError:
                pass  # a closed session: what was set aside is still handed over
            return self.events.take()

    def _events_added(self) -> int:
        """Unsolicited lines received so far, counting what already arrived (drained, no round trip)."""
        with self._lock:
            try:
                if not self._broken:
                    self._take_backlog()
            except DeviceError:
                self._confirmed.forget()
            return self.events.added

    # ---- raw protocol -------------------------------------------------------------------------
    def _write(self, text: str) -> int:
        if self._broken:
            raise TransportClosed(f"{self._channel.description}: closed after an earlier timeout "
                                  f"(a late reply would be taken for the next one); reopen the switch")
        self._take_backlog()
        return self._channel.write_line(text)

    def _take_backlog(self) -> None:
        """Lines nobody asked for (SCPI devices speak only when asked): kept as events, never replies."""
        for recv_ns, line in self._channel.drain(Deadline(min(self.timeout_s, 1.0))):
            self.events.add(DeviceEvent(recv_ns, self.resource.name, "unsolicited", text=(line[:256],)))

    def _reply(self, sent: str, deadline: Deadline) -> tuple[Receipt, str]:
        while True:
            try:
                recv_ns, line = self._channel.read_line(deadline)
            except (DeviceTimeout, LineTooLong, TransportClosed) as exc:
                # SCPI replies carry no tag: after a timeout or a cut line the stream cannot be trusted
                self._broken = True
                self._confirmed.forget()
                self._channel.close()
                renamed = type(exc)(f"{sent!r}: {exc}")
                renamed.partial = getattr(exc, "partial", "")
                raise renamed from exc
            if line.strip() != sent.strip():  # some serial consoles echo the command
                return self._channel.last_receipt, line.strip()

    def query(self, text: str, *, deadline: Deadline | None = None) -> str:
        """Send a query, return its reply line. Sets last_timing."""
        with self._lock:
            deadline = deadline or Deadline(self.timeout_s)
            self._write(text)
            write = self._channel.last_write
            receipt, reply = self._reply(text, deadline)
            self.last_timing = CommandTiming.of(write, receipt)
        return reply

    def execute(self, text: str, *, deadline: Deadline | None = None) -> CommandTiming:
        """Send a command followed by `*OPC?`, then check the error queue; DeviceDenied on error."""
        return Pending(self._execute_steps(text, deadline)).finish()

    def _execute_steps(self, text: str, deadline: Deadline | None = None) -> Generator[int, None, CommandTiming]:
        """`execute` as a driver's steps (devices.protocols.Pending): the session is held from the write until
        the error queue is read."""
        with self._lock:
            self._confirmed.forget()  # a change: plan the next apply from a read, unless apply confirms it
            deadline = deadline or Deadline(self.timeout_s)
            line = f"{text};*OPC?"
            self._write(line)
            write = self._channel.last_write
            yield write[0]
            receipt, reply = self._reply(line, deadline)
            if reply.rsplit(";", 1)[-1].strip() != "1":
                raise DeviceError(f"{text!r}: expected *OPC? reply 1, got {excerpt(reply)}")
            timing = CommandTiming.of(write, receipt)
            errors = self._errors(deadline)
            self.last_timing = timing
        if errors:
            code, message = errors[0]
            more = f" (+{len(errors) - 1} more: {errors[1:]})" if len(errors) > 1 else ""
            raise DeviceDenied(text, code, message + more, permanent=is_permanent(code))
        return timing

    def _errors(self, deadline: Deadline) -> list[tuple[str, str]]:
        errors: list[tuple[str, str]] = []
        for _ in range(_MAX_ERRORS):
            self._write(":SYST:ERR?")
            _, reply = self._reply(":SYST:ERR?", deadline)
            m = _ERROR.match(reply)
            if not m:
                raise DeviceError(f"cannot parse :SYST:ERR? reply {excerpt(reply)}")
            if int(m.group(1)) == 0:
                break
            errors.append((m.group(1), m.group(2)))
        return errors

    # ---- CircuitSwitch --------------------------------------------------------------------------
    def identify(self) -> str:
        return self.query("*IDN?")

    def patches(self) -> dict[int, int]:
        return self._read_patches()[0]

    def _read_patches(self) -> tuple[dict[int, int], CommandTiming]:
        reply = self.query(":OXC:SWIT:CONN:STAT?")
        try:
            return parse_state(reply, self.resource.size), self.last_timing
        except ImpossibleState as exc:  # say which switch: this line may end a run
            raise ImpossibleState(f"{self.resource.name}: :OXC:SWIT:CONN:STAT? reply "
                                  f"{excerpt(reply, 80)}: {exc}") from None
        except DeviceError as exc:
            raise DeviceError(f"{self.resource.name}: :OXC:SWIT:CONN:STAT? reply {excerpt(reply, 80)}: "
                              f"{exc}") from None

    def connect(self, ingress: int, egress: int) -> CommandTiming:
        """`:OXC:SWIT:CONN:ADD` as is: a conflict is the switch's error (use `apply` to reconcile)."""
        check_allowed(self.allowed, (ingress, egress), f"connect {ingress}->{egress}")
        return self.execute(f":OXC:SWIT:CONN:ADD {channel_list([ingress])},{channel_list([egress])}")

    def disconnect(self, ingresses: Sequence[int]) -> CommandTiming:
        """`:OXC:SWIT:CONN:SUB (@ingresses),(@)`: a port without a patch is the switch's error."""
        ingresses = disconnect_ports(self, ingresses)
        return self.execute(f":OXC:SWIT:CONN:SUB {channel_list(ingresses)},(@)")

    def _apply_steps(self, mapping: Mapping[int, int], exclusive: bool) -> Generator[int, None, CommandTiming]:
        """`apply`'s steps (devices.protocols.Pending), yielding after the first change's write. One atomic
        `:CONN:ONLY` when the whole switch state lies on allowed ports (so replacing it cannot touch anything
        else); otherwise `:CONN:SUB` of the conflicts, then `:CONN:ADD`. Planned from
        the read after our last change (base.plan_for) only for SUB + ADD: `:CONN:ONLY` replaces the whole
        switch state, so whether it lies on allowed ports is always read from the switch first."""
        planned = plan_for(self, mapping, exclusive)
        if planned.read is None and self._replaces_all(planned):
            planned = plan_for(self, mapping, exclusive)  # the remembered state was taken: this one reads
        plan, final = planned.plan, planned.expected
        if plan.empty:
            return planned.read
        if self._replaces_all(planned):
            ins = sorted(final)
            timing = yield from self._execute_steps(f":OXC:SWIT:CONN:ONLY {channel_list(ins)},"
                                                    f"{channel_list([final[i] for i in ins])}")
        else:
            commands = []
            if plan.removes:
                commands.append(f":OXC:SWIT:CONN:SUB {channel_list(sorted(plan.removes))},(@)")
            if plan.adds:
                ins = sorted(plan.adds)
                commands.append(f":OXC:SWIT:CONN:ADD {channel_list(ins)},{channel_list([plan.adds[i] for i in ins])}")
            # the first is the change's write; an ADD after a SUB waits for the SUB's reply (SCPI: one at a time)
            timings = [(yield from self._execute_steps(commands[0]))] + [self.execute(c) for c in commands[1:]]
            timing = timings[0].until(timings[-1])
        confirm_planned(self, planned, mapping)
        return timing

    def _replaces_all(self, planned: Planned) -> bool:
        """Whether `apply` would send one `:CONN:ONLY`: the switch's state before and after on allowed ports."""
        return all(p in self.allowed for pair in (planned.current | planned.expected).items() for p in pair)

    def port_power(self, ports: Sequence[int]) -> dict[int, float]:
        """`:MON:POW? (@ports)` -> comma-separated dBm in the same order (command name unverified)."""
        ports = power_ports(self, ports)
        if not ports:
            return {}
        reply = self.query(f":MON:POW? {channel_list(ports)}")
        try:
            values = [float(v) for v in reply.strip("()").split(",")]
        except ValueError:
            raise DeviceError(f":MON:POW? reply is not a list of numbers: {excerpt(reply)}") from None
        if len(values) != len(ports):
            raise DeviceError(f":MON:POW? returned {len(values)} values for {len(ports)} ports: "
                              f"{excerpt(reply)}")
        return dict(zip(ports, values))

    def close(self) -> None:
        self._confirmed.forget()
        self._channel.close()
