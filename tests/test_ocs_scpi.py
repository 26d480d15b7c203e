"""Polatis SCPI driver against the emulator over TCP, `socket://` and a pty serial line; shared state with
TL1; framing over `loop://`."""
from __future__ import annotations

import os
import socket
import tty

import pytest

from devices.emulated.ocs_server import OcsServers
from devices.emulated.physics import OpticalBench
from devices.emulated.profile import load_profile
from devices.errors import DeviceDenied, DeviceTimeout, PortNotAllowed
from devices.ocs import open_switch
from devices.ocs.lines import SerialLineChannel
from devices.ocs.scpi import parse_state
from devices.resources import OcsResource

N = 16
ALL_PORTS = frozenset(range(1, 2 * N + 1))


@pytest.fixture(scope="module")
def emulator():
    bench = OpticalBench(load_profile("instant"), seed=2).start()
    servers = OcsServers(bench).start()
    yield bench, servers
    servers.stop()
    bench.stop()


def _url(servers: OcsServers, transport: str) -> str:
    host, port = servers.scpi_address
    return {"tcp": f"tcp://{host}:{port}", "socket": f"socket://{host}:{port}", "pty": servers.pty_path}[transport]


def _open(url: str, allowed=ALL_PORTS, protocol="polatis-scpi", **extra):
    return open_switch(OcsResource(name="ocs1", protocol=protocol, url=url, size=(N, N),
                                   allowed_ports=frozenset(allowed), **extra), timeout_s=10)


@pytest.fixture(params=["tcp", "socket", "pty"])
def scpi(request, emulator):
    _, servers = emulator
    switch = _open(_url(servers, request.param), allowed=ALL_PORTS | {99})
    switch.execute(":OXC:SWIT:DISC:ALL")
    yield switch
    switch.close()


def test_identify_connect_list_power(scpi, emulator):
    bench, _ = emulator
    assert scpi.identify().startswith("Polatis,")
    timing = scpi.connect(1, 17)
    assert timing.sent_ns <= timing.completed_ns
    assert scpi.patches() == {1: 17} == bench.ocs_patches()
    bench.wait_idle()
    power = scpi.port_power([1, 17, 18])
    assert power[17] > -20 and power[18] <= -50 and set(power) == {1, 17, 18}


def test_switch_errors_surface_with_their_codes(scpi):
    scpi.connect(1, 17)
    cases = [(lambda: scpi.connect(99, 18), "-222", True),   # no such port
             (lambda: scpi.connect(2, 17), "-221", False),   # egress busy (may clear)
             (lambda: scpi.connect(1, 18), "-221", False),   # ingress busy
             (lambda: scpi.disconnect([3]), "-224", True)]   # no patch to delete
    for action, code, permanent in cases:
        with pytest.raises(DeviceDenied) as denied:
            action()
        assert (denied.value.code, denied.value.permanent) == (code, permanent), denied.value
    assert scpi.patches() == {1: 17}
    with pytest.raises(DeviceDenied) as denied:
        scpi.execute(":OXC:SWIT:FROB")
    assert (denied.value.code, denied.value.permanent) == ("-113", True)
    scpi.connect(2, 18)  # the error queue was drained: the next command succeeds cleanly


def test_apply_exclusive_moves_only_what_changes(scpi, emulator):
    bench, _ = emulator
    scpi.connect(1, 17)
    scpi.connect(2, 18)
    bench.wait_idle()  # the scheduler may still be replaying earlier moves on a loaded machine
    before = len(bench.ground_truth())
    scpi.apply({1: 18, 3: 19}, exclusive=True)
    assert scpi.patches() == {1: 18, 3: 19}
    scpi.apply({1: 18, 3: 19}, exclusive=True)  # idempotent: nothing moves
    bench.wait_idle()
    moved = [t for t in bench.ground_truth()[before:] if t["stage"] in ("mirror_settled", "mirror_released")]
    assert sorted((t["stage"], t["ocs_port"]) for t in moved) == [
        ("mirror_released", 17), ("mirror_released", 18), ("mirror_settled", 18), ("mirror_settled", 19)]


