"""A real data plane for the emulated bench: network namespaces, veth pairs and an OCS cross-connect.

Each emulated host gets a namespace (`<prefix>h1`, ...) holding one veth end per NIC port, named like the
NIC (`ens1f0np0`), with the NIC's MAC and an address in 198.18.0.0/15. The other ends live in one OCS
namespace (`<prefix>ocs`). The OCS is a `tc` ingress u32 filter per port: while the mirror of a patch
X.tx → Y.rx is settled and Y's port is ACTIVE (the physics' first packet follows the receiver's port_active),
frames entering X's OCS-side veth leave on Y's; otherwise they are discarded.
The physics (OpticalBench) drives the carrier: the OCS-side veth of port X is up exactly while X's
`carrier` is 1, so host X's veth shows carrier and frames flow only then.

Mirror moves (u32+mirred filter replace/delete) and carrier changes (link up/down) are raw rtnetlink
requests on one socket opened inside the OCS namespace: tens of µs each, where a `tc` or `ip` fork costs
milliseconds (benchmarks/bench_probe.py). They run in order on one worker thread, never on the bench's.

Real processes in the namespaces read the machine's real clock, so a bench with a data plane must give
its hosts clock offset 0 and drift 0 (profile `hosts: {clock_offset_ms: [0, 0], drift_ppm: [0, 0]}`);
`start()` refuses otherwise. Needs root. Traffic stays inside the namespaces this object creates.
"""
from __future__ import annotations

import ctypes
import errno
import hashlib
import ipaddress
import logging
import os
import queue
import re
import shutil
import socket
import struct
import subprocess
import tempfile
import threading
import time
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Iterator

from devices.emulated.nic import NicChange, NicModel
from devices.emulated.physics import OpticalBench
from devices.timing import now_ns

log = logging.getLogger(__name__)

PORT_NETWORK = ipaddress.ip_network("198.18.0.0/15")  # RFC 2544 benchmarking range
OCS_IFINDEX_BASE = 1000  # OCS-side ifindex = base + ingress port; never equal to the host side's
FILTER_PREF = 10
FILTER_HANDLE = "800::800"
CLONE_NEWNET = 0x40000000
_NAME = re.compile(r"[a-z][a-z0-9_-]{0,11}")

# rtnetlink and tc constants (linux/rtnetlink.h, pkt_sched.h, pkt_cls.h, tc_act/tc_mirred.h)
_NLMSG_ERROR = 2
_RTM_NEWLINK, _RTM_NEWTFILTER, _RTM_DELTFILTER = 16, 44, 45
_NLM_F_REQUEST, _NLM_F_ACK, _NLM_F_CREATE = 0x1, 0x4, 0x400
_IFF_UP = 0x1
_ETH_P_ALL = 0x0003
_TC_H_INGRESS = 0xFFFF0000  # parent ffff:
_U32_HANDLE = 0x80000800  # 800::800
_TCA_KIND, _TCA_OPTIONS = 1, 2
_TCA_U32_SEL, _TCA_U32_ACT = 5, 7
_TC_U32_TERMINAL = 1
_TCA_ACT_KIND, _TCA_ACT_OPTIONS = 1, 2
_TCA_MIRRED_PARMS = 2
_TC_ACT_STOLEN = 4
_TCA_EGRESS_REDIR = 1


class NetnsError(RuntimeError):
    """The data plane could not be built or changed (a failed `ip`/`tc` command, or no permission)."""


@dataclass(frozen=True)
class PortPlane:
    """Where one NIC port lives in the data plane."""

    model: NicModel
    netns: str  # the host's namespace; the veth there is named model.netdev
    ip: str  # host-side address, prefix PORT_NETWORK.prefixlen
    ocs_dev: str  # OCS-side veth name in the OCS namespace
    ocs_ifindex: int


def _run(argv: list[str], stdin: str | None = None) -> str:
    done = subprocess.run(argv, input=stdin, capture_output=True, text=True)
    if done.returncode != 0:
        raise NetnsError(f"{' '.join(argv[:6])}{' …' if len(argv) > 6 else ''} failed: "
                         f"{(done.stderr or done.stdout).strip()}")
    return done.stdout


