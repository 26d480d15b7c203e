"""The host agent protocol of ARCHITECTURE.md, emulated: `timesrv`, `watch`, `counters`, `probe-send`,
`probe-recv` of an uploaded agent program (`python3 -u PATH SUBCOMMAND`, devices/agent/hilagent.py)."""
from __future__ import annotations

import posixpath
import random
import shlex
import time
from typing import TYPE_CHECKING, NamedTuple

import paramiko
from paramiko.buffered_pipe import BufferedPipe
from paramiko.common import cMSG_CHANNEL_WINDOW_ADJUST

from devices.emulated import dataplane
from devices.emulated.host.context import ChannelGone, ExecContext, Handler
from devices.emulated.host.net import ETHTOOL_FIELDS, ETHTOOL_STATES
from devices.emulated.host.shell import PYTHON_NAMES, has_tool
from devices.emulated.host.streams import Stream
from devices.emulated.nic import NicChange
from devices.sshhub import HubSocket
from devices.timing import now_ns

if TYPE_CHECKING:
    from devices.emulated.host.server import EmulatedHostServer


WATCH_ETHTOOL_DEFAULT_US = 100_000  # the agent's default --ethtool-interval-us
AGENT_FIELDS = ("rx_los", "rx_lol", "carrier", "operstate", "phys_state", "state")
_COUNTER_BATCH_S = 0.005  # the emulated counter sampler prints its ticks in batches this far apart (cheap)


def runs_agent_timesrv(server: "EmulatedHostServer", command: str) -> bool:
    """`command` is exactly `[exec] python3 [-u] AGENT timesrv` of an uploaded agent, run by the built-in
    handlers (no override): what `TimeResponder` may answer on the hub from the first byte."""
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
            or server.agent_commands.get("timesrv") is not agent_timesrv:
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


class TimeResponder(BufferedPipe):
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


def agent_timesrv(ctx: ExecContext, argv: list[str]) -> int:
    """`TOKEN` -> `TOKEN HOST_NS` at once. Answered on the hub by `TimeResponder` where the exec request
    installed one; this thread then sends only the replies the hub could not (a short window), until EOF.
    Otherwise this thread answers, lean on purpose, with HOST_NS the host clock midway between the token's arrival
    (its read's kernel receive stamp) and the reply's send (`_clock_read_at`):
    the thread's wake-up after the hub fed the bytes (0.1-2 ms on a busy emulator) would otherwise lengthen
    only the probe's outbound leg and bias the harness's offset estimate (events recorded early)."""
    host_time, host, channel = ctx.bench.host_time, ctx.host, ctx.channel
    arrivals = channel.in_buffer
    if isinstance(arrivals, TimeResponder):
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
    """`--name value` options (with defaults None; a `list` option: every value given, in order) and the positional
    words."""
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
            values[name] = (values[name] or []) + [value] if known[name] is list else known[name](value)
        else:
            positional.append(word)
        i += 1
    return values, positional


def _snapshot_fields(snapshot) -> dict[str, str]:
    return {"rx_los": str(int(snapshot.rx_los)), "rx_lol": str(int(snapshot.rx_lol)),
            "carrier": str(int(snapshot.carrier)), "operstate": snapshot.operstate,
            "phys_state": snapshot.phys_state, "state": snapshot.ib_state,
            **({"module_state": snapshot.module_state} if snapshot.module_state is not None else {})}


class _Tick(NamedTuple):
    """A stream's own timer, routed like a physics change to its own key (no value: it changes nothing)."""

    netdev: str
    field: str
    t_ns: int
    value: None = None


