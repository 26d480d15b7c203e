"""Polatis TL1 driver: against an independent minimal TL1 responder (written here, not our emulator) and
against the emulator over real TCP."""
from __future__ import annotations

import dataclasses
import re
import socket
import socketserver
import threading
import time

import pytest

from devices.emulated.ocs_server import OcsServers
from devices.emulated.physics import OpticalBench
from devices.emulated.profile import Delay, load_profile
from devices.errors import DeviceDenied, DeviceTimeout, PortNotAllowed
from devices.timing import Deadline
from devices.ocs import open_switch
from devices.ocs.tl1 import Tl1Switch
from devices.resources import OcsResource

N = 16  # the `instant` profile's switch is 16x16
ALL_PORTS = frozenset(range(1, 2 * N + 1))


# ---------------------------------------------------------------- an independent, quirky TL1 responder
class _Quirky(socketserver.BaseRequestHandler):
    """Writes LF-only lines, a `<` prompt without a newline after each reply, and an autonomous
    `A  ... REPT` message before every reply. Knows only what the TL1 grammar says."""

    def handle(self):
        state = self.server.state
        buf = b""
        self.request.sendall(b"\n<")
        while data := self.request.recv(4096):
            buf += data
            while b";" in buf:
                raw, _, buf = buf.partition(b";")
                text = raw.decode().strip()
                state["log"].append(text)
                verb, _tid, aid, ctag, *rest = text.split(":") + [""] * 4
                out = ["   NODE-7 24-05-01 12:00:00", "A  77 REPT EVT", '   "17:LOS,TC,,,,,,"', ";",
                       "   NODE-7 24-05-01 12:00:01"]
                body, deny = [], None
                patches = state["patches"]
                after_change, state["in_change"] = state.get("in_change"), verb in ("ENT-PATCH", "DLT-PATCH")
                if state["in_change"] and not after_change:
                    state["before_change"] = dict(patches)
                if verb in state.get("deny_once", {}):  # refused without acting
                    deny = state["deny_once"].pop(verb)
                elif verb == "ACT-USER":
                    deny = None if rest[1] == "secret" else "PICC"
                elif verb == "RTRV-PATCH":
                    if after_change and state.get("early_reads"):  # answered before the change ahead was done
                        state["early_reads"] -= 1
                        shown = state["before_change"]
                    else:
                        shown = patches
                    body = [f'   "{i},{e}"' for i, e in sorted(shown.items())]
                elif verb == "ENT-PATCH":
                    ins, outs = ([int(x) for x in side.split("&")] for side in aid.split(","))
                    if any(i in patches for i in ins) or any(e in patches.values() for e in outs):
                        deny = "SROF"
                    else:
                        patches.update(zip(ins, outs))
                elif verb == "DLT-PATCH":
                    ports = [int(x) for x in aid.split("&")]
                    if any(p not in patches for p in ports):
                        deny = "IDNV"
                    for p in ports:
                        patches.pop(p, None)
                elif verb == "RTRV-PORT-POWER":
                    body = [f'   "{p}:{-3.5 if p in patches or p in patches.values() else -60:.2f}"'
                            for p in map(int, aid.split("&"))]
                elif verb == "RTRV-NETYPE":
                    body = ['   "POLATIS,IOST,OXC,7.1"']
                elif verb != "CANC-USER":
                    deny = "ICNV"
                out.append(f"M  {ctag} {'DENY' if deny else 'COMPLD'}")
                out += [f"   {deny}", "   /* refused */"] if deny else body
                out.append(";")
                if (held := state.get("hold", {}).get(verb)) is not None:
                    held.wait(10)  # the test says when the switch answers
                self.request.sendall(("\n".join(out) + "\n<").encode())


@pytest.fixture()
def quirky():
    server = socketserver.ThreadingTCPServer(("127.0.0.1", 0), _Quirky)
    server.daemon_threads = True
    server.state = {"patches": {}, "log": []}
    threading.Thread(target=server.serve_forever, args=(0.05,), daemon=True).start()
    yield server
    server.shutdown()
    server.server_close()