def netns_available() -> str | None:
    """None when namespaces can be made here, else the reason they cannot."""
    if os.geteuid() != 0:
        return "needs root"
    if shutil.which("ip") is None or shutil.which("tc") is None:
        return "needs iproute2 (ip, tc)"
    name = f"hilchk{os.getpid()}"
    try:
        _run(["ip", "netns", "add", name])
    except NetnsError as exc:
        return f"`ip netns add` does not work here: {exc}"
    subprocess.run(["ip", "netns", "del", name], capture_output=True)
    return None


def list_netns() -> list[str]:
    out = subprocess.run(["ip", "netns", "list"], capture_output=True, text=True).stdout
    return [line.split()[0] for line in out.splitlines() if line.strip()]


_libc = None


def _setns(fd: int) -> None:
    global _libc
    if hasattr(os, "setns"):  # Python >= 3.12
        os.setns(fd, CLONE_NEWNET)
        return
    if _libc is None:
        _libc = ctypes.CDLL(None, use_errno=True)
    if _libc.setns(fd, CLONE_NEWNET) != 0:
        err = ctypes.get_errno()
        raise OSError(err, os.strerror(err))


@contextmanager
def in_netns(name: str) -> Iterator[None]:
    """Run the body with this thread in namespace `name` (sockets made here stay in it)."""
    home = os.open("/proc/thread-self/ns/net", os.O_RDONLY)
    target = os.open(f"/run/netns/{name}", os.O_RDONLY)
    try:
        _setns(target)
        try:
            yield
        finally:
            _setns(home)
    finally:
        os.close(target)
        os.close(home)


_libc_gil = None


def gil_libc():
    """The C library through ctypes.PyDLL: its calls keep the GIL, so no other thread of this process runs between
    clock reads taken just before and after one (a kernel change the call makes is then dated to within the call,
    not to within the wait for the GIL after it)."""
    global _libc_gil
    if _libc_gil is None:
        libc = ctypes.PyDLL(None, use_errno=True)
        libc.send.argtypes = [ctypes.c_int, ctypes.c_char_p, ctypes.c_size_t, ctypes.c_int]
        libc.send.restype = ctypes.c_ssize_t
        libc.pwrite.argtypes = [ctypes.c_int, ctypes.c_char_p, ctypes.c_size_t, ctypes.c_long]
        libc.pwrite.restype = ctypes.c_ssize_t
        libc.ftruncate.argtypes = [ctypes.c_int, ctypes.c_long]
        libc.ftruncate.restype = ctypes.c_int
        _libc_gil = libc
    return _libc_gil


def _attr(kind: int, payload: bytes) -> bytes:
    """One netlink attribute (type, length, payload padded to 4 bytes)."""
    length = 4 + len(payload)
    return struct.pack("=HH", length, kind) + payload + b"\0" * (-length % 4)


