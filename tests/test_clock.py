"""Clock correction against synthetic host clocks with known offset, drift and a step."""
from __future__ import annotations

import numpy as np
import pytest

from devices.errors import DeviceTimeout
from devices.protocols import LineStream
from harness.clock import ClockSample, ClockSyncError, ClockTracker, clock_table, probe, probe_each

EPOCH = 1_764_000_000 * 10**9  # realtime vs monotonic: offsets are ~1.7e18 ns, beyond float precision


class SimTime:
    def __init__(self, start: int = 5 * 10**12):
        self.t = start

    def __call__(self) -> int:
        return self.t


class FakeTimesrv(LineStream):
    """The agent's `timesrv` with a host clock `host(t)` and random one-way delays (ns)."""

    def __init__(self, clock: SimTime, host, rng, forward, backward, granularity=1_000, stale=0):
        self.clock, self.host, self.rng = clock, host, rng
        self.forward, self.backward, self.granularity = forward, backward, granularity
        self.queue: list[tuple[int, str]] = [(clock.t, f"old{i} 1") for i in range(stale)]

    def write(self, data: str) -> None:
        token = data.strip()
        self.clock.t += int(self.forward(self.rng))
        stamp = self.host(self.clock.t) // self.granularity * self.granularity
        self.clock.t += int(self.backward(self.rng))
        self.queue.append((self.clock.t, f"{token} {stamp}"))

    def readline(self, deadline):
        return self.queue.pop(0) if self.queue else None

    def __iter__(self):
        raise NotImplementedError

    def close(self) -> None:
        pass


def host_clock(offset, drift_ppm, t0, steps=()):
    """realtime(t) = t + EPOCH + offset + drift·(t − t0) + Σ jumps after their time."""
    def host(t: int) -> int:
        value = t + EPOCH + offset + round(drift_ppm * 1e-6 * (t - t0))
        return value + sum(j for at, j in steps if t >= at)
    return host


def true_offset(host, t):
    return host(t) - t


def exp_delay(mean_ns):
    return lambda rng: 20_000 + rng.exponential(mean_ns)


def test_probe_keeps_min_delay_sample_and_bounds_offset():
    clock, rng = SimTime(), np.random.default_rng(1)
    host = host_clock(offset=-37_000_000, drift_ppm=0, t0=clock.t)
    # Strongly asymmetric: the request path is slow, the reply fast (exec-style bias).
    stream = FakeTimesrv(clock, host, rng, exp_delay(400_000), exp_delay(10_000), stale=2)
    sample = probe(stream, count=32, now=clock)
    assert abs(sample.offset_ns - true_offset(host, sample.t_ns)) <= sample.uncertainty_ns
    assert sample.uncertainty_ns >= sample.delay_ns // 2 + 1000


def test_probe_errors():
    clock = SimTime()
    stream = FakeTimesrv(clock, lambda t: t, np.random.default_rng(0), exp_delay(1), exp_delay(1))
    stream.write = lambda data: None  # the responder never answers
    with pytest.raises(DeviceTimeout):
        probe(stream, count=1, now=clock)
    stream.queue = [(clock.t, "c1")]
    with pytest.raises(ClockSyncError):
        probe(stream, count=1, now=clock)


@pytest.mark.parametrize("seed,drift_ppm,asymmetric", [(0, 15.0, False), (1, -20.0, True), (2, 0.0, True),
                                                       (3, 3.7, False)])
