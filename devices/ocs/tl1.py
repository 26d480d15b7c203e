"""Polatis TL1 driver (TCP port 3082): `VERB-MOD:[TID]:[AID]:CTAG[::params];`.

Replies are read by ctag. Header lines, `<` prompts, `IP` acknowledgements and other ctags' replies are
skipped; `COMPLD` returns the body, `DENY` raises DeviceDenied with the switch's own code (IIAC, SROF,
IDNV, PLNA, ...). Autonomous messages (GR-831: `<almcde> <atag> REPT ALM|EVT ...` with alarm code `*C`
critical, `**` major, `*^` minor, `A` none) are set aside as DeviceEvents wherever they arrive: between
commands, before our reply, or in the middle of it (with or without their own header line).
"""
from __future__ import annotations

import itertools
import re
import threading
from collections import deque
from dataclasses import dataclass
from typing import Generator, Mapping, Sequence

from devices.errors import DeviceDenied, DeviceError, DeviceTimeout
from devices.ocs.base import (ConfirmedState, DeviceEvent, DeviceEvents, check_allowed, check_state,
                              disconnect_ports, keep_confirmed, plan_for, power_ports)
from devices.ocs.lines import MAX_REPLY_BYTES, MAX_REPLY_LINES, LineChannel, LineTooLong, excerpt
from devices.protocols import Pending, SteppedSwitch
from devices.resources import OcsResource
from devices.timing import CommandTiming, Deadline, Receipt

_STATUS = re.compile(r"^M\s+(\S+)\s+(COMPLD|DENY|PRTL|DELAY|RTRV)\b\s*(.*)$")
_AUTONOMOUS = re.compile(r"^(\*C|\*\*|\*\^|\*|A)\s+(\d{1,10}(?:\.\d{1,10})?)\s+([A-Z].*)$")
_HEADER = re.compile(r"\d{2,4}-\d\d-\d\d\s+\d\d:\d\d:\d\d\s*$")
_CODE = re.compile(r"^([A-Z]{4})\b")
_COMMENT = re.compile(r"/\*\s*(.*?)\s*\*/")
_QUOTED = re.compile(r'^"(.*)"\s*$')
_PATCH = re.compile(r"^\s*(\d{1,9})\s*,\s*(\d{1,9})\s*$")
_QUOTED_PATCH = re.compile(r'"\s*(\d{1,9})\s*,\s*(\d{1,9})\s*"\s*$')  # _QUOTED holding a _PATCH
_POWER = re.compile(r"^\s*(\d{1,9})\s*:\s*([-+]?\d{1,6}(?:\.\d{0,9})?(?:[eE][-+]?\d{1,3})?)(?:[,\s]|$)")
# What one autonomous message keeps (a real one is a few short lines); the rest is counted, not stored.
_MAX_EVENT_LINES, _MAX_EVENT_LINE = 16, 256
# DENY codes that retrying will not clear: bad port/AID, bad ctag, bad command, bad parameter, bad login,
# login not active. (SROF "busy", SNVS "not in valid state" may clear.)
PERMANENT_CODES = frozenset({"IIAC", "IICT", "ICNV", "IDNV", "PIUI", "PLNA"})


@dataclass(frozen=True)
class Tl1Response:
    """One parsed TL1 response to our ctag."""

    ctag: str
    status: str
    body: tuple[str, ...]  # stripped body lines, without the `;`
    completed_ns: int
    receipt: Receipt | None = None  # how its `;` was stamped (LineChannel.last_receipt)

    @property
    def payloads(self) -> list[str]:
        """Contents of the quoted data lines."""
        return [m.group(1) for line in self.body if (m := _QUOTED.match(line))]

    @property
    def error_code(self) -> str:
        for line in self.body:
            if (m := _CODE.match(line)) and not line.startswith('"'):
                return m.group(1)
        return ""

    @property
    def comment(self) -> str:
        return " ".join(m.group(1) for line in self.body if (m := _COMMENT.search(line)))


