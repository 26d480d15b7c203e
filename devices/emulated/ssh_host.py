"""An emulated lab host: a real SSH server (paramiko) on 127.0.0.1 answering what the drivers run.

Commands are answered from the `OpticalBench` in the real tools' formats (devices/emulated/formats.py):
`cat` of sysfs files, `ip [-ts] [-o] monitor link` (streaming), `ip -o link`, `rdma [-j] link`, `ethtool`,
`ethtool -m`, `mlxlink -d`, `nvidia-smi --query-gpu=…` and its default table, `ibstat`, `ibstatus`, `ibv_devinfo`,
`ibdev2netdev`, `uname`, `ls` (of the RDMA/net sysfs classes), `date +%s.%N`, `chronyc tracking`, the benchmark
tools `alltoall_perf` (nccl-tests) and `ib_write_bw` (perftest) with transfer times derived from the current
circuits (see the benchmark tools section), plus the host agent protocol of ARCHITECTURE.md (upload with
`mkdir -p … && cat > PATH`, `python3 -u PATH SUBCOMMAND`).
Every timestamp a host prints comes from `bench.host_clock_ns` / `bench.host_time` (offset + drift).

Command handlers form a registry (`server.commands`, name -> handler(ctx, argv) -> exit status);
`extra_commands` adds or overrides entries, and the key "*" catches names nobody else handles.

Channel lifecycle (shared spec feasibility.md §1): a handler ends by sending exit status + EOF and lets
the client close; closing from the handler can overtake paramiko's exec reply and fail the command.
A reaper closes channels the client leaves open (e.g. a stock `ssh` whose stdin stays open).
"""
from __future__ import annotations

import fnmatch
import functools
import hashlib
import heapq
import itertools
import logging
import os
import posixpath
import queue
import random
import selectors
import shlex
import socket
import stat
import tempfile
import threading
import time
from dataclasses import replace
from pathlib import Path
from typing import Callable, Iterator, NamedTuple

import paramiko
from paramiko.buffered_pipe import BufferedPipe
from paramiko.common import cMSG_CHANNEL_WINDOW_ADJUST
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

from devices.emulated import coreutils, dataplane, formats
from devices.emulated.physics import NicChange
from devices.resources import HostResource
from devices.sshhub import HubSocket, HubTransport, stamp_arrivals
from devices.timing import now_ns

log = logging.getLogger(__name__)

Handler = Callable[["ExecContext", list[str]], int]

_CLOSE_AFTER_S = 0.25  # then the reaper closes a finished channel the client left open (stock ssh waits for it)
_POLL_S = 0.1  # how often blocked streaming handlers check whether the client went away
PYTHON_NAMES = ("python3", "python")  # how the harness launches the agent (HostResource.python)
WATCH_ETHTOOL_DEFAULT_US = 100_000  # the agent's default --ethtool-interval-us
AGENT_FIELDS = ("rx_los", "rx_lol", "carrier", "operstate", "phys_state", "state")
_ETHTOOL_FIELDS = ("rx_los", "rx_lol")
# Read from `ethtool -m` as well, on its grid, but a state, not a latched flag: a CMIS module's "Module State" (the
# data-path state no `ethtool -m` prints, so the agent cannot watch it: it stays in the ground truth only).
_ETHTOOL_STATES = ("module_state",)
EPS_GBPS_DEFAULT = 100.0  # packet-fabric bandwidth per NIC when a pair has no circuit
TRANSFER_LATENCY_US_DEFAULT = 10.0  # fixed start-up cost of one emulated transfer (launch, handshake)
_BYTES_PER_GBIT = 1.25e8
_COUNTER_BATCH_S = 0.005  # the emulated counter sampler prints its ticks in batches this far apart (cheap)
_TRANSFER_WAKE_NS = 20_000_000  # an emulated tool re-reads the fabric at least this often while it waits


class ChannelGone(Exception):
    """The client closed the channel (or the connection dropped) while a handler was writing."""


class ExecContext:
    """What a command handler sees: the host, the bench, the exec'd command line and the channel I/O."""

    def __init__(self, server: "EmulatedHostServer", channel: paramiko.Channel, command: str):
        self.server = server
        self.bench = server.bench
        self.host = server.host_name
        self.channel = channel
        self.command = command
        self._redirect: list[bytes] | None = None
        self._stdin_buffer = b""
        self._stdin_fixed = False  # stdin is `_stdin_buffer` alone (a pipe's left side, or /dev/null), not the channel
        self.tty = False  # the session has a pty: its line discipline turns \n into \r\n and merges stderr
        self.bash = False  # run by the interactive login shell (bash), not by `sh -c` (dash)
        self.cwd = server.home  # the shell's working directory (`cd`); a session starts in the home directory

    def with_stdin(self, data: bytes | None) -> "ExecContext":
        """A subshell of this context (a pipe's stage: its `cd` stays its own) reading `data` as its whole
        stdin, or, for None, this context's stdin."""
        stage = ExecContext(self.server, self.channel, self.command)
        stage.tty, stage.bash, stage.cwd, stage._redirect = self.tty, self.bash, self.cwd, self._redirect
        stage._stdin_buffer, stage._stdin_fixed = (self._stdin_buffer, self._stdin_fixed) if data is None \
            else (data, True)
        return stage

    # ---- output
    def out(self, text: str | bytes) -> None:
        data = text.encode() if isinstance(text, str) else text
        if self._redirect is not None:
            self._redirect.append(data)
            return
        if self.tty:
            data = data.replace(b"\n", b"\r\n")
        if self.server.reply_delay_s > 0:  # fault injection: a slow (loaded) host
            time.sleep(self.server.reply_delay_s)
        try:
            self.channel.sendall(data)
        except (OSError, EOFError) as exc:
            raise ChannelGone() from exc

    def err(self, text: str | bytes) -> None:
        data = text.encode() if isinstance(text, str) else text
        try:
            if self.tty:
                self.channel.sendall(data.replace(b"\n", b"\r\n"))
                return
            self.channel.sendall_stderr(data)
        except (OSError, EOFError) as exc:
            raise ChannelGone() from exc

    # ---- input
    def read_stdin(self) -> bytes:
        """All of stdin, up to EOF (or the client closing)."""
        chunks = [self._stdin_buffer]
        self._stdin_buffer = b""
        while not self._stdin_fixed:
            data = self.channel.recv(65536)
            if not data:
                return b"".join(chunks)
            chunks.append(data)
        return b"".join(chunks)

    def stdin_lines(self) -> Iterator[bytes]:
        """Stdin line by line (without newline) until EOF."""
        while True:
            cut = self._stdin_buffer.find(b"\n")
            if cut >= 0:
                line, self._stdin_buffer = self._stdin_buffer[:cut], self._stdin_buffer[cut + 1:]
                yield line
                continue
            data = b"" if self._stdin_fixed else self.channel.recv(65536)
            if not data:
                return
            self._stdin_buffer += data

    def gone(self) -> bool:
        """The client closed the channel or the connection dropped."""
        transport = self.channel.get_transport()
        return self.channel.closed or transport is None or not transport.is_active()

    def stdin_closed(self) -> bool:
        """The client sent EOF on stdin (the agent's streaming subcommands stop then)."""
        return bool(self.channel.eof_received)

    def wait_stdin_eof_or_gone(self) -> None:
        """Block until stdin reaches EOF or the client goes away (discarding stdin). No polling: paramiko
        ends a blocked recv on EOF, on the channel's close and when the connection drops (every channel of a
        transport whose loop ends is closed), so a waiting command costs no wake-ups."""
        while self.channel.recv(65536):
            pass

    def sleep(self, seconds: float) -> bool:
        """Sleep, returning early (False) if the client goes away."""
        end = time.monotonic() + seconds
        while (left := end - time.monotonic()) > 0:
            if self.gone():
                return False
            time.sleep(min(left, _POLL_S))
        return True

    def path(self, word: str) -> str:
        """A shell word as an absolute path (`~` is the user's home, a relative path from the working directory)."""
        if word == "~" or word.startswith("~/"):
            word = self.server.home + word[1:]
        if not word.startswith("/"):
            word = posixpath.join(self.cwd, word)
        return posixpath.normpath(word)


class _VirtualFs:
    """Files uploaded to the host (the agent program), kept in memory per host."""

    def __init__(self, home: str):
        self.lock = threading.Lock()
        self.files: dict[str, bytes] = {}
        self.dirs = {"/", "/home", home, "/tmp"}

    def mkdir(self, path: str) -> None:
        with self.lock:
            while path not in self.dirs:
                self.dirs.add(path)
                path = posixpath.dirname(path)


def _generate_ed25519(path: Path) -> paramiko.Ed25519Key:
    """A fresh Ed25519 key in OpenSSH format (mode 600). paramiko has no Ed25519 generate()."""
    pem = Ed25519PrivateKey.generate().private_bytes(serialization.Encoding.PEM,
                                                     serialization.PrivateFormat.OpenSSH,
                                                     serialization.NoEncryption())
    path.write_bytes(pem)
    os.chmod(path, 0o600)
    return paramiko.Ed25519Key(filename=str(path))


def _forget_accepted(channel: paramiko.Channel) -> None:
    """Drop this channel from paramiko's queue of channels awaiting `Transport.accept()` (we never call
    it), or the queue grows by one per command. `accept()` itself would pop *other* channels, whose only
    strong reference that queue is until their exec request arrives: paramiko's __del__ then closes them."""
    transport = channel.get_transport()
    queue_ = getattr(transport, "server_accepts", None)
    if transport is None or queue_ is None:
        return
    with transport.lock:
        try:
            queue_.remove(channel)
        except ValueError:
            pass


def server_transport(sock: socket.socket, host_key: paramiko.PKey, interface: paramiko.ServerInterface,
                     subsystems: dict[str, tuple] | None = None) -> paramiko.Transport | None:
    """An SSH server transport (TCP_NODELAY) on an accepted connection; its loop runs on the process's SSH
    hub (devices.sshhub: one thread for every connection). `subsystems`: name -> (handler class, *args), as
    paramiko's set_subsystem_handler takes them. None if it cannot start."""
    sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    transport = HubTransport(sock)
    transport.add_server_key(host_key)
    for name, (handler, *args) in (subsystems or {}).items():
        transport.set_subsystem_handler(name, handler, *args)
    try:
        transport.start_server(event=threading.Event(), server=interface)
    except (paramiko.SSHException, OSError, EOFError):
        transport.close()
        return None
    return transport


def accept_ssh(listener: socket.socket, host_key: paramiko.PKey, interface: Callable[[], paramiko.ServerInterface],
               running: Callable[[], bool]) -> Iterator[paramiko.Transport]:
    """SSH server transports for each connection whose handshake starts, until `running()` turns false or
    the listener is closed."""
    while running():
        try:
            sock, _ = listener.accept()
        except OSError:
            return
        transport = server_transport(sock, host_key, interface())
        if transport is not None:
            yield transport


class _HostsLoop:
    """What every emulated host of a process shares, so a pod costs no thread per host for them: one thread
    accepting on all hosts' listeners (a selector), one closing the channels clients leave open, and a pool of
    command threads (the connections themselves are on the SSH hub, devices.sshhub).

    A command runs on an idle pool thread, handed over by a queue: the hub that received the exec request
    never waits for a thread to start (a start waits until the new thread gets the GIL, and the hub serves
    every host's connection), and a short command costs one hand-off, not a thread's creation. Only when
    every pool thread is busy does the starter thread add one; threads idle for `_IDLE_S` leave the pool."""

    _IDLE_S = 30.0

    _instance: "_HostsLoop | None" = None
    _instance_lock = threading.Lock()

    @classmethod
    def get(cls) -> "_HostsLoop":
        with cls._instance_lock:
            if cls._instance is None or cls._instance.pid != os.getpid():  # a forked child has no threads
                cls._instance = cls()
            return cls._instance

    def __init__(self):
        self.pid = os.getpid()
        self._selector = selectors.DefaultSelector()
        self._idle = socket.socketpair()  # keeps the selector non-empty: select() blocks, never spins
        self._selector.register(self._idle[0], selectors.EVENT_READ, None)
        self._reap: list[tuple[float, int, paramiko.Channel]] = []
        self._reap_cv = threading.Condition()
        self._reap_seq = itertools.count()
        self._starts: queue.SimpleQueue = queue.SimpleQueue()
        self._commands: queue.SimpleQueue = queue.SimpleQueue()
        self._pool_lock = threading.Lock()
        self._spare = 0  # pool threads waiting for a command and not yet promised one (waiting - queued)
        threading.Thread(target=self._accept_loop, name="ssh-hosts-accept", daemon=True).start()
        threading.Thread(target=self._reap_loop, name="ssh-hosts-reaper", daemon=True).start()
        threading.Thread(target=self._start_loop, name="ssh-hosts-starter", daemon=True).start()

    def listen(self, listener: socket.socket, host: "EmulatedHostServer") -> None:
        listener.setblocking(False)
        self._selector.register(listener, selectors.EVENT_READ, host)

    def unlisten(self, listener: socket.socket) -> None:
        try:
            self._selector.unregister(listener)
        except (KeyError, ValueError):
            pass

    def _accept_loop(self) -> None:
        while True:
            try:
                ready = self._selector.select()
            except OSError:  # a listener closed under us; the next round sees the map without it
                continue
            for key, _ in ready:
                try:
                    sock, _ = key.fileobj.accept()
                except (BlockingIOError, OSError):
                    continue
                sock.setblocking(True)
                key.data._accepted(sock)

    def run_command(self, target: Callable, args: tuple, name: str) -> None:
        """Run `target(*args)` on a pool thread (named `name` while it runs); never waits."""
        with self._pool_lock:
            spare = self._spare > 0
            if spare:
                self._spare -= 1
        self._commands.put((target, args, name))
        if not spare:
            self._starts.put(None)  # one more pool thread, for this command

    def _start_loop(self) -> None:
        while True:
            self._starts.get()
            threading.Thread(target=self._pool_thread, daemon=True, name="ssh-hosts-command").start()

    def _pool_thread(self) -> None:
        me = threading.current_thread()
        while True:
            try:
                target, args, name = self._commands.get(timeout=self._IDLE_S)
            except queue.Empty:
                with self._pool_lock:
                    if self._spare > 0:  # else a command is promised to a waiting thread: maybe this one
                        self._spare -= 1
                        return
                continue
            me.name = name
            try:
                target(*args)
            except BaseException:  # a command's failure must not shrink the pool unnoticed
                log.exception("emulated host command thread")
            me.name = "ssh-hosts-command"
            with self._pool_lock:
                self._spare += 1

    def close_later(self, channel: paramiko.Channel) -> None:
        with self._reap_cv:
            heapq.heappush(self._reap, (time.monotonic() + _CLOSE_AFTER_S, next(self._reap_seq), channel))
            if len(self._reap) == 1:  # the reaper waits for an earlier deadline, or for nothing: wake it only then
                self._reap_cv.notify()

    def _reap_loop(self) -> None:
        while True:
            with self._reap_cv:
                while not self._reap or self._reap[0][0] > time.monotonic():
                    self._reap_cv.wait(None if not self._reap else self._reap[0][0] - time.monotonic())
                now = time.monotonic() + _CLOSE_AFTER_S / 5  # those due soon too: one wake-up per batch of
                due = []  # commands, not per command
                while self._reap and self._reap[0][0] <= now:
                    due.append(heapq.heappop(self._reap)[2])
            for channel in due:
                channel.close()


