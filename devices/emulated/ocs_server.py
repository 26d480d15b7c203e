"""TL1 (TCP) and SCPI (TCP and a pty serial line) servers: thin protocol views of one `OpticalBench`.

Replies follow the Polatis formats in spec/protocols.md §1.1–1.2: TL1 answers with a header line
(`   <SID> YY-MM-DD HH:MM:SS`), `M  <ctag> COMPLD` or `DENY` + GR-831 code + `/* comment */`, and `;`.
A change is answered (TL1 COMPLD, SCPI `*OPC?` -> 1) no earlier than the bench says its mirrors settle.
Every session must log in with ACT-USER on TL1 (commands before that get DENY PLNA); SCPI has no login.
With `autonomous=True`, logged-in TL1 sessions also receive `A  <atag> REPT EVT PATCH` on every change.

All connections (TL1, SCPI, the pty) are served by one asyncio event loop in one thread: an idle
connection costs a socket, not a thread; a session waiting for its mirrors, or a client that stops
reading or sends half a command, never delays another. Each session handles its commands in order.
"""
from __future__ import annotations

import asyncio
import itertools
import os
import random
import re
import socket
import threading
import time
import tty
from collections import deque
from typing import Callable, NamedTuple

from devices.emulated.physics import OpticalBench
from devices.emulated.switching import OcsRefusal
from devices.timing import ReceiveStamps, enable_receive_stamps, now_ns

_LINE_END = re.compile(rb"\r\n|\r|\n")
# A command longer than this is dropped unread (real units have small input buffers); what a client
# does not read is buffered up to _MAX_UNREAD bytes, then the client is dropped.
_MAX_COMMAND = 64 * 1024
_MAX_UNREAD = 1 << 20
_MAX_PORT = 4096  # no switch has more ports: a range beyond is refused before it is expanded


async def _until(t_ns: int) -> None:
    delay = (t_ns - now_ns()) / 1e9
    if delay > 0:
        await asyncio.sleep(delay)


def _port_range(lo: str, hi: str | None) -> range:
    """One port or range, checked before it is expanded (a client's `1&&30000000` costs nothing).
    Raises ValueError."""
    a = int(lo)
    b = int(hi) if hi is not None else a
    if b > _MAX_PORT or b - a > _MAX_PORT:  # ports out of the switch's range are the bench's error
        raise ValueError(f"port range {lo}..{hi}")
    return range(a, b + 1)


def _port_list(text: str) -> list[int]:
    """TL1 AID list: `1&5&9`, ranges `1&&4`. Raises ValueError."""
    ports: list[int] = []
    for item in text.replace("&&", "..").split("&"):
        lo, sep, hi = item.strip().partition("..")
        ports.extend(_port_range(lo, hi if sep else None))
    return ports


_INSTANCES = itertools.count(1)  # emulated switches made by this process (their serial numbers)