def _resource(address, allowed=ALL_PORTS, user="admin", password="root", **kw) -> OcsResource:
    return OcsResource(name="ocs1", protocol="polatis-tl1", url=f"tcp://{address[0]}:{address[1]}",
                       size=(N, N), allowed_ports=frozenset(allowed), user=user, password=password, **kw)


def test_driver_speaks_tl1_not_our_emulator(quirky):
    with_log = quirky.state["log"]
    switch = open_switch(_resource(quirky.server_address, password="secret"), timeout_s=5)
    try:
        assert with_log[0] == "ACT-USER::admin:1::secret"
        assert switch.identify() == "POLATIS,IOST,OXC,7.1"
        switch.connect(3, 20)
        assert switch.patches() == {3: 20}
        assert switch.port_power([3, 4]) == {3: -3.5, 4: -60.0}
        with pytest.raises(DeviceDenied) as denied:
            switch.connect(5, 20)
        assert denied.value.code == "SROF"
        switch.apply({5: 20, 6: 21})  # reconcile: drop 3->20, then add
        assert switch.patches() == {5: 20, 6: 21}
        switch.disconnect([5, 6])
        assert switch.patches() == {}
        with pytest.raises(DeviceDenied) as denied:
            switch.disconnect([9])
        assert denied.value.code == "IDNV"
    finally:
        switch.close()
    assert with_log[-1].startswith("CANC-USER::admin:")


def test_apply_pipelines_the_ent_patch_and_the_confirming_read_behind_the_dlt_patch(quirky):
    """DLT-PATCH, ENT-PATCH and the confirming RTRV-PATCH go out in one write, before the DLT-PATCH's reply is
    read: no round trip between them, and no other write (the read back is that RTRV's reply)."""
    switch = open_switch(_resource(quirky.server_address, password="secret"), timeout_s=5)
    wire: list[str] = []
    write_line, read_line = switch._channel.write_line, switch._channel.read_line
    switch._channel.write_line = lambda text, eol="\r\n": (wire.append("> " + text), write_line(text, eol))[1]
    switch._channel.read_line = lambda deadline: (line := read_line(deadline), wire.append("< " + line[1]))[0]
    try:
        switch.connect(3, 20)
        wire.clear()
        switch.apply({5: 20, 6: 21})
        *_plan_read, write = [k for k, w in enumerate(wire) if w.startswith(">")]  # no write after it
        dlt, ent, rtrv = wire[write][2:].split("\r\n")  # written together, in this order
        assert dlt.startswith("DLT-PATCH::3:") and ent.startswith("ENT-PATCH::5&6,20&21:"), wire
        assert rtrv.startswith("RTRV-PATCH:::") and len({c.split(":")[3] for c in (dlt, ent, rtrv)}) == 3, wire
        dlt_reply = next(k for k, w in enumerate(wire) if w == f"< M  {dlt.split(':')[3]} COMPLD")
        assert write < dlt_reply, wire
        assert quirky.state["patches"] == {5: 20, 6: 21}
    finally:
        switch.close()


def test_begin_apply_returns_once_the_change_is_written_and_finish_reads_its_replies(quirky):
    """The harness goes on while the switch settles: `begin_apply` returns after the pipelined write, before
    any reply to it; `finish` reads them and returns what `apply` returns; the session is held until then."""
    switch = open_switch(_resource(quirky.server_address, password="secret"), timeout_s=5)
    answer = threading.Event()
    try:
        switch.connect(3, 20)
        quirky.state["hold"] = {"DLT-PATCH": answer}  # the switch answers the first change when told to
        pending = switch.begin_apply({5: 20, 6: 21})
        assert pending.sent_ns == switch._channel.last_write[0]
        deadline = Deadline(5)
        while not quirky.state["log"][-1].startswith("DLT-PATCH") and not deadline.expired():
            time.sleep(0.005)
        assert quirky.state["log"][-1].startswith("DLT-PATCH")  # at the switch, unanswered: begin returned
        assert switch._lock.locked()  # the session is the pending apply's until it finishes
        answer.set()
        timing = pending.finish()
        assert timing.sent_ns == pending.sent_ns < timing.completed_ns and not switch._lock.locked()
        assert [c.split(":")[0] for c in quirky.state["log"][-3:]] == ["DLT-PATCH", "ENT-PATCH", "RTRV-PATCH"]
        assert quirky.state["patches"] == {5: 20, 6: 21} and switch.patches() == {5: 20, 6: 21}
        assert switch.begin_apply({5: 20, 6: 21}).sent_ns > 0  # nothing to change: it ended, with its read
    finally:
        answer.set()
        switch.close()