class _SshServer(paramiko.ServerInterface):
    def __init__(self, host: "EmulatedHostServer"):
        self.host = host
        self.ptys: set[int] = set()  # the channels (ids) that asked for a pty

    def get_allowed_auths(self, username: str) -> str:
        return "publickey"

    def check_auth_publickey(self, username: str, key: paramiko.PKey) -> int:
        if username == self.host.user and key == self.host.client_public_key:
            return paramiko.AUTH_SUCCESSFUL
        return paramiko.AUTH_FAILED

    def check_channel_request(self, kind: str, chanid: int) -> int:
        if kind == "session":
            return paramiko.OPEN_SUCCEEDED
        return paramiko.OPEN_FAILED_ADMINISTRATIVELY_PROHIBITED

    def check_channel_env_request(self, channel, name, value) -> bool:
        return True  # stock OpenSSH sends LANG/LC_*; accept and ignore

    def check_channel_exec_request(self, channel: paramiko.Channel, command: bytes) -> bool:
        text = command.decode(errors="replace")
        # before the client can send stdin: the time responder answers on the hub, others read arrival stamps
        if _runs_agent_timesrv(self.host, text):
            channel.in_buffer = _TimeResponder(channel, self.host.bench, self.host.host_name)
        else:
            stamp_arrivals(channel)
        _HostsLoop.get().run_command(self.host._exec, (channel, text, channel.chanid in self.ptys),
                                     f"ssh-{self.host.host_name}-exec")
        return True

    def check_channel_pty_request(self, channel, term, width, height, pixelwidth, pixelheight, modes) -> bool:
        self.ptys.add(channel.chanid)
        return True

    def check_channel_window_change_request(self, channel, width, height, pixelwidth, pixelheight) -> bool:
        return True

    def check_channel_shell_request(self, channel: paramiko.Channel) -> bool:
        _HostsLoop.get().run_command(self.host._interactive, (channel, channel.chanid in self.ptys),
                                     f"ssh-{self.host.host_name}-shell")
        return True


class EmulatedHostServer:
    """One emulated host on 127.0.0.1:`port`. Key files live in a temp dir this object owns."""

    def __init__(self, bench, host_name: str, *, user: str = "lab",
                 extra_commands: dict[str, Handler] | None = None, gpus: int = 8):
        self.bench = bench
        self.host_name = host_name
        self.user = user
        self.home = f"/home/{user}"
        self.gpus = [formats.EmulatedGpu(i) for i in range(gpus)]
        # the tool versions this host behaves as (a profile's `tools:` pins them)
        self.tools = formats.ToolVersions(**getattr(getattr(bench, "profile", None), "tools", {}) or {})
        self.commands: dict[str, Handler] = dict(DEFAULT_COMMANDS)
        self.commands.update(extra_commands or {})
        self.agent_commands: dict[str, Handler] = dict(AGENT_COMMANDS)
        self.fs = _VirtualFs(self.home)
        self.port = 0
        self._dir: tempfile.TemporaryDirectory | None = None
        self._listener: socket.socket | None = None
        self._transports: list[paramiko.Transport] = []
        self.connections = 0  # SSH connections accepted (key exchange done) since start: ground truth for tests
        self._lock = threading.Lock()
        self._running = False
        self._followed_ns = 0  # since when latched module flags count (follow_bench)
        # netdev -> (schedule ns of its last `ethtool -m`, (LOS, LOL) then)
        self._module_read: dict[str, tuple[int, tuple[bool, bool]]] = {}
        self._module_lock = threading.Lock()
        self._agent_streams: _AgentStreams | None = None
        self.reply_delay_s = 0.0  # fault injection: every output write of a command waits this long
        self.watch_stalled_until_ns = 0  # fault injection (`watch_stall`): the agent's watches print nothing until then
        # privileges: whether `sudo -n` may run commands as root (sudoers NOPASSWD), and what it ran (ground truth)
        self.sudo_allowed = True
        self.sudo_commands: list[str] = []
        # where the host keeps its tools (Debian's layout); an absolute path elsewhere is "not found"
        self.tool_paths: dict[str, tuple[str, ...]] = dict(TOOL_PATHS)
        # Emulated data plane of the benchmark tools (each overridable per command line):
        self.link_gbps: float | None = None  # over a circuit; None: the slower NIC's speed
        self.eps_gbps = EPS_GBPS_DEFAULT  # over the packet fabric, per NIC
        self.transfer_latency_us = TRANSFER_LATENCY_US_DEFAULT
        self.host_key: paramiko.Ed25519Key | None = None
        self.client_public_key: paramiko.PKey | None = None

    # ------------------------------------------------------------------ lifecycle
    @property
    def host_key_path(self) -> Path:
        return self._keydir / "ssh_host_ed25519_key"

    @property
    def client_key_path(self) -> Path:
        return self._keydir / "id_ed25519"

    @property
    def known_hosts_path(self) -> Path:
        return self._keydir / "known_hosts"

    @property
    def _keydir(self) -> Path:
        if self._dir is None:
            raise RuntimeError("EmulatedHostServer not started")
        return Path(self._dir.name)

    def start(self) -> "EmulatedHostServer":
        self._dir = tempfile.TemporaryDirectory(prefix=f"ocs-hil-{self.host_name}-")
        self.host_key = _generate_ed25519(self.host_key_path)
        client_key = _generate_ed25519(self.client_key_path)
        self.client_public_key = paramiko.Ed25519Key(data=client_key.asbytes())
        self.client_key_path.with_suffix(".pub").write_text(
            f"{client_key.get_name()} {client_key.get_base64()} {self.user}@harness\n")
        self._listener = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        self._listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        self._listener.bind(("127.0.0.1", 0))
        self._listener.listen(64)
        self.port = self._listener.getsockname()[1]
        self.known_hosts_path.write_text(
            f"[127.0.0.1]:{self.port} {self.host_key.get_name()} {self.host_key.get_base64()}\n")
        self.follow_bench()
        self._running = True
        _HostsLoop.get().listen(self._listener, self)
        return self

    def follow_bench(self) -> "EmulatedHostServer":
        """From now on the module's latched flags count (`take_latched`): all the command handlers need, without
        a listener (devices/emulated/sshd_hosts.py serves them to its tools)."""
        self._followed_ns = now_ns()
        return self

    def stop(self) -> None:
        self._running = False
        with self._lock:
            streams, self._agent_streams = self._agent_streams, None
        if streams is not None:
            streams.close()
        if self._listener is not None:
            _HostsLoop.get().unlisten(self._listener)
            self._listener.close()
            self._listener = None
        self.drop_connections()
        if self._dir is not None:
            self._dir.cleanup()
            self._dir = None

    def drop_connections(self) -> int:
        """Close every client connection (fault injection: a dropped link). Returns how many."""
        with self._lock:
            transports, self._transports = self._transports, []
        for transport in transports:
            transport.close()
        return len(transports)

    def __enter__(self) -> "EmulatedHostServer":
        return self.start()

    def __exit__(self, *exc) -> None:
        self.stop()

    def resource(self) -> HostResource:
        """How the harness reaches this host. Emulated: host-key checking relaxed, known_hosts still given."""
        return HostResource(name=self.host_name, address="127.0.0.1", port=self.port, user=self.user,
                            identity_file=str(self.client_key_path), known_hosts=str(self.known_hosts_path),
                            strict_host_key=False)

    def inventory_entry(self, ocs: str = "ocs1") -> dict:
        """This host as an inventory `hosts:` entry (ARCHITECTURE.md contract)."""
        r = self.resource()
        return {"address": r.address, "port": r.port, "user": r.user, "identity_file": r.identity_file,
                "known_hosts": r.known_hosts,
                "nics": [{"netdev": p.netdev, "rdma_dev": p.rdma_dev, "rdma_port": p.rdma_port, "ocs": ocs,
                          "tx": p.ocs_tx, "rx": p.ocs_rx} for p in self.bench.nic_ports(self.host_name)]}

    # ------------------------------------------------------------------ connections
    def _accepted(self, sock: socket.socket) -> None:
        if not self._running:
            sock.close()
            return
        transport = server_transport(sock, self.host_key, _SshServer(self),
                                     {"sftp": (_SftpSession, _HostSftp)})
        if transport is not None:
            with self._lock:
                self._transports = [t for t in self._transports if t.is_active()] + [transport]
                self.connections += 1

    def _exec(self, channel: paramiko.Channel, command: str, tty: bool = False) -> None:
        _forget_accepted(channel)
        ctx = ExecContext(self, channel, command)
        ctx.tty = tty
        try:
            status = run_shell(ctx, command)
        except ChannelGone:
            return
        except Exception as exc:  # a handler bug must not leave the client hanging
            log.exception("emulated host %s: %r failed", self.host_name, command)
            try:
                ctx.err(f"emulator: {type(exc).__name__}: {exc}\n")
            except ChannelGone:
                return
            status = 1
        self._end_session(channel, status)

    def _end_session(self, channel: paramiko.Channel, status: int) -> None:
        try:
            channel.send_exit_status(status)
            channel.shutdown_write()
        except (OSError, EOFError):
            return
        _HostsLoop.get().close_later(channel)

    def _interactive(self, channel: paramiko.Channel, tty: bool) -> None:
        """A login shell: a prompt, each line run by run_shell, until `exit` or Ctrl-D on an empty line."""
        _forget_accepted(channel)
        shell = _InteractiveShell(self, channel, tty)
        try:
            status = shell.run()
        except ChannelGone:
            return
        self._end_session(channel, status)

    def agent_streams(self) -> "_AgentStreams":
        """The thread serving this host's agent streams (started with the first stream)."""
        with self._lock:
            if self._agent_streams is None:
                self._agent_streams = _AgentStreams(self)
            return self._agent_streams

    # ------------------------------------------------------------------ state helpers
    def take_latched(self, netdev: str) -> tuple[bool, bool]:
        """The module's latched (LOS, LOL), cleared by this read: set where the flag rose in a change due since the
        port's last read — by due time, not by when the change reached this host (a late delivery must not latch
        into a later read a loss the earlier read already covered)."""
        key = f"{self.host_name}:{netdev}"
        with self._module_lock:
            since, (los, lol) = self._module_read.get(netdev, (self._followed_ns, (True, True)))
            now, changes = self.bench.nic_changes(since)
            latched = [False, False]
            for _, port, state in changes:
                if port == key:
                    latched[0] |= state.rx_los and not los
                    latched[1] |= state.rx_lol and not lol
                    los, lol = state.rx_los, state.rx_lol
            self._module_read[netdev] = (max(now, since), (los, lol))
        return latched[0], latched[1]

    def nic_by_netdev(self, netdev: str):
        return next((m for m in self.bench.nic_ports(self.host_name) if m.netdev == netdev), None)

    def nic_by_rdma(self, dev: str, port: int | None = None):
        return next((m for m in self.bench.nic_ports(self.host_name)
                     if m.rdma_dev == dev and (port is None or m.rdma_port == port)), None)

    def ports_with_state(self) -> list:
        return self.bench.nic_snapshots(self.host_name)


# ====================================================================== a minimal shell


class _ShellSyntax(ValueError):
    """A command line sh would refuse to parse (dash's message)."""


_GLOB = "*?["
_QUOTED_GLOB = dict(zip(_GLOB, "\ue000\ue001\ue002"))  # a quoted glob character, kept literal through shlex


def _mark_quoted_globs(command: str) -> str:
    """`command` with each quoted or escaped `*?[` replaced by a private character, so that after shlex has
    removed the quotes only the unquoted ones expand (`grep 'a*' f`: a pattern; `cat /sys/*/x`: a glob)."""
    out, quote, escaped = [], "", False
    for c in command:
        if escaped:  # the character after a backslash: literal
            escaped = False
            if c in _GLOB and not quote:
                out[-1] = _QUOTED_GLOB[c]  # for the backslash, which shlex would keep before a private character
                continue
            out.append(_QUOTED_GLOB.get(c, c))
            continue
        if c == "\\" and quote != "'":
            escaped = True
        elif c in "'\"" and quote in ("", c):
            quote = "" if quote else c
        elif quote and c in _GLOB:
            c = _QUOTED_GLOB[c]
        out.append(c)
    return "".join(out)


def _unmark(text: str) -> str:
    return text.translate({ord(v): k for k, v in _QUOTED_GLOB.items()})


def _expand_word(ctx: ExecContext, word: str) -> list[str]:
    """Pathname expansion as dash does it: the matching paths of the host's file system and sysfs in C-locale
    order, the word itself when nothing matches (or it has no unquoted glob character)."""
    if not any(c in word for c in _GLOB):
        return [_unmark(word)]
    matches, part = ["/" if word.startswith("/") else ""], ""
    for part in (p for p in word.split("/") if p):
        if not any(c in part for c in _GLOB):
            matches = [posixpath.join(base, _unmark(part)) for base in matches]
            continue
        # quoted glob characters match only themselves; a leading dot is matched only by a dot (no hidden files)
        pattern = "".join({v: f"[{k}]" for k, v in _QUOTED_GLOB.items()}.get(c, c) for c in part)
        matches = [posixpath.join(base, name) for base in matches
                   for name in _ls_names(ctx, ctx.path(base or ".")) or []
                   if not name.startswith(".") and fnmatch.fnmatchcase(name, pattern)]
    if not any(c in part for c in _GLOB):  # listed entries exist; a literal last component may not
        matches = [m for m in matches if _read_file(ctx, m) is not None or _ls_names(ctx, m) is not None]
    return sorted(matches, key=str.encode) or [_unmark(word)]


def _split_commands(command: str) -> list[tuple[str, list[list[str]]]]:
    """`a | b && c ; d` -> [('', [a-words, b-words]), ('&&', [c-words]), (';', [d-words])]. Quoted glob
    characters stay marked in the words (see _mark_quoted_globs); _expand_word expands or restores them."""
    lexer = shlex.shlex(_mark_quoted_globs(command), posix=True, punctuation_chars=";&|<>")
    lexer.whitespace_split = True
    pieces: list[tuple[str, list[list[str]]]] = [("", [[]])]
    for token in lexer:
        if token in ("&&", ";", "||"):
            pieces.append((token, [[]]))
        elif token == "|":
            if not pieces[-1][1][-1]:
                raise _ShellSyntax('"|" unexpected')
            pieces[-1][1].append([])
        else:
            pieces[-1][1][-1].append(token)
    for _, pipeline in pieces:
        if len(pipeline) > 1 and not pipeline[-1]:
            raise _ShellSyntax("end of file unexpected")
    return [(op, pipeline) for op, pipeline in pieces if pipeline[0]]