class CommandFaults:
    """OCS faults armed for the next matching commands (devices/emulated/faults.py arms them).

    deny: refuse the command without acting (TL1 DENY SNVS, SCPI error -213); silence: swallow it (no
    effect, no reply); garbage: act, then bury the reply in line noise; drop_chars: act, then lose a few
    characters of the reply. Each fired fault is logged in `fired` as (t_ns, kind, command).
    """

    KINDS = ("deny", "silence", "garbage", "drop_chars")

    def __init__(self, seed: int = 0):
        self._lock = threading.Lock()
        self._armed: list[list] = []  # [kind, commands left, changes only]
        self.rng = random.Random(seed)
        self.fired: list[tuple[int, str, str]] = []

    def arm(self, kind: str, count: int = 1, changes_only: bool = True) -> None:
        if kind not in self.KINDS:
            raise ValueError(f"unknown OCS fault {kind!r} (choose from {', '.join(self.KINDS)})")
        if count < 1:
            raise ValueError("count must be >= 1")
        with self._lock:
            self._armed.append([kind, int(count), bool(changes_only)])

    def clear(self) -> None:
        with self._lock:
            self._armed.clear()

    def take(self, command: str, is_change: bool) -> str | None:
        """The fault that applies to this command, if any (consumes one use)."""
        with self._lock:
            for entry in self._armed:
                if is_change or not entry[2]:
                    entry[1] -= 1
                    if entry[1] <= 0:
                        self._armed.remove(entry)
                    self.fired.append((now_ns(), entry[0], command))
                    return entry[0]
        return None

    def corrupt(self, data: bytes, kind: str) -> bytes:
        with self._lock:
            if kind == "garbage":  # a burst of noise on its own line, anywhere between lines
                noise = bytes(self.rng.choice([b for b in range(32, 256) if b != ord(";")])
                              for _ in range(self.rng.randint(3, 12)))
                cuts = [i + 2 for i in range(len(data) - 1) if data[i:i + 2] == b"\r\n"] or [0]
                at = self.rng.choice(cuts)
                return data[:at] + noise + b"\r\n" + data[at:]
            if kind == "drop_chars":
                keep = bytearray(data)
                for _ in range(min(len(keep) - 1, self.rng.randint(1, 3))):
                    del keep[self.rng.randrange(len(keep))]
                return bytes(keep)
        return data


_TL1_CHANGES = ("ENT-PATCH", "DLT-PATCH")