class Rtnetlink:
    """Link up/down and u32+mirred ingress filters over an rtnetlink socket bound to one namespace: the
    same requests `ip link set` and `tc filter replace|del` send, without a fork (tens of µs, not ms)."""

    def __init__(self, netns: str):
        with in_netns(netns):
            self._sock = socket.socket(socket.AF_NETLINK, socket.SOCK_RAW, socket.NETLINK_ROUTE)
        self._sock.bind((0, 0))
        self._sock.settimeout(2.0)
        self._seq = 0

    def _request(self, kind: int, flags: int, body: bytes, what: str, missing_ok: bool = False) -> tuple[int, int]:
        """Send one request and wait for its acknowledgement; returns the monotonic ns just before and just after
        the send, within which the kernel carried it out (rtnetlink handles a request in the sender's call)."""
        self._seq += 1
        header = struct.pack("=IHHII", 16 + len(body), kind, _NLM_F_REQUEST | _NLM_F_ACK | flags, self._seq, 0)
        data = header + body
        libc = gil_libc()
        sent = now_ns()
        n = libc.send(self._sock.fileno(), data, len(data), 0)
        done = now_ns()
        if n != len(data):
            err = ctypes.get_errno()
            raise NetnsError(f"{what}: {os.strerror(err) if n < 0 else 'short send'}")
        while True:
            reply = self._sock.recv(65536)
            _, reply_kind, _, seq, _ = struct.unpack_from("=IHHII", reply)
            if reply_kind == _NLMSG_ERROR and seq == self._seq:
                error = -struct.unpack_from("=i", reply, 16)[0]
                if error and not (missing_ok and error in (errno.ENOENT, errno.EINVAL)):
                    raise NetnsError(f"{what}: {os.strerror(error)}")
                return sent, done

    def set_up(self, ifindex: int, up: bool) -> tuple[int, int]:
        """`ip link set DEV up|down`; returns when it happened (`_request`)."""
        ifinfo = struct.pack("=BxHiII", socket.AF_UNSPEC, 0, ifindex, _IFF_UP if up else 0, _IFF_UP)
        return self._request(_RTM_NEWLINK, 0, ifinfo, f"link {ifindex} {'up' if up else 'down'}")

    @staticmethod
    def _tcmsg(ifindex: int, handle: int) -> bytes:
        info = (FILTER_PREF << 16) | socket.htons(_ETH_P_ALL)
        return struct.pack("=BxxxiIII", socket.AF_UNSPEC, ifindex, handle, _TC_H_INGRESS, info)

    def redirect(self, ifindex: int, target_ifindex: int) -> None:
        """`tc filter replace dev IN parent ffff: protocol all pref P handle 800::800 u32 match u32 0 0
        action mirred egress redirect dev OUT`."""
        selector = struct.pack("=BBBxHHhhI", _TC_U32_TERMINAL, 0, 1, 0, 0, 0, 0, 0)
        selector += struct.pack("=IIii", 0, 0, 0, 0)  # one key: mask 0, value 0 (matches every frame)
        mirred = struct.pack("=IIiiiiI", 0, 0, _TC_ACT_STOLEN, 0, 0, _TCA_EGRESS_REDIR, target_ifindex)
        action = _attr(_TCA_ACT_KIND, b"mirred\0") + _attr(_TCA_ACT_OPTIONS, _attr(_TCA_MIRRED_PARMS, mirred))
        options = _attr(_TCA_U32_SEL, selector) + _attr(_TCA_U32_ACT, _attr(1, action))  # action order 1
        body = self._tcmsg(ifindex, _U32_HANDLE) + _attr(_TCA_KIND, b"u32\0") + _attr(_TCA_OPTIONS, options)
        self._request(_RTM_NEWTFILTER, _NLM_F_CREATE, body, f"redirect {ifindex} -> {target_ifindex}")

    def unredirect(self, ifindex: int) -> None:
        """`tc filter del dev IN parent ffff: protocol all pref P` (no error if there is none)."""
        self._request(_RTM_DELTFILTER, 0, self._tcmsg(ifindex, 0), f"unredirect {ifindex}", missing_ok=True)

    def close(self) -> None:
        self._sock.close()


