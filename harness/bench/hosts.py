"""The bench's hosts: one host's session during a run (its SSH connection, the agent, the clock tracker and its
streams, read by the process's one reader thread (harness.bench.readers) into observations on one queue), and the
hosts one step observes (their sessions, the reconnect policy after a drop, the clock checks that label a cycle
whose host clock stepped).

A dropped connection ends every stream; each reader reports it once as a 'fault' observation, and
`reconnect()` brings the session back (new connection, agent, time responder and the same streams)."""
from __future__ import annotations

import collections
import contextlib
import queue
import re
import shlex
import threading
import time
from typing import Callable

from devices import hostagent
from devices.errors import DeviceError
from devices.hostagent import (HOST_INT_END, WATCH_FIELDS, HostAgent, parse_port_probe_line, parse_probe_line,
                               sysfs_watch_fields, watch_heartbeat, watch_line_fields)
from devices.protocols import LineStream
from devices.records import record
from devices.resources import HostResource
from devices.ssh import SshTransport
from devices.timing import Deadline, now_ns
from harness.bench import BenchBroken
from harness.outcome import IntRows


@record
class Observation:
    """A host-side fact, still on the host's clock. kind: 'watch' | 'probe' | 'fault' | 'alive' (the watch's
    heartbeat: it is running, nothing changed)."""

    kind: str
    host: str
    netdev: str
    field: str  # watch field, 'first'/'last' for probes, or the fault cause
    value: str
    host_ns: int
    interval_ns: int  # the change happened within (host_ns - interval_ns, host_ns]
    recv_ns: int  # harness time the line arrived (for ordering and overhead accounting)


