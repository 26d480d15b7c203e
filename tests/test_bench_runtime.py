"""The bench runtime's rules in milliseconds: scripted observations, a fake switch, no emulator."""
from __future__ import annotations

import contextlib
import threading
import json
from dataclasses import replace
from types import SimpleNamespace

import pytest
from hypothesis import given, settings, strategies as st

from devices.errors import DeviceDenied, DeviceTimeout
from devices.ocs.fake import FakeSwitch
from devices.resources import NicPort, OcsResource
from devices.timing import Deadline
from harness.bench import BenchBroken
from harness.bench.circuits import CircuitGuard, RetryPolicy
from harness.bench.live import LiveBench
from harness.bench.observe import CycleWatch, ObservationLog
from harness.bench.scripted import ScriptedObservations
from harness.bench.stages import PortRef, stage_events
from harness.steps.turnaround import TurnaroundParams, TurnaroundRun

MS = 1_000_000
OCS = OcsResource(name="ocs1", protocol="polatis-tl1", url="tcp://127.0.0.1:1", size=(8, 8),
                  allowed_ports=frozenset(range(1, 17)))
PORTS = {"h1:eth0": PortRef("h1:eth0", "h1", "eth0", "mlx5_0", 9),
         "h2:eth0": PortRef("h2:eth0", "h2", "eth0", "mlx5_0", 10)}
PORT_OF = {(p.host, p.netdev): k for k, p in PORTS.items()}
CHAIN = ("light_detected", "cdr_locked", "phy_up", "port_active", "first_packet")
MAC = {"h1:eth0": "02:00:00:00:00:02", "h2:eth0": "02:00:00:00:00:01"}


def _ctx(tmp_path, nics, session):
    ctx = SimpleNamespace(inventory=SimpleNamespace(nic_ports=nics, ocs={"ocs1": OCS}), cycles=1, run_dir=tmp_path,
                          resume_after={},
                          dry_run=False, teardown=contextlib.ExitStack(), stack=contextlib.ExitStack(),
                          switch=lambda name: FakeSwitch(OCS), session=lambda host: session,
                          open_sessions=lambda hosts: {h: session for h in hosts}, emulated=None,
                          manifest_extra={}, guards={}, observations=None, run_id="r", lease=None, broken=None)
    ctx.latch_broken = lambda why: setattr(ctx, "broken", ctx.broken or why)
    ctx.bench = LiveBench(ctx)
    return ctx


class _RecordingSession:
    def __init__(self):
        self.watched = []

    def start_watch(self, specs, *args):
        self.watched += specs

    def wait_watching(self, deadline):
        return []

    _stop = threading.Event()


def test_the_watch_reads_the_inventory_rdma_port(tmp_path):
    nics = (NicPort("h1", "eth0", "mlx5_0", 2, "ocs1", 1, 9), NicPort("h1", "eth1", "mlx5_0", 1, "ocs1", 2, 10))
    session = _RecordingSession()
    step = SimpleNamespace(name="measure", file="pb.yaml", line=1,
                           params=TurnaroundParams().model_dump() | {"probes": False})
    TurnaroundRun(_ctx(tmp_path, nics, session), step).setup()
    assert session.watched == [("eth0", "mlx5_0", 2), ("eth1", "mlx5_0", 1)]


# ---------------------------------------------------------------- cycle rules over scripted observations
def _watch(script, sent=100 * MS, completed=101 * MS, **kw):
    return CycleWatch({k: set(CHAIN) for k in PORTS}, PORT_OF, sent, completed, script.convert, peer_mac=MAC,
                      chain=CHAIN, **kw)


def _full_chain(script, host, start, step=1 * MS):
    for i, (field, value) in enumerate([("rx_los", "0"), ("rx_lol", "0"), ("carrier", "1"), ("state", "ACTIVE")]):
        script.watch(host, "eth0", field, value, start + i * step)
    script.probe(host, "eth0", MAC[f"{host}:eth0"], start + 4 * step)


def _feed(watch, script):
    for obs in script.items:
        watch.fault(obs, f"host:{obs.host}: {obs.field}") if obs.kind == "fault" else watch.feed(obs)
    return watch


def test_every_stage_seen_settles_at_once_with_the_poll_bound():
    script = ScriptedObservations()
    for host in ("h1", "h2"):
        _full_chain(script, host, 102 * MS)
    watch = _feed(_watch(script), script)
    assert watch.settled(0)
    events = stage_events("r", 1, PORTS, "ocs1", 100 * MS, 101 * MS, watch.result(110 * MS), script.convert, CHAIN)
    got = {(e.host, e.stage): (e.t_ns, e.uncertainty_ns) for e in events if e.host}
    # a polled change is the interval's midpoint ± (half the poll + clock bound + 1 µs granularity)
    assert got[("h1", "light_detected")] == (102 * MS - 100_000, 100_000 + 20_000 + 1_000)
    assert got[("h1", "first_packet")] == (106 * MS, 21_000)  # a probe is stamped by the kernel: clock only
    assert not [e for e in events if e.stage == "fault"]


def test_a_stage_passed_between_two_polls_is_bounded_by_its_neighbours():
    """carrier dropped and came back between two polls: phy_up is never seen, yet it happened after CDR lock
    and before port ACTIVE — recorded with exactly that interval, and the cycle is not faulted."""
    script = ScriptedObservations()
    _full_chain(script, "h1", 102 * MS)
    script.watch("h2", "eth0", "rx_los", "0", 102 * MS)
    script.watch("h2", "eth0", "rx_lol", "0", 103 * MS)
    script.watch("h2", "eth0", "state", "ACTIVE", 105 * MS)
    script.probe("h2", "eth0", MAC["h2:eth0"], 106 * MS)
    watch = _feed(_watch(script), script)
    assert watch.complete() and not watch.settled(0) and watch.settled(watch.grace_ns)  # late reports awaited
    arrivals = watch.result(110 * MS)
    assert arrivals.missing == {}
    events = {(e.host, e.stage): e for e in stage_events("r", 1, PORTS, "ocs1", 100 * MS, 101 * MS, arrivals,
                                                         script.convert, CHAIN)}
    phy = events[("h2", "phy_up")]
    lo, hi = phy.t_ns - phy.uncertainty_ns, phy.t_ns + phy.uncertainty_ns
    assert lo == 103 * MS - 200_000 - 21_000 and hi == 105 * MS + 21_000  # after CDR lock's lower bound, before ACTIVE
    assert phy.source == "between-polls:before port_active"
    assert not [e for e in events.values() if e.stage == "fault"]