class NetnsPlane:
    """The namespaces, veths and cross-connect of one OpticalBench. Use as a context manager."""

    def __init__(self, bench: OpticalBench, prefix: str):
        if not _NAME.fullmatch(prefix):
            raise ValueError(f"netns prefix must match {_NAME.pattern}, got {prefix!r}")
        self.bench = bench
        self.prefix = prefix
        self.ocs_netns = f"{prefix}ocs"
        self.host_netns = {host: f"{prefix}h{i + 1}" for i, host in enumerate(bench.hosts)}
        self.ports: dict[str, PortPlane] = {}
        for i, model in enumerate(bench.all_nic_ports()):
            self.ports[model.key] = PortPlane(
                model=model, netns=self.host_netns[model.host], ip=str(PORT_NETWORK[i + 1]),
                ocs_dev=f"t{model.ocs_tx}r{model.ocs_rx}", ocs_ifindex=OCS_IFINDEX_BASE + model.ocs_tx)
        self._by_tx = {p.model.ocs_tx: p for p in self.ports.values()}
        self._by_rx = {p.model.ocs_rx: p for p in self.ports.values()}
        self._created: list[str] = []
        self._redirects: dict[int, int] = {}  # ingress -> egress currently wired
        self._mirrors: dict[int, int] = {}  # ingress -> egress of each settled mirror
        self._active: set[str] = set()  # ports whose state is ACTIVE
        self._lit_by: dict[int, int] = {}  # egress -> the ingress of its last settled mirror
        self._wiring = threading.Lock()  # the three above: mirrors come with the bench's lock, states without
        self._ops: queue.SimpleQueue = queue.SimpleQueue()
        self._worker: threading.Thread | None = None
        self._netlink: Rtnetlink | None = None
        self._unsubscribes: list[Callable[[], None]] = []
        self._procs: list[subprocess.Popen] = []
        self._agent_dir: tempfile.TemporaryDirectory | None = None
        self._agent_lock = threading.Lock()  # hosts' command threads upload the same agent at once
        self.errors: list[str] = []
        self.op_log: list[tuple[str, str, int, int]] = []  # (kind, port key, queued mono ns, done mono ns)
        # (host, netdev, "carrier", "0"|"1", the physics' due ns) -> mono ns just before and after its request
        self.realised: dict[tuple[str, str, str, str, int], tuple[int, int]] = {}

    # ------------------------------------------------------------------ lifecycle
    def start(self) -> "NetnsPlane":
        reason = netns_available()
        if reason:
            raise NetnsError(f"network namespaces unavailable: {reason}")
        for host in self.bench.hosts:
            clock = self.bench.host_clock_params(host)
            if clock["offset_ns"] or clock["drift_ppm"]:
                raise NetnsError(f"host {host} has clock offset {clock['offset_ns']} ns / drift "
                                 f"{clock['drift_ppm']} ppm; a netns bench needs 0 and 0 (real processes "
                                 "read the real clock)")
        if self.bench.ocs_patches():
            raise NetnsError("start the data plane before the first patch")
        clash = set(list_netns()) & {self.ocs_netns, *self.host_netns.values()}
        if clash:
            raise NetnsError(f"namespaces already exist: {', '.join(sorted(clash))}")
        try:
            self._build()
            self._netlink = Rtnetlink(self.ocs_netns)
            self._worker = threading.Thread(target=self._work, name=f"netns-{self.prefix}", daemon=True)
            self._worker.start()
            self.bench.on_mirror.append(self._on_mirror)
            for host in self.bench.hosts:
                self._unsubscribes.append(self.bench.subscribe(host, self._on_change))
            for port in self.ports.values():  # carrier already up (light without patches: never, but be exact)
                if self.bench.nic_snapshot(port.model.host, port.model.netdev).carrier:
                    self._ops.put(("carrier", now_ns(), port, True, None))
        except BaseException:
            self.stop()
            raise
        return self

    def _build(self) -> None:
        for name in [self.ocs_netns, *self.host_netns.values()]:
            _run(["ip", "netns", "add", name])
            self._created.append(name)
            # No IPv6 chatter (router/neighbour solicitations) on the emulated links.
            _run(["ip", "netns", "exec", name, "sysctl", "-qw", "net.ipv6.conf.all.disable_ipv6=1",
                  "net.ipv6.conf.default.disable_ipv6=1"])
        root_batch = []
        for p in self.ports.values():
            root_batch.append(f"link add {p.model.netdev} netns {p.netns} index {p.model.ifindex} address "
                              f"{p.model.mac} type veth peer name {p.ocs_dev} netns {self.ocs_netns} "
                              f"index {p.ocs_ifindex}")
        _run(["ip", "-batch", "-"], "\n".join(root_batch) + "\n")
        for host, netns in self.host_netns.items():
            batch = ["link set lo up"]
            for p in self.ports.values():
                if p.model.host == host:
                    batch += [f"addr add {p.ip}/{PORT_NETWORK.prefixlen} dev {p.model.netdev}",
                              f"link set {p.model.netdev} up"]
            _run(["ip", "-n", netns, "-batch", "-"], "\n".join(batch) + "\n")
        tc = []
        for p in self.ports.values():  # OCS-side veths stay admin-down until the physics says carrier
            tc.append(f"qdisc add dev {p.ocs_dev} ingress")
        _run(["tc", "-n", self.ocs_netns, "-batch", "-"], "\n".join(tc) + "\n")

    def stop(self) -> None:
        """Stop following the bench, end started processes, delete every namespace this plane created."""
        self.bench.unwatch_mirror(self._on_mirror)
        for unsubscribe in self._unsubscribes:
            unsubscribe()
        self._unsubscribes.clear()
        if self._worker is not None:
            self._ops.put(None)
            self._worker.join(timeout=10)
            self._worker = None
        if self._netlink is not None:
            self._netlink.close()
            self._netlink = None
        for proc in self._procs:
            if proc.poll() is None:
                proc.kill()
            try:
                proc.wait(timeout=5)
            except subprocess.TimeoutExpired:
                pass
        self._procs.clear()
        for name in reversed(self._created):
            done = subprocess.run(["ip", "netns", "del", name], capture_output=True, text=True)
            if done.returncode != 0:
                self.errors.append(f"ip netns del {name}: {done.stderr.strip()}")
        self._created.clear()
        if self._agent_dir is not None:
            self._agent_dir.cleanup()
            self._agent_dir = None

    def __enter__(self) -> "NetnsPlane":
        return self.start()

    def __exit__(self, *exc) -> None:
        self.stop()

    # ------------------------------------------------------------------ following the physics
    def _on_mirror(self, t_ns: int, ingress: int, egress: int, settled: bool) -> None:
        """Called by the bench with its lock held: only queue work."""
        if ingress not in self._by_tx:
            return
        with self._wiring:
            if settled:
                self._mirrors[ingress] = egress
                target = self._by_rx.get(egress)
                if target is not None and self._lit_by.get(egress) != ingress:
                    # A new far end: the receiver trains again before it is active, whether or not the change
                    # that says so (delivered after this call, outside the bench's lock) has come yet.
                    self._active.discard(target.model.key)
                self._lit_by[egress] = ingress
            elif self._mirrors.get(ingress) == egress:
                del self._mirrors[ingress]
            self._rewire(ingress)

    def _rewire(self, ingress: int) -> None:
        """Wire `ingress` to the NIC its settled mirror lights, once that port is ACTIVE; else unwire it. The
        physics' first packet comes after the receiving port is active (a frame before would bound its
        port_active from above, before it happened). Holding `_wiring`."""
        target = self._by_rx.get(self._mirrors.get(ingress, -1))
        if target is not None and target.model.key not in self._active:
            target = None
        want = None if target is None else target.model.ocs_rx
        if self._redirects.get(ingress) == want:
            return
        if want is None:
            del self._redirects[ingress]
        else:
            self._redirects[ingress] = want
        self._ops.put(("redirect", now_ns(), self._by_tx[ingress], target, None))

    def _on_change(self, change: NicChange) -> None:
        port = self.ports.get(f"{change.host}:{change.netdev}")
        if port is None:
            return
        if change.field == "carrier":
            self._ops.put(("carrier", now_ns(), port, change.value == "1", change.t_ns))
        elif change.field == "state":
            with self._wiring:
                key = port.model.key
                if (change.value == "ACTIVE") == (key in self._active):
                    return
                if change.value == "ACTIVE":
                    self._active.add(key)
                else:
                    self._active.discard(key)
                for ingress, egress in list(self._mirrors.items()):
                    if egress == port.model.ocs_rx:
                        self._rewire(ingress)

    def _work(self) -> None:
        while True:
            op = self._ops.get()
            if op is None:
                return
            kind, queued, port, arg, due = op
            if kind == "barrier":
                arg.set()
                continue
            if kind == "call":
                try:
                    arg()
                except Exception:  # the caller's own work: logged, the plane goes on
                    log.exception("netns plane %s: queued call failed", self.prefix)
                    self.errors.append(f"queued call {arg!r} failed")
                continue
            try:
                if kind == "carrier":
                    window = self._netlink.set_up(port.ocs_ifindex, arg)
                    if due is not None:  # the host side's carrier changed with the OCS side's admin state
                        self.realised[(port.model.host, port.model.netdev, "carrier", str(int(arg)), due)] = window
                elif arg is None:
                    self._netlink.unredirect(port.ocs_ifindex)
                else:
                    self._netlink.redirect(port.ocs_ifindex, arg.ocs_ifindex)
            except (NetnsError, OSError) as exc:
                log.error("netns plane %s: %s", self.prefix, exc)
                self.errors.append(str(exc))
            self.op_log.append((kind, port.model.key, queued, now_ns()))

    def tc_command(self, source: PortPlane, target: PortPlane | None) -> list[str]:
        """The `tc` command equivalent to what the plane sends over netlink to wire `source` to `target`,
        or to unwire it. This kernel has no gact (`action drop`), so an unpatched port has no filter: its
        frames reach the OCS namespace's own stack, which has no address and does not forward them."""
        where = ["tc", "-n", self.ocs_netns, "filter"]
        common = ["dev", source.ocs_dev, "parent", "ffff:", "protocol", "all", "pref", str(FILTER_PREF)]
        if target is None:
            return [*where, "del", *common]
        return [*where, "replace", *common, "handle", FILTER_HANDLE, "u32", "match", "u32", "0", "0",
                "action", "mirred", "egress", "redirect", "dev", target.ocs_dev]

    def submit(self, work: Callable[[], None]) -> None:
        """Run `work` on the plane's worker, in order with the carrier and wiring changes queued before and after
        it (a host-visible change made elsewhere then keeps the physics' order with these)."""
        self._ops.put(("call", now_ns(), None, work, None))

    def settle(self, timeout: float = 5.0) -> bool:
        """Block until every queued data-plane change is applied (for tests and benchmarks)."""
        done = threading.Event()
        self._ops.put(("barrier", now_ns(), None, done, None))
        return done.wait(timeout)

    # ------------------------------------------------------------------ direct control
    def set_carrier(self, host: str, netdev: str, up: bool) -> int:
        """Bypass the physics: set port's OCS-side veth up/down now (benchmarks). Returns the realtime ns
        just before the netlink request."""
        if self._netlink is None:
            raise NetnsError("plane not started")
        port = self.port(host, netdev)
        sent = time.time_ns()
        self._ops.put(("carrier", now_ns(), port, up, None))
        return sent

    # ------------------------------------------------------------------ views
    def port(self, host: str, netdev: str) -> PortPlane:
        try:
            return self.ports[f"{host}:{netdev}"]
        except KeyError:
            raise KeyError(f"no NIC {netdev} on host {host}") from None

    def netns_of(self, host: str) -> str:
        return self.host_netns[host]

    def redirects(self) -> dict[int, int]:
        """ingress -> egress as currently wired (or queued to be)."""
        return dict(self._redirects)

    def run_in(self, host: str, argv: list[str], **popen_kwargs) -> subprocess.Popen:
        """Start `argv` inside `host`'s namespace (`ip netns exec`). stop() kills it if still running."""
        proc = subprocess.Popen(["ip", "netns", "exec", self.host_netns[host], *argv], **popen_kwargs)
        self._procs.append(proc)
        return proc

    def agent_file(self, source: bytes) -> str:
        """A local copy of an uploaded agent program that processes in the namespaces can run.

        Under a lock, and written whole before it is visible: two hosts' commands start the agent at once, and
        unlocked, a second directory replaced the first (whose finalizer then deleted it under the first
        command), or a process ran the file while it was still being written (no output at all)."""
        with self._agent_lock:
            if self._agent_dir is None:
                self._agent_dir = tempfile.TemporaryDirectory(prefix="hil-netns-agent-")
            path = Path(self._agent_dir.name) / f"hilagent-{hashlib.sha256(source).hexdigest()[:12]}.py"
            if not path.exists():
                partial = path.with_suffix(".partial")
                partial.write_bytes(source)
                os.replace(partial, path)
            return str(path)


