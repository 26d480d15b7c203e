"""The NETCONF driver against a server we did not write: yuma123's `netconfd` with Polatis' own optical-switch
YANG, behind OpenSSH's `sshd` (tests/peers/netconfd.py). Ground truth is read from netconfd over a second,
plain ncclient session; the same requests sent to our emulator must get the same rpc-errors."""
from __future__ import annotations

import json
import xml.etree.ElementTree as ET

import pytest

from tests.peers.netconfd import NetconfdPeer, missing

WHY_NOT = missing()
pytestmark = pytest.mark.skipif(WHY_NOT is not None, reason=f"netconfd peer unavailable: {WHY_NOT}")

from devices.errors import DeviceDenied, DeviceError  # noqa: E402
from devices.ocs import open_switch  # noqa: E402
from devices.ocs.netconf import NotOneToOne  # noqa: E402
from devices.resources import OcsResource  # noqa: E402

N = 16
ALL_PORTS = frozenset(range(1, 2 * N + 1))
NC_NS = "urn:ietf:params:xml:ns:netconf:base:1.0"
OS_NS = "http://www.polatis.com/yang/optical-switch"
NC, OS = f"{{{NC_NS}}}", f"{{{OS_NS}}}"
EDIT = (f"<edit-config><target><{{target}}/></target><config xmlns:nc='{NC_NS}'>"
        f"<cross-connects xmlns='{OS_NS}'>{{pairs}}</cross-connects></config></edit-config>")


def _pair(ingress, egress=None, operation="merge") -> str:
    return (f"<pair nc:operation='{operation}'><ingress>{ingress}</ingress>"
            + (f"<egress>{egress}</egress>" if egress is not None else "") + "</pair>")


class Truth:
    """A second session to the server, plain ncclient and no driver: what the server holds, and changes made
    behind the driver's back."""

    def __init__(self, manager):
        from ncclient.operations.rpc import RaiseMode

        self.m = manager
        self.m.raise_mode = RaiseMode.NONE

    def send(self, body: str) -> ET.Element:
        from ncclient.xml_ import to_ele

        return ET.fromstring(self.m.dispatch(to_ele(f"<x xmlns='{NC_NS}'>{body}</x>")[0]).xml.encode())

    def pairs(self, source="running") -> dict[int, int]:
        reply = self.send(f"<get-config><source><{source}/></source><filter type='subtree'>"
                          f"<cross-connects xmlns='{OS_NS}'/></filter></get-config>")
        assert reply.find(NC + "rpc-error") is None, ET.tostring(reply)
        return {int(p.findtext(OS + "ingress")): int(p.findtext(OS + "egress"))
                for p in reply.iter(OS + "pair")}

    def edit(self, pairs: str, target="running") -> None:
        reply = self.send(EDIT.format(target=target, pairs=pairs))
        assert reply.find(NC + "ok") is not None, ET.tostring(reply)

    def clear(self) -> None:
        reply = self.send(EDIT.format(target="running", pairs="").replace(
            "<cross-connects ", "<cross-connects nc:operation='remove' "))
        assert reply.find(NC + "ok") is not None, ET.tostring(reply)

    def close(self) -> None:
        self.m.close_session()


def _truth(peer: NetconfdPeer) -> Truth:
    from ncclient import manager

    host_key = (peer.dir / "ssh_host_ed25519_key.pub").read_text().split()[1]
    return Truth(manager.connect(host="127.0.0.1", port=peer.port, username=peer.user,
                                 key_filename=str(peer.dir / "id_ed25519"), hostkey_verify=True,
                                 hostkey_b64=host_key, allow_agent=False, look_for_keys=False, timeout=10))


def _count_requests(switch, monkeypatch) -> list[str]:
    """What the driver sends from now on, one entry per request (its description)."""
    sent: list[str] = []
    steps = switch._rpc_steps

    def counted(what, call):
        sent.append(what)
        return steps(what, call)

    monkeypatch.setattr(switch, "_rpc_steps", counted)
    return sent


def _open(url: str, user: str, allowed=ALL_PORTS | {0}):
    return open_switch(OcsResource(name="ocs1", protocol="polatis-netconf", url=url, size=(N, N),
                                   allowed_ports=frozenset(allowed), user=user), timeout_s=10)


@pytest.fixture(scope="module")
def peer():
    with NetconfdPeer(target="running") as server:
        yield server


@pytest.fixture(scope="module")
def truth(peer):
    session = _truth(peer)
    yield session
    session.close()


