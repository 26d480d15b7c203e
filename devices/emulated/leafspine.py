"""The emulated packet fabric as a multiplane leaf–spine (the flow model of analysis/fabric.py), for the
emulated `alltoall_perf` when it is given `--fabric` (the Spectrum-X link studies).

- Endpoints are the bench's NIC ports in inventory order: port i sits on leaf i // per_leaf of every plane.
- Leaf–spine links are pulled and restored by the emulated `fabric_link PLANE LEAF SPINE down|up` (a switch's
  port shut, as `nv set interface … link state down` on a real leaf): each change is stamped with the harness
  clock under the fabric's lock, so an integration never runs past a change it has not seen; integrations
  hold their own lock, so a shut never waits for one.
- A link is dark (carries nothing) from its pull to its restore; routes avoid it from the profile's
  `fabric.detection` after the pull (until then the flows hashed or sprayed onto it stall).
- A collective: every rank of `--self` + `--peers` joins a rendezvous (NCCL's communicator set-up) and the
  collective starts when the last one joined; each of its transfers starts when the previous one has ended
  on every rank (a barrier). The flows of a transfer move at max-min fair rates over the links
  (analysis.fabric.fluid_steps), solved again at every flow's end and every fabric change, only as far as a
  reader asks (`Schedule`), and read in closed form between (rates are constant there): a counter read costs
  a bisect. A busy machine delays when a tool returns, not what it prints.
"""
from __future__ import annotations

import bisect
import math
import threading
import weakref
from dataclasses import dataclass

import numpy as np

from analysis import fabric as fb
from devices.timing import now_ns

_STATES: "weakref.WeakKeyDictionary[object, FabricLinks]" = weakref.WeakKeyDictionary()
_LOCK = threading.Lock()


@dataclass(frozen=True)
class Declared:
    """The fabric a tool declares (`--fabric planes=2,per_leaf=4,spines=4,lb=ecmp,seed=13`)."""

    planes: int
    per_leaf: int
    spines: int
    lb: str
    seed: int

    @classmethod
    def parse(cls, text: str) -> "Declared":
        fields = dict(part.partition("=")[::2] for part in text.split(",") if part)
        unknown = set(fields) - {"planes", "per_leaf", "spines", "lb", "seed"}
        if unknown:
            raise ValueError(f"--fabric: unknown key {sorted(unknown)[0]!r} (planes, per_leaf, spines, lb, seed)")
        try:
            out = cls(int(fields.get("planes", 2)), int(fields.get("per_leaf", 4)), int(fields.get("spines", 4)),
                      fields.get("lb", "ecmp"), int(fields.get("seed", 0)))
        except ValueError:
            raise ValueError(f"--fabric {text!r}: planes, per_leaf, spines and seed are integers") from None
        if out.lb not in fb.MODES:
            raise ValueError(f"--fabric: lb {out.lb!r} is not one of {', '.join(fb.MODES)}")
        return out


class FabricLinks:
    """The leaf–spine links' pulls and restores on one bench, on the harness clock."""

    def __init__(self, detection_s: float):
        self.lock = threading.RLock()
        self.detection_s = detection_s
        self.spans: dict[tuple, list[list]] = {}  # (plane, leaf, spine) -> [[down ns, up ns | None], ...]
        self.pending: dict[frozenset, dict] = {}
        self.solved: dict = {}  # a transfer's fluid solution under one state, for its repeats

    def set_state(self, link: tuple[int, int, int], up: bool) -> int:
        with self.lock:
            t = now_ns()
            spans = self.spans.setdefault(link, [])
            if up and spans and spans[-1][1] is None:
                spans[-1][1] = t
            elif not up and not (spans and spans[-1][1] is None):
                spans.append([t, None])
            return t

    def state(self, t: int) -> tuple[frozenset, frozenset]:
        """(dark links, links routed around) at `t`."""
        det = int(self.detection_s * 1e9)
        dark, out = set(), set()
        with self.lock:
            items = [(link, [tuple(span) for span in spans]) for link, spans in self.spans.items()]
        for link, spans in items:
            for down, up in spans:
                if down <= t and (up is None or t < up):
                    dark.add(link)
                    if t >= down + det:
                        out.add(link)
        return frozenset(dark), frozenset(out)

    def next_change(self, t: int) -> int | None:
        det = int(self.detection_s * 1e9)
        with self.lock:
            spans = [tuple(span) for spans in self.spans.values() for span in spans]
        later = [x for down, up in spans
                 for x in (down, down + det if up is None or down + det < up else None, up) if x is not None and x > t]
        return min(later, default=None)


def links_of(bench, detection_s: float) -> FabricLinks:
    with _LOCK:
        state = _STATES.get(bench)
        if state is None:
            state = _STATES[bench] = FabricLinks(detection_s)
        return state


