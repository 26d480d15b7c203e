"""Every protocol in the OCS registry, through `open_switch`, against its emulator view of one switch: the
16x16 traverse, the switch's own refusals, and the allowlist that sends nothing."""
from __future__ import annotations

import pytest

from devices.emulated.ocs_server import OcsServers
from devices.emulated.physics import OpticalBench
from devices.emulated.profile import load_profile
from devices.errors import DeviceDenied, PortNotAllowed
from devices.ocs import get_protocol, open_switch, protocol_names
from devices.resources import OcsResource

N = 16  # the `instant` profile's switch is 16x16
ALL_PORTS = frozenset(range(1, 2 * N + 1))
# what each switch answers: no such port, an ingress where an egress belongs, no patch to delete,
# ingress busy, egress busy
REFUSALS = {
    "polatis-tl1": ("IIAC", "IIAC", "IDNV", "SROF", "SROF"),
    "polatis-scpi": ("-222", "-222", "-224", "-221", "-221"),
    "polatis-netconf": ("invalid-value", "invalid-value", "data-missing", "data-exists", "in-use"),
}


@pytest.fixture(scope="module")
def emulator():
    bench = OpticalBench(load_profile("instant"), seed=5).start()
    servers = OcsServers(bench, pty=False).start()
    views = {name: get_protocol(name).start_emulator(servers) for name in protocol_names()}
    yield bench, servers, views
    for view in views.values():
        view.stop()
    servers.stop()
    bench.stop()


def _open(views, protocol: str, allowed=ALL_PORTS, plan_from_confirmed_read=False):
    return open_switch(OcsResource(name="ocs1", protocol=protocol, url=views[protocol].url, size=(N, N),
                                   allowed_ports=frozenset(allowed), user="admin", password="root",
                                   plan_from_confirmed_read=plan_from_confirmed_read),
                       timeout_s=10)


@pytest.fixture(params=sorted(REFUSALS))
def switch(request, emulator):
    _, servers, views = emulator
    servers.faults.clear()
    switch = _open(views, request.param, allowed=ALL_PORTS | {99}, plan_from_confirmed_read=True)
    switch.apply({}, exclusive=True)  # every test starts from an empty switch
    yield switch
    switch.close()


def test_every_registered_protocol_is_tested():
    assert set(protocol_names()) == set(REFUSALS)


def test_full_traverse_of_every_port_pair(switch, emulator):
    """Every ingress to every egress, one at a time, each confirmed by reading the switch back."""
    bench = emulator[0]
    seen = 0
    for ingress in range(1, N + 1):
        for egress in range(N + 1, 2 * N + 1):
            timing = switch.apply({ingress: egress}, exclusive=True)
            assert timing.sent_ns <= timing.completed_ns
            assert bench.ocs_patches() == {ingress: egress}  # the emulator's truth, not the driver's read
            seen += 1
    assert seen == N * N


def test_switch_refusals_surface_with_their_codes(switch):
    no_port, wrong_side, no_patch, ingress_busy, egress_busy = REFUSALS[switch.resource.protocol]
    cases = [(lambda: switch.connect(99, 17), no_port),
             (lambda: switch.connect(1, 2), wrong_side),
             (lambda: switch.disconnect([4]), no_patch)]
    switch.connect(1, 17)
    cases += [(lambda: switch.connect(1, 18), ingress_busy),
              (lambda: switch.connect(3, 17), egress_busy)]
    entry = get_protocol(switch.resource.protocol)
    for action, code in cases:
        with pytest.raises(DeviceDenied) as denied:
            action()
        assert denied.value.code == code, denied.value
        assert code in str(denied.value)
        assert denied.value.permanent == entry.is_permanent(code)
    assert entry.is_permanent(no_port) and not entry.is_permanent(egress_busy)
    assert switch.patches() == {1: 17}  # nothing changed by the refusals


