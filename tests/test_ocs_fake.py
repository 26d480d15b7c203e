"""FakeSwitch and the shared reconcile plan: properties, and a differential test of FakeSwitch against
the TL1 driver talking to the emulator (same states, same refusal codes)."""
from __future__ import annotations

import pytest
from hypothesis import HealthCheck, example, given, settings, strategies as st

from devices.emulated.ocs_server import OcsServers
from devices.emulated.physics import OpticalBench
from devices.emulated.profile import load_profile
from devices.errors import DeviceDenied, PortNotAllowed
from devices.ocs import open_switch
from devices.ocs.base import format_ports, parse_port_ranges, plan_apply
from devices.ocs.fake import FakeSwitch
from devices.resources import OcsResource

N = 16
ALL_PORTS = frozenset(range(1, 2 * N + 1))


def _resource(allowed=ALL_PORTS, url="fake://", protocol="polatis-tl1") -> OcsResource:
    return OcsResource(name="ocs1", protocol=protocol, url=url, size=(N, N), allowed_ports=frozenset(allowed),
                       user="admin", password="root")


@st.composite
def valid_state(draw, n=6):
    ingresses = draw(st.lists(st.integers(1, n), unique=True, max_size=n))
    egresses = draw(st.permutations(range(n + 1, 2 * n + 1)))
    return dict(zip(ingresses, egresses))


@given(current=valid_state(), wanted=valid_state(), allowed_extra=st.sets(st.integers(1, 12)),
       exclusive=st.booleans())
def test_plan_apply_reaches_wanted_and_removes_only_conflicts(current, wanted, allowed_extra, exclusive):
    allowed = frozenset(allowed_extra) | set(wanted) | set(wanted.values())
    try:
        plan = plan_apply(current, wanted, allowed, exclusive)
    except PortNotAllowed:
        # then some patch that must go (or be replaced) has a port outside the allowlist
        assert any((i in wanted or e in wanted.values() or (exclusive and i in allowed))
                   and (i not in allowed or e not in allowed) and wanted.get(i) != e
                   for i, e in current.items())
        return
    result = {i: e for i, e in current.items() if i not in plan.removes} | plan.adds
    assert all(result[i] == e for i, e in wanted.items())
    assert len(set(result.values())) == len(result)  # one ingress per egress
    for i, e in plan.removes.items():  # brute-force check that each removal was necessary
        assert current[i] == e
        assert (i in wanted and wanted[i] != e) or (e in wanted.values() and wanted.get(i) != e) \
            or (exclusive and i in allowed and i not in wanted)
    kept = {i: e for i, e in current.items() if i not in plan.removes}
    assert all(current.get(i) != e for i, e in plan.adds.items())  # nothing re-sent
    if exclusive:
        assert all(i in wanted for i in result if i in allowed)
    assert plan.touched_ports() <= allowed
    assert kept.items() <= current.items()


@given(st.sets(st.integers(1, 200)))
def test_port_ranges_round_trip(ports):
    assert parse_port_ranges(format_ports(ports)) == ports


@pytest.mark.parametrize("text", ["0-3", "5-2", "a", "1-b"])
def test_bad_port_ranges(text):
    with pytest.raises(ValueError):
        parse_port_ranges(text)


def test_fake_validates_like_a_switch():
    fake = FakeSwitch(_resource(allowed=ALL_PORTS | {40}))
    fake.connect(1, 17)
    for action, code in [(lambda: fake.connect(1, 18), "SROF"), (lambda: fake.connect(2, 17), "SROF"),
                         (lambda: fake.connect(1, 17), "SROF"),
                         (lambda: fake.connect(40, 18), "IIAC"), (lambda: fake.connect(2, 3), "IIAC"),
                         (lambda: fake.disconnect([2]), "IDNV")]:
        with pytest.raises(DeviceDenied) as denied:
            action()
        assert (denied.value.code, denied.value.permanent) == (code, code != "SROF")
    assert fake.port_power([1, 17, 18]) == {1: -3.5, 17: -3.5, 18: -60.0}
    limited = FakeSwitch(_resource(allowed={1, 17}))
    with pytest.raises(PortNotAllowed):
        limited.connect(1, 18)
    assert limited.commands == []


# ---------------------------------------------------------------- differential: fake vs emulator
@pytest.fixture(scope="module")
def live_tl1():
    bench = OpticalBench(load_profile("instant"), seed=3).start()
    servers = OcsServers(bench, pty=False).start()
    host, port = servers.tl1_address
    switch = open_switch(_resource(url=f"tcp://{host}:{port}", allowed=ALL_PORTS | {40}), timeout_s=10)
    yield switch
    switch.close()
    servers.stop()
    bench.stop()


ports = st.integers(1, 8) | st.integers(N + 1, N + 8) | st.just(40)
operations = st.lists(st.one_of(
    st.tuples(st.just("connect"), ports, ports),
    st.tuples(st.just("disconnect"), st.lists(ports, min_size=1, max_size=3, unique=True)),
    st.tuples(st.just("apply"), st.dictionaries(st.integers(1, 8), st.integers(N + 1, N + 8), max_size=3),
              st.booleans()),
), max_size=12)


@settings(max_examples=80, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(ops=operations)
@example(ops=[("connect", 1, 17), ("connect", 1, 17)])
@example(ops=[("connect", 1, 17), ("disconnect", [1, 17])])
def test_fake_agrees_with_emulator(live_tl1, ops):
    live_tl1.command("DLT-PATCH", "ALL")
    fake = FakeSwitch(_resource(allowed=ALL_PORTS | {40}))
    for op in ops:
        outcomes = []
        for switch in (fake, live_tl1):
            try:
                if op[0] == "connect":
                    switch.connect(op[1], op[2])
                elif op[0] == "disconnect":
                    switch.disconnect(op[1])
                elif len(set(op[1].values())) == len(op[1]):
                    switch.apply(op[1], exclusive=op[2])
                outcomes.append("ok")
            except DeviceDenied as exc:
                outcomes.append(exc.code)
        assert outcomes[0] == outcomes[1], op
        assert fake.patches() == live_tl1.patches(), op


def test_confirm_compares_every_patch_on_allowed_ports_with_the_plan():
    from devices.ocs.base import ConfirmedState, StateMismatch, confirm

    allowed = frozenset({1, 2, 3, 17, 18, 19})
    expected = {1: 17, 2: 18, 9: 25}
    confirm({1: 17, 2: 18, 9: 26}, {1: 17}, expected=expected, allowed=allowed)  # 9 is not ours
    with pytest.raises(StateMismatch, match=r"unplanned \{3: 19\}, gone \{\}"):
        confirm({1: 17, 2: 18, 3: 19}, {1: 17}, expected=expected, allowed=allowed)
    with pytest.raises(StateMismatch, match=r"unplanned \{9: 19\}, gone \{2: 18\}"):
        confirm({1: 17, 9: 19}, {1: 17}, expected=expected, allowed=allowed)
    known = ConfirmedState()
    known.keep({1: 17}, events_added=4)
    assert known.take(4) == {1: 17} and known.take(4) is None  # handed out once
    known.keep({1: 17}, events_added=4)
    assert known.take(5) is None  # the switch said something since
