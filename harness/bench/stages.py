"""Pure: what a cycle's observations mean, and the stage events they become.

Every host observation is an interval: a polled change happened within (host_ns - interval_ns, host_ns],
converted to the harness clock with the host's clock bound. A port's stages happen in a fixed order after
the command (analysis.stages.PORT_CHAIN), so each stage's true time also lies after the command, after every
earlier stage's lower bound and after the last poll that showed it not yet reached, and before every later
stage's upper bound. Intersecting these keeps every bound true and makes it tighter; a stage passed between
two polls (never seen) still gets an event, spanning the interval in which it must have happened.
"""
from __future__ import annotations

import functools
from dataclasses import dataclass, field
from typing import Callable, NamedTuple

from analysis.stages import PORT_CHAIN, STAGES, WATCH_STAGES
from harness.events import Event

GRANULARITY_NS = 1_000  # reading granularity of a host timestamp
# Watch values that show a chain stage not reached yet: the stage happens after that poll.
_NOT_YET = {("rx_los", "1"): "light_detected", ("rx_lol", "1"): "cdr_locked", ("carrier", "0"): "phy_up"}


def not_yet(field: str, value: str) -> str | None:
    """The chain stage a watch value shows not reached yet (any port state but ACTIVE: port_active)."""
    if field == "state":
        return "port_active" if value != "ACTIVE" else None
    return _NOT_YET.get((field, value))


# Module flags the agent reads with `ethtool -m`, which prints the *latched* flag bytes (SFF-8636's `*_AW_OFFSET`,
# CMIS' latched lane flags: set when the condition asserts, cleared on read). A poll's "1" then says the condition
# held at some time since the poll before, not that it still holds; a "0" right after it says it ended between
# the poll before that "1" and this one — an interval longer than the "0"'s own (`own_bound`).
LATCHED_FIELDS = frozenset({"rx_los", "rx_lol"})

# The watch fields a stage or a "not yet" is read from; a watch line of any other (operstate, phys_state) marks
# nothing here and is kept for the record only (observations.jsonl).
STAGE_FIELDS = frozenset({f for f, _ in WATCH_STAGES} | {f for f, _ in _NOT_YET} | {"state"})

# (host, host_ns) -> (t_ns, offset_ns, uncertainty_ns) on the harness clock.
Convert = Callable[[str, int], tuple[int, int, int]]


@dataclass(frozen=True)
class PortRef:
    key: str
    host: str
    netdev: str
    device: str
    ocs_port: int
    ocs: str = ""  # the switch its fibres land on: its chain starts at that switch's command


@dataclass
class Arrivals:
    """What `ObservationLog.expect` collected for one cycle. kept: (port, stage) -> its first observation;
    not_yet: (port, stage) -> the latest observation showing the stage not reached yet; missing: stages
    never seen nor implied by a later one (the cycle waited them out); lost: stages reached while a host
    was disconnected; flaps: carrier drops after phy_up; causes: (host, fault source); unobserved: port -> the
    watched stages its host's stalled watch did not report (never inferred from a later stage)."""

    kept: dict[tuple[str, str], object] = field(default_factory=dict)
    not_yet: dict[tuple[str, str], object] = field(default_factory=dict)
    missing: dict[str, list[str]] = field(default_factory=dict)
    lost: dict[str, list[str]] = field(default_factory=dict)
    flaps: dict[str, int] = field(default_factory=dict)
    causes: list[tuple[str, str]] = field(default_factory=list)
    done_ns: int = 0
    unobserved: dict[str, list[str]] = field(default_factory=dict)

    def of(self, key: str, chain: tuple[str, ...]) -> tuple[dict[str, object], dict[str, object]]:
        """Port `key`'s kept observations (stage -> observation, in stage order) and its chain's not-yet ones:
        what its events are built from."""
        kept, not_yet = self.kept, self.not_yet
        return ({s: o for s in STAGES if (o := kept.get((key, s))) is not None},
                {s: o for s in chain if (o := not_yet.get((key, s))) is not None})