def run_shell(ctx: ExecContext, command: str, status: int = 0) -> int:
    """Run `command` with `&&`, `||`, `;`, pipes of commands that end, `> FILE` (stdout into the virtual file
    system) and `$?` (`status`: the previous command's, in an interactive shell)."""
    try:
        pieces = _split_commands(command)
    except ValueError as exc:
        ctx.err(f"sh: 1: Syntax error: {exc}\n")
        return 2
    for op, pipeline in pieces:
        if (op == "&&" and status != 0) or (op == "||" and status == 0):
            continue
        pipeline = [[x for w in words for x in ([str(status)] if w == "$?" else _expand_word(ctx, w))]
                    for words in pipeline]
        status = _run_pipeline(ctx, pipeline)
    return status


def _streams(words: list[str]) -> str | None:
    """What a command streams until the client stops it (so it cannot be a pipe's stage), None if it ends."""
    while words[:1] in (["exec"], ["sudo"]):
        words = words[2:] if words[1:2] == ["-n"] else words[1:]
    name = posixpath.basename(words[0]) if words else ""
    if name in PYTHON_NAMES:
        return "the agent"
    if name == "ip" and "monitor" in words:
        return "ip monitor"
    if name == "nvidia-smi" and any(w in ("-l", "-lms") or w.startswith(("--loop", "-l=", "-lms=")) for w in words):
        return "nvidia-smi's loop"
    return None


def _run_pipeline(ctx: ExecContext, pipeline: list[list[str]]) -> int:
    """`a | b | c` as sh runs commands that end: each stage's stdout is the next one's stdin, the status is the
    last stage's. The stages run one after another (the emulated tools end), so a streaming command is refused."""
    if len(pipeline) == 1:
        return _run_simple(ctx, pipeline[0])
    for words in pipeline:
        if (what := _streams(words)) is not None:
            ctx.err(f"sh: 1: emulated host: {what} streams until stopped and cannot run in a pipe\n")
            return 2
    data = None  # the first stage reads the session's stdin
    for words in pipeline[:-1]:
        stage = ctx.with_stdin(data)
        stage._redirect = []
        _run_simple(stage, words)
        if data is None:  # what it left unread stays for the commands after the pipe
            ctx._stdin_buffer = stage._stdin_buffer
        data = b"".join(stage._redirect)
    return _run_simple(ctx.with_stdin(data), pipeline[-1])


def _filter(ctx: ExecContext, argv: list[str]) -> int:
    """A coreutils/grep filter over stdin or files of the host (devices/emulated/coreutils.py)."""
    def read(word: str) -> bytes | None:
        content = _read_file(ctx, ctx.path(word))
        return content.encode() if isinstance(content, str) else content
    tool = coreutils.FILTERS[posixpath.basename(argv[0])]
    out, err, status = tool(argv, ctx.read_stdin, read)  # stdin read only when an operand is `-` or none is given
    if out:
        ctx.out(out)
    if err:
        ctx.err(err)
    return status


class _InteractiveShell:
    """What an engineer meets after `ssh host`: Debian's bash as a login shell with its default prompt
    (`user@host:~$ `, no colour) and readline's basic editing: echo, backspace, Ctrl-U, Ctrl-C (`^C`, status
    130), Ctrl-D on an empty line or `exit [N]` (`logout`). Under a pty output lines end in CRLF (ONLCR) and
    stderr joins stdout. Without a pty (`ssh -T host < script`) bash reads its commands from stdin instead: no
    prompt, no echo, no editing. A command's stdin is empty (the terminal stays the shell's), so a streaming
    command is refused: there would be no way to stop it but closing the session."""

    def __init__(self, server: "EmulatedHostServer", channel: paramiko.Channel, tty: bool):
        self.server, self.channel = server, channel
        self.ctx = ExecContext(server, channel, "-bash").with_stdin(b"")  # the terminal stays the shell's
        self.ctx.tty, self.ctx.bash = tty, True
        self.status = 0

    @property
    def prompt(self) -> str:
        """Debian's default PS1 without colour, `\\u@\\h:\\w\\$ `: the home directory shown as ~."""
        cwd, home = self.ctx.cwd, self.server.home
        where = "~" + cwd[len(home):] if cwd == home or cwd.startswith(home + "/") else cwd
        return f"{self.server.user}@{self.server.host_name.split('.')[0]}:{where}$ "

    def run(self) -> int:
        if not self.ctx.tty:
            return self.script()
        self.ctx.out(self.prompt)
        line, escape = bytearray(), b""
        while True:
            data = self.channel.recv(4096)
            if not data:
                return self.status  # the client closed its side: the session ends as on a hang-up
            for byte in data:
                char = bytes([byte])
                if escape or char == b"\x1b":  # cursor keys and the like: an escape sequence, not input
                    escape += char
                    if len(escape) > 1 and (escape[-1:].isalpha() or escape[-1:] == b"~"):
                        escape = b""
                    continue
                if char in (b"\r", b"\n"):
                    self.ctx.out("\n")
                    if (done := self.line(line.decode(errors="replace"))) is not None:
                        return done
                    line.clear()
                    self.ctx.out(self.prompt)
                elif char in (b"\x7f", b"\x08"):
                    if line:
                        line.pop()
                        self.ctx.out("\b \b")
                elif char == b"\x15":
                    self.ctx.out("\b \b" * len(line))
                    line.clear()
                elif char == b"\x03":
                    self.ctx.out("^C\n" + self.prompt)
                    line.clear()
                    self.status = 130
                elif char == b"\x04":
                    if not line:
                        self.ctx.err("logout\n")
                        return self.status
                elif byte >= 0x20 or char == b"\t":
                    line += char
                    self.ctx.out(char)

    def script(self) -> int:
        """Lines from stdin until EOF or `exit`."""
        pending = b""
        while True:
            data = self.channel.recv(4096)
            rows = (pending + data).split(b"\n")
            pending = rows.pop() if data else b""
            for row in rows:
                if (done := self.line(row.decode(errors="replace"))) is not None:
                    return done
            if not data:
                return self.status

    def line(self, text: str) -> int | None:
        """Run one line; the session's exit status when it was `exit`."""
        try:
            words = shlex.split(text)
        except ValueError:
            words = None
        if words and words[0] == "exit":
            if len(words) > 1 and not words[1].lstrip("-").isdigit():
                self.ctx.err(f"-bash: exit: {words[1]}: numeric argument required\n")
                return 2
            if self.ctx.tty:  # bash says it, on stderr, when an interactive login shell ends
                self.ctx.err("logout\n")
            return int(words[1]) & 255 if len(words) > 1 else self.status
        if not text.strip():
            return None
        try:
            pieces = _split_commands(text)
        except ValueError:
            pieces = []
        streaming = [what for _, pipeline in pieces for words in pipeline if (what := _streams(words))]
        if streaming:
            self.ctx.err(f"-bash: emulated host: {streaming[0]} streams until stopped; run it with "
                         "`ssh host COMMAND` instead\n")
            self.status = 2
            return None
        try:
            self.status = run_shell(self.ctx, text, self.status)
        except ChannelGone:
            raise
        except Exception as exc:  # a handler bug must not end the session
            log.exception("emulated host %s: %r failed", self.server.host_name, text)
            self.ctx.err(f"emulator: {type(exc).__name__}: {exc}\n")
            self.status = 1
        return None


def _not_found(ctx: ExecContext, name: str) -> int:
    """dash's complaint for `ssh host COMMAND`, bash's in the interactive login shell."""
    if not ctx.bash:
        ctx.err(f"sh: 1: {name}: not found\n")
    else:
        ctx.err(f"-bash: {name}: " + ("No such file or directory\n" if "/" in name else "command not found\n"))
    return 127


def _has_tool(server: "EmulatedHostServer", path: str, tool: str) -> bool:
    """Whether `path` runs `tool` on this host: its bare name, or an absolute path where the host keeps it."""
    return (path == tool or path in server.tool_paths.get(tool, ())) and tool in server.commands


def _sudo(ctx: ExecContext, argv: list[str]) -> int:
    """sudo as the harness uses it, `sudo -n COMMAND...`: run as root when the host's user may (sudoers NOPASSWD:
    `sudo_allowed`), else sudo's own refusal. Without -n sudo would prompt: there is no terminal here."""
    words = argv[1:]
    if words[:1] != ["-n"]:
        ctx.err("sudo: a terminal is required to read the password; either use the -S option to read from "
                "standard input or configure an askpass helper\nsudo: a password is required\n")
        return 1
    if len(words) < 2:
        ctx.err("usage: sudo -h | -K | -k | -V\n")
        return 1
    if not ctx.server.sudo_allowed:
        ctx.err("sudo: a password is required\n")
        return 1
    ctx.server.sudo_commands.append(shlex.join(words[1:]))
    return _run_simple(ctx, words[1:])


def _run_simple(ctx: ExecContext, words: list[str]) -> int:
    home = ctx.server.home
    words = [home + w[1:] if w == "~" or w.startswith("~/") else w for w in words]  # tilde expansion
    target = None
    if ">" in words:
        at = words.index(">")
        if at + 1 >= len(words):
            ctx.err("sh: 1: Syntax error: newline unexpected\n")
            return 2
        target = ctx.path(words[at + 1])
        words = words[:at] + words[at + 2:]
        if posixpath.dirname(target) not in ctx.server.fs.dirs:
            ctx.err(f"sh: 1: cannot create {target}: Directory nonexistent\n")
            return 2
    if any(w in ("<", ">>", "&", "|&") for w in words):
        ctx.err("sh: 1: emulated host: input redirection, appending and background jobs are not supported\n")
        return 2
    if words and words[0] == "exec":
        words = words[1:]
    if not words:
        return 0
    name = words[0]
    if name.startswith("/") and not _has_tool(ctx.server, name, posixpath.basename(name)) \
            and posixpath.basename(name) in ctx.server.tool_paths:
        return _not_found(ctx, name)
    handler = ctx.server.commands.get(name) or ctx.server.commands.get(posixpath.basename(name))
    if handler is None and posixpath.basename(name) in PYTHON_NAMES:
        handler = _python
    if handler is None:
        handler = ctx.server.commands.get("*")
    if handler is None:
        return _not_found(ctx, name)
    if target is None:
        return handler(ctx, words)
    saved, ctx._redirect = ctx._redirect, []
    try:
        status = handler(ctx, words)
    finally:
        data, ctx._redirect = b"".join(ctx._redirect), saved
    with ctx.server.fs.lock:
        ctx.server.fs.files[target] = data
    return status


# ====================================================================== sftp, scp (OpenSSH >= 9's scp speaks SFTP)


class _SftpSession(paramiko.SFTPServer):
    """paramiko's SFTP server on its own thread (one per session), the channel off the accept queue."""

    def start_subsystem(self, name, transport, channel):
        _forget_accepted(channel)
        super().start_subsystem(name, transport, channel)

    def finish_subsystem(self):
        try:  # sshd's internal-sftp ends with status 0; scp takes a session without one (-1) as failed
            self.sock.send_exit_status(0)
        except (OSError, EOFError):
            pass
        super().finish_subsystem()


class _LongName(paramiko.SFTPAttributes):
    """A directory entry whose long name (what `sftp`'s `ls -l` prints) is the line OpenSSH's sftp-server writes
    (sftp-common.c ls_file: "%s %3u %-*s %-*s %8llu %s %s", strmode's 11 characters, names at least 8 wide,
    "%b %e %H:%M" within half a year, else "%b %e  %Y")."""
    owner = "root"

    def __str__(self) -> str:
        mode = super().__str__()[:10] + " "
        recent = 0 <= time.time() - self.st_mtime < 365 * 24 * 3600 / 2
        when = time.strftime("%b %e %H:%M" if recent else "%b %e  %Y", time.localtime(self.st_mtime))
        return (f"{mode} {1:3d} {self.owner:<8} {self.owner:<8} {self.st_size or 0:8d} {when} "
                f"{getattr(self, 'filename', '?')}")


class _HostSftp(paramiko.SFTPServerInterface):
    """The host's files over SFTP: the virtual file system (read, write, create, remove, rename, mkdir, rmdir)
    and the emulated sysfs (listed and read; read-only, as sysfs is to the non-root user)."""

    def __init__(self, server: _SshServer, *args, **kwargs):
        super().__init__(server, *args, **kwargs)
        self.host = server.host
        self.fs = self.host.fs
        self.ctx = ExecContext(self.host, None, "internal-sftp")  # for _read_file/_ls_names: no channel I/O

    def canonicalize(self, path: str) -> str:
        return self.ctx.path(path or ".")  # relative to the home directory, as sshd's sftp-server starts there

    def attributes(self, path: str, listed: bool = False) -> paramiko.SFTPAttributes | int:
        attr = paramiko.SFTPAttributes()  # exactly this class: paramiko's server packs no subclass
        mine = path.startswith(self.host.home + "/") or path == self.host.home or path in self.fs.files
        attr.st_uid = attr.st_gid = 1000 if mine else 0
        attr.st_atime = attr.st_mtime = int(time.time())
        if _ls_names(self.ctx, path) is not None:
            attr.st_mode, attr.st_size = stat.S_IFDIR | 0o755, 4096
            return attr
        content = _read_file(self.ctx, path)
        if content is None:
            if not listed:
                return paramiko.SFTP_NO_SUCH_FILE
            attr.st_mode, attr.st_size = stat.S_IFDIR | 0o755, 0  # a sysfs entry we only list (a device's dir)
            return attr
        with self.fs.lock:
            mine = path in self.fs.files
        attr.st_mode = stat.S_IFREG | (0o644 if mine else 0o444)
        attr.st_size = len(content.encode() if isinstance(content, str) else content)
        return attr

    def stat(self, path: str):
        return self.attributes(self.canonicalize(path))

    lstat = stat

    def list_folder(self, path: str):
        where = self.canonicalize(path)
        names = _ls_names(self.ctx, where)
        if names is None:
            return paramiko.SFTP_NO_SUCH_FILE
        entries = []
        for name in names:
            entry = _LongName()
            entry.__dict__.update(vars(self.attributes(posixpath.join(where, name), listed=True)))
            entry.filename, entry.owner = name, self.host.user if entry.st_uid else "root"
            entries.append(entry)
        return entries

    def open(self, path: str, flags: int, attr):
        where = self.canonicalize(path)
        if _ls_names(self.ctx, where) is not None:
            return paramiko.SFTP_FAILURE  # a directory
        content = _read_file(self.ctx, where)
        data = bytearray(content.encode() if isinstance(content, str) else content or b"")
        writing = bool(flags & (os.O_WRONLY | os.O_RDWR))
        if writing:
            with self.fs.lock:
                mine = where in self.fs.files
                parent = posixpath.dirname(where) in self.fs.dirs
            if content is not None and not mine:
                return paramiko.SFTP_PERMISSION_DENIED
            if not parent or (content is None and not flags & os.O_CREAT):
                return paramiko.SFTP_NO_SUCH_FILE
            if content is not None and flags & os.O_CREAT and flags & os.O_EXCL:
                return paramiko.SFTP_FAILURE
            if flags & os.O_TRUNC:
                data.clear()
            with self.fs.lock:
                self.fs.files[where] = bytes(data)
        elif content is None:
            return paramiko.SFTP_NO_SUCH_FILE
        return _SftpFile(self, where, data, writing, flags)

    def remove(self, path: str):
        where = self.canonicalize(path)
        with self.fs.lock:
            if self.fs.files.pop(where, None) is not None:
                return paramiko.SFTP_OK
        return paramiko.SFTP_NO_SUCH_FILE if _read_file(self.ctx, where) is None else paramiko.SFTP_PERMISSION_DENIED

    def rename(self, oldpath: str, newpath: str):
        old, new = self.canonicalize(oldpath), self.canonicalize(newpath)
        with self.fs.lock:
            if old not in self.fs.files:
                return paramiko.SFTP_NO_SUCH_FILE
            if posixpath.dirname(new) not in self.fs.dirs or new in self.fs.dirs:
                return paramiko.SFTP_FAILURE
            self.fs.files[new] = self.fs.files.pop(old)
        return paramiko.SFTP_OK

    posix_rename = rename

    def mkdir(self, path: str, attr):
        where = self.canonicalize(path)
        with self.fs.lock:
            if where in self.fs.dirs or where in self.fs.files:
                return paramiko.SFTP_FAILURE
            if posixpath.dirname(where) not in self.fs.dirs:
                return paramiko.SFTP_NO_SUCH_FILE
            self.fs.dirs.add(where)
        return paramiko.SFTP_OK

    def rmdir(self, path: str):
        where = self.canonicalize(path)
        with self.fs.lock:
            if where not in self.fs.dirs:
                return paramiko.SFTP_NO_SUCH_FILE
            prefix = where.rstrip("/") + "/"
            if where in ("/", "/home", "/tmp", self.host.home) or \
                    any(p.startswith(prefix) for p in list(self.fs.files) + list(self.fs.dirs)):
                return paramiko.SFTP_FAILURE
            self.fs.dirs.discard(where)
        return paramiko.SFTP_OK

    def chattr(self, path: str, attr):
        return paramiko.SFTP_OK if _read_file(self.ctx, self.canonicalize(path)) is not None \
            or _ls_names(self.ctx, self.canonicalize(path)) is not None else paramiko.SFTP_NO_SUCH_FILE


