"""One observation log per run: every host reader feeds it, `expect()` reads it (pytest-embedded's one log).

Each observation is also appended raw — on the host's clock, as the agent printed it — to
`observations.jsonl`, with the clock samples and each cycle's arrivals, so `harness report` can convert the
run again with the final clock fit, and a lab engineer reads first what the hosts said.

`CycleWatch` holds a cycle's rules (which observation marks which stage of which port, stale reports, a
restarted watch's current values after a reconnect, flaps, probes from the old peer); it is fed one
observation at a time and so is unit-tested over scripted observations in milliseconds.
"""
from __future__ import annotations

import collections
import functools
import os
import queue
import threading
import time
from pathlib import Path
from typing import Callable

import orjson

from analysis.stages import PORT_CHAIN, WATCH_STAGES
from devices.timing import Deadline, now_ns
from harness.bench.stages import LATCHED_FIELDS, STAGE_FIELDS, Arrivals, Convert, CycleEvents, interval, not_yet

# Watch values that show a stage reached (a restarted watch prints them as current values).
REACHED = {"light_detected": ("rx_los", "0"), "cdr_locked": ("rx_lol", "0"), "phy_up": ("carrier", "1"),
           "port_active": ("state", "ACTIVE")}


@functools.lru_cache(maxsize=4096)  # a watch line's field and value: a few dozen pairs in practice
def _meaning(field: str, value: str) -> tuple[str | None, str | None]:
    """(the stage a watch line marks, None if none; the chain stage it shows not reached yet, `not_yet`)."""
    return WATCH_STAGES.get((field, value)), not_yet(field, value)


_WATCHED = frozenset(WATCH_STAGES.values())  # the stages a watch line marks (not the first probe)
_OBS = b'{"k":"obs",'  # an observation's line in observations.jsonl starts so, then its own fields
_UNWRITTEN_MAX = 20_000  # batches put before the mirror writes them anyway (an 8 x 8 cycle puts ~80)


