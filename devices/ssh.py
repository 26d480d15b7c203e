"""SSH command transport (paramiko): one persistent connection per host.

Why it looks like this (shared spec feasibility.md §1, §4):
- the TCP socket is created here with TCP_NODELAY and handed to paramiko via `sock=`; paramiko's own
  socket stalls ~40 ms per round trip on Nagle + delayed ACK;
- commands run as channels on one long-lived transport (~1 ms each); monitors stream over one channel;
- strict host-key checking (known_hosts + RejectPolicy) unless the inventory marks the bench emulated;
- a dropped connection is re-established with bounded retries and backoff before a command is sent;
  a command whose connection drops mid-way is not re-run (it may have had effects): TransportClosed.
Secrets (passwords, key material) never appear in error messages.
"""
from __future__ import annotations

import atexit
import contextlib
import errno
import functools
import os
import selectors
import shutil
import socket
import tempfile
import threading
import time
from typing import Iterator

import paramiko
from paramiko.common import cMSG_CHANNEL_WINDOW_ADJUST

from devices import wirelog
from devices.errors import DeviceError, DeviceTimeout, ReadBudget, TransportClosed
from devices.protocols import CommandResult, CommandTransport, LineStream
from devices.resources import HostResource, JumpHost
from devices.sshhub import ArrivalStampedPipe, HubSocket, HubTransport, first_send_ns, shared_hub, stamp_arrivals
from devices.timing import ClockPair, CommandTiming, Deadline, now_ns

_CHUNK = 65536
_POLL_S = 0.05  # how often a blocked read wakes to drain stderr and check its deadline
_ACK_BYTES = 16384  # pushed lines give their window back to the peer in steps of this (paramiko's recv would)


class HostKeyError(DeviceError):
    """The host's key is unknown (strict checking) or differs from known_hosts. Never retried."""


class AuthenticationFailed(DeviceError):
    """The host refused our credentials. Never retried."""


class CommandFailed(DeviceError):
    """`run(..., check=True)` and the command exited non-zero."""

    def __init__(self, host: str, result: CommandResult):
        tail = result.stderr.strip().splitlines()[-1:] or [""]
        super().__init__(f"{host}: {result.command!r} exited {result.exit_status}: {tail[0][:200]}")
        self.result = result


OVERFLOW_CONNECTIONS = 4  # more connections to one host, at most, for sessions its sshd refused on the first


def _no_more_sessions(exc: BaseException) -> bool:
    """The host's sshd refused a session channel as OpenSSH does past MaxSessions ("no more sessions")."""
    return isinstance(exc, paramiko.ChannelException) and exc.code == paramiko.OPEN_FAILED_CONNECT_FAILED


# OpenSSH's MaxStartups (10:30:100 by default) drops new connections at random once 10 are between their TCP accept
# and their login (every one past 100), and a lab's bastion is dialled by every host's route at set-up (32 at once):
# drops cost retries, and fail2ban on the bastion may count them against the harness's address. At most this many
# of the process's logins are under way at one jump host.
JUMP_LOGINS_AT_ONCE = 8
_jump_logins: dict[tuple[str, int], threading.BoundedSemaphore] = {}
_jump_logins_lock = threading.Lock()


def _jump_login_slot(hop: JumpHost) -> threading.BoundedSemaphore:
    with _jump_logins_lock:
        return _jump_logins.setdefault((hop.address, hop.port), threading.BoundedSemaphore(JUMP_LOGINS_AT_ONCE))


def _close_route(client: paramiko.SSHClient | None, hops: list[paramiko.SSHClient]) -> None:
    """Close a connection, then the jump hosts' connections it went through, the last hop first."""
    if client is not None:
        client.close()
    for hop in reversed(hops):
        hop.close()