class _WatchStream(Stream):
    """The agent's local poller (devices/agent/hilagent.py `watch`): each change is reported at the first
    poll tick at or after it (a grid of `interval` with a random phase; ethtool fields on their own grid),
    stamped with the host clock at that tick, and printed no earlier than that tick (the ticks reached late,
    in one write). Changes that revert between two ticks are never seen, as with a real poller — except
    carrier and the IB state, whose drop and return the agent reads from `carrier_changes` and `link_downed`
    (both lines, one tick; a carrier change with a flap before it: the change, its revert, the change), and the
    module's LOS and LOL flags, which `ethtool -m` reads latched (as the emulated `ethtool -m` does): a tick after
    the flag was set reads "1" even if it has cleared since, and the tick after that reads it as it is then."""

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
        ethtool = field in ETHTOOL_FIELDS or field in ETHTOOL_STATES
        return self.phase[ethtool], self.ethtool_interval if ethtool else self.interval

    def arm_heartbeat(self, at_ns: int) -> None:
        if self.heartbeat:
            self.ctx.server.agent_streams().arm(_Tick(*self.timer, at_ns))

    def write(self, items: list) -> None:
        super().write(items)
        if self.heartbeat and not self.closed and any(item[1].field == self.timer[1] for item in items):  # its one chain of ticks
            # due a period after the last line printed, even when that is past: an agent is not stopped by the
            # emulator running late, so the beats it missed meanwhile are printed at once, each dated when due
            self.arm_heartbeat(max(self.printed_ns + self.heartbeat, self.ctx.server.watch_stalled_until_ns))

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
        if self.heartbeat and all(item[1].field == self.timer[1] for item in items):  # a silent tick
            due = items[-1][0]
            if due - self.printed_ns < self.heartbeat:
                return ""  # a line was printed since this beat was armed
            self.printed_ns = due
            return f"{self.ctx.bench.host_time(self.ctx.host, due)} alive\n"
        while i < len(items):  # tick by tick: a poller sees only the value at the tick
            tick = items[i][0]
            seen: dict[tuple[str, str], str] = {}
            flipped: set[tuple[str, str]] = set()  # a value that changed in this tick (carrier_changes moved)
            carrier_changes: dict[tuple[str, str], int] = {}  # the carrier's changes in this tick, counted
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
                if key[1] == "carrier" and change.value != seen.get(key, last.get(key)):
                    carrier_changes[key] = carrier_changes.get(key, 0) + 1
                if change.value == "1" and key[1] in ETHTOOL_FIELDS:
                    latched.add(key)
                seen[key] = live[key] = change.value
            host_ns = self.ctx.bench.host_time(self.ctx.host, tick)
            for key, value in seen.items():
                ethtool = key[1] in ETHTOOL_FIELDS or key[1] in ETHTOOL_STATES
                step = self.ethtool_interval if ethtool else self.interval
                if key in latched and value != "1":  # read as set; the next tick reads it as it is then
                    value = "1"
                    self.ctx.server.agent_streams().arm(NicChange(tick + 1, self.ctx.host, *key, None))
                if last.get(key) != value:
                    before, last[key] = last.get(key), value
                    if before is not None and carrier_changes.get(key, 0) >= 3:  # and back and forth besides
                        out += [f"{host_ns} {key[0]} {key[1]} {v} {step}\n" for v in (value, before, value)]
                    else:
                        out.append(f"{host_ns} {key[0]} {key[1]} {value} {step}\n")
                elif key[1] == "carrier" and key in flipped:  # down and up between two ticks: the agent
                    other = "0" if value == "1" else "1"  # sees carrier_changes move by two
                    out += [f"{host_ns} {key[0]} {key[1]} {v} {step}\n" for v in (other, value)]
                elif key[1] == "state" and key in flipped and value == "ACTIVE":  # ... and link_downed move
                    out += [f"{host_ns} {key[0]} {key[1]} {v} {step}\n" for v in ("DOWN", value)]
        if out:
            self.printed_ns = max(self.printed_ns, tick)
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
            ethtool = key[1] in ETHTOOL_FIELDS or key[1] in ETHTOOL_STATES
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
    if ethtool_us > 0 and not has_tool(ctx.server, ethtool, "ethtool"):  # the agent's own note and behaviour
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
        watched[netdev] = fields + ((ETHTOOL_FIELDS + ETHTOOL_STATES * cmis) if ethtool_us > 0 else ())
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
        opts, _ = _options(argv[1:], {"iface": list, "dst-mac": str, "dst-ip": str, "template": list,
                                      "interval-us": int, "udp-port": int, "dqpn": int})
        for template in opts["template"] or ():
            bytes.fromhex(template)
    except ValueError as exc:
        ctx.err(f"probe-send: {exc}\n")
        return 2
    ifaces, templates = opts["iface"] or [], opts["template"] or []
    if len(set(ifaces)) != len(ifaces):
        ctx.err("probe-send: an --iface given twice\n")
        return 2
    if templates and len(templates) != len(ifaces):
        ctx.err(f"probe-send: give one --template per --iface ({len(ifaces)} ports, {len(templates)} templates)\n")
        return 2
    if not templates and opts["dst-mac"] is not None and len(ifaces) != 1:
        ctx.err("probe-send: --dst-mac builds the frame of one --iface; give a --template per port\n")
        return 2
    if not ifaces or any(ctx.server.nic_by_netdev(i) is None for i in ifaces) or not opts["interval-us"] \
            or (not templates and opts["dst-mac"] is None):
        ctx.err("usage: probe-send --iface NETDEV (--template HEX | --dst-mac MAC) [--iface NETDEV --template HEX "
                "...] --interval-us N\n")
        return 2
    started = []
    try:
        for iface in ifaces:  # one sender's ports, each on every tick from its start
            ctx.bench.probe_start(ctx.host, iface, int(opts["interval-us"]) * 1000)
            started.append(iface)
        ctx.wait_stdin_eof_or_gone()
    finally:
        for iface in started:
            ctx.bench.probe_stop(ctx.host, iface)
    return 0


