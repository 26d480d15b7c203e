"""Host clock correction over the agent's `timesrv` (NTP/Cristian style, protocols.md §4).

One probe: t1 = harness now before writing `TOKEN`, t4 = harness time the reply `TOKEN HOST_NS` arrived.
offset θ = HOST_NS − (t1+t4)/2 (host clock minus harness clock), delay δ = t4 − t1. By causality the true
offset lies in θ ± δ/2 whatever the path asymmetry; we add the reading granularity. Of K probes the one
with the smallest δ is kept (feasibility.md §4: a long-lived responder, min-RTT sample).

`ClockTracker` keeps these estimates over a run. Assuming each segment's offset is linear in time
(constant drift), the error of the fitted line is itself linear, so a bound E_i = u_i + |residual_i| at
two samples bounds it everywhere: interpolated between samples, and growing by at most
(E_first + E_last)/(t_last − t_first) per ns beyond them. A small `drift_wander_ppm` term covers real
oscillators whose frequency wanders. A new estimate outside that band (plus its own uncertainty and a
threshold) is a clock step and starts a new segment; so is an estimate that would make the fitted drift
exceed `max_drift_ppm`. A step smaller than that band, close after a segment's first sample, can be taken
for drift until later samples contradict it.
"""
from __future__ import annotations

import itertools
import math
from dataclasses import dataclass, field
from typing import Callable

import numpy as np

from devices.errors import DeviceError, DeviceTimeout
from devices.protocols import LineStream
from devices.timing import Deadline, now_ns

_tokens = itertools.count(1)


class ClockSyncError(DeviceError):
    """The time responder answered nonsense, or no estimate exists yet."""


@dataclass(frozen=True)
class ClockSample:
    """One min-delay estimate. `t_ns` is the harness time of the probe midpoint."""

    t_ns: int
    offset_ns: int
    delay_ns: int
    uncertainty_ns: int


def _send(stream: LineStream, now: Callable[[], int]) -> tuple[str, int]:
    token = f"c{next(_tokens)}"
    t1 = now()
    stream.write(token + "\n")
    return token, t1