def test_begin_apply_returns_once_the_change_is_written_and_finish_reads_its_reply(scpi, emulator):
    """The harness goes on while the switch settles: `begin_apply` writes the change and reads nothing of
    its reply; `finish` reads it and returns what `apply` returns; the session is held until then."""
    bench, _ = emulator
    scpi.connect(1, 17)
    before, read = scpi.last_timing, scpi.patches()  # a read: `:CONN:ONLY` is planned from one
    pending = scpi.begin_apply({1: 18, 2: 19}, exclusive=True)
    assert pending.sent_ns == scpi._channel.last_write[0] and scpi._lock.locked()
    assert scpi.last_timing is not before and scpi.last_timing.completed_ns < pending.sent_ns  # the read's
    timing = pending.finish()
    assert timing.sent_ns == pending.sent_ns < timing.completed_ns and not scpi._lock.locked()
    assert read == {1: 17} and scpi.patches() == {1: 18, 2: 19}
    # outside the allowlist a SUB then an ADD: the first is begin's write, the ADD waits for its reply
    switch = _open(_url(emulator[1], "tcp"), allowed=ALL_PORTS - {16, 32})
    try:
        scpi.connect(16, 32)
        pending = switch.begin_apply({1: 19, 3: 18})
        assert switch._channel.last_write[0] == pending.sent_ns and switch._lock.locked()
        timing = pending.finish()
        assert timing.sent_ns == pending.sent_ns and switch.patches() == {1: 19, 3: 18, 16: 32}
    finally:
        switch.close()


def test_apply_keeps_patches_outside_the_allowlist(emulator):
    bench, servers = emulator
    admin = _open(_url(servers, "tcp"))
    admin.execute(":OXC:SWIT:DISC:ALL")
    admin.connect(9, 25)  # someone else's patch
    limited = _open(_url(servers, "tcp"), allowed={1, 2, 17, 18})
    try:
        limited.apply({1: 17, 2: 18}, exclusive=True)  # cannot use :CONN:ONLY: it would drop 9->25
        assert limited.patches() == {1: 17, 2: 18, 9: 25}
        with pytest.raises(PortNotAllowed):
            limited.connect(9, 26)
        with pytest.raises(PortNotAllowed):
            limited.apply({1: 25})
        assert bench.ocs_patches() == {1: 17, 2: 18, 9: 25}
    finally:
        limited.close()
        admin.close()


def test_scpi_and_tl1_share_one_switch(emulator):
    _, servers = emulator
    scpi = _open(_url(servers, "pty"))
    host, port = servers.tl1_address
    tl1 = _open(f"tcp://{host}:{port}", protocol="polatis-tl1", user="admin", password="root")
    try:
        scpi.execute(":OXC:SWIT:DISC:ALL")
        tl1.connect(4, 20)
        assert scpi.patches() == {4: 20}
        scpi.apply({5: 21})
        assert tl1.patches() == {4: 20, 5: 21}
    finally:
        scpi.close()
        tl1.close()


def test_full_traverse_over_the_serial_line(emulator):
    """Over TCP the traverse runs for every protocol in tests/test_ocs_protocols.py."""
    _, servers = emulator
    switch = _open(_url(servers, "pty"))
    try:
        for ingress in range(1, N + 1):
            for egress in range(N + 1, 2 * N + 1):
                switch.apply({ingress: egress}, exclusive=True)
                assert switch.patches() == {ingress: egress}
    finally:
        switch.close()


def test_raw_scpi_forms(emulator):
    """Lowercase short forms, compound commands with a relative node, CR-only line ends."""
    _, servers = emulator
    with socket.create_connection(servers.scpi_address, timeout=5) as sock:
        sock.sendall(b":oxc:swit:disc:all\r:oxc:swit:conn:only (@1,2),(@17,18); stat?\r")
        assert sock.recv(100) == b"(@1,2),(@17,18)\n"
        sock.sendall(b":OXC:SWITch:CONNect:PORT? 18;*OPC?\n:syst:err?\n")
        data = b""
        while data.count(b"\n") < 2:
            data += sock.recv(100)
        assert data == b'"2";1\n0,"No error"\n'
        sock.sendall(b":oxc:swit:size?\r\n")
        assert sock.recv(100) == b"16,16\n"