class HostSession:
    """Opened once per host per run; `close()` ends every stream and the connection."""

    # (chronyd's, ptp4l's) command socket when not at the daemons' default paths (harness.clock.clock_sources_command)
    clock_sockets: tuple[str | None, str | None] = (None, None)

    def __init__(self, resource: HostResource, clock_probes: int = 24, readers=None,
                 transport: SshTransport | None = None):
        self.resource = resource
        self.name = resource.name
        self.clock_probes = clock_probes
        self.transport = transport or SshTransport(resource)  # given: the run's connection, already used (preflight)
        self.agent = HostAgent(self.transport, python=resource.python, ethtool=resource.tool("ethtool"))
        self._streams: list[LineStream] = []
        self._readers = readers  # None: the process's one reader thread (harness.bench.readers)
        self._timesrv: LineStream | None = None
        self.clock = None
        self.clock_sources = None  # (readings, absent, realtime minus harness clock) of read_clock_sources
        self._clock_lock = threading.Lock()
        self._stop = threading.Event()
        self._probe_lock = threading.Lock()  # one clock probe at a time over the shared time responder
        self._starters: list = []  # how to start each stream again after a reconnect
        self._watch_lock = threading.Lock()
        self._watch_awaited: set[tuple[str, str]] = set()  # (netdev, field) whose current value is still due
        self._watch_live: threading.Event | None = None
        self.watch_heard_ns = 0  # harness time the watch last printed a line or a heartbeat (its liveness)
        self.watch_printed_ns = 0  # host time of the latest line or heartbeat it printed
        self.watch_caught_up: Callable[[], int] = now_ns  # its stream's LineStream.caught_up_ns
        self.watch_gap_ns = 0  # a silence longer than this is kept in `watch_gaps` (0: none kept)
        # (begin, end) harness ns of each silence kept: the agent printed nothing for that long on its own clock, and
        # nothing arrived meanwhile (a late delivery of lines printed on time is the path's lag, not a stall)
        self.watch_gaps: collections.deque = collections.deque(maxlen=64)
        self.reconnects = 0
        self.on_clock_sample = None  # called (host, ClockSample) for every sample added (observations.jsonl)
        self.generations: dict[str, int] | None = None  # host -> clock generation, kept by HostGroup (a step: +1)

    def open(self) -> None:
        from harness.clock import ClockTracker

        self.transport.connect()
        try:
            self.agent.install(Deadline(15))
        except DeviceError as exc:
            raise DeviceError(f"host {self.name}: {exc}") from None
        self._timesrv = self._keep(self.agent.timesrv())
        self.clock = ClockTracker(self.name)
        self.sync_clock()
        self.read_clock_sources()

    def read_clock_sources(self) -> None:
        """What the host's own chrony / ptp4l say of its clock (one exec; a second for more syncs where ptp4l
        answered), with this machine's realtime minus the harness clock at that moment: the manifest sets them beside
        the probe's bound (`clock_source_table`)."""
        from harness.clock import (ClockSyncError, clock_sources_command, ptp_samples_command, read_clock_sources,
                                   realtime_minus_monotonic)

        chronyd, ptp4l = self.clock_sockets
        try:
            stdout = self.transport.run(clock_sources_command(chronyd, ptp4l), deadline=Deadline(5)).stdout
            readings, absent = read_clock_sources(stdout)
            if "ptp" in readings:  # more syncs: one alone may have been delayed far beyond the path delay
                stdout += self.transport.run(ptp_samples_command(ptp4l), deadline=Deadline(5)).stdout
                readings, absent = read_clock_sources(stdout)
        except (DeviceError, ClockSyncError) as exc:
            readings, absent = {}, {"all": f"clock sources not read: {exc}"[:300]}
        self.clock_sources = (readings, absent, realtime_minus_monotonic())

    def clock_source_table(self) -> dict:
        from harness.clock import clock_source_entry

        if self.clock_sources is None:
            return {}
        readings, absent, realtime = self.clock_sources
        with self._clock_lock:
            return clock_source_entry(readings, absent, self.clock, realtime)

    def sync_clock(self, count: int | None = None):
        """One min-delay estimate over the long-lived responder, added to the tracker."""
        from harness.clock import probe

        # Adding under the probe lock orders the tracker's samples by construction: a concurrent probe
        # can neither finish nor be added before this one is.
        with self._probe_lock:
            sample = probe(self._timesrv, count=count or self.clock_probes, deadline=Deadline(10))
            return self._add_sample(sample)

    def _add_sample(self, sample):
        with self._clock_lock:
            step = self.clock.add(sample)
            if step is not None and self.generations is not None:  # after the model changed, never before
                self.generations[self.name] = len(self.clock.segments)
        sink = getattr(self, "on_clock_sample", None)
        if sink is not None:
            sink(self.name, sample)
        return step

    @staticmethod
    def sync_clocks_together(sessions: list["HostSession"], rounds: int = 1) -> None:
        """`rounds` pipelined probes per host (about one round trip each for all hosts); each host's
        minimum-delay sample added to its tracker."""
        from harness.clock import probe_each

        with contextlib.ExitStack() as held:
            for session in sessions:
                held.enter_context(session._probe_lock)
            best: dict = {}
            for _ in range(max(1, rounds)):
                samples = probe_each({s.name: s._timesrv for s in sessions}, deadline=Deadline(10))
                for name, sample in samples.items():
                    if name not in best or sample.delay_ns < best[name].delay_ns:
                        best[name] = sample
            for session in sessions:  # still under the probe locks (see sync_clock)
                session._add_sample(best[session.name])

    def clock_step_list(self) -> list:
        with self._clock_lock:
            return list(self.clock.steps)

    def reconnect(self, deadline: Deadline) -> None:
        """After a dropped connection: end what is left of the old streams, connect again (the transport
        retries with backoff), reinstall the agent and restart the time responder and every stream.
        Watch streams start with the current values (INTERVAL 0), which are states, not transitions."""
        old, self._streams = self._streams, []
        self._end(old)
        self.transport.connect()
        self.agent.install(deadline)
        with self._probe_lock:
            self._timesrv = self._keep(self.agent.timesrv())
        for start in self._starters:
            start()
        self.sync_clock()
        self.reconnects += 1

    def to_harness(self, host_ns: int) -> tuple[int, int, int]:
        """(t_ns, offset_ns, uncertainty_ns) of a host timestamp, with the tracker's current model."""
        with self._clock_lock:
            return self.clock.to_harness(host_ns)

    def to_harness_many(self, host_ns):
        """`to_harness` of each of an int64 array of host timestamps, as arrays (the tracker's `to_harness_many`)."""
        with self._clock_lock:
            return self.clock.to_harness_many(host_ns)

    def _keep(self, stream: LineStream) -> LineStream:
        self._streams.append(stream)
        return stream

    def _spawn(self, stream: LineStream, sink, parse_lines, what: str) -> None:
        """Deliver the stream's lines into `sink` from the shared reader, each packet's made observations at once
        by `parse_lines(recv_ns, lines)` (None: nothing delivered); its end, unless ours, is reported once as a
        'fault' observation."""
        if self._readers is None:
            from harness.bench.readers import shared_readers

            self._readers = shared_readers()

        put_many = getattr(sink, "put_many", None) or (lambda batch: [sink.put(obs) for obs in batch])

        def on_lines(recv_ns: int, lines: list[str]) -> None:
            batch = parse_lines(recv_ns, lines)
            if batch:
                put_many(batch)  # the lines that arrived together, in one (a cycle's burst: one wake-up a packet)

        def on_end(reason: str) -> None:
            if not getattr(stream, "closed_by_us", False) and not self._stop.is_set():
                sink.put(Observation("fault", self.name, "", f"agent {what}", reason.strip()[:300], 0, 0, now_ns()))

        self._readers.add_lines(stream, on_lines if parse_lines is not None else lambda recv_ns, lines: None, on_end)

    def _each_line(self, parse: Callable[[int, str], "Observation"]) -> Callable[[int, list[str]], list]:
        """A packet's lines parsed one by one by `parse(recv_ns, line)`: blank lines skipped, a malformed one
        (DeviceError) a fault observation of its own."""
        def parse_lines(recv_ns: int, lines: list[str]) -> list:
            batch = []
            for line in lines:
                if not line or line.isspace():
                    continue
                try:
                    batch.append(parse(recv_ns, line))
                except DeviceError as exc:
                    batch.append(Observation("fault", self.name, "", "agent_output", str(exc)[:300], 0, 0, recv_ns))
            return batch

        return parse_lines

    def start_watch(self, ports: list[tuple[str, str | None, int | None]], interval_us: int,
                    ethtool_interval_us: int, sink: "queue.Queue[Observation]", heartbeat_us: int = 0) -> None:
        self._starters.append(lambda: self._start_watch(ports, interval_us, ethtool_interval_us, sink, heartbeat_us))
        self._start_watch(ports, interval_us, ethtool_interval_us, sink, heartbeat_us)

    def _start_watch(self, ports, interval_us: int, ethtool_interval_us: int, sink, heartbeat_us: int = 0) -> None:
        # Until the watch has printed a field's current value, a change of it is not seen as one (the agent
        # prints the new value as current): `wait_watching` holds the first command until they are all in.
        awaited = {(netdev, f) for netdev, rdma_dev, _ in ports for f in sysfs_watch_fields(rdma_dev is not None)}
        live = threading.Event()
        with self._watch_lock:
            self._watch_awaited, self._watch_live = awaited, live
        if not awaited:
            live.set()
        stream = self._keep(self.agent.watch(ports, interval_us, ethtool_interval_us, heartbeat_us))
        self.watch_caught_up = stream.caught_up_ns

        name = self.name
        self.watch_heard_ns = now_ns()

        def current(netdev: str, field: str) -> None:  # a field's current value printed (INTERVAL 0)
            if not live.is_set():
                with self._watch_lock:
                    awaited.discard((netdev, field))
                    if not awaited:
                        live.set()

        def odd(recv_ns: int, line: str) -> Observation:
            """A line the one pass below did not take: a heartbeat, or a malformed line (DeviceError)."""
            if "alive" in line:
                beat = watch_heartbeat(line)
                if beat is not None:
                    return Observation("alive", name, "", "alive", "", beat, 0, recv_ns)
            host_ns, netdev, field, value, interval_ns = watch_line_fields(line)  # raises: not a watch line
            if interval_ns == 0:
                current(netdev, field)
            return Observation("watch", name, netdev, field, value, host_ns, interval_ns, recv_ns)

        odd_lines = self._each_line(odd)
        fields, top = frozenset(WATCH_FIELDS), HOST_INT_END

        def parse_lines(recv_ns: int, lines: list[str]) -> list:
            # One pass over a packet's lines (a cycle's burst: ~100 lines a host), on the SSH hub's thread that the
            # cycle's end waits for: a well-formed watch line is split and checked inline (`watch_line_fields`'
            # checks, the same outcome); any other goes through `odd`, one by one.
            batch = []
            for line in lines:
                parts = line.split()
                if len(parts) == 5 and parts[2] in fields:
                    try:
                        host_ns, interval_ns = int(parts[0]), int(parts[4])
                    except ValueError:
                        host_ns = interval_ns = -1
                    if 0 <= host_ns < top and 0 <= interval_ns < top:
                        if interval_ns == 0:
                            current(parts[1], parts[2])
                        batch.append(Observation("watch", name, parts[1], parts[2], parts[3], host_ns, interval_ns,
                                                 recv_ns))
                        continue
                if parts:
                    batch += odd_lines(recv_ns, [line])
            if batch:  # heard from (a line or a heartbeat, well-formed or not): its liveness
                printed = batch[0].host_ns
                if recv_ns - self.watch_heard_ns > self.watch_gap_ns > 0 and self.watch_printed_ns \
                        and printed - self.watch_printed_ns > self.watch_gap_ns:
                    silent = min(recv_ns - self.watch_heard_ns, printed - self.watch_printed_ns)
                    self.watch_gaps.append((recv_ns - silent, recv_ns))
                self.watch_heard_ns = recv_ns
                self.watch_printed_ns = max(self.watch_printed_ns, batch[-1].host_ns)
            return batch

        self._spawn(stream, sink, parse_lines, "watch")

    def wait_watching(self, deadline: Deadline) -> list[str]:
        """Wait until the watch has printed the current value of every field it polls from sysfs; the
        "NETDEV FIELD"s still missing when `deadline` passes first ([] when none, or no watch runs)."""
        live = self._watch_live
        if live is None or live.wait(deadline.remaining()):
            return []
        with self._watch_lock:
            return sorted(f"{netdev} {field}" for netdev, field in self._watch_awaited)

    def start_probe_recv(self, netdevs: list[str], gap_us: int, udp_port: int, sink) -> None:
        """One probe receiver over the host's `netdevs` (one stream: a host's first probes come in few packets)."""
        self._starters.append(lambda: self._start_probe_recv(netdevs, gap_us, udp_port, sink))
        self._start_probe_recv(netdevs, gap_us, udp_port, sink)

    def _start_probe_recv(self, netdevs: list[str], gap_us: int, udp_port: int, sink) -> None:
        stream = self._keep(self.agent.probe_recv(netdevs[0] if len(netdevs) == 1 else netdevs, gap_us, udp_port))
        name, mine = self.name, frozenset(netdevs)

        def parse(recv_ns: int, line: str) -> Observation:
            if len(netdevs) == 1:
                netdev, p = netdevs[0], parse_probe_line(line)
            else:
                netdev, p = parse_port_probe_line(line)
                if netdev not in mine:
                    raise DeviceError(f"agent probe-recv: a port it does not watch in {line[:200]!r}")
            return Observation("probe", name, netdev, p.kind, f"{p.src_mac} {p.seq}", p.host_ns, 0, recv_ns)

        self._spawn(stream, sink, self._each_line(parse), f"probe-recv-{'+'.join(netdevs)}")

    def start_probe_send(self, ports: list[tuple[str, bytes]], interval_us: int, sink) -> None:
        """One probe sender over the host's `ports` ((netdev, frame template) each): one SSH session, however many
        NICs (a session per port would pass sshd's MaxSessions, 10 by default, on an 8-NIC host)."""
        self._starters.append(lambda: self._start_probe_send(ports, interval_us, sink))
        self._start_probe_send(ports, interval_us, sink)

    def _start_probe_send(self, ports: list[tuple[str, bytes]], interval_us: int, sink) -> None:
        stream = self._keep(self.agent.probe_send(ports, interval_us))
        self._spawn(stream, sink, None, f"probe-send-{'+'.join(netdev for netdev, _ in ports)}")

    def _end(self, streams) -> None:
        for stream in streams:
            stream.closed_by_us = True
            if self._readers is not None:
                self._readers.remove(stream)
            try:
                stream.close()
            except Exception:  # teardown reaches every stream; after a drop the connection is gone anyway
                pass

    def close(self) -> None:
        """End every stream and the connection."""
        self._stop.set()
        self._end(reversed(self._streams))
        self._streams = []
        self.transport.close()