def flap_truth_ns(bench, links, after_ns: int) -> tuple[int, int] | None:
    """The emulator's truth of a flap of the leaf–spine `links` shut after `after_ns`, harness ns: (the last of
    them dark, routed around — every flow off the shut links). From the last: a shell line of shut commands
    spreads them over its own run time, which is the tool's, not the fabric's."""
    state = _STATES.get(bench)
    if state is None:
        return None
    with state.lock:
        downs = [next((d for d, _ in state.spans.get(tuple(link), []) if d >= after_ns), None) for link in links]
    if not downs or None in downs:
        return None
    return max(downs), max(downs) + int(state.detection_s * 1e9)


def detection_of(bench) -> float:
    profile = getattr(bench, "profile", None)
    return profile.fabric_detection.at_quantile(0.5) if profile is not None else 1e-3


class Schedule:
    """A transfer's flows under one fabric state from `left` bytes on, in closed form relative to its start:
    every rank's bytes at any instant (rates are constant between segment ends), each flow's end and the
    transfer's. Its segments (analysis.fabric.fluid_steps: a max-min solve each) are solved only as far as a
    reader asks — a state the fabric leaves again soon (a shut link before its detection) costs the segments
    it lasted. A whole transfer under one state is kept per bench once complete (a tool's iterations repeat
    it)."""

    def __init__(self, w: np.ndarray, cap: np.ndarray, left: np.ndarray, pairs: np.ndarray, endpoints: int,
                 scale: float, memo=None):
        self.left, self.memo = left, memo
        self._steps = fb.fluid_steps(w, cap, left)
        self.by_rank = np.zeros((len(left), 2 * endpoints))  # a flow's bytes to its rank's sent and received
        self.by_rank[np.arange(len(left)), pairs[:, 0]] = scale
        self.by_rank[np.arange(len(left)), endpoints + pairs[:, 1]] += scale
        self.segments: list[tuple[float, float, np.ndarray]] = []
        self.starts: list[float] = []
        self.stops: list[float] = []
        self.rank_rates: list[np.ndarray] = []  # per segment: every rank column's bytes/s
        self.rank_bytes = [np.zeros(2 * endpoints)]  # by every segment's start, and the last one's end
        self.flow_end = np.where(left <= 0, 0, -1).astype(np.int64)  # the first ns it is done, -1 not yet
        self.complete = not (left > 0).any()
        self.finish: int | None = 0 if self.complete else None  # ns after the start, once every flow is done

    def extend_to(self, dt_ns: float) -> None:
        """Solve segments until they cover `dt_ns` after the start (or the transfer is done or stalls)."""
        while not self.complete and (not self.stops or self.stops[-1] * 1e9 < dt_ns):
            step = next(self._steps, None)
            if step is None:
                self.complete = True
                break
            a, b, rates, after = step
            self.segments.append((a, b, rates))
            self.starts.append(a)
            self.stops.append(b)
            self.rank_rates.append(rates @ self.by_rank)
            if math.isfinite(b):
                self.rank_bytes.append(self.rank_bytes[-1] + self.rank_rates[-1] * (b - a))
                ended = (after <= 0) & (self.flow_end < 0)
                self.flow_end[ended] = int(math.ceil(b * 1e9))
            if not (after > 0).any():
                self.complete, self.finish = True, int(math.ceil(b * 1e9))

    def bytes_at(self, dt_ns: int, cols) -> np.ndarray:
        """The bytes of rank columns `cols` moved `dt_ns` after the start (solved that far)."""
        x = dt_ns / 1e9
        i = bisect.bisect_right(self.starts, x) - 1
        if i < 0:
            return np.zeros(self.rank_bytes[0][cols].shape)
        if x >= self.stops[i]:
            return self.rank_bytes[i + 1][cols]
        return self.rank_bytes[i][cols] + self.rank_rates[i][cols] * (x - self.starts[i])

    def left_at(self, dt_ns: int, size: np.ndarray) -> np.ndarray:
        """Every flow's bytes left `dt_ns` after the start (a state change cuts the schedule there)."""
        left = self.left
        x = dt_ns / 1e9
        for a, b, rates in self.segments:
            if a >= x:
                break
            left = np.where(rates > 0, np.maximum(left - rates * (min(b, x) - a), 0.0), left)
        return np.where(left <= 1e-9 * np.maximum(size, 1.0), 0.0, left)


