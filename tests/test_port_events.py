"""A port's events (`port_events`, `CycleEvents.port`) equal those of the algorithm they replaced, kept here as
the oracle: random kept and not-yet observations, poll intervals and clock conversions, contradictions included.
The hand-made cases (tests/test_bench_runtime.py) pin the oracle's bounds; this pins the fast build to it."""
from __future__ import annotations

import math

import orjson
from hypothesis import given, settings, strategies as st

from analysis.stages import PORT_CHAIN, STAGES
from harness.bench.stages import CycleEvents, PortRef, port_events
from harness.eventlog import encode
from harness.events import Event
from harness.bench.hosts import Observation

PORT = PortRef("h1:eth0", "h1", "eth0", "mlx5_0", 9)
# watch values and the stage each marks; the probe's first packet marks first_packet
MARKS = {"light_detected": ("rx_los", "0"), "cdr_locked": ("rx_lol", "0"), "phy_up": ("carrier", "1"),
         "port_active": ("state", "ACTIVE"), "light_lost": ("rx_los", "1"), "port_down": ("carrier", "0")}
NOT_YET = {"light_detected": ("rx_los", "1"), "cdr_locked": ("rx_lol", "1"), "phy_up": ("carrier", "0"),
           "port_active": ("state", "POLLING")}