# The agent's stream lines, parsed (DeviceError on a malformed one): a step reads a host's streams here.
parse_counter_line = hostagent.parse_counter_line
parse_watch_line = hostagent.parse_watch_line


_MAC = re.compile(r"^[0-9a-f]{2}(:[0-9a-f]{2}){5}$")


def _probe_template(mac: str, index: int, udp_port: int) -> bytes:
    from devices.agent import build_probe_template

    return build_probe_template(src_mac=mac, dst_mac="ff:ff:ff:ff:ff:ff", src_ip=f"198.18.{index // 250}.{index % 250 + 1}",
                                dst_ip="198.19.255.255", udp_port=udp_port, dqpn=0x100 + index)


def _port_mac(session, netdev: str, index: int) -> str:
    """The NIC's own MAC (probes carry it, so a receiver can tell its new peer's frames from stale ones);
    a locally administered stand-in when the host does not say."""
    try:
        mac = session.transport.run(f"cat /sys/class/net/{shlex.quote(netdev)}/address",
                                    deadline=Deadline(5)).stdout.strip().lower()
    except DeviceError:
        mac = ""
    return mac if _MAC.match(mac) else f"02:00:00:00:{index // 256:02x}:{index % 256:02x}"


# The watch's heartbeat: a line after this long without one. A stream silent for LIVENESS_BEATS periods has stalled
# (a heartbeat is due after one; the rest is the SSH path's and a loaded host's slack). While changes flow, no
# heartbeat is printed: it costs nothing per cycle.
WATCH_HEARTBEAT_US = 100_000
LIVENESS_BEATS = 3
WATCH_READY_S = 15.0  # how long observe() waits for the watches' current values (an agent starting late)
# Background clock probes per period, all hosts together. Since a reply is dated by the kernel's receive stamp, a
# sample's delay is the wire's and the host's, not the hub's backlog: on an 8 x 8 bench 8 rounds a host find as
# good a minimum as 24 did (the same stage error against the emulator's truth), at a third of the probes.
CLOCK_PROBE_BUDGET = 64