class _Tl1Session:
    """One TL1 connection: login state and command dispatch."""

    def __init__(self, servers: "OcsServers", send: Callable[[bytes], object] | None = None):
        self.servers = servers
        self.user: str | None = None
        self.settle_ns = 0  # the reply to a change waits until its mirrors settle
        self.arrived_ns: int | None = None  # when the command being handled reached the switch (None: unknown)
        self._send = send

    def send(self, data: bytes) -> None:
        """Queue bytes for the client (whole messages: a reply and a report never interleave)."""
        self._send(data)

    def report(self, atag: int, lines: list[str]) -> bytes:
        """An autonomous message (`A  <atag> REPT EVT ...`)."""
        head = ["", "", f"   {self.servers.sid} {time.strftime('%y-%m-%d %H:%M:%S', time.gmtime())}",
                f"A  {atag} REPT EVT PATCH"]
        return "\r\n".join(head + [f"   {line}" for line in lines] + [";"]).encode() + b"\r\n"

    def reply(self, ctag: str, ok: bool, body: list[str] = (), code: str = "", comment: str = "") -> bytes:
        lines = ["", "", f"   {self.servers.sid} {time.strftime('%y-%m-%d %H:%M:%S', time.gmtime())}",
                 f"M  {ctag} {'COMPLD' if ok else 'DENY'}"]
        if not ok:
            lines.append(f"   {code}")
            if comment:
                lines.append(f"   /* {comment} */")
        lines += [f"   {line}" for line in body]
        lines.append(";")
        return "\r\n".join(lines).encode() + b"\r\n"

    def handle(self, command: str) -> bytes:
        parts = command.strip().split(":")
        verb = parts[0].strip().upper()
        aid = parts[2].strip() if len(parts) > 2 else ""
        ctag = parts[3].strip() if len(parts) > 3 else ""
        if not re.fullmatch(r"[A-Za-z0-9]{1,6}", ctag):
            return self.reply(ctag or "0", False, code="IICT", comment="Invalid correlation tag")
        if verb == "ACT-USER":
            password = ":".join(parts[5:]).strip() if len(parts) > 5 else ""
            if self.servers.users.get(aid) == password:
                self.user = aid
                return self.reply(ctag, True)
            return self.reply(ctag, False, code="PIUI", comment="Invalid user name or password")
        if verb == "RTRV-HDR":
            return self.reply(ctag, True)
        if self.user is None:
            return self.reply(ctag, False, code="PLNA", comment="Login not active")
        if verb == "CANC-USER":
            self.user = None
            return self.reply(ctag, True)
        handler: Callable[[str, list[str]], list[str]] | None = {
            "ENT-PATCH": self._ent_patch, "DLT-PATCH": self._dlt_patch, "RTRV-PATCH": self._rtrv_patch,
            "RTRV-PORT-POWER": self._rtrv_power, "RTRV-NETYPE": self._rtrv_netype,
            "RTRV-EQPT": self._rtrv_eqpt,
        }.get(verb)
        if handler is None:
            return self.reply(ctag, False, code="ICNV", comment=f"Command not valid: {verb}")
        try:
            return self.reply(ctag, True, handler(aid, parts[4:]))
        except OcsRefusal as exc:
            return self.reply(ctag, False, code=_TL1_CODES[exc.kind], comment=exc.text)
        except ValueError:
            return self.reply(ctag, False, code="IIAC", comment=f"Invalid access identifier {aid!r}")

    def _ent_patch(self, aid: str, _params: list[str]) -> list[str]:
        ins_text, sep, outs_text = aid.partition(",")
        ins, outs = _port_list(ins_text), _port_list(outs_text) if sep else []
        if not ins or len(ins) != len(outs):
            raise ValueError(aid)
        if len(set(ins)) != len(ins):
            raise OcsRefusal("listed_twice", "Port listed twice")
        self._settle(self.servers.apply(dict(zip(ins, outs)), (), at_ns=self.arrived_ns))
        return []

    def _settle(self, settle_ns: int) -> None:
        self.settle_ns = max(self.settle_ns, settle_ns)

    def _dlt_patch(self, aid: str, _params: list[str]) -> list[str]:
        if aid.upper() == "ALL":
            self._settle(self.servers.apply({}, None, at_ns=self.arrived_ns))
        else:
            self._settle(self.servers.apply({}, _port_list(aid), at_ns=self.arrived_ns))
        return []

    def _rtrv_patch(self, aid: str, _params: list[str]) -> list[str]:
        patches = self.servers.bench.ocs_patches()
        if aid and aid.upper() != "ALL":
            wanted = set(_port_list(aid))
            n, m = self.servers.bench.ocs_size
            if any(not 1 <= p <= n + m for p in wanted):
                raise OcsRefusal("invalid_port", "Invalid port")
            patches = {i: e for i, e in patches.items() if i in wanted or e in wanted}
        return [f'"{i},{e}"' for i, e in sorted(patches.items())]

    def _rtrv_power(self, aid: str, _params: list[str]) -> list[str]:
        n, m = self.servers.bench.ocs_size
        ports = list(range(1, n + m + 1)) if aid.upper() in ("", "ALL") else _port_list(aid)
        for p in ports:
            if not 1 <= p <= n + m:
                raise OcsRefusal("invalid_port", f"Invalid port {p}")
        return [f'"{p}:{self.servers.bench.ocs_port_power(p):.2f}"' for p in ports]

    def _rtrv_netype(self, _aid: str, _params: list[str]) -> list[str]:
        n, m = self.servers.bench.ocs_size
        return [f'"POLATIS,EMU-{n}x{m},OXC,{self.servers.version}"']

    def _rtrv_eqpt(self, aid: str, params: list[str]) -> list[str]:
        if "PARAMETER=SIZE" in ":".join(params).upper().replace(" ", ""):
            n, m = self.servers.bench.ocs_size
            return [f'"{aid or "SYSTEM"}::SIZE={n}x{m}"']
        raise OcsRefusal("unsupported", "Only PARAMETER=SIZE is emulated")


# SCPI mnemonics as the standard writes them: the upper-case part is the short form. A parser accepts
# exactly the short or the long form, in any case (SCPI-99 §6.2.1): `STAT`, `stat`, `STATe`, `state`.
_SCPI_MNEMONICS = ("OXC", "SWITch", "CONNect", "STATe", "SUBtract", "DISConnect", "SYSTem", "ERRor",
                   "MONitor", "POWer", "SIZE", "PORT", "ONLY", "ADD", "ALL", "NEXT")
_SCPI_KEYWORDS = {form.upper(): "".join(c for c in name if c.isupper())
                  for name in _SCPI_MNEMONICS for form in (name, "".join(c for c in name if c.isupper()))}


