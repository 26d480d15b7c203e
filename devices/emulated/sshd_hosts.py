"""Emulated hosts that are real: Debian's OpenSSH `sshd` inside each host's network namespace of the netns data
plane (devices/emulated/netns.py), the harness logging in with a key and a pinned host key, and the real kernel,
shell, coreutils, `ip` and Python serving everything a host has without hardware.

- **Login.** One host key and one client key per host (ssh-keygen); a known_hosts naming exactly that host key.
  The bench listens on 127.0.0.1 in the root namespace and starts, per connection, `sshd -i` (inetd mode, the
  connection as its stdin and stdout) inside the host's namespace, so the namespace needs no route to the root
  one and every session's processes run in it.
- **Each host's own view.** Every connection's mount namespace (`ip netns exec` makes one and mounts the
  namespace's own sysfs) gets the host's home directory over the user's (what the harness uploads stays the
  host's), and `/sys/class/infiniband` from a per-host tree (an overlay on /sys/class adds the directory the
  machine has no driver for; /sys/class/net stays the kernel's: real veth carrier and operstate).
- **The RDMA port's sysfs** (`ports/N/state`, `phys_state`, `rate`, `link_layer`) are plain files written from the
  physics' changes (formats.sysfs_ib_port_file renders them, as the paramiko host serves them), on the data
  plane's worker in order with the veth carrier changes: the agent reads them through the file descriptor it
  keeps open, at the kernel's cost. A write that changes a file's length
  keeps every read a single line (shorter: truncated first), and its time window is recorded: the bench's ground
  truth of the stages read from a file or from the kernel is when the file or the veth changed (`realised`), not
  when the physics meant it to.
- **Hardware tools** (`ethtool`, `rdma`, `mlxlink`, `nvidia-smi`, the InfiniBand diagnostics, the benchmark tools)
  are one small C program (toolshim.c) in a per-host bin directory that sshd's `SetEnv PATH` puts first: it sends
  its command line over a UNIX socket to the bench, which runs the paramiko host's handler for it
  (devices/emulated/host/server.py DEFAULT_COMMANDS) and sends back its stdout, stderr and exit status.

Needs root, /usr/sbin/sshd, ssh-keygen, iproute2, mount with overlayfs, and a C compiler for the tool program.
"""
from __future__ import annotations

import ctypes
import hashlib
import logging
import os
import pwd
import shlex
import shutil
import socket
import struct
import subprocess
import tempfile
import threading
from pathlib import Path
from typing import Callable

from devices.emulated import formats
from devices.emulated.netns import gil_libc
from devices.emulated.nic import NicChange, NicSnapshot
from devices.resources import HostResource
from devices.timing import now_ns

log = logging.getLogger(__name__)

SSHD = "/usr/sbin/sshd"
SHIM_SOURCE = Path(__file__).with_name("toolshim.c")
# What the host has no hardware for: served by the emulator through the tool program (the rest is the real system)
HARDWARE_TOOLS = ("ethtool", "rdma", "mlxlink", "nvidia-smi", "ibstat", "ibstatus", "ibv_devinfo", "ibdev2netdev",
                  "ib_write_bw", "alltoall_perf")
# The RDMA port files written from the physics (formats.sysfs_ib_port_file renders each). Not the counters:
# link_downed moves with the state in one physics change, which two files cannot show at once (a read between
# the two writes would show a flap that never happened); the data counters are not kept current.
IB_PORT_FILES = ("state", "phys_state", "rate", "link_layer")
# Stages a host reads from a file or the kernel here, and the (watch field, value) whose realised change marks them
REALISED_STAGES = {"phy_up": ("carrier", "1"), "port_down": ("carrier", "0"), "port_active": ("state", "ACTIVE")}
STANDARD_PATH = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"


class SshdHostError(RuntimeError):
    """The sshd hosts could not be set up (a tool missing, a failed command)."""