def test_a_denied_dlt_patch_names_what_the_pipelined_ent_patch_did_and_a_retry_reconciles(quirky):
    """After a refused DLT-PATCH the switch still runs the ENT-PATCH sent with it: a pair on a port still
    patched is refused (SROF here), a pair on free ports is made. The refusal says both; the next apply reads
    the switch and sends only what is still missing."""
    log, state = quirky.state["log"], quirky.state
    switch = open_switch(_resource(quirky.server_address, password="secret"), timeout_s=5)
    try:
        switch.ent_patch_lists = False  # one pair per ENT-PATCH: each pair's fate is its own
        switch.connect(3, 20)
        state["deny_once"] = {"DLT-PATCH": "SNVS"}
        with pytest.raises(DeviceDenied) as denied:
            switch.apply({3: 21, 7: 22})
        assert (denied.value.code, denied.value.permanent) == ("SNVS", False)
        assert denied.value.after == ("ENT-PATCH denied SROF", "ENT-PATCH COMPLD")
        assert state["patches"] == {3: 20, 7: 22}  # the switch's truth: 3 kept, 7 made
        del log[:]
        switch.apply({3: 21, 7: 22})
        assert [c.split(":")[0] + ":" + c.split(":")[2] for c in log if c.startswith(("DLT", "ENT"))] == [
            "DLT-PATCH:3", "ENT-PATCH:3,21"]  # 7 -> 22 is not sent again
        assert state["patches"] == {3: 21, 7: 22}
    finally:
        switch.close()


def test_a_read_back_answered_before_the_change_was_done_is_one_recorded_retry_from_a_fresh_read(quirky):
    """A unit that answered the pipelined RTRV-PATCH before it finished the ENT-PATCH shows the old state: that
    is a StateMismatch, never a silent wrong circuit, and the guard's retry plans from a read of its own."""
    from harness.bench.circuits import CircuitGuard, RetryPolicy

    log, state = quirky.state["log"], quirky.state
    switch = open_switch(_resource(quirky.server_address, password="secret", plan_from_confirmed_read=True),
                         timeout_s=5)
    try:
        switch.connect(3, 20)
        guard = CircuitGuard("ocs1", switch, snapshot_path=None, resuming=False, allowed=switch.allowed)
        del log[:]
        state["early_reads"] = 1
        applied = guard.apply({5: 20, 6: 21}, RetryPolicy(retries=2, backoff_s=0.0, timeout_s=5))
        (cause,) = applied.causes
        assert cause.startswith("ocs-retry:ocs1: switch state does not confirm the change: missing {5: 20, 6: 21}")
        assert [c.split(":")[0] for c in log] == ["RTRV-PATCH", "DLT-PATCH", "ENT-PATCH",
                                                  "RTRV-PATCH",  # answered early: the old state
                                                  "RTRV-PATCH"]  # the retry: a fresh read, nothing to send
        assert state["patches"] == switch.patches() == {5: 20, 6: 21}
    finally:
        switch.close()


def test_a_refused_change_raises_with_what_came_after_and_keeps_no_read(quirky):
    """A refused ENT-PATCH raises DeviceDenied naming no later change (the pipelined read is not one), and its
    read is not kept: the next apply reads the switch first, even with planning from the confirmed read on."""
    log, state = quirky.state["log"], quirky.state
    switch = open_switch(_resource(quirky.server_address, password="secret", plan_from_confirmed_read=True),
                         timeout_s=5)
    try:
        state["deny_once"] = {"ENT-PATCH": "SNVS"}
        with pytest.raises(DeviceDenied) as denied:
            switch.apply({3: 20})
        assert (denied.value.code, denied.value.after) == ("SNVS", ())
        del log[:]
        switch.apply({3: 20})
        assert [c.split(":")[0] for c in log] == ["RTRV-PATCH", "ENT-PATCH", "RTRV-PATCH"], log
        assert state["patches"] == {3: 20}
    finally:
        switch.close()


