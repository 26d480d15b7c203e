"""Polatis SCPI driver over TCP (5025) or a serial line (any pyserial URL or device path).

Commands that change state are sent as `<command>;*OPC?` (one line, one write): the `1` marks completion.
The error queue (`:SYST:ERR?`) is then read; a non-zero entry raises DeviceDenied with the switch's
code and text. Channel lists use `(@1,2,3)` and accept `a:b` ranges when parsing.
"""
from __future__ import annotations

import re
import threading
from typing import Mapping, Sequence

from devices.errors import DeviceDenied, DeviceError, DeviceTimeout, TransportClosed
from devices.ocs.base import check_allowed, confirm, plan_apply
from devices.ocs.lines import LineChannel
from devices.protocols import CircuitSwitch
from devices.resources import OcsResource
from devices.timing import CommandTiming, Deadline

_STATE = re.compile(r"\(@([^)]*)\)\s*,\s*\(@([^)]*)\)")
_ERROR = re.compile(r'^\s*([+-]?\d+)\s*,\s*"?(.*?)"?\s*$')
# SCPI-99 error classes that retrying will not clear: command errors (-100..-199: syntax, undefined
# header, missing parameter) and parameter errors (-220 parameter, -222 data out of range, -224 illegal
# value). Execution errors such as -213 "init ignored" (busy) or -221 "settings conflict" may clear.
_PERMANENT_PARAMETER = frozenset({-220, -222, -224})
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


def parse_channel_list(text: str) -> list[int]:
    """`1,2,5:7` -> [1, 2, 5, 6, 7]."""
    ports: list[int] = []
    for part in text.replace(" ", "").split(","):
        if not part:
            continue
        lo, sep, hi = part.partition(":")
        ports.extend(range(int(lo), int(hi) + 1) if sep else [int(lo)])
    return ports


def parse_state(text: str) -> dict[int, int]:
    """`(@1,2),(@17,18)` -> {1: 17, 2: 18}; several groups may be joined by `;`."""
    patches: dict[int, int] = {}
    groups = _STATE.findall(text)
    if not groups:
        raise DeviceError(f"cannot parse connection state {text!r}")
    for ins, outs in groups:
        ingress, egress = parse_channel_list(ins), parse_channel_list(outs)
        if len(ingress) != len(egress):
            raise DeviceError(f"connection state lists differ in length: {text!r}")
        patches.update(zip(ingress, egress))
    return patches