def test_port_outside_allowlist_sends_nothing(emulator):
    bench, servers, views = emulator
    for protocol in REFUSALS:
        admin = _open(views, protocol)
        admin.apply({}, exclusive=True)
        admin.connect(9, 25)  # someone else's patch
        limited = _open(views, protocol, allowed={1, 2, 17, 18})
        try:
            servers.faults.clear()
            servers.faults.arm("deny", count=1000, changes_only=False)  # a tripwire: any command fires it
            for action in (lambda: limited.connect(1, 19), lambda: limited.connect(9, 17),
                           lambda: limited.port_power([1, 30]), lambda: limited.apply({2: 25})):
                with pytest.raises(PortNotAllowed):
                    action()
            assert servers.faults.fired == [], protocol
            servers.faults.clear()
            bench.ocs_apply({1: 26})  # set behind our back: 26 is not allowed
            bench.wait_idle()
            truth = len(bench.ground_truth())
            with pytest.raises(PortNotAllowed):
                limited.disconnect([1])  # the patch's egress is outside the allowlist (after a read)
            with pytest.raises(PortNotAllowed):
                limited.apply({1: 17})  # moving it away from 26 touches 26
            bench.wait_idle()
            assert bench.ocs_patches() == {1: 26, 9: 25} and len(bench.ground_truth()) == truth, protocol
            bench.ocs_apply({}, [1])
            limited.apply({1: 17, 2: 18}, exclusive=True)  # keeps 9->25, which is not ours
            assert limited.patches() == {1: 17, 2: 18, 9: 25} == bench.ocs_patches()
        finally:
            servers.faults.clear()
            limited.close()
            admin.close()


def test_apply_plans_from_its_confirmed_read_and_a_change_behind_its_back_is_caught_and_retried(switch, emulator):
    """The next apply plans from the read that confirmed the last one (one read fewer per change; SCPI's
    `:CONN:ONLY` replaces the whole state, so it always reads first). Another session's change between two
    applies is caught by the confirming read, retried from a fresh read, and named as the retry's cause."""
    from harness.bench.circuits import CircuitGuard, RetryPolicy

    bench, _, views = emulator
    protocol = switch.resource.protocol
    reads: list[int] = []
    read_patches = switch._read_patches
    switch._read_patches = lambda: (reads.append(1), read_patches())[1]
    guard = CircuitGuard("ocs1", switch, snapshot_path=None, resuming=False, allowed=switch.allowed)
    policy = RetryPolicy(retries=2, backoff_s=0.0, timeout_s=10.0)
    assert guard.apply({1: 17, 2: 18}, policy).causes == ()
    reads.clear()
    assert guard.apply({1: 18, 2: 17}, policy).causes == ()
    # only the confirming read, a round trip of its own but on TL1 (pipelined with the change)
    assert len(reads) == {"polatis-scpi": 2, "polatis-tl1": 0}.get(protocol, 1)
    assert bench.ocs_patches() == {1: 18, 2: 17}
    other = _open(views, protocol)  # another operator, between two cycles, announced to nobody
    try:
        other.disconnect([2])
        other.connect(3, 19)
    finally:
        other.close()
    applied = guard.apply({1: 18, 2: 17, 4: 20}, policy)
    assert bench.ocs_patches() == {1: 18, 2: 17, 4: 20}  # the emulator's truth: 3->19 cleared, 2->17 back
    if protocol == "polatis-scpi":  # planned from a read: nothing to catch
        assert applied.causes == ()
    else:
        (cause,) = applied.causes
        assert cause.startswith("ocs-retry:ocs1: switch state does not confirm the change: missing {2: 17}"), cause
    assert not guard.suspect  # a mismatch is not a broken session: no reconnect