def test_scpi_long_forms_in_any_case(emulator):
    """SCPI-99 keywords: the short or the long form, any case (`STATe?`, `ERRor?`); a form in between
    (`SWITC`) is an undefined header (-113), answered through the error queue, not by a hang."""
    _, servers = emulator
    with socket.create_connection(servers.scpi_address, timeout=5) as sock:
        def ask(text: bytes) -> bytes:
            sock.sendall(text + b"\n")
            data = b""
            while not data.endswith(b"\n"):
                data += sock.recv(100)
            return data

        assert ask(b":OXC:SWITch:CONNect:ONLY (@3),(@19);:OXC:SWITch:CONNect:STATe?") == b"(@3),(@19)\n"
        assert ask(b":oxc:switch:connect:state?") == ask(b":OXC:SWIT:CONN:STAT?") == b"(@3),(@19)\n"
        assert ask(b":SYSTem:ERRor?") == ask(b":system:error:next?") == b'0,"No error"\n'
        assert ask(b":OXC:SWITC:CONN:STAT?;:SYSTem:ERRor?").startswith(b'-113,"Undefined header')
        # a huge range is refused before anything is expanded
        assert ask(b":MON:POW? (@1:300000000);:SYST:ERR?").startswith(b'-224,"Illegal parameter value')


def test_pty_client_without_pyserial(emulator):
    """A client that opens the pty device itself and sends CRLF gets CRLF-terminated answers."""
    _, servers = emulator
    fd = os.open(servers.pty_path, os.O_RDWR | os.O_NOCTTY)
    try:
        tty.setraw(fd)
        os.write(fd, b"*idn?\r\n")
        data = b""
        while not data.endswith(b"\r\n"):
            data += os.read(fd, 100)
        assert data.startswith(b"Polatis,")
    finally:
        os.close(fd)


def test_parse_state_forms():
    assert parse_state("(@),(@)") == {}
    assert parse_state("(@1,2,3),(@19,18,22)") == {1: 19, 2: 18, 3: 22}
    assert parse_state("(@1:3),(@17:19)") == {1: 17, 2: 18, 3: 19}
    assert parse_state("(@1),(@17);(@2),(@18)") == {1: 17, 2: 18}


def test_loop_url_framing_and_silent_timeout():
    """pyserial's loop:// echoes: a line comes back whole; a missing terminator is a DeviceTimeout."""
    from devices.timing import Deadline

    channel = SerialLineChannel("loop://")
    try:
        channel.write_line(":oxc:swit:size?", eol="\r\n")
        _, line = channel.read_line(Deadline(2))
        assert line == ":oxc:swit:size?"
        channel._write(b"no-terminator")
        with pytest.raises(DeviceTimeout) as timeout:
            channel.read_line(Deadline(0.2))
        assert "no-terminator" in str(timeout.value)
    finally:
        channel.close()


def test_timeout_closes_the_untagged_stream():
    """SCPI replies carry no tag: after a timeout the driver refuses to reuse the stream."""
    import threading

    from devices.errors import TransportClosed

    listener = socket.create_server(("127.0.0.1", 0))
    accepted = []

    def answer_once():  # the error queue at connect, then silence
        conn, _ = listener.accept()
        accepted.append(conn)
        conn.recv(100)
        conn.sendall(b'0,"No error"\n')

    threading.Thread(target=answer_once, daemon=True).start()
    try:
        host, port = listener.getsockname()
        switch = open_switch(OcsResource(name="x", protocol="polatis-scpi", url=f"tcp://{host}:{port}",
                                         size=(N, N), allowed_ports=ALL_PORTS), timeout_s=0.2)
        with pytest.raises(DeviceTimeout):
            switch.identify()
        with pytest.raises(TransportClosed):
            switch.patches()
        switch.close()
    finally:
        listener.close()
        for conn in accepted:
            conn.close()