def test_wrong_password_is_denied_and_password_not_echoed(quirky):
    with pytest.raises(DeviceDenied) as denied:
        open_switch(_resource(quirky.server_address, password="nope"), timeout_s=5)
    assert denied.value.code == "PICC"
    assert "nope" not in str(denied.value)


def test_port_outside_allowlist_sends_nothing(quirky):
    switch = open_switch(_resource(quirky.server_address, allowed={1, 17}, password="secret"), timeout_s=5)
    try:
        sent_before = list(quirky.state["log"])
        for action in (lambda: switch.connect(1, 18), lambda: switch.connect(2, 17),
                       lambda: switch.port_power([1, 30]), lambda: switch.apply({2: 18})):
            with pytest.raises(PortNotAllowed):
                action()
        assert quirky.state["log"] == sent_before
        quirky.state["patches"][1] = 20  # set behind our back: 20 is not allowed
        with pytest.raises(PortNotAllowed):
            switch.disconnect([1])  # the patch's egress is outside the allowlist
        with pytest.raises(PortNotAllowed):
            switch.apply({1: 17})  # moving it away from 20 touches 20
        assert all(not c.startswith(("DLT", "ENT")) for c in quirky.state["log"])
    finally:
        switch.close()


def _scripted_peer(replies: list[bytes]):
    """A listener answering each received chunk with the next scripted reply."""
    listener = socket.create_server(("127.0.0.1", 0))
    accepted = []

    def serve():
        conn, _ = listener.accept()
        accepted.append(conn)
        for reply in replies:
            if not conn.recv(100):
                return
            conn.sendall(reply)

    threading.Thread(target=serve, daemon=True).start()
    return listener, accepted


def test_error_code_on_the_status_line_and_a_late_stale_reply():
    listener, accepted = _scripted_peer([
        b"   A 24-05-01 12:00:00\r\nM  1 DENY IIAC\r\n   /* Invalid AID */\r\n;\r\n",  # a node named A
        # a reply to an old ctag arriving first must be skipped, not taken for ours
        b"M  1 COMPLD\r\n   \"9,25\"\r\n;\r\nIP 2\r\n<M  2 COMPLD\r\n   \" 3 , 19 \"\r\n;\r\n",
    ])
    switch = open_switch(_resource(listener.getsockname(), user=None), timeout_s=5)
    try:
        with pytest.raises(DeviceDenied) as denied:
            switch.connect(1, 17)
        assert denied.value.code == "IIAC" and "Invalid AID" in str(denied.value)
        assert switch.patches() == {3: 19}
    finally:
        switch.close()
        listener.close()
        for conn in accepted:
            conn.close()


def test_silent_peer_times_out_with_partial_reply():
    listener = socket.create_server(("127.0.0.1", 0))
    accepted = []

    def serve():
        conn, _ = listener.accept()
        accepted.append(conn)
        conn.recv(100)
        conn.sendall(b"   NODE 24-05-01 12:00:00\r\nM  1 COMPL")  # never finishes

    threading.Thread(target=serve, daemon=True).start()
    resource = _resource(listener.getsockname(), user=None)
    switch = open_switch(resource, timeout_s=0.3)
    try:
        with pytest.raises(DeviceTimeout) as timeout:
            switch.patches()
        assert "M  1 COMPL" in str(timeout.value) and "RTRV-PATCH" in str(timeout.value)
    finally:
        switch.close()
        listener.close()
        for conn in accepted:
            conn.close()


# ---------------------------------------------------------------- against the emulator
@pytest.fixture(scope="module")
def emulator():
    bench = OpticalBench(load_profile("instant"), seed=1).start()
    servers = OcsServers(bench, pty=False).start()
    yield bench, servers
    servers.stop()
    bench.stop()