def _reply(stream: LineStream, token: str, t1: int, deadline: Deadline, granularity_ns: int,
           now: Callable[[], int], who: str = "time responder") -> ClockSample:
    """Read up to the reply to `token` and turn it into a sample."""
    while True:
        got = stream.readline(deadline)
        if got is None:
            raise DeviceTimeout(f"{who}: no reply to {token} before the deadline")
        recv_ns, line = got
        after = now()
        parts = line.split()
        if len(parts) != 2:
            raise ClockSyncError(f"{who}: expected 'TOKEN HOST_NS', got {line!r}"[:200])
        if parts[0] == token:
            break  # anything else is a late reply to an earlier, abandoned probe
    try:
        host_ns = int(parts[1])
    except ValueError:
        raise ClockSyncError(f"{who}: bad timestamp in {line!r}"[:200]) from None
    # The stream's receive stamp is the tighter t4, if it is consistent.
    t4 = recv_ns if t1 <= recv_ns <= after else after
    delay = t4 - t1
    return ClockSample(t_ns=(t1 + t4) // 2, offset_ns=host_ns - (t1 + t4) // 2, delay_ns=delay,
                       uncertainty_ns=(delay + 1) // 2 + 1 + granularity_ns)


def probe(stream: LineStream, *, count: int = 16, deadline: Deadline | None = None,
          granularity_ns: int = 1_000, now: Callable[[], int] = now_ns) -> ClockSample:
    """Send `count` probes over a `timesrv` stream; return the minimum-delay sample."""
    if count < 1:
        raise ValueError("count must be >= 1")
    deadline = deadline or Deadline(5.0)
    samples = [_reply(stream, *_send(stream, now), deadline, granularity_ns, now) for _ in range(count)]
    return min(samples, key=lambda s: s.delay_ns)


def probe_each(streams: dict[str, LineStream], *, deadline: Deadline | None = None,
               granularity_ns: int = 1_000, now: Callable[[], int] = now_ns) -> dict[str, ClockSample]:
    """One probe per host, pipelined: every token is written before any reply is read, so N hosts cost
    about one round trip, not N. A reply read after another's may be stamped late; that only widens its
    delay and so its (still valid) bound."""
    deadline = deadline or Deadline(5.0)
    sent = {name: _send(stream, now) for name, stream in streams.items()}
    return {name: _reply(stream, *sent[name], deadline, granularity_ns, now, f"time responder of {name}")
            for name, stream in streams.items()}


@dataclass(frozen=True)
class ClockStep:
    """A discontinuity: at harness time ~`t_ns` the offset jumped by `jump_ns` (± `uncertainty_ns`)."""

    t_ns: int
    after_ns: int  # last sample before the step (the step happened in (after_ns, t_ns])
    jump_ns: int
    uncertainty_ns: int


@dataclass
class _Segment:
    samples: list[ClockSample] = field(default_factory=list)
    # Model: offset(t) = base + a + b * (t - t_ref); base is an exact int (offsets can be ~1.7e18 ns).
    base: int = 0
    t_ref: int = 0
    a: float = 0.0
    b: float = 0.0
    bounds: np.ndarray = field(default_factory=lambda: np.zeros(0))  # E_i per sample
    times: np.ndarray = field(default_factory=lambda: np.zeros(0))  # t_i - t_ref
    slope_bound: float = 0.0

    @property
    def first_t(self) -> int:
        return self.samples[0].t_ns

    @property
    def last_t(self) -> int:
        return self.samples[-1].t_ns


class ClockTracker:
    """Per-host offset model over a run: drift fit, step detection, host → harness conversion."""

    def __init__(self, host: str, *, step_threshold_ns: int = 100_000, max_drift_ppm: float = 200.0,
                 drift_wander_ppm: float = 0.1):
        self.host = host
        self.step_threshold_ns = step_threshold_ns
        self.max_drift = max_drift_ppm * 1e-6
        self.wander = drift_wander_ppm * 1e-6
        self.segments: list[_Segment] = []
        self.steps: list[ClockStep] = []

    # ---- feeding
    def sync(self, stream: LineStream, *, count: int = 16, deadline: Deadline | None = None,
             granularity_ns: int = 1_000, now: Callable[[], int] = now_ns) -> ClockSample:
        """Probe the host and add the estimate."""
        sample = probe(stream, count=count, deadline=deadline, granularity_ns=granularity_ns, now=now)
        self.add(sample)
        return sample

    def add(self, sample: ClockSample) -> ClockStep | None:
        """Add an estimate; return the step it reveals, if any."""
        if self.segments:
            segment = self.segments[-1]
            if sample.t_ns < segment.last_t:
                raise ValueError("clock samples must be added in time order")
            predicted, bound = self._predict(segment, sample.t_ns)
            miss = abs((sample.offset_ns - segment.base) - predicted)
            stepped = miss > bound + sample.uncertainty_ns + self.step_threshold_ns
            if not stepped:
                # A "drift" faster than any oscillator drifts is a step the band was too wide to see: no
                # line with |slope| <= max_drift passes through this sample's band and every earlier one.
                stepped = not self._drift_possible(segment, sample)
                trial = None if stepped else self._fit(_Segment(samples=[*segment.samples, sample]))
            if stepped:
                step = ClockStep(t_ns=sample.t_ns, after_ns=segment.last_t,
                                 jump_ns=round((sample.offset_ns - segment.base) - predicted),
                                 uncertainty_ns=math.ceil(bound + sample.uncertainty_ns))
                self.steps.append(step)
                self.segments.append(self._fit(_Segment(samples=[sample])))
                return step
            self.segments[-1] = trial
            return None
        self.segments.append(self._fit(_Segment(samples=[sample])))
        return None

    def _drift_possible(self, seg: _Segment, sample: ClockSample) -> bool:
        """Whether some slope within ±max_drift joins the new sample's band to each earlier sample's band.
        The bands are rigorous (causality), so an empty intersection proves a step; noisy but valid
        samples never produce one."""
        lo, hi = -self.max_drift, self.max_drift
        # The first and the latest samples carry the information; any subset keeps the test rigorous.
        for old in seg.samples[:1] + seg.samples[-32:]:
            dt = sample.t_ns - old.t_ns
            if dt <= 0:
                continue
            dy = sample.offset_ns - old.offset_ns
            slack = sample.uncertainty_ns + old.uncertainty_ns
            lo, hi = max(lo, (dy - slack) / dt), min(hi, (dy + slack) / dt)
        return lo <= hi

    def _fit(self, seg: _Segment) -> _Segment:
        s = seg.samples
        seg.base, seg.t_ref = s[0].offset_ns, s[-1].t_ns
        t = np.array([x.t_ns - seg.t_ref for x in s], dtype=float)
        y = np.array([x.offset_ns - seg.base for x in s], dtype=float)
        u = np.array([x.uncertainty_ns for x in s], dtype=float)
        if len(s) == 1 or np.ptp(t) == 0:
            w = 1 / u**2
            seg.a, seg.b = float(np.sum(w * y) / np.sum(w)), 0.0
        else:
            # Weighted least squares, weights 1/u²: the tight (low-delay) estimates dominate.
            seg.b, seg.a = (float(v) for v in np.polyfit(t, y, 1, w=1 / u))
            if abs(seg.b) > self.max_drift:
                # Over a short span a few noisy samples can suggest an impossible drift; extrapolating it
                # would call every next sample a step. Keep the drift physical and refit the offset.
                seg.b = float(np.clip(seg.b, -self.max_drift, self.max_drift))
                w = 1 / u**2
                seg.a = float(np.sum(w * (y - seg.b * t)) / np.sum(w))
        residual = np.abs(y - (seg.a + seg.b * t))
        seg.times, seg.bounds = t, u + residual
        if len(s) == 1 or np.ptp(t) == 0:
            seg.slope_bound = self.max_drift + abs(seg.b)
        else:
            span = t[-1] - t[0]
            seg.slope_bound = min((seg.bounds[0] + seg.bounds[-1]) / span, self.max_drift + abs(seg.b))
        return seg

    # ---- queries
    def _predict(self, seg: _Segment, t_ns: int) -> tuple[float, float]:
        """(offset − seg.base, bound) at harness time t_ns. Offsets stay split into an exact int base
        and a small float part: a host's realtime minus harness monotonic is ~1.7e18 ns."""
        x = float(t_ns - seg.t_ref)
        offset = seg.a + seg.b * x
        t, e = seg.times, seg.bounds
        if x >= t[-1]:
            distance = x - t[-1]
            bound = e[-1] + (seg.slope_bound + self.wander) * distance
        elif x <= t[0]:
            distance = t[0] - x
            bound = e[0] + (seg.slope_bound + self.wander) * distance
        else:
            j = int(np.searchsorted(t, x))  # t[j-1] < x <= t[j]
            lam = (x - t[j - 1]) / (t[j] - t[j - 1]) if t[j] > t[j - 1] else 0.0
            distance = min(x - t[j - 1], t[j] - x)
            bound = (1 - lam) * e[j - 1] + lam * e[j] + self.wander * distance
        return offset, float(bound)

    def offset_at(self, t_ns: int) -> tuple[int, int]:
        """(offset_ns, uncertainty_ns) of this host at harness time t_ns."""
        seg = self._segment_at_harness(t_ns)
        offset, bound = self._predict(seg, t_ns)
        return seg.base + round(offset), math.ceil(bound)

    def _segment_at_harness(self, t_ns: int) -> _Segment:
        if not self.segments:
            raise ClockSyncError(f"no clock estimate for host {self.host} yet")
        chosen = self.segments[0]
        for seg in self.segments[1:]:
            if seg.first_t <= t_ns:
                chosen = seg
        return chosen

    def to_harness(self, host_ns: int) -> tuple[int, int, int]:
        """A host timestamp on the harness clock: (t_ns, offset_ns, uncertainty_ns).

        Near a step (between the last sample before it and the first after it) both models are
        possible; the answer then covers both.
        """
        if not self.segments:
            raise ClockSyncError(f"no clock estimate for host {self.host} yet")
        intervals = []
        nearest: tuple[float, float, float] | None = None
        for k, seg in enumerate(self.segments):
            # Solve t = host - offset(t) for the linear model.
            x = (float(host_ns - seg.base - seg.t_ref) - seg.a) / (1.0 + seg.b)
            t = seg.t_ref + x
            _, bound = self._predict(seg, round(t))
            bound *= 1.0 + abs(seg.b)  # conversion back through the model; negligible but safe
            lo_window = self.segments[k - 1].last_t if k > 0 else -math.inf
            hi_window = self.segments[k + 1].first_t if k + 1 < len(self.segments) else math.inf
            if lo_window - bound < t < hi_window + bound:
                intervals.append((t - bound, t + bound))
            gap = max(lo_window - t, t - hi_window, 0.0)
            if nearest is None or gap < nearest[0]:
                nearest = (gap, t - bound, t + bound)
        if not intervals:  # inconsistent with every segment's window: use the closest one
            intervals = [nearest[1:]]
        lo = min(i[0] for i in intervals)
        hi = max(i[1] for i in intervals)
        t_mid = round((lo + hi) / 2)
        return t_mid, host_ns - t_mid, math.ceil((hi - lo) / 2)

    # ---- reporting
    @property
    def drift_ppm(self) -> float | None:
        return self.segments[-1].b * 1e6 if self.segments else None

    def table(self) -> dict:
        """A JSON-ready summary for the run manifest."""
        segments = []
        for seg in self.segments:
            offset, bound = self._predict(seg, seg.last_t)
            segments.append({"from_ns": seg.first_t, "to_ns": seg.last_t, "samples": len(seg.samples),
                             "offset_ns": seg.base + round(offset), "uncertainty_ns": math.ceil(bound),
                             "drift_ppm": seg.b * 1e6,
                             "min_delay_ns": min(s.delay_ns for s in seg.samples)})
        return {"host": self.host, "segments": segments,
                "steps": [{"t_ns": s.t_ns, "after_ns": s.after_ns, "jump_ns": s.jump_ns,
                           "uncertainty_ns": s.uncertainty_ns} for s in self.steps]}


def clock_table(trackers: dict[str, ClockTracker] | list[ClockTracker]) -> list[dict]:
    """Manifest `clock` entry for several hosts."""
    values = trackers.values() if isinstance(trackers, dict) else trackers
    return [t.table() for t in values]