class SshTransport(CommandTransport):
    """`CommandTransport` over SSH to one `HostResource`. Thread-safe: many channels may run at once.

    connect_timeout bounds TCP connect + handshake + auth of one attempt; command deadlines are separate.
    """

    def __init__(self, resource: HostResource, *, connect_timeout: float = 10.0, keepalive_s: float = 15.0,
                 retries: int = 3, backoff_s: float = 0.2, password: str | None = None):
        self.resource = resource
        self.connect_timeout = connect_timeout
        self.keepalive_s = keepalive_s
        self.retries = retries
        self.backoff_s = backoff_s
        self._password = password
        self._client: paramiko.SSHClient | None = None
        self._lock = threading.Lock()
        self._closed = False
        self.connects = 0  # successful connections so far (1 + reconnects)
        self._fallbacks_before = 0  # read-time fallbacks of the connections before this one (`receive_stamps`)
        self._closed_report = (False, 0, "never connected")  # the last connection's, once closed
        self._hops: list[paramiko.SSHClient] = []  # the jump hosts' connections of the live route, in order
        # more connections to the host, for sessions it refused on the first (`_overflow_channel`), with their hops
        self._overflow: list[tuple[paramiko.SSHClient, list[paramiko.SSHClient]]] = []
        self._overflow_lock = threading.Lock()
        self.overflow_connects = 0

    # ------------------------------------------------------------------ connection
    @property
    def _where(self) -> str:
        r = self.resource
        via = f" via {','.join(map(str, r.proxy_jump))}" if r.proxy_jump else (
            " via its proxy command" if r.proxy_command else "")
        return f"{r.name} ({r.user}@{r.address}:{r.port}{via})"

    def _scrub(self, text: str) -> str:
        for secret in (self._password, self.resource.passphrase):
            if secret:
                text = text.replace(secret, "***")
        return text

    def _connect_once(self) -> tuple[paramiko.SSHClient, list[paramiko.SSHClient]]:
        """One connection along the host's route, and the jump hosts' connections it goes through: each
        `proxy_jump` hop logged into in turn (strict host keys on every hop), the next one reached through a
        direct-tcpip channel of the one before; or the `proxy_command`'s pipes; else a TCP socket."""
        r = self.resource
        since = ClockPair.now()  # the replies' kernel stamps are trusted from here (HubSocket)
        hops: list[paramiko.SSHClient] = []
        try:
            if not r.proxy_jump:
                sock = (_CommandSocket(r.proxy_command, shared_hub()) if r.proxy_command
                        else self._tcp(r.address, r.port))
            for i, hop in enumerate(r.proxy_jump):
                passphrase = r.passphrase if hop.identity_file == r.identity_file else None  # the host's key
                # the first hop, from its TCP connect to its login, is what the jump host's MaxStartups counts
                with _jump_login_slot(hop) if i == 0 else contextlib.nullcontext():
                    if i == 0:
                        sock = self._tcp(hop.address, hop.port)
                    client = self._login(sock, hop.address, hop.port, hop.user, hop.identity_file, hop.known_hosts,
                                         passphrase, since, f"{self._where}: jump host {hop}")
                hops.append(client)
                nxt = r.proxy_jump[i + 1] if i + 1 < len(r.proxy_jump) else r
                sock = _ChannelSocket.open(client.get_transport(), nxt.address, nxt.port, self.connect_timeout,
                                           f"{self._where}: jump host {hop}")
            client = self._login(sock, r.address, r.port, r.user, r.identity_file, r.known_hosts, r.passphrase,
                                 since, self._where)
        except BaseException:
            _close_route(None, hops)
            raise
        return client, hops

    def _tcp(self, address: str, port: int) -> socket.socket:
        sock = socket.create_connection((address, port), timeout=self.connect_timeout)
        try:
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        except OSError:
            sock.close()
            raise
        return sock

    def _login(self, sock, address: str, port: int, user: str, identity_file: str | None, known_hosts: str | None,
               passphrase: str | None, since: ClockPair, where: str) -> paramiko.SSHClient:
        """SSH over `sock` (a socket, a hop's channel, a proxy command) to `address:port` as `user`: the key
        pinned by `identity_file` first, then the agent's keys; host key against `known_hosts`."""
        client = None
        try:
            client = paramiko.SSHClient()
            self._host_keys(client, known_hosts, where)
            pkey = _private_key(identity_file, passphrase, where) if identity_file else None
            client.connect(address, port=port, username=user, password=self._password, pkey=pkey,
                           sock=sock, timeout=self.connect_timeout,
                           banner_timeout=self.connect_timeout, auth_timeout=self.connect_timeout,
                           channel_timeout=self.connect_timeout,
                           look_for_keys=pkey is None and self._password is None,
                           allow_agent=self._password is None,
                           transport_factory=functools.partial(HubTransport, stamps_since=since))
        except BaseException as exc:
            transport = client.get_transport() if client is not None else None
            if transport is not None:  # its socket is closed on the hub that watches it
                transport.close()
                transport.sock.close()  # also when the transport never started (close() then does nothing)
            else:
                sock.close()
            if isinstance(exc, paramiko.BadHostKeyException):
                raise HostKeyError(f"{where}: host key does not match known_hosts "
                                   f"({known_hosts or '~/.ssh/known_hosts'}): refused") from None
            if isinstance(exc, paramiko.AuthenticationException):
                raise AuthenticationFailed(f"{where}: authentication failed") from None
            if isinstance(exc, paramiko.SSHException) and "No authentication methods" in str(exc):
                raise AuthenticationFailed(f"{where}: no key to offer (no identity_file, ssh_config IdentityFile, "
                                           "ssh-agent key or ~/.ssh/id_*)") from None
            if isinstance(exc, paramiko.SSHException) and "not found in known_hosts" in str(exc):
                raise HostKeyError(f"{where}: host key not in known_hosts "
                                   f"({known_hosts or '~/.ssh/known_hosts'}): refused") from None
            raise
        transport = client.get_transport()
        assert transport is not None
        transport.set_keepalive(max(1, int(self.keepalive_s)))
        return client

    def _host_keys(self, client: paramiko.SSHClient, known_hosts: str | None, where: str) -> None:
        """Strict: `known_hosts` (else the user's) and RejectPolicy. Emulated bench: a known key must still
        match, an unknown one is accepted and written to this process's own known_hosts, never to `known_hosts`."""
        strict = self.resource.strict_host_key
        path = os.path.expanduser(known_hosts) if known_hosts else None
        if path and os.path.exists(path):
            if strict:
                client.load_host_keys(path)
            else:
                client.get_host_keys().load(path)  # read only: paramiko would save learned keys into it
        elif path and strict:
            raise HostKeyError(f"{where}: known_hosts file {known_hosts} does not exist")
        elif strict:
            client.load_system_host_keys()
        client.set_missing_host_key_policy(paramiko.RejectPolicy() if strict else _LearnPolicy())

    def _transport(self) -> paramiko.Transport:
        """The live transport, (re)connecting with bounded retries and backoff."""
        with self._lock:
            if self._closed:
                raise TransportClosed(f"{self._where}: transport was closed")
            client = self._client
            if client is not None:
                transport = client.get_transport()
                if transport is not None and transport.is_active():
                    return transport
                self._fallbacks_before += self._stamp_report()[1]
                client.close()
                self._close_hops()
                self._client = None
            last = ""
            for attempt in range(self.retries + 1):
                if attempt:
                    time.sleep(self.backoff_s * 2 ** (attempt - 1))
                try:
                    self._client, self._hops = self._connect_once()
                    self.connects += 1
                    transport = self._client.get_transport()
                    assert transport is not None
                    return transport
                except paramiko.SSHException as exc:
                    last = self._scrub(str(exc))
                except (OSError, EOFError) as exc:
                    last = self._scrub(f"{type(exc).__name__}: {exc}")
            raise TransportClosed(f"{self._where}: cannot connect after {self.retries + 1} attempts ({last})")

    def connect(self) -> None:
        """Open the connection now instead of at the first command."""
        self._transport()

    def _stamp_report(self) -> tuple[bool, int, str]:
        transport = self._client.get_transport() if self._client is not None else None
        report = getattr(getattr(transport, "sock", None), "stamp_report", None)
        return report() if report is not None else (False, 0, "never connected")

    def receive_stamps(self) -> dict:
        """How this host's replies were dated (a clock probe's reply: by its kernel receive stamp, or by its read,
        which counts the hub's backlog in the probe's delay): `stamp` "kernel" or "read" (the connection now),
        `fallbacks` — reads dated by their read instead, every connection of the run — and the last `reason`."""
        with self._lock:
            kernel, fallbacks, reason = self._stamp_report() if self._client is not None else self._closed_report
            return {"stamp": "kernel" if kernel else "read", "fallbacks": self._fallbacks_before + fallbacks,
                    "reason": reason}

    def _open_channel(self, deadline: Deadline) -> paramiko.Channel:
        for attempt in range(2):
            transport = self._transport()
            try:
                return self._open_session(transport, deadline)
            except (paramiko.SSHException, OSError, EOFError) as exc:
                if _no_more_sessions(exc) and transport.is_active():
                    return self._overflow_channel(deadline)
                # nothing ran yet, so one reconnect-and-retry is safe
                if attempt or transport.is_active():
                    raise TransportClosed(f"{self._where}: cannot open a channel: {self._scrub(str(exc))}") from None
        raise AssertionError("unreachable")

    def _open_session(self, transport: paramiko.Transport, deadline: Deadline) -> paramiko.Channel:
        timeout = deadline.remaining()
        return transport.open_session(timeout=self.connect_timeout if timeout is None
                                      else min(timeout, self.connect_timeout))

    def _overflow_channel(self, deadline: Deadline) -> paramiko.Channel:
        """A session on another connection to the host: its sshd refused one more on this connection (OpenSSH's
        MaxSessions, 10 by default, counts every stream and command open at once; 8 ranks of a traffic phase on a
        host of 8 NICs beside the harness's streams pass it). Opened as the first, on the same route, and kept
        for the next refusal; at most OVERFLOW_CONNECTIONS of them."""
        with self._overflow_lock:
            live = []
            for client, hops in self._overflow:
                transport = client.get_transport()
                if transport is not None and transport.is_active():
                    live.append((client, hops))
                else:
                    _close_route(client, hops)
            self._overflow = live
            last = None
            for client, _ in live:
                try:
                    return self._open_session(client.get_transport(), deadline)
                except (paramiko.SSHException, OSError, EOFError) as exc:
                    last = exc
            if len(live) >= OVERFLOW_CONNECTIONS:
                raise TransportClosed(f"{self._where}: cannot open a channel: the host refused another session on "
                                      f"each of {1 + len(live)} connections ({self._scrub(str(last))}; OpenSSH's "
                                      f"MaxSessions, 10 by default, counts every stream and command open at once)")
            with self._lock:
                if self._closed:
                    raise TransportClosed(f"{self._where}: transport was closed")
            try:
                client, hops = self._connect_once()
            except (paramiko.SSHException, OSError, EOFError) as exc:
                raise TransportClosed(f"{self._where}: the host refused another session on this connection, and "
                                      f"another connection failed: {self._scrub(str(exc))}") from None
            with self._lock:
                if self._closed:  # closed while this one connected: not kept, no channel on it
                    _close_route(client, hops)
                    raise TransportClosed(f"{self._where}: transport was closed")
            self._overflow.append((client, hops))
            self.overflow_connects += 1
            try:
                return self._open_session(client.get_transport(), deadline)
            except (paramiko.SSHException, OSError, EOFError) as exc:
                raise TransportClosed(f"{self._where}: cannot open a channel on another connection: "
                                      f"{self._scrub(str(exc))}") from None

    # ------------------------------------------------------------------ commands
    def run(self, command: str, *, deadline: Deadline | None = None, stdin: str | bytes | None = None,
            check: bool = False) -> CommandResult:
        """Run `command`, feed `stdin` (then EOF), collect stdout/stderr/exit status before `deadline`.
        The wire log (devices.wirelog) gets the command, then its exit status, time and output sizes."""
        name = self.resource.name
        if wirelog.enabled():
            size = len(stdin.encode() if isinstance(stdin, str) else stdin or b"")
            wirelog.note(now_ns(), name, "$", command + (f"  (stdin: {size} bytes)" if size else ""))
        try:
            result = self._run(command, deadline, stdin)
        except DeviceError as exc:
            wirelog.note(now_ns(), name, "=", f"{type(exc).__name__}: {exc}")
            raise
        if wirelog.enabled():
            tail = result.stderr.strip().splitlines()[-1:] if result.exit_status else []
            wirelog.note(result.timing.completed_ns, name, "=",
                         f"exit {result.exit_status} in {result.timing.elapsed_s * 1e3:.3f} ms, stdout "
                         f"{len(result.stdout)} B, stderr {len(result.stderr)} B: {command[:200]}"
                         + (f"  (stderr: {tail[0][:200]})" if tail else ""))
        if check and result.exit_status != 0:
            raise CommandFailed(self._where, result)
        return result

    def _run(self, command: str, deadline: Deadline | None, stdin: str | bytes | None) -> CommandResult:
        deadline = deadline or Deadline(None)
        command = self.resource.as_run(command)  # declared tool paths, `sudo -n` (become)
        channel = self._open_channel(deadline)
        out: list[bytes] = []
        err: list[bytes] = []
        bound = _output_budget(self._where, command)
        try:
            sent = now_ns()
            channel.exec_command(command)
            if stdin:
                channel.sendall(stdin.encode() if isinstance(stdin, str) else stdin)
            channel.shutdown_write()
            while True:
                remaining = deadline.remaining()
                if remaining is not None and remaining <= 0:
                    raise DeviceTimeout(f"{self._where}: {command!r} did not finish before its deadline",
                                        partial=b"".join(out).decode(errors="replace"))
                channel.settimeout(_POLL_S if remaining is None else min(_POLL_S, remaining))
                try:
                    data = channel.recv(_CHUNK)
                except socket.timeout:
                    while channel.recv_stderr_ready():
                        err.append(bound(channel.recv_stderr(_CHUNK)))
                    if channel.closed and not channel.recv_ready():  # output may have come with the close
                        break
                    continue
                if not data:
                    break
                out.append(bound(data))
            channel.settimeout(None)
            while True:  # stdout hit EOF, so stderr is complete too
                data = channel.recv_stderr(_CHUNK)
                if not data:
                    break
                err.append(bound(data))
            remaining = deadline.remaining()
            if not channel.status_event.wait(timeout=self.connect_timeout if remaining is None else remaining):
                raise DeviceTimeout(f"{self._where}: {command!r}: no exit status before its deadline",
                                    partial=b"".join(out).decode(errors="replace"))
            completed = now_ns()
            status = channel.exit_status
        except (OSError, EOFError, paramiko.SSHException) as exc:
            raise TransportClosed(f"{self._where}: connection lost during {command!r}: "
                                  f"{self._scrub(str(exc)) or type(exc).__name__}") from None
        finally:
            channel.close()
        if status == -1 and self._transport_dying(channel):
            raise TransportClosed(f"{self._where}: connection lost during {command!r}")
        return CommandResult(command, status, b"".join(out).decode(errors="replace"),
                             b"".join(err).decode(errors="replace"), CommandTiming(sent, completed))

    @staticmethod
    def _transport_dying(channel: paramiko.Channel, grace_s: float = 0.5) -> bool:
        """A channel closed without exit status: a dropped connection (paramiko closes the channels just
        before it marks the transport inactive, hence the grace) or a command killed by a signal."""
        transport = channel.get_transport()
        end = time.monotonic() + grace_s
        while transport is not None and transport.is_active():
            if time.monotonic() >= end:
                return False
            time.sleep(0.01)
        return True

    def stream(self, command: str) -> "SshLineStream":
        """Start a long-running command; read its stdout line by line, write to its stdin."""
        command = self.resource.as_run(command)  # declared tool paths, `sudo -n` (become)
        channel = self._open_channel(Deadline(None))
        stamp_arrivals(channel)  # each line's recv_ns: when the hub had its bytes, not when we read them
        try:
            channel.exec_command(command)
        except (OSError, EOFError, paramiko.SSHException) as exc:
            channel.close()
            raise TransportClosed(f"{self._where}: cannot start {command!r}: {self._scrub(str(exc))}") from None
        wirelog.note(now_ns(), self.resource.name, "$", f"{command}  (stream)")
        return SshLineStream(channel, command, self._where, self.resource.name)

    def close(self) -> None:
        with self._lock:
            self._closed = True
            if self._client is not None:
                self._closed_report = self._stamp_report()  # what `receive_stamps` says once closed
                self._client.close()
                self._client = None
            self._close_hops()
        with self._overflow_lock:
            overflow, self._overflow = self._overflow, []
        for client, hops in overflow:
            _close_route(client, hops)

    def _close_hops(self) -> None:
        hops, self._hops = self._hops, []
        _close_route(None, hops)

    def __enter__(self) -> "SshTransport":
        return self

    def __exit__(self, *exc) -> None:
        self.close()


