"""Misbehaving peers (issue scenarios): every driver call ends in a DeviceError (or the right answer) within
its deadline, with bounded memory; autonomous messages are set aside wherever they arrive; a switch state
is checked before it is believed."""
from __future__ import annotations

import time
import tracemalloc
from pathlib import Path

import pytest

from devices.emulated.hostile_peer import Close, Flood, HostilePeer, Pause
from devices.errors import DeviceError, DeviceTimeout
from devices.ocs import open_switch
from devices.ocs.base import ImpossibleState, check_state
from devices.ocs.lines import MAX_LINE_BYTES, LineSplitter, LineTooLong
from devices.ocs.scpi import parse_state
from devices.resources import OcsResource

N = 16
TIMEOUT_S = 0.5
SLACK_S = 5.0  # a loaded machine may be late; the bound proves the deadline holds, not speed
MEMORY_LIMIT = 10 * 2**20


def _ctag(command: str) -> str:
    parts = command.split(":")
    return parts[3].strip() if len(parts) > 3 else "0"


def _tl1_reply(ctag: str, body: list[str] = (), status: str = "COMPLD") -> bytes:
    lines = ["", "", "   POLATIS 24-05-01 12:00:00", f"M  {ctag} {status}", *[f"   {b}" for b in body], ";"]
    return "\r\n".join(lines).encode() + b"\r\n"


def _switch(peer: HostilePeer, protocol: str):
    return open_switch(OcsResource(name="ocs1", protocol=protocol, url=peer.url(), size=(N, N),
                                   allowed_ports=frozenset(range(1, 2 * N + 1))), timeout_s=TIMEOUT_S)


def _scpi_respond(state):
    """A peer with an empty error queue and an identity that answers the state query with `state`
    (bytes or steps)."""
    def respond(command: str):
        if command.upper().startswith(":SYST:ERR?"):
            return [b'0,"No error"\n']
        if command.upper() == "*IDN?":
            return [b"Polatis,FAKE-16x16,000000,1.0\n"]
        if "STAT?" in command.upper():
            return [state] if isinstance(state, bytes) else state
        return []
    return respond


def _bounded(call):
    """Run `call`; return (result or exception, seconds, peak bytes allocated meanwhile)."""
    tracemalloc.start()
    try:
        base = tracemalloc.get_traced_memory()[0]
        tracemalloc.reset_peak()
        started = time.monotonic()
        try:
            outcome = call()
        except Exception as exc:  # the test asserts its type
            outcome = exc
        elapsed = time.monotonic() - started
        peak = tracemalloc.get_traced_memory()[1] - base
    finally:
        tracemalloc.stop()
    return outcome, elapsed, peak


# ---------------------------------------------------------------- TL1
@pytest.mark.parametrize("with_header", [True, False])
def test_tl1_rept_inside_a_reply_is_set_aside_and_the_reply_parsed(with_header):
    rept = (["   POLATIS 24-05-01 12:00:01"] if with_header else []) + [
        "A  12 REPT EVT PATCH", '   "2:DLT"', ";", "*C  13 REPT ALM EQPT",
        '   "PWR-1:CR,PWR,SA,05-01,12-00-01:\\"Power supply\\""', ";"]

    def respond(command):
        reply = _tl1_reply(_ctag(command), ['"1,17"']).decode().removesuffix(";\r\n")
        return [(reply + "\r\n".join(rept) + '\r\n   "3,19"\r\n;\r\n').encode()]

    with HostilePeer(respond, "tl1") as peer:
        switch = _switch(peer, "polatis-tl1")
        assert switch.patches() == {1: 17, 3: 19}
        events = switch.take_events()
        switch.close()
    assert [(e.kind, e.severity, e.tag) for e in events] == [("REPT EVT PATCH", "A", "12"),
                                                            ("REPT ALM EQPT", "*C", "13")]
    assert events[0].text == ('"2:DLT"',) and events[0].device == "ocs1" and events[0].t_ns > 0
    assert switch.take_events() == []


def test_tl1_autonomous_between_commands_and_before_the_reply():
    def respond(command):
        return [b"\r\n\n   POLATIS 24-05-01 12:00:00\r\n** 7 REPT ALM OTS\r\n   \"17:LOS,SA\"\r\n;\r\n",
                _tl1_reply(_ctag(command), ['"4,20"'])]

    with HostilePeer(respond, "tl1") as peer:
        switch = _switch(peer, "polatis-tl1")
        assert switch.patches() == {4: 20}
        assert switch.patches() == {4: 20}
        events = switch.take_events()
        switch.close()
    assert [(e.severity, e.tag, e.text) for e in events] == [("**", "7", ('"17:LOS,SA"',))] * 2