def _scpi_node(keyword: str) -> str:
    """One header node in its short upper-case form (`STATe?` -> `STAT?`); unknown ones as sent."""
    query = keyword.endswith("?")
    word = keyword.removesuffix("?").upper()
    return _SCPI_KEYWORDS.get(word, word) + ("?" if query else "")
_CHANNELS = re.compile(r"^\s*\(@([^)]*)\)\s*,\s*\(@([^)]*)\)\s*$")
# Each refusal kind (OcsRefusal.KINDS) in the protocols' words: GR-831 error codes (TL1) and SCPI-99 error numbers
_TL1_CODES = {"invalid_port": "IIAC", "port_in_use": "SROF", "egress_in_use": "SROF", "no_patch": "IDNV",
              "listed_twice": "IDNV", "lists_differ": "IDNV", "unsupported": "IDNV", "not_equipped": "SNVS"}
_SCPI_ERRORS = {"invalid_port": (-222, "Data out of range"), "port_in_use": (-221, "Settings conflict"),
                "egress_in_use": (-221, "Settings conflict"), "no_patch": (-224, "Illegal parameter value"),
                "listed_twice": (-224, "Illegal parameter value"), "lists_differ": (-224, "Illegal parameter value"),
                "unsupported": (-224, "Illegal parameter value"), "not_equipped": (-200, "Execution error")}


def _scpi_ports(text: str) -> list[int]:
    """`1,2,5:7` -> [1, 2, 5, 6, 7]. Raises ValueError."""
    ports: list[int] = []
    for item in text.replace(" ", "").split(","):
        if item:
            lo, sep, hi = item.partition(":")
            ports.extend(_port_range(lo, hi if sep else None))
    return ports