class Collective:
    """One collective's transfers over the fabric, every rank's bytes integrated together: a transfer is
    solved (`Schedule`) at its start and at every fabric change while it runs, and between those read in
    closed form — a counter read costs a bisect, not an integration."""

    def __init__(self, links: FabricLinks, topo: fb.LeafSpine, declared: Declared, index: dict[str, int],
                 plans: dict[str, list[list[tuple[str, float, float]]]], latency_ns: int, scale: float,
                 start_ns: int):
        self.links, self.topo, self.declared, self.scale, self.latency_ns = links, topo, declared, scale, latency_ns
        self.ranks = sorted(plans, key=index.__getitem__)
        counts = {len(p) for p in plans.values()}
        if len(counts) != 1:
            raise ValueError("the ranks of one collective give different numbers of transfers")
        self.k_total = counts.pop()
        self.iters = []  # per transfer: (pairs (F, 3), bytes (F,)) of every rank's sends
        for k in range(self.k_total):
            rows = [(index[r], index[peer], 0, send) for r in self.ranks for peer, send, _ in plans[r][k] if send > 0]
            rows.sort()
            pairs = np.asarray([x[:3] for x in rows], dtype=int).reshape(-1, 3)
            self.iters.append((pairs, np.asarray([x[3] for x in rows], dtype=float) / scale))
        self.pos = {r: index[r] for r in self.ranks}
        self.k, self.t = 0, start_ns
        self.start_ns = start_ns
        self.sched: tuple | None = None  # (state key, start ns, Schedule) of the current transfer
        self.done = np.zeros(2 * topo.endpoints)  # every rank's bytes of the transfers before the current one
        # what the counters read: from each start ns on, (schedule start, Schedule | None, bytes by then)
        self.piece_ns: list[int] = [start_ns]
        self.pieces: list[tuple[int, Schedule | None, np.ndarray]] = [(start_ns, None, self.done.copy())]
        self.ends: dict[str, list[tuple[int, int]]] = {r: [] for r in self.ranks}
        self._w: dict = {}
        # the integration's own lock: a fabric_link stamps its change under the links' lock and never waits for
        # a solve; an integration up to `until` (<= now when asked) reads the changes stamped by then
        self.lock = threading.RLock()
        self._begin(start_ns)

    def _begin(self, t: int) -> None:
        self.t_k = t
        pairs, size = self.iters[self.k]
        self.left = size.copy()
        self.flow_end = np.full(size.shape, -1, dtype=np.int64)
        self.sched = None

    def _solve(self, key) -> Schedule:
        """The current transfer from now under state `key` (a whole transfer under one state: once per bench)."""
        pairs, size = self.iters[self.k]
        fresh = bool(np.array_equal(self.left, size))
        memo = (self.topo, self.declared, self.scale, pairs.tobytes(), size.tobytes(), key) if fresh else None
        with self.links.lock:
            known = self.links.solved.get(memo) if memo is not None else None
        return known or Schedule(self._route(key[1]), self.topo.capacities(key[0]), self.left, pairs,
                                 self.topo.endpoints, self.scale, memo)

    def _keep(self, sched: Schedule) -> None:
        if sched.memo is not None and sched.complete:
            with self.links.lock:
                if len(self.links.solved) > 256:
                    self.links.solved.clear()
                self.links.solved.setdefault(sched.memo, sched)

    def _route(self, out: frozenset) -> np.ndarray:
        key = (self.k, out)
        if key not in self._w:
            pairs, size = self.iters[self.k]
            self._w = {k: v for k, v in self._w.items() if k[0] == self.k}
            self._w[key] = fb.route_matrix(self.topo, fb.Flows(pairs, size), self.declared.lb, out,
                                           self.declared.seed)
        return self._w[key]

    def _bytes(self, i: int, t: int) -> np.ndarray:
        """Every rank column's bytes at `t` (in piece i)."""
        base, sched, before = self.pieces[i]
        if sched is None:
            return before
        return before + sched.bytes_at(t - base, slice(None))

    def _cut(self, t: int) -> None:
        """The current schedule ends at `t` (the fabric changed): its flows' ends and bytes left by then."""
        _, base, sched = self.sched
        size = self.iters[self.k][1]
        ended = (sched.flow_end >= 0) & (base + sched.flow_end <= t) & (self.flow_end < 0)
        self.flow_end[ended] = base + sched.flow_end[ended]
        self.left = sched.left_at(t - base, size)
        self.flow_end[(self.left <= 0) & (self.flow_end < 0)] = t

    def _start(self, t: int, sched: Schedule | None, before: np.ndarray) -> None:
        if self.piece_ns[-1] == t:
            self.piece_ns.pop()
            self.pieces.pop()
        self.piece_ns.append(t)
        self.pieces.append((t, sched, before))

    def advance(self, until: int) -> None:
        """Integrate every rank up to `until` (<= now: every fabric change by then is known)."""
        while self.k < self.k_total and self.t < until:
            resume = self.t_k + self.latency_ns
            if self.t < resume:
                self.t = min(resume, until)
                continue
            key = self.links.state(self.t)
            if self.sched is None or self.sched[0] != key:
                before = self.done.copy()
                if self.sched is not None:
                    before = self._bytes(len(self.pieces) - 1, self.t)
                    self._cut(self.t)
                sched = self._solve(key)
                self.sched = (key, self.t, sched)
                self._start(self.t, sched, before)
            _, base, sched = self.sched
            nxt = self.links.next_change(self.t)
            stop = until if nxt is None else min(until, nxt)
            sched.extend_to(stop - base)
            self._keep(sched)
            finish = None if sched.finish is None else base + sched.finish
            if finish is not None:
                stop = min(stop, finish)
            self.t = stop
            if finish is not None and self.t >= finish:
                self._end_transfer(finish)

    def _end_transfer(self, t: int) -> None:
        _, base, sched = self.sched
        ended = (sched.flow_end >= 0) & (self.flow_end < 0)
        self.flow_end[ended] = base + sched.flow_end[ended]
        self.flow_end[self.flow_end < 0] = t
        pairs, size = self.iters[self.k]
        for r, i in self.pos.items():
            mine = (pairs[:, 0] == i) | (pairs[:, 1] == i)
            end = int(self.flow_end[mine].max()) if mine.any() else self.t_k + self.latency_ns
            self.ends[r].append((self.t_k, end))
        e = self.topo.endpoints
        self.done = self.done + np.r_[np.bincount(pairs[:, 0], weights=size, minlength=e),
                                      np.bincount(pairs[:, 1], weights=size, minlength=e)] * self.scale
        self._start(t, None, self.done)
        self.k += 1
        if self.k < self.k_total:
            self._begin(t)

    def delivered(self, rank: str, t: int) -> tuple[float, float]:
        """`rank`'s (bytes sent, received) by `t`, no later than integrated."""
        t = min(t, self.t)
        i = bisect.bisect_right(self.piece_ns, t) - 1
        if i < 0:
            return 0.0, 0.0
        base, sched, before = self.pieces[i]
        cols = [self.pos[rank], self.topo.endpoints + self.pos[rank]]
        got = before[cols] if sched is None else before[cols] + sched.bytes_at(t - base, cols)
        return float(got[0]), float(got[1])

    def projected_finish_ns(self) -> int:
        if self.k >= self.k_total:
            return self.t
        if self.sched is not None and self.sched[2].finish is not None:
            return self.sched[1] + self.sched[2].finish
        return self.t + 1_000_000  # solved only up to now: look again soon