def background_rounds(hosts: int, wanted: int, budget: int = CLOCK_PROBE_BUDGET) -> int:
    """Pipelined rounds per background sync: each host's own count while the bench is small, fewer as it
    grows, so clock tracking costs the harness and the hosts a bounded number of probes per period
    (at least one per host: every host is still tracked every period)."""
    return max(1, min(wanted, budget // max(1, hosts)))


class HostGroup:
    """The observed hosts of one step. Clock checks: one thread re-estimates every host's offset each
    period and, after a cycle, once more on request (`request_check`, which the turnaround step makes once the
    next command is out: its probes then run in that command's physical wait). A step labels every cycle
    that may contain it (`clock_labels`), including one already written, whose label is then appended."""

    def __init__(self, sessions: dict, *, retries: int = 3, backoff_s: float = 0.1):
        self.sessions = sessions
        self.retries, self.backoff_s = retries, backoff_s
        self.reconnected: dict[str, int] = {}  # host -> harness time of its last reconnect
        self._stop = threading.Event()
        self._clock_thread: threading.Thread | None = None
        self._wake = threading.Condition()
        self._check_wanted: list[tuple[int, int]] = []  # (cycle, probes) the clock thread is to check
        self._checks_asked = self._checks_done = 0
        self._check_failures: list[tuple[int, str, str]] = []  # (cycle, host, cause)
        self._spans = IntRows(3)  # (cycle, begin_ns, done_ns) (done: -1 while running)
        self._steps_labelled: dict[str, int] = {}  # host -> its clock steps already reported
        self.unwatched: list[tuple[str, str]] = []  # (host, fault source): a watch not live when observe() ended
        self.liveness_ns = 0  # a watch silent this long has stalled (0: no heartbeat asked, not judged)
        # host -> its clock's generation: the tracker's segment count, which changes when the host's clock is found
        # to have stepped (a conversion made before that may not bound the truth; one made before another sample
        # still does). Each session updates it as it adds the sample that shows a step; it is read per host
        # line in a cycle's burst (`clock_generation`), so a dict lookup there, not a chain of calls.
        self.generations = {host: len(s.clock.segments) if getattr(s, "clock", None) is not None else 0
                            for host, s in sessions.items()}
        for session in sessions.values():
            session.generations = self.generations
        self.clock_generation: Callable[[str], int] = self.generations.__getitem__

    def observe(self, nics, log, *, watch_us: int, ethtool_us: int, clock_resync_s: float, probe_us: int = 0,
                probe_gap_us: int = 2000, udp_port: int = 4791, heartbeat_us: int = WATCH_HEARTBEAT_US
                ) -> dict[str, str]:
        """Start every reader of these NIC ports into `log`: the agent's watch (the inventory's RDMA device
        and port; a heartbeat after `heartbeat_us` without a line, its liveness: `watch_silent`), probe receivers
        and senders (`probe_us` > 0), the background clock sync, each sample also logged. Returns port key ->
        the MAC its probes carry."""
        mac_of = {}
        self.liveness_ns = heartbeat_us * 1000 * LIVENESS_BEATS if heartbeat_us > 0 else 0
        for host, session in self.sessions.items():
            mine = [n for n in nics if n.host == host]
            session.on_clock_sample = log.clock_sample
            session.watch_gap_ns = self.liveness_ns
            session.start_watch([(n.netdev, n.rdma_dev, n.rdma_port) for n in mine], watch_us, ethtool_us, log,
                                heartbeat_us)
            if probe_us and mine:
                session.start_probe_recv([n.netdev for n in mine], probe_gap_us, udp_port, log)
                templates = []
                for i, n in enumerate(nics):
                    if n.host == host:
                        mac_of[n.key] = _port_mac(session, n.netdev, i)
                        templates.append((n.netdev, _probe_template(mac_of[n.key], i, udp_port)))
                session.start_probe_send(templates, probe_us, log)
        self.start_clock_sync(clock_resync_s)
        # A watch that starts after the first command prints that cycle's changes as current values, and
        # the cycle waits for transitions that never come: every watch is live before observe() returns.
        deadline = Deadline(WATCH_READY_S)
        for host, session in self.sessions.items():
            if missing := session.wait_watching(deadline):
                self.unwatched.append((host, f"host:{host}: watch gave no current value of {', '.join(missing)} "
                                             f"within {WATCH_READY_S:g} s"[:300]))
        return mac_of

    def start_clock_sync(self, period_s: float, probes: int | None = None) -> None:
        """One thread re-estimates every host's offset each `period_s` (drift, steps): `probes` pipelined
        rounds (one round trip each for all hosts; default: the sessions' own probe count), the
        minimum-delay sample per host kept; between periods it runs the checks asked for."""
        if self._clock_thread is not None:
            return
        probes = probes or background_rounds(len(self.sessions),
                                             max((getattr(s, "clock_probes", 1) for s in self.sessions.values()),
                                                 default=1))

        def loop():
            due = time.monotonic() + period_s
            while not self._stop.is_set():
                with self._wake:
                    while not self._check_wanted and not self._stop.is_set() and time.monotonic() < due:
                        self._wake.wait(due - time.monotonic())
                    checks, self._check_wanted = self._check_wanted, []
                if self._stop.is_set():
                    break
                if checks:  # one round answers every check asked for meanwhile
                    self._check(checks[0][0], max(p for _, p in checks), len(checks))
                    continue
                due = time.monotonic() + period_s
                live = [s for s in self.sessions.values() if not s._stop.is_set()]
                if not live:
                    break  # the run closed its sessions
                try:
                    self._sync_all(live, probes)  # a dead responder: its streams report the drop; retried next period
                except Exception:  # noqa: BLE001 — the thread outlives any one bad round
                    pass
            with self._wake:  # nobody waits for a check that will not run
                self._checks_done = self._checks_asked
                self._wake.notify_all()

        self._clock_thread = threading.Thread(target=loop, daemon=True, name="clock-sync")
        self._clock_thread.start()

    @staticmethod
    def _sync_all(sessions, probes: int) -> list[tuple[str, str]]:
        """One pipelined estimate of every host's offset; (host, error) of those that failed."""

        try:
            HostSession.sync_clocks_together(sessions, rounds=probes)
            return []
        except DeviceError:
            failed = []
            for session in sessions:  # find the host that failed; the others still get their sample
                try:
                    session.sync_clock(count=probes)
                except DeviceError as exc:
                    failed.append((session.name, str(exc)[:200]))
            return failed

    # ---- clock checks and the cycles they label
    def cycle_started(self, cycle: int, begin_ns: int) -> None:
        self._spans.append((cycle, begin_ns, -1))

    def cycle_ended(self, done_ns: int) -> None:
        self._spans[-1] = (*self._spans[-1][:2], done_ns)

    def request_check(self, cycle: int, probes: int) -> Callable[[], bool]:
        """Probe every host's clock now, on the clock thread (without it: here, at once); a step or a
        failed probe it finds is reported by the next `clock_labels`. Returns whether it has run."""
        if probes <= 0:
            return lambda: True
        if self._clock_thread is None or not self._clock_thread.is_alive():
            self._check(cycle, probes)
            return lambda: True
        with self._wake:
            self._checks_asked += 1
            ticket = self._checks_asked
            self._check_wanted.append((cycle, probes))
            self._wake.notify_all()
        return lambda: self._checks_done >= ticket

    def _check(self, cycle: int, probes: int, answers: int = 1) -> None:
        live = [s for s in self.sessions.values() if not s._stop.is_set()]
        try:
            failed = self._sync_all(live, probes) if probes == 1 else \
                [f for s in live for f in self._sync_all([s], probes)]
        except Exception as exc:  # noqa: BLE001 — reported as the cycle's fault, the thread goes on
            failed = [(s.name, f"{type(exc).__name__}: {exc}"[:200]) for s in live]
        with self._wake:
            self._check_failures += [(cycle, host, f"host:{host}: clock probe failed: {why}") for host, why in failed]
            self._checks_done += answers
            self._wake.notify_all()

    def clock_labels(self, timeout_s: float = 15.0) -> dict[int, list[tuple[str, str]]]:
        """Once the checks asked for have ended: cycle -> (host, cause) for every clock step found since the
        last call — on every cycle whose span meets the interval that surely holds the step (a cycle already
        written among them) — and every failed check probe."""
        deadline = Deadline(timeout_s)
        with self._wake:
            while self._checks_done < self._checks_asked and not deadline.expired():
                self._wake.wait(deadline.remaining())
            failures, self._check_failures = self._check_failures, []
        labels: dict[int, list[tuple[str, str]]] = {}
        for cycle, host, cause in failures:
            labels.setdefault(cycle, []).append((host, cause))
        for host, session in self.sessions.items():
            steps = session.clock_step_list()
            for step in steps[self._steps_labelled.get(host, 0):]:
                for cycle, begin, done in self._spans:
                    if begin <= step.not_after_ns and (done < 0 or step.not_before_ns < done):
                        labels.setdefault(cycle, []).append(
                            (host, f"clock-step:{host}: {step.jump_ns / 1e6:+.3f} ms ± {step.uncertainty_ns / 1e6:.3f}"))
            self._steps_labelled[host] = len(steps)
        return labels

    def stop(self) -> None:
        self._stop.set()
        with self._wake:
            self._wake.notify_all()

    def heard(self, host: str) -> int:
        """Harness time `host`'s watch last printed a line or heartbeat."""
        return self.sessions[host].watch_heard_ns

    def silence(self, host: str, since_ns: int, now_ns: int) -> int:
        """The longest time within [since_ns, now_ns] that `host`'s watch printed nothing (the silence going on
        counts). A silence that ends just after `since_ns` is short here: the lines that end it say what changed
        meanwhile, with intervals that reach back over it."""
        session = self.sessions[host]
        # a silence going on is the agent's only up to when its stream's reader last caught up (a harness held up
        # has lines waiting unread)
        longest = min(now_ns, session.watch_caught_up()) - max(session.watch_heard_ns, since_ns)
        # a copy: the SSH hub's thread appends to the deque meanwhile (tuple() copies it without yielding the GIL)
        for begin, end in reversed(tuple(session.watch_gaps)):
            if end <= since_ns:
                break
            longest = max(longest, min(end, now_ns) - max(begin, since_ns))
        return longest

    def convert(self, host: str, host_ns: int) -> tuple[int, int, int]:
        return self.sessions[host].to_harness(host_ns)

    def on_fault(self, obs) -> str | None:
        """A host's stream ended or sent nonsense: reconnect it once per drop. Returns the fault source to
        record, or None for a stale report of a drop already handled; BenchBroken when it stays away."""
        host = obs.host
        if obs.recv_ns and obs.recv_ns <= self.reconnected.get(host, 0):
            return None  # another stream reporting the same drop
        cause = f"host:{host}: {obs.field}: {obs.value}"[:300]
        if obs.field == "agent_output":
            return cause  # one unparsable line: the stream itself is alive
        last = ""
        for attempt in range(self.retries + 1):
            if attempt:
                time.sleep(self.backoff_s * 2 ** (attempt - 1))
            try:
                self.sessions[host].reconnect(Deadline(15))
                self.reconnected[host] = now_ns()
                return cause
            except DeviceError as exc:
                last = str(exc)[:200]
        raise BenchBroken(f"host {host}: cannot reconnect after {self.retries + 1} attempts ({last})")

    def warm_up(self, seconds: float) -> None:
        """Drift is only known over a span of samples: make sure the first measured cycle has one."""
        first = min(s.clock.segments[-1].first_t for s in self.sessions.values())
        wait = seconds - (now_ns() - first) / 1e9
        if wait > 0:
            threading.Event().wait(wait)