def test_tracker_bounds_hold_through_drift_and_step(seed, drift_ppm, asymmetric):
    rng = np.random.default_rng(seed)
    clock = SimTime()
    start = clock.t
    step_at, jump = start + 31 * 10**9 + 123_456_789, 2_500_000
    host = host_clock(offset=int(rng.integers(-40, 40) * 10**6), drift_ppm=drift_ppm, t0=start,
                      steps=[(step_at, jump)])
    forward = exp_delay(300_000 if asymmetric else 60_000)
    stream = FakeTimesrv(clock, host, rng, forward, exp_delay(60_000))
    tracker = ClockTracker("gpu1")
    for _ in range(60):  # one sync per second for a minute
        tracker.sync(stream, count=8, now=clock)
        clock.t += 10**9 + int(rng.integers(0, 10**8))
    # Exactly one step, located between the samples around it, with the right size.
    assert len(tracker.steps) == 1
    step = tracker.steps[0]
    assert step.after_ns < step_at <= step.t_ns
    assert step.not_before_ns < step_at <= step.not_after_ns and step.not_after_ns >= step.t_ns
    assert abs(step.jump_ns - jump) <= step.uncertainty_ns
    assert abs(tracker.drift_ppm - drift_ppm) < 5
    # Host timestamps anywhere in the run (and 20 s past it) map back within the stated bound.
    end = clock.t
    for t_true in np.linspace(start - 5 * 10**9, end + 20 * 10**9, 3001).astype(np.int64):
        t_true = int(t_true)
        t, offset, bound = tracker.to_harness(host(t_true))
        assert abs(t - t_true) <= bound, (t_true - start, t - t_true, bound)
        assert offset == host(t_true) - t
    # The bound grows with extrapolation past the last sample.
    last = tracker.segments[-1].last_t
    bounds = [tracker.offset_at(last + k * 10**9)[1] for k in range(0, 50, 10)]
    assert bounds == sorted(bounds) and bounds[-1] > bounds[0]
    # Interpolated offsets are tight compared with the single-probe RTT/2 bound.
    _, within = tracker.offset_at(last - 10**10)
    assert within < 400_000


def test_single_sample_uses_prior_drift_and_reports_table():
    tracker = ClockTracker("gpu2", max_drift_ppm=100)
    with pytest.raises(ClockSyncError):
        tracker.to_harness(1)
    tracker.add(ClockSample(t_ns=10**12, offset_ns=EPOCH, delay_ns=200_000, uncertainty_ns=101_000))
    assert tracker.offset_at(10**12) == (EPOCH, 101_000)
    assert tracker.offset_at(10**12 + 10**9)[1] == pytest.approx(101_000 + 100_000 + 100, abs=2)
    with pytest.raises(ValueError):
        tracker.add(ClockSample(t_ns=10**11, offset_ns=EPOCH, delay_ns=1, uncertainty_ns=1))
    table = clock_table({"gpu2": tracker})
    assert table[0]["host"] == "gpu2" and table[0]["segments"][0]["offset_ns"] == EPOCH


def test_worst_case_asymmetry_is_just_inside_the_bound():
    """All delay on the request path: every estimate is off by exactly δ/2, which the bound must cover
    (and nearly equal: a looser bound than necessary would not be caught by random delays)."""
    clock = SimTime()
    host = host_clock(offset=12_345_678, drift_ppm=-8.0, t0=clock.t)
    stream = FakeTimesrv(clock, host, None, lambda rng: 500_000, lambda rng: 0, granularity=1)
    tracker = ClockTracker("gpu3", drift_wander_ppm=0)
    for _ in range(20):
        tracker.sync(stream, count=4, now=clock, granularity_ns=1)
        clock.t += 10**9
    for t_true in range(tracker.segments[0].first_t, tracker.segments[0].last_t, 10**8):
        t, _, bound = tracker.to_harness(host(t_true))
        assert abs(t - t_true) <= bound
        assert abs(t - t_true) >= 0.99 * 250_000 and bound <= 250_000 + 100
    assert tracker.drift_ppm == pytest.approx(-8.0, abs=0.01)


def test_estimates_are_much_better_than_their_bound():
    rng = np.random.default_rng(7)
    clock = SimTime()
    host = host_clock(offset=-5_000_000, drift_ppm=11.0, t0=clock.t)
    stream = FakeTimesrv(clock, host, rng, exp_delay(80_000), exp_delay(80_000))
    tracker = ClockTracker("gpu4")
    for _ in range(30):
        tracker.sync(stream, count=16, now=clock)
        clock.t += 10**9
    errors = [abs(tracker.to_harness(host(t))[0] - t) for t in range(clock.t - 29 * 10**9, clock.t, 10**8)]
    assert np.median(errors) < 10_000 and max(errors) < 40_000


def test_step_right_after_the_first_sample_is_not_taken_for_drift():
    """A 500 µs step 1 s after the first sample hides inside the single-sample band (200 ppm × 2 s),
    but the drift it would imply (250 ppm) is impossible, so it is a step."""
    clock = SimTime()
    step_at = clock.t + 10**9
    host = host_clock(offset=0, drift_ppm=5.0, t0=clock.t, steps=[(step_at, 500_000)])
    stream = FakeTimesrv(clock, host, np.random.default_rng(3), exp_delay(30_000), exp_delay(30_000))
    tracker = ClockTracker("gpu5")
    for _ in range(10):
        tracker.sync(stream, count=8, now=clock)
        clock.t += 2 * 10**9
    assert len(tracker.steps) == 1 and tracker.steps[0].after_ns < step_at <= tracker.steps[0].t_ns
    for t_true in range(tracker.segments[0].first_t, clock.t, 10**8):
        t, _, bound = tracker.to_harness(host(t_true))
        assert abs(t - t_true) <= bound