def test_a_latched_loss_of_light_read_after_the_link_is_up_still_bounds_its_clearing():
    """A re-pairing faster than a poll (dark 30 µs at 100.03 ms, the new light at once): the sysfs poll sees the
    carrier drop and return (carrier_changes) at 100.2 ms, and the same poll's `ethtool -m` reads the module's
    latched LOS flag set; the next ethtool poll, at 100.4 ms, reads it clear. The light came back within the
    "1"'s interval, though the link was already up when it was read: light_detected's event holds 100.03 ms
    and the chain does not call the port's bounds contradictory (before, it kept the "0"'s own interval, later
    than the truth, and lost light_lost's reading as a "not yet")."""
    script = ScriptedObservations()
    _full_chain(script, "h1", 102 * MS)
    script.watch("h2", "eth0", "carrier", "0", 100_200_000)
    script.watch("h2", "eth0", "carrier", "1", 100_200_000)
    script.watch("h2", "eth0", "rx_los", "1", 100_200_000)
    script.watch("h2", "eth0", "rx_lol", "1", 100_200_000)
    script.watch("h2", "eth0", "state", "ACTIVE", 100_200_000)
    script.probe("h2", "eth0", MAC["h2:eth0"], 100_250_000)
    script.watch("h2", "eth0", "rx_los", "0", 100_400_000)
    script.watch("h2", "eth0", "rx_lol", "0", 100_400_000)
    arrivals = _feed(_watch(script, completed=100_040_000), script).result(110 * MS)
    events = {(e.host, e.stage): e for e in stage_events("r", 1, PORTS, "ocs1", 100 * MS, 100_040_000, arrivals,
                                                         script.convert, CHAIN)}
    assert not [e for e in events.values() if e.stage == "fault"]
    for stage in ("light_detected", "cdr_locked", "light_lost"):
        e = events[("h2", stage)]
        assert e.t_ns - e.uncertainty_ns <= 100_030_000 <= e.t_ns + e.uncertainty_ns, stage
    first = events[("h2", "first_packet")]
    assert events[("h2", "light_detected")].t_ns + events[("h2", "light_detected")].uncertainty_ns <= \
        first.t_ns + first.uncertainty_ns  # the chain's order holds: light before the first packet


def test_the_last_poll_that_saw_it_down_bounds_a_hidden_stage_from_below():
    script = ScriptedObservations()
    _full_chain(script, "h1", 102 * MS)
    script.watch("h2", "eth0", "carrier", "0", 101_500_000, interval_ns=200_000)  # still down at that poll
    script.probe("h2", "eth0", MAC["h2:eth0"], 104 * MS)
    arrivals = _feed(_watch(script), script).result(110 * MS)
    events = {(e.host, e.stage): e for e in stage_events("r", 1, PORTS, "ocs1", 100 * MS, 101 * MS, arrivals,
                                                         script.convert, CHAIN)}
    light, phy = events[("h2", "light_detected")], events[("h2", "phy_up")]
    assert light.t_ns - light.uncertainty_ns == 100 * MS  # nothing earlier than the command
    assert phy.t_ns - phy.uncertainty_ns == 101_500_000 - 200_000 - 21_000  # after the poll that saw it down
    assert phy.t_ns + phy.uncertainty_ns == 104 * MS + 21_000  # before the first probe through the circuit


def test_missing_stages_stale_reports_old_peer_probes_and_flaps():
    script = ScriptedObservations()
    script.watch("h1", "eth0", "rx_los", "0", 99 * MS, interval_ns=200_000)  # before the command: stale
    script.probe("h1", "eth0", "02:00:00:00:00:99", 102 * MS)  # the old peer's flow resuming
    script.watch("h1", "eth0", "rx_los", "0", 102 * MS)
    script.watch("h1", "eth0", "rx_lol", "0", 103 * MS)
    _full_chain(script, "h2", 102 * MS)
    script.watch("h2", "eth0", "carrier", "0", 108 * MS)  # lost again with the light on
    watch = _feed(_watch(script), script)
    assert not watch.complete()
    arrivals = watch.result(130 * MS)
    assert arrivals.missing == {"h1:eth0": ["first_packet", "phy_up", "port_active"]}
    assert arrivals.kept[("h1:eth0", "light_detected")].recv_ns == 102 * MS
    assert arrivals.flaps == {"h2:eth0": 1}
    assert watch.describe() == ("h1:eth0: saw light_detected, cdr_locked; missing first_packet, phy_up, "
                                "port_active")
    sources = [e.source for e in stage_events("r", 1, PORTS, "ocs1", 100 * MS, 101 * MS, arrivals,
                                              script.convert, CHAIN) if e.stage == "fault"]
    assert sources == ["timeout:missing first_packet+phy_up+port_active",
                       "link-flap:h2:eth0: carrier dropped 1x after phy_up"]


