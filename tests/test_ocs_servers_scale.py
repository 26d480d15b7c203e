"""The emulated TL1 and SCPI servers serve many clients from one event loop: no thread per connection,
every one of 200 concurrent clients answered, and a slow, silent or non-reading client delays nobody."""
from __future__ import annotations

import dataclasses
import socket
import threading
import time

import pytest

from devices.emulated.hostile_peer import connect_crowd, read_all
from devices.emulated.ocs_server import OcsServers
from devices.emulated.physics import OpticalBench
from devices.emulated.profile import Delay, load_profile

CLIENTS = 200


@pytest.fixture(scope="module")
def servers():
    profile = load_profile("instant")
    slow = dataclasses.replace(profile, ocs={"switch": Delay.fixed(1.0), "dark": Delay.fixed(0.0)})
    bench = OpticalBench(slow).start()
    servers = OcsServers(bench, pty=False).start()
    yield servers
    servers.stop()
    bench.stop()


@pytest.mark.parametrize("protocol", ["tl1", "scpi"])
def test_200_concurrent_clients_answered_without_a_thread_each(servers, protocol):
    address = servers.tl1_address if protocol == "tl1" else servers.scpi_address
    query, done = {
        "tl1": (b"ACT-USER::admin:1::root;RTRV-NETYPE:::2:;", lambda d: b"M  2 COMPLD" in d and d.endswith(b";\r\n")),
        "scpi": (b"*IDN?\n", lambda d: d.endswith(b"\n")),
    }[protocol]
    threads_before = set(threading.enumerate())
    silent = socket.create_connection(address, timeout=5)
    silent.sendall(b"RTRV-PAT" if protocol == "tl1" else b"*ID")  # half a command, then nothing
    clients = connect_crowd(address, CLIENTS)  # all at once: the listen backlog must hold them
    try:
        assert set(threading.enumerate()) <= threads_before  # 201 open connections, not one thread more
        for c in clients:
            c.sendall(query)
        replies = read_all(clients, done)
        answered = [c for c, data in replies.items() if done(data)]
        assert len(answered) == CLIENTS
        if protocol == "scpi":
            assert all(data.startswith(b"Polatis,") for data in replies.values())
        assert set(threading.enumerate()) <= threads_before
    finally:
        for c in clients + [silent]:
            c.close()


def test_a_client_waiting_for_its_mirrors_or_not_reading_delays_nobody(servers):
    """Client A's change settles after 1 s; B floods queries and never reads; C's query is answered
    before A's change completes (an order, not a speed)."""
    a = socket.create_connection(servers.scpi_address, timeout=5)
    b = socket.create_connection(servers.scpi_address, timeout=5)
    c = socket.create_connection(servers.scpi_address, timeout=5)
    try:
        a.sendall(b":OXC:SWIT:CONN:ADD (@1),(@17);*OPC?\n")
        b.setblocking(False)
        try:
            for _ in range(2000):
                b.send(b"*IDN?\n" * 50)
        except BlockingIOError:
            pass  # its buffers are full: the server must not wait for it
        time.sleep(0.05)  # A's command is in: its settle is under way
        c.sendall(b":OXC:SWITch:CONNect:STATe?\n")
        order: list[socket.socket] = []
        replies = read_all([a, c], lambda d: d.endswith(b"\n"), order=order)
        assert replies[a] == b"1\n" and replies[c].startswith(b"(@")  # the long form is understood
        assert order == [c, a]  # C was answered while A's mirrors were still moving
    finally:
        for s in (a, b, c):
            s.close()
        reset = socket.create_connection(servers.scpi_address, timeout=5)
        reset.sendall(b":OXC:SWIT:DISC:ALL;*OPC?\n")
        read_all([reset], lambda d: d.endswith(b"\n"))
        reset.close()


def _sent_and_acknowledged(sock: socket.socket, within_s: float = 30.0) -> None:
    """The peer's kernel has every byte `sock` sent (nothing left unacknowledged in its send queue)."""
    import fcntl
    import struct
    import termios

    end = time.monotonic() + within_s
    while struct.unpack("i", fcntl.ioctl(sock, termios.TIOCOUTQ, b"\0" * 4))[0]:
        assert time.monotonic() < end, "the loopback peer never acknowledged the command"
        time.sleep(0.001)


@pytest.mark.parametrize("protocol", ["tl1", "scpi"])
def test_the_switch_moves_when_a_command_arrives_not_when_the_servers_thread_gets_to_it(protocol):
    """The servers' thread is held busy (as a loaded machine holds it) while a change arrives: its mirror
    still starts moving at the kernel's receive time — after it was sent, before the thread was let go."""
    from devices.timing import now_ns

    profile = load_profile("instant")
    switch_ns = 2_000_000
    bench = OpticalBench(dataclasses.replace(profile, ocs={"switch": Delay.fixed(switch_ns / 1e9),
                                                           "dark": Delay.fixed(0.0)})).start()
    servers = OcsServers(bench, pty=False).start()
    egress = bench.ocs_size[0] + 1
    settled = []
    bench.on_mirror.append(lambda t, ingress, egress, done: done and settled.append(t))
    try:
        if protocol == "tl1":
            c = socket.create_connection(servers.tl1_address, timeout=30)
            c.sendall(b"ACT-USER::admin:1::root;")
            assert read_all([c], lambda d: d.endswith(b";\r\n"))[c].count(b"COMPLD") == 1
            change, done = f"ENT-PATCH::1,{egress}:2:;".encode(), (lambda d: b"M  2 " in d)
        else:
            c = socket.create_connection(servers.scpi_address, timeout=30)
            change, done = f":OXC:SWITch:CONNect:ADD (@1),(@{egress});*OPC?\n".encode(), (lambda d: d.endswith(b"\n"))
        held = threading.Event()
        servers._loop.call_soon_threadsafe(held.wait, 60)
        sent = now_ns()
        c.sendall(change)
        _sent_and_acknowledged(c)
        released = now_ns()
        held.set()
        reply = read_all([c], done)[c]
        c.close()
        assert b"COMPLD" in reply if protocol == "tl1" else reply == b"1\n"
        assert bench.ocs_patches() == {1: egress}  # (a reader runs what is due: the settle is in `settled`)
        (settle,) = settled
        assert sent <= settle - switch_ns < released
    finally:
        servers.stop()
        bench.stop()