@pytest.fixture(scope="module")
def module_switch(peer):
    switch = _open(peer.url, peer.user)
    yield switch
    switch.close()


@pytest.fixture()
def switch(module_switch, truth):
    truth.clear()
    yield module_switch


def test_logs_in_with_its_key_and_the_pinned_host_key_only(peer, switch, tmp_path):
    assert switch.target == "running" and switch.pair_tag == "pair"  # :writable-running, revision 2018-03-22
    assert switch.patches() == {}
    import subprocess

    subprocess.run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-f", str(tmp_path / "key")], check=True)
    kind, key = (tmp_path / "key.pub").read_text().split()[:2]  # another key of the server's own type
    (tmp_path / "known_hosts").write_text(f"[127.0.0.1]:{peer.port} {kind} {key}\n")
    wrong = peer.url.replace(str(peer.dir / "known_hosts"), str(tmp_path / "known_hosts"))
    with pytest.raises(DeviceError, match="SSHUnknownHostError: Unknown host key"):
        _open(wrong, peer.user)


def test_lists_makes_and_removes_cross_connects(switch, truth):
    timing = switch.connect(1, 17)
    assert truth.pairs() == {1: 17} and timing.sent_ns <= timing.completed_ns
    switch.apply({1: 18, 2: 17})  # a move and a new pair, one edit-config
    assert truth.pairs() == {1: 18, 2: 17} == switch.patches()
    truth.edit(_pair(9, 25))  # someone else's
    switch.apply({3: 19}, exclusive=True)  # drops every other pair on an allowed port
    assert truth.pairs() == {3: 19}
    switch.disconnect([3])
    assert truth.pairs() == {} == switch.patches()


def test_out_of_range_port_is_the_servers_refusal_and_never_retried(switch, truth, monkeypatch):
    from harness.bench.circuits import BenchBroken, CircuitGuard, RetryPolicy

    with pytest.raises(DeviceDenied) as denied:
        switch.connect(0, 17)  # the model's range is 1..65535
    error = denied.value
    assert error.code == "invalid-value" and error.permanent
    for part in ("protocol error: value not in range [not-in-range]",
                 "at /nc:rpc/nc:edit-config/nc:config/opsw:cross-connects/opsw:pair[opsw:ingress='0']/opsw:ingress",
                 "bad-value 0", "error-number 288"):
        assert part in str(error), str(error)
    guard = CircuitGuard("ocs1", switch, snapshot_path=None, resuming=False, allowed=switch.allowed)
    sent = _count_requests(switch, monkeypatch)
    with pytest.raises(BenchBroken, match="invalid-value"):
        guard.apply({0: 17}, RetryPolicy(retries=3, backoff_s=0.0, timeout_s=10.0))
    assert [w for w in sent if w.startswith("edit-config")] == ["edit-config apply {0: 17}"]  # no retry
    with pytest.raises(DeviceDenied) as denied:
        switch.disconnect([5])  # no such pair
    assert denied.value.code == "data-missing" and denied.value.permanent
    assert "opsw:pair[opsw:ingress='5']" in str(denied.value) and "[data-incomplete]" in str(denied.value)
    assert truth.pairs() == {}


def test_a_second_feeder_of_an_egress_is_never_sent_named_when_found_and_can_be_undone(switch, truth,
                                                                                       monkeypatch):
    switch.connect(1, 17)
    sent = _count_requests(switch, monkeypatch)
    with pytest.raises(DeviceDenied) as denied:
        switch.connect(2, 17)  # netconfd would take it: the model has no `unique egress`
    assert denied.value.code == "in-use" and "nothing was sent" in str(denied.value)
    assert sent == ["get-config cross-connects"] and truth.pairs() == {1: 17}
    truth.edit(_pair(2, 17))  # another client does what the server allows
    assert truth.pairs() == {1: 17, 2: 17}
    with pytest.raises(NotOneToOne) as found:
        switch.patches()
    assert found.value.conflicts == {17: (1, 2)}
    assert "egress 17 fed by ingress 1 and 2 (1->17, 2->17)" in str(found.value)
    assert "disconnect 2" in str(found.value)
    sent.clear()
    with pytest.raises(NotOneToOne, match="nothing was sent"):
        switch.apply({5: 21})  # would leave the conflict as it is
    assert sent == ["get-config cross-connects"] and truth.pairs() == {1: 17, 2: 17}
    switch.disconnect([2])  # the way back, on the state as it is
    assert truth.pairs() == {1: 17} == switch.patches()
    truth.edit(_pair(2, 17))
    switch.apply({1: 17})  # the wanted mapping resolves it too: 2->17 is the conflict it removes
    assert truth.pairs() == {1: 17}


