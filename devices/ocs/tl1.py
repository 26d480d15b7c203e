"""Polatis TL1 driver (TCP port 3082): `VERB-MOD:[TID]:[AID]:CTAG[::params];`.

Replies are read by ctag. Header lines, `<` prompts, `IP` acknowledgements and autonomous messages
(`A  <atag> REPT ...`, `*C`/`**`/`*^` alarms) interleaved with the reply are skipped; `COMPLD` returns the
body, `DENY` raises DeviceDenied with the switch's own code (IIAC, SROF, IDNV, PLNA, ...).
"""
from __future__ import annotations

import itertools
import re
import threading
from dataclasses import dataclass
from typing import Mapping, Sequence

from devices.errors import DeviceDenied, DeviceError, DeviceTimeout
from devices.ocs.base import check_allowed, confirm, plan_apply
from devices.ocs.lines import LineChannel
from devices.protocols import CircuitSwitch
from devices.resources import OcsResource
from devices.timing import CommandTiming, Deadline

_STATUS = re.compile(r"^M\s+(\S+)\s+(COMPLD|DENY|PRTL|DELAY|RTRV)\b\s*(.*)$")
_AUTONOMOUS = re.compile(r"^(\*C|\*\*|\*\^|\*|A)\s+\d+\s+\S")
_HEADER = re.compile(r"\d{2,4}-\d\d-\d\d\s+\d\d:\d\d:\d\d\s*$")
_ACK = re.compile(r"^(IP|PF|OK|NA|NG|RL)\s+\S+\s*$")
_CODE = re.compile(r"^([A-Z]{4})\b")
_COMMENT = re.compile(r"/\*\s*(.*?)\s*\*/")
_QUOTED = re.compile(r'^"(.*)"\s*$')
_PATCH = re.compile(r"^\s*(\d+)\s*,\s*(\d+)\s*$")
_POWER = re.compile(r"^\s*(\d+)\s*:\s*([-+0-9.eE]+)")
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


def read_response(channel: LineChannel, ctag: str, deadline: Deadline) -> Tl1Response:
    """Read lines until the response for `ctag` is complete; skip everything else."""
    block: str | None = None  # None outside a message, "ours" or "other" inside one
    status = ""
    body: list[str] = []
    while True:
        recv_ns, raw = channel.read_line(deadline)
        text = raw.strip()
        if text == ">":  # continuation: the rest of this response follows as another message
            block = None
            continue
        text = text.lstrip("<").strip()  # a prompt sent without a newline prefixes the next line
        if not text:
            continue
        if block is not None:
            if text == ";":
                if block == "ours":
                    return Tl1Response(ctag, status, tuple(body), recv_ns)
                block = None
            elif block == "ours":
                body.append(text)
            continue
        if _HEADER.search(text):
            continue  # `<SID> YY-MM-DD HH:MM:SS`, whatever the SID is called
        if m := _STATUS.match(text):
            block = "ours" if m.group(1) == ctag else "other"
            if block == "ours" and (not status or m.group(2) == "DENY"):
                status = m.group(2)
            if block == "ours" and m.group(3).strip():  # some NEs put the error code on the status line
                body.append(m.group(3).strip())
        elif _AUTONOMOUS.match(text):
            block = "other"
        # anything else outside a message: header (SID date time), ack (`IP ctag`), stray `;`: skip