def test_pipelined_probes_of_several_hosts_bound_each_true_offset():
    """Replies read one after another are stamped late; their bounds widen but still hold."""
    clock = SimTime()
    offsets = {"a": 5_000_000, "b": -12_000_000, "c": 40_000}
    rng = np.random.default_rng(7)
    streams = {h: FakeTimesrv(clock, host_clock(o, 3.0, clock.t), rng, exp_delay(40_000), exp_delay(40_000))
               for h, o in offsets.items()}
    for _ in range(50):
        samples = probe_each(streams, now=clock)
        assert set(samples) == set(offsets)
        for h, s in samples.items():
            true = streams[h].host(s.t_ns) - s.t_ns
            assert abs(s.offset_ns - true) <= s.uncertainty_ns


def test_windowed_fit_bounds_every_past_time_of_a_long_run():
    """Thousands of samples through a small window: the fit stays O(window) and past times (in any
    earlier window) still map back within their bound, with a wandering drift the full-run line misses."""
    rng = np.random.default_rng(11)
    clock = SimTime()
    start = clock.t
    wander = lambda t: round(2e-6 * 40e9 / (2 * np.pi) * np.sin(2 * np.pi * (t - start) / 40e9))  # noqa: E731
    base = host_clock(offset=3_000_000, drift_ppm=7.0, t0=start)
    host = lambda t: base(t) + wander(t)  # noqa: E731
    stream = FakeTimesrv(clock, host, rng, exp_delay(50_000), exp_delay(50_000))
    tracker = ClockTracker("gpu6", window=16, drift_wander_ppm=2.5)
    for _ in range(1500):
        tracker.sync(stream, count=2, now=clock)
        clock.t += 10**8
    seg = tracker.segments[-1]
    assert tracker.steps == [] and seg.count == 1500
    assert len(seg.recent) == 16 and len(seg.fit.times) == 16 and len(seg.history) > 150
    bounds = []
    for t_true in np.linspace(start, clock.t, 2001).astype(np.int64):
        t, _, bound = tracker.to_harness(host(int(t_true)))
        assert abs(t - int(t_true)) <= bound, (int(t_true) - start, t - int(t_true), bound)
        bounds.append(bound)
    assert np.median(bounds) < 150_000  # a window-local line: no wander-sized bound


def test_host_session_adds_clock_samples_under_the_probe_lock():
    """The race that crashed long runs: a sample added after the probe lock is released can be overtaken
    by a later one. Both sync paths add while holding it."""
    from harness.bench.hosts import HostSession

    clock = SimTime()
    sessions = []
    for name in ("a", "b"):
        session = object.__new__(HostSession)
        session.name, session.clock_probes = name, 2
        session._probe_lock, session._clock_lock = __import__("threading").Lock(), __import__("threading").Lock()
        session._timesrv = FakeTimesrv(clock, host_clock(0, 0.0, clock.t), np.random.default_rng(1),
                                       exp_delay(1000), exp_delay(1000))
        tracker = ClockTracker(name)
        held = []
        tracker.add = (lambda add, s, h: lambda sample: (h.append(s._probe_lock.locked()), add(sample))[1])(
            tracker.add, session, held)
        session.clock, session.held = tracker, held
        sessions.append(session)
    import harness.clock as clock_module
    real_probe, real_each = clock_module.probe, clock_module.probe_each
    try:
        clock_module.probe = lambda stream, **kw: real_probe(stream, count=kw["count"], now=clock)
        clock_module.probe_each = lambda streams, **kw: real_each(streams, now=clock)
        sessions[0].sync_clock()
        HostSession.sync_clocks_together(sessions)
    finally:
        clock_module.probe, clock_module.probe_each = real_probe, real_each
    assert sessions[0].held == [True, True] and sessions[1].held == [True]