@dataclass(frozen=True)
class Tl1Reply:
    """How one command of a pipeline ended: as sent (a password shown as ***), its response and timing, and
    how many autonomous messages the session had received when its response was complete."""

    shown: str
    response: Tl1Response
    timing: CommandTiming
    events_added: int = 0

    @property
    def outcome(self) -> str:
        """`VERB COMPLD`, or `VERB denied CODE`."""
        verb = self.shown.split(":", 1)[0]
        if self.response.status == "COMPLD":
            return f"{verb} COMPLD"
        return f"{verb} denied {self.response.error_code or self.response.status}"

    def denied(self, after: tuple[str, ...] = ()) -> DeviceDenied:
        code = self.response.error_code or self.response.status
        return DeviceDenied(self.shown, code, self.response.comment, permanent=code in PERMANENT_CODES,
                            after=after)


class Tl1Reader:
    """The TL1 message stream of one session, line by line: the responses to the ctags `expect`ed come back
    from `read` (in any order: a response to one is kept until it is read); autonomous messages go to
    `events`; everything else is skipped. State carries across commands, so a message split between the
    backlog and the next reply is still read whole."""

    def __init__(self, channel: LineChannel, device: str, events: DeviceEvents):
        self.channel, self.device, self.events = channel, device, events
        self._wanted: dict[str, list] = {}  # ctag -> [status, body lines, body bytes] of a response being read
        self._done: dict[str, Tl1Response] = {}  # complete responses not yet read
        self._block: str | None = None  # ctag of the response message being read, if inside one
        self._auto: list | None = None  # [t_ns, severity, atag, kind, lines, lines cut]
        self.recent: deque[str] = deque(maxlen=12)  # last lines seen, for error messages

    def expect(self, ctag: str) -> None:
        """Collect the response to `ctag` (call before its command is written)."""
        self._wanted[ctag] = ["", [], 0]

    def forget(self) -> None:
        """Stop collecting: responses still outstanding are skipped when they come."""
        self._wanted.clear()
        self._done.clear()

    def read(self, ctag: str, deadline: Deadline) -> Tl1Response:
        """Lines until the response for `ctag` is complete. DeviceTimeout carries what did arrive."""
        if ctag not in self._done:
            self._wanted.setdefault(ctag, ["", [], 0])
        self.recent.clear()
        try:
            while ctag not in self._done:
                recv_ns, raw = self.channel.read_line(deadline)
                self.recent.append(raw)
                self.feed(recv_ns, raw)
            return self._done.pop(ctag)
        except DeviceTimeout as exc:
            partial = "\n".join(self.recent) + ("\n" + exc.partial if exc.partial else "")
            raise DeviceTimeout(f"no complete reply to ctag {ctag} from {self.channel.description} "
                                f"before the deadline", partial) from None

    def take_backlog(self, deadline: Deadline | None = None) -> None:
        """Read what arrived since the last command (stale replies, autonomous messages)."""
        for recv_ns, raw in self.channel.drain(deadline):
            self.feed(recv_ns, raw)

    def feed(self, recv_ns: int, raw: str) -> Tl1Response | None:
        text = raw.strip()
        if text[:1] == '"' and self._block is not None and self._auto is None:
            self._body_line(text)  # the common line of a long reply: a quoted one can be nothing else
            return None
        if text == ">":  # continuation: the rest of this message follows as another message
            self._end_autonomous()
            self._block = None
            return None
        text = text.lstrip("<").strip()  # a prompt sent without a newline prefixes the next line
        if not text:
            return None
        status = _STATUS.match(text)
        if self._auto is not None:
            if text == ";":
                self._end_autonomous()
                return None
            if status is None and not _AUTONOMOUS.match(text) and not _HEADER.search(text):
                self._add_autonomous_line(text)
                return None
            self._end_autonomous()  # cut short: the next message began without its terminator
        if auto := _AUTONOMOUS.match(text):
            self._auto = [recv_ns, auto.group(1), auto.group(2), " ".join(auto.group(3).split()), [], 0]
            return None
        if _HEADER.search(text):
            return None  # `<SID> YY-MM-DD HH:MM:SS`, whatever the SID is called; also inside a reply
        if self._block is not None and status is None:
            reply = self._wanted.get(self._block)
            if text == ";":
                block, self._block = self._block, None
                if reply is not None:
                    del self._wanted[block]
                    receipt = self.channel.last_receipt
                    if receipt.t_ns != recv_ns:  # fed by hand, not just read: only the read time is known
                        receipt = Receipt(recv_ns, 0, 0, "read")
                    self._done[block] = Tl1Response(block, reply[0], tuple(reply[1]), recv_ns, receipt)
                    return self._done[block]
            else:
                self._body_line(text)
            return None
        if status is not None:
            self._block = status.group(1)
            if (reply := self._wanted.get(self._block)) is not None:
                if not reply[0] or status.group(2) == "DENY":
                    reply[0] = status.group(2)
                if status.group(3).strip():  # some NEs put the error code on the status line
                    self._body_line(status.group(3).strip())  # within the reply's bounds: a flood of them too
        # anything else outside a message (ack `IP ctag`, a stray `;`, noise): skip
        return None

    def _body_line(self, text: str) -> None:
        """A line inside the response message being read: kept if it is one we want, within bounds."""
        reply = self._wanted.get(self._block)
        if reply is None:
            return
        reply[2] += len(text)
        if reply[2] > MAX_REPLY_BYTES or len(reply[1]) >= MAX_REPLY_LINES:
            block, self._block = self._block, "?"  # skip the rest of this flood
            raise DeviceError(f"reply to ctag {block} is longer than {MAX_REPLY_BYTES} bytes "
                              f"or {MAX_REPLY_LINES} lines: {excerpt(text)}")
        reply[1].append(text)

    def _add_autonomous_line(self, text: str) -> None:
        lines = self._auto[4]
        if len(lines) < _MAX_EVENT_LINES:
            lines.append(text[:_MAX_EVENT_LINE])
        else:
            self._auto[5] += 1

    def _end_autonomous(self) -> None:
        if self._auto is None:
            return
        t_ns, severity, atag, kind, lines, cut = self._auto
        self._auto = None
        if cut:
            lines.append(f"... {cut} more lines")
        self.events.add(DeviceEvent(t_ns, self.device, kind, severity, atag, tuple(lines)))


