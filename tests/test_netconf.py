"""Polatis NETCONF: the emulated server on the wire (raw SSH client, both framings, rpc-error), the driver
(host keys, old model revision, faults, settle-time replies), and users' tools (`harness emulate`,
`harness ocs`, a plain ncclient script) against it."""
from __future__ import annotations

import dataclasses
import os
import re
import subprocess
import sys
import xml.etree.ElementTree as ET
from pathlib import Path

import paramiko
import pytest
import yaml

from devices.emulated.netconf_server import NetconfServer
from devices.emulated.ocs_server import OcsServers
from devices.emulated.physics import OpticalBench
from devices.emulated.profile import Delay, load_profile
from devices.errors import DeviceDenied, DeviceError, DeviceTimeout, TransportClosed
from devices.ocs import Endpoint, OcsConfigError, open_switch, parse_url
from devices.ocs.registry import OcsProtocol, register_protocol
from devices.resources import OcsResource
from devices.timing import now_ns
from harness.cli import main

N = 16
ALL_PORTS = frozenset(range(1, 2 * N + 1))
NC = "{urn:ietf:params:xml:ns:netconf:base:1.0}"
OS = "{http://www.polatis.com/yang/optical-switch}"
ROOT = Path(__file__).resolve().parents[1]


@pytest.fixture(scope="module")
def emulator():
    bench = OpticalBench(load_profile("instant"), seed=6).start()
    servers = OcsServers(bench, pty=False).start()
    yield bench, servers
    servers.stop()
    bench.stop()


@pytest.fixture()
def server(emulator, request):
    bench, servers = emulator
    bench.ocs_apply({}, list(bench.ocs_patches()))
    servers.faults.clear()
    with NetconfServer(servers, **getattr(request, "param", {})) as nc:
        yield nc
    servers.faults.clear()


def _open(nc: NetconfServer, url: str | None = None, password="root", timeout_s=10.0):
    return open_switch(OcsResource(name="ocs1", protocol="polatis-netconf", url=url or nc.url, size=(N, N),
                                   allowed_ports=ALL_PORTS | {99}, user="admin", password=password),
                       timeout_s=timeout_s)