# ---------------------------------------------------------------------- emulated SSH host passthrough
PASSTHROUGH_AGENT = ("probe-send", "probe-recv")


def _pump(ctx, proc: subprocess.Popen, stops_on_stdin_eof: bool) -> int:
    """Relay a real process's stdout/stderr to an SSH channel until the client closes stdin or goes away;
    then end the process (by closing its stdin if it stops on EOF, else by SIGTERM)."""
    from devices.emulated.host.context import ChannelGone

    def relay(read, write):
        try:
            for data in iter(read, b""):
                write(data)
        except ChannelGone:
            pass

    # stdout as the process wrote it (what one write of the agent's holds goes on in one SSH packet, not a line
    # each); stderr by lines, each decoded whole
    threads = [threading.Thread(target=relay, args=(lambda: proc.stdout.read1(65536), ctx.out), daemon=True),
               threading.Thread(target=relay, args=(proc.stderr.readline,
                                                    lambda b: ctx.err(b.decode(errors="replace"))), daemon=True)]
    for thread in threads:
        thread.start()
    try:
        watcher = threading.Thread(target=ctx.wait_stdin_eof_or_gone, daemon=True)
        watcher.start()
        while watcher.is_alive() and proc.poll() is None:
            watcher.join(0.05)
    finally:
        if proc.poll() is None:
            try:
                proc.stdin.close()  # the agent stops on stdin EOF and prints its summary
            except OSError:
                pass
            if not stops_on_stdin_eof:
                proc.terminate()
            try:
                proc.wait(timeout=5)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
        for thread in threads:
            thread.join(timeout=5)
    return proc.returncode if proc.returncode >= 0 else 128 - proc.returncode


