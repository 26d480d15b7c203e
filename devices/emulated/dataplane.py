"""The emulated tools' data plane: how many bytes a transfer has moved at any instant, from the physics.

A rank's transfer (`Transfer`) sends and receives given bytes to and from each peer. Its rates follow the
NIC ports' states over time (`physics.OpticalBench.nic_changes`: light, PHY and port state changes at their
DUE times), integrated piecewise — never the moment a tool thread happens to run. So a busy machine delays
when a tool returns, not what it prints, and a link pulled while a transfer runs slows it from that instant.

Rates (the all-to-all model of `analysis.mixnet.all_to_all_time`, per rank):
- a peer whose circuit carries (both receivers lit by each other, carrier, port ACTIVE) at the circuit rate,
  each direction on its own;
- every other peer shares the NIC's packet-fabric rate, per direction, in proportion to what is left;
- multiplane load balancing: while any port of the rank's exchange lost its light less than the profile's
  `fabric.detection` ago (and is still dark), the rank keeps spraying onto the dead plane and moves nothing;
  then the lost circuit's traffic is re-spread over the packet fabric (the surviving planes), and moves back
  onto the circuit once it carries again.
Constant states reproduce the closed form: latency + max(max over circuits of max(send, recv) / circuit rate,
max(Σ send, Σ recv) over the rest / packet-fabric rate).

`PortCounters` keeps, per NIC port, the bytes its transfers moved (RDMA `port_xmit_data` / `port_rcv_data`,
in units of 4 octets like the kernel's), which the emulated sysfs and the agent's counter sampler read.
"""
from __future__ import annotations

import bisect
import hashlib
import threading
import weakref
from dataclasses import dataclass
from typing import Callable

_KEEP_NS = 5_000_000_000  # a finished transfer older than this is folded into its port's running totals


def detection_ns(profile, key: str, lost_ns: int) -> int:
    """The fabric's detection delay for `key`'s light lost at `lost_ns`: a quantile of the profile's
    `fabric.detection` keyed by (port, instant), so the same loss is detected alike by every rank."""
    if profile is None:
        return 0
    u = int(hashlib.sha256(f"{key}:{lost_ns}".encode()).hexdigest()[:13], 16) / 16**13
    return int(profile.fabric_detection.at_quantile(min(max(u, 1e-9), 1 - 1e-9)) * 1e9)


class Timeline:
    """One NIC port's state over time: its state at `start_ns`, then (due ns, state) changes in order."""

    def __init__(self, start_ns: int, initial):
        self.times: list[int] = [start_ns]
        self.states: list = [initial]

    def extend(self, changes) -> None:
        for t, state in changes:
            if t > self.times[-1]:
                self.times.append(t)
                self.states.append(state)
            elif t == self.times[-1]:  # several changes at one instant: the state after the last
                self.states[-1] = state

    def at(self, t_ns: int):
        return self.states[max(bisect.bisect_right(self.times, t_ns) - 1, 0)]

    def changes_in(self, after_ns: int, until_ns: int) -> list[int]:
        lo, hi = bisect.bisect_right(self.times, after_ns), bisect.bisect_right(self.times, until_ns)
        return self.times[lo:hi]


class FabricView:
    """Every NIC port's timeline from the view's start, kept up to date on demand — one per physics, shared
    by every transfer on it (one call brings every port's changes).

    `states()` -> (now, {key: state}) and `changes(since_ns)` -> (now, [(due ns, key, state)]) are the
    physics' `nic_states` / `nic_changes`: every change due by `now` is in them."""

    _KEEP = 4096  # changes kept per port (a transfer lives far shorter than that many changes of one port)

    def __init__(self, states: Callable[[], tuple], changes: Callable[[int], tuple], detection):
        self._changes, self.detection, self.lock = changes, detection, threading.Lock()
        now, initial = states()
        self.timelines = {key: Timeline(now, state) for key, state in initial.items()}
        self.start_ns = self.known_ns = now

    def known_until(self, t_ns: int) -> None:
        """Make every change due by `t_ns` known (t_ns <= now)."""
        with self.lock:
            if t_ns <= self.known_ns:
                return
            now, changes = self._changes(self.known_ns)
            for t, key, state in changes:
                line = self.timelines[key]
                line.extend([(t, state)])
                if len(line.times) > 2 * self._KEEP:
                    del line.times[:self._KEEP], line.states[:self._KEEP]
            self.known_ns = max(now, self.known_ns)