class Tl1Switch(SteppedSwitch):
    """A Polatis switch over TL1. One exchange at a time (an internal lock serialises callers); `apply`
    pipelines its changes.

    `ent_patch_lists`: `apply` sends all new pairs in one `ENT-PATCH::1&2,17&18` (TL1 `&` AID lists, as
    DLT-PATCH uses); set False for a unit that accepts only one pair per ENT-PATCH.
    """

    ent_patch_lists = True

    def __init__(self, resource: OcsResource, channel: LineChannel, *, timeout_s: float = 30.0,
                 tid: str = ""):
        self.resource = resource
        self.allowed = frozenset(resource.allowed_ports)
        self._channel = channel
        self.timeout_s = float(timeout_s)  # default deadline of one command (s)
        self._tid = tid
        self._ctags = itertools.count(1)
        self._lock = threading.Lock()
        self._logged_in = False
        self.last_timing: CommandTiming | None = None
        self.events = DeviceEvents()
        self._confirmed = ConfirmedState()  # what the read after our last change showed (base.plan_for)
        self._reader = Tl1Reader(channel, resource.name, self.events)
        if resource.user:
            self.login(resource.user, resource.password or "")

    # ---- raw protocol -------------------------------------------------------------------------
    def command(self, verb: str, aid: str = "", params: str = "", *, redact: bool = False,
                deadline: Deadline | None = None) -> Tl1Response:
        """Send one TL1 command and wait for its COMPLD; DENY raises DeviceDenied. Sets last_timing."""
        (reply,) = self.pipeline([(verb, aid, params)], redact=redact, deadline=deadline)
        if reply.response.status != "COMPLD":
            raise reply.denied()
        return reply.response

    def pipeline(self, commands: Sequence[tuple[str, str, str]], *, redact: bool = False,
                 deadline: Deadline | None = None) -> list["Tl1Reply"]:
        """Write every (verb, aid, params) command, then read their responses: a TL1 session may have several
        commands outstanding (each has its own ctag) and the switch executes them in the order sent. A DENY
        does not stop the later commands — the switch runs them anyway — so nothing is raised for it here:
        each Tl1Reply says how its command ended. Sets last_timing (the last command's)."""
        return Pending(self._pipeline_steps(commands, redact, deadline)).finish()

    def _pipeline_steps(self, commands: Sequence[tuple[str, str, str]], redact: bool = False,
                        deadline: Deadline | None = None) -> Generator[int, None, list["Tl1Reply"]]:
        """`pipeline` as a driver's steps (devices.protocols.Pending): the session is held from the write
        until every reply is read."""
        with self._lock:
            if not all(verb.startswith("RTRV-") for verb, _, _ in commands):
                self._confirmed.forget()  # a change, or a login: plan the next apply from a read
            deadline = deadline or Deadline(self.timeout_s)
            self._reader.take_backlog(deadline)  # stale output must not be taken for our reply
            sent: list[tuple[str, str]] = []
            texts: list[str] = []
            for verb, aid, params in commands:
                ctag = str(next(self._ctags))
                texts.append(f"{verb}:{self._tid}:{aid}:{ctag}:" + (f":{params}" if params else "") + ";")
                self._reader.expect(ctag)
                sent.append((ctag, f"{verb}:{self._tid}:{aid}:{ctag}::***;" if redact else texts[-1]))
            self._channel.write_line("\r\n".join(texts))  # one write: nothing can come between them
            write = self._channel.last_write
            replies: list[Tl1Reply] = []
            try:
                yield write[0]
                for ctag, shown in sent:
                    try:
                        response = self._reader.read(ctag, deadline)
                    except DeviceTimeout as exc:
                        raise DeviceTimeout(f"{shown}: {exc}") from exc
                    except LineTooLong as exc:  # name the command; the session goes on
                        raise type(exc)(f"{shown}: {exc}") from exc
                    self.last_timing = CommandTiming.of(write, response.receipt)
                    replies.append(Tl1Reply(shown, response, self.last_timing, self.events.added))
            except BaseException:
                self._confirmed.forget()  # the session's state is in doubt
                raise
            finally:
                self._reader.forget()  # replies still outstanding after an error are skipped as stale
        return replies

    def reconnect(self) -> None:
        """A fresh session after a timeout or a dropped connection: reopen the channel, log in again.
        A hung session is abandoned without CANC-USER (it would not answer)."""
        with self._lock:
            self._logged_in = False
            self._confirmed.forget()
            self._channel.reopen()
            self._reader = Tl1Reader(self._channel, self.resource.name, self.events)
        if self.resource.user:
            self.login(self.resource.user, self.resource.password or "")

    def login(self, user: str, password: str) -> CommandTiming:
        self._channel.hidden = (password.encode(),) if password else ()  # the wire log shows ***
        self.command("ACT-USER", user, password, redact=True)
        self._logged_in = True
        self._user = user
        return self.last_timing

    def take_events(self) -> list[DeviceEvent]:
        """Autonomous messages received since the last call (REPT ALM / EVT ...), oldest first."""
        with self._lock:
            try:
                self._reader.take_backlog(Deadline(1.0))
            except DeviceError:
                pass  # a closed or broken session: what was set aside is still handed over
            return self.events.take()

    def _events_added(self) -> int:
        """Autonomous messages received so far, counting what already arrived (drained, no round trip)."""
        with self._lock:
            try:
                self._reader.take_backlog(Deadline(1.0))
            except DeviceError:
                self._confirmed.forget()
            return self.events.added

    # ---- CircuitSwitch --------------------------------------------------------------------------
    def identify(self) -> str:
        response = self.command("RTRV-NETYPE")
        return "; ".join(response.payloads) or " ".join(response.body)

    def patches(self) -> dict[int, int]:
        return self._read_patches()[0]

    def _read_patches(self) -> tuple[dict[int, int], CommandTiming]:
        return self._parse_patches(self.command("RTRV-PATCH")), self.last_timing

    def _parse_patches(self, response: Tl1Response) -> dict[int, int]:
        """An RTRV-PATCH reply's state."""
        pairs: list[tuple[int, int]] = []
        for line in response.body:
            if pair := _QUOTED_PATCH.match(line):  # the usual line, in one match
                pairs.append((int(pair.group(1)), int(pair.group(2))))
                continue
            # Strict: TL1 has no checksum, so a line hit by noise must fail the read, not vanish from it.
            quoted = _QUOTED.match(line)
            pair = _PATCH.match(quoted.group(1)) if quoted else None
            if pair is None:
                if _COMMENT.fullmatch(line.strip()):
                    continue
                raise DeviceError(f"{self.resource.name}: RTRV-PATCH: malformed reply line {excerpt(line, 80)}")
            pairs.append((int(pair.group(1)), int(pair.group(2))))
        return check_state(pairs, self.resource.size, f"{self.resource.name}: RTRV-PATCH reply")

    def connect(self, ingress: int, egress: int) -> CommandTiming:
        """ENT-PATCH as is: a conflicting patch is the switch's error (use `apply` to reconcile)."""
        check_allowed(self.allowed, (ingress, egress), f"connect {ingress}->{egress}")
        self.command("ENT-PATCH", f"{int(ingress)},{int(egress)}")
        return self.last_timing

    def disconnect(self, ingresses: Sequence[int]) -> CommandTiming:
        """DLT-PATCH as is: deleting a missing patch is the switch's error."""
        ingresses = disconnect_ports(self, ingresses)
        self.command("DLT-PATCH", "&".join(map(str, ingresses)))
        return self.last_timing

    def _apply_steps(self, mapping: Mapping[int, int], exclusive: bool) -> Generator[int, None, CommandTiming]:
        """`apply`'s steps (devices.protocols.Pending). Read (or plan from the read after our last change:
        base.plan_for), then the DLT-PATCH of the conflicts, the ENT-PATCH of the new pairs and the confirming
        RTRV-PATCH pipelined (written together: the ENT does not wait a round trip for the DLT's reply, nor the
        read back for the ENT's). The switch
        runs them in the order sent, so the RTRV's reply is the state once the changes are done; a unit that
        answered it early shows a mismatch (StateMismatch: the guard's retry plans from a fresh read).

        A refused command does not stop the ones sent after it: after a denied DLT-PATCH the switch still
        runs the ENT-PATCH, whose ports are then mostly still patched (refused too, e.g. SROF), while pairs
        on free ports may be made. So the first refusal is raised with what each later command did
        (`DeviceDenied.after`), and nothing is assumed about the state: the caller's retry calls `apply`
        again, which reads the switch and sends only what is still missing (the pipelined read is not kept)."""
        planned = plan_for(self, mapping, exclusive)
        plan = planned.plan
        if plan.empty:
            return planned.read
        commands: list[tuple[str, str, str]] = []
        if plan.removes:
            commands.append(("DLT-PATCH", "&".join(map(str, sorted(plan.removes))), ""))
        adds = sorted(plan.adds.items())
        if self.ent_patch_lists and len(adds) > 1:
            # one command, so the mirrors move together instead of settling one after another
            commands.append(("ENT-PATCH", "&".join(str(i) for i, _ in adds) + ","
                             + "&".join(str(e) for _, e in adds), ""))
        else:
            commands += [("ENT-PATCH", f"{ingress},{egress}", "") for ingress, egress in adds]
        *changes, readback = yield from self._pipeline_steps(commands + [("RTRV-PATCH", "", "")])
        for k, reply in enumerate(changes):
            if reply.response.status != "COMPLD":
                raise reply.denied(after=tuple(later.outcome for later in changes[k + 1:]))
        if readback.response.status != "COMPLD":
            raise readback.denied()
        # An autonomous message that came before the last change's reply was sent before the read began (the
        # switch runs the commands in order); one that came after it may report a change the read missed.
        keep_confirmed(self, planned, mapping, self._parse_patches(readback.response), changes[-1].events_added)
        return changes[0].timing.until(changes[-1].timing)

    def port_power(self, ports: Sequence[int]) -> dict[int, float]:
        ports = power_ports(self, ports)
        if not ports:
            return {}
        response = self.command("RTRV-PORT-POWER", "&".join(map(str, ports)))
        power: dict[int, float] = {}
        for payload in response.payloads:
            if m := _POWER.match(payload):
                power[int(m.group(1))] = float(m.group(2))
        missing = [p for p in ports if p not in power]
        if missing:
            raise DeviceError(f"RTRV-PORT-POWER returned no value for port(s) {missing[:20]}: "
                              f"{excerpt(' '.join(response.body))}")
        return power

    def close(self) -> None:
        try:
            if self._logged_in:
                self.command("CANC-USER", self._user, deadline=Deadline(2.0))
        except DeviceError:
            pass  # logging out of a dead session is best effort
        finally:
            self._logged_in = False
            self._confirmed.forget()
            self._channel.close()