def _modelled_probe(bench: OpticalBench, host: str, agent_args: list[str]) -> list[str]:
    """Mirror a real `probe-send` in the physics' probe model, so the ground truth keeps its modelled
    `first_packet` events (the real receiver's kernel timestamps are the measurement); the ports started."""
    if agent_args[0] != "probe-send":
        return []
    pairs = list(zip(agent_args[1::2], agent_args[2::2]))
    ifaces = [value for name, value in pairs if name == "--iface"]
    interval = dict(pairs).get("--interval-us", "")
    if not interval.isdigit() or int(interval) <= 0:
        return []
    started = []
    for iface in ifaces:
        try:
            bench.probe_start(host, iface, int(interval) * 1000)
        except KeyError:
            continue
        started.append(iface)
    return started


def passthrough_commands(plane: NetnsPlane, host: str) -> dict:
    """Command handlers for `EmulatedHostServer(..., extra_commands=...)` that run the real tools inside
    `host`'s namespace: `ip ... monitor ...`, and the uploaded agent's probe-send / probe-recv. Every
    other command (and the agent's timesrv and watch, which read the physics' full NIC state) stays
    emulated."""
    from devices.emulated.host.server import DEFAULT_COMMANDS
    from devices.emulated.host.shell import PYTHON_NAMES
    from devices.emulated.host.shell import run_python as emulated_python  # file checks, usage, other subcommands

    emulated_ip = DEFAULT_COMMANDS["ip"]

    def ip(ctx, argv: list[str]) -> int:
        if "monitor" not in argv[1:]:
            return emulated_ip(ctx, argv)
        proc = plane.run_in(host, ["ip", *argv[1:]], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE)
        return _pump(ctx, proc, stops_on_stdin_eof=False)

    def python(ctx, argv: list[str]) -> int:
        args = [a for a in argv[1:] if a != "-u"]
        if len(args) >= 2 and args[1] in PASSTHROUGH_AGENT:
            with ctx.server.fs.lock:
                source = ctx.server.fs.files.get(ctx.path(args[0]))
            if source is not None:
                local = plane.agent_file(source if isinstance(source, bytes) else source.encode())
                proc = plane.run_in(host, ["python3", "-u", local, *args[1:]], stdin=subprocess.PIPE,
                                    stdout=subprocess.PIPE, stderr=subprocess.PIPE)
                modelled = _modelled_probe(ctx.bench, host, args[1:])
                try:
                    return _pump(ctx, proc, stops_on_stdin_eof=True)
                finally:
                    for iface in modelled:
                        ctx.bench.probe_stop(host, iface)
        return emulated_python(ctx, argv)

    return {"ip": ip, **{name: python for name in PYTHON_NAMES}}