def sshd_missing() -> str | None:
    """Why real sshd hosts cannot run here, or None."""
    if os.geteuid() != 0:
        return "needs root (network and mount namespaces, sshd)"
    for path, package in ((SSHD, "openssh-server"), (shutil.which("ssh-keygen"), "openssh-client"),
                          (shutil.which("ip"), "iproute2"), (shutil.which("mount"), "mount")):
        if not path or not os.access(path, os.X_OK):
            return f"{path or package} not installed (apt-get install {package})"
    if not (shutil.which("cc") or shutil.which("gcc")):
        return "no C compiler for the hardware tools' program (apt-get install gcc)"
    return None


def _run(argv: list[str], **kwargs) -> str:
    done = subprocess.run(argv, capture_output=True, text=True, **kwargs)
    if done.returncode != 0:
        raise SshdHostError(f"{' '.join(argv[:4])} failed: {(done.stderr or done.stdout).strip()}")
    return done.stdout


def build_shim() -> Path:
    """The tool program, compiled once per source into the machine's temporary directory (a bench starts in
    tens of milliseconds rather than a compiler's second on a loaded machine)."""
    source = SHIM_SOURCE.read_bytes()
    binary = Path(tempfile.gettempdir()) / f"ocs-hil-toolshim-{hashlib.sha256(source).hexdigest()[:12]}"
    if not binary.exists():
        compiler = shutil.which("cc") or shutil.which("gcc")
        partial = binary.with_name(f"{binary.name}.{os.getpid()}.partial")
        try:
            _run([compiler, "-O2", "-o", str(partial), str(SHIM_SOURCE)])
            os.replace(partial, binary)  # whole or not at all: benches start at once in parallel tests
        finally:
            partial.unlink(missing_ok=True)
    return binary


# ---------------------------------------------------------------------- the tools' socket
class _ToolChannel:
    """What an ExecContext needs of a paramiko channel, over one tool program's UNIX socket connection."""

    def __init__(self, sock: socket.socket):
        self._sock = sock
        self._lock = threading.Lock()
        self.closed = False
        self.eof_received = False

    def _frame(self, kind: bytes, data: bytes) -> None:
        try:
            with self._lock:
                self._sock.sendall(kind + struct.pack(">I", len(data)) + data)
        except OSError:
            self.closed = True
            raise

    def sendall(self, data: bytes) -> None:
        self._frame(b"o", data)

    def sendall_stderr(self, data: bytes) -> None:
        self._frame(b"e", data)

    def send_exit(self, status: int) -> None:
        self._frame(b"x", struct.pack(">I", status & 0xFFFFFFFF))

    def recv(self, size: int) -> bytes:
        """The tool program sends nothing after its command line: this returns b"" once it is gone."""
        try:
            data = self._sock.recv(size)
        except OSError:
            data = b""
        if not data:
            self.closed = self.eof_received = True
        return data

    def get_transport(self):
        return self

    def is_active(self) -> bool:
        return not self.closed


def _read_request(sock: socket.socket) -> list[str] | None:
    """argv (a count, then the words, each NUL-ended), or None if the program went away first."""
    buf = b""
    while True:
        count, sep, rest = buf.partition(b"\0")
        if sep and count.isdigit() and rest.count(b"\0") >= int(count):
            return rest.decode(errors="surrogateescape").split("\0")[:int(count)]
        data = sock.recv(4096)
        if not data:
            return None
        buf += data


