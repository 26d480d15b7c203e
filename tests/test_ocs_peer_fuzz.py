"""Hypothesis-generated peer behaviours against the TL1, SCPI and NETCONF drivers: every call returns a possible
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


# ---------------------------------------------------------------- NETCONF: fuzzed <rpc-reply> to get-config
NC_NS = "urn:ietf:params:xml:ns:netconf:base:1.0"
OS_NS = "http://www.polatis.com/yang/optical-switch"


def _pairs_xml(pairs) -> str:
    return "".join(f"<pair><ingress>{i}</ingress><egress>{e}</egress></pair>" for i, e in pairs)


netconf_replies = st.one_of(
    valid_pairs.map(lambda p: ("data", _pairs_xml(p))),
    st.lists(st.tuples(st.integers(-3, 40), st.integers(-3, 40)), max_size=5).map(lambda p: ("data", _pairs_xml(p))),
    st.sampled_from([("data", "<pair><ingress>1</ingress></pair>"),
                     ("data", "<pair><ingress>1" + "0" * 5000 + "</ingress><egress>17</egress></pair>"),
                     ("data", "<pair><ingress>x</ingress><egress>17</egress></pair>"),
                     ("data", "<frob/>"), ("raw", "<rpc-reply"), ("raw", "\x00garbage\x00"),
                     ("raw", "<rpc-reply message-id='999' xmlns='%s'><ok/></rpc-reply>" % NC_NS),
                     ("raw", "<rpc-reply message-id='{id}' xmlns='%s'/>" % NC_NS), ("silence", "")]),
    st.binary(max_size=64).map(lambda b: ("raw", b.decode("latin-1"))),
)


@pytest.fixture(scope="module")
def netconf():
    from devices.emulated.netconf_server import netconf_view
    from devices.emulated.ocs_server import OcsServers
    from devices.emulated.physics import OpticalBench
    from devices.emulated.profile import load_profile
    from devices.ocs import open_switch
    from devices.resources import OcsResource

    bench = OpticalBench(load_profile("instant"), seed=5).start()
    servers = OcsServers(bench, pty=False).start()
    view = netconf_view(servers)
    switch = open_switch(OcsResource(name="ocs1", protocol="polatis-netconf", url=view.url, size=(16, 16),
                                     allowed_ports=frozenset(range(1, 33)), user="admin", password="root"),
                         timeout_s=10)
    yield view, switch
    switch.close()
    view.stop()
    servers.stop()
    bench.stop()


@settings(max_examples=20, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(reply=netconf_replies)
def test_netconf_driver_keeps_the_contract_against_fuzzed_replies(netconf, reply):
    import re
    import time

    from devices.errors import DeviceError, DeviceTimeout, TransportClosed
    from devices.ocs.base import check_state

    view, switch = netconf
    original = type(view)._handle
    kind, text = reply

    def fuzzed(self, raw, session_id):
        if b"get-config" not in raw:
            return original(self, raw, session_id)
        if kind == "silence":
            return None, False
        message_id = re.search(rb'message-id="([^"]+)"', raw).group(1).decode()
        if kind == "raw":
            return text.replace("{id}", message_id).encode("utf-8", "replace"), False
        return (f'<rpc-reply message-id="{message_id}" xmlns="{NC_NS}"><data>'
                f'<cross-connects xmlns="{OS_NS}">{text}</cross-connects></data></rpc-reply>').encode(), False

    view._handle = fuzzed.__get__(view)
    switch.timeout_s = 0.3
    started = time.monotonic()
    try:
        state = switch.patches()
        check_state(state.items(), (16, 16), "fuzz")  # a returned state is a possible one
    except DeviceError as exc:
        if isinstance(exc, (DeviceTimeout, TransportClosed)) or "rpc-reply" in str(exc):
            del view._handle
            switch.timeout_s = 10
            switch.reconnect()  # a session that lost its framing is abandoned, as the guard does
    finally:
        view.__dict__.pop("_handle", None)
    assert time.monotonic() - started < 0.3 + 10 + 5  # the deadline, a reconnect, slack for load