def test_a_loose_neighbour_does_not_widen_the_bound_next_to_a_tight_sample():
    """Between a tight sample and a loose one (a probe delayed by load), the bound stays near the tight
    one's, and still holds the true offset everywhere."""
    host = host_clock(3_000_000, 15.0, 0)
    tracker = ClockTracker("h")
    times = [k * 500_000_000 for k in range(6)]
    for k, t in enumerate(times):
        unc = 2_000_000 if k % 2 else 40_000  # every other sample: a 4 ms round trip
        tracker.add(ClockSample(t_ns=t, offset_ns=true_offset(host, t) + unc // 3, delay_ns=2 * unc,
                                uncertainty_ns=unc))
    for x in range(times[0], times[-1], 50_000_000):
        offset, bound = tracker.offset_at(x)
        assert abs(offset - true_offset(host, x)) <= bound
    _, next_to_tight = tracker.offset_at(times[2] + 10_000_000)  # 10 ms after a tight sample, before a loose one
    assert next_to_tight < 0.2 * 2_000_000


def _predict_by_definition(tracker, fit, t_ns):
    """The bound as defined, over every sample of the window (the envelope's oracle)."""
    x = float(t_ns - fit.t_ref)
    t, e, s = fit.times, fit.bounds, fit.slope_bound + tracker.wander
    near = float(np.min(e + s * np.abs(t - x)))
    if t[0] < x < t[-1]:
        j = int(np.searchsorted(t, x))
        lam = (x - t[j - 1]) / (t[j] - t[j - 1])
        near = min(near, (1 - lam) * e[j - 1] + lam * e[j] + tracker.wander * min(x - t[j - 1], t[j] - x))
    return fit.a + fit.b * x, near


@pytest.mark.parametrize("seed", [1, 2, 3])
def test_envelope_bound_equals_the_bound_over_every_sample(seed):
    rng = np.random.default_rng(seed)
    tracker = ClockTracker("h", window=32)
    host = host_clock(int(rng.integers(-10**7, 10**7)), float(rng.uniform(-30, 30)), 0)
    t = 0
    for _ in range(40):
        t += int(rng.integers(10**7, 10**9))
        unc = int(rng.choice([20_000, 60_000, 3_000_000]))
        tracker.add(ClockSample(t_ns=t, offset_ns=true_offset(host, t) + int(rng.integers(-unc, unc)),
                                delay_ns=2 * unc, uncertainty_ns=unc))
    fit = tracker.segments[-1].fit
    for x in np.concatenate([rng.uniform(fit.first_t - 10**9, t + 10**10, 300), fit.times + fit.t_ref]):
        got = tracker._predict(fit, int(x))
        want = _predict_by_definition(tracker, fit, int(x))
        assert got[0] == want[0] and got[1] == pytest.approx(want[1], rel=1e-9, abs=1e-3)


def test_conversions_are_reused_only_until_the_next_sample():
    host = host_clock(2_000_000, 10.0, 0)
    tracker, fresh = ClockTracker("h"), ClockTracker("h")
    for t in (0, 10**9):
        for tr in (tracker, fresh):
            tr.add(ClockSample(t_ns=t, offset_ns=true_offset(host, t) + 30_000, delay_ns=100_000,
                               uncertainty_ns=50_000))
    h = host(15 * 10**8)
    before = tracker.to_harness(h)
    assert tracker.to_harness(h) == before
    late = 2 * 10**9
    for tr in (tracker, fresh):  # a tight sample after the time asked about narrows its bound
        tr.add(ClockSample(t_ns=late, offset_ns=true_offset(host, late), delay_ns=2_000, uncertainty_ns=1_000))
    after = tracker.to_harness(h)
    assert after == fresh._to_harness(h) and after[2] < before[2]


