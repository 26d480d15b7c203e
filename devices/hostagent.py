"""Driver for the host agent (devices/agent/hilagent.py): install it over a CommandTransport, then use its
time responder, local watcher, counter sampler and probes. The protocol is in ARCHITECTURE.md ("Host agent protocol")."""
from __future__ import annotations

import re
import secrets
import shlex
from typing import Iterable, Sequence

from devices.errors import DeviceError
from devices.protocols import CommandTransport, LineStream
from devices.records import record
from devices.timing import Deadline

WATCH_FIELDS = ("rx_los", "rx_lol", "carrier", "operstate", "phys_state", "state", "module_state")  # CMIS: ethtool -m


def sysfs_watch_fields(rdma: bool) -> tuple[str, ...]:
    """The fields `watch` polls from sysfs for one port, each printed first as its current value (with its
    RDMA device: also the IB port's); rx_los/rx_lol come from `ethtool -m`, on their own thread, if at all."""
    return ("carrier", "operstate") + (("phys_state", "state") if rdma else ())


@record
class WatchLine:
    """One watcher line: `field` of `netdev` changed to `value`, seen by the poll at host time `host_ns`;
    the change happened in (host_ns - interval_ns, host_ns]."""

    host_ns: int
    netdev: str
    field: str
    value: str
    interval_ns: int


@record
class ProbeLine:
    """`first`: the first probe after a silence; `last`: the last probe before one. Kernel rx time."""

    host_ns: int
    kind: str
    src_mac: str
    seq: int


@record
class CounterLine:
    """One counter sample: RDMA `port` ("dev/port") had sent `xmit_words` and received `rcv_words` (octets / 4)
    at some instant within [host_ns - read_ns, host_ns]."""

    host_ns: int
    port: str
    xmit_words: int
    rcv_words: int
    read_ns: int


HOST_INT_END = 2**63  # a host number is below this: it fits every int64 column of the record


def host_int(text: str, what: str, line: str) -> int:
    """A number an agent printed (a host time in ns, an interval, a counter): 0 <= value < 2**63, so it fits
    every int64 column of the record; anything else is the host's fault, said for that line alone."""
    value = int(text)
    if not 0 <= value < HOST_INT_END:
        raise DeviceError(f"agent {what}: {_digits(text)} out of range 0..2**63-1 in {line[:200]!r}")
    return value


def _digits(text: str) -> str:
    return text if len(text) <= 24 else f"{text[:20]}... ({len(text)} digits)"


def parse_counter_line(line: str) -> CounterLine:
    parts = line.split()
    if len(parts) != 5 or "/" not in parts[1]:
        raise DeviceError(f"agent counters: expected 'HOST_NS RDMADEV/PORT XMIT RCV READ_NS', got {line!r}")
    try:
        return CounterLine(host_int(parts[0], "counters", line), parts[1], host_int(parts[2], "counters", line),
                           host_int(parts[3], "counters", line), host_int(parts[4], "counters", line))
    except ValueError:
        raise DeviceError(f"agent counters: bad number in {line!r}") from None


HEARTBEAT = "alive"  # `watch --heartbeat-us`: `HOST_NS alive`, printed after that long without a line


def watch_heartbeat(line: str) -> int | None:
    """The host time of a watch heartbeat line (`HOST_NS alive`), None for any other line."""
    parts = line.split()
    if len(parts) != 2 or parts[1] != HEARTBEAT:
        return None
    try:
        return int(parts[0])
    except ValueError:
        raise DeviceError(f"agent watch: bad number in {line!r}") from None


def parse_watch_line(line: str) -> WatchLine:
    return WatchLine(*watch_line_fields(line))


def watch_line_fields(line: str) -> tuple[int, str, str, str, int]:
    """`parse_watch_line`'s fields as a tuple: a host reader makes its own record of each line (a cycle's
    burst is hundreds of lines, each object made once less)."""
    parts = line.split()
    if len(parts) != 5 or parts[2] not in WATCH_FIELDS:
        raise DeviceError(f"agent watch: expected 'HOST_NS NETDEV FIELD VALUE INTERVAL_NS', got {line!r}")
    try:
        return host_int(parts[0], "watch", line), parts[1], parts[2], parts[3], host_int(parts[4], "watch", line)
    except ValueError:
        raise DeviceError(f"agent watch: bad number in {line!r}") from None


def parse_probe_line(line: str) -> ProbeLine:
    """A line of a receiver over one port (`HOST_NS first|last SRC_MAC SEQ`)."""
    parts = line.split()
    if len(parts) != 4 or parts[1] not in ("first", "last"):
        raise DeviceError(f"agent probe-recv: expected 'HOST_NS first|last SRC_MAC SEQ', got {line!r}")
    return _probe_line(parts, line)


def parse_port_probe_line(line: str) -> tuple[str, ProbeLine]:
    """A line of a receiver over several ports (`HOST_NS first|last SRC_MAC SEQ NETDEV`): (its port, the probe)."""
    parts = line.split()
    if len(parts) != 5 or parts[1] not in ("first", "last"):
        raise DeviceError(f"agent probe-recv: expected 'HOST_NS first|last SRC_MAC SEQ NETDEV', got {line!r}")
    return parts[4], _probe_line(parts, line)