@pytest.fixture()
def tl1(emulator):
    bench, servers = emulator
    switch = open_switch(_resource(servers.tl1_address, allowed=ALL_PORTS | {99}), timeout_s=10)
    switch.command("DLT-PATCH", "ALL")  # raw command: every test starts from an empty switch
    yield switch
    switch.close()


def _raw(address, payload: bytes, replies: int) -> str:
    with socket.create_connection(address, timeout=5) as sock:
        sock.sendall(payload)
        data = b""
        while data.count(b"\r\n;") < replies:
            data += sock.recv(4096)
    return data.decode()


def test_raw_client_login_and_list(emulator, tl1):
    _, servers = emulator
    tl1.connect(2, 18)
    text = _raw(servers.tl1_address, b"RTRV-PATCH:::1:;ACT-USER::admin:2::root;RTRV-PATCH:::3:;\r\n", 3)
    header = r"\r\n   POLATIS \d\d-\d\d-\d\d \d\d:\d\d:\d\d\r\n"
    assert re.search(header + r"M  1 DENY\r\n   PLNA\r\n   /\* .* \*/\r\n;", text)
    assert re.search(header + r"M  2 COMPLD\r\n;", text)
    assert re.search(header + r'M  3 COMPLD\r\n   "2,18"\r\n;', text)


def test_login_required_and_checked(emulator):
    _, servers = emulator
    with pytest.raises(DeviceDenied) as denied:
        open_switch(_resource(servers.tl1_address, password="wrong"), timeout_s=5)
    assert denied.value.code == "PIUI"
    anonymous = open_switch(_resource(servers.tl1_address, user=None), timeout_s=5)
    try:
        with pytest.raises(DeviceDenied) as denied:
            anonymous.patches()
        assert denied.value.code == "PLNA"
    finally:
        anonymous.close()


def test_switch_errors_surface_with_their_codes(tl1):
    cases = [(lambda: tl1.connect(99, 17), "IIAC"),        # no such port
             (lambda: tl1.connect(1, 2), "IIAC"),          # ingress where an egress belongs
             (lambda: tl1.disconnect([4]), "IDNV")]        # no patch to delete
    tl1.connect(1, 17)
    cases += [(lambda: tl1.connect(1, 18), "SROF"),         # ingress busy
              (lambda: tl1.connect(3, 17), "SROF")]         # egress busy
    for action, code in cases:
        with pytest.raises(DeviceDenied) as denied:
            action()
        assert denied.value.code == code, denied.value
        assert denied.value.permanent == (code != "SROF")  # a busy port may clear; a bad port will not
        assert code in str(denied.value)
    assert tl1.patches() == {1: 17}  # nothing changed by the refusals
    with pytest.raises(DeviceDenied) as denied:
        tl1.command("RTRV-NOTHING")
    assert (denied.value.code, denied.value.permanent) == ("ICNV", True)


def test_apply_is_an_idempotent_reconcile(tl1):
    tl1.connect(1, 17)
    tl1.connect(2, 18)
    tl1.connect(5, 25)
    first = tl1.apply({1: 18, 3: 17})  # 1 moves, 2 loses its egress, 3 takes 17
    assert tl1.patches() == {1: 18, 3: 17, 5: 25}
    assert first.sent_ns <= first.completed_ns
    again = tl1.apply({1: 18, 3: 17})
    assert tl1.patches() == {1: 18, 3: 17, 5: 25}
    assert again.completed_ns > first.completed_ns
    tl1.apply({4: 20}, exclusive=True)
    assert tl1.patches() == {4: 20}
    with pytest.raises(ValueError):
        tl1.apply({1: 20, 2: 20})


