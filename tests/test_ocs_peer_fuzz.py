"""Hypothesis-generated peer behaviours against the TL1 and SCPI drivers: every call returns a possible
switch state or raises a DeviceError within its deadline, buffers stay bounded, and autonomous messages
spliced anywhere into a reply never change what it says. The long run is benchmarks/peer_fuzz.py."""
from __future__ import annotations

import pytest
from hypothesis import HealthCheck, given, settings, strategies as st

from devices.emulated.hostile_peer import HostilePeer
from devices.emulated.peer_behaviours import Piece, behaviours, outcome_of, valid_pairs
from devices.ocs.lines import MAX_LINE_BYTES

TIMEOUT_S = 0.15
FUZZ = settings(max_examples=15, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])


@pytest.fixture(scope="module", params=["tl1", "scpi"])
def peer(request):
    with HostilePeer(lambda command: [], request.param) as peer:
        yield request.param, peer


@FUZZ
@given(behaviour=behaviours("tl1") | behaviours("scpi"))
def test_any_peer_behaviour_keeps_the_driver_contract(peer, behaviour):
    dialect, server = peer
    kind, _, switch = outcome_of(server, dialect, behaviour, TIMEOUT_S)
    assert not kind.startswith("CONTRACT"), (kind, behaviour)
    if switch is not None:
        assert len(switch._channel._splitter._buf) <= MAX_LINE_BYTES  # bounded whatever arrived
        assert len(switch.events.take()) <= 1024


@pytest.fixture(scope="module")
def tl1_peer():
    with HostilePeer(lambda command: [], "tl1") as peer:
        yield peer


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(pairs=valid_pairs, splice=st.lists(st.integers(0, 8), max_size=4).map(tuple))
def test_autonomous_messages_spliced_anywhere_never_change_the_reply(tl1_peer, pairs, splice):
    kind, _, switch = outcome_of(tl1_peer, "tl1", [Piece("reply", pairs, splice)], 2.0)
    assert kind == "ok" and switch.last_state == dict(pairs)
    # in the order they were spliced in (by position, then by index)
    expected = [str(100 + k) for k, at in sorted(enumerate(splice), key=lambda x: (x[1], x[0]))
                if at <= len(pairs)]
    events = switch.events.take()
    assert [e.tag for e in events] == expected and all(e.kind.startswith("REPT ") for e in events)