def test_a_reconnect_loses_what_was_reached_meanwhile():
    script = ScriptedObservations()
    _full_chain(script, "h1", 102 * MS)
    script.watch("h2", "eth0", "rx_los", "0", 102 * MS)
    script.fault("h2", at_ns=102_500_000)
    watch = _watch(script, reconnected={"h2": 103 * MS})
    _feed(watch, script)
    for field, value in [("rx_lol", "0"), ("carrier", "1"), ("state", "ACTIVE")]:  # the restarted watch's values
        watch.feed(script.watch("h2", "eth0", field, value, 104 * MS, interval_ns=0))
    arrivals = watch.result(110 * MS)
    assert arrivals.lost == {"h2:eth0": ["cdr_locked", "phy_up", "port_active", "first_packet"]}
    assert arrivals.causes == [("h2", "host:h2: agent watch")] and arrivals.missing == {}


def test_expect_returns_what_arrived_when_the_deadline_passes(tmp_path):
    script = ScriptedObservations()
    log = ObservationLog(tmp_path / "observations.jsonl")
    script.watch("h1", "eth0", "rx_los", "0", 102 * MS)
    for obs in script.items:
        log.put(obs)
    arrivals = log.expect(_watch(script), Deadline(0.05), on_fault=lambda obs: None)
    assert set(arrivals.kept) == {("h1:eth0", "light_detected")}
    assert arrivals.missing["h2:eth0"] == sorted(CHAIN)
    log.flush()
    (line,) = (tmp_path / "observations.jsonl").read_text().splitlines()
    assert json.loads(line) == {"k": "obs", "kind": "watch", "host": "h1", "netdev": "eth0", "field": "rx_los",
                                "value": "0", "host_ns": 107 * MS, "interval_ns": 200_000, "recv_ns": 102 * MS}



def test_lines_that_mark_no_stage_are_mirrored_but_not_queued_and_the_cycle_is_the_same(tmp_path):
    """operstate and phys_state mark no stage: observations.jsonl keeps every line, the step's queue only those
    a cycle's rules read (STAGE_FIELDS: every field of a stage, a "not yet" or a restarted watch's values),
    so the cycle keeps exactly what feeding it every line keeps."""
    from harness.bench.observe import REACHED
    from harness.bench.stages import STAGE_FIELDS

    assert {field for field, _ in REACHED.values()} <= STAGE_FIELDS
    assert STAGE_FIELDS == {"rx_los", "rx_lol", "carrier", "state", "module_state", "datapath_state"}  # CMIS: optional
    script = ScriptedObservations()
    for host in ("h1", "h2"):
        script.watch(host, "eth0", "rx_los", "1", 100 * MS + 300_000)
        script.watch(host, "eth0", "operstate", "down", 100 * MS + 400_000)
        _full_chain(script, host, 102 * MS)
        script.watch(host, "eth0", "phys_state", "LinkUp", 103 * MS + 600_000)
        script.watch(host, "eth0", "operstate", "up", 103 * MS + 700_000)
    log = ObservationLog(tmp_path / "observations.jsonl")
    log.put_many(script.items)
    log.put_many([o for o in script.items if o.field == "operstate"])  # a batch of nothing read: not queued
    queued = []
    while (obs := log.get(0)) is not None:
        queued.append(obs)
    assert queued == [o for o in script.items if o.field not in ("operstate", "phys_state")] and len(queued) == 12
    log.flush()
    mirrored = [json.loads(line) for line in (tmp_path / "observations.jsonl").read_text().splitlines()]
    assert [(m["host"], m["field"], m["value"]) for m in mirrored] == \
        [(o.host, o.field, o.value) for o in script.items + [o for o in script.items if o.field == "operstate"]]
    for obs in script.items:
        log.put(obs)
    through_log = log.expect(_watch(script), Deadline(5), on_fault=lambda obs: None)
    direct = _feed(_watch(script), script).result(through_log.done_ns)
    assert through_log == direct and not through_log.missing and len(direct.kept) == 12



def test_the_mirror_writes_lines_at_flush_in_the_order_put_and_loses_none_put_meanwhile(tmp_path, monkeypatch):
    """The reader's `put_many` only queues a batch for the mirror; `flush` (the step's, once the next command is
    out) and `close` write every batch put before them, in order; a record written meanwhile (a clock sample,
    which may come in a cycle's burst) does not. Batches put from another thread while the mirror is written
    are each written exactly once, and with nobody flushing, the queue is written once it holds too many."""
    from harness.bench import observe
    from harness.clock import ClockSample

    path = tmp_path / "observations.jsonl"
    script = ScriptedObservations()
    for i in range(3000):
        script.watch("h1", "eth0", "carrier", str(i % 2), 100 * MS + i * 1000)
    items = script.items
    log = ObservationLog(path)
    log.put_many(items[:2])
    log._file.flush()
    assert path.read_text() == ""  # not serialised on the reader's thread
    sample = ClockSample(**{f: 1 for f in ClockSample.__dataclass_fields__})
    log.clock_sample("h1", sample)  # a record: written at once, the lines at the next flush
    log._file.flush()
    assert [json.loads(line)["k"] for line in path.read_text().splitlines()] == ["clock"]
    log.flush()
    assert [json.loads(line)["k"] for line in path.read_text().splitlines()] == ["clock", "obs", "obs"]

    batches = [items[i:i + 7] for i in range(2, len(items), 7)]
    done = threading.Event()

    def reader() -> None:
        for batch in batches:
            log.put_many(batch)
        done.set()

    thread = threading.Thread(target=reader)
    thread.start()
    while not done.is_set():
        log.flush()
    thread.join()
    log.close()
    written = [json.loads(line) for line in path.read_text().splitlines()]
    assert [w["host_ns"] for w in written if w["k"] == "obs"] == [o.host_ns for o in items]

    monkeypatch.setattr(observe, "_UNWRITTEN_MAX", 3)
    unflushed = ObservationLog(tmp_path / "unflushed.jsonl")
    for obs in items[:4]:
        unflushed.put_many([obs])  # the fourth batch writes all four
    unflushed._file.flush()
    assert len((tmp_path / "unflushed.jsonl").read_text().splitlines()) == 4
    unflushed.close()