class ToolServer:
    """One host's hardware tools: a UNIX socket served by the paramiko host's command handlers."""

    def __init__(self, bench, host: str, path: Path):
        from devices.emulated.host.server import EmulatedHostServer

        self.host = host
        self.path = path
        self.emulated = EmulatedHostServer(bench, host).follow_bench()
        self._listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        self._listener.bind(str(path))
        self._listener.listen(64)
        self.calls = 0  # tool runs served (ground truth for tests)
        threading.Thread(target=self._accept, name=f"tools-{host}", daemon=True).start()

    def _accept(self) -> None:
        while True:
            try:
                conn, _ = self._listener.accept()
            except OSError:
                return
            threading.Thread(target=self._serve, args=(conn,), name=f"tool-{self.host}", daemon=True).start()

    def _serve(self, conn: socket.socket) -> None:
        from devices.emulated.host.context import ChannelGone, ExecContext

        with conn:
            argv = _read_request(conn)
            if not argv:
                return
            self.calls += 1
            channel = _ToolChannel(conn)
            ctx = ExecContext(self.emulated, channel, shlex.join(argv))
            handler = self.emulated.commands.get(argv[0]) if argv[0] in HARDWARE_TOOLS else None
            try:
                if handler is None:
                    ctx.err(f"{argv[0]}: not a hardware tool of this bench\n")
                    status = 127
                else:
                    status = handler(ctx, argv)
            except ChannelGone:
                return
            except Exception as exc:  # a handler bug must not leave the tool hanging
                log.exception("sshd host %s: %r failed", self.host, argv)
                status = 1
                try:
                    ctx.err(f"emulator: {type(exc).__name__}: {exc}\n")
                except ChannelGone:
                    return
            try:
                channel.send_exit(status)
            except OSError:
                pass

    def stop(self) -> None:
        try:
            self._listener.shutdown(socket.SHUT_RDWR)
        except OSError:
            pass
        self._listener.close()
        self.emulated.stop()


# ---------------------------------------------------------------------- the RDMA port's sysfs
def write_sysfs_file(fd: int, old: bytes, new: bytes) -> tuple[int, int]:
    """Change a file another process keeps open and re-reads with pread at offset 0, so that every read is one
    line: shorter, truncated to the new length first (a read then shows the old text cut short); longer, written
    whole (a read before the length grows shows the old length). Returns the monotonic ns just before and after
    (calls that keep the GIL: devices.emulated.netns.gil_libc)."""
    libc = gil_libc()
    before = now_ns()
    if len(new) < len(old):
        libc.ftruncate(fd, len(new))
    written = libc.pwrite(fd, new, len(new), 0)
    after = now_ns()
    if written != len(new):
        raise OSError(ctypes.get_errno(), f"pwrite wrote {written} of {len(new)} bytes")
    return before, after


class IbSysfs:
    """Per host, `/sys/class/infiniband/<dev>/ports/<n>/{state,phys_state,rate,link_layer}` kept current with
    the physics. `realised[(host, netdev, field, value, due_ns)] = (before_ns, after_ns)`: when a change due at
    `due_ns` was in the file."""

    _FIELDS = {"state": "ib_state", "phys_state": "phys_state"}  # watch field (its file) -> the snapshot's

    def __init__(self, bench, roots: dict[str, Path], submit: Callable[[Callable[[], None]], None]):
        self.bench = bench
        self._submit = submit  # where the writes run: in order with the carrier changes (NetnsPlane.submit)
        self.realised: dict[tuple[str, str, str, str, int], tuple[int, int]] = {}
        self._ports: dict[tuple[str, str], Path] = {}  # (host, netdev) -> its port directory
        self._files: dict[Path, tuple[int, bytes]] = {}  # each file's descriptor and text
        self._lock = threading.Lock()
        self._unsubscribes = []
        for host, root in roots.items():
            for model in bench.nic_ports(host):
                ports = root / model.rdma_dev / "ports" / str(model.rdma_port)
                (ports / "counters").mkdir(parents=True, exist_ok=True)
                self._ports[(host, model.netdev)] = ports
            self._unsubscribes.append(bench.subscribe(host, self._changed))
            for model in bench.nic_ports(host):  # after subscribing: no change falls between
                self._render(host, model.netdev, IB_PORT_FILES)

    def _render(self, host: str, netdev: str, names, snapshot=None) -> tuple[int, int]:
        """Write the named files of a port from `snapshot` (default: its state now); returns the window the last
        one changed in."""
        ports = self._ports[(host, netdev)]
        snapshot = snapshot or self.bench.nic_snapshot(host, netdev)
        window = (0, 0)
        with self._lock:
            for name in names:
                path = ports / name
                text = (formats.sysfs_ib_port_file(snapshot, name) or "").encode()
                if path not in self._files:
                    path.write_bytes(text)
                    self._files[path] = (os.open(path, os.O_WRONLY), text)
                    continue
                fd, old = self._files[path]
                if old != text:
                    window = write_sysfs_file(fd, old, text)
                    self._files[path] = (fd, text)
        return window

    def _changed(self, change: NicChange) -> None:
        attr = self._FIELDS.get(change.field)
        if attr is None or (change.host, change.netdev) not in self._ports:
            return
        # The change's own value, written in the physics' order with the veth's carrier: changes delivered late
        # come in one batch, and a state file written at once would show ACTIVE before the carrier it follows.
        snapshot = NicSnapshot()._replace(**{attr: change.value})

        def write() -> None:
            window = self._render(change.host, change.netdev, (change.field,), snapshot)
            if window[1]:
                self.realised[(change.host, change.netdev, change.field, change.value, change.t_ns)] = window

        self._submit(write)

    def stop(self) -> None:
        for unsubscribe in self._unsubscribes:
            unsubscribe()
        self._unsubscribes.clear()
        with self._lock:
            for fd, _ in self._files.values():
                os.close(fd)
            self._files.clear()