class _SftpFile(paramiko.SFTPHandle):
    """An open file: a snapshot read at open (a sysfs file is rendered once, as a read of it would); writes
    reach the host's file system at each write, so a concurrent `cat` sees them as on a real host."""

    def __init__(self, sftp: _HostSftp, path: str, data: bytearray, writing: bool, flags: int):
        super().__init__(flags)
        self.sftp, self.path, self.data, self.writing = sftp, path, data, writing
        self.append = bool(flags & os.O_APPEND)

    def read(self, offset: int, length: int):
        return bytes(self.data[offset:offset + length])

    def write(self, offset: int, data: bytes):
        if not self.writing:
            return paramiko.SFTP_PERMISSION_DENIED
        if self.append:
            offset = len(self.data)
        if offset > len(self.data):
            self.data.extend(bytes(offset - len(self.data)))
        self.data[offset:offset + len(data)] = data
        with self.sftp.fs.lock:
            self.sftp.fs.files[self.path] = bytes(self.data)
        return paramiko.SFTP_OK

    def stat(self):
        return self.sftp.attributes(self.path)

    def chattr(self, attr):
        return paramiko.SFTP_OK


def _scp(ctx: ExecContext, argv: list[str]) -> int:
    """The remote end of legacy `scp -O` (rcp's protocol): `scp -t TARGET` receives one file or more, `scp -f
    PATH...` sends them; single files only (no -r). Each message is acknowledged by a NUL byte; a refusal is
    \\x01 and the message, as OpenSSH's scp sends it."""
    words = [w for w in argv[1:] if w not in ("-v", "-p", "-q", "-d", "--")]
    if len(words) < 2 or words[0] not in ("-t", "-f") or any(w.startswith("-") for w in words[1:]):
        ctx.err("scp: emulated host: only `scp -t TARGET` and `scp -f PATH...` (single files) are served\n")
        return 1

    def exact(n: int) -> bytes:
        while len(ctx._stdin_buffer) < n:
            data = ctx.channel.recv(65536)
            if not data:
                raise ChannelGone()
            ctx._stdin_buffer += data
        out, ctx._stdin_buffer = ctx._stdin_buffer[:n], ctx._stdin_buffer[n:]
        return out

    def line() -> bytes:
        while b"\n" not in ctx._stdin_buffer:
            data = ctx.channel.recv(65536)
            if not data:
                return b""
            ctx._stdin_buffer += data
        out, _, ctx._stdin_buffer = ctx._stdin_buffer.partition(b"\n")
        return out

    def refuse(message: str) -> int:
        ctx.out(b"\x01scp: " + message.encode() + b"\n")
        return 1

    fs = ctx.server.fs
    if words[0] == "-t":
        target = ctx.path(words[1])
        ctx.out(b"\0")
        while header := line():
            kind, rest = header[:1], header[1:].decode(errors="replace")
            if kind == b"T":  # -p's times: acknowledged, not kept
                ctx.out(b"\0")
                continue
            if kind != b"C":
                return refuse(f"emulated host: {header[:1].decode()!r} (directories, -r) is not supported")
            _, size, name = rest.split(" ", 2)
            path = posixpath.join(target, name) if target in fs.dirs else target
            if path not in fs.files and _read_file(ctx, path) is not None:
                return refuse(f"{path}: Permission denied")
            if posixpath.dirname(path) not in fs.dirs:
                return refuse(f"{path}: No such file or directory")
            ctx.out(b"\0")
            data = exact(int(size))
            exact(1)  # the sender's NUL after the data
            with fs.lock:
                fs.files[path] = data
            ctx.out(b"\0")
        return 0
    status = 0
    if exact(1) != b"\0":
        return 1
    for word in words[1:]:
        path = ctx.path(word)
        content = _read_file(ctx, path)
        if content is None:
            ctx.out(f"\x01scp: {word}: No such file or directory\n")
            status = 1
            continue
        data = content.encode() if isinstance(content, str) else content
        mode = "0644" if path in fs.files else "0444"
        ctx.out(f"C{mode} {len(data)} {posixpath.basename(path)}\n")
        if exact(1) != b"\0":
            return 1
        ctx.out(data + b"\0")
        if exact(1) != b"\0":
            return 1
    return status


# ====================================================================== tool commands


def _cd(ctx: ExecContext, argv: list[str]) -> int:
    """The builtin: the working directory of this shell (in a pipe a subshell's, as sh has it)."""
    if len(argv) > 2:
        ctx.err("-bash: cd: too many arguments\n" if ctx.bash else "sh: 1: cd: too many arguments\n")
        return 1 if ctx.bash else 2
    target = ctx.path(argv[1]) if len(argv) > 1 else ctx.server.home
    if _ls_names(ctx, target) is None:
        exists = _read_file(ctx, target) is not None
        if ctx.bash:
            ctx.err(f"-bash: cd: {argv[1]}: {'Not a directory' if exists else 'No such file or directory'}\n")
            return 1
        ctx.err(f"sh: 1: cd: can't cd to {argv[1]}\n")
        return 2
    ctx.cwd = target
    return 0


def _pwd(ctx: ExecContext, argv: list[str]) -> int:
    ctx.out(ctx.cwd + "\n")
    return 0


def _true(ctx: ExecContext, argv: list[str]) -> int:
    return 0


def _false(ctx: ExecContext, argv: list[str]) -> int:
    return 1


def _echo(ctx: ExecContext, argv: list[str]) -> int:
    ctx.out(" ".join(argv[1:]) + "\n")
    return 0


def _hostname(ctx: ExecContext, argv: list[str]) -> int:
    ctx.out(ctx.host + "\n")
    return 0


def _sleep(ctx: ExecContext, argv: list[str]) -> int:
    try:
        seconds = float(argv[1])
    except (IndexError, ValueError):
        ctx.err("sleep: missing or invalid operand\n")
        return 1
    ctx.sleep(seconds)
    return 0


def _mkdir(ctx: ExecContext, argv: list[str]) -> int:
    paths = [a for a in argv[1:] if not a.startswith("-")]
    if not paths:
        ctx.err("mkdir: missing operand\n")
        return 1
    for path in paths:
        ctx.server.fs.mkdir(ctx.path(path))
    return 0


def _rm(ctx: ExecContext, argv: list[str]) -> int:
    with ctx.server.fs.lock:
        for path in (a for a in argv[1:] if not a.startswith("-")):
            ctx.server.fs.files.pop(ctx.path(path), None)
    return 0


def _read_file(ctx: ExecContext, path: str) -> str | bytes | None:
    """A virtual file, or an emulated sysfs file rendered from the bench now."""
    with ctx.server.fs.lock:
        if path in ctx.server.fs.files:
            return ctx.server.fs.files[path]
    parts = path.strip("/").split("/")
    if parts[:3] == ["sys", "class", "infiniband"] and len(parts) >= 7 and parts[4] == "ports":
        model = ctx.server.nic_by_rdma(parts[3], int(parts[5]) if parts[5].isdigit() else -1)
        if model is not None:
            name = "/".join(parts[6:])
            octets = (dataplane.counters(ctx.bench, model.key).at(now_ns()) if name.endswith("_data")
                      else (0.0, 0.0))
            return formats.sysfs_ib_port_file(ctx.bench.nic_snapshot(ctx.host, model.netdev), name, octets)
    if parts[:3] == ["sys", "class", "net"] and len(parts) == 5:
        model = ctx.server.nic_by_netdev(parts[3])
        if model is not None:
            return formats.sysfs_net_file(ctx.bench.nic_snapshot(ctx.host, model.netdev), model, parts[4])
    return None


def _cat(ctx: ExecContext, argv: list[str]) -> int:
    paths = [a for a in argv[1:] if a != "-"]
    if not paths:
        ctx.out(ctx.read_stdin())
        return 0
    status = 0
    for word in paths:
        content = _read_file(ctx, ctx.path(word))
        if content is None:
            ctx.err(f"cat: {word}: No such file or directory\n")
            status = 1
        else:
            ctx.out(content)
    return status


def _sha256sum(ctx: ExecContext, argv: list[str]) -> int:
    status = 0
    for word in argv[1:]:
        content = _read_file(ctx, ctx.path(word))
        if content is None:
            ctx.err(f"sha256sum: {word}: No such file or directory\n")
            status = 1
            continue
        data = content.encode() if isinstance(content, str) else content
        ctx.out(f"{hashlib.sha256(data).hexdigest()}  {word}\n")
    return status