def test_a_guard_restores_through_a_second_feeder_or_names_it(switch, truth):
    from harness.bench.circuits import CircuitGuard, RetryPolicy

    switch.connect(1, 17)
    guard = CircuitGuard("ocs1", switch, snapshot_path=None, resuming=False, allowed=switch.allowed)
    guard.apply({1: 18, 3: 19}, RetryPolicy(retries=0, timeout_s=10.0))
    truth.edit(_pair(2, 18))  # behind the run's back: 1->18 and 2->18
    outcome = guard.restore(within_s=10.0)  # moving 1 back to 17 resolves it; 2->18 is on a touched port
    assert outcome.restored and outcome.error is None, outcome
    assert truth.pairs() == {1: 17}
    guard.apply({1: 18, 3: 19}, RetryPolicy(retries=0, timeout_s=10.0))
    truth.edit(_pair(2, 19))  # 3->19 and 2->19: which one is meant, the restore cannot know
    outcome = guard.restore(within_s=10.0)
    assert not outcome.restored and "egress 19 fed by ingress 2 and 3 (2->19, 3->19)" in outcome.error, outcome
    assert truth.pairs() == {1: 18, 2: 19, 3: 19}  # nothing was sent
    switch.disconnect([2])  # what the message says to do
    assert guard.restore(within_s=10.0).restored and truth.pairs() == {1: 17}


def test_state_data_the_server_does_not_provide_is_said_so(switch):
    with pytest.raises(DeviceError, match="returned no product-information: it does not provide this state data, "
                                          "so identify is not available"):
        switch.identify()
    with pytest.raises(DeviceError, match="returned no opm-power: it does not provide this state data, so port "
                                          "power is not available"):
        switch.port_power([1, 17])


def test_candidate_only_server_is_changed_by_commit_under_lock_and_left_clean_after_a_refusal():
    with NetconfdPeer(target=None) as server:  # netconfd's default: :candidate, no :writable-running
        truth = _truth(server)
        switch = _open(server.url, server.user)
        try:
            assert switch.target == "candidate"
            switch.apply({3: 19, 4: 20})
            assert truth.pairs() == {3: 19, 4: 20}  # running: committed
            with pytest.raises(DeviceDenied) as denied:
                switch.connect(0, 17)
            assert denied.value.code == "invalid-value" and denied.value.permanent
            with pytest.raises(DeviceDenied) as denied:
                switch.apply({5: 21, 6: 0})  # refused at the edit: discarded, not left for the next commit
            assert truth.pairs("candidate") == truth.pairs() == {3: 19, 4: 20}
            truth.edit(_pair(7, 23), target="candidate")  # someone's edit, not committed: ours would carry it
            with pytest.raises(DeviceDenied) as denied:
                switch.apply({5: 21})
            assert denied.value.code == "resource-denied" and not denied.value.permanent  # may clear: retried
            assert "discard-changes needed" in str(denied.value) and truth.pairs() == {3: 19, 4: 20}
            truth.send("<discard-changes/>")
            switch.disconnect([3])
            assert truth.pairs() == {4: 20} == switch.patches()
        finally:
            switch.close()
            truth.close()


def test_harness_ocs_against_netconfd(peer, truth, capsys):
    from harness.cli import main

    truth.clear()
    base = ["ocs", "--url", peer.url, "--protocol", "polatis-netconf", "--user", peer.user, "--size", "16x16"]
    assert main(base + ["connect", "1", "17"]) == 0
    assert capsys.readouterr().out.startswith("connected 1 -> 17 in ")
    assert main(base + ["--json", "list"]) == 0
    assert json.loads(capsys.readouterr().out) == {"1": 17}
    truth.edit(_pair(2, 17))
    assert main(base + ["list"]) != 0
    assert "egress 17 fed by ingress 1 and 2" in capsys.readouterr().err
    assert main(base + ["--allowed-ports", "2,17", "disconnect", "2"]) == 0
    assert main(base + ["--allowed-ports", "1,17", "disconnect", "1"]) == 0
    assert truth.pairs() == {}
    assert main(base + ["identify"]) != 0
    assert "does not provide this state data" in capsys.readouterr().err