class Tl1Switch(CircuitSwitch):
    """A Polatis switch over TL1. One command at a time (an internal lock serialises callers).

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
        if resource.user:
            self.login(resource.user, resource.password or "")

    # ---- raw protocol -------------------------------------------------------------------------
    def command(self, verb: str, aid: str = "", params: str = "", *, redact: bool = False,
                deadline: Deadline | None = None) -> Tl1Response:
        """Send one TL1 command and wait for its COMPLD; DENY raises DeviceDenied. Sets last_timing."""
        with self._lock:
            ctag = str(next(self._ctags))
            text = f"{verb}:{self._tid}:{aid}:{ctag}:" + (f":{params}" if params else "") + ";"
            shown = f"{verb}:{self._tid}:{aid}:{ctag}::***;" if redact else text
            deadline = deadline or Deadline(self.timeout_s)
            self._channel.drain()  # stale autonomous output must not be taken for our reply
            sent_ns = self._channel.write_line(text)
            try:
                response = read_response(self._channel, ctag, deadline)
            except DeviceTimeout as exc:
                raise DeviceTimeout(f"{shown}: {exc}") from exc
            self.last_timing = CommandTiming(sent_ns, response.completed_ns)
        if response.status != "COMPLD":
            code = response.error_code or response.status
            raise DeviceDenied(shown, code, response.comment, permanent=code in PERMANENT_CODES)
        return response

    def reconnect(self) -> None:
        """A fresh session after a timeout or a dropped connection: reopen the channel, log in again.
        A hung session is abandoned without CANC-USER (it would not answer)."""
        with self._lock:
            self._logged_in = False
            self._channel.reopen()
        if self.resource.user:
            self.login(self.resource.user, self.resource.password or "")

    def login(self, user: str, password: str) -> CommandTiming:
        self.command("ACT-USER", user, password, redact=True)
        self._logged_in = True
        self._user = user
        return self.last_timing

    # ---- CircuitSwitch --------------------------------------------------------------------------
    def identify(self) -> str:
        response = self.command("RTRV-NETYPE")
        return "; ".join(response.payloads) or " ".join(response.body)

    def patches(self) -> dict[int, int]:
        return self._read_patches()[0]

    def _read_patches(self) -> tuple[dict[int, int], CommandTiming]:
        response = self.command("RTRV-PATCH")
        patches: dict[int, int] = {}
        n, m = self.resource.size
        for line in response.body:
            # Strict: TL1 has no checksum, so a line hit by noise must fail the read, not vanish from it.
            quoted = _QUOTED.match(line)
            pair = _PATCH.match(quoted.group(1)) if quoted else None
            if pair is None:
                if _COMMENT.fullmatch(line.strip()):
                    continue
                raise DeviceError(f"RTRV-PATCH: malformed reply line {line[:80]!r}")
            ingress, egress = int(pair.group(1)), int(pair.group(2))
            in_range = 1 <= ingress <= n < egress <= n + m if n and m else 1 <= ingress and 1 <= egress
            if not in_range or ingress in patches or egress in patches.values():
                raise DeviceError(f"RTRV-PATCH: impossible patch {ingress},{egress} in the reply")
            patches[ingress] = egress
        return patches, self.last_timing

    def connect(self, ingress: int, egress: int) -> CommandTiming:
        """ENT-PATCH as is: a conflicting patch is the switch's error (use `apply` to reconcile)."""
        check_allowed(self.allowed, (ingress, egress), f"connect {ingress}->{egress}")
        self.command("ENT-PATCH", f"{int(ingress)},{int(egress)}")
        return self.last_timing

    def disconnect(self, ingresses: Sequence[int]) -> CommandTiming:
        """DLT-PATCH as is: deleting a missing patch is the switch's error."""
        ingresses = [int(i) for i in ingresses]
        if not ingresses:
            raise ValueError("disconnect needs at least one port")
        check_allowed(self.allowed, ingresses, "disconnect")
        current = self.patches()  # a patch has two ends: its egress must be allowed too
        check_allowed(self.allowed, [current[i] for i in ingresses if i in current], "disconnect")
        self.command("DLT-PATCH", "&".join(map(str, ingresses)))
        return self.last_timing

    def apply(self, mapping: Mapping[int, int], *, exclusive: bool = False) -> CommandTiming:
        check_allowed(self.allowed, [p for pair in mapping.items() for p in pair], "apply")
        current, read_timing = self._read_patches()
        plan = plan_apply(current, mapping, self.allowed, exclusive)
        if plan.empty:
            return read_timing
        timings: list[CommandTiming] = []
        if plan.removes:
            self.command("DLT-PATCH", "&".join(map(str, sorted(plan.removes))))
            timings.append(self.last_timing)
        adds = sorted(plan.adds.items())
        if self.ent_patch_lists and len(adds) > 1:
            # one command, so the mirrors move together instead of settling one after another
            self.command("ENT-PATCH", "&".join(str(i) for i, _ in adds) + ","
                         + "&".join(str(e) for _, e in adds))
            timings.append(self.last_timing)
        else:
            for ingress, egress in adds:
                self.command("ENT-PATCH", f"{ingress},{egress}")
                timings.append(self.last_timing)
        confirm(self.patches(), mapping, plan.removes)
        return CommandTiming(timings[0].sent_ns, timings[-1].completed_ns)

    def port_power(self, ports: Sequence[int]) -> dict[int, float]:
        ports = [int(p) for p in ports]
        if not ports:
            return {}
        check_allowed(self.allowed, ports, "port power")
        response = self.command("RTRV-PORT-POWER", "&".join(map(str, ports)))
        power: dict[int, float] = {}
        for payload in response.payloads:
            if m := _POWER.match(payload):
                power[int(m.group(1))] = float(m.group(2))
        missing = [p for p in ports if p not in power]
        if missing:
            raise DeviceError(f"RTRV-PORT-POWER returned no value for port(s) {missing}: {response.body}")
        return power

    def close(self) -> None:
        try:
            if self._logged_in:
                self.command("CANC-USER", self._user, deadline=Deadline(2.0))
        except DeviceError:
            pass  # logging out of a dead session is best effort
        finally:
            self._logged_in = False
            self._channel.close()