# ---------------------------------------------------------------- the oracle: the build before it was made fast
def oracle_interval(obs, convert):
    t, offset, clock_unc = convert(obs.host, obs.host_ns - obs.interval_ns // 2)
    unc = clock_unc + (obs.interval_ns + 1) // 2 + 1_000
    return t - unc, t + unc, offset


def oracle_chain_bounds(after_ns, seen, not_before, chain=PORT_CHAIN):
    lo, out = after_ns, {}
    los = {}
    for stage in chain:
        if stage in seen:
            lo = max(lo, seen[stage][0])
        if stage in not_before:
            lo = max(lo, not_before[stage])
        los[stage] = lo
    hi = math.inf
    for stage in reversed(chain):
        if stage in seen:
            hi = min(hi, seen[stage][1])
        if hi == math.inf:
            continue
        bound = (los[stage], int(hi))
        if bound[0] > bound[1]:
            if stage not in seen:
                continue
            bound = seen[stage]
        out[stage] = bound
    return out


def oracle_event(run_id, cycle, stage, lo, hi, port, offset_ns=0, source=""):
    t = (lo + hi) // 2
    return Event(run_id, cycle, stage, port.host, port.device, port.netdev, port.ocs_port, t, int(offset_ns), hi - t,
                 source)


def oracle_source(obs):
    return f"agent-probe:{obs.value.split()[0]}" if obs.kind == "probe" else f"agent-watch:{obs.field}"


def oracle_port_events(run_id, cycle, port, first_sent_ns, kept, not_yet, convert, chain=PORT_CHAIN, done_ns=None):
    events = []
    raw = {stage: oracle_interval(obs, convert) for stage, obs in kept.items()}
    not_before = {stage: oracle_interval(obs, convert)[0] for stage, obs in not_yet.items()}
    for stage in chain:  # a latched module flag cleared at the poll right after the one that showed it set: it may
        obs, early = kept.get(stage), not_yet.get(stage)  # have cleared within that poll's interval
        if obs is not None and early is not None and obs.field in ("rx_los", "rx_lol") and \
                early.host_ns > obs.host_ns - 1.5 * obs.interval_ns:
            raw[stage] = (min(raw[stage][0], not_before[stage]),) + raw[stage][1:]
    bounds = oracle_chain_bounds(first_sent_ns, {s: raw[s][:2] for s in chain if s in raw}, not_before, chain)
    for stage in chain:
        if stage in kept:
            lo, hi = bounds.get(stage, raw[stage][:2])
            events.append(oracle_event(run_id, cycle, stage, lo, hi, port, raw[stage][2], oracle_source(kept[stage])))
        elif stage in bounds:
            later = next(s for s in chain[chain.index(stage) + 1:] if s in kept)
            lo, hi = bounds[stage]
            events.append(oracle_event(run_id, cycle, stage, lo, hi, port, raw[later][2],
                                       f"between-polls:before {later}"))
        elif any(s in kept for s in chain[chain.index(stage) + 1:]):
            if done_ns is None:
                return None
            events.append(oracle_event(run_id, cycle, "fault", done_ns, done_ns, port,
                                       source=f"bounds:{port.key}: {stage} implied, but its bounds contradict"))
    for stage in STAGES:
        if stage in kept and stage not in chain:
            lo, hi, offset = raw[stage]
            events.append(oracle_event(run_id, cycle, stage, lo, hi, port, offset, oracle_source(kept[stage])))
    return events


def oracle_encode(event):
    return event.to_dict(), orjson.dumps(event, option=orjson.OPT_SERIALIZE_NUMPY) + b"\n"


# ---------------------------------------------------------------- random ports, every observation near the others
def _observation(stage: str, shown_not_yet: bool, host_ns: int, interval_ns: int) -> Observation:
    if stage == "first_packet":
        return Observation("probe", PORT.host, PORT.netdev, "first", "02:00:00:00:00:01 3", host_ns, interval_ns, 0)
    field, value = (NOT_YET if shown_not_yet else MARKS)[stage]
    return Observation("watch", PORT.host, PORT.netdev, field, value, host_ns, interval_ns, 0)


# host times within 1.2 ms of each other with poll intervals up to 0.6 ms: orders contradict often; and on a grid
# with the clock's offsets and bounds, so that bounds also meet exactly
TIMES = st.tuples(st.integers(0, 24).map(lambda k: k * 50_000), st.sampled_from([0, 200_000, 600_000, 1]))
MODELS = st.tuples(st.integers(-6, 6).map(lambda k: k * 50_000), st.sampled_from([49_000, 99_000, 0, 123_457]))


@st.composite
def ports(draw):
    chain = draw(st.sampled_from([PORT_CHAIN, PORT_CHAIN[:-1]]))
    kept = {s: _observation(s, False, *draw(TIMES))
            for s in draw(st.sets(st.sampled_from(PORT_CHAIN + ("light_lost", "port_down"))))}
    not_yet = {s: _observation(s, True, *draw(TIMES)) for s in draw(st.sets(st.sampled_from(chain[:4])))}
    # the host clock's model, per host time one of a few (it moves between samples): its offset and bound
    models = draw(st.lists(MODELS, min_size=1, max_size=4))

    def convert(host: str, host_ns: int) -> tuple[int, int, int]:
        offset, unc = models[host_ns % len(models)]
        return host_ns - offset, offset, unc

    first_sent = draw(st.integers(-10, 30).map(lambda k: k * 50_000))
    done_ns = draw(st.one_of(st.none(), st.integers(2_000_000, 9_000_000)))
    return chain, kept, not_yet, convert, first_sent, done_ns


def test_port_events_equal_the_oracles_on_random_ports():
    """Also checks the strategy is worth its examples: contradictions (faults, or None while the cycle runs),
    stages passed between polls, among them some whose bounds just meet (no width) and the losing side all occur."""
    branches = set()

    @settings(max_examples=400)
    @given(ports())
    def check(port):
        chain, kept, not_yet, convert, first_sent, done_ns = port
        want = oracle_port_events("r", 4, PORT, first_sent, kept, not_yet, convert, chain, done_ns)
        assert port_events("r", 4, PORT, first_sent, kept, not_yet, convert, chain, done_ns) == want
        built = CycleEvents("r", 4, {PORT.key: PORT}, first_sent, convert, chain, encode=encode)
        got = built.port(PORT.key, 0, kept, not_yet, done_ns)
        if want is None:
            assert got is None
            branches.add("unfinished")
            return
        events, encoded = got
        assert events == want and [[type(v) for v in vars(e).values()] for e in events] == \
            [[type(v) for v in vars(e).values()] for e in want]  # same values, of the same types
        assert encoded == [oracle_encode(e) for e in want]
        branches.update(name for name, hit in [
            ("fault", any(e.source.startswith("bounds:") for e in want)),
            ("between-polls", any(e.source.startswith("between-polls") for e in want)),
            ("losing", any(e.stage in ("light_lost", "port_down") for e in want)),
            ("touching", any(e.uncertainty_ns == 0 and e.source.startswith("between-polls") for e in want)),
            ("latched", any(s in not_yet and not_yet[s].host_ns > kept[s].host_ns - 1.5 * kept[s].interval_ns
                            for s in ("light_detected", "cdr_locked") if s in kept))] if hit)

    check()
    assert branches == {"unfinished", "fault", "between-polls", "losing", "touching", "latched"}


def test_chain_bounds_intersect_and_never_contradict():
    seen = {"light_detected": (0, 1000), "cdr_locked": (200, 300), "first_packet": (250, 260)}
    b = oracle_chain_bounds(100, seen, {"phy_up": 240})
    assert b["light_detected"] == (100, 260) and b["cdr_locked"] == (200, 260)
    assert b["phy_up"] == (240, 260) and b["port_active"] == (240, 260) and b["first_packet"] == (250, 260)
    # a seen stage whose chain bound would be empty keeps its own interval
    assert oracle_chain_bounds(0, {"phy_up": (500, 600), "port_active": (100, 200)}, {})["phy_up"] == (500, 600)


def test_a_latched_flag_cleared_at_the_next_poll_may_have_cleared_within_the_poll_that_showed_it_set():
    """`ethtool -m` prints latched module flags: a loss of light shorter than a poll (lost at 0.3 ms, back at
    0.6 ms, polls every 1 ms) reads "1" at the poll after it (1 ms) and "0" only at the next (2 ms). The light came
    back within the "1"'s interval, before the "0"'s: the event must hold 0.6 ms. A loss that spans polls reads
    "1" live until the poll before the "0", whose own interval then holds the clearing (and stays tight)."""
    def convert(host, host_ns):
        return host_ns, 0, 0

    def light_detected(kept, not_yet):
        (event,) = [e for e in port_events("r", 1, PORT, 0, kept, not_yet, convert) if e.stage == "light_detected"]
        return event.t_ns - event.uncertainty_ns, event.t_ns + event.uncertainty_ns

    short = light_detected({"light_detected": _observation("light_detected", False, 2_000_000, 1_000_000)},
                           {"light_detected": _observation("light_detected", True, 1_000_000, 1_000_000)})
    assert short[0] <= 600_000 <= short[1] and short[1] == 2_000_000 + 1_000
    spanning = light_detected({"light_detected": _observation("light_detected", False, 5_000_000, 1_000_000)},
                              {"light_detected": _observation("light_detected", True, 1_000_000, 1_000_000)})
    assert spanning == (4_000_000 - 1_000, 5_000_000 + 1_000)
    # the same for the CDR's loss-of-lock flag; a sysfs value (carrier) is read live, never widened
    (cdr,) = [e for e in port_events("r", 1, PORT, 0, {"cdr_locked": _observation("cdr_locked", False, 2_000_000,
                                                                                 1_000_000)},
                                     {"cdr_locked": _observation("cdr_locked", True, 1_000_000, 1_000_000)}, convert)
              if e.stage == "cdr_locked"]
    assert cdr.t_ns - cdr.uncertainty_ns <= 600_000
    (phy,) = [e for e in port_events("r", 1, PORT, 0, {"phy_up": _observation("phy_up", False, 2_000_000, 1_000_000)},
                                     {"phy_up": _observation("phy_up", True, 1_000_000, 1_000_000)}, convert)
              if e.stage == "phy_up"]
    assert phy.t_ns - phy.uncertainty_ns == 1_000_000 - 1_000