# ---------------------------------------------------------------- the wire, from a raw SSH client
class RawNetconf:
    """Speaks RFC 6242 by hand over a paramiko `netconf` subsystem channel."""

    def __init__(self, nc: NetconfServer, base11: bool):
        self.client = paramiko.SSHClient()
        self.client.load_host_keys(str(nc.known_hosts_path))
        self.client.connect("127.0.0.1", nc.port, username="admin", password="root", look_for_keys=False,
                            allow_agent=False, timeout=10)
        self.channel = self.client.get_transport().open_session()
        self.channel.settimeout(10)
        self.channel.invoke_subsystem("netconf")
        self.buffer = b""
        self.hello = ET.fromstring(self._until(b"]]>]]>"))
        caps = ["urn:ietf:params:netconf:base:1.0"] + (["urn:ietf:params:netconf:base:1.1"] if base11 else [])
        self.channel.sendall(("<hello xmlns='urn:ietf:params:xml:ns:netconf:base:1.0'><capabilities>"
                              + "".join(f"<capability>{c}</capability>" for c in caps)
                              + "</capabilities></hello>]]>]]>").encode())
        offered = [c.text for c in self.hello.iter(NC + "capability")]
        self.chunked = base11 and "urn:ietf:params:netconf:base:1.1" in offered

    def _until(self, end: bytes) -> bytes:
        while end not in self.buffer:
            data = self.channel.recv(65536)
            assert data, "server closed the channel"
            self.buffer += data
        message, _, self.buffer = self.buffer.partition(end)
        return message

    def rpc(self, body: str, message_id: str | None = "1", chunks: int = 1) -> ET.Element:
        attr = f' message-id="{message_id}"' if message_id is not None else ""
        payload = f'<rpc xmlns="urn:ietf:params:xml:ns:netconf:base:1.0"{attr}>{body}</rpc>'.encode()
        if self.chunked:  # split into `chunks` chunks, as RFC 6242 §4.2 allows
            size = -(-len(payload) // chunks)
            framed = b"".join(b"\n#%d\n%s" % (len(payload[i:i + size]), payload[i:i + size])
                              for i in range(0, len(payload), size)) + b"\n##\n"
        else:
            framed = payload + b"]]>]]>"
        self.channel.sendall(framed)
        if not self.chunked:
            return ET.fromstring(self._until(b"]]>]]>"))
        reply = self._until(b"\n##\n")
        match = re.fullmatch(rb"\n#(\d+)\n(.*)", reply, re.S)
        assert match and int(match.group(1)) == len(match.group(2)), reply[:80]
        return ET.fromstring(match.group(2))

    def close(self):
        self.client.close()


def _error(reply: ET.Element) -> tuple[str, str]:
    error = reply.find(NC + "rpc-error")
    assert error is not None, ET.tostring(reply)
    assert error.findtext(NC + "error-severity") == "error"
    return error.findtext(NC + "error-type"), error.findtext(NC + "error-tag")


@pytest.mark.parametrize("server, chunked", [({}, True), ({"base11": False}, False)], indirect=["server"])
def test_wire_framing_hello_get_and_rpc_errors(server, chunked, emulator):
    bench = emulator[0]
    raw = RawNetconf(server, base11=True)
    try:
        caps = [c.text for c in raw.hello.iter(NC + "capability")]
        assert "http://www.polatis.com/yang/optical-switch?module=optical-switch&revision=2018-03-22" in caps
        assert raw.chunked == chunked and raw.hello.findtext(NC + "session-id").isdigit()
        edit = ("<edit-config><target><running/></target><config><cross-connects xmlns="
                "'http://www.polatis.com/yang/optical-switch'>{}</cross-connects></config></edit-config>")
        ok = raw.rpc(edit.format("<pair><ingress>3</ingress><egress>19</egress></pair>"), "7", chunks=3)
        assert ok.get("message-id") == "7" and ok.find(NC + "ok") is not None
        assert bench.ocs_patches() == {3: 19}
        data = raw.rpc("<get/>").find(NC + "data")
        assert [c.tag.removeprefix(OS) for c in data] == ["product-information", "port-config", "opm-power",
                                                          "cross-connects"]
        assert len(data.findall(f"{OS}opm-power/{OS}port")) == 2 * N
        selected = raw.rpc("<get><filter type='subtree'><opm-power xmlns='http://www.polatis.com/yang/optical-"
                           "switch'><port><port-id>19</port-id></port></opm-power></filter></get>")
        ports = selected.findall(f"{NC}data/{OS}opm-power/{OS}port")
        assert [p.findtext(OS + "port-id") for p in ports] == ["19"] and float(ports[0].findtext(OS + "power"))
        config = raw.rpc("<get-config><source><running/></source></get-config>").find(NC + "data")
        assert [c.tag.removeprefix(OS) for c in config] == ["port-config", "cross-connects"]  # no state data
        assert config.find(f"{OS}port-config/{OS}port/{OS}status") is None
        # (error-type, error-tag) as netconfd answers the same requests (tests/test_netconf_peer.py compares
        # every field against a running netconfd); in-use: the switch's own refusal, which netconfd lacks
        for body, expected in [
                (edit.format("<pair><ingress>99</ingress><egress>20</egress></pair>"),
                 ("protocol", "invalid-value")),
                (edit.format("<pair><ingress>x</ingress><egress>20</egress></pair>"), ("protocol", "bad-element")),
                (edit.format("<pair><ingress>4</ingress><egress>19</egress></pair>"), ("application", "in-use")),
                (edit.format("<pair><ingress>4</ingress></pair>"), ("application", "data-missing")),
                (edit.format("<pair xmlns:nc='urn:ietf:params:xml:ns:netconf:base:1.0' nc:operation='delete'>"
                             "<ingress>5</ingress></pair>"), ("application", "data-missing")),
                (edit.format("<pair operation='create'><ingress>3</ingress><egress>20</egress></pair>"),
                 ("application", "data-exists")),
                (edit.format("<pair><ingress>4</ingress><egress>20</egress><foo/></pair>"),
                 ("protocol", "unknown-element")),
                ("<edit-config><target><running/></target><config><opm-power xmlns='http://www.polatis.com/"
                 "yang/optical-switch'/></config></edit-config>", ("application", "access-denied")),
                ("<edit-config><target><running/></target><config><system xmlns='urn:x'/></config>"
                 "</edit-config>", ("protocol", "unknown-namespace")),
                ("<get-config><source><candidate/></source></get-config>", ("protocol", "invalid-value")),
                ("<commit/>", ("protocol", "operation-not-supported")),
                ("<frobnicate/>", ("rpc", "unknown-element")),
                ("<get/", ("rpc", "malformed-message"))]:
            assert _error(raw.rpc(body)) == expected, body
        assert _error(raw.rpc("<get/>", message_id=None)) == ("rpc", "missing-attribute")
        assert bench.ocs_patches() == {3: 19}  # refused edits change nothing, all or nothing
        ok = raw.rpc("<close-session/>")
        assert ok.find(NC + "ok") is not None
    finally:
        raw.close()


def test_stock_openssh_client_speaks_to_the_netconf_subsystem(server, tmp_path):
    import shutil

    if shutil.which("ssh") is None:
        pytest.skip("no OpenSSH client on this machine (.ci/run installs openssh-client)")
    askpass = tmp_path / "askpass"
    askpass.write_text("#!/bin/sh\necho root\n")
    askpass.chmod(0o700)
    env = dict(os.environ, SSH_ASKPASS=str(askpass), SSH_ASKPASS_REQUIRE="force", DISPLAY=":0")
    base = "urn:ietf:params:xml:ns:netconf:base:1.0"
    session = (f"<hello xmlns='{base}'><capabilities><capability>urn:ietf:params:netconf:base:1.0</capability>"
               f"</capabilities></hello>]]>]]><rpc message-id='1' xmlns='{base}'><get-config><source><running/>"
               f"</source></get-config></rpc>]]>]]><rpc message-id='2' xmlns='{base}'><close-session/></rpc>]]>]]>")
    out = subprocess.run(["ssh", "-o", f"UserKnownHostsFile={server.known_hosts_path}", "-o",
                          "StrictHostKeyChecking=yes", "-o", "PreferredAuthentications=password", "-p",
                          str(server.port), "-s", "admin@127.0.0.1", "netconf"],
                         input=session, capture_output=True, text=True, env=env, timeout=60)
    assert out.returncode == 0, out.stderr
    messages = out.stdout.split("]]>]]>")
    assert len(messages) == 4 and messages[-1] == ""  # hello, two replies, nothing unframed
    assert '<cross-connects xmlns="http://www.polatis.com/yang/optical-switch"' in messages[1]
    assert ET.fromstring(messages[2]).find(NC + "ok") is not None


def test_edit_config_is_one_transaction_and_ok_waits_for_the_mirrors():
    profile = load_profile("instant")
    slow = dataclasses.replace(profile, ocs={"switch": Delay.fixed(0.05), "dark": Delay.fixed(0.0)})
    bench = OpticalBench(slow).start()
    servers = OcsServers(bench, pty=False).start()
    try:
        with NetconfServer(servers) as nc:
            switch = _open(nc)
            try:
                switch.apply({1: 17, 2: 18})
                bench.wait_idle()
                before = len(bench.ground_truth())
                timing = switch.apply({1: 18, 2: 17})  # a swap: one edit-config (delete-free merges)
                assert timing.completed_ns - timing.sent_ns >= 0.05e9
                bench.wait_idle()
                settled = [t for t in bench.ground_truth()[before:] if t["stage"] == "mirror_settled"]
                assert sorted(t["ocs_port"] for t in settled) == [17, 18]
                assert all(timing.sent_ns <= t["t_ns"] <= timing.completed_ns for t in settled)
                assert switch.patches() == {1: 18, 2: 17}
            finally:
                switch.close()
    finally:
        servers.stop()
        bench.stop()


def test_host_keys_are_checked_and_logins_refused(server, tmp_path):
    other = tmp_path / "known_hosts"
    key = paramiko.ECDSAKey.generate()
    other.write_text(f"[127.0.0.1]:{server.port} {key.get_name()} {key.get_base64()}\n")
    for url in (f"ssh://127.0.0.1:{server.port}?known_hosts={other}",  # a different key
                f"ssh://127.0.0.1:{server.port}?known_hosts={tmp_path / 'missing'}"):
        with pytest.raises((DeviceError, OcsConfigError)):
            _open(server, url=url, timeout_s=5)
    with pytest.raises(DeviceError, match="uthentication"):
        _open(server, password="wrong", timeout_s=5)


@pytest.mark.parametrize("server", [{"revision": "2017-02-09", "base11": False}], indirect=True)
def test_old_model_revision_uses_pairs(server, emulator):
    switch = _open(server)
    try:
        assert switch.pair_tag == "pairs"
        switch.apply({5: 21, 6: 22})
        assert switch.patches() == {5: 21, 6: 22} == emulator[0].ocs_patches()
    finally:
        switch.close()


@pytest.mark.parametrize("server", [{"target": "candidate"}], indirect=True)
def test_a_candidate_only_server_is_changed_by_commit_under_lock_and_left_clean_after_a_refusal(server, emulator):
    bench, servers = emulator
    switch = _open(server)
    try:
        assert switch.target == "candidate"
        switch.apply({1: 17, 2: 18})
        assert bench.ocs_patches() == {1: 17, 2: 18}
        with pytest.raises(DeviceDenied) as denied:
            switch.connect(3, 99)  # refused at the edit of the candidate
        assert denied.value.code == "invalid-value" and denied.value.permanent
        servers.faults.arm("deny")  # the commit refused: worth a retry, and nothing of ours left behind
        with pytest.raises(DeviceDenied) as denied:
            switch.apply({3: 19})
        assert denied.value.code == "in-use" and not denied.value.permanent
        assert server._candidate is None and bench.ocs_patches() == {1: 17, 2: 18}
        other = RawNetconf(server, base11=True)  # another session edits the candidate and does not commit
        try:
            edit = ("<edit-config><target><candidate/></target><config><cross-connects xmlns='http://www.polatis"
                    ".com/yang/optical-switch'><pair><ingress>7</ingress><egress>23</egress></pair></cross-connects>"
                    "</config></edit-config>")
            assert other.rpc(edit).find(NC + "ok") is not None
            with pytest.raises(DeviceDenied) as denied:
                switch.apply({3: 19})  # its lock is refused: our commit would carry the other edit
            assert denied.value.code == "resource-denied" and not denied.value.permanent
        finally:
            other.close()  # a session's uncommitted changes stay (it held no lock) ...
        assert server._candidate is not None
        cleaner = RawNetconf(server, base11=True)
        assert cleaner.rpc("<discard-changes/>").find(NC + "ok") is not None  # ... until discarded
        cleaner.close()
        switch.apply({3: 19})
        assert switch.patches() == {1: 17, 2: 18, 3: 19} == bench.ocs_patches()
    finally:
        switch.close()


@pytest.mark.parametrize("server", [{"target": None}], indirect=True)
def test_a_server_that_cannot_be_written_is_refused_before_sending(server, emulator):
    bench, servers = emulator
    switch = _open(server)
    try:
        assert switch.target is None
        servers.faults.arm("deny", count=1000)  # a tripwire: an edit-config fires it
        fired = len(servers.faults.fired)
        for change in (lambda: switch.apply({1: 17}), lambda: switch.connect(1, 17)):
            with pytest.raises(DeviceDenied, match="neither :writable-running nor :candidate") as denied:
                change()
            assert denied.value.permanent
        assert len(servers.faults.fired) == fired and bench.ocs_patches() == {} == switch.patches()
    finally:
        servers.faults.clear()
        switch.close()


def test_deny_is_not_permanent_and_silence_times_out_then_reconnects(server, emulator):
    bench, servers = emulator
    switch = _open(server, timeout_s=1.0)
    try:
        servers.faults.arm("deny")
        with pytest.raises(DeviceDenied) as denied:
            switch.apply({1: 17})
        assert denied.value.code == "in-use" and not denied.value.permanent
        with pytest.raises(DeviceDenied) as denied:
            switch.connect(1, 99)
        assert denied.value.code == "invalid-value" and denied.value.permanent
        servers.faults.arm("silence")
        with pytest.raises(DeviceTimeout):
            switch.apply({1: 17})
        switch.reconnect()
        switch.apply({1: 17})
        assert switch.patches() == {1: 17} == bench.ocs_patches()
    finally:
        switch.close()


def test_begin_apply_returns_once_the_edit_config_is_written_and_finish_awaits_its_reply(server, emulator):
    """The edit-config is on the wire when begin_apply returns, stamped at the session's write; its reply is
    finish's: a switch that never answers makes finish, not begin_apply, time out. Otherwise finish gives
    what apply gives, and the session is free again after it."""
    bench, servers = emulator
    switch = _open(server, timeout_s=1.0)
    try:
        servers.faults.arm("silence")
        before = now_ns()
        pending = switch.begin_apply({3: 19})  # raised DeviceTimeout here when the reply was awaited first
        assert before < pending.sent_ns == switch._sent_ns < now_ns()
        with pytest.raises(DeviceTimeout):
            pending.finish()
        switch.reconnect()
        pending = switch.begin_apply({3: 19, 4: 20})
        timing = pending.finish()
        assert timing.sent_ns == pending.sent_ns and timing.completed_ns >= timing.sent_ns
        assert switch.patches() == {3: 19, 4: 20} == bench.ocs_patches()
    finally:
        switch.close()


def test_requests_are_written_by_the_caller_not_when_ncclient_s_reader_loop_next_wakes(server, emulator,
                                                                                       monkeypatch):
    """ncclient queues a request for its reader loop, which writes it when its select next times out (TICK):
    with a 30 s TICK, every request here would wait for it; written by the caller, each is answered at once.
    (The one request at connect goes through the queue on purpose, after our hello: `_hello_sent`.)"""
    from ncclient.transport import session as nc_session

    switch = _open(server, timeout_s=5.0)
    monkeypatch.setattr(nc_session, "TICK", 30.0)  # read by the loop at its next select
    switch.patches()  # the loop's current select may still be the short one: from here on every select is 30 s
    try:
        for mapping in ({7: 23}, {7: 24, 8: 23}, {}):
            switch.apply(mapping, exclusive=True)  # a read, then an edit-config: each would time out at 5 s
            assert switch.patches() == mapping == emulator[0].ocs_patches()
    finally:
        switch.close()


def test_an_ncclient_without_the_internals_the_driver_stamps_through_is_refused_clearly(server, monkeypatch):
    """A future ncclient that renamed what the driver frames and stamps the wire with (here its 1.1 framing's end
    delimiter): a DeviceError at connect naming the version and what is missing — not an AttributeError at the
    first change — and the session closed."""
    from ncclient.transport import session as nc_session
    from ncclient.transport import ssh as nc_ssh

    monkeypatch.delattr(nc_session, "END_DELIM")
    closed, close = [], nc_ssh.SSHSession.close
    monkeypatch.setattr(nc_ssh.SSHSession, "close", lambda self: (closed.append(self), close(self)))
    with pytest.raises(DeviceError, match=r"ncclient \S+ lacks ncclient.transport.session.END_DELIM, which this "
                                          r"driver stamps the wire through"):
        _open(server, timeout_s=5.0)
    assert len(closed) == 1 and not closed[0].connected


def test_line_noise_drops_the_session_and_replies_are_validated(server, emulator, monkeypatch):
    bench, servers = emulator
    switch = _open(server, timeout_s=2.0)
    try:
        servers.faults.arm("garbage", changes_only=False)  # SSH's MAC fails: sshd drops the connection
        with pytest.raises(TransportClosed):
            switch.patches()
        switch.reconnect()
        bench.ocs_apply({7: 23})

        def lying(raw: bytes, session_id: int):  # answers every get-config with a pair it cannot have
            mid = ET.fromstring(raw).get("message-id")
            return (f'<rpc-reply xmlns="urn:ietf:params:xml:ns:netconf:base:1.0" message-id="{mid}"><data>'
                    f'<cross-connects xmlns="http://www.polatis.com/yang/optical-switch"><pair><ingress>7'
                    f'</ingress><egress>3</egress></pair></cross-connects></data></rpc-reply>').encode(), False

        monkeypatch.setattr(server, "_handle", lying)
        with pytest.raises(DeviceError, match="egress 3 out of range"):
            switch.patches()
    finally:
        switch.close()


def test_urls_and_duplicate_registration(tmp_path, capsys, monkeypatch):
    assert parse_url("ssh://10.0.0.5", "polatis-netconf") == Endpoint("ssh", "10.0.0.5", 830)
    assert parse_url("ssh://[::1]:2830?known_hosts=kh", "polatis-netconf") == Endpoint(
        "ssh", "::1", 2830, options=(("known_hosts", "kh"),))
    for url in ("tcp://h:830", "/dev/ttyUSB0", "ssh://:830"):
        with pytest.raises(OcsConfigError):
            parse_url(url, "polatis-netconf")
    with pytest.raises(OcsConfigError):
        parse_url("ssh://h", "polatis-tl1")
    inventory = tmp_path / "bench.yaml"  # a TL1 URL under a NETCONF switch: refused where it is written
    inventory.write_text("bench: {name: lab, emulated: false}\nocs:\n  ocs1:\n    protocol: polatis-netconf\n"
                         "    url: tcp://192.0.2.10:3082\n    size: [16, 16]\n    allowed_ports: ['1-2', '17-18']\n"
                         "    user: admin\n    password_env: OCS_PASSWORD\nhosts: {}\n")
    monkeypatch.setenv("OCS_PASSWORD", "x")
    assert main(["validate", str(inventory)]) == 2
    err = capsys.readouterr().err.strip()
    assert f"{inventory}:5: ocs.ocs1.url:" in err and "ssh://HOST:PORT" in err and len(err.splitlines()) == 1
    with pytest.raises(ValueError, match="already registered"):
        register_protocol(OcsProtocol(name="polatis-netconf", driver="x:y", schemes=("ssh",), default_port=1,
                                      permanent="x:y", emulator="x:y"))


# ---------------------------------------------------------------- users' tools
@pytest.fixture(scope="module")
def emulate(tmp_path_factory):
    """`harness emulate --protocol polatis-netconf` in its own process, as a user starts it."""
    tmp = tmp_path_factory.mktemp("emulate")
    inventory = tmp / "bench.yaml"
    proc = subprocess.Popen([sys.executable, "-m", "harness", "emulate", "--profile", "instant",
                             "--protocol", "polatis-netconf", "--inventory-out", str(inventory)],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, cwd=ROOT)
    first = proc.stdout.readline()  # printed once the inventory is completely written
    assert first.startswith("emulated bench"), first + proc.stderr.read()
    banner = [proc.stdout.readline() for _ in range(3)]
    assert banner[0].startswith("  OCS (polatis-netconf, in the inventory): NETCONF ssh://127.0.0.1:"), banner
    yield yaml.safe_load(inventory.read_text())["ocs"]["ocs1"], proc
    proc.terminate()
    assert proc.wait(timeout=30) == 0


def test_harness_ocs_and_an_ncclient_script_drive_the_emulator(emulate, capsys):
    ocs, proc = emulate
    assert ocs["protocol"] == "polatis-netconf" and ocs["url"].startswith("ssh://127.0.0.1:")
    base = ["ocs", "--url", ocs["url"], "--protocol", "polatis-netconf", "--user", ocs["user"],
            "--password", "root"]
    assert main(base + ["apply", "1:17", "2:18"]) == 0
    assert main(base + ["--json", "list"]) == 0
    assert capsys.readouterr().out.splitlines()[-1] == '{"1": 17, "2": 18}'
    assert main(base + ["identify"]) == 0
    assert capsys.readouterr().out.startswith("Polatis,EMU-16x16,")
    assert main(base + ["connect", "3", "17"]) == 1
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "in-use" in err[0]
    endpoint = parse_url(ocs["url"], "polatis-netconf")
    script = [sys.executable, str(ROOT / "examples" / "netconf_cross_connects.py"), endpoint.host,
              str(endpoint.port), ocs["user"], "--known-hosts", endpoint.option("known_hosts")]
    env = dict(os.environ, OCS_PASSWORD="root")
    out = subprocess.run(script + ["--delete", "2", "--connect", "1:19", "4:20"], capture_output=True,
                         text=True, env=env, timeout=60)
    assert out.returncode == 0, out.stderr
    lines = out.stdout.splitlines()
    assert lines[:2] == ["before: {1: 17, 2: 18}", "after: {1: 19, 4: 20}"]
    assert [line.split(":")[0] for line in lines[2:]] == ["port 1", "port 4", "port 19", "port 20"]
    assert main(base + ["--json", "list"]) == 0
    assert capsys.readouterr().out.splitlines()[-1] == '{"1": 19, "4": 20}'


def test_a_turnaround_run_on_an_emulated_netconf_switch(tmp_path, run_playbook):
    import pandas as pd

    # Mirrors that take milliseconds, as real ones do: with `instant` (zero dark time) one edit-config that
    # swaps two pairs leaves no light loss for any watch to see, on SCPI's atomic :CONN:ONLY as well.
    profile = tmp_path / "mems.yaml"
    profile.write_text(yaml.safe_dump({
        "name": "mems", "ocs": {"switch": {"dist": "uniform", "low_ms": 3, "high_ms": 6},
                                "dark": {"dist": "fixed", "ms": 0.2}},
        "nic": {"los_clear": {"dist": "fixed", "ms": 0.05}, "cdr_lock": {"dist": "fixed", "ms": 0.5},
                "phy_up": {"dist": "fixed", "ms": 2}, "port_active": {"dist": "fixed", "ms": 1},
                "link_down": {"dist": "fixed", "ms": 0.5}},
        "topology": {"hosts": 2, "nics_per_host": 2, "ocs_size": [8, 8]}}))
    path = tmp_path / "pb.yaml"
    path.write_text(yaml.safe_dump({"name": "t", "bench": "emulated:instant", "seed": 3, "cycles": 1, "steps": [
        {"type": "turnaround", "name": "measure", "cycle_timeout_s": 20, "clock_warmup_s": 0.3}]}))
    run = run_playbook(path, bench=f"emulated:{profile}?ocs=polatis-netconf")
    assert run.exit_code == 0, run
    (manifest,) = run.run_dir.rglob("manifest.json")
    events = run.events()
    completed = events[events.stage == "ocs_command_completed"]
    assert completed.cycle.nunique() == 1 and (events.stage == "port_active").any()
    bench_inventory = yaml.safe_load((manifest.parent / "bench" / "inventory.yaml").read_text()) \
        if (manifest.parent / "bench" / "inventory.yaml").exists() else None
    if bench_inventory is not None:
        assert bench_inventory["ocs"]["ocs1"]["protocol"] == "polatis-netconf"
    refused = run_playbook(path, bench="emulated:instant?ocs=cisco")
    assert refused.exit_code == 2 and "unknown switch protocol 'cisco'" in refused.error