def test_the_pipelined_read_back_is_the_switch_after_the_change_and_plans_the_next_apply(emulator):
    """Against the emulator's truth: the confirming RTRV-PATCH of one apply is served after the ENT-PATCH is
    done and shows the bench's state, and the next apply plans from it (no read before its change)."""
    bench, servers = emulator
    switch = open_switch(_resource(servers.tl1_address, plan_from_confirmed_read=True), timeout_s=10)
    try:
        switch.command("DLT-PATCH", "ALL")
        switch.apply({1: 17, 2: 18})
        switch.apply({1: 18, 3: 17})
        switch.identify()  # answered once the server has logged every command before it
        served = [s for s in servers.tl1_served if not s.command.startswith("RTRV-NETYPE")][-5:]
        assert [s.command.split(":")[0] for s in served] == [
            "ENT-PATCH", "RTRV-PATCH",  # the first apply's change and its read back
            "DLT-PATCH", "ENT-PATCH", "RTRV-PATCH"]  # the second: no read before its change
        served = served[2:]
        assert served[2].arrived_ns is None or served[2].reply_write_ns >= served[1].reply_write_ns
        assert switch._confirmed.take(switch._events_added()) == bench.ocs_patches() == {1: 18, 3: 17}
    finally:
        switch.close()


def test_completion_waits_for_the_mirrors():
    profile = load_profile("instant")
    slow = dataclasses.replace(profile, ocs={"switch": Delay.fixed(0.05), "dark": Delay.fixed(0.0)})
    bench = OpticalBench(slow).start()
    servers = OcsServers(bench, pty=False).start()
    try:
        switch = open_switch(_resource(servers.tl1_address), timeout_s=5)
        timing = switch.connect(1, 17)
        switch.close()
        bench.wait_idle()
        settled = [t["t_ns"] for t in bench.ground_truth() if t["stage"] == "mirror_settled"]
        assert timing.completed_ns - timing.sent_ns >= 50_000_000
        # the scheduler thread may run late on a loaded machine, so only its lower bound is checked
        assert len(settled) == 1 and settled[0] >= timing.sent_ns + 50_000_000
        # power reflects the settled mirror: egress lit, a dark egress not
        reader = open_switch(_resource(servers.tl1_address), timeout_s=5)
        power = reader.port_power([17, 18])
        reader.close()
        assert power[17] > -20 and power[18] <= -50
    finally:
        servers.stop()
        bench.stop()


def test_emulator_runs_a_pipelined_ent_patch_once_the_dlt_patch_is_done_not_when_its_loop_gets_to_it():
    """DLT-PATCH and ENT-PATCH in one write: the ENT's mirror moves from the DLT's completion (here its
    arrival, a delete completes at once), whatever the server's thread was doing in between, so the ground
    truth's release and settle are exactly `switch - dark` apart (the old server started the ENT when its loop
    had sent the DLT's reply)."""
    profile = load_profile("instant")
    slow = dataclasses.replace(profile, ocs={"switch": Delay.fixed(0.03), "dark": Delay.fixed(0.001)})
    bench = OpticalBench(slow).start()
    servers = OcsServers(bench, pty=False).start()
    try:
        with socket.create_connection(servers.tl1_address, timeout=5) as sock:
            def exchange(payload: bytes, replies: int) -> str:
                sock.sendall(payload)
                data = b""
                while data.count(b"\r\n;") < replies:
                    data += sock.recv(4096)
                return data.decode()

            assert exchange(b"ACT-USER::admin:1::root;ENT-PATCH::1,17:2:;", 2).count("COMPLD") == 2
            bench.wait_idle()
            replies = exchange(b"DLT-PATCH::1:3:;ENT-PATCH::1,18:4:;", 2)
            assert "M  3 COMPLD" in replies and "M  4 COMPLD" in replies
        bench.wait_idle()
        truth = bench.ground_truth()
        (released,) = [t["t_ns"] for t in truth if t["stage"] == "mirror_released" and t["ocs_port"] == 17]
        (settled,) = [t["t_ns"] for t in truth if t["stage"] == "mirror_settled" and t["ocs_port"] == 18]
        assert settled - released == 29_000_000
        assert bench.ocs_patches() == {1: 18}
    finally:
        servers.stop()
        bench.stop()