def _probe_line(parts: list[str], line: str) -> ProbeLine:
    try:
        return ProbeLine(host_int(parts[0], "probe-recv", line), parts[1], parts[2].lower(),
                         host_int(parts[3], "probe-recv", line))
    except ValueError:
        raise DeviceError(f"agent probe-recv: bad number in {line!r}") from None


class HostAgent:
    """The agent on one host. `install()` uploads it once (content-addressed path), then sub-commands run
    as long-lived streams over the host's one SSH connection."""

    def __init__(self, transport: CommandTransport, python: str = "python3", ethtool: str = "ethtool"):
        self.transport = transport
        self.python = python
        self.ethtool = ethtool  # the path the host runs ethtool by (its inventory `tools:`), for the watch
        self._path: str | None = None
        self.python_version: str | None = None  # MAJOR.MINOR.MICRO of the Python the agent runs under, once installed

    def install(self, deadline: Deadline | None = None) -> str:
        from devices.agent import agent_path, agent_source

        path = agent_path()
        if path.startswith("~/"):
            path = path[2:]  # SSH commands start in the home directory; a quoted "~" would not expand
        quoted = shlex.quote(path)
        folder = shlex.quote(path.rsplit("/", 1)[0])
        deadline = deadline or Deadline(10)
        # written aside, then renamed: hosts that share a home (NFS, as clusters do) install the same path at once,
        # and a `cat >` truncating it under another host's start ran that host's agent on an empty file
        partial = shlex.quote(f"{path}.partial-{secrets.token_hex(6)}")
        self.transport.run(f"mkdir -p {folder} && cat > {partial} && mv -f {partial} {quoted}",
                           stdin=agent_source(), deadline=deadline, check=True)
        self._path = quoted
        # the interpreter it will run under (sudo's, with `become`): a missing or too old one named here, once
        done = self.transport.run(self._cmd("version"), deadline=deadline)
        said = (done.stderr.strip() or done.stdout.strip())[-300:]
        if done.exit_status in (126, 127):
            raise DeviceError(f"agent: cannot run {self.python!r} on the host ({said}); name its Python 3 in the "
                              "inventory (`python:`)")
        if done.exit_status == 3 and "needs Python" in said:
            raise DeviceError(f"agent: {said.removeprefix('hilagent: ')}; name a newer Python 3 in the inventory "
                              "(`python:`)")
        if done.exit_status != 0 or not re.fullmatch(r"\d+\.\d+\.\d+", done.stdout.strip()):
            raise DeviceError(f"agent: {self.python} -u {path} version exited {done.exit_status}: {said!r}")
        self.python_version = done.stdout.strip()
        return path

    def _cmd(self, *args: str) -> str:
        if self._path is None:
            raise DeviceError("host agent not installed: call install() first")
        return " ".join([shlex.quote(self.python), "-u", self._path, *map(shlex.quote, args)])

    def timesrv(self) -> LineStream:
        return self.transport.stream(self._cmd("timesrv"))

    def watch(self, ports: Iterable[tuple[str, str | None, int | None]], interval_us: int,
              ethtool_interval_us: int, heartbeat_us: int = 0) -> LineStream:
        """ports: (netdev, rdma_dev or None, rdma_port or None). `heartbeat_us` > 0: a `HOST_NS alive` line
        (`watch_heartbeat`) after that long without a line, so a silent stream can be told from a quiet port."""
        specs = [n if d is None else f"{n}={d}/{p}" for n, d, p in ports]
        tool = ("--ethtool", self.ethtool) if self.ethtool != "ethtool" else ()
        beat = ("--heartbeat-us", str(int(heartbeat_us))) if heartbeat_us > 0 else ()
        return self.transport.stream(self._cmd("watch", "--interval-us", str(int(interval_us)),
                                               "--ethtool-interval-us", str(int(ethtool_interval_us)), *beat,
                                               *tool, *specs))

    def counters(self, ports: Iterable[tuple[str, int]], interval_us: int) -> LineStream:
        """RDMA data counters of `ports` ((rdma_dev, port)) sampled every `interval_us` on the host."""
        return self.transport.stream(self._cmd("counters", "--interval-us", str(int(interval_us)),
                                               *(f"{d}/{p}" for d, p in ports)))

    def probe_send(self, ports: Sequence[tuple[str, bytes]], interval_us: int) -> LineStream:
        """One sender over `ports` ((netdev, frame template) each): one process and one SSH session for all of a
        host's ports, each port's probe sent every tick."""
        return self.transport.stream(self._cmd("probe-send", *(w for iface, template in ports
                                                                for w in ("--iface", iface, "--template", template.hex())),
                                               "--interval-us", str(int(interval_us))))

    def probe_recv(self, iface: str | Sequence[str], gap_us: int, udp_port: int = 4791) -> LineStream:
        """One receiver over `iface`, or over several ports (a sequence of names) at once: one stream, one process,
        its lines (`parse_port_probe_line`) naming their port, those received together written together."""
        ifaces = [iface] if isinstance(iface, str) else list(iface)
        return self.transport.stream(self._cmd("probe-recv", *(w for n in ifaces for w in ("--iface", n)),
                                               "--gap-us", str(int(gap_us)),
                                               "--udp-port", str(int(udp_port))))