# ---------------------------------------------------------------------- the hosts
class SshdHosts:
    """Every host of a NetnsPlane as a real sshd. `resource(host)` is how the harness reaches it (strict host
    key); `stop()` ends every process started here and removes its files."""

    def __init__(self, plane, log_dir: Path):
        self.plane = plane
        self.bench = plane.bench
        self.log_dir = Path(log_dir)
        self.user = pwd.getpwuid(os.geteuid()).pw_name
        self._home_of_user = pwd.getpwuid(os.geteuid()).pw_dir
        self._tmp: tempfile.TemporaryDirectory | None = None
        self.tools: dict[str, ToolServer] = {}
        self.ports: dict[str, int] = {}
        self.connections: dict[str, int] = {}  # sshd processes started per host (ground truth for tests)
        self._listeners: dict[str, socket.socket] = {}
        self._procs: list[subprocess.Popen] = []
        self._procs_lock = threading.Lock()
        self.sysfs: IbSysfs | None = None
        self._running = False

    @property
    def dir(self) -> Path:
        return Path(self._tmp.name)

    def host_dir(self, host: str) -> Path:
        return self.dir / host

    # ------------------------------------------------------------------ lifecycle
    def start(self) -> "SshdHosts":
        reason = sshd_missing()
        if reason:
            raise SshdHostError(f"sshd hosts unavailable: {reason}")
        # A short path: the tools' UNIX sockets live here (108 bytes at most)
        self._tmp = tempfile.TemporaryDirectory(prefix="hil-sshd-")
        try:
            self._start()
        except BaseException:
            self.stop()
            raise
        return self

    def _start(self) -> None:
        d = self.dir
        os.chmod(d, 0o755)
        shim = build_shim()
        (d / "lower" / "infiniband").mkdir(parents=True)  # the mount point the overlay adds to /sys/class
        self.log_dir.mkdir(parents=True, exist_ok=True)
        os.makedirs("/run/sshd", mode=0o755, exist_ok=True)  # Debian's privilege separation directory
        for host in self.bench.hosts:
            h = self.host_dir(host)
            for sub in ("bin", "home", "infiniband"):
                (h / sub).mkdir(parents=True)
            for tool in HARDWARE_TOOLS:
                shutil.copy2(shim, h / "bin" / tool)
            for name in ("ssh_host_ed25519_key", "id_ed25519"):
                _run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-C", f"{name}@{host}", "-f", str(h / name)])
            shutil.copy(h / "id_ed25519.pub", h / "authorized_keys")
            listener = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
            listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            listener.bind(("127.0.0.1", 0))
            listener.listen(64)
            self._listeners[host] = listener
            self.ports[host] = port = listener.getsockname()[1]
            self.connections[host] = 0
            key_type, key = (h / "ssh_host_ed25519_key.pub").read_text().split()[:2]
            (h / "known_hosts").write_text(f"[127.0.0.1]:{port} {key_type} {key}\n")
            (h / "sshd_config").write_text("\n".join([
                f"HostKey {h / 'ssh_host_ed25519_key'}", f"AuthorizedKeysFile {h / 'authorized_keys'}",
                "PasswordAuthentication no", "KbdInteractiveAuthentication no", "PubkeyAuthentication yes",
                f"AllowUsers {self.user}", "PermitRootLogin prohibit-password", "UsePAM no", "StrictModes no",
                "PrintMotd no", "PrintLastLog no", "PidFile none", "LogLevel VERBOSE",
                f"SetEnv PATH={h / 'bin'}:{STANDARD_PATH}", ""]))
            _run([SSHD, "-t", "-f", str(h / "sshd_config")])
            self.tools[host] = ToolServer(self.bench, host, h / "tools.sock")
        self.sysfs = IbSysfs(self.bench, {host: self.host_dir(host) / "infiniband" for host in self.bench.hosts},
                             self.plane.submit)
        self._running = True
        for host, listener in self._listeners.items():
            threading.Thread(target=self._accept, args=(host, listener), name=f"sshd-{host}", daemon=True).start()

    def _command(self, host: str) -> list[str]:
        """`sshd -i` in the host's namespace, after giving its mount namespace the host's home and RDMA sysfs."""
        h = self.host_dir(host)
        script = ('mount -t overlay hil-sys-class -o "lowerdir=/sys/class:$1" /sys/class && '
                  'mount --bind "$2" /sys/class/infiniband && mount --bind "$3" "$4" && '
                  f'exec {SSHD} -i -e -f "$5"')
        return ["ip", "netns", "exec", self.plane.netns_of(host), "sh", "-c", script, "sh", str(self.dir / "lower"),
                str(h / "infiniband"), str(h / "home"), self._home_of_user, str(h / "sshd_config")]

    def _accept(self, host: str, listener: socket.socket) -> None:
        command = self._command(host)
        log_path = self.log_dir / f"sshd-{host}.log"
        while self._running:
            try:
                conn, _ = listener.accept()
            except OSError:
                return
            with conn, open(log_path, "ab") as log_file:
                try:
                    proc = subprocess.Popen(command, stdin=conn, stdout=conn, stderr=log_file)
                except OSError as exc:
                    log.error("sshd host %s: %s", host, exc)
                    continue
            with self._procs_lock:
                self._procs = [p for p in self._procs if p.poll() is None] + [proc]
                self.connections[host] += 1

    def stop(self) -> None:
        self._running = False
        for listener in self._listeners.values():
            try:
                listener.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass
            listener.close()
        self._listeners.clear()
        # Every process in the hosts' namespaces was started from here (sshd and its sessions)
        for host in self.bench.hosts:
            pids = subprocess.run(["ip", "netns", "pids", self.plane.netns_of(host)], capture_output=True,
                                  text=True).stdout.split()
            for pid in pids:
                try:
                    os.kill(int(pid), 9)
                except (ProcessLookupError, ValueError):
                    pass
        with self._procs_lock:
            procs, self._procs = self._procs, []
        for proc in procs:
            try:
                proc.wait(timeout=5)
            except subprocess.TimeoutExpired:
                pass
        if self.sysfs is not None:
            self.sysfs.stop()
            self.sysfs = None
        for tools in self.tools.values():
            tools.stop()
        self.tools.clear()
        if self._tmp is not None:
            self._tmp.cleanup()
            self._tmp = None

    # ------------------------------------------------------------------ views
    def resource(self, host: str) -> HostResource:
        h = self.host_dir(host)
        return HostResource(name=host, address="127.0.0.1", port=self.ports[host], user=self.user,
                            identity_file=str(h / "id_ed25519"), known_hosts=str(h / "known_hosts"),
                            strict_host_key=True)

    def realised(self) -> dict[tuple[str, str, str, str, int], tuple[int, int]]:
        """(host, netdev, field, value, due ns) -> (from, to) harness ns: when a change the physics made at its due
        time was visible to the host (the veth's carrier, the RDMA state file)."""
        out = dict(self.plane.realised)
        if self.sysfs is not None:
            out.update(self.sysfs.realised)
        return out