class ScpiSwitch(CircuitSwitch):
    """A Polatis switch over SCPI."""

    def __init__(self, resource: OcsResource, channel: LineChannel, *, timeout_s: float = 30.0):
        self.resource = resource
        self.allowed = frozenset(resource.allowed_ports)
        self._channel = channel
        self.timeout_s = float(timeout_s)  # default deadline of one command (s)
        self._lock = threading.Lock()
        self.last_timing: CommandTiming | None = None
        self._broken = False
        self._write("*CLS")  # start from an empty error queue

    def reconnect(self) -> None:
        """Reopen the line after a timeout (SCPI replies carry no tag, so the old stream is abandoned)."""
        with self._lock:
            self._channel.reopen()
            self._broken = False
        self._write("*CLS")

    # ---- raw protocol -------------------------------------------------------------------------
    def _write(self, text: str) -> int:
        if self._broken:
            raise TransportClosed(f"{self._channel.description}: closed after an earlier timeout "
                                  f"(a late reply would be taken for the next one); reopen the switch")
        self._channel.drain()
        return self._channel.write_line(text)

    def _reply(self, sent: str, deadline: Deadline) -> tuple[int, str]:
        while True:
            try:
                recv_ns, line = self._channel.read_line(deadline)
            except DeviceTimeout as exc:
                # SCPI replies carry no tag: after a timeout the stream cannot be trusted any more
                self._broken = True
                self._channel.close()
                raise DeviceTimeout(f"{sent!r}: {exc}") from exc
            if line.strip() != sent.strip():  # some serial consoles echo the command
                return recv_ns, line.strip()

    def query(self, text: str, *, deadline: Deadline | None = None) -> str:
        """Send a query, return its reply line. Sets last_timing."""
        with self._lock:
            deadline = deadline or Deadline(self.timeout_s)
            sent_ns = self._write(text)
            recv_ns, reply = self._reply(text, deadline)
            self.last_timing = CommandTiming(sent_ns, recv_ns)
        return reply

    def execute(self, text: str, *, deadline: Deadline | None = None) -> CommandTiming:
        """Send a command followed by `*OPC?`, then check the error queue; DeviceDenied on error."""
        with self._lock:
            deadline = deadline or Deadline(self.timeout_s)
            line = f"{text};*OPC?"
            sent_ns = self._write(line)
            recv_ns, reply = self._reply(line, deadline)
            if reply.rsplit(";", 1)[-1].strip() != "1":
                raise DeviceError(f"{text!r}: expected *OPC? reply 1, got {reply!r}")
            timing = CommandTiming(sent_ns, recv_ns)
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
                raise DeviceError(f"cannot parse :SYST:ERR? reply {reply!r}")
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
        return parse_state(self.query(":OXC:SWIT:CONN:STAT?")), self.last_timing

    def connect(self, ingress: int, egress: int) -> CommandTiming:
        """`:OXC:SWIT:CONN:ADD` as is: a conflict is the switch's error (use `apply` to reconcile)."""
        check_allowed(self.allowed, (ingress, egress), f"connect {ingress}->{egress}")
        return self.execute(f":OXC:SWIT:CONN:ADD {channel_list([ingress])},{channel_list([egress])}")

    def disconnect(self, ingresses: Sequence[int]) -> CommandTiming:
        """`:OXC:SWIT:CONN:SUB (@ingresses),(@)`: a port without a patch is the switch's error."""
        ingresses = [int(i) for i in ingresses]
        if not ingresses:
            raise ValueError("disconnect needs at least one port")
        check_allowed(self.allowed, ingresses, "disconnect")
        current = self.patches()
        check_allowed(self.allowed, [current[i] for i in ingresses if i in current], "disconnect")
        return self.execute(f":OXC:SWIT:CONN:SUB {channel_list(ingresses)},(@)")

    def apply(self, mapping: Mapping[int, int], *, exclusive: bool = False) -> CommandTiming:
        """One atomic `:CONN:ONLY` when the whole switch state lies on allowed ports (so replacing it
        cannot touch anything else); otherwise `:CONN:SUB` of the conflicts, then `:CONN:ADD`."""
        check_allowed(self.allowed, [p for pair in mapping.items() for p in pair], "apply")
        current, read_timing = self._read_patches()
        plan = plan_apply(current, mapping, self.allowed, exclusive)
        if plan.empty:
            return read_timing
        final = {i: e for i, e in current.items() if i not in plan.removes} | plan.adds
        on_allowed = all(p in self.allowed for pair in (current | final).items() for p in pair)
        if on_allowed:
            ins = sorted(final)
            timing = self.execute(f":OXC:SWIT:CONN:ONLY {channel_list(ins)},"
                                  f"{channel_list([final[i] for i in ins])}")
        else:
            timings = []
            if plan.removes:
                timings.append(self.execute(f":OXC:SWIT:CONN:SUB {channel_list(sorted(plan.removes))},(@)"))
            if plan.adds:
                ins = sorted(plan.adds)
                timings.append(self.execute(f":OXC:SWIT:CONN:ADD {channel_list(ins)},"
                                            f"{channel_list([plan.adds[i] for i in ins])}"))
            timing = CommandTiming(timings[0].sent_ns, timings[-1].completed_ns)
        confirm(self.patches(), mapping, plan.removes)
        return timing

    def port_power(self, ports: Sequence[int]) -> dict[int, float]:
        """`:MON:POW? (@ports)` -> comma-separated dBm in the same order (command name unverified)."""
        ports = [int(p) for p in ports]
        if not ports:
            return {}
        check_allowed(self.allowed, ports, "port power")
        reply = self.query(f":MON:POW? {channel_list(ports)}")
        try:
            values = [float(v) for v in reply.strip("()").split(",")]
        except ValueError:
            raise DeviceError(f":MON:POW? reply is not a list of numbers: {reply!r}") from None
        if len(values) != len(ports):
            raise DeviceError(f":MON:POW? returned {len(values)} values for {len(ports)} ports: {reply!r}")
        return dict(zip(ports, values))

    def close(self) -> None:
        self._channel.close()