# ---- the emulator answers as netconfd does ------------------------------------------------------------
STATE_EDIT = (f"<edit-config><target><running/></target><config><opm-power xmlns='{OS_NS}'><port><port-id>1"
              "</port-id><power>1.0</power></port></opm-power></config></edit-config>")
SAME_REFUSALS = {
    "out of range": EDIT.format(target="running", pairs=_pair(0, 17)),
    "no pair to delete": EDIT.format(target="running", pairs=_pair(5, operation="delete")),
    "pair exists": EDIT.format(target="running", pairs=_pair(3, 20, "create")),
    "no egress": EDIT.format(target="running", pairs=_pair(4, operation="create")),
    "unknown leaf": EDIT.format(target="running", pairs="<pair><ingress>4</ingress><egress>20</egress><foo>1</foo>"
                                                        "</pair>"),
    "unknown container": f"<edit-config><target><running/></target><config><bogus xmlns='{OS_NS}'/></config>"
                         "</edit-config>",
    "other namespace": "<edit-config><target><running/></target><config><thing xmlns='urn:example:x'/></config>"
                       "</edit-config>",
    "state data written": STATE_EDIT,
    "state leaf written": f"<edit-config><target><running/></target><config><port-config xmlns='{OS_NS}'><port>"
                          "<port-id>1</port-id><status>ENABLED</status></port></port-config></config></edit-config>",
    "no candidate (read)": "<get-config><source><candidate/></source></get-config>",
    "no candidate (write)": EDIT.format(target="candidate", pairs=_pair(4, 20)),
    "commit": "<commit/>",
    "unknown rpc": "<frobnicate/>",
    "edit without config": "<edit-config><target><running/></target></edit-config>",
}


def _error_shape(reply: ET.Element) -> tuple:
    error = reply.find(NC + "rpc-error")
    assert error is not None, ET.tostring(reply)
    info = error.find(NC + "error-info")
    # not yuma's own error-number, nor the prefix `inv:` it gives an element of a namespace it does not know
    items = tuple((i.tag.rpartition("}")[2], (i.text or "").strip().removeprefix("inv:"))
                  for i in (info if info is not None else ()) if i.tag.rpartition("}")[2] != "error-number")
    return (tuple(error.findtext(NC + f) for f in ("error-type", "error-tag", "error-severity", "error-app-tag",
                                                   "error-path")), items)


@pytest.fixture(scope="module")
def emulated():
    from devices.emulated.netconf_server import NetconfServer
    from devices.emulated.ocs_server import OcsServers
    from devices.emulated.physics import OpticalBench
    from devices.emulated.profile import load_profile

    bench = OpticalBench(load_profile("instant"), seed=7).start()
    servers = OcsServers(bench, pty=False).start()
    with NetconfServer(servers) as server:
        yield server
    servers.stop()
    bench.stop()


def test_the_emulator_refuses_as_netconfd_does(truth, module_switch, emulated):
    from ncclient import manager

    emulator = Truth(manager.connect(host="127.0.0.1", port=emulated.port, username="admin", password="root",
                                     hostkey_verify=True, hostkey_b64=emulated.host_key.get_base64(),
                                     allow_agent=False, look_for_keys=False, timeout=10))
    ours = open_switch(OcsResource(name="emu", protocol="polatis-netconf", url=emulated.url, size=(N, N),
                                   allowed_ports=ALL_PORTS | {0}, user="admin", password="root"), timeout_s=10)
    try:
        for session in (truth, emulator):
            session.clear()
            session.edit(_pair(3, 19))
        for case, body in SAME_REFUSALS.items():
            theirs, mine = truth.send(body), emulator.send(body)
            assert _error_shape(mine) == _error_shape(theirs), case
            # our message starts with theirs and then says more
            assert mine.findtext(f"{NC}rpc-error/{NC}error-message").startswith(
                theirs.findtext(f"{NC}rpc-error/{NC}error-message")), case
        assert truth.pairs() == emulator.pairs() == {3: 19}
        # the driver sees the same codes and permanence from both
        for action in (lambda s: s.connect(0, 17), lambda s: s.disconnect([5]), lambda s: s.connect(3, 20)):
            seen = []
            for switch in (ours, module_switch):
                with pytest.raises(DeviceDenied) as denied:
                    action(switch)
                seen.append((denied.value.code, denied.value.permanent))
            assert seen[0] == seen[1], seen
    finally:
        ours.close()
        emulator.close()