def _date(ctx: ExecContext, argv: list[str]) -> int:
    host_ns = ctx.bench.host_clock_ns(ctx.host)
    fmt = argv[1] if len(argv) > 1 else None
    if fmt == "+%s.%N":
        ctx.out(formats.date_ns(host_ns))
    elif fmt == "+%s%N":
        ctx.out(f"{host_ns}\n")
    elif fmt == "+%s":
        ctx.out(f"{host_ns // 1_000_000_000}\n")
    elif fmt is None:
        ctx.out(time.strftime("%a %b %e %H:%M:%S %Z %Y\n", time.localtime(host_ns // 1_000_000_000)))
    else:
        ctx.err(f"date: emulated host supports +%s.%N, +%s%N, +%s; got {fmt!r}\n")
        return 1
    return 0


def _chronyc(ctx: ExecContext, argv: list[str]) -> int:
    if argv[1:] not in (["tracking"], ["-c", "tracking"]):
        ctx.err("chronyc: emulated host supports 'chronyc [-c] tracking' only\n")
        return 1
    host_ns = ctx.bench.host_clock_ns(ctx.host)
    offset_s = (host_ns - time.time_ns()) / 1e9  # against this machine's realtime, the emulated hosts' "NTP time"
    params = getattr(ctx.bench, "host_clock_params", None)
    drift = params(ctx.host)["drift_ppm"] if params else 0.0
    csv = argv[1] == "-c"
    ctx.out(formats.chronyc_tracking_csv(offset_s, drift, ref_time_s=host_ns / 1e9 - 1.0) if csv
            else formats.chronyc_tracking(offset_s, drift))
    return 0


def _ip(ctx: ExecContext, argv: list[str]) -> int:
    opts = {"ts": False, "oneline": False, "json": False}
    rest = argv[1:]
    if rest in (["-V"], ["-Version"]):
        ctx.out(f"ip utility, iproute2-{ctx.server.tools.iproute2}, libbpf 1.1.0\n")
        return 0
    while rest and rest[0].startswith("-"):
        flag = rest.pop(0)
        if flag in ("-j", "-json"):
            opts["json"] = True
        elif flag in ("-ts", "-tshort"):
            opts["ts"] = True
        elif flag in ("-o", "-oneline"):
            opts["oneline"] = True
        elif flag in ("-d", "-details", "-s", "-stats"):
            pass
        else:
            ctx.err(f'Option "{flag}" is unknown, try "ip -help".\n')
            return 255
    if rest[:1] == ["monitor"] and rest[1:] in ([], ["link"]):
        return _ip_monitor(ctx, opts["ts"], opts["oneline"])
    if rest[:1] in (["link"], ["l"]) and rest[1:2] == ["set"]:
        return _ip_link_set(ctx, [w for w in rest[2:] if w != "dev"])
    if rest[:1] in (["link"], ["l"]):
        words = [w for w in rest[1:] if w not in ("show", "dev")]
        ports = ctx.server.ports_with_state()
        if words:
            ports = [(m, s) for m, s in ports if m.netdev == words[0]]
            if not ports:
                ctx.err(f'Device "{words[0]}" does not exist.\n')
                return 1
        if opts["json"]:
            ctx.out(formats.ip_link_json(ports, include_loopback=not words))
            return 0
        if words:
            text = "".join(formats.ip_link_lines(m, s.carrier, s.operstate, oneline=opts["oneline"], monitor=False,
                                                 admin_up=s.admin_up)
                           for m, s in ports)
        elif opts["oneline"]:
            text = formats.ip_o_link(ports)
        else:
            text = "".join(formats.ip_link_lines(m, s.carrier, s.operstate, oneline=False, monitor=False,
                                                 admin_up=s.admin_up)
                           for m, s in ports)
        ctx.out(text)
        return 0
    ctx.err(f'Object "{rest[0] if rest else ""}" is unknown, try "ip help".\n')
    return 255


def _ip_link_set(ctx: ExecContext, words: list[str]) -> int:
    """`ip link set [dev] NETDEV up|down` (silent on success, as iproute2 is); the physics switches the port."""
    if len(words) != 2 or words[1] not in ("up", "down"):
        ctx.err("emulated host supports 'ip link set [dev] NETDEV up|down' only\n")
        return 255
    model = ctx.server.nic_by_netdev(words[0])
    if model is None:
        ctx.err(f'Cannot find device "{words[0]}"\n')
        return 1
    ctx.bench.set_admin(ctx.host, model.netdev, words[1] == "up")
    return 0


def _ip_monitor(ctx: ExecContext, stamps: bool, oneline: bool) -> int:
    """Stream a link event whenever carrier or operstate changes. Changes of one port at one instant are one
    RTM_NEWLINK, so one event (a carrier loss takes the carrier and the operstate down together). Netlink is
    immediate here: the emulator does not model linkwatch's up-to-1-s batching of carrier-down events."""
    changes: queue.SimpleQueue = queue.SimpleQueue()
    unsubscribe = ctx.bench.subscribe(ctx.host, changes.put)
    try:
        state = {m.netdev: [m, s.carrier, s.operstate] for m, s in ctx.server.ports_with_state()}
        pending: list = []
        while not ctx.gone():
            if pending:
                change = pending.pop(0)
            else:
                try:
                    change = changes.get(timeout=_POLL_S)
                except queue.Empty:
                    continue
            batch = [change]
            while True:  # the changes already queued for the same port and instant join this event
                try:
                    more = changes.get_nowait()
                except queue.Empty:
                    break
                if more.netdev == change.netdev and more.t_ns == change.t_ns:
                    batch.append(more)
                else:
                    pending.append(more)
            entry = state.get(change.netdev)
            if entry is None:
                continue
            changed = False
            for item in batch:
                if item.field not in ("carrier", "operstate"):
                    continue
                new = (item.value == "1") if item.field == "carrier" else item.value
                index = 1 if item.field == "carrier" else 2
                if entry[index] != new:
                    entry[index], changed = new, True
            if not changed:
                continue
            host_ns = ctx.bench.host_time(ctx.host, change.t_ns) if stamps else None
            ctx.out(formats.ip_link_lines(entry[0], entry[1], entry[2], oneline=oneline, monitor=True,
                                          host_ns=host_ns))
    finally:
        unsubscribe()
    return 0


def _rdma(ctx: ExecContext, argv: list[str]) -> int:
    words = argv[1:]
    as_json = any(w in ("-j", "-json", "--json") for w in words)
    words = [w for w in words if not w.startswith("-")]
    if words[:1] != ["link"]:
        ctx.err(f'Unknown object "{words[0] if words else ""}"\n')
        return 1
    ports = ctx.server.ports_with_state()
    select = [w for w in words[1:] if w != "show"]
    if select:
        dev, _, port = select[0].partition("/")
        ports = [(m, s) for m, s in ports if m.rdma_dev == dev and (not port or str(m.rdma_port) == port)]
        if not ports:
            ctx.err("Wrong device name\n")
            return 1
    ctx.out(formats.rdma_link(ports, as_json=as_json, tools=ctx.server.tools))
    return 0


def _ethtool(ctx: ExecContext, argv: list[str]) -> int:
    words = argv[1:]
    if words in (["--version"], ["-V"]):
        ctx.out(f"ethtool version {ctx.server.tools.ethtool}\n")
        return 0
    module = bool(words) and words[0] in ("-m", "--dump-module-eeprom", "--module-info")
    if module:
        words = words[1:]
    if len(words) != 1:
        ctx.err("ethtool: bad command line argument(s)\nFor more information run ethtool -h\n")
        return 1
    model = ctx.server.nic_by_netdev(words[0])
    if model is None:
        ctx.err("netlink error: no device matches name (offset 24)\nnetlink error: No such device\n")
        return 1
    snapshot = ctx.bench.nic_snapshot(ctx.host, model.netdev)
    if module:
        los, lol = ctx.server.take_latched(model.netdev)
        ctx.out(formats.ethtool_module(snapshot, rx_los=los or snapshot.rx_los, rx_lol=lol or snapshot.rx_lol,
                                       tools=ctx.server.tools))
    else:
        ctx.out(formats.ethtool(model, snapshot, tools=ctx.server.tools))
    return 0


def _mlxlink(ctx: ExecContext, argv: list[str]) -> int:
    dev = argv[argv.index("-d") + 1] if "-d" in argv[:-1] else None
    port = int(argv[argv.index("-p") + 1]) if "-p" in argv[:-1] and argv[argv.index("-p") + 1].isdigit() else None
    model = ctx.server.nic_by_rdma(dev, port) if dev else None
    if model is None:
        ctx.err(f"-E- Failed to open device: {dev}\n")
        return 1
    ctx.out(formats.mlxlink(model, ctx.bench.nic_snapshot(ctx.host, model.netdev), ctx.server.tools))
    return 0


GPU_BUSY = {"utilization_gpu": 97, "utilization_memory": 41, "power_draw_w": 612.4}  # a training step computing
GPU_STALLED = {"utilization_gpu": 0, "utilization_memory": 0, "power_draw_w": 118.3}  # waiting on its all-to-all


def _gpus_now(ctx: ExecContext, gpus: list) -> list:
    """The emulated host runs a data-parallel job whose collectives need every one of its NIC ports: its GPUs
    compute while all are ACTIVE and stall (idle) from the moment one is not — the network re-training."""
    busy = all(snap.ib_state == "ACTIVE" for _, snap in ctx.server.ports_with_state())
    return [_gpu_in(gpu, busy) for gpu in gpus]


@functools.lru_cache(maxsize=4096)
def _gpu_in(gpu, busy: bool):
    """`gpu` computing or stalled (two states per GPU: the GPU view samples every host several times a second,
    and dataclasses.replace costs ~20 µs a call)."""
    return replace(gpu, **(GPU_BUSY if busy else GPU_STALLED))


def _nvidia_smi(ctx: ExecContext, argv: list[str]) -> int:
    fields: list[str] | None = None
    fmt: list[str] = []
    index: set[int] | None = None
    loop_ms: int | None = None
    args = argv[1:]
    if args[:1] == ["topo"]:
        if args[1:] != ["-m"]:
            ctx.err("emulated nvidia-smi topo supports -m only\n")
            return 2
        ctx.out(formats.nvidia_smi_topo(ctx.server.gpus, sorted({m.rdma_dev for m in ctx.bench.nic_ports(ctx.host)})))
        return 0
    for i, arg in enumerate(args):
        if arg.startswith("--query-gpu="):
            fields = [f.strip() for f in arg.split("=", 1)[1].split(",") if f.strip()]
        elif arg.startswith("--format="):
            fmt = arg.split("=", 1)[1].split(",")
        elif arg in ("-i", "--id") and i + 1 < len(args):
            index = {int(x) for x in args[i + 1].split(",") if x.isdigit()}
        elif arg.startswith("--id="):
            index = {int(x) for x in arg.split("=", 1)[1].split(",") if x.isdigit()}
        elif arg in ("-l", "--loop", "-lms", "--loop-ms") or arg.startswith(("--loop=", "--loop-ms=")):
            name, _, value = arg.partition("=")
            value = value or (args[i + 1] if i + 1 < len(args) else "")
            if not value.isdigit() or int(value) <= 0:
                ctx.err(f"Invalid value for {name}: {value!r}\n")
                return 2
            loop_ms = int(value) * (1 if name in ("-lms", "--loop-ms") else 1000)
    if not args:
        ctx.out(formats.nvidia_smi_table(_gpus_now(ctx, ctx.server.gpus), ctx.bench.host_clock_ns(ctx.host)))
        return 0
    if fields is None or "csv" not in fmt:
        ctx.err("emulated nvidia-smi supports no option (the default table), "
                "--query-gpu=FIELDS --format=csv[,noheader][,nounits] "
                "[-lms MS | -l S] only\n")
        return 2
    for field in fields:
        if field not in formats.GPU_FIELDS:
            ctx.out(f'Field "{field}" is not a valid field to query.\n\n')
            return 2
    chosen = [g for g in ctx.server.gpus if index is None or g.index in index]
    header, units = "noheader" not in fmt, "nounits" not in fmt
    if loop_ms is not None:
        stream = _GpuQueryLoop(ctx, chosen, fields, units, loop_ms * 1_000_000)
        return stream.serve(lambda: stream.query(header))
    ctx.out(formats.nvidia_smi_query(_gpus_now(ctx, chosen), fields, ctx.bench.host_clock_ns(ctx.host),
                                     header=header, units=units))
    return 0


def _ibstat(ctx: ExecContext, argv: list[str]) -> int:
    """`ibstat [CA [PORT]]`; an unknown CA ends as ibstat does, with its ibpanic line and exit status 255."""
    ports = ctx.server.ports_with_state()
    if len(argv) > 1:
        chosen = [(m, s) for m, s in ports if m.rdma_dev == argv[1]
                  and (len(argv) < 3 or str(m.rdma_port) == argv[2])]
        if not chosen:
            ctx.err(f"ibpanic: [{_fake_pid('ibstat', argv[1])}] main: stat of IB device '{argv[1]}' failed: "
                    "No such file or directory\n")
            return 255
        ports = chosen
    ctx.out(formats.ibstat(ports))
    return 0


def _ibstatus(ctx: ExecContext, argv: list[str]) -> int:
    """`ibstatus [DEV[:PORT]]`."""
    ports = ctx.server.ports_with_state()
    if len(argv) > 1:
        dev, _, port = argv[1].partition(":")
        ports = [(m, s) for m, s in ports if m.rdma_dev == dev and (not port or str(m.rdma_port) == port)]
        if not ports:
            ctx.err(f"stat: cannot stat '/sys/class/infiniband/{dev}': No such file or directory\n")
            return 1
    ctx.out(formats.ibstatus(ports))
    return 0


def _ibv_devinfo(ctx: ExecContext, argv: list[str]) -> int:
    ports = ctx.server.ports_with_state()
    args = argv[1:]
    if args[:1] in (["-d"], ["--ib-dev"]) and len(args) == 2:
        ports = [(m, s) for m, s in ports if m.rdma_dev == args[1]]
        if not ports:
            ctx.err(f"IB device '{args[1]}' wasn't found\n")
            return 255
    elif args:
        ctx.err("emulated ibv_devinfo supports [-d DEV] only\n")
        return 1
    ctx.out(formats.ibv_devinfo(ports))
    return 0


def _ibdev2netdev(ctx: ExecContext, argv: list[str]) -> int:
    ctx.out(formats.ibdev2netdev(ctx.server.ports_with_state()))
    return 0


def _uname(ctx: ExecContext, argv: list[str]) -> int:
    """`uname [-snrvmpioa]`: the fields asked for, in uname's own order; none asked is `-s`."""
    letters = "".join(a[1:] for a in argv[1:]) if all(a.startswith("-") for a in argv[1:]) else "?"
    if letters.strip(formats.UNAME_OPTIONS + "a"):
        ctx.err(f"uname: invalid option -- '{letters.strip(formats.UNAME_OPTIONS + 'a')[0]}'\n"
                "Try 'uname --help' for more information.\n")
        return 1
    fields = formats.uname_fields(ctx.host)
    chosen = [f for flag, f in zip(formats.UNAME_OPTIONS, fields) if flag in letters or "a" in letters] or fields[:1]
    ctx.out(" ".join(chosen) + "\n")
    return 0


def _ls_names(ctx: ExecContext, path: str) -> list[str] | None:
    """The entries of a directory of the emulated host (its RDMA and net sysfs classes and the virtual files),
    None when there is no such directory."""
    models = ctx.bench.nic_ports(ctx.host)
    parts = path.rstrip("/").split("/")[1:] if path != "/" else []
    if parts in (["sys"], ["sys", "class"]):  # the way down to the classes below
        return ["class"] if parts == ["sys"] else ["infiniband", "net"]
    if parts == ["sys", "class", "infiniband"]:
        return sorted({m.rdma_dev for m in models})
    if parts == ["sys", "class", "net"]:
        return sorted({"lo"} | {m.netdev for m in models})
    if parts[:3] == ["sys", "class", "infiniband"] and len(parts) >= 5 and \
            any(m.rdma_dev == parts[3] for m in models):
        if parts[4:] == ["device", "net"]:
            return sorted(m.netdev for m in models if m.rdma_dev == parts[3])
        if parts[4:] == ["ports"]:
            return sorted(str(m.rdma_port) for m in models if m.rdma_dev == parts[3])
        return None
    fs = ctx.server.fs
    with fs.lock:
        if path not in fs.dirs:
            return None
        prefix = path.rstrip("/") + "/"
        return sorted({p[len(prefix):].split("/")[0] for p in list(fs.files) + list(fs.dirs)
                       if p.startswith(prefix) and p != prefix} | ({"sys"} if path == "/" else set()))


def _ls(ctx: ExecContext, argv: list[str]) -> int:
    """`ls [-1] [PATH...]` as a non-terminal gets it: one name a line; several directories under `PATH:` heads."""
    paths = [a for a in argv[1:] if a != "-1"]
    if any(a.startswith("-") for a in paths):
        ctx.err("emulated ls supports [-1] [PATH...] only\n")
        return 2
    status, blocks = 0, []
    for word in paths or ["."]:
        path = ctx.path(word)
        names = _ls_names(ctx, posixpath.normpath(path))
        if names is None:
            if _read_file(ctx, path) is not None:
                blocks.append((None, [word]))
                continue
            ctx.err(f"ls: cannot access '{word}': No such file or directory\n")
            status = 2
            continue
        blocks.append((word, names))
    files = [n for head, names in blocks if head is None for n in names]
    dirs = [(head, names) for head, names in blocks if head is not None]
    out = "".join(f"{n}\n" for n in files)
    for i, (head, names) in enumerate(dirs):
        if len(paths) > 1:
            out += ("\n" if out else "") + f"{head}:\n"
        out += "".join(f"{n}\n" for n in names)
    ctx.out(out)
    return status


# ====================================================================== benchmark tools (protocols.md §3.2, §3.3)
#
# Emulated data plane: a NIC pair whose cross-connects are patched both ways and whose two ports are ACTIVE
# (the mirrors settled and the links trained) moves data at the circuit rate; anything else crosses the
# packet fabric at `eps_gbps` per NIC. Each transfer really takes its time (sleep), divided by
# `--time-scale`; the tools report the elapsed time multiplied back, as a real tool reports what it measured.

_NCCL_TYPES = {"int8": 1, "char": 1, "uint8": 1, "int32": 4, "int": 4, "uint32": 4, "int64": 8, "uint64": 8,
               "half": 2, "float16": 2, "bfloat16": 2, "float": 4, "float32": 4, "double": 8, "float64": 8}
_SIZE_SUFFIX = {"": 1, "K": 1 << 10, "M": 1 << 20, "G": 1 << 30}


class _ToolUsage(ValueError):
    """A benchmark tool's command line is wrong (printed to stderr, exit status 1)."""


def _size(word: str) -> int:
    """nccl-tests / perftest sizes: bytes with an optional K, M or G (powers of 1024) suffix."""
    text = word.strip().upper()
    suffix = text[-1] if text and text[-1] in "KMG" else ""
    try:
        value = int(text[:-1] if suffix else text) * _SIZE_SUFFIX[suffix]
    except ValueError:
        raise _ToolUsage(f"invalid size {word!r}") from None
    if value < 0:
        raise _ToolUsage(f"invalid size {word!r}")
    return value


def _positive(word: str, what: str) -> float:
    try:
        value = float(word)
    except ValueError:
        raise _ToolUsage(f"{what} must be a number, got {word!r}") from None
    if not value > 0 or value == float("inf"):
        raise _ToolUsage(f"{what} must be > 0, got {word!r}")
    return value


def _tool_options(argv: list[str], with_value: dict[str, str], flags: dict[str, str]
                  ) -> tuple[dict[str, str | bool], list[str]]:
    """Short/long options -> canonical names (`-b 8`, `--minbytes=8`, `--minbytes 8`), plus positionals."""
    values: dict[str, str | bool] = {}
    positional: list[str] = []
    i = 0
    while i < len(argv):
        word = argv[i]
        name, eq, inline = word.partition("=") if word.startswith("--") else (word, "", "")
        if name in flags:
            values[flags[name]] = True
        elif name in with_value:
            if not eq:
                i += 1
                if i >= len(argv):
                    raise _ToolUsage(f"option {name} needs a value")
                inline = argv[i]
            values[with_value[name]] = inline
        elif word.startswith("-") and word != "-":
            raise _ToolUsage(f"unknown option {word}")
        else:
            positional.append(word)
        i += 1
    return values, positional


def _port_by_key(ctx: ExecContext, key: str):
    host, sep, netdev = key.partition(":")
    if not sep:
        return None
    return next((m for m in ctx.bench.all_nic_ports() if m.host == host and m.netdev == netdev), None)


def _circuit_up(bench, patches: dict[int, int], a, b) -> bool:
    """Patched both ways and both ends ACTIVE: light arrived on each side and the links trained."""
    if patches.get(a.ocs_tx) != b.ocs_rx or patches.get(b.ocs_tx) != a.ocs_rx:
        return False
    return all(bench.nic_snapshot(m.host, m.netdev).ib_state == "ACTIVE" for m in (a, b))


class _DataPlane:
    """Rates and latency of one tool invocation (command line, else the host's settings)."""

    def __init__(self, ctx: ExecContext, opts: dict):
        self.ctx = ctx
        server = ctx.server
        self.link_gbps = _positive(opts["link-gbps"], "--link-gbps") if "link-gbps" in opts else server.link_gbps
        self.eps_bytes_s = (_positive(opts["eps-gbps"], "--eps-gbps") if "eps-gbps" in opts
                            else server.eps_gbps) * _BYTES_PER_GBIT
        latency_us = float(opts.get("latency-us", server.transfer_latency_us))
        if not latency_us >= 0:
            raise _ToolUsage("--latency-us must be >= 0")
        self.latency_s = latency_us / 1e6
        self.time_scale = _positive(opts["time-scale"], "--time-scale") if "time-scale" in opts else 1.0

    def circuit_bytes_s(self, a, b) -> float:
        if self.link_gbps is not None:
            return self.link_gbps * _BYTES_PER_GBIT
        speed = min(self.ctx.bench.nic_snapshot(m.host, m.netdev).speed_mbps for m in (a, b))
        return speed / 1000 * _BYTES_PER_GBIT

    def pair_bytes_s(self, me, peer) -> float:
        return (self.circuit_bytes_s(me, peer) if _circuit_up(self.ctx.bench, self.ctx.bench.ocs_patches(), me, peer)
                else self.eps_bytes_s)

    def run(self, me, plan: list[list[tuple[object, float, float]]]) -> list[tuple[int, int]] | None:
        """`me`'s transfers back to back from now (per transfer: (peer, bytes to send, to receive)), integrated
        over the physics (devices/emulated/dataplane.py) and counted on `me`'s port. Sleeps until they end
        (time-scaled: rates × time_scale); each transfer's (start, end) on the harness clock, None if the
        client went away."""
        scale = self.time_scale
        steps = [[(m.key, send, recv, self.circuit_bytes_s(me, m) * scale) for m, send, recv in step] for step in plan]
        view = dataplane.fabric(self.ctx.bench)
        chain = dataplane.counters(self.ctx.bench, me.key).start(
            lambda t0: dataplane.Chain(view, me.key, steps, self.eps_bytes_s * scale,
                                       int(self.latency_s / scale * 1e9), t0), now_ns)
        while True:
            now = now_ns()
            chain.advance(now)
            if chain.finish_ns is not None:
                return chain.intervals()
            # the result does not depend on when we wake; waking in steps only ends the command near its end
            wait = min(chain.projected_finish_ns() - now, _TRANSFER_WAKE_NS) / 1e9
            if not self.ctx.sleep(max(wait, 0.0)):
                return None


def _fake_pid(*words: str) -> int:
    return 1000 + int(hashlib.sha256(" ".join(words).encode()).hexdigest()[:8], 16) % 60000


def _device_index(ctx: ExecContext, model) -> int:
    return [m.netdev for m in ctx.bench.nic_ports(model.host)].index(model.netdev)


_ALLTOALL_USAGE = ("usage: alltoall_perf [-b MINBYTES] [-e MAXBYTES] [-f FACTOR | -i STEPBYTES] [-g 1] [-n ITERS] "
                   "[-w WARMUP] [-c 0|1] [-d TYPE] --peers HOST:NETDEV[=SEND[/RECV]],... [--self HOST:NETDEV] "
                   "[--link-gbps G] [--eps-gbps G] [--latency-us U] [--time-scale S]\n")


def _alltoall_perf(ctx: ExecContext, argv: list[str]) -> int:
    """nccl-tests `alltoall_perf` for one rank (this host's NIC `--self`, default its first) against the
    ranks in `--peers`. Without byte counts each peer gets size/nranks, as in alltoall; with
    `=SEND[/RECV]` (RECV defaults to SEND) the counts are this rank's traffic at size = ΣSEND and scale
    with the swept size. Sizes, iterations and columns follow nccl-tests (in-place is timed too)."""
    try:
        opts, positional = _tool_options(argv[1:], {
            "-b": "b", "--minbytes": "b", "-e": "e", "--maxbytes": "e", "-f": "f", "--stepfactor": "f",
            "-i": "i", "--stepbytes": "i", "-g": "g", "--ngpus": "g", "-t": "t", "--nthreads": "t",
            "-n": "n", "--iters": "n", "-w": "w", "--warmup_iters": "w", "-c": "c", "--check": "c",
            "-d": "d", "--datatype": "d", "-o": "o", "--op": "o", "-z": "z", "--blocking": "z",
            "--peers": "peers", "--self": "self", "--link-gbps": "link-gbps", "--eps-gbps": "eps-gbps",
            "--latency-us": "latency-us", "--time-scale": "time-scale"}, {})
        if positional:
            raise _ToolUsage(f"unexpected argument {positional[0]!r}")
        if opts.get("g", "1") != "1" or opts.get("t", "1") != "1":
            raise _ToolUsage("the emulated alltoall_perf runs one rank per process (-g 1 -t 1)")
        dtype = str(opts.get("d", "float"))
        if dtype not in _NCCL_TYPES:
            raise _ToolUsage(f"invalid type {dtype}")
        me = _port_by_key(ctx, str(opts["self"])) if "self" in opts else ctx.server.bench.nic_ports(ctx.host)[0]
        if me is None or me.host != ctx.host:
            raise _ToolUsage(f"--self {opts.get('self')!r} is not a NIC port of {ctx.host}")
        peers: list[tuple[object, float | None, float | None]] = []
        for spec in filter(None, str(opts.get("peers", "")).split(",")):
            key, eq, amounts = spec.partition("=")
            model = _port_by_key(ctx, key)
            if model is None or model == me:
                raise _ToolUsage(f"--peers: no such peer NIC port {key!r} (HOST:NETDEV)")
            send, _, recv = amounts.partition("/")
            peers.append((model, float(_size(send)) if eq else None, float(_size(recv or send)) if eq else None))
        if not peers:
            raise _ToolUsage("--peers: at least one peer HOST:NETDEV is needed")
        explicit = [p[1] is not None for p in peers]
        if any(explicit) and not all(explicit):
            raise _ToolUsage("--peers: give byte counts for every peer or for none")
        total_send = sum(p[1] for p in peers) if all(explicit) else 0.0
        default_size = int(total_send) if all(explicit) else 32 << 20
        min_bytes = _size(str(opts["b"])) if "b" in opts else default_size
        max_bytes = _size(str(opts["e"])) if "e" in opts else max(min_bytes, default_size)
        factor = int(opts.get("f", 2)) if "i" not in opts else 1
        step_bytes = _size(str(opts["i"])) if "i" in opts else 0
        iters, warmup = int(opts.get("n", 20)), int(opts.get("w", 5))
        check = str(opts.get("c", "1")) != "0"
        if max_bytes < min_bytes or iters < 1 or warmup < 0 or (factor < 2 and step_bytes <= 0):
            raise _ToolUsage("need minbytes <= maxbytes, iters >= 1, warmup >= 0 and a growing size sweep")
        plane = _DataPlane(ctx, opts)
    except (_ToolUsage, ValueError) as exc:
        ctx.err(f"alltoall_perf: {exc}\n{_ALLTOALL_USAGE}")
        return 1
    nranks = len(peers) + 1
    word = _NCCL_TYPES[dtype]

    def rank_traffic(size: int) -> list[tuple[object, float, float]]:
        if all(explicit):
            scale = size / total_send if total_send > 0 else 0.0
            return [(m, s * scale, r * scale) for m, s, r in peers]
        return [(m, size / nranks, size / nranks) for m, _, _ in peers]

    sizes = []
    size = min_bytes
    while size <= max_bytes:
        sizes.append(size)
        grown = size * factor if step_bytes <= 0 else size + step_bytes
        if grown <= size:  # a sweep from 0 bytes by a factor stays at 0: one row
            break
        size = grown
    counts = (warmup, iters, iters)  # warm-up, out-of-place, in-place
    intervals = plane.run(me, [rank_traffic(size) for size in sizes for n in counts for _ in range(n)])
    if intervals is None:
        return 1

    def mean_s(first: int, count: int) -> float:
        """Mean seconds of `count` transfers from the `first`-th, as the fabric realised them."""
        spans = intervals[first:first + count]
        return (spans[-1][1] - spans[0][0]) / 1e9 * plane.time_scale / max(count, 1)

    rows, index = [], 0
    for size in sizes:
        index += warmup
        phases = []
        for _ in ("out-of-place", "in-place"):
            seconds = mean_s(index, iters)
            index += iters
            algbw = size / 1e9 / seconds if seconds > 0 else 0.0
            phases.append(formats.NcclTiming(seconds * 1e6, algbw, algbw * (nranks - 1) / nranks,
                                             0 if check else None))
        rows.append((size, size // word, dtype, "none", -1, phases[0], phases[1]))
    ranks = [formats.NcclRank(r, m.host, _device_index(ctx, m), _fake_pid(m.host, m.netdev), 0x18 + 0x10 * r,
                              formats.EmulatedGpu(0).name) for r, m in enumerate([me] + [p[0] for p in peers])]
    ctx.out(formats.nccl_tests_output("alltoall_perf", ranks, rows, min_bytes=min_bytes, max_bytes=max_bytes,
                                      step_factor=factor, warmup_iters=warmup, iters=iters, check=check,
                                      tools=ctx.server.tools))
    return 0


def _perftest_end(model) -> formats.PerftestEnd:
    """Stable per-NIC connection identifiers (RoCE: GID = IPv4-mapped address from the MAC)."""
    digest = int(hashlib.sha256(model.key.encode()).hexdigest()[:16], 16)
    mac = [int(x, 16) for x in model.mac.split(":")]
    gid = bytes(10) + b"\xff\xff" + bytes([10, mac[3], mac[4], 1])
    return formats.PerftestEnd(lid=0, qpn=0x100 + model.ifindex, psn=digest & 0xFFFFFF, rkey=(digest >> 24) & 0x1FFFFF,
                               vaddr=0x7F0000000000 | ((digest >> 8) & 0xFFFFFFF000), gid=gid)


def _ib_write_bw(ctx: ExecContext, argv: list[str]) -> int:
    """perftest `ib_write_bw` client: `ib_write_bw -d DEV [-i PORT] [-s BYTES] [-n ITERS] [--report_gbits]
    SERVER` with SERVER a host name (the peer NIC: the one our circuit reaches there, else the same RDMA
    device name) or HOST:NETDEV. Writes iters × size bytes one way over the current data plane."""
    try:
        opts, positional = _tool_options(argv[1:], {
            "-d": "d", "--ib-dev": "d", "-i": "i", "--ib-port": "i", "-s": "s", "--size": "s", "-n": "n",
            "--iters": "n", "-q": "q", "--qp": "q", "-x": "x", "--gid-index": "x", "-m": "m", "--mtu": "m",
            "-p": "p", "--port": "p", "--link-gbps": "link-gbps", "--eps-gbps": "eps-gbps",
            "--latency-us": "latency-us", "--time-scale": "time-scale"},
            {"-F": "F", "--CPU-freq": "F", "--report_gbits": "gbits", "-R": "R", "--rdma_cm": "R"})
        if len(positional) != 1:
            raise _ToolUsage("the emulated ib_write_bw runs the client side: give the server (HOST or "
                             "HOST:NETDEV)")
        dev = str(opts.get("d", ""))
        port = int(opts.get("i", 0)) or None
        me = ctx.server.nic_by_rdma(dev, port) if dev else ctx.bench.nic_ports(ctx.host)[0]
        if me is None:
            ctx.err(f" IB device {dev} not found\n Unable to find the Infiniband/RoCE device\n")
            return 1
        size, iters = _size(str(opts.get("s", "65536"))), int(opts.get("n", 5000))
        qps, mtu, gid_index = int(opts.get("q", 1)), int(opts.get("m", 4096)), int(opts.get("x", 3))
        if size < 1 or iters < 1:
            raise _ToolUsage("size and iterations must be >= 1")
        plane = _DataPlane(ctx, opts)
    except (_ToolUsage, ValueError) as exc:
        ctx.err(f"ib_write_bw: {exc}\n")
        return 1
    host, _, netdev = positional[0].partition(":")
    candidates = [m for m in ctx.bench.all_nic_ports() if m.host == host and m.host != ctx.host]
    if netdev:
        candidates = [m for m in candidates if m.netdev == netdev]
    if not candidates:
        ctx.err(f"Couldn't connect to {positional[0]}:{opts.get('p', 18515)}\n"
                "Unable to open file descriptor for socket connection Unable to init the socket connection\n")
        return 1
    patches = ctx.bench.ocs_patches()
    peer = (next((m for m in candidates if patches.get(me.ocs_tx) == m.ocs_rx), None)
            or next((m for m in candidates if m.rdma_dev == me.rdma_dev), None) or candidates[0])
    rate = plane.pair_bytes_s(me, peer)
    spans = plane.run(me, [[(peer, float(size * iters), 0.0)]])
    if spans is None:
        return 1
    measured = (spans[0][1] - spans[0][0]) / 1e9 * plane.time_scale
    average = size * iters / measured
    gbits = bool(opts.get("gbits"))
    unit = (lambda b: b * 8 / 1e9) if gbits else (lambda b: b / 2**20)  # noqa: E731  perftest's MiB = 2^20
    row = (size, iters, unit(rate), unit(average), average / size / 1e6)
    ctx.out(formats.ib_write_bw_output(me.rdma_dev, _perftest_end(me), _perftest_end(peer), [row],
                                       report_gbits=gbits, qps=qps, mtu=mtu, gid_index=gid_index,
                                       tools=ctx.server.tools))
    return 0


# ====================================================================== host agent (ARCHITECTURE.md)


def _python(ctx: ExecContext, argv: list[str]) -> int:
    args = [a for a in argv[1:] if a != "-u"]
    if not args or args[0].startswith("-"):
        ctx.err("emulated host: python3 runs uploaded agent programs only\n")
        return 2
    path = ctx.path(args[0])
    with ctx.server.fs.lock:
        present = path in ctx.server.fs.files
    if not present:
        ctx.err(f"{argv[0]}: can't open file '{args[0]}': [Errno 2] No such file or directory\n")
        return 2
    if len(args) < 2 or args[1] not in ctx.server.agent_commands:
        ctx.err(f"usage: {posixpath.basename(path)} {{{','.join(ctx.server.agent_commands)}}} ...\n")
        return 2
    return ctx.server.agent_commands[args[1]](ctx, args[1:])


def _runs_agent_timesrv(server: "EmulatedHostServer", command: str) -> bool:
    """`command` is exactly `[exec] python3 [-u] AGENT timesrv` of an uploaded agent, run by the built-in
    handlers (no override): what `_TimeResponder` may answer on the hub from the first byte."""
    if "timesrv" not in command:  # every exec request asks: no shell parse for the others
        return False
    try:
        words = shlex.split(command)
    except ValueError:
        return False
    words = words[1:] if words[:1] == ["exec"] else words
    if words[:2] == ["sudo", "-n"]:  # become: sudo
        if not server.sudo_allowed:
            return False
        words = words[2:]
    words = [w for i, w in enumerate(words) if not (i == 1 and w == "-u")]
    if len(words) != 3 or words[2] != "timesrv" or posixpath.basename(words[0]) not in PYTHON_NAMES:
        return False
    if words[0] in server.commands or posixpath.basename(words[0]) in server.commands \
            or server.agent_commands.get("timesrv") is not _agent_timesrv:
        return False
    path = words[1]
    if path == "~" or path.startswith("~/"):
        path = server.home + path[1:]
    path = posixpath.normpath(path if path.startswith("/") else posixpath.join(server.home, path))
    with server.fs.lock:
        return path in server.fs.files


def _clock_read_at(arrived_ns: int) -> int:
    """When an emulated host reads its clock for a time token: midway between the token's arrival (its read's
    kernel stamp, bounded; 0: unknown) and now, the reply's send — whatever backlog of the shared SSH hub lay
    between falls on both legs of the probe alike, as inside an idle host; now where the arrival is unknown."""
    now = now_ns()
    return (arrived_ns + now) // 2 if 0 < arrived_ns <= now else now


class _TimeResponder(BufferedPipe):
    """The stdin of an agent `timesrv`, answered where it arrives: on the SSH hub, as the transport's loop feeds
    each chunk, `TOKEN` -> `TOKEN HOST_NS` with the host clock midway between the token's arrival (its read's
    kernel stamp) and now (`_clock_read_at`), sent at once. No thread is woken per probe (the command's thread
    only waits for EOF): the clock path is the emulator's busiest per-packet path (~35 probes per 8x8 cycle), and
    a thread's wake-up after the hub had the token (0.1-2 ms on a busy emulator) fell on the outbound leg only.
    Only when the channel's send window is short does a reply go through the command's thread (from then on
    every reply, in order): a send from the hub must never wait for the client."""

    def __init__(self, channel: paramiko.Channel, bench, host: str):
        super().__init__()
        self._channel, self._host_time, self._host = channel, bench.host_time, host
        sock = getattr(getattr(channel, "transport", None), "sock", None)
        self._sock = sock if isinstance(sock, HubSocket) else None  # whose reads' kernel stamps date a token
        self._partial = b""
        self._via_thread = False

    def feed(self, data) -> None:  # the transport's loop, one chunk at a time
        channel = self._channel
        ack = channel._check_add_window(len(data))  # consumed here, so the client's window is given back here
        if ack > 0:
            m = paramiko.Message()
            m.add_byte(cMSG_CHANNEL_WINDOW_ADJUST)
            m.add_int(channel.remote_chanid)
            m.add_int(ack)
            channel.transport._send_user_message(m)
        self._partial += data
        if b"\n" not in self._partial:
            return
        *lines, self._partial = self._partial.split(b"\n")
        stamp = self._host_time(self._host, _clock_read_at(self._sock.arrived_ns if self._sock is not None else 0))
        reply = b"".join(b"%s %d\n" % (line.strip(), stamp) for line in lines)
        if not self._via_thread and len(reply) <= min(channel.out_window_size, channel.out_max_packet_size - 64):
            try:
                channel.send(reply)  # one packet within the window: it cannot wait
            except (OSError, EOFError):
                pass  # the client went away; its close ends the command
            return
        self._via_thread = True
        super().feed(reply)


def _agent_timesrv(ctx: ExecContext, argv: list[str]) -> int:
    """`TOKEN` -> `TOKEN HOST_NS` at once. Answered on the hub by `_TimeResponder` where the exec request
    installed one; this thread then sends only the replies the hub could not (a short window), until EOF.
    Otherwise this thread answers, lean on purpose, with HOST_NS the host clock midway between the token's arrival
    (its read's kernel receive stamp) and the reply's send (`_clock_read_at`):
    the thread's wake-up after the hub fed the bytes (0.1-2 ms on a busy emulator) would otherwise lengthen
    only the probe's outbound leg and bias the harness's offset estimate (events recorded early)."""
    host_time, host, channel = ctx.bench.host_time, ctx.host, ctx.channel
    arrivals = channel.in_buffer
    if isinstance(arrivals, _TimeResponder):
        while data := arrivals.read(65536):  # the pipe, not channel.recv: these bytes are replies, not stdin
            try:
                channel.sendall(data)
            except (OSError, EOFError):
                raise ChannelGone() from None
        return 0
    buffer = b""
    while True:
        data = channel.recv(65536)
        if not data:
            return 0
        buffer += data
        if b"\n" not in buffer:
            continue
        *lines, buffer = buffer.split(b"\n")
        stamp = host_time(host, _clock_read_at(getattr(arrivals, "last_arrival_ns", 0)))
        reply = b"".join(b"%s %d\n" % (line.strip(), stamp) for line in lines)
        try:
            channel.sendall(reply)
        except (OSError, EOFError):
            raise ChannelGone() from None


def _options(argv: list[str], known: dict[str, type]) -> tuple[dict[str, object], list[str]]:
    """`--name value` options (with defaults None) and the positional words."""
    values: dict[str, object] = {name: None for name in known}
    positional = []
    i = 0
    while i < len(argv):
        word = argv[i]
        if word.startswith("--"):
            name, eq, value = word[2:].partition("=")
            if name not in known:
                raise ValueError(f"unknown option --{name}")
            if not eq:
                i += 1
                if i >= len(argv):
                    raise ValueError(f"--{name} needs a value")
                value = argv[i]
            values[name] = known[name](value)
        else:
            positional.append(word)
        i += 1
    return values, positional


def _snapshot_fields(snapshot) -> dict[str, str]:
    return {"rx_los": str(int(snapshot.rx_los)), "rx_lol": str(int(snapshot.rx_lol)),
            "carrier": str(int(snapshot.carrier)), "operstate": snapshot.operstate,
            "phys_state": snapshot.phys_state, "state": snapshot.ib_state,
            **({"module_state": snapshot.module_state} if snapshot.module_state is not None else {})}


class _AgentStreams:
    """A host's streaming agent subcommands (`watch`, `probe-recv`) served by one thread of the host's.

    The host's changes come from the physics through ONE subscription into one queue (a C call on the physics'
    delivery thread, no Python callback per stream); each change goes to the streams that watch its port and
    field, which say when its line is due (a watch: its next poll tick; a probe receiver: at once); the thread
    writes each stream's due lines in one write. A command's own thread only waits for its stdin's EOF, so a
    stream costs no wake-ups while nothing changes and a burst of changes wakes one thread per host instead of
    one per stream. What a line says and when it is stamped is each stream's (`_WatchStream`,
    `_ProbeRecvStream`); only who writes it is shared. One thread per host, not per process: a host whose
    client stops reading (a full SSH window) or that is made slow (`reply_delay_s`) holds up its own
    streams only, as on a real bench."""

    _EMPTY = object()

    def __init__(self, server: "EmulatedHostServer"):
        self._inbox: queue.SimpleQueue = queue.SimpleQueue()
        self._lock = threading.Lock()
        self._routes: dict[tuple[str, str], tuple] = {}  # (netdev, field) -> streams; replaced, never mutated
        self._unsubscribe = server.bench.subscribe(server.host_name, self._inbox.put)
        threading.Thread(target=self._run, name=f"ssh-{server.host_name}-agent", daemon=True).start()

    def add(self, stream) -> None:
        """From now on `stream` gets the changes of its (netdev, field) keys, each due at the first tick of
        `stream.grid(field)` = (origin, step) at or after it (step 0: at once)."""
        with self._lock:
            routes = dict(self._routes)
            for key in stream.keys:
                routes[key] = routes.get(key, ()) + ((stream, *stream.grid(key[1])),)
            self._routes = routes

    def remove(self, stream) -> None:
        """No change reaches `stream` and nothing is written to it once this returns."""
        with self._lock:
            routes = dict(self._routes)
            for key in stream.keys:
                routes[key] = tuple(r for r in routes.get(key, ()) if r[0] is not stream)
            self._routes = routes
        with stream.write_lock:
            stream.closed = True

    def arm(self, change) -> None:
        """A stream's own timer: `change` is routed as a physics change (due at its `t_ns` on a step-0 grid)."""
        self._inbox.put(change)

    def close(self) -> None:
        self._unsubscribe()
        self._inbox.put(None)

    def _run(self) -> None:
        inbox, due, seq, empty = self._inbox, [], itertools.count(), self._EMPTY
        while True:
            if not due:
                change = inbox.get()
            else:
                wait = (due[0][0] - now_ns()) / 1e9
                try:
                    change = inbox.get(timeout=wait) if wait > 0 else inbox.get_nowait()
                except queue.Empty:
                    change = empty
            now = now_ns()
            ready: dict = {}  # stream -> its (due ns, change) due by now, in arrival order: the heap's first
            while due and due[0][0] <= now:
                at, _, stream, item = heapq.heappop(due)
                ready.setdefault(stream, []).append((at, item))
            while change is not empty:  # everything already queued
                if change is None:
                    return
                # the routes as of this change: a stream added since reads its first values after adding
                for stream, origin, step in self._routes.get((change.netdev, change.field), ()):
                    t = change.t_ns
                    at = origin + -(-(t - origin) // step) * step if step else t  # its tick, or at once
                    if at > now:
                        heapq.heappush(due, (at, next(seq), stream, change))
                    elif stream in ready:
                        ready[stream].append((at, change))
                    else:
                        ready[stream] = [(at, change)]
                try:
                    change = inbox.get_nowait()
                except queue.Empty:
                    change = empty
            for stream, items in ready.items():
                items.sort(key=_due)  # stable: changes due at one tick stay in arrival order
                stream.write(items)


def _due(item: tuple) -> int:
    return item[0]


class _Stream:
    """One agent stream's output, written by its host's `_AgentStreams` thread (or, for its first lines, by
    its command's thread, holding `write_lock` so nothing overtakes them)."""

    keys: tuple[tuple[str, str], ...] = ()

    def __init__(self, ctx: ExecContext):
        self.ctx = ctx
        self.write_lock = threading.Lock()
        self.closed = False

    def write(self, items: list) -> None:
        with self.write_lock:
            if self.closed:
                return
            text = self.lines(items)
            if text:
                try:
                    self.ctx.out(text)
                except ChannelGone:
                    self.closed = True  # its command's thread sees the channel close and ends

    def serve(self, first_lines: Callable[[], str]) -> int:
        """Register, write `first_lines()` (read after registering: no change can fall between), then wait
        for stdin's EOF or the client going away."""
        streams = self.ctx.server.agent_streams()
        self.write_lock.acquire()
        try:
            streams.add(self)
            text = first_lines()
            if text:
                self.ctx.out(text)
        except BaseException:  # the channel gone, or a bug: never left registered (remove takes the lock)
            self.write_lock.release()
            streams.remove(self)
            raise
        self.write_lock.release()
        try:
            self.ctx.wait_stdin_eof_or_gone()
        finally:
            streams.remove(self)
        return 0


class _Tick(NamedTuple):
    """A stream's own timer, routed like a physics change to its own key (no value: it changes nothing)."""

    netdev: str
    field: str
    t_ns: int
    value: None = None


class _GpuTick(NamedTuple):
    """A looping `nvidia-smi`'s next query, routed like a physics change to its own stream."""

    netdev: str
    field: str
    t_ns: int


class _GpuQueryLoop(_Stream):
    """`nvidia-smi --query-gpu=... --format=csv... -lms N` (`-l S`): the query printed at once (the header,
    unless `noheader`, only then), then again `interval` after each query until the client goes away: each
    query stamps its own `timestamp` (host clock, ms). Its timer rides on the host's `_AgentStreams` thread:
    each query arms the next as a `_GpuTick` due then (no thread, no wake-up in between)."""

    def __init__(self, ctx: ExecContext, gpus: list, fields: list[str], units: bool, interval: int):
        super().__init__(ctx)
        self.gpus, self.fields, self.units, self.interval = gpus, fields, units, interval
        self.keys = (("", f"nvidia-smi-loop-{id(self)}"),)

    @staticmethod
    def grid(field: str) -> tuple[int, int]:
        return 0, 0  # due at the tick's own time

    def query(self, header: bool = False) -> str:
        ctx = self.ctx
        text = formats.nvidia_smi_query(_gpus_now(ctx, self.gpus), self.fields, ctx.bench.host_clock_ns(ctx.host),
                                        header=header, units=self.units)
        ctx.server.agent_streams().arm(_GpuTick(*self.keys[0], now_ns() + self.interval))  # sleeps, then again
        return text

    def lines(self, items: list) -> str:
        return self.query()


class _WatchStream(_Stream):
    """The agent's local poller (devices/agent/hilagent.py `watch`): each change is reported at the first
    poll tick at or after it (a grid of `interval` with a random phase; ethtool fields on their own grid),
    stamped with the host clock at that tick, and printed no earlier than that tick (the ticks reached late,
    in one write). Changes that revert between two ticks are never seen, as with a real poller — except
    carrier and the IB state, whose drop and return the agent reads from `carrier_changes` and `link_downed`
    (both lines, one tick), and the module's LOS and LOL flags, which `ethtool -m` reads latched (as the
    emulated `ethtool -m` does): a tick after the flag was set reads "1" even if it has cleared since, and the
    tick after that reads it as it is then."""

    def __init__(self, ctx: ExecContext, watched: dict[str, tuple[str, ...]], interval: int, ethtool_interval: int,
                 heartbeat: int = 0):
        super().__init__(ctx)
        self.watched = watched
        # its own timer (`_Tick`s on this key, routed like a change): the heartbeat and the end of a stall
        self.timer = ("", f"watch-timer-{id(self)}")
        self.keys = tuple((netdev, field) for netdev, fields in watched.items() for field in fields) + (self.timer,)
        self.interval, self.ethtool_interval, self.heartbeat = interval, ethtool_interval, heartbeat
        rng = random.Random()
        start = now_ns()
        self.phase = {False: start + rng.randrange(interval), True: start + rng.randrange(ethtool_interval)}
        self.last: dict[tuple[str, str], str] = {}  # as printed
        self.live: dict[tuple[str, str], str] = {}  # as the physics last set it
        self.printed_ns = start  # harness time of the last line written (a heartbeat only after a silence)
        self.stalled_since: int | None = None  # the first tick a `watch_stall` fault kept silent
        self.moved: set[tuple[str, str]] = set()  # the fields that changed during that stall

    def grid(self, field: str) -> tuple[int, int]:
        if field == self.timer[1]:
            return 0, 0  # due at its own time
        ethtool = field in _ETHTOOL_FIELDS or field in _ETHTOOL_STATES
        return self.phase[ethtool], self.ethtool_interval if ethtool else self.interval

    def arm_heartbeat(self, at_ns: int) -> None:
        if self.heartbeat:
            self.ctx.server.agent_streams().arm(_Tick(*self.timer, at_ns))

    def write(self, items: list) -> None:
        super().write(items)
        if self.heartbeat and not self.closed and any(item[1].field == self.timer[1] for item in items):  # its one chain of ticks
            self.arm_heartbeat(max(self.printed_ns + self.heartbeat, self.ctx.server.watch_stalled_until_ns,
                                   now_ns() + 1))

    def first_lines(self) -> str:
        """Every watched field's value now, INTERVAL_NS 0 (as the real agent's first poll)."""
        ctx, lines = self.ctx, []
        host_now = ctx.bench.host_clock_ns(ctx.host)
        for netdev, fields in self.watched.items():
            values = _snapshot_fields(ctx.bench.nic_snapshot(ctx.host, netdev))
            for field in fields:
                self.last[(netdev, field)] = self.live[(netdev, field)] = values[field]
                lines.append(f"{host_now} {netdev} {field} {values[field]} 0\n")
        return "".join(lines)

    def lines(self, items: list) -> str:
        now = now_ns()
        stall = self.ctx.server.watch_stalled_until_ns
        if now < stall or self.stalled_since is not None:
            return self._stalled(items, now, stall)
        out, last, live, i = [], self.last, self.live, 0
        if self.heartbeat and now - self.printed_ns >= self.heartbeat and \
                all(item[1].field == self.timer[1] for item in items):  # a silent tick: the agent's heartbeat
            self.printed_ns = now
            return f"{self.ctx.bench.host_time(self.ctx.host, now)} alive\n"
        while i < len(items):  # tick by tick: a poller sees only the value at the tick
            tick = items[i][0]
            seen: dict[tuple[str, str], str] = {}
            flipped: set[tuple[str, str]] = set()  # a value that changed in this tick (carrier_changes moved)
            latched: set[tuple[str, str]] = set()  # a module flag set since the last tick
            while i < len(items) and items[i][0] == tick:
                change = items[i][1]
                key = (change.netdev, change.field)
                i += 1
                if change.value is None:  # the read after a latched flag: the value as it is now
                    seen.setdefault(key, live.get(key))
                    continue
                if change.value != last.get(key) or key in seen:
                    flipped.add(key)
                if change.value == "1" and key[1] in _ETHTOOL_FIELDS:
                    latched.add(key)
                seen[key] = live[key] = change.value
            host_ns = self.ctx.bench.host_time(self.ctx.host, tick)
            for key, value in seen.items():
                ethtool = key[1] in _ETHTOOL_FIELDS or key[1] in _ETHTOOL_STATES
                step = self.ethtool_interval if ethtool else self.interval
                if key in latched and value != "1":  # read as set; the next tick reads it as it is then
                    value = "1"
                    self.ctx.server.agent_streams().arm(NicChange(tick + 1, self.ctx.host, *key, None))
                if last.get(key) != value:
                    last[key] = value
                    out.append(f"{host_ns} {key[0]} {key[1]} {value} {step}\n")
                elif key[1] == "carrier" and key in flipped:  # down and up between two ticks: the agent
                    other = "0" if value == "1" else "1"  # sees carrier_changes move by two
                    out += [f"{host_ns} {key[0]} {key[1]} {v} {step}\n" for v in (other, value)]
                elif key[1] == "state" and key in flipped and value == "ACTIVE":  # ... and link_downed move
                    out += [f"{host_ns} {key[0]} {key[1]} {v} {step}\n" for v in ("DOWN", value)]
        if out:
            self.printed_ns = now
        return "".join(out)

    def _stalled(self, items: list, now: int, stall: int) -> str:
        """A `watch_stall` fault: the agent is stopped (its stream stays open). Changes meanwhile only move
        the values; the first tick after the stall prints every value that differs from the last printed one,
        its interval reaching back to the last tick before the stall (what a poller resumed would see)."""
        for _, change in items:
            if change.field != self.timer[1] and change.value is not None:
                self.live[(change.netdev, change.field)] = change.value
                self.moved.add((change.netdev, change.field))
        if now < stall:
            if self.stalled_since is None:  # the first tick it kept silent: its changes happened within a step before
                self.stalled_since = min((at for at, _ in items), default=now)
                self.moved = {(change.netdev, change.field) for _, change in items if change.value is not None}
                if not self.heartbeat:  # else its heartbeat's next tick is the stall's end
                    self.ctx.server.agent_streams().arm(_Tick(*self.timer, stall))
            return ""
        since, self.stalled_since = self.stalled_since, None
        host_ns = self.ctx.bench.host_time(self.ctx.host, now)
        out = []
        for key, value in self.live.items():
            ethtool = key[1] in _ETHTOOL_FIELDS or key[1] in _ETHTOOL_STATES
            interval = now - since + (self.ethtool_interval if ethtool else self.interval)
            if self.last.get(key) != value:
                self.last[key] = value
                out.append(f"{host_ns} {key[0]} {key[1]} {value} {interval}\n")
            elif key in self.moved and key[1] == "carrier":  # down and up meanwhile: carrier_changes moved
                out += [f"{host_ns} {key[0]} {key[1]} {v} {interval}\n" for v in ("0" if value == "1" else "1", value)]
            elif key in self.moved and key[1] == "state" and value == "ACTIVE":  # ... and link_downed
                out += [f"{host_ns} {key[0]} {key[1]} {v} {interval}\n" for v in ("DOWN", value)]
        self.moved = set()
        self.printed_ns = now
        return "".join(out) or f"{host_ns} alive\n"


def _agent_watch(ctx: ExecContext, argv: list[str]) -> int:
    """The agent's `watch` (see `_WatchStream`); initial values carry INTERVAL_NS 0, `--ethtool-interval-us 0`
    turns the ethtool fields off. Ends when stdin closes or the client goes away."""
    try:
        opts, targets = _options(argv[1:], {"interval-us": int, "ethtool-interval-us": int, "ethtool": str,
                                            "heartbeat-us": int})
    except ValueError as exc:
        ctx.err(f"watch: {exc}\n")
        return 2
    if not opts["interval-us"] or opts["interval-us"] <= 0 or not targets:
        ctx.err("usage: watch --interval-us N [--ethtool-interval-us M] NETDEV[=RDMADEV/PORT] ...\n")
        return 2
    ethtool_us = WATCH_ETHTOOL_DEFAULT_US if opts["ethtool-interval-us"] is None else opts["ethtool-interval-us"]
    ethtool = opts["ethtool"] or "ethtool"
    if ethtool_us > 0 and not _has_tool(ctx.server, ethtool, "ethtool"):  # the agent's own note and behaviour
        ctx.err(f"hilagent: {ethtool} not found; rx_los and rx_lol not watched\n")
        ethtool_us = 0
    watched: dict[str, tuple[str, ...]] = {}  # netdev -> fields
    for target in targets:
        netdev, eq, rdma = target.partition("=")
        model = ctx.server.nic_by_netdev(netdev)
        dev, _, port = rdma.partition("/")
        if model is None or (eq and (model.rdma_dev != dev or str(model.rdma_port) != port)):
            ctx.err(f"watch: no such port {target}\n")
            return 2
        fields = ("carrier", "operstate") + (("phys_state", "state") if eq else ())
        cmis = ctx.bench.nic_snapshot(ctx.host, netdev).module_state is not None  # its `ethtool -m` shows the state
        watched[netdev] = fields + ((_ETHTOOL_FIELDS + _ETHTOOL_STATES * cmis) if ethtool_us > 0 else ())
    interval = int(opts["interval-us"]) * 1000
    stream = _WatchStream(ctx, watched, interval, int(ethtool_us) * 1000 or interval,
                          max(0, opts["heartbeat-us"] or 0) * 1000)

    def first_lines() -> str:
        text = stream.first_lines()
        stream.printed_ns = now_ns()  # its first lines: the silence a heartbeat waits for starts now
        stream.arm_heartbeat(stream.printed_ns + stream.heartbeat)
        return text

    return stream.serve(first_lines)


def _agent_counters(ctx: ExecContext, argv: list[str]) -> int:
    """Emulates the agent's counter sampler: on a grid of `--interval-us` ticks (random phase), each port's
    port_xmit_data / port_rcv_data AT the tick (the transfers integrated over the fabric up to it), stamped
    with the host clock at the tick, read time 0. Printed no earlier than the tick, in batches when this
    thread runs late — the values do not depend on when it runs."""
    try:
        opts, targets = _options(argv[1:], {"interval-us": int})
    except ValueError as exc:
        ctx.err(f"counters: {exc}\n")
        return 2
    ports = []
    for target in targets:
        dev, _, port = target.partition("/")
        model = ctx.server.nic_by_rdma(dev, int(port) if port.isdigit() else -1)
        if model is None:
            ctx.err(f"counters: no such port {target}\n")
            return 2
        ports.append((target, dataplane.counters(ctx.bench, model.key)))
    if not opts["interval-us"] or opts["interval-us"] <= 0 or not ports:
        ctx.err("usage: counters --interval-us N RDMADEV/PORT ...\n")
        return 2
    interval = int(opts["interval-us"]) * 1000
    tick = now_ns() + random.randrange(interval)
    while not ctx.gone() and not ctx.stdin_closed():
        lines, now = [], now_ns()
        while tick <= now:
            host_ns = ctx.bench.host_time(ctx.host, tick)
            for name, counter in ports:
                sent, received = counter.at(tick)
                lines.append(f"{host_ns} {name} {int(sent) // 4} {int(received) // 4} 0\n")
            tick += interval
        if lines:
            ctx.out("".join(lines))
        time.sleep(max(_COUNTER_BATCH_S, (tick - now_ns()) / 1e9))
    return 0


def _agent_probe_send(ctx: ExecContext, argv: list[str]) -> int:
    try:
        opts, _ = _options(argv[1:], {"iface": str, "dst-mac": str, "dst-ip": str, "template": bytes.fromhex,
                                      "interval-us": int, "udp-port": int, "dqpn": int})
    except ValueError as exc:
        ctx.err(f"probe-send: {exc}\n")
        return 2
    if ctx.server.nic_by_netdev(str(opts["iface"])) is None or not opts["interval-us"] \
            or (opts["template"] is None and opts["dst-mac"] is None):
        ctx.err("usage: probe-send --iface NETDEV (--template HEX | --dst-mac MAC) --interval-us N\n")
        return 2
    ctx.bench.probe_start(ctx.host, opts["iface"], int(opts["interval-us"]) * 1000)
    try:
        ctx.wait_stdin_eof_or_gone()
    finally:
        ctx.bench.probe_stop(ctx.host, opts["iface"])
    return 0


class _ProbeRecvStream(_Stream):
    """The agent's `probe-recv`: a `first` line for each stream of probes the port starts to receive, stamped
    with the host clock at the first probe's arrival (a kernel receive stamp), printed at once. As a real
    receiver: no probe from before it started, and the first after its start is "first"."""

    def __init__(self, ctx: ExecContext, netdev: str):
        super().__init__(ctx)
        self.netdev = netdev
        self.keys = ((netdev, "probe_first"),)
        self.started = now_ns()  # set again once registered (first_lines)

    @staticmethod
    def grid(field: str) -> tuple[int, int]:
        return 0, 0  # at once

    def first_lines(self) -> str:
        """The first probe seen of a flow that began before the receiver (a later flow comes as a change)."""
        ctx = self.ctx
        # Its start is after it registered: a flow's first probe before then never came as a change to it.
        self.started = now_ns()
        flow = ctx.bench.probe_flow(ctx.host, self.netdev)
        if flow is None or flow[2] >= self.started:
            return ""
        mac, seq, arrival, interval = flow
        k = -(-(self.started - arrival) // interval)
        seen = arrival + k * interval
        time.sleep(max(0, seen - now_ns()) / 1e9)  # printed no earlier than the probe arrived
        return f"{ctx.bench.host_time(ctx.host, seen)} first {mac} {seq + k}\n"

    def lines(self, items: list) -> str:
        host_time, host, started = self.ctx.bench.host_time, self.ctx.host, self.started
        return "".join(f"{host_time(host, change.t_ns)} first {change.value}\n" for _, change in items
                       if change.t_ns >= started)


def _agent_probe_recv(ctx: ExecContext, argv: list[str]) -> int:
    try:
        opts, _ = _options(argv[1:], {"iface": str, "gap-us": int, "udp-port": int})
    except ValueError as exc:
        ctx.err(f"probe-recv: {exc}\n")
        return 2
    netdev = opts["iface"]
    if ctx.server.nic_by_netdev(str(netdev)) is None:
        ctx.err("usage: probe-recv --iface NETDEV --gap-us G [--udp-port P]\n")
        return 2
    stream = _ProbeRecvStream(ctx, str(netdev))
    return stream.serve(stream.first_lines)


DEFAULT_COMMANDS: dict[str, Handler] = {
    "true": _true, "false": _false, "echo": _echo, "hostname": _hostname, "sleep": _sleep,
    "mkdir": _mkdir, "rm": _rm, "cat": _cat, "sha256sum": _sha256sum, "date": _date, "chronyc": _chronyc,
    "ip": _ip, "rdma": _rdma, "ethtool": _ethtool, "mlxlink": _mlxlink, "nvidia-smi": _nvidia_smi,
    "alltoall_perf": _alltoall_perf, "ib_write_bw": _ib_write_bw,
    "ibstat": _ibstat, "ibstatus": _ibstatus, "ibv_devinfo": _ibv_devinfo, "ibdev2netdev": _ibdev2netdev,
    "uname": _uname, "ls": _ls, "sudo": _sudo,
    "cd": _cd, "pwd": _pwd, "scp": _scp, **{name: _filter for name in coreutils.FILTERS},
}
# Debian's paths of the tools (ethtool, iproute2's ip and rdma in /usr/sbin and /sbin; usrmerge links both;
# mlxlink from MFT and nvidia-smi in /usr/bin)
TOOL_PATHS = {"ethtool": ("/usr/sbin/ethtool", "/sbin/ethtool"), "ip": ("/usr/sbin/ip", "/sbin/ip", "/usr/bin/ip", "/bin/ip"),
              "rdma": ("/usr/sbin/rdma", "/sbin/rdma", "/usr/bin/rdma", "/bin/rdma"),
              "mlxlink": ("/usr/bin/mlxlink",), "nvidia-smi": ("/usr/bin/nvidia-smi",)}
AGENT_COMMANDS: dict[str, Handler] = {
    "timesrv": _agent_timesrv, "watch": _agent_watch, "counters": _agent_counters,
    "probe-send": _agent_probe_send, "probe-recv": _agent_probe_recv,
}