def test_the_cycles_collector_frees_what_became_cyclic_garbage_and_freezes_the_rest():
    """During a step's cycles automatic collection is off; `collect_young`, once a cycle in its physical wait,
    collects what is cyclic garbage by then and freezes the survivors (not scanned again)."""
    import gc
    import weakref

    from harness.steps.turnaround import collect_young

    class Node:
        pass

    automatic = gc.isenabled()
    gc.disable()
    try:
        garbage, alive = Node(), Node()
        garbage.me, alive.me = garbage, alive  # two reference cycles; only `alive` is still referenced
        gone = weakref.ref(garbage)
        del garbage
        frozen = gc.get_freeze_count()
        assert gone() is not None  # refcounting alone never frees a cycle
        collect_young()
        assert gone() is None and alive.me is alive
        assert gc.get_freeze_count() > frozen and gc.get_count()[0] < 50
    finally:
        gc.unfreeze()
        if automatic:
            gc.enable()


# ---------------------------------------------------------------- guarded circuits
class _Flaky(FakeSwitch):
    def __init__(self, failures):
        super().__init__(OCS)
        self.failures, self.reconnects = list(failures), 0

    def apply(self, mapping, *, exclusive=False):
        if self.failures:
            raise self.failures.pop(0)
        return super().apply(mapping, exclusive=exclusive)

    def reconnect(self):
        self.reconnects += 1


def test_guard_retries_transient_faults_and_refuses_permanent_ones(tmp_path):
    switch = _Flaky([DeviceDenied("x", "SNVS", "busy"), DeviceTimeout("silent")])
    guard = CircuitGuard("ocs1", switch, snapshot_path=tmp_path / "restore.json", resuming=False)
    applied = guard.apply({1: 9}, RetryPolicy(retries=2, backoff_s=0.001))
    assert applied.causes == ("ocs-retry:ocs1: denied SNVS", "ocs-retry:ocs1: timeout") and switch.reconnects == 1
    assert switch.patches() == {1: 9} and switch.timeout_s == 10.0
    switch.failures = [DeviceDenied("x", "IIAC", "bad port", permanent=True)]
    with pytest.raises(BenchBroken, match="IIAC"):
        guard.apply({2: 10}, RetryPolicy(retries=5, backoff_s=0.001))
    switch.failures = [DeviceDenied("x", "SNVS")] * 3
    with pytest.raises(BenchBroken, match="gave up after 3 attempts"):
        guard.apply({2: 10}, RetryPolicy(retries=2, backoff_s=0.001))


class _WritesThenWaits(FakeSwitch):
    """A switch whose `begin_apply` writes (stamping `writes`) and whose reply is read at `finish`: each of
    `replies` is raised there in turn, then the fake's own apply answers."""

    def __init__(self, replies=(), unwritten=0):
        super().__init__(OCS)
        self.replies, self.unwritten, self.writes, self.finished = list(replies), unwritten, [], 0

    def begin_apply(self, mapping, *, exclusive=False):
        from devices.protocols import Pending
        from devices.timing import now_ns

        if self.unwritten:  # fails before anything is written
            self.unwritten -= 1
            raise DeviceTimeout("connection not ready")

        def steps():
            self.writes.append(now_ns())
            yield self.writes[-1]
            self.finished += 1
            if self.replies:
                raise self.replies.pop(0)
            timing = super(_WritesThenWaits, self).apply(mapping, exclusive=exclusive)
            return replace(timing, sent_ns=self.writes[-1])

        return Pending(steps())


def test_a_guarded_apply_is_written_at_begin_and_its_reply_and_retries_are_finish_s(tmp_path):
    from harness.bench.stages import ocs_events

    switch = _WritesThenWaits()
    guard = CircuitGuard("ocs1", switch, snapshot_path=tmp_path / "restore.json", resuming=False)
    command = guard.begin({1: 9}, RetryPolicy(retries=2, backoff_s=0.001))
    # on the wire, its reply not read: the cycle's command time is known now, and it is what finish reports
    assert switch.writes and command.sent_ns == switch.writes[0] and switch.finished == 0 and switch.patches() == {}
    applied = command.finish()
    assert switch.finished == 1 and switch.patches() == {1: 9}
    assert applied.first_sent_ns == command.sent_ns == applied.timing.sent_ns and applied.causes == ()

    # written, then its reply timed out: the change may have gone out at that write, which stays the command's
    # time; the retry reads the switch and sends what is missing, and the bound reaches its write
    switch.replies = [DeviceTimeout("silent")]
    command = guard.begin({2: 10}, RetryPolicy(retries=2, backoff_s=0.001))
    first_write = command.sent_ns
    applied = command.finish()
    assert len(switch.writes) == 3 and first_write == switch.writes[1] and applied.first_sent_ns == first_write
    assert applied.causes == ("ocs-retry:ocs1: timeout",) and switch.patches() == {2: 10}
    (sent,) = ocs_events("r", 1, "ocs1", applied.first_sent_ns, None, applied.ocs_stamps)
    assert sent.source == "harness:first attempt's write, 1 retries"
    assert sent.t_ns - sent.uncertainty_ns <= first_write and switch.writes[2] <= sent.t_ns + sent.uncertainty_ns

    # failed before its write: nothing is known at begin; finish retries and the first attempt's start stands
    switch.unwritten = 1
    command = guard.begin({3: 11}, RetryPolicy(retries=2, backoff_s=0.001))
    assert command.sent_ns == 0 and len(switch.writes) == 3
    applied = command.finish()
    assert applied.first_sent_ns == command.first_start < switch.writes[3] and applied.causes == (
        "ocs-retry:ocs1: timeout",)
    assert ocs_events("r", 1, "ocs1", applied.first_sent_ns, None, applied.ocs_stamps)[0].source == \
        "harness:first attempt's start, 1 retries"

    # a refusal the driver calls permanent, at finish: the bench is broken, as with `apply`
    switch.replies = [DeviceDenied("x", "IIAC", "bad port", permanent=True)]
    with pytest.raises(BenchBroken, match="IIAC"):
        guard.begin({4: 12}, RetryPolicy(retries=5, backoff_s=0.001)).finish()