def test_tl1_huge_line_is_a_device_error_within_the_deadline_and_bounded():
    def respond(command):
        return [f"M  {_ctag(command)} COMPLD\r\n   \"".encode() + b"1" * 2**20 + b'",17"\r\n;\r\n']

    with HostilePeer(respond, "tl1") as peer:
        switch = _switch(peer, "polatis-tl1")
        outcome, elapsed, peak = _bounded(switch.patches)
        switch.close()
    assert isinstance(outcome, LineTooLong), outcome
    assert "RTRV-PATCH" in str(outcome) and "111" in str(outcome) and len(str(outcome)) < 600
    assert elapsed < TIMEOUT_S + SLACK_S and peak < MEMORY_LIMIT


def test_tl1_stream_without_end_of_line_stays_bounded():
    def respond(command):
        return [f"M  {_ctag(command)} COMPLD\r\n   \"".encode(), Flood(b"x" * 65536, 3.0)]

    with HostilePeer(respond, "tl1") as peer:
        switch = _switch(peer, "polatis-tl1")
        outcome, elapsed, peak = _bounded(switch.patches)
        switch.close()
    assert isinstance(outcome, DeviceError), outcome
    assert elapsed < TIMEOUT_S + SLACK_S and peak < MEMORY_LIMIT, (elapsed, peak)


def test_tl1_flood_of_lines_and_wrong_ctags_time_out_with_the_partial_reply():
    def respond(command):
        return [_tl1_reply(str(int(_ctag(command)) + 100), ['"1,17"']), Flood(b'   "5,21"\r\n' * 400, 6.0)]

    with HostilePeer(respond, "tl1") as peer:
        switch = _switch(peer, "polatis-tl1")
        switch.timeout_s = 2.0  # long enough for the flood to start on a loaded machine
        outcome, elapsed, peak = _bounded(switch.patches)
        switch.close()
    assert isinstance(outcome, DeviceTimeout), outcome
    assert '"5,21"' in str(outcome) and "RTRV-PATCH" in str(outcome)
    assert elapsed < TIMEOUT_S + SLACK_S and peak < MEMORY_LIMIT, (elapsed, peak)


@pytest.mark.parametrize("body, what", [
    (['"1,17"', '"2,17"'], "egress 17 fed by both ingress 1 and 2"),
    (['"1,17"', '"1,18"'], "ingress 1 connected twice"),
    (['"0,17"'], "ingress 0 out of range 1-16"),
    (['"1,999"'], "egress 999 out of range 17-32"),
    (['"1,' + "9" * 5000 + '"'], "malformed reply line"),
])
def test_tl1_impossible_state_is_not_believed(body, what):
    with HostilePeer(lambda command: [_tl1_reply(_ctag(command), body)], "tl1") as peer:
        switch = _switch(peer, "polatis-tl1")
        with pytest.raises(DeviceError) as error:
            switch.patches()
        switch.close()
    assert what in str(error.value)


# ---------------------------------------------------------------- SCPI
@pytest.mark.parametrize("state, what", [
    (b"(@a),(@b)\n", "is not a port or a range"),
    (b"(@1,2),(@17,17)\n", "egress 17 fed by both ingress 1 and 2"),
    (b"(@0,999),(@-5,70000)\n", "item '0' is not a range of ports within 1-32"),
    (b"(@2,3),(@-5,70000)\n", "item '-5' is not a port or a range"),
    (b"(@1,999),(@17,18)\n", "not a range of ports within 1-32"),
    (b"(@3),(@5)\n", "egress 5 out of range 17-32"),
    (b"(@1:30000000),(@17:30000016)\n", "not a range of ports within 1-32"),
    (b"(@1,2),(@17)\n", "differ in length"),
])
def test_scpi_impossible_or_unreadable_state_is_a_device_error(state, what):
    with HostilePeer(_scpi_respond(state)) as peer:
        switch = _switch(peer, "polatis-scpi")
        outcome, elapsed, peak = _bounded(switch.patches)
        switch.close()
    assert isinstance(outcome, DeviceError) and what in str(outcome), outcome
    assert elapsed < TIMEOUT_S + SLACK_S and peak < MEMORY_LIMIT