_VIEWS: "weakref.WeakKeyDictionary[object, FabricView]" = weakref.WeakKeyDictionary()
_VIEWS_LOCK = threading.Lock()


def fabric(bench) -> FabricView:
    """The one view of `bench` (an `OpticalBench`), made at its first use."""
    with _VIEWS_LOCK:
        view = _VIEWS.get(bench)
        if view is None:
            profile = getattr(bench, "profile", None)
            view = _VIEWS[bench] = FabricView(bench.nic_states, bench.nic_changes,
                                              lambda key, lost_ns: detection_ns(profile, key, lost_ns))
        return view


def carries(state) -> bool:
    return not state.rx_los and state.carrier and state.ib_state == "ACTIVE"


@dataclass
class Peer:
    key: str
    send: float  # bytes still to send to this peer
    recv: float  # bytes still to receive from it
    circuit_bytes_s: float


class Transfer:
    """One rank's share of one collective (or one perftest run), integrated over its ports' timelines.

    `advance(t)` integrates up to `t` (t <= now: every change due by then is known); `delivered(t)` is then
    exact for any t up to the integrated time (bytes are piecewise linear between `checkpoints`)."""

    def __init__(self, view: FabricView, me: str, peers: list[Peer], eps_bytes_s: float, latency_ns: int,
                 start_ns: int):
        self.view, self.me, self.peers, self.eps = view, me, peers, eps_bytes_s
        self.keys = [me] + [p.key for p in peers]
        self.timelines = view.timelines
        self.start_ns = start_ns
        self.total = (sum(p.send for p in peers), sum(p.recv for p in peers))
        self.sent = self.received = 0.0
        self.t = start_ns
        self.checkpoints: list[tuple[int, float, float]] = [(start_ns, 0.0, 0.0)]
        self._times = [start_ns]  # the checkpoints' instants (bisected by every counter read)
        self.finish_ns: int | None = None
        self.lock = threading.Lock()
        self._resume_ns = start_ns + latency_ns  # the fixed start-up cost: nothing moves before it
        if not any(p.send > 0 or p.recv > 0 for p in peers):
            self._finish(self._resume_ns)

    # ---------------------------------------------------------------- state at an instant
    def _stall_until(self, t: int) -> int | None:
        """The end of the undetected loss that stalls the rank at `t`, None if it is not stalled."""
        until = None
        for key in self.keys:
            s = self.timelines[key].at(t)
            if s.rx_los and s.light_lost_ns is not None:
                due = s.light_lost_ns + self.view.detection(key, s.light_lost_ns)
                if s.light_lost_ns <= t < due:
                    until = due if until is None else max(until, due)
        return until

    def _circuit(self, peer: Peer, t: int) -> bool:
        a, b = self.timelines[self.me].at(t), self.timelines[peer.key].at(t)
        return carries(a) and carries(b) and a.lit_by == peer.key and b.lit_by == self.me

    # ---------------------------------------------------------------- integration
    def _checkpoint(self, t: int, sent: float, received: float) -> None:
        self.checkpoints.append((t, sent, received))
        self._times.append(t)

    def _finish(self, t: int) -> None:
        self.finish_ns = t
        self.t = t
        self._checkpoint(t, *self.total)

    def _move(self, t: int, dt_ns: int) -> int | None:
        """Move bytes during [t, t + dt) with the state at t (constant in between); the finish instant if the
        transfer ends in it. Checkpoints at every instant a rate changes."""
        circuit = [p for p in self.peers if self._circuit(p, t)]
        pool = [p for p in self.peers if p not in circuit]
        done = 0
        while done < dt_ns:
            s_pool, r_pool = sum(p.send for p in pool), sum(p.recv for p in pool)
            ends = [max(p.send, p.recv) / p.circuit_bytes_s for p in circuit if max(p.send, p.recv) > 0]
            ends += [x / self.eps for x in (s_pool, r_pool) if x > 0]
            partial = [min(p.send, p.recv) / p.circuit_bytes_s for p in circuit if min(p.send, p.recv) > 0] + ends
            if not ends:
                return t + done
            step_s = min(min(partial), (dt_ns - done) / 1e9)
            step_ns = max(1, min(dt_ns - done, int(round(step_s * 1e9))))
            step_s = step_ns / 1e9
            for p in circuit:
                for attr in ("send", "recv"):
                    left = getattr(p, attr)
                    moved = min(left, p.circuit_bytes_s * step_s)
                    setattr(p, attr, left - moved)
                    self._count(attr, moved)
            for attr, total in (("send", s_pool), ("recv", r_pool)):
                if total > 0:
                    keep = max(0.0, 1 - self.eps * step_s / total)
                    for p in pool:
                        moved = getattr(p, attr) * (1 - keep)
                        setattr(p, attr, getattr(p, attr) * keep if keep > 1e-12 else 0.0)
                        self._count(attr, moved)
            done += step_ns
            self._checkpoint(t + done, self.sent, self.received)
            if all(max(p.send, p.recv) <= 1e-6 for p in self.peers):
                return t + done
        return None

    def _count(self, attr: str, moved: float) -> None:
        if attr == "send":
            self.sent = min(self.total[0], self.sent + moved)
        else:
            self.received = min(self.total[1], self.received + moved)

    def advance(self, until_ns: int) -> None:
        """Integrate up to `until_ns` (every state change due by then is known to the physics)."""
        with self.lock:
            if self.finish_ns is not None or until_ns <= self.t:
                return
            self.view.known_until(until_ns)
            while self.t < until_ns and self.finish_ns is None:
                t = self.t
                if t < self._resume_ns:
                    self.t = min(self._resume_ns, until_ns)
                    self._checkpoint(self.t, self.sent, self.received)
                    continue
                bounds = [until_ns] + [c for k in self.keys for c in self.timelines[k].changes_in(t, until_ns)]
                stall = self._stall_until(t)
                if stall is not None:
                    self.t = min([stall] + bounds)
                    self._checkpoint(self.t, self.sent, self.received)
                    continue
                end = min(bounds)
                finished = self._move(t, end - t)
                if finished is not None:
                    self._finish(finished)
                else:
                    self.t = end

    def projected_finish_ns(self) -> int:
        """When the transfer ends if no state changes after the integrated time (for a tool's sleep)."""
        with self.lock:
            if self.finish_ns is not None:
                return self.finish_ns
            t = max(self.t, self._resume_ns)
            stall = self._stall_until(t)
            t = stall if stall is not None else t
            circuit = [p for p in self.peers if self._circuit(p, self.t)]
            pool = [p for p in self.peers if p not in circuit]
            ends = [max(p.send, p.recv) / p.circuit_bytes_s for p in circuit]
            ends += [max(sum(p.send for p in pool), sum(p.recv for p in pool)) / self.eps]
            return t + int(max(ends) * 1e9) + 1

    def delivered(self, t_ns: int) -> tuple[float, float]:
        """(bytes sent, bytes received) by `t_ns`, for t_ns up to the integrated time."""
        with self.lock:
            cps = self.checkpoints
            if t_ns <= cps[0][0]:
                return 0.0, 0.0
            if t_ns >= cps[-1][0]:
                return cps[-1][1], cps[-1][2]
            i = bisect.bisect_right(self._times, t_ns)
            (t0, s0, r0), (t1, s1, r1) = cps[i - 1], cps[i]
            w = (t_ns - t0) / (t1 - t0) if t1 > t0 else 1.0
            return s0 + w * (s1 - s0), r0 + w * (r1 - r0)