def interval(obs, convert: Convert) -> tuple[int, int, int]:
    """(lo, hi, offset_ns): the harness-clock interval that holds the observed change."""
    t, offset, clock_unc = convert(obs.host, obs.host_ns - obs.interval_ns // 2)
    unc = clock_unc + (obs.interval_ns + 1) // 2 + GRANULARITY_NS
    return t - unc, t + unc, offset


def _event(run_id: str, cycle: int, stage: str, lo: int, hi: int, *, port: PortRef | None = None, host: str = "",
           device: str = "", offset_ns: int = 0, source: str = "") -> Event:
    t = (lo + hi) // 2
    return Event(run_id, cycle, stage, port.host if port else host, port.device if port else device,
                 port.netdev if port else "", port.ocs_port if port else 0, t, int(offset_ns), hi - t, source)


def source_of(obs) -> str:
    return f"agent-probe:{obs.value.split()[0]}" if obs.kind == "probe" else f"agent-watch:{obs.field}"


_EVENT = Event.unchecked  # for stages taken from STAGES itself: none to check


def own_bound(obs, shown_not_yet, bound: Callable[[object], tuple[int, int, int]]) -> tuple[int, int, int]:
    """The bound of the chain stage `obs` marks, given the latest observation that showed it not reached yet
    (None: none). A latched flag's clearing ("0") polled right after the poll that showed it set ("1") may have
    happened within that "1"'s own interval — the flag latched a short loss, and was already clear when read —
    so its lower bound is that "1"'s; in every other case, `bound(obs)`. "Right after": the "1" is later than
    1.5 of the "0"'s intervals before it (polls ~one interval apart; a poller's reads take time, a host clock
    drifts: never an exact match)."""
    own = bound(obs)
    if shown_not_yet is not None and obs.kind == "watch" and obs.field in LATCHED_FIELDS and \
            shown_not_yet.host_ns > obs.host_ns - obs.interval_ns * 3 // 2:
        return min(own[0], bound(shown_not_yet)[0]), own[1], own[2]
    return own


@functools.cache
def _plan(chain: tuple[str, ...]) -> tuple[Callable[..., Event], tuple[str, ...]]:
    """How a chain's events are made (unchecked where its stages are all known) and the kept stages outside
    it that make events, in stage order."""
    return (_EVENT if set(chain) <= set(STAGES) else Event), tuple(s for s in STAGES if s not in chain)


def port_events(run_id: str, cycle: int, port: PortRef, first_sent_ns: int, kept: dict[str, object],
                not_yet: dict[str, object], convert: Convert, chain: tuple[str, ...] = PORT_CHAIN,
                done_ns: int | None = None, bound: Callable[[object], tuple[int, int, int]] | None = None,
                unobserved=()) -> list[Event] | None:
    """One port's events: every kept observation with its chain-tightened bound, and every chain stage
    implied by a later one (passed between two polls). A contradiction is a fault at `done_ns` (None, the
    cycle still running: returns None, the port is built again at its end).

    Each chain stage's bound is the tightest the order allows: lo = max(the command, the lower bounds of this
    and every earlier stage, the last poll that showed it not yet reached), hi = min(the upper bounds of this
    and every later stage); a stage with no later evidence has none, and a seen stage whose bound would
    contradict keeps its own interval; a stage in `unobserved` (its watch had stalled) is never implied. One pass
    each way, no intermediate maps: a cycle's end builds up to
    64 ports (8 x 8) on the path between cycles (benchmarks/bench_port_events.py). `bound(obs)`: its
    `interval` (default: made with `convert`), when the caller has them already."""
    make, others = _plan(chain)
    if bound is None:
        bound = functools.partial(interval, convert=convert)
    key, host, device, netdev, ocs_port = port.key, port.host, port.device, port.netdev, port.ocs_port
    seen, los, lo = {}, [], first_sent_ns
    for stage in chain:  # lower bounds: the command, this and every earlier stage's, the last poll not yet
        obs, early = kept.get(stage), not_yet.get(stage)
        if obs is not None:
            seen[stage] = own = own_bound(obs, early, bound) if early is not None else bound(obs)
            if own[0] > lo:
                lo = own[0]
        if early is not None:
            earliest = bound(early)[0]
            if earliest > lo:
                lo = earliest
        los.append(lo)
    events, hi, later = [], None, None
    for at in range(len(chain) - 1, -1, -1):  # upper bounds: this and every later stage's; events backwards
        stage, lo = chain[at], los[at]
        own = seen.get(stage)
        if own is not None:
            if hi is None or own[1] < hi:
                hi = own[1]
            low, high = (lo, hi) if lo <= hi else own[:2]  # contradicting: a seen stage keeps its own interval
            t = (low + high) // 2
            events.append(make(run_id, cycle, stage, host, device, netdev, ocs_port, t, own[2], high - t,
                               source_of(kept[stage])))
            later = stage
        elif hi is not None and stage not in unobserved:
            if lo <= hi:
                t = (lo + hi) // 2
                events.append(make(run_id, cycle, stage, host, device, netdev, ocs_port, t, seen[later][2],
                                   hi - t, f"between-polls:before {later}"))
            elif done_ns is None:
                return None
            else:
                events.append(_EVENT(run_id, cycle, "fault", host, device, netdev, ocs_port, done_ns, 0, 0,
                                     f"bounds:{key}: {stage} implied, but its bounds contradict"))
    events.reverse()
    for stage in others:  # the side losing light: its own interval, in stage order
        obs = kept.get(stage)
        if obs is not None:
            lo, hi, offset = bound(obs)
            t = (lo + hi) // 2
            events.append(_EVENT(run_id, cycle, stage, host, device, netdev, ocs_port, t, offset, hi - t,
                                 source_of(obs)))
    return events


class CycleEvents:
    """A cycle's port events built while the cycle still waits for its last observations (`prepare`, when
    the log has nothing queued), each port's serialised with them (`encode`), so that the cycle's end
    builds only the ports whose observations (`version`) or host clock (`generation`: samples added) changed
    since: the same events `stage_events` builds from scratch, with every clock sample up to the end.
    `sent_by_ocs`: on a cycle that commands several switches, each one's send — a port's chain starts at its own
    switch's (`PortRef.ocs`); else at `first_sent_ns`."""

    def __init__(self, run_id: str, cycle: int, ports: dict[str, PortRef], first_sent_ns: int, convert: Convert,
                 chain: tuple[str, ...] = PORT_CHAIN, generation: Callable[[str], int] = lambda host: 0,
                 encode: Callable[[Event], object] | None = None, sent_by_ocs: dict[str, int] | None = None):
        self.run_id, self.cycle, self.ports, self.first_sent = run_id, cycle, ports, first_sent_ns
        self.sent_by_ocs = sent_by_ocs or {}
        self.convert, self.chain, self.generation, self.encode = convert, chain, generation, encode
        self._built: dict[str, tuple[tuple[int, int], list[Event], list]] = {}  # key -> (version, events, encoded)
        self._partial: dict[str, tuple] = {}  # key -> a port's events without its chain's last stage (`partial`)
        self.unobserved: dict[str, list[str]] = {}  # Arrivals.unobserved: stages a stalled watch did not report
        self.rebuilt = 0  # ports built at the cycle's end (the rest were ready): what a test can check
        self.completed = 0  # ports whose final stage was added to their `partial` events (`_complete`)
        # (host, host_ns, interval_ns) -> (the host clock's generation, the interval): what `interval` reads of
        # an observation, so the lines of one poll (a host's batch: 8 ports x 4 fields, ~5 distinct times)
        # share one conversion
        self._bounds: dict[tuple[str, int, int], tuple[int, tuple[int, int, int]]] = {}

    def bound(self, obs, generation: int | None = None) -> tuple[int, int, int]:
        """`interval(obs, convert)`, remembered for the cycle: the watch bounds each observation it keeps as it
        arrives, and the port's events (built later, often at the cycle's end) reuse that — ~11 a port, each
        a conversion's lookup and arithmetic otherwise. A later clock sample leaves a bound made before it
        true; a step (the host's generation) does not: then it is made again. A `generation` read earlier
        can only be older: then the port is built again (its stamp is stale)."""
        if generation is None:
            generation = self.generation(obs.host)
        key = (obs.host, obs.host_ns, obs.interval_ns)
        known = self._bounds.get(key)
        if known is not None and known[0] == generation:
            return known[1]
        answer = interval(obs, self.convert)
        self._bounds[key] = (generation, answer)
        return answer

    def ready(self, key: str, version: int) -> tuple[list[Event], list] | None:
        """The port's events and encodings if built with `version` and its host's clock generation now."""
        known = self._built.get(key)
        if known is not None and known[0] == (version, self.generation(self.ports[key].host)):
            return known[1], known[2]
        return None

    def port(self, key: str, version: int, kept: dict[str, object], not_yet: dict[str, object],
             done_ns: int | None = None) -> tuple[list[Event], list] | None:
        port = self.ports[key]
        generation = self.generation(port.host)
        stamp = (version, generation)  # read before converting: a step meanwhile makes the stamp stale, never
        known = self._built.get(key)   # the events
        if known is not None and known[0] == stamp:
            return known[1], known[2]
        completed = self._complete(key, generation, kept, not_yet)
        if completed is not None:
            events, encoded = completed
            self._built[key] = (stamp, events, encoded)
            self.completed += 1
            return events, encoded
        cache, again = self._bounds, self.bound

        def bound(obs) -> tuple[int, int, int]:  # `self.bound`, its lookup inline
            known = cache.get((obs.host, obs.host_ns, obs.interval_ns))
            return known[1] if known is not None and known[0] == generation else again(obs, generation)

        events = port_events(self.run_id, self.cycle, port, self.sent_of(port), kept, not_yet, self.convert,
                             self.chain, done_ns, bound, self.unobserved.get(key, ()))
        if events is None:
            return None
        encoded = [self.encode(e) for e in events] if self.encode is not None else []
        self._built[key] = (stamp, events, encoded)
        if done_ns is not None:
            self.rebuilt += 1
        return events, encoded

    def sent_of(self, port: PortRef) -> int:
        """When the command that changes `port` was sent: its switch's."""
        return self.sent_by_ocs.get(port.ocs, self.first_sent)

    def partial(self, key: str, kept: dict[str, object], not_yet: dict[str, object]) -> None:
        """Build now the events of a port that waits only for its chain's last stage (the first probe), every
        earlier chain stage seen: when that stage comes — often in the cycle's last batch of lines — it adds
        its own event, and the others stand unless its upper bound is below one of theirs (`_complete`)."""
        port, final = self.ports[key], self.chain[-1]
        if final in kept or any(stage not in kept for stage in self.chain[:-1]):
            return
        generation = self.generation(port.host)
        bound = functools.partial(self.bound, generation=generation)
        sent = self.sent_of(port)
        events = port_events(self.run_id, self.cycle, port, sent, kept, not_yet, self.convert, self.chain,
                             bound=bound)
        if events is None:
            return
        # the last stage's lower bound but its own (port_events: the command, every earlier stage's, every
        # "not yet" one's)
        floor = max([sent] + [own_bound(kept[s], not_yet.get(s), bound)[0] for s in self.chain[:-1]]
                    + [bound(o)[0] for s, o in not_yet.items() if s in self.chain])
        chain_events = sum(e.stage in self.chain for e in events)
        encoded = [self.encode(e) for e in events] if self.encode is not None else []
        self._partial[key] = (generation, dict(kept), dict(not_yet), floor, events, encoded, chain_events)

    def _complete(self, key: str, generation: int, kept: dict[str, object],
                  not_yet: dict[str, object]) -> tuple[list[Event], list] | None:
        """The port's events from its `partial` ones and its chain's last stage, if only that stage came since
        (the same observations otherwise, the same host clock) and its upper bound tightens no earlier
        stage's: then they are what `port_events` makes (its lower bounds run forward, so the last
        stage's is the only new one). None: build the port whole."""
        known = self._partial.get(key)
        final = self.chain[-1]
        if known is None or known[0] != generation or final not in kept:
            return None
        _, had, had_not_yet, floor, events, encoded, chain_events = known
        if len(kept) != len(had) + 1 or len(not_yet) != len(had_not_yet) or \
                any(had.get(stage) is not obs for stage, obs in kept.items() if stage != final) or \
                any(had_not_yet.get(stage) is not obs for stage, obs in not_yet.items()):
            return None
        obs = kept[final]
        lo, hi, offset = self.bound(obs, generation)
        if any(e.t_ns + e.uncertainty_ns > hi for e in events[:chain_events]):
            return None  # it bounds an earlier stage from above: that one's event changes
        if max(lo, floor) <= hi:  # else its bounds would contradict: it keeps its own (port_events)
            lo = max(lo, floor)
        event = _event(self.run_id, self.cycle, final, lo, hi, port=self.ports[key], offset_ns=offset,
                       source=source_of(obs))
        events = events[:chain_events] + [event] + events[chain_events:]
        if self.encode is None:
            return events, []
        return events, encoded[:chain_events] + [self.encode(event)] + encoded[chain_events:]


class OcsStamps(NamedTuple):
    """How the OCS command's two events were stamped: the true times lie within their t_ns ± these bounds
    (devices.timing.CommandTiming), and each source names its stamp (write, kernel receive, read...)."""

    sent_bound_ns: int = 0
    completed_bound_ns: int = 0
    sent_source: str = "harness"
    completed_source: str = "harness"


class OcsCommand(NamedTuple):
    """One switch's command in a cycle that commands several: its events carry the switch's name."""

    ocs: str
    sent_ns: int
    completed_ns: int | None
    stamps: OcsStamps = OcsStamps()


def stage_events(run_id: str, cycle: int, ports: dict[str, PortRef], ocs: str, first_sent_ns: int,
                 completed_ns: int, arrivals: Arrivals, convert: Convert,
                 chain: tuple[str, ...] = PORT_CHAIN, built: CycleEvents | None = None,
                 versions: dict[str, int] | None = None, ocs_stamps: OcsStamps = OcsStamps(),
                 commands: tuple[OcsCommand, ...] = ()) -> list[Event]:
    """The cycle's events: the OCS command (or `commands`: each switch's), every port's (`port_events`; those
    `built` already while the cycle waited reused where their `versions` and host clocks did not change since),
    and the faults."""
    return list(cycle_events(run_id, cycle, ports, ocs, first_sent_ns, completed_ns, arrivals, convert, chain,
                             built, versions, ocs_stamps, commands)[0])


def ocs_events(run_id: str, cycle: int, ocs: str, first_sent_ns: int, completed_ns: int | None,
               stamps: OcsStamps = OcsStamps()) -> list[Event]:
    """`ocs_command_sent` and (when known) `ocs_command_completed`, with their stamps' bounds."""
    events = [Event(run_id, cycle, "ocs_command_sent", "", ocs, "", 0, first_sent_ns, 0, stamps.sent_bound_ns,
                    stamps.sent_source)]
    if completed_ns is not None:
        events.append(Event(run_id, cycle, "ocs_command_completed", "", ocs, "", 0, completed_ns, 0,
                            stamps.completed_bound_ns, stamps.completed_source))
    return events


def cycle_events(run_id: str, cycle: int, ports: dict[str, PortRef], ocs: str, first_sent_ns: int,
                 completed_ns: int, arrivals: Arrivals, convert: Convert, chain: tuple[str, ...] = PORT_CHAIN,
                 built: CycleEvents | None = None, versions: dict[str, int] | None = None,
                 ocs_stamps: OcsStamps = OcsStamps(), commands: tuple[OcsCommand, ...] = ()
                 ) -> tuple[list[Event], list | None]:
    """`stage_events` and, with `built`, each event's encoding (`built.encode`) in the same order."""
    if built is None:
        built = CycleEvents(run_id, cycle, ports, first_sent_ns, convert, chain,
                            sent_by_ocs={c.ocs: c.sent_ns for c in commands})
    encode = built.encode
    built.unobserved = arrivals.unobserved
    events = [e for c in commands for e in ocs_events(run_id, cycle, c.ocs, c.sent_ns, c.completed_ns, c.stamps)] \
        if commands else ocs_events(run_id, cycle, ocs, first_sent_ns, completed_ns, ocs_stamps)
    encoded = [encode(e) for e in events] if encode is not None else None
    versions = versions or {}
    for key in ports:
        version = versions.get(key, -1)
        # a port built while the cycle waited, unchanged since, is not looked at again (64 ports: ~0.5 ms)
        ready = built.ready(key, version)
        if ready is None:
            mine, not_yet = arrivals.of(key, chain)
            if not mine:
                continue
            ready = built.port(key, version, mine, not_yet, arrivals.done_ns)
        events += ready[0]
        if encoded is not None:
            encoded += ready[1]
    faults = [_event(run_id, cycle, "fault", arrivals.done_ns, arrivals.done_ns, port=ports[key],
                     source=f"timeout:missing {'+'.join(stages)}") for key, stages in arrivals.missing.items()]
    faults += [_event(run_id, cycle, "fault", arrivals.done_ns, arrivals.done_ns, port=ports[key],
                      source=f"host:{ports[key].host}: reached while disconnected: {'+'.join(sorted(stages))}")
               for key, stages in arrivals.lost.items()]
    faults += [_event(run_id, cycle, "fault", arrivals.done_ns, arrivals.done_ns, port=ports[key],
                      source=f"link-flap:{key}: carrier dropped {count}x after phy_up")
               for key, count in arrivals.flaps.items()]
    faults += [_event(run_id, cycle, "fault", arrivals.done_ns, arrivals.done_ns, host=host, source=cause)
               for host, cause in arrivals.causes]
    events += faults
    if encoded is not None:
        encoded += [encode(e) for e in faults]
    return events, encoded