class _ScpiSession:
    """One SCPI connection (TCP or the pty): error queue and the settle time `*OPC?` waits for."""

    def __init__(self, servers: "OcsServers"):
        self.servers = servers
        self.errors: list[tuple[int, str]] = []
        self.settle_ns = 0
        self.arrived_ns: int | None = None  # when the line being handled reached the switch (None: unknown)

    def error(self, code: int, text: str) -> None:
        if len(self.errors) < 32:
            self.errors.append((code, text))

    async def handle_line(self, line: str) -> str | None:
        """Execute one program message (commands joined by `;`); the joined query replies, or None.
        `*OPC?` answers once the mirrors of every change before it have settled."""
        replies: list[str] = []
        prefix: list[str] = []
        for unit in line.split(";"):
            unit = unit.strip()
            if not unit:
                continue
            header, _, args = unit.partition(" ")
            if header.startswith("*"):
                nodes = [header.upper()]
            else:
                nodes = [_scpi_node(n) for n in header.strip(":").split(":")]
                nodes = nodes if header.startswith(":") or not prefix else prefix + nodes
                prefix = nodes[:-1]
            if nodes == ["*OPC?"]:
                await _until(self.settle_ns)
            reply = self.execute(":".join(nodes), args.strip())
            if reply is not None:
                replies.append(reply)
        return ";".join(replies) if replies else None

    def execute(self, path: str, args: str) -> str | None:
        bench = self.servers.bench
        n, m = bench.ocs_size
        try:
            if path == "*IDN?":
                return f"Polatis,EMU-{n}x{m},{self.servers.serial},{self.servers.version}"
            if path == "*OPC?":
                return "1"
            if path == "*CLS":
                self.errors.clear()
                return None
            if path in ("SYST:ERR?", "SYST:ERR:NEXT?"):
                code, text = self.errors.pop(0) if self.errors else (0, "No error")
                return f'{code},"{text}"'
            if path == "SYST:ERR:ALL?":
                errors, self.errors = self.errors or [(0, "No error")], []
                return ",".join(f'{c},"{t}"' for c, t in errors)
            if path == "OXC:SWIT:SIZE?":
                return f"{n},{m}"
            if path == "OXC:SWIT:CONN:STAT?":
                patches = sorted(bench.ocs_patches().items())
                return (f"(@{','.join(str(i) for i, _ in patches)}),"
                        f"(@{','.join(str(e) for _, e in patches)})")
            if path == "OXC:SWIT:CONN:PORT?":
                port = int(args)
                patches = bench.ocs_patches()
                peer = patches.get(port) or next((i for i, e in patches.items() if e == port), 0)
                return f'"{peer}"'
            if path == "MON:POW?":
                ports = _scpi_ports(args.strip().removeprefix("(@").removesuffix(")"))
                if any(not 1 <= p <= n + m for p in ports) or not ports:
                    raise OcsRefusal("invalid_port", "Invalid port")
                return ",".join(f"{bench.ocs_port_power(p):.2f}" for p in ports)
            if path in ("OXC:SWIT:CONN:ADD", "OXC:SWIT:CONN:ONLY", "OXC:SWIT:CONN:SUB"):
                match = _CHANNELS.match(args)
                if not match:
                    self.error(-109, "Missing parameter; expected (@ingress...),(@egress...)")
                    return None
                ins, outs = _scpi_ports(match.group(1)), _scpi_ports(match.group(2))
                self._connect(path.rsplit(":", 1)[1], ins, outs)
                return None
            if path in ("OXC:SWIT:DISC:ALL", "*RST"):
                self.settle_ns = max(self.settle_ns, self.servers.apply({}, None, at_ns=self.arrived_ns))
                return None
        except OcsRefusal as exc:
            code, text = _SCPI_ERRORS[exc.kind]
            self.error(code, f"{text}; {exc.text}")
            return None
        except ValueError:
            self.error(-224, f"Illegal parameter value; {args!r}")
            return None
        self.error(-113, f"Undefined header; {path}")
        return None

    def _connect(self, action: str, ins: list[int], outs: list[int]) -> None:
        if action == "SUB":
            patches = self.servers.bench.ocs_patches()
            if outs and ins and len(ins) != len(outs):
                raise OcsRefusal("lists_differ", "Ingress and egress lists differ in length")
            removes = list(ins)
            if outs and not ins:  # by egress only
                owner = {e: i for i, e in patches.items()}
                missing = [e for e in outs if e not in owner]
                if missing:
                    raise OcsRefusal("no_patch", f"No patch on port {missing[0]}")
                removes = [owner[e] for e in outs]
            for i, e in zip(ins, outs):
                if patches.get(i) != e:
                    raise OcsRefusal("no_patch", f"No patch {i}->{e}")
            settle = self.servers.apply({}, removes, at_ns=self.arrived_ns)
        else:
            if len(ins) != len(outs):
                raise OcsRefusal("lists_differ", "Ingress and egress lists differ in length")
            if len(set(ins)) != len(ins):
                raise OcsRefusal("listed_twice", "Port listed twice")
            settle = self.servers.apply(dict(zip(ins, outs)), None if action == "ONLY" else (),
                                       at_ns=self.arrived_ns)
        self.settle_ns = max(self.settle_ns, settle)