class Chain:
    """A tool's transfers back to back: each starts when the one before ends, on the fabric's time, and the
    whole chain is counted from its start — so a counter read never sees a gap that a late tool thread would
    leave between two of its iterations. `plan`: per transfer, its (peer key, send, recv, circuit bytes/s)."""

    def __init__(self, view: FabricView, me: str, plan: list[list[tuple[str, float, float, float]]],
                 eps_bytes_s: float, latency_ns: int, start_ns: int):
        self.view, self.me, self.plan, self.eps, self.latency_ns = view, me, plan, eps_bytes_s, latency_ns
        self.start_ns = start_ns
        self.total = (sum(x[1] for step in plan for x in step), sum(x[2] for step in plan for x in step))
        self.transfers: list[Transfer] = []
        self._starts: list[int] = []
        self._before: list[tuple[float, float]] = []  # the totals of every transfer before each one
        self.lock = threading.Lock()
        self._next(start_ns)

    def _next(self, start_ns: int) -> None:
        if self.transfers:
            last, (s, r) = self.transfers[-1], self._before[-1]
            self._before.append((s + last.total[0], r + last.total[1]))
        else:
            self._before.append((0.0, 0.0))
        step = self.plan[len(self.transfers)]
        self.transfers.append(Transfer(self.view, self.me, [Peer(*x) for x in step], self.eps, self.latency_ns,
                                       start_ns))
        self._starts.append(start_ns)

    @property
    def finish_ns(self) -> int | None:
        last = self.transfers[-1]
        return last.finish_ns if len(self.transfers) == len(self.plan) else None

    def advance(self, until_ns: int) -> None:
        with self.lock:
            while True:
                current = self.transfers[-1]
                current.advance(until_ns)
                if current.finish_ns is None or len(self.transfers) == len(self.plan):
                    return
                self._next(current.finish_ns)

    def projected_finish_ns(self) -> int:
        """When the current transfer ends if no state changes (for a tool's sleep)."""
        with self.lock:
            return self.transfers[-1].projected_finish_ns()

    def delivered(self, t_ns: int) -> tuple[float, float]:
        """Every transfer before the one running at `t_ns` whole, that one in part: O(log transfers)."""
        with self.lock:
            i = bisect.bisect_left(self._starts, t_ns) - 1
            if i < 0:
                return 0.0, 0.0
            (s, r), (ds, dr) = self._before[i], self.transfers[i].delivered(t_ns)
        return s + ds, r + dr

    def intervals(self) -> list[tuple[int, int | None]]:
        with self.lock:
            return [(tr.start_ns, tr.finish_ns) for tr in self.transfers]