def test_a_plan_made_ahead_is_taken_only_for_its_mapping_and_while_its_state_stands(switch, emulator, monkeypatch):
    """`plan_ahead` plans the next apply from the kept state while the last change settles; `apply` takes that
    plan instead of planning again only for the same mapping, with nothing done on the session since. Either
    way the switch ends where a plan made at `apply` leaves it, and a change behind the session's back is
    caught by the confirming read (the plan made ahead is the one `apply` would have made then)."""
    import devices.ocs.base as base
    from harness.bench.circuits import CircuitGuard, RetryPolicy

    bench, _, views = emulator
    planned: list[dict] = []
    plan_apply = base.plan_apply
    monkeypatch.setattr(base, "plan_apply", lambda current, *rest: planned.append(dict(current)) or
                        plan_apply(current, *rest))
    switch.apply({1: 17, 2: 18}, exclusive=True)
    reads_first = switch.resource.protocol == "polatis-scpi"  # :CONN:ONLY always reads the state it replaces

    def apply_planned_ahead(ahead, then, between=lambda: None):
        planned.clear()
        base.plan_ahead(switch, ahead, True)
        made = len(planned)
        between()
        switch.apply(then, exclusive=True)
        assert bench.ocs_patches() == then
        return made, len(planned) - made

    assert apply_planned_ahead({1: 18, 2: 17}, {1: 18, 2: 17}) == (1, 1 if reads_first else 0)  # taken
    assert apply_planned_ahead({1: 17}, {1: 17, 2: 18, 3: 19}) == (1, 1 + reads_first)  # another mapping
    assert apply_planned_ahead({1: 18}, {1: 18}, lambda: switch.connect(4, 20)) == (1, 1)  # a command since
    assert apply_planned_ahead({1: 20}, {1: 20}, lambda: switch.patches()) == (1, reads_first)  # a read: kept
    assert apply_planned_ahead({2 * N + 5: 17}, {1: 17}) == (0, 1 + reads_first)  # refused ahead: none held
    with pytest.raises(PortNotAllowed):
        base.plan_ahead(switch, {1: 18}, True)
        switch.apply({1: 18, 2: 17 + 2 * N}, exclusive=True)
    guard = CircuitGuard("ocs1", switch, snapshot_path=None, resuming=False, allowed=switch.allowed)
    policy = RetryPolicy(retries=2, backoff_s=0.0, timeout_s=10.0)
    guard.apply({1: 17, 2: 18}, policy)
    guard.plan_ahead({1: 18, 2: 17})
    other = _open(views, switch.resource.protocol)  # another operator, after the plan was made ahead
    try:
        other.connect(3, 19)
    finally:
        other.close()
    applied = guard.apply({1: 18, 2: 17}, policy)
    assert bench.ocs_patches() == {1: 18, 2: 17}  # 3->19 caught and cleared (exclusive)
    assert len(applied.causes) == (0 if reads_first else 1)


def test_a_foreign_patch_to_a_port_outside_the_inventory_made_between_two_applies_is_never_removed(switch, emulator):
    """Another session re-patches one of our allowed ingresses to a port outside our allowlist between two
    applies. Planned from memory, the next change would delete that patch (a DLT-PATCH names only the
    ingress); with the kept-read plan off (the default off an emulated bench) it plans from a read, sees
    the foreign end and sends nothing."""
    from harness.bench.circuits import CircuitGuard, RetryPolicy

    bench, _, views = emulator
    protocol = switch.resource.protocol
    allowed = frozenset(range(1, 9)) | frozenset(range(N + 1, N + 9))
    foreign = 2 * N  # an egress outside our allowlist
    ours = _open(views, protocol, allowed=allowed)
    try:
        guard = CircuitGuard("ocs1", ours, snapshot_path=None, resuming=False, allowed=allowed)
        policy = RetryPolicy(retries=2, backoff_s=0.0, timeout_s=10.0)
        guard.apply({1: N + 1, 2: N + 2}, policy)
        switch.disconnect([2])  # `switch` here is another session, every port allowed
        switch.connect(2, foreign)
        with pytest.raises(PortNotAllowed, match=str(foreign)):
            guard.apply({1: N + 2, 2: N + 1}, policy)
        assert bench.ocs_patches() == {1: N + 1, 2: foreign}  # the emulator's truth: nothing was sent
    finally:
        ours.close()


def test_every_refusal_kind_has_words_in_every_protocol():
    """The switch side refuses in neutral kinds: each protocol server must say every one in its own words."""
    from devices.emulated import netconf_server, ocs_server
    from devices.emulated.switching import OcsRefusal

    for words in (ocs_server._TL1_CODES, ocs_server._SCPI_ERRORS, netconf_server._TAGS):
        assert words.keys() == OcsRefusal.KINDS
    with pytest.raises(TypeError, match="unknown refusal kind 'SROF'"):
        OcsRefusal("SROF", "a protocol's word, not a kind")
