"""The emulated packet fabric as a multiplane leaf–spine (the flow model of analysis/fabric.py), for the
emulated `alltoall_perf` when it is given `--fabric` (the Spectrum-X link studies).

- Endpoints are the bench's NIC ports in inventory order: port i sits on leaf i // per_leaf of every plane.
- Leaf–spine links are pulled and restored by the emulated `fabric_link PLANE LEAF SPINE down|up` (a switch's
  port shut, as `nv set interface … link state down` on a real leaf): each change is stamped with the harness
  clock under the fabric's lock, so an integration never runs past a change it has not seen.
- A link is dark (carries nothing) from its pull to its restore; routes avoid it from the profile's
  `fabric.detection` after the pull (until then the flows hashed or sprayed onto it stall).
- A collective: every rank of `--self` + `--peers` joins a rendezvous (NCCL's communicator set-up) and the
  collective starts when the last one joined; each of its transfers starts when the previous one has ended
  on every rank (a barrier). The flows of a transfer move at max-min fair rates over the links
  (analysis.fabric.fluid), solved again at every flow's end and every fabric change, integrated lazily up to
  the instant a reader asks for — so a busy machine delays when a tool returns, not what it prints.
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
        for link, spans in self.spans.items():
            for down, up in spans:
                if down <= t and (up is None or t < up):
                    dark.add(link)
                    if t >= down + det:
                        out.add(link)
        return frozenset(dark), frozenset(out)

    def next_change(self, t: int) -> int | None:
        det = int(self.detection_s * 1e9)
        later = [x for spans in self.spans.values() for down, up in spans
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


class Collective:
    """One collective's transfers over the fabric, every rank's bytes integrated together."""

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
        self.sched = None  # (state key, base ns, segments, left after) of the current transfer under one state
        self._done = None  # (schedule, segments applied, bytes left after them, asked at): _left_at's progress
        self._begin(start_ns)
        self.checkpoints = {r: [(start_ns, 0.0, 0.0)] for r in self.ranks}
        self.checkpoint_ns = {r: [start_ns] for r in self.ranks}  # their instants, for bisect (counters read often)
        self.done = {r: (0.0, 0.0) for r in self.ranks}  # bytes of the transfers before the current one
        self.ends: dict[str, list[tuple[int, int]]] = {r: [] for r in self.ranks}
        self._w: dict = {}

    def _begin(self, t: int) -> None:
        self.t_k = t
        pairs, size = self.iters[self.k]
        self.left = size.copy()
        self.flow_end = np.full(size.shape, -1, dtype=np.int64)
        self.sched = None

    def _fluid(self, key) -> tuple[list, np.ndarray, np.ndarray]:
        """(segments, bytes left at the start, after) of the current transfer from now under state `key`; a
        whole transfer under one state is solved once per bench (the iterations of a tool repeat it)."""
        pairs, size = self.iters[self.k]
        fresh = bool(np.array_equal(self.left, size))
        memo = (self.topo, self.declared, pairs.tobytes(), size.tobytes(), key) if fresh else None
        if memo is not None and memo in self.links.solved:
            segments, after = self.links.solved[memo]
        else:
            segments, after = fb.fluid(self._route(key[1]), self.topo.capacities(key[0]), self.left)
            if memo is not None:
                if len(self.links.solved) > 256:
                    self.links.solved.clear()
                self.links.solved[memo] = (segments, after)
        return segments, self.left.copy(), after

    def _route(self, out: frozenset) -> np.ndarray:
        key = (self.k, out)
        if key not in self._w:
            pairs, size = self.iters[self.k]
            self._w = {k: v for k, v in self._w.items() if k[0] == self.k}
            self._w[key] = fb.route_matrix(self.topo, fb.Flows(pairs, size), self.declared.lb, out,
                                           self.declared.seed)
        return self._w[key]

    def _rank_bytes(self, moved: np.ndarray) -> dict[str, tuple[float, float]]:
        pairs = self.iters[self.k][0]
        sent = np.bincount(pairs[:, 0], weights=moved, minlength=self.topo.endpoints) * self.scale
        recv = np.bincount(pairs[:, 1], weights=moved, minlength=self.topo.endpoints) * self.scale
        return {r: (float(sent[i]), float(recv[i])) for r, i in self.pos.items()}

    def _left_at(self, x: int) -> np.ndarray:
        """Bytes left of every flow at `x` under the current schedule. `advance` asks for increasing instants:
        the segments ended by then are applied once and kept (re-applying them from the schedule's start at
        every instant made an ECMP transfer's integration quadratic in its flows' end times — slower than the
        fabric's own time at 20 ranks)."""
        _, base, segments, left, _ = self.sched
        i = 0
        if self._done is not None and self._done[0] is self.sched and self._done[3] <= x:
            _, i, left, _ = self._done
        while i < len(segments) and math.isfinite(segments[i][1]) and base + segments[i][1] * 1e9 <= x:
            a, b, rates = segments[i]
            if base + a * 1e9 >= x:
                break
            left = np.where(rates > 0, np.maximum(left - rates * ((base + b * 1e9 - (base + a * 1e9)) / 1e9), 0.0),
                            left)
            i += 1
        self._done = (self.sched, i, left, x)
        if i < len(segments):
            a, b, rates = segments[i]
            ta = base + a * 1e9
            if ta < x:
                dt = ((x if not math.isfinite(b) else min(base + b * 1e9, x)) - ta) / 1e9
                left = np.where(rates > 0, np.maximum(left - rates * dt, 0.0), left)
        size = self.iters[self.k][1]
        return np.where(left <= 1e-9 * np.maximum(size, 1.0), 0.0, left)

    def advance(self, until: int) -> None:
        """Integrate every rank up to `until` (<= now: every fabric change by then is known)."""
        while self.k < self.k_total and self.t < until:
            resume = self.t_k + self.latency_ns
            if self.t < resume:
                self.t = min(resume, until)
                continue
            key = self.links.state(self.t)
            if self.sched is None or self.sched[0] != key:
                self.sched = (key, self.t, *self._fluid(key), )
            _, base, segments, _, after = self.sched
            nxt = self.links.next_change(self.t)
            stop = until if nxt is None else min(until, nxt)
            finish = None
            if not (after > 0).any():
                finish = base + int(math.ceil(segments[-1][1] * 1e9)) if segments else self.t
                stop = min(stop, finish)
            ends = (base + int(round(b * 1e9)) for _, b, _ in segments if math.isfinite(b))
            bounds = sorted({x for x in ends if self.t < x < stop} | {stop})
            for x in bounds:
                left = self._left_at(x)
                self.flow_end[(left <= 0) & (self.flow_end < 0)] = x
                self.left, self.t = left, x
                self._count(self.iters[self.k][1] - left, x)
            if finish is not None and self.t >= finish:
                self.flow_end[self.flow_end < 0] = finish
                self._end_transfer(finish)

    def _count(self, moved: np.ndarray, t: int) -> None:
        for r, (s, rv) in self._rank_bytes(moved).items():
            s0, r0 = self.done[r]
            self.checkpoints[r].append((t, s0 + s, r0 + rv))
            self.checkpoint_ns[r].append(t)

    def _end_transfer(self, t: int) -> None:
        pairs, size = self.iters[self.k]
        per = self._rank_bytes(size)
        for r, i in self.pos.items():
            mine = (pairs[:, 0] == i) | (pairs[:, 1] == i)
            end = int(self.flow_end[mine].max()) if mine.any() else self.t_k + self.latency_ns
            self.ends[r].append((self.t_k, end))
            s0, r0 = self.done[r]
            self.done[r] = (s0 + per[r][0], r0 + per[r][1])
        self.k += 1
        if self.k < self.k_total:
            self._begin(t)

    def projected_finish_ns(self) -> int:
        if self.k >= self.k_total:
            return self.t
        if self.sched is not None and self.sched[2] and math.isfinite(self.sched[2][-1][1]):
            return self.sched[1] + int(self.sched[2][-1][1] * 1e9) + 1
        return self.t + 1_000_000


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
        with self.coll.links.lock:
            self.coll.advance(until_ns)

    def projected_finish_ns(self) -> int:
        with self.coll.links.lock:
            return self.coll.projected_finish_ns()

    def intervals(self) -> list[tuple[int, int]]:
        with self.coll.links.lock:
            return list(self.coll.ends[self.rank])

    def delivered(self, t_ns: int) -> tuple[float, float]:
        with self.coll.links.lock:
            cps = self.coll.checkpoints[self.rank]
            i = bisect.bisect_right(self.coll.checkpoint_ns[self.rank], t_ns)
            if i == 0:
                return 0.0, 0.0
            if i == len(cps):
                return cps[-1][1], cps[-1][2]
            (t0, s0, r0), (t1, s1, r1) = cps[i - 1], cps[i]
        w = (t_ns - t0) / (t1 - t0) if t1 > t0 else 1.0
        return s0 + w * (s1 - s0), r0 + w * (r1 - r0)


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
