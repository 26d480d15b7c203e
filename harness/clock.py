"""Host clock correction over the agent's `timesrv` (NTP/Cristian style, protocols.md §4).

One probe: t1 = harness time `TOKEN` went to the socket (the stream's `sent_ns`, else now before writing it), t4 =
harness time the reply `TOKEN HOST_NS` arrived (the stream's receive stamp: on the SSH hub as it left the socket).
Both stamps sit as close to the socket as the other leg's, so the legs' asymmetry (the offset's bias) stays small.
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

import bisect
import collections
import itertools
import math
from dataclasses import dataclass
from typing import Callable

import numpy as np

from devices.errors import DeviceError, DeviceTimeout
from devices.hostagent import host_int
from devices.protocols import LineStream
from devices.records import record
from devices.timing import Deadline, now_ns

_tokens = itertools.count(1)


class ClockSyncError(DeviceError):
    """The time responder answered nonsense, or no estimate exists yet."""


@record
class ClockSample:
    """One min-delay estimate. `t_ns` is the harness time of the probe midpoint."""

    t_ns: int
    offset_ns: int
    delay_ns: int
    uncertainty_ns: int


def _send(stream: LineStream, now: Callable[[], int]) -> tuple[str, int]:
    token = f"c{next(_tokens)}"
    before = now()
    stream.write(token + "\n")
    # The stream's send stamp (its first byte handed to the socket) is the tighter t1, if it is consistent.
    sent = getattr(stream, "sent_ns", 0)
    return token, (sent if before <= sent <= now() else before)


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
        host_ns = host_int(parts[1], "timesrv", line)
    except (ValueError, DeviceError):  # not a number, or beyond the record's int64
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


def _rint64(x: np.ndarray) -> np.ndarray:
    """round() of each of `x` as int64; OverflowError at ±2**62 and beyond (or NaN), never a wrapped value."""
    if len(x) and not np.abs(x).max() < 2.0**62:
        raise OverflowError("a time beyond int64 arithmetic")
    return np.rint(x).astype(np.int64)


@dataclass(frozen=True)
class ClockStep:
    """A discontinuity: at harness time ~`t_ns` the offset jumped by `jump_ns` (± `uncertainty_ns`)."""

    t_ns: int
    after_ns: int  # last sample before the step (the step happened in (after_ns, t_ns])
    jump_ns: int
    uncertainty_ns: int
    # For certain, by causality: after the last sample's probe was sent, before the revealing reply came.
    not_before_ns: int = 0
    not_after_ns: int = 0


@dataclass
class _Fit:
    """One line fitted over a window of consecutive samples: offset(t) = base + a + b * (t - t_ref), with
    `base` an exact int (offsets can be ~1.7e18 ns) and the bound E_i = u_i + |residual_i| per sample.

    `near(x)`, the tightest single-sample bound min_i(E_i + s|t_i - x|), is a lower envelope of V shapes:
    with prefix minima of E_i - s t_i and suffix minima of E_i + s t_i it costs one bisection, not a pass
    over the window (a cycle converts hundreds of host times with the same fit)."""

    base: int
    t_ref: int
    a: float
    b: float
    times: np.ndarray  # t_i - t_ref
    bounds: np.ndarray  # E_i
    slope_bound: float
    wander: float = 0.0  # the tracker's drift wander (per ns), added to slope_bound away from samples

    def __post_init__(self) -> None:
        s = self.slope_bound + self.wander
        self.first_t = self.t_ref + int(self.times[0])
        self._t = self.times.tolist()
        self._e = self.bounds.tolist()
        self._left = np.minimum.accumulate(self.bounds - s * self.times).tolist()
        self._right = np.minimum.accumulate((self.bounds + s * self.times)[::-1])[::-1].tolist()

    def near(self, x: float) -> float:
        s = self.slope_bound + self.wander
        if self._t is None:  # compacted: the same sums, from the arrays
            k = int(np.searchsorted(self.times, x, side="right"))
            best = math.inf
            if k:
                best = s * x + float(np.minimum.accumulate(self.bounds[:k] - s * self.times[:k])[-1])
            if k < len(self.times):
                best = min(best, float(np.minimum.accumulate(
                    (self.bounds[k:] + s * self.times[k:])[::-1])[-1]) - s * x)
            return best
        k = bisect.bisect_right(self._t, x)  # samples [0, k) at or before x
        best = math.inf
        if k:
            best = s * x + self._left[k - 1]
        if k < len(self._t):
            best = min(best, self._right[k] - s * x)
        return best

    def near_many(self, x: np.ndarray) -> np.ndarray:
        """`near` of each of `x`, the same sums (and so the same floats)."""
        s = self.slope_bound + self.wander
        n = len(self.times)
        left = np.minimum.accumulate(self.bounds - s * self.times)
        right = np.minimum.accumulate((self.bounds + s * self.times)[::-1])[::-1]
        k = np.searchsorted(self.times, x, side="right")
        best = np.where(k > 0, s * x + left[np.maximum(k - 1, 0)], np.inf)
        return np.where(k < n, np.minimum(best, right[np.minimum(k, n - 1)] - s * x), best)

    def compact(self) -> None:
        """Drop the lists that make `near` one bisection (~16 KB of Python floats a fit): a kept fit that is no
        longer the current one answers only for past times, and a campaign keeps thousands of them."""
        self._t = self._e = self._left = self._right = None


class _Segment:
    """The samples between two steps. The line is fitted over the last `window` samples only, so adding a
    sample costs O(window) whatever the run length; every `window // 2` samples the current fit is kept in
    `history` (consecutive fits overlap by half a window), so a past time is still bounded by a fit whose
    window contains it. Per window the bound argument is the one above, needing linearity only there."""

    def __init__(self, first: ClockSample, window: int):
        self.first = first
        self.window = window
        self.recent: collections.deque[ClockSample] = collections.deque(maxlen=window)
        self.count = 0
        self.min_delay_ns = first.delay_ns
        self.history: list[_Fit] = []
        self.history_starts: list[int] = []
        self.fit: _Fit | None = None
        # The window's samples as arrays (t_ns and offset_ns relative to the first sample: exact int64), so a
        # fit slices them instead of building three arrays from 128 records; `_n` filled of 2 windows.
        self._t = np.empty(2 * window, dtype=np.int64)
        self._y = np.empty(2 * window, dtype=np.int64)
        self._u = np.empty(2 * window, dtype=np.int64)
        self._n = 0
        self.max_abs_y = self.max_u = 0  # over every sample pushed: when the drift test's floats are exact

    @property
    def first_t(self) -> int:
        return self.first.t_ns

    @property
    def last_t(self) -> int:
        return self.recent[-1].t_ns

    def push(self, sample: ClockSample) -> None:
        """Append `sample` to the window's arrays (`window_arrays` then ends with it; `add` follows)."""
        if self._n == len(self._t):
            keep = self.window - 1
            for a in (self._t, self._y, self._u):
                a[:keep] = a[self._n - keep:self._n]
            self._n = keep
        n = self._n
        self._t[n] = sample.t_ns - self.first.t_ns
        self._y[n] = sample.offset_ns - self.first.offset_ns
        self._u[n] = sample.uncertainty_ns
        self._n = n + 1
        self.max_abs_y = max(self.max_abs_y, abs(sample.offset_ns - self.first.offset_ns))
        self.max_u = max(self.max_u, sample.uncertainty_ns)

    def window_arrays(self, last: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """The last `last` samples pushed: (t_ns, offset_ns) relative to the segment's first sample, and
        uncertainty_ns (views, valid until the next push)."""
        lo = self._n - last
        return self._t[lo:self._n], self._y[lo:self._n], self._u[lo:self._n]

    def add(self, sample: ClockSample, fit: _Fit) -> None:
        """Take `sample` with `fit`, the line over the window that now ends with it (pushed already)."""
        self.recent.append(sample)
        self.count += 1
        self.min_delay_ns = min(self.min_delay_ns, sample.delay_ns)
        if self.history and self.history[-1] is self.fit and fit is not self.fit:
            self.fit.compact()  # kept for past times only, from now on
        self.fit = fit
        if self.count >= self.window and (self.count - self.window) % (self.window // 2) == 0:
            self.history.append(fit)
            self.history_starts.append(fit.first_t)

    def fit_at(self, t_ns: int) -> _Fit:
        """The fit to use at harness time t_ns: the latest whose window starts at or before it."""
        if not self.history or t_ns >= self.fit.first_t:
            return self.fit
        k = bisect.bisect_right(self.history_starts, t_ns) - 1
        return self.history[max(k, 0)]


class ClockTracker:
    """Per-host offset model over a run: drift fit, step detection, host → harness conversion.

    Samples must come in time order (the caller owns the ordering: HostSession adds under the same lock
    that serialises its probes)."""

    def __init__(self, host: str, *, step_threshold_ns: int = 100_000, max_drift_ppm: float = 200.0,
                 drift_wander_ppm: float = 0.1, window: int = 128):
        if window < 4:
            raise ValueError("window must be >= 4")
        self.host = host
        self.step_threshold_ns = step_threshold_ns
        self.max_drift = max_drift_ppm * 1e-6
        self.wander = drift_wander_ppm * 1e-6
        self.window = window
        self.segments: list[_Segment] = []
        self.steps: list[ClockStep] = []
        self._converted: dict[int, tuple[int, int, int]] = {}  # host_ns -> to_harness(), until the next sample

    # ---- feeding
    def sync(self, stream: LineStream, *, count: int = 16, deadline: Deadline | None = None,
             granularity_ns: int = 1_000, now: Callable[[], int] = now_ns) -> ClockSample:
        """Probe the host and add the estimate."""
        sample = probe(stream, count=count, deadline=deadline, granularity_ns=granularity_ns, now=now)
        self.add(sample)
        return sample

    def add(self, sample: ClockSample) -> ClockStep | None:
        """Add an estimate; return the step it reveals, if any. O(window) per sample."""
        self._converted.clear()
        if self.segments:
            segment = self.segments[-1]
            if sample.t_ns < segment.last_t:
                raise ValueError("clock samples must be added in time order")
            predicted, bound = self._predict(segment.fit, sample.t_ns)
            miss = abs((sample.offset_ns - segment.fit.base) - predicted)
            stepped = miss > bound + sample.uncertainty_ns + self.step_threshold_ns
            if not stepped:
                # A "drift" faster than any oscillator drifts is a step the band was too wide to see: no
                # line with |slope| <= max_drift passes through this sample's band and every earlier one.
                stepped = not self._drift_possible(segment, sample)
            if stepped:
                last = segment.recent[-1]
                step = ClockStep(t_ns=sample.t_ns, after_ns=segment.last_t,
                                 jump_ns=round((sample.offset_ns - segment.fit.base) - predicted),
                                 uncertainty_ns=math.ceil(bound + sample.uncertainty_ns),
                                 not_before_ns=last.t_ns - (last.delay_ns + 1) // 2,
                                 not_after_ns=sample.t_ns + (sample.delay_ns + 1) // 2)
                self.steps.append(step)
                self._start_segment(sample)
                return step
            segment.push(sample)
            segment.add(sample, self._fit(segment, min(len(segment.recent) + 1, self.window)))
            return None
        self._start_segment(sample)
        return None

    def _start_segment(self, sample: ClockSample) -> None:
        segment = _Segment(sample, self.window)
        segment.push(sample)
        segment.add(sample, self._fit(segment, 1))
        self.segments.append(segment)

    def _drift_possible(self, seg: _Segment, sample: ClockSample) -> bool:
        """Whether some slope within ±max_drift joins the new sample's band to each earlier sample's band.
        The bands are rigorous (causality), so an empty intersection proves a step; noisy but valid
        samples never produce one."""
        # The first and the latest samples carry the information; any subset keeps the test rigorous.
        first = seg.first
        dt0 = sample.t_ns - first.t_ns
        dy0, slack0 = sample.offset_ns - first.offset_ns, sample.uncertainty_ns + first.uncertainty_ns
        lo, hi = -self.max_drift, self.max_drift
        if dt0 > 0:
            lo, hi = max(lo, (dy0 - slack0) / dt0), min(hi, (dy0 + slack0) / dt0)
        t, y, u = seg.window_arrays(min(len(seg.recent), 32))
        if max(dt0, 2 * max(abs(dy0), seg.max_abs_y) + slack0 + seg.max_u) > 1 << 53:
            for t_i, y_i, u_i in zip(t.tolist(), y.tolist(), u.tolist()):  # Python ints: exact at any size
                if dt0 > t_i:
                    dy, slack = dy0 - y_i, sample.uncertainty_ns + u_i
                    lo, hi = max(lo, (dy - slack) / (dt0 - t_i)), min(hi, (dy + slack) / (dt0 - t_i))
            return lo <= hi
        dt, dy, slack = dt0 - t, dy0 - y, sample.uncertainty_ns + u
        if dt[-1] <= 0:  # probes at the same time as this one: no slope between them
            later = dt > 0
            dt, dy, slack = dt[later], dy[later], slack[later]
            if not len(dt):
                return lo <= hi
        # Every operand is exact as a float (below 2**53), so each quotient is the correctly rounded one, as
        # Python's int / int.
        return max(lo, float(((dy - slack) / dt).max())) <= min(hi, float(((dy + slack) / dt).min()))

    def _fit(self, seg: _Segment, count: int) -> _Fit:
        """The line over the segment's last `count` samples."""
        t_rel, y_rel, u_int = seg.window_arrays(count)
        base = seg.first.offset_ns + int(y_rel[0])
        t_ref = seg.first.t_ns + int(t_rel[-1])
        t = (t_rel - t_rel[-1]).astype(float)
        y = (y_rel - y_rel[0]).astype(float)
        u = u_int.astype(float)
        # Weighted least squares, weights 1/u²: the tight (low-delay) estimates dominate.
        w = 1 / u**2
        sum_w = np.add.reduce(w)
        t_mean, y_mean = np.add.reduce(w * t) / sum_w, np.add.reduce(w * y) / sum_w
        spread = np.add.reduce(w * (t - t_mean) ** 2)
        b = float(np.add.reduce(w * (t - t_mean) * (y - y_mean)) / spread) if spread > 0 else 0.0
        if abs(b) > self.max_drift:
            # Over a short span a few noisy samples can suggest an impossible drift; extrapolating it
            # would call every next sample a step. Keep the drift physical and refit the offset.
            b = min(max(b, -self.max_drift), self.max_drift)
        a = float(y_mean - b * t_mean)
        bounds = u + np.abs(y - (a + b * t))
        span = t[-1] - t[0]
        slope_bound = self.max_drift + abs(b)
        if span > 0:
            slope_bound = min((bounds[0] + bounds[-1]) / span, slope_bound)
        return _Fit(base=base, t_ref=t_ref, a=a, b=b, times=t, bounds=bounds, slope_bound=float(slope_bound),
                    wander=self.wander)

    # ---- queries
    def _predict(self, fit: _Fit, t_ns: int) -> tuple[float, float]:
        """(offset − fit.base, bound) at harness time t_ns. Offsets stay split into an exact int base
        and a small float part: a host's realtime minus harness monotonic is ~1.7e18 ns."""
        x = float(t_ns - fit.t_ref)
        offset = fit.a + fit.b * x
        # Any one sample bounds the (linear) error, growing at most by slope_bound per ns away from it: a
        # tight sample close by beats interpolating towards a loose neighbour (a probe under load). Beyond
        # the first or last sample that is also the extrapolated bound.
        bound = fit.near(x)
        t, e = (fit._t, fit._e) if fit._t is not None else (fit.times.tolist(), fit.bounds.tolist())
        if t[0] < x < t[-1]:
            j = bisect.bisect_left(t, x)  # t[j-1] < x <= t[j]
            lam = (x - t[j - 1]) / (t[j] - t[j - 1]) if t[j] > t[j - 1] else 0.0
            distance = min(x - t[j - 1], t[j] - x)
            bound = min(bound, (1 - lam) * e[j - 1] + lam * e[j] + self.wander * distance)
        return offset, bound

    def offset_at(self, t_ns: int) -> tuple[int, int]:
        """(offset_ns, uncertainty_ns) of this host at harness time t_ns."""
        fit = self._segment_at_harness(t_ns).fit_at(t_ns)
        offset, bound = self._predict(fit, t_ns)
        return fit.base + round(offset), math.ceil(bound)

    def _segment_at_harness(self, t_ns: int) -> _Segment:
        if not self.segments:
            raise ClockSyncError(f"no clock estimate for host {self.host} yet")
        k = bisect.bisect_right([seg.first_t for seg in self.segments], t_ns) - 1
        return self.segments[max(k, 0)]

    @staticmethod
    def _solve(fit: _Fit, host_ns: int) -> float:
        """Solve t = host - offset(t) for the fit's line."""
        return fit.t_ref + (float(host_ns - fit.base - fit.t_ref) - fit.a) / (1.0 + fit.b)

    def to_harness(self, host_ns: int) -> tuple[int, int, int]:
        """A host timestamp on the harness clock: (t_ns, offset_ns, uncertainty_ns).

        Near a step (between the last sample before it and the first after it) both models are
        possible; the answer then covers both.
        """
        if not self.segments:
            raise ClockSyncError(f"no clock estimate for host {self.host} yet")
        # A cycle converts each observation when it arrives and again when the cycle ends: with no sample
        # added in between the model, and so the answer, is the same.
        known = self._converted.get(host_ns)
        if known is not None:
            return known
        if len(self._converted) >= 1 << 16:
            self._converted.clear()
        self._converted[host_ns] = answer = self._to_harness(host_ns)
        return answer

    def _to_harness(self, host_ns: int) -> tuple[int, int, int]:
        if len(self.segments) == 1:  # no step: the loop below with its one window, unbounded both ways
            seg = self.segments[0]
            fit = seg.fit_at(round(self._solve(seg.fit, host_ns))) if seg.history else seg.fit
            t = self._solve(fit, host_ns)
            bound = self._predict(fit, round(t))[1] * (1.0 + abs(fit.b))
            lo, hi = t - bound, t + bound
            t_mid = round((lo + hi) / 2)
            return t_mid, host_ns - t_mid, math.ceil((hi - lo) / 2)
        return self._to_harness_segments(host_ns)

    def _to_harness_segments(self, host_ns: int) -> tuple[int, int, int]:
        intervals = []
        nearest: tuple[float, float, float] | None = None
        for k, seg in enumerate(self.segments):
            fit = seg.fit_at(round(self._solve(seg.fit, host_ns)))  # the window around that time
            t = self._solve(fit, host_ns)
            _, bound = self._predict(fit, round(t))
            bound *= 1.0 + abs(fit.b)  # conversion back through the model; negligible but safe
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

    # ---- the same over arrays: `to_harness` of many host times at once, element by element the same floats
    def _predict_bound_many(self, fit: _Fit, t_ns: np.ndarray) -> np.ndarray:
        """`_predict(fit, t)[1]` of each of `t_ns` (int64)."""
        x = (t_ns - fit.t_ref).astype(np.float64)
        bound = fit.near_many(x)
        t, e = fit.times, fit.bounds
        between = (t[0] < x) & (x < t[-1])
        if between.any():
            j = np.clip(np.searchsorted(t, x, side="left"), 1, len(t) - 1)
            t0, t1 = t[j - 1], t[j]
            with np.errstate(divide="ignore", invalid="ignore"):
                lam = np.where(t1 > t0, (x - t0) / (t1 - t0), 0.0)
            inner = (1 - lam) * e[j - 1] + lam * e[j] + self.wander * np.minimum(x - t0, t1 - x)
            bound = np.where(between, np.minimum(bound, inner), bound)
        return bound

    @staticmethod
    def _solve_many(fit: _Fit, host_ns: np.ndarray) -> np.ndarray:
        return float(fit.t_ref) + ((host_ns - fit.base - fit.t_ref).astype(np.float64) - fit.a) / (1.0 + fit.b)

    def to_harness_many(self, host_ns: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """`to_harness` of each of `host_ns` (int64) as arrays (t_ns, offset_ns, uncertainty_ns), each element the
        same as one call gives. OverflowError when a time or the model is too large for int64 arithmetic."""
        if not self.segments:
            raise ClockSyncError(f"no clock estimate for host {self.host} yet")
        host_ns = np.asarray(host_ns, dtype=np.int64)
        if len(host_ns):  # `host_ns - base - t_ref` of every fit, exact in int64
            ends = int(host_ns.min()), int(host_ns.max())
            if any(abs(h - f.base) >= 1 << 63 or abs(h - f.base - f.t_ref) >= 1 << 63
                   for seg in self.segments for f in [seg.fit, *seg.history] for h in ends):
                raise OverflowError("host times too far from the clock model for int64 arithmetic")
        # as `_to_harness_segments` (one segment: its one window, unbounded both ways, gives `_to_harness`'s answer)
        lo, hi = np.full(len(host_ns), np.inf), np.full(len(host_ns), -np.inf)
        taken = np.zeros(len(host_ns), dtype=bool)
        nearest = np.full(len(host_ns), np.inf), np.zeros(len(host_ns)), np.zeros(len(host_ns))
        for k, seg in enumerate(self.segments):
            # the window around each time: `seg.fit_at`
            at = _rint64(self._solve_many(seg.fit, host_ns))
            which = np.full(len(host_ns), -1)
            if seg.history:
                older = at < seg.fit.first_t
                which[older] = np.maximum(np.searchsorted(seg.history_starts, at[older], side="right") - 1, 0)
            t, bound = np.empty(len(host_ns)), np.empty(len(host_ns))
            for w in np.unique(which).tolist():
                mine = which == w
                fit = seg.fit if w < 0 else seg.history[w]
                t[mine] = self._solve_many(fit, host_ns[mine])
                bound[mine] = self._predict_bound_many(fit, _rint64(t[mine])) * (1.0 + abs(fit.b))
            lo_window = self.segments[k - 1].last_t if k > 0 else -math.inf
            hi_window = self.segments[k + 1].first_t if k + 1 < len(self.segments) else math.inf
            inside = (lo_window - bound < t) & (t < hi_window + bound)
            lo = np.where(inside, np.minimum(lo, t - bound), lo)
            hi = np.where(inside, np.maximum(hi, t + bound), hi)
            taken |= inside
            gap = np.maximum(np.maximum(lo_window - t, t - hi_window), 0.0)
            closer = gap < nearest[0]
            nearest = (np.where(closer, gap, nearest[0]), np.where(closer, t - bound, nearest[1]),
                       np.where(closer, t + bound, nearest[2]))
        # inconsistent with every segment's window: the closest one
        lo, hi = np.where(taken, lo, nearest[1]), np.where(taken, hi, nearest[2])
        t_mid = _rint64((lo + hi) / 2)
        return t_mid, host_ns - t_mid, _rint64(np.ceil((hi - lo) / 2))

    # ---- reporting
    @property
    def drift_ppm(self) -> float | None:
        return self.segments[-1].fit.b * 1e6 if self.segments else None

    def table(self) -> dict:
        """A JSON-ready summary for the run manifest."""
        segments = []
        for seg in self.segments:
            offset, bound = self._predict(seg.fit, seg.last_t)
            segments.append({"from_ns": seg.first_t, "to_ns": seg.last_t, "samples": seg.count,
                             "offset_ns": seg.fit.base + round(offset), "uncertainty_ns": math.ceil(bound),
                             "drift_ppm": seg.fit.b * 1e6, "min_delay_ns": seg.min_delay_ns})
        return {"host": self.host, "segments": segments,
                "steps": [{"t_ns": s.t_ns, "after_ns": s.after_ns, "jump_ns": s.jump_ns,
                           "uncertainty_ns": s.uncertainty_ns, "not_before_ns": s.not_before_ns,
                           "not_after_ns": s.not_after_ns} for s in self.steps]}


def clock_table(trackers: dict[str, ClockTracker] | list[ClockTracker]) -> list[dict]:
    """Manifest `clock` entry for several hosts."""
    values = trackers.values() if isinstance(trackers, dict) else trackers
    return [t.table() for t in values]


# ---------------------------------------------------------------- clock sources a lab already runs
# One exec per host: chrony's tracking, the local ptp4l's time status and path delay, then the host's time (the
# instant the readings are grown to). A missing daemon or tool only empties its section.
CLOCK_SOURCES_COMMAND = ("echo '## chrony'; chronyc {chronyd}-c tracking; echo '## ptp'; {pmc}; "
                         "echo '## date'; date +%s.%N")
PMC_COMMAND = "pmc -u -b 0 {ptp4l}'GET TIME_STATUS_NP' 'GET CURRENT_DATA_SET'"
# Where ptp4l answered: a second exec reads PTP_SAMPLES more syncs PTP_SPACING_S apart (one sync can be delayed far
# beyond the path delay on a loaded host: the bound takes the best-bounded of them, `ptp_offset_bound`)
PTP_SAMPLES, PTP_SPACING_S = 4, 0.25


def clock_sources_command(chronyd_socket: str | None = None, ptp4l_socket: str | None = None) -> str:
    """The command `read_clock_sources` parses; the sockets: daemons not at their default paths
    (/var/run/chrony/chronyd.sock, /var/run/ptp4l)."""
    import shlex

    return CLOCK_SOURCES_COMMAND.format(chronyd=f"-h {shlex.quote(chronyd_socket)} " if chronyd_socket else "",
                                        pmc=_pmc(ptp4l_socket))


def ptp_samples_command(ptp4l_socket: str | None = None) -> str:
    """More of ptp4l's syncs, each its own `## ptp` section, then the host's time: appended to the output of
    `clock_sources_command`, `read_clock_sources` bounds the offset from all of them."""
    pmc = _pmc(ptp4l_socket)
    return "".join(f"sleep {PTP_SPACING_S}; echo '## ptp'; {pmc}; " for _ in range(PTP_SAMPLES)) + \
        "echo '## date'; date +%s.%N"


def _pmc(ptp4l_socket: str | None) -> str:
    import shlex

    return PMC_COMMAND.format(ptp4l=f"-s {shlex.quote(ptp4l_socket)} " if ptp4l_socket else "")


@dataclass(frozen=True)
class SourceReading:
    """A host clock against a source's reference: host minus reference = `offset_ns` ± `width_ns` at host time
    `host_ns`; `bound_ns` = |offset_ns| + width_ns, the bound on the host clock's error itself (ClockBound's
    clock error bound for chrony). `rule` says how `width_ns` was derived."""

    source: str  # 'chrony' | 'ptp'
    host_ns: int
    offset_ns: int
    width_ns: int
    reference: str
    rule: str

    @property
    def bound_ns(self) -> int:
        return abs(self.offset_ns) + self.width_ns


CHRONY_RULE = ("AWS ClockBound: |System time| + Root dispersion + Root delay/2, the dispersion grown since Ref time "
               "at (1 ppm + Skew + |Residual freq|)")
PTP_RULE = ("IEEE 1588 delay request-response: |master_offset| + meanPathDelay + the sync's delay beyond the least "
            "delayed of the syncs read (ptp4l subtracts its filtered path delay from each sync's own t2 - t1: the "
            "offset errs by that sync's delay less the mean, within the mean if the least delayed sync was no "
            "slower than the median round trip), grown since ingress_time at 1 ppm; the clock ptp4l stamps "
            "with (CLOCK_REALTIME under -S, else the NIC's PHC, which phc2sys copies with its own error)")


def read_clock_sources(stdout: str, *, max_clock_error_ppm: float = 1.0) -> tuple[dict[str, SourceReading], dict]:
    """Parse the output of `clock_sources_command()`: the readings found and, per source, why there is none."""
    from devices.parsers.clock_tools import (parse_chronyc_tracking_csv, parse_date_ns, parse_pmc,
                                             ptp_offset_bound, ptp_status)
    from devices.parsers.common import ParseError

    blocks: list[tuple[str, list[str]]] = []  # a section may repeat (one `## ptp` per sync read): kept in order
    for line in stdout.splitlines():
        if line.startswith("## "):
            blocks.append((line[3:].strip(), []))
        elif blocks:
            blocks[-1][1].append(line)
    sections = {name: lines for name, lines in blocks}  # the last of each: the latest `## date`
    if "date" not in sections:
        raise ClockSyncError(f"clock sources: no '## date' section in {stdout[-200:]!r}")
    try:
        host_ns = parse_date_ns("\n".join(sections["date"]))
    except ParseError as exc:
        raise ClockSyncError(f"clock sources: {exc}") from None
    readings: dict[str, SourceReading] = {}
    absent: dict[str, str] = {}
    chrony = "\n".join(sections.get("chrony", ())).strip()
    try:
        if not chrony:
            absent["chrony"] = "no chronyd answered (none running, or chronyc absent)"
        else:
            t = parse_chronyc_tracking_csv(chrony)
            if t.leap_status == "Not synchronised" or t.stratum == 0:
                absent["chrony"] = f"chronyd not synchronised (stratum {t.stratum}, {t.leap_status})"
            else:
                at_s = host_ns / 1e9
                readings["chrony"] = SourceReading(
                    source="chrony", host_ns=host_ns, offset_ns=round(t.system_time_s * 1e9),
                    width_ns=math.ceil(t.correction_bound_s(at_s, max_clock_error_ppm) * 1e9),
                    reference=f"{t.reference_id} ({t.reference_name}) stratum {t.stratum}", rule=CHRONY_RULE)
    except ParseError as exc:
        absent["chrony"] = f"unreadable chronyc -c tracking: {exc}"
    try:
        statuses = [ptp_status(parse_pmc("\n".join(lines))) for name, lines in blocks if name == "ptp"]
        status = statuses[0] if statuses else None
        if status is None:
            absent["ptp"] = "no ptp4l answered (none running, pmc absent, or its socket not ours to use)"
        elif not status.synced or status.mean_path_delay_ns is None:
            absent["ptp"] = f"ptp4l without a master sync (gmPresent {status.gm_present}, ingress_time " \
                            f"{status.ingress_time_ns}{', no path delay' if status.mean_path_delay_ns is None else ''})"
        else:
            best, width = ptp_offset_bound([s for s in statuses if s is not None], host_ns, max_clock_error_ppm)
            readings["ptp"] = SourceReading(
                source="ptp", host_ns=host_ns, offset_ns=best.master_offset_ns, width_ns=math.ceil(width),
                reference=f"grandmaster {best.gm_identity}, {best.steps_removed} step(s) removed", rule=PTP_RULE)
    except ParseError as exc:
        absent["ptp"] = f"unreadable pmc reply: {exc}"
    return readings, absent


def realtime_minus_monotonic() -> tuple[int, int]:
    """This machine's CLOCK_REALTIME minus the harness clock, ± half the pair's read width (the narrower of two)."""
    import time

    best = None
    for _ in range(2):
        a = now_ns()
        r = time.clock_gettime_ns(time.CLOCK_REALTIME)
        b = now_ns()
        if best is None or b - a < best[1]:
            best = (r - (a + b) // 2, b - a)
    return best[0], (best[1] + 1) // 2 + 1


def cross_check(reading: SourceReading, probe: tuple[int, int, int], harness_realtime: tuple[int, int]) -> dict:
    """The source's offset against the SSH probe's at the reading's host time. `probe`: the tracker's
    `to_harness(reading.host_ns)` = (t_ns, host minus harness clock, ±); `harness_realtime`: this machine's realtime
    minus the harness clock (±). Assumes the harness machine's realtime is on the source's reference (a lab's hosts
    and harness following the same servers); their disagreement beyond both bounds (and the pair's) is a warning."""
    _, probe_offset, probe_u = probe
    rt_offset, rt_u = harness_realtime
    probe_vs_realtime = probe_offset - rt_offset  # host minus this machine's realtime, by the probe
    disagreement = probe_vs_realtime - reading.offset_ns
    allowed = probe_u + rt_u + reading.width_ns
    return {"probe_offset_ns": probe_vs_realtime, "probe_uncertainty_ns": probe_u + rt_u,
            "disagreement_ns": disagreement, "allowed_ns": allowed, "ok": abs(disagreement) <= allowed}


def clock_source_entry(readings: dict[str, SourceReading], absent: dict, tracker: "ClockTracker | None",
                       harness_realtime: tuple[int, int]) -> dict:
    """The manifest's `sources` entry of one host: each reading with the probe's bound beside it."""
    entry: dict = {"absent": dict(absent)} if absent else {}
    for name, r in readings.items():
        row = {"offset_ns": r.offset_ns, "width_ns": r.width_ns, "bound_ns": r.bound_ns, "host_ns": r.host_ns,
               "reference": r.reference, "rule": r.rule}
        if tracker is not None and tracker.segments:
            row["probe"] = cross_check(r, tracker.to_harness(r.host_ns), harness_realtime)
        entry[name] = row
    return entry


def source_warnings(tables: list[dict]) -> list[str]:
    """One line per host and source whose reading disagrees with the SSH probe beyond both bounds."""
    out = []
    for t in tables:
        for name, row in (t.get("sources") or {}).items():
            check = row.get("probe") if isinstance(row, dict) else None
            if check and not check["ok"]:
                out.append(f"clock of {t['host']}: {name} says {row['offset_ns'] / 1e3:+.1f} µs ± "
                           f"{row['width_ns'] / 1e3:.1f}, the SSH probe {check['probe_offset_ns'] / 1e3:+.1f} µs ± "
                           f"{check['probe_uncertainty_ns'] / 1e3:.1f}: they disagree by "
                           f"{check['disagreement_ns'] / 1e3:+.1f} µs, beyond both bounds")
    return out
