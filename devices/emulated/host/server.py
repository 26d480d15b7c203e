"""`EmulatedHostServer`: one emulated host, its SSH server and its command registry (`server.commands`, name ->
handler(ctx, argv) -> exit status); `extra_commands` adds or overrides entries, and the key "*" catches names
nobody else handles."""
from __future__ import annotations

import logging
import socket
import tempfile
import threading
from pathlib import Path

import paramiko

from devices.emulated import formats
from devices.emulated.host import benchtools, files, gpu, net, shell, system, transfer
from devices.emulated.host.agent import AGENT_COMMANDS, TimeResponder, runs_agent_timesrv
from devices.emulated.host.benchtools import EPS_GBPS_DEFAULT, TRANSFER_LATENCY_US_DEFAULT
from devices.emulated.host.context import ChannelGone, ExecContext, Handler
from devices.emulated.host.files import VirtualFs
from devices.emulated.host.shell import InteractiveShell, run_shell
from devices.emulated.host.ssh import HostsLoop, forget_accepted, generate_ed25519, server_transport
from devices.emulated.host.streams import AgentStreams
from devices.emulated.host.transfer import HostSftp, SftpSession
from devices.resources import HostResource
from devices.sshhub import stamp_arrivals
from devices.timing import now_ns

log = logging.getLogger(__name__)


# OpenSSH's MaxSessions default: sessions open at once on one connection; the next one is refused ("no more
# sessions", channel open failure 2). A lab's hosts keep it unless their admin raised it.
MAX_SESSIONS = 10


class SshServer(paramiko.ServerInterface):
    def __init__(self, host: "EmulatedHostServer"):
        self.host = host
        self.transport: paramiko.Transport | None = None  # set by server_transport before the handshake
        self.ptys: set[int] = set()  # the channels (ids) that asked for a pty

    def get_allowed_auths(self, username: str) -> str:
        return "publickey"

    def check_auth_publickey(self, username: str, key: paramiko.PKey) -> int:
        if username == self.host.user and key == self.host.client_public_key:
            return paramiko.AUTH_SUCCESSFUL
        return paramiko.AUTH_FAILED

    def check_channel_request(self, kind: str, chanid: int) -> int:
        if kind != "session":
            return paramiko.OPEN_FAILED_ADMINISTRATIVELY_PROHIBITED
        if len(self.transport._channels) >= MAX_SESSIONS:  # noqa: SLF001 - open on this connection, not yet freed
            log.info("no more sessions")  # OpenSSH's words, in its log
            return paramiko.OPEN_FAILED_CONNECT_FAILED  # what OpenSSH answers
        return paramiko.OPEN_SUCCEEDED

    def check_channel_env_request(self, channel, name, value) -> bool:
        return True  # stock OpenSSH sends LANG/LC_*; accept and ignore

    def check_channel_exec_request(self, channel: paramiko.Channel, command: bytes) -> bool:
        text = command.decode(errors="replace")
        # before the client can send stdin: the time responder answers on the hub, others read arrival stamps
        if runs_agent_timesrv(self.host, text):
            channel.in_buffer = TimeResponder(channel, self.host.bench, self.host.host_name)
        else:
            stamp_arrivals(channel)
        HostsLoop.get().run_command(self.host._exec, (channel, text, channel.chanid in self.ptys),
                                    f"ssh-{self.host.host_name}-exec")
        return True

    def check_channel_pty_request(self, channel, term, width, height, pixelwidth, pixelheight, modes) -> bool:
        self.ptys.add(channel.chanid)
        return True

    def check_channel_window_change_request(self, channel, width, height, pixelwidth, pixelheight) -> bool:
        return True

    def check_channel_shell_request(self, channel: paramiko.Channel) -> bool:
        HostsLoop.get().run_command(self.host._interactive, (channel, channel.chanid in self.ptys),
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
        self.fs = VirtualFs(self.home)
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
        self._agent_streams: AgentStreams | None = None
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
        self.host_key = generate_ed25519(self.host_key_path)
        client_key = generate_ed25519(self.client_key_path)
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
        HostsLoop.get().listen(self._listener, self)
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
            HostsLoop.get().unlisten(self._listener)
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
        transport = server_transport(sock, self.host_key, SshServer(self),
                                     {"sftp": (SftpSession, HostSftp)})
        if transport is not None:
            with self._lock:
                self._transports = [t for t in self._transports if t.is_active()] + [transport]
                self.connections += 1

    def _exec(self, channel: paramiko.Channel, command: str, tty: bool = False) -> None:
        forget_accepted(channel)
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
        HostsLoop.get().close_later(channel)

    def _interactive(self, channel: paramiko.Channel, tty: bool) -> None:
        """A login shell: a prompt, each line run by run_shell, until `exit` or Ctrl-D on an empty line."""
        forget_accepted(channel)
        shell = InteractiveShell(self, channel, tty)
        try:
            status = shell.run()
        except ChannelGone:
            return
        self._end_session(channel, status)

    def agent_streams(self) -> "AgentStreams":
        """The thread serving this host's agent streams (started with the first stream)."""
        with self._lock:
            if self._agent_streams is None:
                self._agent_streams = AgentStreams(self)
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


DEFAULT_COMMANDS: dict[str, Handler] = {
    **shell.COMMANDS, **files.COMMANDS, **transfer.COMMANDS, **system.COMMANDS, **net.COMMANDS, **gpu.COMMANDS,
    **benchtools.COMMANDS,
}
# Debian's paths of the tools (ethtool, iproute2's ip and rdma in /usr/sbin and /sbin; usrmerge links both;
# mlxlink from MFT and nvidia-smi in /usr/bin)
TOOL_PATHS = {"ethtool": ("/usr/sbin/ethtool", "/sbin/ethtool"), "ip": ("/usr/sbin/ip", "/sbin/ip", "/usr/bin/ip", "/bin/ip"),
              "rdma": ("/usr/sbin/rdma", "/sbin/rdma", "/usr/bin/rdma", "/bin/rdma"),
              "mlxlink": ("/usr/bin/mlxlink",), "nvidia-smi": ("/usr/bin/nvidia-smi",),
              "python3": ("/usr/bin/python3", "/bin/python3")}