def test_expect_feeds_lines_while_the_command_s_reply_is_awaited_and_settles_only_once_it_came():
    from concurrent.futures import Future

    from devices.timing import CommandTiming

    script = ScriptedObservations()
    for host in ("h1", "h2"):
        _full_chain(script, host, 102 * MS)
    log = ObservationLog(None)
    for obs in script.items:
        log.put(obs)
    command = Future()
    watch = _watch(script, completed=None)
    done = threading.Event()
    threading.Thread(target=lambda: (done.wait(10), command.set_result(SimpleNamespace(
        timing=CommandTiming(100 * MS, 101 * MS))), log.wake()), daemon=True).start()
    fed = []
    real_feed = watch.feed
    watch.feed = lambda obs: (fed.append(obs), real_feed(obs), len(fed) == len(script.items) and done.set())
    arrivals = log.expect(watch, Deadline(20), on_fault=lambda obs: None, command=command)
    # every line was fed before the reply came (it comes only then), and the cycle waited for the reply
    assert len(fed) == len(script.items) and command.done() and watch.completed == 101 * MS
    assert arrivals.missing == {} and len(arrivals.kept) == 2 * len(CHAIN)
    # the same cycle with the reply known from the start: the same arrivals
    again = _feed(_watch(script), script).result(arrivals.done_ns)
    assert (again.kept, again.missing, again.lost) == (arrivals.kept, arrivals.missing, arrivals.lost)

    # a command that failed ends the wait at once, whatever the lines
    failed = Future()
    failed.set_exception(BenchBroken("ocs ocs1: gave up"))
    arrivals = log.expect(_watch(script, completed=None), Deadline(20), on_fault=lambda obs: None, command=failed)
    assert arrivals.kept == {} and set(arrivals.missing) == set(PORTS)


def test_a_reconnected_host_s_current_values_wait_for_the_command_s_reply():
    script = ScriptedObservations()
    _full_chain(script, "h1", 102 * MS)
    script.watch("h2", "eth0", "rx_los", "0", 102 * MS)
    script.fault("h2", at_ns=102_500_000)
    restarted = [script.watch("h2", "eth0", f, v, 104 * MS, interval_ns=0)
                 for f, v in [("rx_lol", "0"), ("carrier", "1"), ("state", "ACTIVE")]]
    after = script.probe("h2", "eth0", MAC["h2:eth0"], 105 * MS)

    def cycle(completed, reply_at):
        watch = _feed(_watch(script, completed=completed, reconnected={"h2": 103 * MS}),
                      SimpleNamespace(items=script.items[:-4]))
        for k, obs in enumerate(restarted + [after]):
            if k == reply_at:
                watch.command_completed(101 * MS)
            watch.feed(obs)
        return watch.result(110 * MS)

    known = cycle(101 * MS, None)  # the reply known before the lines
    assert known.lost == {"h2:eth0": ["cdr_locked", "phy_up", "port_active", "first_packet"]}
    for reply_at in range(len(restarted) + 1):  # the reply came while the restarted watch's lines came
        late = cycle(None, reply_at)
        assert (late.lost, late.kept, late.missing) == (known.lost, known.kept, known.missing), reply_at


def test_guard_restores_only_touched_ports_and_verifies(tmp_path):
    switch = FakeSwitch(OcsResource(name="ocs1", protocol="polatis-tl1", url="tcp://127.0.0.1:1", size=(8, 8),
                                    allowed_ports=frozenset({1, 2, 3, 9, 10, 11})))
    switch._patches = {1: 9, 3: 11, 4: 12}  # 4 -> 12 is outside the allowlist: never ours
    guard = CircuitGuard("ocs1", switch, snapshot_path=tmp_path / "restore.json", resuming=False)
    assert json.loads((tmp_path / "restore.json").read_text()) == {"ocs1": {"1": 9, "3": 11, "4": 12}}
    guard.apply({1: 10, 2: 9}, exclusive=False)
    switch._patches[3] = 11  # untouched ports keep whatever they have
    assert guard.restore(within_s=5).restored and switch.patches() == {1: 9, 3: 11, 4: 12}
    resumed = CircuitGuard("ocs1", switch, snapshot_path=tmp_path / "restore.json", resuming=True,
                           allowed=switch.resource.allowed_ports)
    switch._patches = {1: 10}
    assert resumed.snapshot == {1: 9, 3: 11, 4: 12} and resumed.verify(switch.patches()) is True  # touched none
    resumed.apply({1: 11, 2: 10})
    outcome = resumed.restore(within_s=5)
    assert outcome.restored and switch.patches() == {1: 9, 3: 11}  # exclusive touched 3: it is restored too


def test_report_reconverts_the_cycles_with_the_final_clock_fit(tmp_path):
    """observations.jsonl keeps clock samples and each cycle's arrivals: converting again with every sample
    gives the events the run gave, bounded now by a sample after them too."""
    from harness.bench.recorrect import recorrected_events
    from harness.clock import ClockSample, ClockTracker

    script = ScriptedObservations(offset_ns=7 * MS)
    for host in ("h1", "h2"):
        _full_chain(script, host, 102 * MS)
    log = ObservationLog(tmp_path / "observations.jsonl")
    trackers = {h: ClockTracker(h) for h in ("h1", "h2")}
    for t, unc in [(90 * MS, 400_000), (200 * MS, 30_000)]:  # a loose sample before, a tight one after
        for host, tracker in trackers.items():
            sample = ClockSample(t_ns=t, offset_ns=7 * MS, delay_ns=2 * unc, uncertainty_ns=unc)
            tracker.add(sample)
            log.clock_sample(host, sample)
    for obs in script.items:
        log.put(obs)
    watch = _feed(_watch(script), script)
    arrivals = watch.result(110 * MS)
    log.cycle(1, 100 * MS, 101 * MS, "ocs1", PORTS, arrivals)
    log.close()
    again = recorrected_events(tmp_path, "r")
    convert = lambda host, ns: trackers[host].to_harness(ns)  # noqa: E731
    expected = [e.to_dict() for e in stage_events("r", 1, PORTS, "ocs1", 100 * MS, 101 * MS, arrivals, convert)]
    assert again.to_dict(orient="records") == expected
    first = again[(again["host"] == "h1") & (again["stage"] == "first_packet")].iloc[0]
    assert first["t_ns"] == 106 * MS and first["uncertainty_ns"] < 400_000