def test_tl1_driver_type(tl1):
    assert isinstance(tl1, Tl1Switch)
    assert "POLATIS" in tl1.identify()


def test_apply_moves_all_mirrors_in_one_command():
    """New pairs go out as one ENT-PATCH list, so the mirrors move together; one pair per command makes
    them settle one after another (40 ms mirror delay)."""
    profile = load_profile("instant")
    slow = dataclasses.replace(profile, ocs={"switch": Delay.fixed(0.04), "dark": Delay.fixed(0.0)})
    bench = OpticalBench(slow).start()
    servers = OcsServers(bench, pty=False).start()
    try:
        switch = open_switch(_resource(servers.tl1_address), timeout_s=5)
        sent: list[str] = []
        write_line = switch._channel.write_line
        switch._channel.write_line = lambda text, eol="\r\n": (sent.append(text), write_line(text, eol))[1]
        switch.apply({1: 17, 2: 18, 3: 19, 4: 20})
        entered = [c for c in sent if c.startswith("ENT-PATCH")]
        # ctag 1 was the login, 2 the read; the read back is written with the change
        assert entered == ["ENT-PATCH::1&2&3&4,17&18&19&20:3:;\r\nRTRV-PATCH:::4:;"]
        switch.ent_patch_lists = False
        switch.apply({5: 21, 6: 22})
        assert sum(c.count("ENT-PATCH") for c in sent) == 3  # the two single pairs pipelined in one write
        switch.close()
        bench.wait_idle()
        assert bench.ocs_patches() == {i: 16 + i for i in range(1, 7)}
        settled = sorted(t["t_ns"] for t in bench.ground_truth() if t["stage"] == "mirror_settled")
        assert settled[5] - settled[4] >= 40_000_000  # the second pair waited for the first
    finally:
        servers.stop()
        bench.stop()


def test_emulator_autonomous_reports_interleave_with_replies():
    bench = OpticalBench(load_profile("instant")).start()
    servers = OcsServers(bench, pty=False, autonomous=True).start()
    try:
        watcher = open_switch(_resource(servers.tl1_address), timeout_s=5)
        writer = open_switch(_resource(servers.tl1_address), timeout_s=5)
        with socket.create_connection(servers.tl1_address, timeout=5) as raw:
            raw.sendall(b"ACT-USER::admin:1::root;")
            data = b""
            while b"M  1 COMPLD" not in data:
                data += raw.recv(4096)
            errors: list[BaseException] = []

            def churn():
                try:
                    for k in range(60):
                        writer.apply({1 + k % 8: 17 + (k * 3) % 8}, exclusive=True)
                except BaseException as exc:  # reported by the main thread
                    errors.append(exc)

            thread = threading.Thread(target=churn)
            thread.start()
            reads = [watcher.patches() for _ in range(200)]  # replies arrive among REPT messages
            thread.join()
            assert not errors, errors
            assert all(len(r) <= 1 and all(1 <= i <= 8 and 17 <= e <= 24 for i, e in r.items()) for r in reads)
            assert watcher.patches() == writer.patches() == bench.ocs_patches()
            while b'"' not in data.split(b"REPT EVT PATCH", 1)[-1]:
                data += raw.recv(4096)
            assert re.search(rb'A  \d+ REPT EVT PATCH\r\n   "\d+(,\d+:ENT|:DLT)"', data)
        watcher.close()
        writer.close()
    finally:
        servers.stop()
        bench.stop()


def test_an_autonomous_message_since_the_last_change_makes_apply_read_the_switch_first(quirky):
    """The quirky peer sends a REPT before every reply: the confirming read is never the next plan's state."""
    switch = open_switch(_resource(quirky.server_address, password="secret", plan_from_confirmed_read=True),
                         timeout_s=5)
    try:
        switch.apply({3: 20})
        log = quirky.state["log"]
        del log[:]
        switch.apply({3: 21})
        assert [line.split(":")[0] for line in log] == ["RTRV-PATCH", "DLT-PATCH", "ENT-PATCH", "RTRV-PATCH"], log
        assert quirky.state["patches"] == {3: 21}
    finally:
        switch.close()