class PortCounters:
    """Every transfer of one NIC port: cumulative bytes sent and received at any instant up to now."""

    def __init__(self):
        self.lock = threading.Lock()
        self.base = (0.0, 0.0)
        self.transfers: list[Chain] = []

    def start(self, make: Callable[[int], Chain], clock: Callable[[], int]) -> Chain:
        """`make(start_ns)`, started now and counted from then: a read either ran before the start (it cannot
        include it) or sees it."""
        with self.lock:
            chain = make(clock())
            self.transfers.append(chain)
            return chain

    def at(self, t_ns: int) -> tuple[float, float]:
        """(bytes sent, bytes received) by `t_ns` (<= now): running transfers are integrated up to it."""
        with self.lock:
            keep, base_s, base_r = [], *self.base
            for tr in self.transfers:
                if tr.finish_ns is not None and tr.finish_ns < t_ns - _KEEP_NS:
                    base_s, base_r = base_s + tr.total[0], base_r + tr.total[1]
                else:
                    keep.append(tr)
            self.base, self.transfers = (base_s, base_r), keep
            running = list(keep)
        sent, received = base_s, base_r
        for tr in running:
            if tr.start_ns < t_ns:
                tr.advance(t_ns)
                s, r = tr.delivered(t_ns)
                sent, received = sent + s, received + r
        return sent, received


_COUNTERS: "weakref.WeakKeyDictionary[object, dict[str, PortCounters]]" = weakref.WeakKeyDictionary()


def counters(bench, key: str) -> PortCounters:
    """The counters of NIC port `key` ("host:netdev") on `bench` (one set per physics)."""
    with _VIEWS_LOCK:
        return _COUNTERS.setdefault(bench, {}).setdefault(key, PortCounters())
