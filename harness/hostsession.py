"""One host during a run: its SSH connection, the agent, the clock tracker, and its streams read by the
process's one reader thread (harness.bench.readers) into observations on one queue (one event stream end to end).

A dropped connection ends every stream; each reader reports it once as a 'fault' observation, and
`reconnect()` brings the session back (new connection, agent, time responder and the same streams)."""
from __future__ import annotations

import collections
import contextlib
import queue
import threading

from devices.errors import DeviceError
from devices.hostagent import HostAgent, parse_probe_line, sysfs_watch_fields, watch_heartbeat, watch_line_fields
from devices.protocols import LineStream
from devices.records import record
from devices.resources import HostResource
from devices.ssh import SshTransport
from devices.timing import Deadline, now_ns


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
        self.watch_gap_ns = 0  # a silence longer than this is kept in `watch_gaps` (0: none kept)
        self.watch_gaps: collections.deque = collections.deque(maxlen=64)  # (last heard, heard again) ns
        self.reconnects = 0
        self.on_clock_sample = None  # called (host, ClockSample) for every sample added (observations.jsonl)
        self.generations: dict[str, int] | None = None  # host -> clock generation, kept by HostGroup (a step: +1)

    def open(self) -> None:
        from harness.clock import ClockTracker

        self.transport.connect()
        self.agent.install(Deadline(15))
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

    def _keep(self, stream: LineStream) -> LineStream:
        self._streams.append(stream)
        return stream

    def _spawn(self, stream: LineStream, sink, parse, what: str) -> None:
        """Deliver the stream's parsed lines into `sink` from the shared reader; its end, unless ours, is
        reported once as a 'fault' observation."""
        if self._readers is None:
            from harness.bench.readers import shared_readers

            self._readers = shared_readers()

        put_many = getattr(sink, "put_many", None) or (lambda batch: [sink.put(obs) for obs in batch])

        def on_lines(recv_ns: int, lines: list[str]) -> None:
            batch = []
            for line in lines:
                if not line or line.isspace():
                    continue
                try:
                    batch.append(parse(recv_ns, line))
                except DeviceError as exc:
                    batch.append(Observation("fault", self.name, "", "agent_output", str(exc)[:300], 0, 0, recv_ns))
            if batch:
                put_many(batch)  # the lines that arrived together, in one (a cycle's burst: one wake-up a packet)

        def on_end(reason: str) -> None:
            if not getattr(stream, "closed_by_us", False) and not self._stop.is_set():
                sink.put(Observation("fault", self.name, "", f"agent {what}", reason.strip()[:300], 0, 0, now_ns()))

        self._readers.add_lines(stream, on_lines if parse is not None else lambda recv_ns, lines: None, on_end)

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

        name = self.name

        self.watch_heard_ns = now_ns()

        def parse(recv_ns: int, line: str) -> Observation:
            if recv_ns - self.watch_heard_ns > self.watch_gap_ns > 0:
                self.watch_gaps.append((self.watch_heard_ns, recv_ns))
            self.watch_heard_ns = recv_ns
            if "alive" in line:
                beat = watch_heartbeat(line)
                if beat is not None:
                    return Observation("alive", name, "", "alive", "", beat, 0, recv_ns)
            host_ns, netdev, field, value, interval_ns = watch_line_fields(line)
            if interval_ns == 0 and not live.is_set():
                with self._watch_lock:
                    awaited.discard((netdev, field))
                    if not awaited:
                        live.set()
            return Observation("watch", name, netdev, field, value, host_ns, interval_ns, recv_ns)

        self._spawn(stream, sink, parse, "watch")

    def wait_watching(self, deadline: Deadline) -> list[str]:
        """Wait until the watch has printed the current value of every field it polls from sysfs; the
        "NETDEV FIELD"s still missing when `deadline` passes first ([] when none, or no watch runs)."""
        live = self._watch_live
        if live is None or live.wait(deadline.remaining()):
            return []
        with self._watch_lock:
            return sorted(f"{netdev} {field}" for netdev, field in self._watch_awaited)

    def start_probe_recv(self, netdev: str, gap_us: int, udp_port: int, sink) -> None:
        self._starters.append(lambda: self._start_probe_recv(netdev, gap_us, udp_port, sink))
        self._start_probe_recv(netdev, gap_us, udp_port, sink)

    def _start_probe_recv(self, netdev: str, gap_us: int, udp_port: int, sink) -> None:
        stream = self._keep(self.agent.probe_recv(netdev, gap_us, udp_port))

        def parse(recv_ns: int, line: str) -> Observation:
            p = parse_probe_line(line)
            return Observation("probe", self.name, netdev, p.kind, f"{p.src_mac} {p.seq}", p.host_ns, 0, recv_ns)

        self._spawn(stream, sink, parse, f"probe-recv-{netdev}")

    def start_probe_send(self, netdev: str, template: bytes, interval_us: int, sink) -> None:
        self._starters.append(lambda: self._start_probe_send(netdev, template, interval_us, sink))
        self._start_probe_send(netdev, template, interval_us, sink)

    def _start_probe_send(self, netdev: str, template: bytes, interval_us: int, sink) -> None:
        stream = self._keep(self.agent.probe_send(netdev, template, interval_us))
        self._spawn(stream, sink, None, f"probe-send-{netdev}")

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