class _StampedConnection(asyncio.StreamReaderProtocol):
    """A TCP connection whose bytes the server reads itself, with recvmsg and SO_TIMESTAMPNS: each chunk comes
    with the kernel's receive time of its last byte, so the emulated switch acts when a command arrived, not
    when a busy machine let this loop's thread get to it (0.5-24 ms later under load, which moved the switch's
    truth with it). The transport writes; it never reads (paused before its first read). `stamps` is the
    servers' one `ReceiveStamps` (made before they listen; all connections are read on one loop thread)."""

    def __init__(self, reader: asyncio.StreamReader, serve, stamps: ReceiveStamps):
        super().__init__(reader, serve)
        self._stamps = stamps

    def connection_made(self, transport) -> None:
        super().connection_made(transport)
        transport.pause_reading()  # before the loop ever registers the transport's reader
        raw = transport.get_extra_info("socket")
        raw.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        enable_receive_stamps(raw)
        self._sock = socket.socket(fileno=os.dup(raw.fileno()))  # the transport's wrapper has no recvmsg
        self._sock.setblocking(False)
        self._ready: asyncio.Future | None = None
        self._lost = False

    def connection_lost(self, exc) -> None:
        self._lost = True
        self._wake()
        self._sock.close()  # before the transport closes its own descriptor: the peer then sees the close
        super().connection_lost(exc)

    def _wake(self) -> None:
        if self._ready is not None and not self._ready.done():
            self._ready.set_result(None)

    async def read(self) -> tuple[bytes, int | None]:
        """(bytes, when they had surely arrived on the harness clock: the kernel's receive stamp, converted, plus
        the conversion's bound — the switch acts from then, never before the command can have reached it; None:
        no stamp); b"" once the connection is gone."""
        loop = asyncio.get_running_loop()
        while not self._lost:
            try:
                received = self._stamps.recv(self._sock, 4096)
            except (BlockingIOError, InterruptedError):
                pass
            except OSError:
                return b"", None
            else:
                return received.data, received.t_ns + received.bound_ns if received.kernel else None
            self._ready = loop.create_future()
            fd = self._sock.fileno()
            loop.add_reader(fd, self._wake)
            try:
                await self._ready
            finally:
                if not self._lost:
                    loop.remove_reader(fd)
        return b"", None


class Served(NamedTuple):
    """One TL1 command as the emulated switch served it (harness clock, ns): when the command reached this
    server's kernel (None on a pty), and its reply's write — the client's kernel has it between the two."""

    command: str
    arrived_ns: int | None
    reply_write_ns: int
    reply_written_ns: int