class RankView:
    """One rank's side of a collective, as the tool and the port counters read it (dataplane.Chain's API)."""

    def __init__(self, coll: Collective, rank: str):
        self.coll, self.rank = coll, rank
        self.start_ns = coll.start_ns
        self.total = self._total()

    def _total(self) -> tuple[float, float]:
        s = r = 0.0
        i = self.coll.pos[self.rank]
        for pairs, size in self.coll.iters:
            s += float(size[pairs[:, 0] == i].sum()) * self.coll.scale
            r += float(size[pairs[:, 1] == i].sum()) * self.coll.scale
        return s, r

    @property
    def finish_ns(self) -> int | None:
        ends = self.coll.ends[self.rank]
        return ends[-1][1] if len(ends) == self.coll.k_total else None

    def advance(self, until_ns: int) -> None:
        with self.coll.lock:
            self.coll.advance(until_ns)

    def projected_finish_ns(self) -> int:
        with self.coll.lock:
            return self.coll.projected_finish_ns()

    def intervals(self) -> list[tuple[int, int]]:
        with self.coll.lock:
            return list(self.coll.ends[self.rank])

    def delivered(self, t_ns: int) -> tuple[float, float]:
        with self.coll.lock:
            return self.coll.delivered(self.rank, t_ns)


def join(bench, declared: Declared, me: str, plan: list[list[tuple[str, float, float]]], latency_ns: int,
         scale: float, nic_gbps: float) -> dict:
    """Join (or open) the rendezvous of the ranks `me` + its peers; the group's dict gets "collective" when
    the last rank has joined."""
    keys = [m.key for m in bench.all_nic_ports()]
    index = {k: i for i, k in enumerate(keys)}
    ranks = frozenset([me] + [peer for step in plan[:1] for peer, _, _ in step])
    links = links_of(bench, detection_of(bench))
    with links.lock:
        group = links.pending.get(ranks)
        if group is None or me in group["plans"]:
            group = links.pending[ranks] = {"plans": {}, "collective": None, "error": None}
        group["plans"][me] = plan
        if len(group["plans"]) == len(ranks):
            del links.pending[ranks]
            topo = fb.LeafSpine(len(keys), declared.planes, declared.per_leaf, declared.spines, nic_gbps)
            try:
                group["collective"] = Collective(links, topo, declared, index, group["plans"], latency_ns, scale,
                                                 now_ns())
            except ValueError as exc:
                group["error"] = str(exc)
        return group