# The most one command's output (stdout and stderr together) may hold: the tools the harness runs print
# kilobytes (`ethtool -S` of a big NIC: ~100 KiB); more is a fault of the host, not data to keep.
MAX_OUTPUT_BYTES = 16 * 2**20
MAX_OUTPUT_LINES = 256 * 1024


def _output_budget(where: str, command: str):
    """`bound(data) -> data` for one command's output: OutputTooLong (a DeviceError naming the bound) past
    MAX_OUTPUT_BYTES / MAX_OUTPUT_LINES, so an endless output ends the read, not the harness's memory."""
    budget = ReadBudget(f"{where}: output of {command[:80]!r}", MAX_OUTPUT_BYTES, MAX_OUTPUT_LINES)

    def bound(data: bytes) -> bytes:
        budget.take(data)
        return data
    return bound


# The longest line a stream keeps: the agent's lines are < 200 bytes. A longer one is handed over in pieces
# one byte past this bound, never buffered whole, so a peer that never sends a line end cannot grow the buffer;
# the reader sees a line longer than this (harness.bench.readers ends such a stream, naming the bound).
MAX_STREAM_LINE_BYTES = 64 * 1024


def _overlong(partial: bytes) -> tuple[list[bytes], bytes]:
    """A partial line (no line end yet) -> (pieces past MAX_STREAM_LINE_BYTES to hand over as lines, the rest)."""
    pieces = []
    while len(partial) > MAX_STREAM_LINE_BYTES:
        pieces.append(partial[:MAX_STREAM_LINE_BYTES + 1])
        partial = partial[MAX_STREAM_LINE_BYTES + 1:]
    return pieces, partial