class OcsServers:
    """TL1 and SCPI servers on 127.0.0.1 (ephemeral ports by default) plus an SCPI pty, over one bench."""

    def __init__(self, bench: OpticalBench, host: str = "127.0.0.1", tl1_port: int = 0, scpi_port: int = 0,
                 pty: bool = True, *, user: str = "admin", password: str = "root",
                 users: dict[str, str] | None = None, sid: str = "POLATIS", autonomous: bool = False):
        self.bench = bench
        self.host = host
        self.users = dict(users) if users is not None else {user: password}
        self.sid = sid
        self.autonomous = autonomous  # send `A ... REPT EVT PATCH` to logged-in TL1 sessions on changes
        self._tl1_sessions: set[_Tl1Session] = set()
        self._atag = 0
        self.serial = f"EMU{os.getpid() % 100000:05d}{next(_INSTANCES):04d}"  # each unit its own, as on a bench
        self.version = "ocs-hil-emulator-1"
        self._ports = (tl1_port, scpi_port)
        self._want_pty = pty
        self._apply_lock = threading.Lock()
        self._loop: asyncio.AbstractEventLoop | None = None
        self._thread: threading.Thread | None = None
        self._listeners: list[asyncio.base_events.Server] = []
        self._writers: set[asyncio.StreamWriter] = set()
        self._tasks: set[asyncio.Task] = set()
        self._pty_fds: tuple[int, int] | None = None
        self.pty_path: str | None = None
        self.faults = CommandFaults()
        self.tl1_served: deque[Served] = deque(maxlen=4096)  # ground truth of the TL1 commands' timing

    # ---- lifecycle ------------------------------------------------------------------------------
    def start(self) -> "OcsServers":
        loop = asyncio.new_event_loop()
        opened = loop.run_until_complete(self._open(loop))  # errors (port in use) surface here
        self._loop = loop
        self._thread = threading.Thread(target=loop.run_forever, name="ocs-servers", daemon=True)
        self._thread.start()
        return opened

    async def _open(self, loop: asyncio.AbstractEventLoop) -> "OcsServers":
        stamps = ReceiveStamps()  # before any connection can receive
        for port, serve in zip(self._ports, (self._tl1_client, self._scpi_client)):
            listener = await loop.create_server(
                lambda serve=serve: _StampedConnection(asyncio.StreamReader(limit=_MAX_COMMAND), serve, stamps),
                self.host, port, backlog=1024)
            for sock in listener.sockets:  # accepted connections inherit it: stamped before connection_made runs
                enable_receive_stamps(sock)
            self._listeners.append(listener)
        if self._want_pty:
            master, slave = os.openpty()
            tty.setraw(slave)  # at once: a cooked slave would echo our replies back to us
            self._pty_fds = (master, slave)  # keep the slave open, or reads on the master fail with EIO
            self.pty_path = os.ttyname(slave)
            reader = asyncio.StreamReader(limit=_MAX_COMMAND)
            await loop.connect_read_pipe(lambda: asyncio.StreamReaderProtocol(reader),
                                         os.fdopen(os.dup(master), "rb", buffering=0))
            transport, protocol = await loop.connect_write_pipe(
                lambda: asyncio.StreamReaderProtocol(asyncio.StreamReader()),
                os.fdopen(os.dup(master), "wb", buffering=0))
            writer = asyncio.StreamWriter(transport, protocol, None, loop)
            # Serial consoles end replies with CR LF; one session for the life of the line.
            async def read() -> tuple[bytes, None]:  # a serial line: no kernel receive stamps
                return await reader.read(4096), None

            self._spawn(self._serve_scpi(read, writer, _ScpiSession(self), b"\r\n"))
        return self

    def stop(self) -> None:
        loop, self._loop = self._loop, None
        if loop is None:
            return
        asyncio.run_coroutine_threadsafe(self._close(), loop).result(timeout=10)
        loop.call_soon_threadsafe(loop.stop)
        self._thread.join(timeout=5)
        loop.close()
        if self._pty_fds:
            for fd in self._pty_fds:
                os.close(fd)
            self._pty_fds = None
        self._listeners = []

    async def _close(self) -> None:
        for listener in self._listeners:
            listener.close()
        for writer in list(self._writers):
            writer.close()
        for task in list(self._tasks):
            task.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)

    def __enter__(self) -> "OcsServers":
        return self.start()

    def __exit__(self, *exc) -> None:
        self.stop()

    @property
    def tl1_address(self) -> tuple[str, int]:
        return self._listeners[0].sockets[0].getsockname()[:2]

    @property
    def scpi_address(self) -> tuple[str, int]:
        return self._listeners[1].sockets[0].getsockname()[:2]

    # ---- shared state -------------------------------------------------------------------------
    def apply(self, adds: dict[int, int], removes, at_ns: int | None = None) -> int:
        """Change the bench; returns when its mirrors settle (the reply waits until then). `removes=None`
        replaces the whole state (`adds` is then the complete wanted mapping; unchanged patches are not
        moved). `at_ns`: when the command arrived (OpticalBench.ocs_apply)."""
        with self._apply_lock:  # read-diff-apply must not interleave between sessions
            if removes is None:
                current = self.bench.ocs_patches()
                removes = [i for i, e in current.items() if adds.get(i) != e]
                adds = {i: e for i, e in adds.items() if current.get(i) != e}
            settle_ns = self.bench.ocs_apply(adds, removes, at_ns=at_ns)
        if self.autonomous and (adds or removes) and self._loop is not None:
            lines = [f'"{i}:DLT"' for i in removes] + [f'"{i},{e}:ENT"' for i, e in adds.items()]
            self._loop.call_later(max(0.0, (settle_ns - now_ns()) / 1e9), self._report, lines)
        return settle_ns

    def _report(self, lines: list[str]) -> None:
        """Send an autonomous `REPT EVT` to every logged-in TL1 session (they interleave with replies)."""
        self._atag += 1
        for session in list(self._tl1_sessions):
            if session.user is not None:
                session.send(session.report(self._atag, lines))

    # ---- connections ----------------------------------------------------------------------------
    def _spawn(self, coroutine) -> None:
        task = asyncio.get_running_loop().create_task(coroutine)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    def _sender(self, writer: asyncio.StreamWriter) -> Callable[[bytes], None]:
        def send(data: bytes) -> None:
            if writer.is_closing():
                return
            if writer.transport.get_write_buffer_size() > _MAX_UNREAD:
                writer.close()  # a client that never reads must not grow our memory
                return
            writer.write(data)
        return send

    async def _tl1_client(self, _reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self._tasks.add(asyncio.current_task())
        self._writers.add(writer)
        connection: _StampedConnection = writer.transport.get_protocol()
        session = _Tl1Session(self, self._sender(writer))
        self._tl1_sessions.add(session)
        try:
            buffer = b""
            # The session runs its commands in order, each from when the switch is done with the one before:
            # its arrival, or the settle of the previous change (a pipelined ENT-PATCH starts once the DLT-PATCH
            # sent with it is done), not when this loop gets round to it on a busy machine.
            free_ns = 0
            while True:
                data, arrived = await connection.read()
                if not data:
                    break
                buffer += data
                while b";" in buffer:
                    command, _, buffer = buffer.partition(b";")
                    text = command.decode("utf-8", "replace").strip()
                    if text:
                        start = None if arrived is None else max(arrived, free_ns)
                        session.arrived_ns = start
                        reply = self._tl1_reply(session, text)
                        await _until(session.settle_ns)
                        writing = now_ns()
                        session.send(reply)
                        self.tl1_served.append(Served(text, arrived, writing, now_ns()))
                        await writer.drain()
                        free_ns = now_ns() if start is None else max(start, session.settle_ns)
                if len(buffer) > _MAX_COMMAND:
                    buffer = b""  # no command is this long: noise, dropped
        except (OSError, asyncio.CancelledError):
            pass  # the client went away, or the server stops
        finally:
            self._tl1_sessions.discard(session)
            self._forget(writer)

    def _tl1_reply(self, session: _Tl1Session, text: str) -> bytes:
        parts = text.split(":")
        fault = self.faults.take(text, parts[0].strip().upper() in _TL1_CHANGES)
        if fault == "silence":
            return b""
        if fault == "deny":
            ctag = parts[3].strip() if len(parts) > 3 else "0"
            return session.reply(ctag or "0", False, code="SNVS", comment="Switch busy")
        reply = session.handle(text)
        return self.faults.corrupt(reply, fault) if fault else reply

    async def _scpi_client(self, _reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self._tasks.add(asyncio.current_task())
        self._writers.add(writer)
        try:
            await self._serve_scpi(writer.transport.get_protocol().read, writer, _ScpiSession(self), b"\n")
        finally:
            self._forget(writer)

    def _forget(self, writer: asyncio.StreamWriter) -> None:
        self._writers.discard(writer)
        writer.close()
        self._tasks.discard(asyncio.current_task())

    async def _serve_scpi(self, read: Callable, writer: asyncio.StreamWriter, session: _ScpiSession,
                          eol: bytes) -> None:
        """Feed SCPI lines (CR, LF or CRLF) from `read()` -> (bytes, arrival ns | None) to `session` until the
        client goes away."""
        send = self._sender(writer)
        buffer = b""
        free_ns = 0  # lines are handled in order: one starts once the one before is done
        try:
            while True:
                data, arrived = await read()
                if not data:
                    break
                buffer += data
                *lines, buffer = _LINE_END.split(buffer)
                if len(buffer) > _MAX_COMMAND:
                    buffer = b""  # no program message is this long: noise, dropped
                for line in lines:
                    text = line.decode("utf-8", "replace").strip()
                    if not text:
                        continue
                    upper = text.upper()
                    fault = self.faults.take(text, "CONN" in upper or "DISC" in upper or "*RST" in upper)
                    if fault == "silence":
                        continue
                    if fault == "deny":
                        session.error(-213, "Init ignored; switch busy")
                        reply = "1" if "*OPC?" in upper else None
                    else:
                        session.arrived_ns = None if arrived is None else max(arrived, free_ns)
                        reply = await session.handle_line(text)
                    if reply is not None:
                        data = reply.encode() + eol
                        send(self.faults.corrupt(data, fault) if fault else data)
                        await writer.drain()
                    free_ns = now_ns()
        except (OSError, asyncio.CancelledError):
            pass  # the client went away, or the server stops