class _ProbeRecvStream(Stream):
    """The agent's `probe-recv`: a `first` line for each stream of probes a port starts to receive, stamped
    with the host clock at the first probe's arrival (a kernel receive stamp), printed at once; over several
    ports, each line names its port (the lines due together in one write). As a real receiver: no probe from
    before it started, and the first after its start is "first"."""

    def __init__(self, ctx: ExecContext, netdev: str, *more: str):
        super().__init__(ctx)
        self.netdevs = (netdev, *more)
        self.named = bool(more)  # several ports: each line ends with its port's name
        self.keys = tuple((n, "probe_first") for n in self.netdevs)
        self.started = now_ns()  # set again once registered (first_lines)

    @staticmethod
    def grid(field: str) -> tuple[int, int]:
        return 0, 0  # at once

    def first_lines(self) -> str:
        """The first probe seen of a flow that began before the receiver (a later flow comes as a change)."""
        ctx = self.ctx
        # Its start is after it registered: a flow's first probe before then never came as a change to it.
        self.started = now_ns()
        lines = []
        for netdev in self.netdevs:
            flow = ctx.bench.probe_flow(ctx.host, netdev)
            if flow is None or flow[2] >= self.started:
                continue
            mac, seq, arrival, interval = flow
            k = -(-(self.started - arrival) // interval)
            seen = arrival + k * interval
            time.sleep(max(0, seen - now_ns()) / 1e9)  # printed no earlier than the probe arrived
            lines.append(f"{ctx.bench.host_time(ctx.host, seen)} first {mac} {seq + k}"
                         + (f" {netdev}\n" if self.named else "\n"))
        return "".join(lines)

    def lines(self, items: list) -> str:
        host_time, host, started = self.ctx.bench.host_time, self.ctx.host, self.started
        if self.named:
            return "".join(f"{host_time(host, change.t_ns)} first {change.value} {change.netdev}\n"
                           for _, change in items if change.t_ns >= started)
        return "".join(f"{host_time(host, change.t_ns)} first {change.value}\n" for _, change in items
                       if change.t_ns >= started)


def _agent_probe_recv(ctx: ExecContext, argv: list[str]) -> int:
    try:
        opts, _ = _options(argv[1:], {"iface": list, "gap-us": int, "udp-port": int})
    except ValueError as exc:
        ctx.err(f"probe-recv: {exc}\n")
        return 2
    netdevs = opts["iface"] or []
    if not netdevs or any(ctx.server.nic_by_netdev(str(n)) is None for n in netdevs) \
            or len(set(netdevs)) != len(netdevs):
        ctx.err("usage: probe-recv --iface NETDEV [--iface NETDEV ...] --gap-us G [--udp-port P]\n")
        return 2
    stream = _ProbeRecvStream(ctx, *map(str, netdevs))
    return stream.serve(stream.first_lines)


def _agent_version(ctx: ExecContext, argv: list[str]) -> int:
    ctx.out(ctx.server.tools.python + "\n")
    return 0


AGENT_COMMANDS: dict[str, Handler] = {
    "timesrv": agent_timesrv, "watch": _agent_watch, "counters": _agent_counters,
    "probe-send": _agent_probe_send, "probe-recv": _agent_probe_recv, "version": _agent_version,
}