class SshLineStream(LineStream):
    """Stdout lines of one remote command, each with the harness time its last byte arrived (read: the kernel's
    receive stamp of the packet's read, else the hub's feed of it; pushed (`deliver`): the feed; see
    `ArrivalStampedPipe`)."""

    def __init__(self, channel: paramiko.Channel, command: str, where: str, name: str = ""):
        self._name = name  # the host's, for the wire log
        self._channel = channel
        self._pipe = channel.in_buffer
        self.command = command
        self._where = where
        self._buffer = b""
        self._recv_ns = 0
        self.sent_ns = 0
        self._eof = False
        self._stderr: list[bytes] = []
        self._on_lines = self._on_end = self._hub = None  # set by `deliver`
        self._unacked = 0

    def readline(self, deadline: Deadline) -> tuple[int, str] | None:
        """Next (recv_ns, line without newline), None when `deadline` passes; TransportClosed at EOF."""
        while True:
            cut = self._buffer.find(b"\n")
            if cut >= 0:
                line, self._buffer = self._buffer[:cut], self._buffer[cut + 1:]
                return self._recv_ns, line.decode(errors="replace")
            if len(self._buffer) > MAX_STREAM_LINE_BYTES:
                (line, *_), _ = _overlong(self._buffer)
                self._buffer = self._buffer[len(line):]
                return self._recv_ns, line.decode(errors="replace")
            if self._eof:
                if self._buffer:  # a last line without newline
                    line, self._buffer = self._buffer, b""
                    return self._recv_ns, line.decode(errors="replace")
                raise TransportClosed(f"{self._where}: {self.command!r} ended (exit {self.exit_status})")
            remaining = deadline.remaining()
            if remaining is not None and remaining <= 0:
                return None
            self._channel.settimeout(_POLL_S if remaining is None else min(_POLL_S, remaining))
            try:
                data = self._channel.recv(_CHUNK)
            except socket.timeout:
                self._drain_stderr()
                continue
            except (OSError, EOFError) as exc:
                raise TransportClosed(f"{self._where}: {self.command!r}: {exc}") from None
            if not data:
                self._eof = True
                self._drain_stderr()
            else:
                self._recv_ns = self._arrival_ns()
                self._buffer += data

    def _arrival_ns(self) -> int:
        # the kernel's bound where there is one (a clock probe's reply time: the hub's backlog is not the wire's)
        return getattr(self._pipe, "last_arrival_ns", 0) or now_ns()  # an unstamped channel: when read

    def fileno(self) -> int:
        """Readable while the channel holds data or has ended (paramiko's pipe): for a selector."""
        return self._channel.fileno()

    def read_available(self) -> tuple[list[tuple[int, str]], bool]:
        """Without blocking: the complete lines received so far (each with the harness time its last byte
        arrived) and whether the command's output has ended (then the last partial line is included)."""
        channel = self._channel
        try:
            while channel.recv_ready():
                data = channel.recv(_CHUNK)
                if not data:
                    break
                self._recv_ns = self._arrival_ns()
                self._buffer += data
        except (OSError, EOFError) as exc:
            raise TransportClosed(f"{self._where}: {self.command!r}: {exc}") from None
        if not channel.recv_ready() and (channel.eof_received or channel.closed):
            self._eof = True
            self._drain_stderr()
        *complete, self._buffer = self._buffer.split(b"\n")
        pieces, self._buffer = _overlong(self._buffer)
        complete += pieces
        lines = [(self._recv_ns, line.decode(errors="replace")) for line in complete]
        if self._eof and self._buffer:
            lines.append((self._recv_ns, self._buffer.decode(errors="replace")))
            self._buffer = b""
        return lines, self._eof

    def deliver(self, on_lines, on_end) -> bool:
        """Push the lines as they arrive: `on_lines(recv_ns, lines)` with the complete lines of each packet, on
        the SSH hub's thread as its loop takes the packet off the socket (no reader thread woken, no pipe
        written per packet); when the output ends, its last partial line, then `on_end()`, once. False: this
        channel is not on a hub (read it with `read_available`). `deliver(None, None)`: nothing more."""
        hub = getattr(self._channel.get_transport(), "_hub", None)
        if hub is None or not isinstance(self._pipe, ArrivalStampedPipe):
            return False
        if on_lines is None:
            self._on_lines = self._on_end = None
            self._pipe.push_to(None, None)
            return True
        self._on_lines, self._on_end, self._hub = on_lines, on_end, hub
        self._pipe.push_to(self._pushed, lambda: hub.spawn(self._pushed_end))
        return True

    def caught_up_ns(self) -> int:
        """Pushed from a hub: when its loop last caught up with its sockets (Hub.caught_up_ns); else now."""
        return self._hub.caught_up_ns if self._hub is not None and self._on_lines is not None else now_ns()

    def _pushed(self, data: bytes, arrival_ns: int) -> None:
        """A chunk of output (under the pipe's lock: nothing here may take the channel's)."""
        self._recv_ns = arrival_ns
        self._buffer += data
        if b"\n" in data:
            complete, _, self._buffer = self._buffer.rpartition(b"\n")
            self._on_lines(arrival_ns, complete.decode(errors="replace").split("\n"))  # one decode a packet
        if len(self._buffer) > MAX_STREAM_LINE_BYTES:
            pieces, self._buffer = _overlong(self._buffer)
            self._on_lines(arrival_ns, [piece.decode(errors="replace") for piece in pieces])
        self._unacked += len(data)
        if self._unacked >= min(_ACK_BYTES, self._channel.in_window_size // 4):
            consumed, self._unacked = self._unacked, 0
            self._hub.spawn(lambda: self._give_window(consumed))

    def _give_window(self, consumed: int) -> None:
        """What `Channel.recv` does after a read: the peer may send `consumed` bytes more (a hub greenlet)."""
        ack = self._channel._check_add_window(consumed)
        if ack > 0:
            m = paramiko.Message()
            m.add_byte(cMSG_CHANNEL_WINDOW_ADJUST)
            m.add_int(self._channel.remote_chanid)
            m.add_int(ack)
            self._channel.transport._send_user_message(m)

    def _pushed_end(self) -> None:
        on_lines, on_end = self._on_lines, self._on_end
        if on_end is None:
            return  # delivery was stopped meanwhile
        self._eof = True
        self._drain_stderr()
        if self._buffer:
            last, self._buffer = self._buffer, b""
            on_lines(self._recv_ns, [last.decode(errors="replace")])
        on_end()

    def __iter__(self) -> Iterator[tuple[int, str]]:
        """Lines until the command ends."""
        forever = Deadline(None)
        while True:
            try:
                item = self.readline(forever)
            except TransportClosed:
                return
            if item is not None:
                yield item

    def write(self, data: str) -> None:
        """Send `data` to the command's stdin; `sent_ns` is then when its first byte went to the socket."""
        payload = data.encode()
        try:
            self.sent_ns = first_send_ns(lambda: self._channel.sendall(payload))
        except (OSError, EOFError) as exc:
            raise TransportClosed(f"{self._where}: {self.command!r}: cannot write: {exc}") from None

    def close_stdin(self) -> None:
        """Send EOF on the command's stdin (e.g. to end `probe-send`)."""
        self._channel.shutdown_write()

    def _drain_stderr(self) -> None:
        while self._channel.recv_stderr_ready():
            self._stderr.append(self._channel.recv_stderr(_CHUNK))
            while sum(map(len, self._stderr)) > MAX_STREAM_LINE_BYTES and len(self._stderr) > 1:
                del self._stderr[0]  # a stream's stderr explains its end: its last bytes are kept

    @property
    def stderr(self) -> str:
        self._drain_stderr()
        return b"".join(self._stderr).decode(errors="replace")

    @property
    def exit_status(self) -> int | None:
        return self._channel.exit_status if self._channel.exit_status_ready() else None

    def close(self) -> None:
        if wirelog.enabled():
            status = self.exit_status
            wirelog.note(now_ns(), self._name, "=", ("stream closed, still running" if status is None else
                                                     f"stream ended, exit {status}") + f": {self.command[:200]}")
        self._channel.close()

    def __enter__(self) -> "SshLineStream":
        return self

    def __exit__(self, *exc) -> None:
        self.close()


# ====================================================================== the route: ssh_config, jumps, proxy command
def ssh_config_for(alias: str, path: str) -> dict:
    """OpenSSH's settings for `alias` in the ssh_config file `path` (paramiko.SSHConfig: Host and Match blocks,
    first value wins, %-tokens expanded): keys lowercased (hostname, port, user, identityfile, proxyjump,
    proxycommand, userknownhostsfile). OSError when it cannot be read; paramiko's ConfigParseError when malformed."""
    config = paramiko.SSHConfig.from_path(os.path.expanduser(path))
    return config.lookup(alias)


def parse_jump(spec: str, *, config: str | None, user: str, identity_file: str | None,
               known_hosts: str | None) -> JumpHost:
    """One ProxyJump hop: `[user@]host[:port]` or `ssh://[user@]host[:port]`, `host` also an ssh_config alias
    (its HostName, Port, User, IdentityFile, UserKnownHostsFile). Explicit parts win over ssh_config, ssh_config
    over the target host's `user`, `identity_file` and `known_hosts`. ValueError when malformed."""
    text = spec.strip()
    if text.startswith("ssh://"):
        text = text[len("ssh://"):]
    hop_user, _, rest = text.rpartition("@")
    port = None
    if rest.startswith("["):  # [v6]:port
        host, _, tail = rest[1:].partition("]")
        if tail.startswith(":"):
            port = tail[1:]
    else:
        host, sep, tail = rest.partition(":")
        port = tail if sep else None
    if not host or (port is not None and not port.isdigit()) or any(c.isspace() for c in text):
        raise ValueError(f"expected [user@]host[:port], found {spec!r}")
    found = ssh_config_for(host, config) if config else {}
    files = found.get("identityfile") or []
    return JumpHost(address=found.get("hostname", host), port=int(port or found.get("port", 22)),
                    user=hop_user or found.get("user") or user,
                    identity_file=files[0] if files else identity_file,
                    known_hosts=(found.get("userknownhostsfile") or "").split(" ")[0] or known_hosts)


def _private_key(path: str, passphrase: str | None, where: str) -> paramiko.PKey:
    """The pinned key, decrypted with the passphrase from the environment (`passphrase_env`): a clear error for
    a missing file, an encrypted key without a passphrase, or a wrong one. Never says the passphrase."""
    full = os.path.expanduser(path)
    try:
        return paramiko.PKey.from_path(full, password=passphrase.encode() if passphrase else None)
    except FileNotFoundError:
        raise AuthenticationFailed(f"{where}: identity file {path} does not exist") from None
    except (paramiko.SSHException, ValueError, TypeError) as exc:
        # PEM keys raise PasswordRequiredException, OpenSSH-format ones a plain SSHException saying so
        if not passphrase and (isinstance(exc, paramiko.PasswordRequiredException)
                               or "password-protected" in str(exc) or "encrypted" in str(exc)):
            raise AuthenticationFailed(f"{where}: identity file {path} is encrypted: name the environment variable "
                                       "holding its passphrase with passphrase_env") from None
        hint = " (wrong passphrase?)" if passphrase else ""
        text = str(exc).replace(passphrase, "***") if passphrase else str(exc)
        raise AuthenticationFailed(f"{where}: cannot read identity file {path}{hint}: {text[:200]}") from None


_learned: dict[str, str] = {}


def learned_known_hosts() -> str:
    """This process's own known_hosts (a run's): where an emulated bench's unknown host keys are written, never
    into the inventory's file. Removed at exit."""
    if "path" not in _learned:
        folder = tempfile.mkdtemp(prefix="ocs-hil-known-hosts-")
        atexit.register(shutil.rmtree, folder, True)
        _learned["path"] = os.path.join(folder, "known_hosts")
    return _learned["path"]


class _LearnPolicy(paramiko.MissingHostKeyPolicy):
    """Emulated bench: accept an unknown host key and append it to `learned_known_hosts()`."""

    _lock = threading.Lock()

    def missing_host_key(self, client, hostname, key) -> None:
        client.get_host_keys().add(hostname, key.get_name(), key)
        with self._lock, open(learned_known_hosts(), "a") as f:
            f.write(f"{hostname} {key.get_name()} {key.get_base64()}\n")


class _RouteSocket(HubSocket):
    """paramiko's socket for a connection that is not a TCP socket of its own (a hop's channel, a proxy
    command's pipes), on the hub as a `HubSocket` is: a read or write that would block waits on the hub in a
    hub greenlet (the hop's own loop runs there too: blocking would stop it), in the calling thread otherwise."""

    def __init__(self, hub, read_fd: int):
        self.hub = hub
        self._fd = read_fd
        self._timeout = None
        self._closed = False
        self.handed = self.sent = 0
        self.wire = None  # `record_wire` accounts TCP sockets only

    def _readable(self) -> bool:
        if self.hub.in_greenlet():
            return self.hub.wait(self._fd, selectors.EVENT_READ, self._timeout)
        return _poll(self._fd, self._timeout)

    def _pause(self, give_up: float | None) -> None:
        if give_up is not None and time.monotonic() >= give_up:
            raise socket.timeout("timed out")
        if self.hub.in_greenlet():
            self.hub.sleep(0.001)
        else:
            time.sleep(0.001)

    def _close_on_hub(self, close) -> None:
        """Close on the hub thread, its selector forgetting the read descriptor first: a descriptor closed while
        still registered, its number taken by a new socket, would leave that socket unwatched."""
        fd = self._fd

        class Closing:
            def fileno(self) -> int:
                return fd

            def close(self) -> None:
                close()

        self.hub.close_socket(Closing())

    def getpeername(self):
        return ("", 0)

    def getsockname(self):
        return ("", 0)

    def setsockopt(self, *args) -> None:
        pass


def _poll(fd: int, timeout: float | None) -> bool:
    import select

    poller = select.poll()
    poller.register(fd, select.POLLIN)
    return bool(poller.poll(None if timeout is None else timeout * 1000))


class _ChannelSocket(_RouteSocket):
    """The next hop's connection: a direct-tcpip channel of the hop before (OpenSSH's ProxyJump, `ssh -W`).
    Its timeout stays 0 (the reader is a hub greenlet); a read waits for the channel's pipe to be readable. A
    read's arrival bound is the hop's socket's last kernel stamp: the bytes came in over that socket, no later."""

    def __init__(self, channel: paramiko.Channel, hub, under):
        channel.settimeout(0.0)
        super().__init__(hub, channel.fileno())
        self._channel, self._under = channel, under

    @classmethod
    def open(cls, transport: paramiko.Transport, address: str, port: int, timeout: float,
             where: str) -> "_ChannelSocket":
        try:
            channel = transport.open_channel("direct-tcpip", (address, port), ("127.0.0.1", 0), timeout=timeout)
        except (paramiko.SSHException, OSError, EOFError) as exc:
            raise TransportClosed(f"{where}: cannot forward to {address}:{port} "
                                  f"(AllowTcpForwarding on the jump host?): {exc}") from None
        return cls(channel, transport._hub, transport.sock)

    @property
    def arrived_ns(self) -> int:
        return getattr(self._under, "arrived_ns", 0)

    def stamp_report(self) -> tuple[bool, int, str]:
        report = getattr(self._under, "stamp_report", None)
        return report() if report is not None else (False, 0, "the jump host's socket gives no receive stamps")

    def fileno(self) -> int:
        return -1 if self._closed else self._fd

    def recv(self, n: int) -> bytes:
        channel = self._channel
        while True:
            if self._closed:
                raise OSError(errno.EBADF, "socket closed")
            try:
                data = channel.recv(n)  # never blocks: timeout 0
            except socket.timeout:
                if not self._readable():
                    raise socket.timeout("timed out") from None
                continue
            self.handed += len(data)
            return data

    def send(self, data) -> int:
        give_up = None if self._timeout is None else time.monotonic() + self._timeout
        while True:
            if self._closed or self._channel.closed:
                raise OSError(errno.EPIPE, "the jump host's channel is closed")
            try:
                return self._channel.send(data)  # never blocks: timeout 0 (a full window raises)
            except socket.timeout:
                self._pause(give_up)

    def close(self) -> None:
        if not self._closed:
            self._closed = True
            self._close_on_hub(self._channel.close)


class _CommandSocket(_RouteSocket):
    """A `proxy_command` (OpenSSH's ProxyCommand, started by paramiko.ProxyCommand): its stdout read and its
    stdin written without blocking. Pipes give no kernel receive stamps: replies are dated by their read."""

    def __init__(self, command: str, hub):
        self._proxy = paramiko.ProxyCommand(command)
        self._out = self._proxy.process.stdout.fileno()
        self._in = self._proxy.process.stdin.fileno()
        os.set_blocking(self._out, False)
        os.set_blocking(self._in, False)
        super().__init__(hub, self._out)
        self.arrived_ns = 0

    def stamp_report(self) -> tuple[bool, int, str]:
        return False, 0, "a proxy command's pipe gives no kernel receive stamps"

    def fileno(self) -> int:
        return -1 if self._closed else self._out

    def recv(self, n: int) -> bytes:
        while True:
            if self._closed:
                raise OSError(errno.EBADF, "socket closed")
            try:
                data = os.read(self._out, n)
            except BlockingIOError:
                if not self._readable():
                    raise socket.timeout("timed out") from None
                continue
            self.handed += len(data)
            return data

    def send(self, data) -> int:
        give_up = None if self._timeout is None else time.monotonic() + self._timeout
        while True:
            if self._closed:
                raise OSError(errno.EBADF, "socket closed")
            try:
                return os.write(self._in, data)
            except BlockingIOError:
                self._pause(give_up)

    def close(self) -> None:
        if not self._closed:
            self._closed = True
            self._close_on_hub(self._end)

    def _end(self) -> None:
        process = self._proxy.process
        process.kill()
        for f in (process.stdin, process.stdout, process.stderr):
            try:
                f.close()
            except OSError:
                pass
        process.wait()