def test_lines_a_clock_step_makes_look_older_than_the_command_wait_for_a_sample():
    """A host clock that stepped back 25 ms, not yet known: its lines convert to before the command although
    they arrived after it. They are kept aside, a clock sample is asked for once, and they count once the
    conversion knows the step (here: the scripted offset corrected)."""
    script = ScriptedObservations()
    _full_chain(script, "h1", 102 * MS)
    _full_chain(script, "h2", 102 * MS)
    stepped = [replace(o, host_ns=o.host_ns - 25 * MS) for o in script.items if o.host == "h2"]
    script.items = [o for o in script.items if o.host == "h1"] + stepped
    asked, landed = [], []
    watch = _feed(_watch(script, suspect=lambda host: asked.append(host) or (lambda: bool(landed))), script)
    assert asked == ["h2"] and not watch.complete()
    watch.retry()
    assert not watch.complete() and asked == ["h2"]  # still waiting for the sample: no second request
    script.offset_ns -= 25 * MS  # the sample the request brought in revealed the step
    landed.append(True)
    watch.retry()
    assert watch.settled(0) and watch.result(110 * MS).missing == {}
    assert watch.arrivals.kept[("h2:eth0", "phy_up")].host_ns == stepped[2].host_ns


def test_a_host_s_parked_lines_count_before_its_next_one():
    """The sample that reveals the step lands between two lines: the parked ones count first, so the old
    side's carrier loss is not taken for a flap after the new link came up."""
    script = ScriptedObservations()
    script.watch("h2", "eth0", "carrier", "0", 101_500_000)  # the old circuit's light gone
    _full_chain(script, "h2", 102 * MS)
    early = [replace(o, host_ns=o.host_ns - 25 * MS) for o in script.items]
    landed = []
    watch = _watch(script, suspect=lambda host: lambda: bool(landed))
    for obs in early[:4]:  # the old side's loss converts early, the new link's first stages too
        watch.feed(obs)
    for obs in early[4:]:  # these would convert after the command even with the step unknown: they wait
        watch.feed(replace(obs, host_ns=obs.host_ns + 25 * MS + 3 * MS))
    assert not watch.arrivals.kept
    script.offset_ns -= 25 * MS  # the sample revealed the step
    landed.append(True)
    watch.retry()
    arrivals = watch.result(110 * MS)
    assert arrivals.flaps == {} and ("h2:eth0", "port_down") in arrivals.kept
    assert ("h2:eth0", "first_packet") in arrivals.kept and "h2:eth0" not in arrivals.missing