def test_scpi_huge_reply_and_endless_stream_are_bounded():
    for steps in ([b"(@" + b"1," * 2**19 + b"1),(@17)\n"], [b"(@1", Flood(b"1," * 32768, 3.0)]):
        with HostilePeer(_scpi_respond(steps)) as peer:
            switch = _switch(peer, "polatis-scpi")
            outcome, elapsed, peak = _bounded(switch.patches)
            switch.close()
        assert isinstance(outcome, LineTooLong), outcome
        assert elapsed < TIMEOUT_S + SLACK_S and peak < MEMORY_LIMIT, (elapsed, peak)


def test_tl1_flood_of_status_lines_is_bounded():
    """Issue 38, reproduction 4: a status line's error text joined the reply outside its bounds (1.3 GB)."""
    def respond(command):
        return [Flood(f"M  {_ctag(command)} DENY  IIAC {'x' * 60000}\r\n".encode() * 4, 3.0)]

    with HostilePeer(respond, "tl1") as peer:
        switch = _switch(peer, "polatis-tl1")
        switch.timeout_s = 2.0
        outcome, elapsed, peak = _bounded(switch.patches)
        switch.close()
    assert isinstance(outcome, DeviceError), outcome
    assert elapsed < 2.0 + SLACK_S and peak < MEMORY_LIMIT, (elapsed, peak)


def test_scpi_state_line_of_ranges_is_bounded():
    """Issue 38, reproduction 4: one 64 KiB state line of ranges expanded to millions of pairs before the
    1:1 check; a switch of N ingresses lists at most N cross-connects."""
    line = (b"(@1:16),(@17:32);" * 4000)[:60000].rpartition(b";")[0] + b"\n"
    with HostilePeer(_scpi_respond(line)) as peer:
        switch = _switch(peer, "polatis-scpi")
        outcome, elapsed, peak = _bounded(switch.patches)
        switch.close()
    assert isinstance(outcome, DeviceError) and "more than 16 cross-connects" in str(outcome), outcome
    assert peak < 2**20, peak


def test_scpi_error_queue_at_connect_and_unsolicited_lines_are_events():
    queue = [b'-350,"Queue overflow"\n', b'-222,"Data out of range"\n', b'0,"No error"\n']

    def respond(command):
        if command.upper().startswith(":SYST:ERR?"):
            return [queue.pop(0) if queue else b'0,"No error"\n']
        if command == "*IDN?":
            return [b"Polatis,X,1,2\n", b"STRAY LINE\n"]
        return []

    with HostilePeer(respond) as peer:
        switch = _switch(peer, "polatis-scpi")
        assert switch.identify() == "Polatis,X,1,2"
        time.sleep(0.05)  # the stray line arrives after the reply: found with the next command
        assert switch.identify() == "Polatis,X,1,2"
        events = switch.take_events()
        switch.close()
    assert [(e.kind, e.tag, e.text) for e in events[:3]] == [
        ("error-queue", "-350", ("Queue overflow",)), ("error-queue", "-222", ("Data out of range",)),
        ("unsolicited", "", ("STRAY LINE",))]


def test_scpi_peer_that_drops_the_connection_or_sends_garbage():
    for steps in ([Close()], [b"\x00\x00\xff\xfe garbage \x00\n"], [Pause(2.0)]):
        with HostilePeer(_scpi_respond(steps)) as peer:
            switch = _switch(peer, "polatis-scpi")
            outcome, elapsed, _ = _bounded(switch.patches)
            switch.close()
        assert isinstance(outcome, DeviceError), outcome
        assert elapsed < TIMEOUT_S + SLACK_S


# ---------------------------------------------------------------- pure checks
def test_check_state_oracle():
    assert check_state([(1, 17), (2, 18)], (16, 16), "x") == {1: 17, 2: 18}
    assert check_state([], (16, 16), "x") == {}
    with pytest.raises(ImpossibleState, match="egress 18 fed by both"):
        check_state([(1, 18), (2, 18)], (16, 16), "x")
    with pytest.raises(ImpossibleState, match="egress 16 out of range 17-32"):
        check_state([(1, 16)], (16, 16), "x")
    assert check_state([(40, 90)], (0, 0), "x") == {40: 90}  # size unknown: only ports >= 1


def test_parse_state_expands_ranges_only_within_the_switch():
    assert parse_state("(@1:3),(@17:19)", (16, 16)) == {1: 17, 2: 18, 3: 19}
    with pytest.raises(ImpossibleState):
        parse_state("(@1:30000000),(@17:30000016)")  # size unknown: still capped, nothing expanded