def test_conversion_without_a_step_is_the_general_one():
    """`to_harness` with one segment (no step) takes a short path; it answers exactly as the general one."""
    import random

    from harness.clock import ClockSample, ClockTracker

    rng = random.Random(5)
    for window, samples in ((8, 1), (8, 40), (128, 300)):
        tracker = ClockTracker("h", window=window)
        t, base, drift = 10**12, 1_700_000_000_000_000_000, rng.uniform(-2e-5, 2e-5)
        for _ in range(samples):
            t += rng.randint(1, 100) * 1_000_000
            delay = rng.randint(50_000, 3_000_000)
            tracker.add(ClockSample(t, base + int(t * drift) + rng.randint(-delay // 2, delay // 2), delay,
                                    delay // 2 + 1000))
        assert len(tracker.segments) == 1
        for _ in range(500):
            host_ns = base + rng.randint(10**12 - 10**10, t + 10**10)
            assert tracker._to_harness(host_ns) == tracker._to_harness_segments(host_ns)


class _ListTracker(ClockTracker):
    """The oracle: the fit and the drift test as first written, over lists of the samples (one numpy array
    built per field, a Python loop over the bands)."""

    def add(self, sample):
        self._pending = sample
        return super().add(sample)

    def _drift_possible(self, seg, sample):
        lo, hi = -self.max_drift, self.max_drift
        for old in [seg.first, *list(seg.recent)[-32:]]:
            dt = sample.t_ns - old.t_ns
            if dt <= 0:
                continue
            dy = sample.offset_ns - old.offset_ns
            slack = sample.uncertainty_ns + old.uncertainty_ns
            lo, hi = max(lo, (dy - slack) / dt), min(hi, (dy + slack) / dt)
        return lo <= hi

    def _fit(self, seg, count):
        s = [*seg.recent, self._pending][-count:]
        base, t_ref = s[0].offset_ns, s[-1].t_ns
        t = np.array([x.t_ns - t_ref for x in s], dtype=float)
        y = np.array([x.offset_ns - base for x in s], dtype=float)
        u = np.array([x.uncertainty_ns for x in s], dtype=float)
        w = 1 / u**2
        t_mean, y_mean = np.sum(w * t) / np.sum(w), np.sum(w * y) / np.sum(w)
        spread = np.sum(w * (t - t_mean) ** 2)
        b = float(np.sum(w * (t - t_mean) * (y - y_mean)) / spread) if spread > 0 else 0.0
        if abs(b) > self.max_drift:
            b = float(np.clip(b, -self.max_drift, self.max_drift))
        a = float(y_mean - b * t_mean)
        bounds = u + np.abs(y - (a + b * t))
        span = t[-1] - t[0]
        slope_bound = self.max_drift + abs(b)
        if span > 0:
            slope_bound = min((bounds[0] + bounds[-1]) / span, slope_bound)
        from harness.clock import _Fit
        return _Fit(base=base, t_ref=t_ref, a=a, b=b, times=t, bounds=bounds, slope_bound=float(slope_bound),
                    wander=self.wander)


def _same_fit(fit, oracle):
    assert (fit.base, fit.t_ref, fit.a, fit.b, fit.slope_bound) == \
        (oracle.base, oracle.t_ref, oracle.a, oracle.b, oracle.slope_bound)
    assert fit.times.tobytes() == oracle.times.tobytes() and fit.bounds.tobytes() == oracle.bounds.tobytes()


def test_fit_over_arrays_is_bit_identical_to_the_fit_over_lists():
    """The tracker fits over arrays it keeps per segment; on random runs (drift up to the physical bound and
    past it, steps small and large, repeated probe times, loose and tight probes, several windows) every fit,
    step and conversion equals the one of the fit over lists, to the bit."""
    import random

    rng = random.Random(13)
    for run in range(24):
        window = rng.choice((4, 5, 16, 33, 128))
        trackers = [ClockTracker("h", window=window), _ListTracker("h", window=window)]
        t, base = 10**12 + rng.randint(0, 10**15), rng.choice((0, -(10**15), 1_700_000_000_000_000_000))
        drift = rng.choice((0.0, rng.uniform(-2e-4, 2e-4), rng.uniform(-1e-3, 1e-3)))
        for _ in range(rng.choice((3, 60, 400))):
            t += rng.choice((0, 1, rng.randint(1, 300) * 1_000_000))
            if rng.random() < 0.02:
                base += rng.choice((rng.randint(-300_000, 300_000), rng.randint(-10**13, 10**13), 2**60))
            delay = rng.choice((rng.randint(2_000, 200_000), rng.randint(1_000_000, 50_000_000)))
            if rng.random() < 0.01:
                delay = 2**55  # bands past 2**53: the drift test's exact fallback
            sample = ClockSample(t, base + int(t * drift) + rng.randint(-delay // 2, delay // 2), delay,
                                 delay // 2 + 1000)
            steps = [tr.add(sample) for tr in trackers]
            assert steps[0] == steps[1]
            ours, oracle = trackers
            assert len(ours.segments) == len(oracle.segments)
            _same_fit(ours.segments[-1].fit, oracle.segments[-1].fit)
        for ours_seg, oracle_seg in zip(ours.segments, oracle.segments):
            assert len(ours_seg.history) == len(oracle_seg.history)
            for fit, oracle_fit in zip(ours_seg.history, oracle_seg.history):
                _same_fit(fit, oracle_fit)
        for _ in range(50):
            host_ns = base + rng.randint(10**12, t + 10**10)
            assert ours.to_harness(host_ns) == oracle.to_harness(host_ns)
        assert ours.table() == oracle.table()


def test_a_campaign_keeps_its_past_fits_compact_and_they_answer_as_before(monkeypatch):
    """Every half window a fit is kept for past times, a campaign's whole length: one no longer current drops the
    Python lists that make its bound one bisection (~16 KB a fit), so the tracker grows by ~2 KB a kept fit, not
    ~18; a past time converts to exactly what the uncompacted fit gave, at every kind of query."""
    import random
    import tracemalloc

    from harness.clock import ClockSample, ClockTracker

    def feed(tracker, rng, count, t):
        for _ in range(count):
            t += rng.randint(1, 100) * 1_000_000
            delay = rng.randint(50_000, 3_000_000)
            tracker.add(ClockSample(t, 1_700_000_000_000_000_000 + int(t * 1e-5) +
                                    rng.randint(-delay // 2, delay // 2), delay, delay // 2 + 1000))
        return t

    tracker, t = ClockTracker("h"), 10**12
    t = feed(tracker, random.Random(7), 200, t)
    tracemalloc.start()
    try:
        t = feed(tracker, random.Random(8), 1280, t)  # 20 fits kept
        after_n = tracemalloc.get_traced_memory()[0]
        t = feed(tracker, random.Random(9), 1280, t)
        after_2n = tracemalloc.get_traced_memory()[0]
    finally:
        tracemalloc.stop()
    assert (after_2n - after_n) / 20 < 5_000  # bytes a kept fit
    kept = tracker.segments[0].history
    assert len(kept) > 40 and all(f._t is None for f in kept[:-2]) and tracker.segments[0].fit._t is not None

    monkeypatch.setattr("harness.clock._Fit.compact", lambda self: None)
    whole, t2 = ClockTracker("h"), 10**12
    for seed, count in ((7, 200), (8, 1280), (9, 1280)):
        t2 = feed(whole, random.Random(seed), count, t2)
    assert whole.segments[0].history[0]._t is not None and t2 == t
    rng = random.Random(3)
    for _ in range(2000):
        host_ns = 1_700_000_000_000_000_000 + rng.randint(10**12 - 10**10, t + 10**10)
        assert tracker._to_harness(host_ns) == whole._to_harness(host_ns)
        at = rng.randint(10**12, t)
        assert tracker.offset_at(at) == whole.offset_at(at)


def test_to_harness_many_is_to_harness_element_by_element():
    """The array form against one call per time, bit for bit: one segment and several (clock steps back and
    forth, times near and between them), kept and compacted fits of long segments, times before, inside and long
    after the samples."""
    rng = np.random.default_rng(11)
    for steps, window, jump in (((), 128, 0), ((), 8, 0), ((30, 31, 70), 8, 50_000_000), ((5, 60), 16, 3 * 10**9)):
        tracker = ClockTracker("h", window=window)
        offset, t = EPOCH, 10**12
        for k in range(120):
            t += int(rng.integers(50_000_000, 400_000_000))
            if k in steps:
                offset += int(rng.choice([-1, 1])) * int(rng.integers(jump // 20, jump))  # a clock step
                # (one longer than the probes' interval leaves host times no segment's window holds)
            unc = int(rng.integers(20_000, 2_000_000))
            tracker.add(ClockSample(t_ns=t, offset_ns=offset + k * 3_000 + int(rng.integers(-unc // 2, unc // 2)),
                                    delay_ns=2 * unc, uncertainty_ns=unc))
        assert len(tracker.segments) == len(steps) + 1, tracker.steps
        first = tracker.segments[0].first_t + EPOCH
        near_steps = [s.t_ns + EPOCH + d for s in tracker.steps for d in range(-4 * 10**9, 4 * 10**9, 5 * 10**6)]
        host = np.unique(np.concatenate([rng.integers(first - 10**11, t + offset + 10**11, 3000),
                                         np.arange(first, t + offset, 9_999_991),
                                         np.array(near_steps, dtype=np.int64)]))
        many = tracker.to_harness_many(host)
        assert host.dtype == np.int64
        assert [tuple(int(a[i]) for a in many) for i in range(len(host))] == \
            [tracker.to_harness(h) for h in host.tolist()]
    with pytest.raises(OverflowError):
        tracker.to_harness_many(np.array([-(1 << 62), 1 << 62]))