class CycleWatch:
    """One cycle's expectations: `wants` port key -> chain stages to see, in `chain` order."""

    def __init__(self, wants: dict[str, set[str]], port_of: dict[tuple[str, str], str], first_sent_ns: int,
                 completed_ns: int | None, convert: Convert, *, peer_mac: dict[str, str] | None = None,
                 reconnected: dict[str, int] | None = None, chain: tuple[str, ...] = PORT_CHAIN,
                 grace_ns: int = 50_000_000, suspect: Callable[[str], None] | None = None,
                 events: CycleEvents | None = None, liveness=None):
        self.need = {k: set(v) for k, v in wants.items()}
        self.wanted = {k: set(v) for k, v in wants.items()}
        self.port_of, self.first_sent, self.completed = port_of, first_sent_ns, completed_ns
        self.convert, self.peer_mac = convert, peer_mac
        self.reconnected = reconnected if reconnected is not None else {}
        self.chain, self.grace_ns = chain, grace_ns
        self.arrivals = Arrivals()
        self.complete_since: int | None = None
        # A line that arrived after the command but converts to before it: a clock step the tracker does not
        # know yet looks like that. `suspect(host)` asks for a clock sample and returns `ready()`; until then
        # that host's lines wait, in order, and are fed again with the sample known (`retry()`); a line
        # that still converts to before the command then happened before it.
        self.suspect = suspect
        # Events of the ports already complete are built while the cycle waits (`prepare`); `version` counts
        # each port's changes of what its events are made of, so the cycle's end rebuilds only those changed.
        self.events = events
        self.version: dict[str, int] = dict.fromkeys(self.need, 0)
        self._finals = {k: max(v, key=chain.index) for k, v in wants.items() if v}
        self._later = {stage: chain[i + 1:] for i, stage in enumerate(chain)}  # `_implied`, per line of a burst
        self._open = {k for k, v in wants.items() if v}  # ports without their final stage (and still needing)
        self._ready: list[str] = []  # ports that have seen everything, their events not built yet
        self._partial: list[str] = []  # ports waiting only for their final stage (CycleEvents.partial)
        self._parked: list = []
        self._held: dict[str, Callable[[], bool]] = {}  # host -> whether its clock sample has landed
        # host -> (host time surely after the command, the host clock's generation it was made with)
        self._host_after: dict[str, tuple[int, int]] = {}
        self._generation = events.generation if events is not None else (lambda host: 0)
        # The hosts' watches' liveness (harness.bench.hosts.HostGroup: `heard(host)`, when its watch last printed a
        # line or heartbeat; `silence(host, since, now)`; `liveness_ns`, 0: not judged). A watch silent that long
        # during the cycle has stalled. A host whose port's last watched stage is still unseen once the cycle is
        # otherwise settled must be heard from since, or be judged stalled: a later stage (the first probe) would
        # imply that stage, as if watched.
        self.liveness = liveness
        self.liveness_ns = getattr(liveness, "liveness_ns", 0)
        self._last_watched = {k: last for k, v in wants.items()
                              if (last := max((s for s in v if s in _WATCHED), key=chain.index, default=None))}
        self._host_of = {key: host for (host, _), key in port_of.items()}
        self._hosts = {self._host_of[k] for k in wants if k in self._host_of}
        self.stalled: dict[str, int] = {}  # host -> its watch's silence (ns) when judged stalled in this cycle
        self._look_ns: int | None = None  # when to judge a watch again (its deadline), while waiting on it

    # ---- rules
    def _final(self, key: str) -> str:
        return self._finals[key]

    def _settle_port(self, key: str) -> None:
        """Whether `key` still keeps the cycle from being complete (kept up per change, not per check), and
        whether its events can be built now: nothing left to see, so no later line can change them."""
        if not self.need[key] or (key, self._finals[key]) in self.arrivals.kept:
            self._open.discard(key)
        if self.events is not None:
            if not self.need[key]:
                self._ready.append(key)
            elif self.need[key] == {self._finals[key]} and self._finals[key] == self.chain[-1]:
                self._partial.append(key)

    def _implied(self, key: str, stage: str) -> bool:
        kept = self.arrivals.kept
        for later in self._later[stage]:
            if (key, later) in kept:
                return True
        return False

    def _lose(self, key: str, stages) -> None:
        for stage in stages:
            if stage in self.need.get(key, ()):
                self.need[key].discard(stage)
                self.arrivals.lost.setdefault(key, []).append(stage)
                self._settle_port(key)

    def fault(self, obs, cause: str | None) -> None:
        """A host's stream ended (the caller reconnected it; `cause` is None for a stale report of a drop
        already handled). A restarted probe receiver only reports a *new* first probe."""
        if not cause:
            return
        self.arrivals.causes.append((obs.host, cause))
        for (host, _), key in self.port_of.items():
            if host == obs.host and (key, "port_active") in self.arrivals.kept:
                self._lose(key, ["first_packet"])

    def feed(self, obs) -> None:
        if self._held and obs.host in self._held:
            self._parked.append(obs)  # a host's lines count in the order they came
            self.retry()
            return
        self._feed(obs)

    def _feed(self, obs, released: bool = False) -> None:
        # Run per host line of a cycle's burst, on the step's thread that the cycle's end waits for: what a line
        # marks is one cached lookup (`_meaning`; a probe's "first" marks its first packet), its checks inline.
        key = self.port_of.get((obs.host, obs.netdev))
        need = self.need.get(key) if key is not None else None
        if need is None:
            return
        kind = obs.kind
        if kind == "watch" and obs.interval_ns == 0:
            # A (re)started watch prints current values. After a reconnect during this cycle, a stage already
            # reached — once the mirrors settled, so the old light is gone — happened while nobody looked.
            if self.reconnected.get(obs.host, 0) < self.first_sent:
                return
            if self.completed is None:  # the switch's reply is still to come: the host's lines wait for it, in order
                self._held[obs.host] = lambda: self.completed is not None
                self._parked.append(obs)
                return
            if self.convert(obs.host, obs.host_ns)[0] > self.completed:
                for gone, marker in REACHED.items():
                    if (obs.field, obs.value) == marker and gone in need:
                        self._lose(key, [gone] + (["first_packet"] if gone == "port_active" else []))
            return
        stage, gated = _meaning(obs.field, obs.value) if kind == "watch" else \
            ("first_packet" if obs.field == "first" else None, None)
        # Unless the change is surely after the command by its host time alone (`_mark_after`), convert it to the
        # harness clock (a line's costly part) and check it is not stale: the exact check would decide the same.
        mark = self._host_after.get(obs.host)
        events = self.events
        bounded = False  # `events.bound(obs)` made in this call: the port's events reuse it, asked once
        if mark is None or obs.host_ns - obs.interval_ns < mark[0] or mark[1] != self._generation(obs.host):
            if events is None:
                lo, hi, offset = interval(obs, self.convert)
            else:
                lo, hi, offset = events.bound(obs)
                bounded = True
            if hi < self.first_sent:  # happened before this cycle's command — or the host's clock stepped
                if obs.recv_ns >= self.first_sent and self.suspect is not None and not released:
                    self._held[obs.host] = self.suspect(obs.host)
                    self._parked.append(obs)
                return
            self._mark_after(obs.host, (lo + hi) // 2, offset)
        kept = self.arrivals.kept
        # A latched flag's "1" counts even where a later stage already implies the one it gates: it says when the
        # flag was set, which bounds its clearing — the "0" that follows — from below (stages.own_bound).
        if gated is not None and gated in need and (obs.field in LATCHED_FIELDS or not self._implied(key, gated)):
            self.arrivals.not_yet[(key, gated)] = obs
            self.version[key] += 1
            if events is not None and not bounded:
                events.bound(obs)  # what the port's events are made of is bounded now, not at the cycle's end
                bounded = True
        if stage is None:
            return
        if stage == "port_down" and (key, "phy_up") in kept:
            self.arrivals.flaps[key] = self.arrivals.flaps.get(key, 0) + 1  # carrier lost with the light on
        if (key, stage) in kept:
            return
        if stage == "first_packet" and self.peer_mac is not None and \
                obs.value.split()[0].lower() != self.peer_mac.get(key):
            return  # a probe from the old peer (its flow resumed), not through the new circuit
        if stage in self.wanted[key] or stage not in self.chain:
            kept[(key, stage)] = obs
            need.discard(stage)
            self.version[key] += 1
            if events is not None and not bounded:
                events.bound(obs)
            self._settle_port(key)

    def _mark_after(self, host: str, t_ns: int, offset_ns: int) -> None:
        """From a line converted at harness time `t_ns` with `offset_ns` (host minus harness): the host time from
        which a change converts to after the command. The host's model offset moves by at most the drift
        bound (200 ppm) per unit of time and by less than its uncertainty per new sample; 1 ms plus twice
        the drift over |t - command| covers both (a step changes the generation: converted again)."""
        if host not in self._host_after or self._host_after[host][1] != self._generation(host):
            margin = 1_000_000 + abs(t_ns - self.first_sent) * 4 // 10_000
            self._host_after[host] = (self.first_sent + offset_ns + margin, self._generation(host))

    def command_completed(self, completed_ns: int) -> None:
        """The OCS command's reply came (the watch was made while it was awaited): lines that needed it go on."""
        self.completed = completed_ns
        self.retry()

    def retry(self) -> None:
        """Feed the waiting lines of every host whose clock sample has landed, in order."""
        if not self._held:
            return
        for host in [h for h, ready in self._held.items() if ready()]:
            del self._held[host]
            mine = [p for p in self._parked if p.host == host]
            self._parked = [p for p in self._parked if p.host != host]
            for obs in mine:
                self._feed(obs, released=True)

    def prepare(self) -> bool:
        """Build the events of one port that has seen all it waits for, or else those of one that waits only
        for its final stage, the first probe (`CycleEvents.partial`: that stage then adds its own event). The
        log calls this while nothing is queued. Returns whether it did something. A port still waiting for
        a stage (or one passed between polls) is built at the cycle's end."""
        if self._ready:
            key = self._ready.pop()
            build = functools.partial(self.events.port, key, self.version[key])
        elif self._partial:
            key = self._partial.pop()
            if self.need[key] != {self._finals[key]}:
                return True  # its final stage came meanwhile
            build = functools.partial(self.events.partial, key)
        else:
            return False
        build(*self.arrivals.of(key, self.chain))
        return True

    # ---- progress
    def complete(self) -> bool:
        """Every port has its final stage (the rest is implied) or nothing left to see."""
        return not self._open

    def settled(self, now: int) -> bool:
        """Complete, and either everything seen or the grace for late polled reports has passed — and then every
        host whose port's last watched stage is unseen heard from since (its watch live: nothing was missed),
        or judged stalled (`_stall`)."""
        if not self.complete():
            self.complete_since = None
            return False
        if self.complete_since is None:
            self.complete_since = now
        if any(self.need.values()) and now - self.complete_since < self.grace_ns:
            return False
        return self._watches_judged(now, self.complete_since)

    def _unheard_hosts(self) -> set[str]:
        """Hosts with a port whose last watched stage is still needed (a later stage may stand in for it)."""
        need = self.need
        return {self._host_of[k] for k, last in self._last_watched.items() if last in need[k]} - self.stalled.keys()

    def _watches_judged(self, now: int, since: int | None, mark: bool = True) -> bool:
        """Each host's watch judged: silent past its deadline during the cycle (then stalled), or live — and a
        host with a port's last watched stage unseen heard from after `since` (None: not asked). False while
        one may still speak (`_look_ns`: when its deadline passes)."""
        self._look_ns = None
        if not self.liveness_ns:
            return True
        unheard = self._unheard_hosts() if since is not None else ()
        for host in self._hosts - self.stalled.keys():
            silence = self.liveness.silence(host, self.first_sent, now)
            if silence >= self.liveness_ns:
                self._stall(host, silence, mark)
            elif host in unheard and (heard := self.liveness.heard(host)) < since:
                look = max(heard, self.first_sent) + self.liveness_ns
                self._look_ns = look if self._look_ns is None else min(self._look_ns, look)
        return self._look_ns is None

    def _stall(self, host: str, silence_ns: int, mark: bool = True) -> None:
        """`host`'s watch gave no line or heartbeat within its deadline: the cycle is faulted, and (`mark`) its
        ports' watched stages not reported are unobserved in this cycle (no event, never implied by a later stage)."""
        self.stalled[host] = silence_ns
        ports = 0
        for key, last in self._last_watched.items():
            if self._host_of[key] != host or not mark:
                continue
            kept = [i for i, s in enumerate(self.chain) if s in _WATCHED and (key, s) in self.arrivals.kept]
            # after the last stage it did report: those before it are bounded by that one (between polls)
            gone = [s for s in self.chain[max(kept, default=-1) + 1:] if s in _WATCHED and s in self.need[key]]
            if not gone:
                continue
            ports += 1
            self.need[key].difference_update(gone)
            self.arrivals.unobserved[key] = gone
            if self.events is not None:
                self.events.unobserved = self.arrivals.unobserved
            self.version[key] += 1
            self._settle_port(key)
        self.arrivals.causes.append((host, f"watch-stall:{host}: no line or heartbeat for {silence_ns / 1e6:.0f} ms "
                                           f"(deadline {self.liveness_ns / 1e6:.0f} ms)"
                                           + (f"; unreported stages of {ports} port(s) unobserved" if mark else "")))

    def look_ns(self) -> int | None:
        """When the wait should look again without a line: the grace's end, or a watch's liveness deadline."""
        if self.complete_since is None:
            return None
        return self._look_ns if self._look_ns is not None else self.complete_since + self.grace_ns

    def describe(self) -> str:
        """What arrived and what is still missing, per port (for a timeout's message)."""
        parts = []
        for key, need in self.need.items():
            if need:
                seen = [s for s in self.chain if (key, s) in self.arrivals.kept]
                parts.append(f"{key}: saw {', '.join(seen) or 'nothing'}; missing {', '.join(sorted(need))}")
        return "; ".join(parts)

    def result(self, done_ns: int) -> Arrivals:
        if not self.complete():  # timed out: was a watch silent meanwhile? (its stages stay missing: the timeout's)
            self._watches_judged(done_ns, None, mark=False)
        a = self.arrivals
        missing = {k: sorted(s for s in need if not self._implied(k, s)) for k, need in self.need.items() if need}
        a.missing = {k: v for k, v in missing.items() if v}
        a.done_ns = done_ns
        return a


def observation_log(ctx) -> "ObservationLog":
    """The run's one observation log (`observations.jsonl` in the run directory), closed with the run."""
    if ctx.observations is None:
        ctx.observations = ObservationLog(None if ctx.dry_run else ctx.run_dir / "observations.jsonl")
        ctx.stack.callback(ctx.observations.close)
    return ctx.observations


class ObservationLog:
    """The run's one queue of host observations (HostSession readers call `put`), mirrored raw to
    `observations.jsonl` (None: memory only)."""

    def __init__(self, path: Path | None = None):
        self.path = path
        # Batches of observations (those that arrived together): one wake-up of the step's thread per batch.
        self._queue = queue.SimpleQueue()  # C: ~0.2 µs a put or get (queue.Queue's Python locks: ~3 µs)
        self._backlog: collections.deque = collections.deque()  # taken from the queue, not yet read
        self._lock = threading.Lock()
        self._file = open(path, "ab") if path is not None else None
        # Batches not yet mirrored: serialising them was a third of the SSH hub's work per line in a cycle's
        # burst, which the cycle's end waits for. `flush` mirrors them, once the next command is out; not a
        # record written meanwhile (a clock sample may come in the burst), which may so precede older lines.
        self._unwritten: collections.deque = collections.deque()
        # kind -> who reads observations of that kind instead of the queue (a stream read over a whole step, as
        # the GPU view's: mirrored with the rest, but no wake-up of a cycle's wait and nothing for it to drop)
        self._taps: dict[str, Callable[[list], None]] = {}

    def _write(self, record: dict) -> None:
        if self._file is not None:
            # orjson: a cycle's record holds every kept observation; json.dumps took ~2 ms of the cycle
            line = orjson.dumps(record, option=orjson.OPT_SERIALIZE_NUMPY) + b"\n"
            with self._lock:  # the lines put before it are mirrored at the next flush (readers key by "k")
                self._file.write(line)

    def put(self, obs) -> None:
        self.put_many([obs])

    def put_many(self, batch: list) -> None:
        """Observations that arrived together: mirrored raw at the next `flush`, queued as one item — but for watch
        lines of a field that marks no stage (STAGE_FIELDS), which only the mirror keeps: a third of a
        cycle's watch lines, each a wake-up's share and a `feed` on the step's thread in the cycle's burst."""
        if self._file is not None:
            self._unwritten.append(batch)  # a deque: appended here, taken by `_mirror` without a lock
            if len(self._unwritten) > _UNWRITTEN_MAX:  # no step flushing (lines between steps): bounded here
                self.flush()
        if self._taps and batch and (tap := self._taps.get(batch[0].kind)) is not None:  # a stream: one kind
            tap(batch)
            return
        read = [obs for obs in batch if obs.kind != "watch" or obs.field in STAGE_FIELDS]
        if read:
            self._queue.put(read)

    def tap(self, kind: str, sink: Callable[[list], None] | None) -> None:
        """Hand every batch of observations of `kind` to `sink` (called on the reader's thread) instead of the
        queue; None: stop. They are mirrored all the same."""
        if sink is None:
            self._taps.pop(kind, None)
        else:
            self._taps[kind] = sink

    def clock_sample(self, host: str, sample) -> None:
        self._write({"k": "clock", "host": host, **vars(sample)})

    def cycle(self, cycle: int, first_sent_ns: int, completed_ns: int, ocs: str, ports: dict, arrivals, *,
              cpu_ns: int | None = None, step_cpu_ns: int | None = None, ocs_stamps: tuple = (),
              commands: tuple = ()) -> None:
        """A cycle's inputs of `stage_events` (`commands`: each switch's, when it commanded several), so a report
        can convert them again; the harness's CPU when it ended (default: now)."""
        self._write({"k": "cycle", "cycle": cycle, "first_sent_ns": first_sent_ns, "completed_ns": completed_ns,
                     "ocs_stamps": list(ocs_stamps),
                     **({"commands": [[c.ocs, c.sent_ns, c.completed_ns, list(c.stamps)] for c in commands]}
                        if commands else {}),
                     # dataclasses as they are: orjson writes their fields (no dict copied per observation)
                     "ocs": ocs, "ports": ports,
                     "kept": [[k, s, o] for (k, s), o in arrivals.kept.items()],
                     "not_yet": [[k, s, o] for (k, s), o in arrivals.not_yet.items()],
                     "missing": arrivals.missing, "lost": arrivals.lost, "flaps": arrivals.flaps,
                     "causes": arrivals.causes, "done_ns": arrivals.done_ns,
                     **({"unobserved": arrivals.unobserved} if arrivals.unobserved else {}),
                     # the harness's CPU so far (every thread, and the thread running the step): per-cycle
                     # overhead that a loaded machine does not inflate
                     "cpu_ns": time.process_time_ns() if cpu_ns is None else cpu_ns,
                     "step_cpu_ns": time.thread_time_ns() if step_cpu_ns is None else step_cpu_ns})

    def _mirror(self) -> None:
        """Write the observations put so far (under `_lock`), each batch in one write."""
        unwritten, write, dumps = self._unwritten, self._file.write, orjson.dumps
        while unwritten:
            # orjson serialises the flat dataclass itself (no dict built per observation); each line is `{"k":"obs",`
            # then the observation's own fields, so the prefix joins a batch's lines (one copy a batch)
            if batch := unwritten.popleft():
                write(_OBS + _OBS.join([dumps(obs, option=orjson.OPT_APPEND_NEWLINE)[1:] for obs in batch]))

    def flush(self) -> None:
        """Mirror the observations put so far and hand the log to the OS (it survives the process). The step
        calls this once a cycle's next command is out, not between its cycles: events.jsonl, fsynced per
        cycle, is the record of truth; a run killed before then loses this raw copy of the cycle's lines."""
        if self._file is not None:
            with self._lock:
                self._mirror()
                self._file.flush()

    def close(self) -> None:
        if self._file is not None:
            with self._lock:
                self._mirror()
                self._file.flush()
                os.fsync(self._file.fileno())
                self._file.close()
                self._file = None

    def wake(self) -> None:
        """Wake the reader of `get` with nothing to read (what it waits for besides lines has come)."""
        self._queue.put(())

    def get(self, timeout: float | None):
        """The next observation; None if none arrives within `timeout` (0: only one already queued), or on a
        `wake`."""
        if not self._backlog:
            try:
                batch = self._queue.get_nowait() if timeout == 0 else self._queue.get(timeout=timeout)
            except queue.Empty:
                return None
            if not batch:
                return None
            self._backlog.extend(batch)
        return self._backlog.popleft()

    def drain(self, on_fault: Callable, seen: Callable | None = None) -> list[tuple[str, str]]:
        """Drop what arrived between cycles (each observation but a fault shown to `seen` first); a host that
        dropped meanwhile is handled by `on_fault` (returns the cause to label the next cycle with)."""
        causes = []
        while self._backlog or not self._queue.empty():
            obs = self.get(0)
            if obs is None:
                continue
            if obs.kind == "fault":
                if cause := on_fault(obs):
                    causes.append((obs.host, cause))
            elif seen is not None:
                seen(obs)
        return causes

    def expect(self, watch: CycleWatch, deadline: Deadline, on_fault: Callable, command=None) -> Arrivals:
        """Feed `watch` until it has settled or the deadline passes; returns what arrived, what is missing
        and why. `on_fault(obs) -> cause | None` reconnects a dropped host (and may raise BenchBroken).
        `command`: the cycle's OCS command while its reply is awaited elsewhere (a Future of its
        harness.bench.circuits.Applied, that `wake`s this log when it ends): the host lines are fed meanwhile,
        and the cycle settles only once it has ended; its failure ends the wait at once."""
        backlog, feed = self._backlog, watch.feed
        while not (watch.completed is not None and watch.complete() and watch.settled(now_ns())):
            if backlog:
                # the rest of a batch already taken (a host's poll: up to a line per port and field): the
                # deadline and the held hosts are looked at once a batch — per line they were a third of a
                # line's cost in a cycle's burst, when the step's thread is the one behind
                obs = backlog.popleft()
            else:
                if watch.completed is None and command is not None and command.done():  # looked at per batch
                    if command.exception() is not None:
                        break
                    watch.command_completed(command.result().timing.completed_ns)
                    continue
                if deadline.expired():
                    break
                obs = self.get(0)
                if obs is None:
                    if watch.prepare():  # nothing queued: build a complete port's events now, not at the end
                        continue
                    wait = min(0.5, deadline.remaining() or 0.5)
                    look = watch.look_ns()
                    if look is not None:
                        wait = min(wait, max(0.0, (look - now_ns()) / 1e9))
                    obs = self.get(wait)
                watch.retry()
                if obs is None:
                    continue
            if obs.kind == "fault":
                watch.fault(obs, on_fault(obs))
            else:
                feed(obs)
        return watch.result(now_ns())
