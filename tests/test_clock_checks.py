"""Which cycles a clock step labels when the clock check that closes a cycle runs during the next one
(harness.bench.hosts.HostGroup: pipelined checks, `clock_labels`)."""
from __future__ import annotations

import threading

from harness.bench.hosts import HostGroup
from harness.clock import ClockStep


class FakeSession:
    def __init__(self, name):
        self.name, self.clock_probes = name, 1
        self._stop = threading.Event()
        self.steps: list[ClockStep] = []

    def clock_step_list(self):
        return list(self.steps)


def step(lo, hi, jump_ms=5.0):
    return ClockStep(t_ns=hi, after_ns=lo, jump_ns=int(jump_ms * 1e6), uncertainty_ns=100, not_before_ns=lo,
                     not_after_ns=hi)


def group(*spans):
    hosts = HostGroup({"a": FakeSession("a")})
    for cycle, begin, done in spans:
        hosts.cycle_started(cycle, begin)
        if done is not None:
            hosts.cycle_ended(done)
    return hosts, hosts.sessions["a"]


def test_a_step_labels_each_cycle_that_may_hold_it_once():
    hosts, a = group((1, 100, 200), (2, 210, 300))
    a.steps.append(step(150, 205))  # in cycle 1, or between cycles: cycle 1 only
    assert hosts.clock_labels() == {1: [("a", "clock-step:a: +5.000 ms ± 0.000")]}
    assert hosts.clock_labels() == {}  # reported once
    a.steps.append(step(190, 220, -2.5))  # the check closing cycle 1 answered after cycle 2 began: both
    assert hosts.clock_labels() == {1: [("a", "clock-step:a: -2.500 ms ± 0.000")], 2: [("a", "clock-step:a: -2.500 ms ± 0.000")]}
    a.steps.append(step(205, 250))  # after the check that closed cycle 1 was sent: cycle 2 only
    assert list(hosts.clock_labels()) == [2]
    a.steps.append(step(20, 90))  # before the first cycle (warm-up): nothing to label
    assert hosts.clock_labels() == {}


def test_the_running_cycle_is_open_ended():
    hosts, a = group((1, 100, 200), (2, 210, None))
    a.steps.append(step(400, 500))
    assert list(hosts.clock_labels()) == [2]


def test_a_check_runs_on_the_clock_thread_and_labels_wait_for_it(monkeypatch):
    hosts, a = group((1, 100, 200), (2, 210, 300))
    ran_on = []

    def sync_all(sessions, probes):
        ran_on.append((threading.current_thread().name, probes))
        a.steps.append(step(250, 320))  # what the check found: a step late in cycle 2
        return [("a", "no reply to c7 before the deadline")]

    monkeypatch.setattr(HostGroup, "_sync_all", staticmethod(sync_all))
    hosts.start_clock_sync(3600.0)  # no background round within the test
    hosts.request_check(2, 1)
    labels = hosts.clock_labels()
    hosts.stop()
    assert ran_on == [("clock-sync", 1)]
    assert labels == {2: [("a", "host:a: clock probe failed: no reply to c7 before the deadline"),
                          ("a", "clock-step:a: +5.000 ms ± 0.000")]}


def test_no_check_without_probes_and_at_once_without_the_thread(monkeypatch):
    hosts, a = group((1, 100, 200))
    calls = []
    monkeypatch.setattr(HostGroup, "_sync_all", staticmethod(lambda sessions, probes: calls.append(probes) or []))
    hosts.request_check(1, 0)
    assert calls == []
    hosts.request_check(1, 3)  # no clock thread: the check runs here, one host at a time
    assert calls == [3] and hosts.clock_labels() == {}



def test_the_generation_a_cycle_reads_changes_with_a_step_and_only_then():
    """`clock_generation` (read per host line) is the tracker's segment count, kept by the session as it adds
    each sample: another sample leaves it, the sample that reveals a step moves it, before anyone can read
    the new model with the old generation."""
    from devices.resources import HostResource
    from harness.clock import ClockSample, ClockTracker
    from harness.bench.hosts import HostSession

    session = HostSession(HostResource("gpu1", "127.0.0.1"), transport=object())
    session.clock = ClockTracker("gpu1")
    session._add_sample(ClockSample(t_ns=10**9, offset_ns=5_000_000, delay_ns=40_000, uncertainty_ns=20_000))
    hosts = HostGroup({"gpu1": session})
    assert hosts.clock_generation("gpu1") == 1
    for k in range(2, 6):  # the same offset, drift-free: no step
        session._add_sample(ClockSample(t_ns=k * 10**9, offset_ns=5_000_000, delay_ns=40_000, uncertainty_ns=20_000))
    assert hosts.clock_generation("gpu1") == 1 and not session.clock.steps
    seen = []
    session.on_clock_sample = lambda host, sample: seen.append(hosts.clock_generation(host))
    session._add_sample(ClockSample(t_ns=6 * 10**9, offset_ns=45_000_000, delay_ns=40_000, uncertainty_ns=20_000))
    assert len(session.clock.steps) == 1 and hosts.clock_generation("gpu1") == 2 == len(session.clock.segments)
    assert seen == [2]