def test_lines_surely_after_the_command_are_not_converted_and_decide_the_same(monkeypatch):
    """A line whose host time lies well past the command's (as the host's first line this cycle put it) cannot
    be stale: its stale check skips the conversion, and the cycle keeps exactly what checking every line keeps.
    What a port's events are made of (kept and not-yet observations) is converted as it arrives, once, and the
    events reuse it. Lines near the command, and every line after the host clock's generation changed (a step),
    are checked."""
    from harness.bench.stages import CycleEvents

    script = ScriptedObservations()
    for host in ("h1", "h2"):
        script.watch(host, "eth0", "carrier", "0", 99 * MS)  # before the command: stale, dropped
        script.watch(host, "eth0", "rx_los", "1", 100 * MS + 300_000)  # near it: checked (and kept: not yet)
        _full_chain(script, host, 102 * MS)
        script.watch(host, "eth0", "operstate", "up", 103 * MS + 500_000)  # marks no stage: never converted
        script.watch(host, "eth0", "phys_state", "LinkUp", 103 * MS + 600_000)
    generation = {"h1": 0, "h2": 0}
    calls = []

    def convert(host, host_ns):
        calls.append((host, host_ns))
        return script.convert(host, host_ns)

    def run(exact: bool):
        calls.clear()
        generation.update(h1=0, h2=0)
        built = CycleEvents("r", 1, PORTS, 100 * MS, convert, CHAIN, generation=generation.__getitem__)
        watch = CycleWatch({k: set(CHAIN) for k in PORTS}, PORT_OF, 100 * MS, 101 * MS, convert, peer_mac=MAC,
                           chain=CHAIN, events=built)
        if exact:
            monkeypatch.setattr(watch, "_mark_after", lambda *args: None)  # nothing surely after: all converted
        for i, obs in enumerate(script.items):
            if i == 11:
                generation["h2"] += 1  # h2's clock found to have stepped: its next line is checked again
            watch.feed(obs)
        a = watch.result(110 * MS)
        converted = len(calls)
        events = stage_events("r", 1, PORTS, "ocs1", 100 * MS, 101 * MS, a, convert, CHAIN, built, watch.version)
        marks = {host: gen for host, (_, gen) in watch._host_after.items()}
        return (a.kept, a.not_yet, a.flaps, a.missing, events), calls[:converted], calls[converted:], marks

    midpoint = lambda obs: (obs.host, obs.host_ns - obs.interval_ns // 2)  # noqa: E731
    fast, fast_calls, fast_end, marks = run(exact=False)
    exact, exact_calls, exact_end, _ = run(exact=True)
    assert fast == exact and len(script.items) == 18 and len(exact_calls) == len(set(exact_calls)) == 18
    # the events reuse every conversion made while the cycle waited, but for h2's one made before its step
    assert fast_end == exact_end == [midpoint(script.items[10])]
    kept = {midpoint(o) for o in [*exact[0].values(), *exact[1].values()]}
    stale = {midpoint(o) for o in script.items if o.recv_ns < 100 * MS}
    assert set(fast_calls) == kept | stale and len(fast_calls) == len(kept | stale)  # each once
    assert marks == {"h1": 0, "h2": 1}  # h2's lines were checked again after its step, and marked anew
    assert not {midpoint(o) for o in script.items if o.field in ("operstate", "phys_state")} & set(fast_calls)


def test_events_built_while_the_cycle_waits_equal_those_built_at_its_end():
    """`prepare` builds the events of a port that has seen everything while nothing is queued; the cycle's
    end builds only the others and those that changed since (a clock step on their host)."""
    from harness.bench.stages import CycleEvents, cycle_events
    from harness.eventlog import encode

    script = ScriptedObservations()
    steps = {"h1": 0, "h2": 0}
    _full_chain(script, "h1", 102 * MS)
    script.watch("h1", "eth0", "carrier", "0", 101 * MS + 500_000)  # the old link going (not in the chain)
    for i, (field, value) in enumerate([("rx_los", "0"), ("rx_lol", "0"), ("carrier", "1")]):
        script.watch("h2", "eth0", field, value, 102 * MS + i * MS)
    script.probe("h2", "eth0", MAC["h2:eth0"], 106 * MS)  # h2 complete: its first probe is in
    late = script.watch("h2", "eth0", "state", "ACTIVE", 105 * MS)  # its watch's line comes after the probe's

    def cycle(prepared_between: bool, stepped: str | None = None):
        built = CycleEvents("r", 1, PORTS, 100 * MS, script.convert, CHAIN, lambda host: steps[host], encode)
        watch = _watch(script, events=built)
        for obs in script.items:
            if obs is not late:
                watch.feed(obs)
        while watch.prepare():
            pass
        assert set(built._built) == {"h1:eth0"} and built.rebuilt == 0  # h2 still waits for port_active
        watch.feed(late)
        if prepared_between:
            assert watch.prepare() and not watch.prepare()  # h2 only, once
        if stepped:
            steps[stepped] += 1
        arrivals = watch.result(110 * MS)
        events, encoded = cycle_events("r", 1, PORTS, "ocs1", 100 * MS, 101 * MS, arrivals, script.convert, CHAIN,
                                       built, watch.version)
        assert events == stage_events("r", 1, PORTS, "ocs1", 100 * MS, 101 * MS, arrivals, script.convert, CHAIN)
        assert encoded == [encode(e) for e in events]
        return built.rebuilt

    assert cycle(prepared_between=False) == 1  # h2 completed last: built at the end
    assert cycle(prepared_between=True) == 0  # built again while waiting: nothing left for the end
    assert cycle(prepared_between=True, stepped="h1") == 1  # h1's clock stepped since: its conversions redone


def test_the_ocs_events_carry_the_commands_bounds_and_after_retries_reach_back_to_the_first_attempt():
    from devices.timing import CommandTiming
    from harness.bench.circuits import Applied
    from harness.bench.stages import ocs_events

    timing = CommandTiming(1_000, 5_000, 10, 20, "write", "kernel")
    sent, completed = ocs_events("r", 1, "ocs1", 1_000, 5_000, Applied(timing, 1_000).ocs_stamps)
    assert (sent.t_ns, sent.uncertainty_ns, sent.source) == (1_000, 10, "harness:write")
    assert (completed.t_ns, completed.uncertainty_ns, completed.source) == (5_000, 20, "harness:kernel")
    # retried: the first attempt (started at 400) may have sent its change unanswered, any time up to the last
    # attempt's write (ended by 1_010): t_ns stays the first attempt's start, ± reaches the last write
    retried = Applied(timing, 400, ("ocs-retry:ocs1: timeout",)).ocs_stamps
    (sent,) = ocs_events("r", 1, "ocs1", 400, None, retried)
    assert sent.t_ns - sent.uncertainty_ns <= 400 and 1_010 <= sent.t_ns + sent.uncertainty_ns
    assert sent.uncertainty_ns == 610 and sent.source == "harness:first attempt's start, 1 retries"


def _partial_cycle(script, feed_last, prepare_at=(), step_at=None):
    """Feed `script` with `feed_last` held back to the end, `prepare` run to exhaustion after the items at
    `prepare_at`; a clock step on h1 after item `step_at`. Returns the cycle's events (built while it
    waited) against those built from scratch, and its CycleEvents."""
    from harness.bench.stages import CycleEvents, cycle_events
    from harness.eventlog import encode

    steps = {"h1": 0, "h2": 0}
    built = CycleEvents("r", 1, PORTS, 100 * MS, script.convert, CHAIN, lambda host: steps[host], encode)
    watch = _watch(script, events=built)
    items = [o for o in script.items if o not in feed_last] + list(feed_last)
    for i, obs in enumerate(items):
        watch.feed(obs)
        if i == step_at:
            steps["h1"] += 1
        if i in prepare_at:
            while watch.prepare():
                pass
    arrivals = watch.result(120 * MS)
    events, encoded = cycle_events("r", 1, PORTS, "ocs1", 100 * MS, 101 * MS, arrivals, script.convert, CHAIN,
                                   built, watch.version)
    assert encoded == [encode(e) for e in events]
    return events, stage_events("r", 1, PORTS, "ocs1", 100 * MS, 101 * MS, arrivals, script.convert, CHAIN), built


def test_a_port_waiting_only_for_its_first_probe_is_built_then_and_the_probe_adds_its_own_event():
    """The ports whose first probe comes in the cycle's last batch of lines: their other events are built
    while the cycle waits, the probe's added at the end — unless its upper bound is below an earlier
    stage's (then that one's event changes: the port is built whole). Either way the same events as
    from scratch."""
    for probe_at, whole in ((106 * MS, False), (104 * MS + 50_000, True)):  # after / inside port_active's bound
        script = ScriptedObservations()
        script.watch("h1", "eth0", "carrier", "0", 101 * MS + 500_000)  # the old link going
        script.watch("h1", "eth0", "rx_los", "1", 101 * MS + 700_000)  # not lit yet: a lower bound
        for i, (field, value) in enumerate([("rx_los", "0"), ("rx_lol", "0"), ("carrier", "1"), ("state", "ACTIVE")]):
            script.watch("h1", "eth0", field, value, 102 * MS + i * MS, interval_ns=1_000_000)
        probe = script.probe("h1", "eth0", MAC["h1:eth0"], probe_at)
        events, scratch, built = _partial_cycle(script, [probe], prepare_at={5})
        assert events == scratch and [e.stage for e in events if e.host == "h1"][4:6] == ["first_packet", "light_lost"]
        assert (built.completed, built.rebuilt) == ((0, 1) if whole else (1, 0))
    # a "not yet" line whose lower bound is above the probe's own: the probe's event starts there
    script = ScriptedObservations()
    script.watch("h1", "eth0", "rx_lol", "1", 106 * MS + 10_000, interval_ns=1_000)  # comes first, stamped late
    for i, (field, value) in enumerate([("rx_los", "0"), ("rx_lol", "0"), ("carrier", "1"), ("state", "ACTIVE")]):
        script.watch("h1", "eth0", field, value, 102 * MS + i * MS, interval_ns=1_000_000)
    probe = script.probe("h1", "eth0", MAC["h1:eth0"], 106 * MS)
    events, scratch, built = _partial_cycle(script, [probe], prepare_at={4})
    first = next(e for e in events if e.stage == "first_packet")
    probe_lo = 106 * MS - script.clock_unc_ns - 1_000
    assert events == scratch and built.completed == 1 and first.t_ns - first.uncertainty_ns > probe_lo


@settings(max_examples=150, deadline=None)
@given(st.data())
def test_events_built_while_the_cycle_waits_equal_those_from_scratch_whatever_the_order(data):
    """Random cycles of two ports — stages seen or passed between polls, "not yet" lines, the old link's
    going, first probes early or late, lines in any order, idle moments anywhere, a clock step — build the
    same events as from scratch."""
    script = ScriptedObservations()
    base, spread = data.draw(st.integers(0, 300_000)), data.draw(st.integers(1, 2_000_000))
    # a clock bound that differs from one conversion to the next, as a tracker's does
    script.convert = lambda host, host_ns: (host_ns - script.offset_ns, script.offset_ns,
                                            base + (host_ns // 1000 * 7919) % spread)
    for host in ("h1", "h2"):
        t = 101 * MS
        if data.draw(st.booleans()):
            script.watch(host, "eth0", "carrier", "0", t + data.draw(st.integers(0, MS)))
        if data.draw(st.booleans()):
            script.watch(host, "eth0", "rx_los", "1", t + data.draw(st.integers(0, 2 * MS)))
        for field, value in [("rx_los", "0"), ("rx_lol", "0"), ("carrier", "1"), ("state", "ACTIVE")]:
            t += data.draw(st.integers(0, 2 * MS))
            if data.draw(st.integers(0, 4)):  # else passed between two polls
                script.watch(host, "eth0", field, value, t, interval_ns=data.draw(st.integers(0, 2 * MS)))
        if data.draw(st.integers(0, 4)):
            script.probe(host, "eth0", MAC[f"{host}:eth0"], t + data.draw(st.integers(-2 * MS, 3 * MS)))
    order = data.draw(st.permutations(range(len(script.items))))
    script.items = [script.items[i] for i in order]
    n = len(script.items)
    last = data.draw(st.lists(st.sampled_from(script.items), max_size=2, unique_by=id)) if n else []
    prepare_at = set(data.draw(st.lists(st.integers(0, max(0, n - 1)), max_size=n)))
    step_at = data.draw(st.none() | st.integers(0, max(0, n - 1)))
    events, scratch, _ = _partial_cycle(script, last, prepare_at, step_at)
    assert events == scratch


def test_the_lines_of_one_poll_share_one_conversion_until_the_clock_steps():
    """`CycleEvents.bound` converts once per (host, host time, poll interval): a host's poll prints up to four
    stage lines per port at one time; another time, interval or host, or a step (generation), converts again,
    and every answer is `interval`'s own."""
    from harness.bench.stages import CycleEvents, interval
    from harness.bench.hosts import Observation

    calls = []

    def convert(host, host_ns):
        calls.append((host, host_ns))
        return host_ns - 7 * MS, 7 * MS, 3_000

    generation = {"h1": 0, "h2": 0}
    built = CycleEvents("r", 1, PORTS, 100 * MS, convert, generation=generation.__getitem__)
    poll = [Observation("watch", "h1", f"eth{i % 2}", field, "0", 120 * MS, 200_000, 0)
            for i, field in enumerate(("rx_los", "rx_lol", "rx_los", "rx_lol"))]
    answers = [built.bound(o) for o in poll]
    assert len(calls) == 1 and answers == [interval(poll[0], convert)] * 4
    del calls[1:]  # interval's own call just now
    built.bound(replace(poll[0], interval_ns=100_000))
    built.bound(replace(poll[0], host="h2"))
    built.bound(replace(poll[0], host_ns=121 * MS))
    assert len(calls) == 4
    generation["h1"] += 1  # h1's clock stepped: its bounds made before are not reused
    assert built.bound(poll[1]) == answers[0] and len(calls) == 5
    assert built.bound(poll[2]) == answers[0] and len(calls) == 5