def test_splitter_cuts_a_long_line_and_goes_on():
    splitter = LineSplitter()
    out = splitter.feed(b"a\r" + b"x" * (MAX_LINE_BYTES + 10)) + splitter.feed(b"y" * 10**6 + b"\nb\r\n")
    assert out[0] == "a" and len(out[1]) == MAX_LINE_BYTES and out[2] == "b"
    assert type(out[1]).__name__ == "CutLine" and splitter.pending == ""


# ---------------------------------------------------------------- end to end
@pytest.fixture(scope="module")
def emulated_hosts(tmp_path_factory):
    """Real emulated hosts (SSH, agent): the run's preflight must find them, so the switch is what stops it."""
    from devices.emulated.bench import EmulatedBench
    from devices.emulated.profile import load_profile

    bench = EmulatedBench(load_profile("instant"), seed=1, workdir=tmp_path_factory.mktemp("bench"))
    bench.start()
    yield bench
    bench.stop()


@pytest.mark.parametrize("state, what", [(b"(@a),(@b)\n", "channel list item 'a' is not a port"),
                                         (b"(@1,2),(@17,17)\n", "egress 17 fed by both ingress 1 and 2")])
def test_harness_run_stops_on_an_impossible_snapshot_and_touches_nothing(tmp_path, capsys, emulated_hosts,
                                                                         state, what):
    import yaml

    from harness.cli import main

    with HostilePeer(_scpi_respond(state)) as peer:
        inventory = yaml.safe_load(Path(emulated_hosts.inventory_path).read_text())
        inventory["ocs"]["ocs1"] = {**inventory["ocs"]["ocs1"], "protocol": "polatis-scpi", "url": peer.url()}
        for key in ("user", "password_env"):
            inventory["ocs"]["ocs1"].pop(key, None)
        path = tmp_path / "bench.yaml"
        path.write_text(yaml.safe_dump(inventory))
        playbook = Path(__file__).resolve().parents[1] / "playbooks" / "turnaround.yaml"
        code = main(["run", str(playbook), "--bench", str(path), "--cycles", "1",
                     "--out", str(tmp_path / "runs"), "-q"])
    err = capsys.readouterr().err
    stopped = [line for line in err.splitlines() if "run stopped" in line]
    assert code == 1 and len(stopped) == 1 and what in stopped[0] and "Traceback" not in err, err
    assert ":OXC:SWIT:CONN:STAT?" in peer.commands  # the state was read, and nothing was changed:
    assert not [c for c in peer.commands if any(verb in c.upper() for verb in
                                                (":ADD", ":ONLY", ":SUB", ":DISC", "*RST"))], peer.commands


def test_guard_records_the_switch_s_own_messages_with_their_time(tmp_path):
    """A REPT before every reply: the CircuitGuard appends each to ocs_events.jsonl (snapshot, apply,
    restore), with the harness time it arrived."""
    import json

    from harness.bench.circuits import CircuitGuard

    patches: dict[int, int] = {}
    atag = iter(range(1, 100))

    def respond(command):
        verb, _, aid = (command.split(":") + ["", "", ""])[:3]
        if verb == "ENT-PATCH":
            ins, outs = (side.split("&") for side in aid.split(","))
            patches.update((int(i), int(e)) for i, e in zip(ins, outs))
        elif verb == "DLT-PATCH":
            for i in aid.split("&"):
                patches.pop(int(i), None)
        body = [f'"{i},{e}"' for i, e in sorted(patches.items())] if verb == "RTRV-PATCH" else []
        rept = f"\r\n\n   POLATIS 24-05-01 12:00:00\r\n** {next(atag)} REPT ALM OTS\r\n   \"17:LOS,SA\"\r\n;\r\n"
        return [rept.encode(), _tl1_reply(_ctag(command), body)]

    with HostilePeer(respond, "tl1") as peer:
        switch = _switch(peer, "polatis-tl1")
        started = time.monotonic_ns()
        guard = CircuitGuard("ocs1", switch, snapshot_path=None, resuming=False,
                             events_path=tmp_path / "ocs_events.jsonl")
        guard.apply({1: 17})
        assert guard.restore().restored and patches == {}
        switch.close()
    records = [json.loads(line) for line in (tmp_path / "ocs_events.jsonl").read_text().splitlines()]
    assert [r["tag"] for r in records] == [str(k) for k in range(1, len(records) + 1)]
    assert len(records) == guard.events_recorded >= 5  # snapshot, apply (read, add, confirm), restore
    assert all(r["ocs"] == "ocs1" and r["severity"] == "**" and r["kind"] == "REPT ALM OTS"
               and r["text"] == ['"17:LOS,SA"'] and r["t_ns"] >= started for r in records)
