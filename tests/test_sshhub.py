"""The SSH hub (devices/sshhub.py): paramiko's loops as greenlets on one thread, sockets that wait on the hub
inside it and in the calling thread outside it, locks a greenlet takes without stopping the hub, and a harness
whose threads do not grow with its hosts."""
from __future__ import annotations

import json
import queue
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path

import paramiko
import pytest
import yaml

from devices.emulated.physics import OpticalBench
from devices.emulated.profile import load_profile
from devices.emulated.host.server import EmulatedHostServer
from devices.ssh import SshTransport
from devices.sshhub import Hub, HubLock, HubSocket, HubTransport
from devices.timing import Deadline, now_ns

ROOT = Path(__file__).resolve().parents[1]


@pytest.fixture(scope="module")
def hub():
    return Hub(name="test-hub")


def _in_hub(hub, fn) -> queue.Queue:
    """Run `fn` as a greenlet on `hub`; its result (or exception) arrives on the queue returned."""
    out: queue.Queue = queue.Queue()

    def body():
        try:
            out.put(fn())
        except BaseException as exc:  # noqa: BLE001 — handed to the test
            out.put(exc)

    hub.spawn(body)
    return out


def test_a_greenlet_recv_waits_on_the_hub_and_times_out_like_a_socket(hub):
    a, b = socket.socketpair()
    s = HubSocket(a, hub)
    s.settimeout(0.05)
    began = time.monotonic()
    got = _in_hub(hub, lambda: s.recv(10)).get(timeout=30)
    assert isinstance(got, socket.timeout) and time.monotonic() - began >= 0.05
    s.settimeout(None)
    pending = _in_hub(hub, lambda: s.recv(10))
    b.send(b"line\n")
    assert pending.get(timeout=30) == b"line\n"
    s.close()
    b.close()


def test_caught_up_is_a_time_before_which_everything_that_came_was_served(hub):
    """While the hub's thread is held up, its caught-up time stays before the hold; bytes that came meanwhile
    are served before it moves past their arrival."""
    a, b = socket.socketpair()
    s = HubSocket(a, hub)
    release, holding = threading.Event(), threading.Event()
    hub.call_soon(lambda: (holding.set(), release.wait(30)))
    assert holding.wait(30)
    held_from = now_ns()
    got = _in_hub(hub, lambda: s.recv(10))
    b.send(b"line\n")
    sent = now_ns()
    time.sleep(0.05)
    assert hub.caught_up_ns < held_from and got.empty()
    release.set()
    assert got.get(timeout=30) == b"line\n"
    deadline = Deadline(30)
    while hub.caught_up_ns <= sent:
        assert not deadline.expired()
        hub.call_soon(lambda: None)  # a round of the loop
        time.sleep(0.001)
    s.close()
    b.close()


def test_greenlets_waiting_on_a_socket_or_a_lock_held_elsewhere_do_not_hold_up_the_hub(hub):
    quiet_a, quiet_b = socket.socketpair()
    echo_a, echo_b = socket.socketpair()
    quiet, echo = HubSocket(quiet_a, hub), HubSocket(echo_a, hub)
    held = threading.Lock()
    lock = HubLock(held, hub)
    held.acquire()  # another thread (this one) holds it
    waiting_for_data = _in_hub(hub, lambda: quiet.recv(10))
    waiting_for_lock = _in_hub(hub, lambda: lock.acquire())
    echoed = _in_hub(hub, lambda: echo.send(echo.recv(10)))
    echo_b.send(b"ping")
    assert echoed.get(timeout=30) == 4 and echo_b.recv(10) == b"ping"  # served while the other two wait
    assert waiting_for_data.empty() and waiting_for_lock.empty()
    held.release()
    assert waiting_for_lock.get(timeout=30) is True
    _in_hub(hub, lock.release).get(timeout=30)
    quiet_b.send(b"late")
    assert waiting_for_data.get(timeout=30) == b"late"
    for s in (quiet, echo, quiet_b, echo_b):
        s.close()


def test_closing_from_another_thread_wakes_the_greenlet_and_the_hub_forgets_the_descriptor(hub):
    a, b = socket.socketpair()
    s = HubSocket(a, hub)
    fd = a.fileno()
    pending = _in_hub(hub, lambda: s.recv(10))
    time.sleep(0.01)  # let it wait (if it has not yet, it finds the socket closed: the same outcome)
    s.close()
    woke = pending.get(timeout=30)
    assert isinstance(woke, OSError)  # socket.timeout (paramiko then sees its packetizer closed) or EBADF
    assert _in_hub(hub, lambda: fd in hub._selector.get_map()).get(timeout=30) is False
    assert a.fileno() == -1  # closed on the hub
    b.close()


def test_outside_the_hub_a_send_waits_in_the_calling_thread_with_the_socket_timeout(hub):
    a, b = socket.socketpair()
    a.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, 4096)
    s = HubSocket(a, hub)
    s.settimeout(0.02)
    sent = 0
    with pytest.raises(socket.timeout):
        for _ in range(10_000):  # nobody reads: the buffer fills, then the wait times out
            sent += s.send(b"x" * 4096)
    received = 0
    while received < sent:
        received += len(b.recv(65536))
    assert received == sent and s.send(b"y") == 1  # drained: sends again
    s.close()
    b.close()


@pytest.fixture(scope="module")
def two_hosts():
    bench = OpticalBench(load_profile("instant"), seed=5)
    servers = [EmulatedHostServer(bench, name).start() for name in bench.hosts[:2]]
    transports = [SshTransport(s.resource()) for s in servers]
    for t in transports:
        t.connect()
    yield transports
    for t in transports:
        t.close()
    for s in servers:
        s.stop()
    bench.stop()


def test_keepalive_runs_on_the_hub_and_its_message_during_key_exchange_is_held_not_waited_for(two_hosts):
    """paramiko's keep-alive check runs at its socket timeouts, in the connection's loop; here its message finds a
    key exchange under way (clear_to_send cleared): the loop goes on (only it can finish the exchange) and the
    message is held, then sent once user messages may flow; the other host's commands run meanwhile."""
    first, second = two_hosts
    transport = first._transport()
    assert isinstance(transport, HubTransport) and isinstance(second._transport(), HubTransport)
    returned = threading.Event()
    on = []

    def keepalive():
        if on:  # once: its message is not written, so paramiko asks again every interval
            return
        on.append(threading.current_thread().name)
        transport.global_request("keepalive@lag.net", wait=False)  # -> _send_user_message
        returned.set()

    transport.clear_to_send.clear()
    transport.packetizer.set_keepalive(0.05, keepalive)
    assert returned.wait(30)
    transport.packetizer.set_keepalive(0, None)
    assert on == ["ssh-hub"]
    assert second.run("echo still", deadline=Deadline(30)).stdout == "still\n"  # the hub is not held
    assert len(transport._held) == 1  # noqa: SLF001 - held, not sent
    transport.clear_to_send.set()
    deadline = time.monotonic() + 30
    while transport._held and time.monotonic() < deadline:  # noqa: SLF001
        time.sleep(0.01)
    assert not transport._held  # noqa: SLF001
    assert first.run("echo after", deadline=Deadline(30)).stdout == "after\n"


_COUNT_THREADS = r"""
import json, os, queue, sys, threading
import paramiko
from devices.resources import HostResource
from harness.bench.hosts import HostGroup
from harness.bench.hosts import HostSession
from devices.timing import Deadline

hosts = json.loads(sys.stdin.read())
counts = []
for n in (4, 16):
    sink = queue.Queue()
    sessions = {}
    for h in hosts[:n]:
        s = HostSession(HostResource(**h["resource"]), clock_probes=4)
        s.open()
        s.start_watch([tuple(p) for p in h["ports"]], 20000, 0, sink)
        sessions[s.name] = s
    synced = set()
    for s in sessions.values():
        s.on_clock_sample = lambda host, sample: synced.add(host)
    group = HostGroup(sessions)
    group.start_clock_sync(0.1)  # the group's one clock thread probes every host
    first = set()
    deadline = Deadline(60)
    while (len(first) < n or len(synced) < n) and not deadline.expired():
        try:
            o = sink.get(timeout=0.1)
            first.add(o.host)
        except queue.Empty:
            pass
    counts.append({"hosts": n, "lines_from": len(first), "synced": len(synced),
                   "names": sorted(t.name for t in threading.enumerate()),
                   "tasks": sorted(open(f"/proc/self/task/{t}/comm").read().strip() for t in os.listdir("/proc/self/task")),
                   "transport_threads": sum(isinstance(t, paramiko.Transport) for t in threading.enumerate())})
    group.stop()
    group._clock_thread.join(30)
    for s in sessions.values():
        s.close()
print(json.dumps(counts))
"""


def test_harness_threads_do_not_grow_with_hosts(tmp_path):
    """4 and 16 emulated hosts, each with the harness's SSH connection, agent, time responder, watch stream
    and clock sync: the harness process (its own, so only its threads count) has the same threads."""
    data = yaml.safe_load(Path(load_profile("instant").path).read_text())
    data["topology"] = {"hosts": 16, "nics_per_host": 1, "ocs_size": [16, 16]}
    (tmp_path / "p.yaml").write_text(yaml.safe_dump(data))
    with OpticalBench(load_profile(str(tmp_path / "p.yaml")), seed=7) as bench:
        servers = [EmulatedHostServer(bench, name).start() for name in bench.hosts]
        try:
            hosts = [{"resource": vars(s.resource()),
                      "ports": [(p.netdev, p.rdma_dev, p.rdma_port) for p in bench.nic_ports(s.host_name)]}
                     for s in servers]
            proc = subprocess.run([sys.executable, "-c", _COUNT_THREADS], input=json.dumps(hosts), cwd=ROOT,
                                  capture_output=True, text=True, timeout=240)
        finally:
            for s in servers:
                s.stop()
    assert proc.returncode == 0, proc.stderr[-2000:]
    four, sixteen = json.loads(proc.stdout.strip().splitlines()[-1])
    assert (four["lines_from"], sixteen["lines_from"]) == (4, 16)  # every host's stream delivered
    assert (four["synced"], sixteen["synced"]) == (4, 16)  # and every host's clock probed by the group
    assert four["transport_threads"] == sixteen["transport_threads"] == 0
    assert "ssh-hub" in four["names"]
    assert four["names"] == sixteen["names"]
    assert four["tasks"] == sixteen["tasks"]  # the kernel's view, native ones too


def test_a_key_re_exchange_runs_inside_both_hub_loops_while_commands_run(two_hosts):
    """Client and emulated server of one connection both on the hub: a re-exchange (paramiko's kex inside
    both loops, user messages held until it ends) with commands sent from threads meanwhile; every one runs."""
    first, second = two_hosts
    transport = first._transport()
    results: list[str] = []

    def commands(k: int) -> None:
        results.extend(first.run(f"echo {k}-{i}", deadline=Deadline(30)).stdout for i in range(10))

    workers = [threading.Thread(target=commands, args=(k,)) for k in range(3)]
    for w in workers:
        w.start()
    for _ in range(3):
        transport.renegotiate_keys()  # returns once the new keys are in force
    for w in workers:
        w.join(60)
    assert sorted(results) == sorted(f"{k}-{i}\n" for k in range(3) for i in range(10))
    assert transport.is_active() and first.connects == 1
    assert second.run("echo other", deadline=Deadline(30)).stdout == "other\n"


def test_a_key_re_exchange_returns_only_once_user_messages_may_flow_again(two_hosts, monkeypatch):
    """paramiko wakes `renegotiate_keys`' caller before its loop lets user messages through again; the gap is
    widened here (the loop pauses in it), so a caller that asked for the next exchange at once would have its
    hold on user messages undone. The hub's transport returns only after the gap: the next exchange holds."""
    first, second = two_hosts
    transport = first._transport()
    need_rekey = transport.packetizer.need_rekey

    def pausing_in_the_gap():  # paramiko asks this between its completion event and `clear_to_send`
        event = transport.completion_event
        if event is not None and event.is_set() and not transport.clear_to_send.is_set():
            time.sleep(0.2)
        return need_rekey()

    monkeypatch.setattr(transport.packetizer, "need_rekey", pausing_in_the_gap)
    for _ in range(2):
        transport.renegotiate_keys()
        assert transport.clear_to_send.is_set() and not transport.in_kex
    assert first.run("echo after", deadline=Deadline(30)).stdout == "after\n"
    assert transport.is_active() and first.connects == 1


def test_arrival_stamps_follow_the_bytes_read_not_the_read(monkeypatch):
    from devices import sshhub

    # this thread's clock only: a hub loop left running by another test reads the module's too, and must go on
    clock, real, mine = iter([100, 200, 300]), sshhub.now_ns, threading.get_ident()
    monkeypatch.setattr(sshhub, "now_ns", lambda: next(clock) if threading.get_ident() == mine else real())
    pipe = sshhub.ArrivalStampedPipe()
    pipe.feed(b"ab\n")  # 100
    pipe.feed(b"cd")  # 200
    assert pipe.read(3) == b"ab\n" and pipe.last_read_ns == 100
    assert pipe.read(1) == b"c" and pipe.last_read_ns == 200
    pipe.feed(b"ef\n")  # 300
    assert pipe.read(100) == b"def\n" and pipe.last_read_ns == 300  # the last byte's arrival


def test_a_read_carries_the_kernel_arrival_not_the_hub_s_backlog(hub):
    """Bytes that sat in the socket while the hub was busy: the pipe's feed stamp is when the hub got to them,
    `last_arrival_ns` when the kernel had them (the read's SO_TIMESTAMPNS, bounded): never before the send, and
    not the hub's wait (a clock probe's reply time must not count it). Fails with the feed stamp alone."""
    from devices import sshhub
    from devices.timing import now_ns

    listener = socket.create_server(("127.0.0.1", 0))
    peer = socket.create_connection(listener.getsockname())
    mine, _ = listener.accept()
    s = HubSocket(mine, hub)
    pipe = sshhub.ArrivalStampedPipe(s)
    # Linux turns receive stamping on for the whole stack a moment after the first socket asks (a work item):
    # segments before that carry none, and a read of them falls back to its own time (still a bound)
    for _ in range(200):
        fallbacks = s._stamps.fallbacks
        peer.sendall(b"w")
        assert _in_hub(hub, lambda: s.recv(100)).get(timeout=30) == b"w"
        if s._stamps.fallbacks == fallbacks:
            break
        time.sleep(0.01)
    else:
        pytest.fail(f"no kernel receive stamp within 2 s: {s._stamps.reason}")
    before = now_ns()
    peer.sendall(b"token 123\n")  # loopback: in our receive queue when sendall returns
    after = now_ns()
    time.sleep(0.1)  # the hub is elsewhere meanwhile
    pipe_fed = _in_hub(hub, lambda: pipe.feed(s.recv(100))).get(timeout=30)
    assert pipe_fed is None and pipe.read(100) == b"token 123\n"
    assert pipe.last_read_ns >= after + 100_000_000  # the feed: after the wait
    assert before <= pipe.last_arrival_ns <= after + 50_000_000, s._stamps.reason  # the kernel's: at the send
    s.close()
    peer.close()
    listener.close()


class _CountingSocket:
    """A socket whose reads (recv, or recvmsg with the kernel's receive stamp) are counted (HubSocket's)."""

    def __init__(self, sock):
        self.sock, self.recvs = sock, 0

    def recv(self, n):
        self.recvs += 1
        return self.sock.recv(n)

    def recvmsg(self, *args):
        self.recvs += 1
        return self.sock.recvmsg(*args)

    def __getattr__(self, name):
        return getattr(self.sock, name)


def test_a_hub_socket_reads_what_has_come_at_once_and_hands_it_out_as_asked(hub):
    """paramiko asks for a packet's header, then its rest: from what one read took, byte for byte in order, with
    `handed` where the bytes handed so far end; once all is handed, it waits for more on the hub's select before
    it reads (no read that would block); b"" at the peer's close."""
    mine, peer = socket.socketpair()
    s = HubSocket(mine, hub)
    s.sock = counting = _CountingSocket(mine)
    stream = bytes(range(256)) * 40  # 10 240 bytes, three packets' worth and more
    peer.sendall(stream)
    time.sleep(0.05)
    sizes = [16, 1000, 16, 5000, 4208]

    def reads():
        return [s.recv(n) for n in sizes]

    got = _in_hub(hub, reads).get(timeout=30)
    assert [len(g) for g in got] == sizes and b"".join(got) == stream and s.handed == len(stream)
    assert counting.recvs == 1  # all of it was there: one read
    waiting = _in_hub(hub, lambda: s.recv(100))  # all was taken: it waits on the hub's select, not in a read
    time.sleep(0.05)
    peer.sendall(b"tail")
    assert waiting.get(timeout=30) == b"tail" and counting.recvs == 2
    peer.close()
    assert _in_hub(hub, lambda: s.recv(100)).get(timeout=30) == b"" and s.handed == len(stream) + 4
    s.close()


class _OneCommandServer(paramiko.ServerInterface):
    """paramiko's server side for one exec channel, no authentication (only over loopback in this test)."""

    def __init__(self):
        self.channel_open = threading.Event()

    def get_allowed_auths(self, username):
        return "none"

    def check_auth_none(self, username):
        return paramiko.AUTH_SUCCESSFUL

    def check_channel_request(self, kind, chanid):
        return paramiko.OPEN_SUCCEEDED

    def check_channel_exec_request(self, channel, command):
        self.channel_open.set()
        return True


def test_the_wire_record_pairs_each_packet_fed_with_the_peer_s_send_that_carried_it(hub, monkeypatch):
    """With `record_wire`, a client and a server on the hub list their sends and the packets their stamped pipes
    were fed, by (local port, peer port): every packet the client was fed ends where one of the server's sends
    ended, and that send began before the client was fed it."""
    import bisect

    from devices import sshhub

    monkeypatch.setattr(sshhub, "wire", None)
    wire = sshhub.record_wire()
    listener = socket.create_server(("127.0.0.1", 0))
    client_sock = socket.create_connection(listener.getsockname())
    server_sock, _ = listener.accept()
    server = HubTransport(server_sock, hub=hub)
    server.add_server_key(paramiko.RSAKey.generate(1024))
    interface = _OneCommandServer()
    server.start_server(event=threading.Event(), server=interface)
    client = HubTransport(client_sock, hub=hub)
    try:
        client.start_client(timeout=20)
        client.auth_none("test")
        channel = client.open_session(timeout=20)
        pipe = sshhub.stamp_arrivals(channel)
        channel.exec_command("lines")
        served = server.accept(20)
        assert served is not None and interface.channel_open.wait(20)
        lines = [f"line {i}\n".encode() for i in range(40)]
        for line in lines:
            served.sendall(line)
        got = b""
        while len(got) < sum(map(len, lines)):
            got += channel.recv(4096)
        assert got == b"".join(lines)
        mine = wire[client_sock.getsockname()[1], client_sock.getpeername()[1]]
        theirs = wire[server_sock.getsockname()[1], server_sock.getpeername()[1]]
        ends = [end for _, end in theirs["sent"]]
        assert len(mine["fed"]) == len(lines) and pipe.last_read_ns == mine["fed"][-1][0]
        for fed_ns, end in mine["fed"]:
            at = bisect.bisect_left(ends, end)
            assert ends[at] == end and theirs["sent"][at][0] < fed_ns  # one send per packet, begun before
        assert ends[-1] == server.sock.sent and mine["sent"][-1][1] == client.sock.sent
    finally:
        client.close()
        server.close()
        listener.close()


def test_first_send_ns_is_when_the_socket_send_began(hub):
    from devices.sshhub import first_send_ns
    from devices.timing import now_ns

    a, b = socket.socketpair()
    s = HubSocket(a, hub)
    before = now_ns()
    sent = first_send_ns(lambda: s.send(b"x"))
    assert before <= sent <= now_ns() and b.recv(1) == b"x"
    assert first_send_ns(lambda: None) == 0  # no socket send: no stamp, not the previous one
    s.send(b"y")  # not armed: leaves no stamp behind
    assert first_send_ns(lambda: None) == 0
    s.close()
    b.close()


def test_hubs_end_their_greenlets_and_thread_at_exit():
    """A greenlet left suspended on the hub's daemon thread at interpreter finalisation could crash it
    (SIGSEGV, seen as `harness emulate` exiting -11 on SIGINT): at exit every hub ends its greenlets and its
    thread first. Checked by an exit handler that runs after the hub's (registered before its import)."""
    script = '''
import atexit, socket, sys
state = {}
@atexit.register
def after_the_hubs():
    hub = state["hub"]
    print(hub._thread.is_alive(), hub.greenlets, state["ended"], flush=True)
from devices.sshhub import Hub, HubSocket
hub = state["hub"] = Hub(name="exit-hub")
state["ended"] = False
a, b = socket.socketpair()
s = HubSocket(a, hub)
def waits_forever():
    try:
        s.recv(10)
    finally:
        state["ended"] = True
hub.spawn(waits_forever)
while not hub.greenlets:
    pass
sys.exit(0)
'''
    out = subprocess.run([sys.executable, "-c", script], cwd=ROOT, capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    assert out.stdout.split() == ["False", "0", "True"], out.stdout + out.stderr


def test_packets_macs_are_compared_by_the_standard_library():
    """paramiko's MAC check goes through hmac.compare_digest (constant time, in C): same answers as its own."""
    import hmac
    import os

    import paramiko.util

    assert paramiko.util.constant_time_bytes_eq is hmac.compare_digest
    mac = os.urandom(32)
    for other, same in ((bytes(mac), True), (mac[:-1] + bytes([mac[-1] ^ 1]), False), (mac[:16], False), (b"", False)):
        assert paramiko.util.constant_time_bytes_eq(mac, other) is same


def test_packets_macs_come_from_copies_of_a_keyed_base_with_paramikos_digests():
    """paramiko's per-packet MAC is computed from a keyed base per (key, digest), copied: the same digest as a
    fresh HMAC for every MAC paramiko negotiates, across keys (a re-key) and when the table is emptied."""
    import hmac
    import random

    import paramiko.packet
    from paramiko.transport import Transport

    from devices import sshhub

    assert paramiko.packet.compute_hmac is sshhub._compute_hmac
    rng = random.Random(7)
    digests = {info["class"] for info in Transport._mac_info.values()}
    keys = [rng.randbytes(n) for n in (16, 20, 32, 64, 100)]
    for _ in range(400):
        key, digest = rng.choice(keys), rng.choice(sorted(digests, key=repr))
        message = rng.randbytes(rng.choice((0, 1, 60, 1500, 40_000)))
        assert sshhub._compute_hmac(key, message, digest) == hmac.HMAC(key, message, digest).digest()
        if rng.random() < 0.01:
            sshhub._keyed.clear()
    assert set(sshhub._keyed) <= {(k, d) for k in keys for d in digests}


@pytest.mark.parametrize("server_ciphers, agreed", [(None, "aes128-gcm@openssh.com"),
                                                    (("aes256-ctr", "aes128-ctr"), "aes128-ctr")])
def test_a_hub_client_asks_for_aes_gcm_first_and_takes_what_the_server_has(hub, server_ciphers, agreed):
    """Against a plain paramiko server: AES-GCM both ways when the server has it; a server without it gets the
    client's next choice (paramiko's order), and the connection carries packets either way."""
    a, b = socket.socketpair()
    server = paramiko.Transport(b)
    server.add_server_key(paramiko.RSAKey.generate(1024))
    if server_ciphers is not None:
        server.get_security_options().ciphers = server_ciphers
    server.start_server(event=threading.Event(), server=paramiko.ServerInterface())
    client = HubTransport(a, hub=hub)
    try:
        client.start_client(timeout=20)
        assert (client.local_cipher, client.remote_cipher) == (agreed, agreed)
        assert (server.local_cipher, server.remote_cipher) == (agreed, agreed)
        client.renegotiate_keys()  # a key exchange needs packets both ways under the agreed cipher
        assert client.is_active() and server.is_active() and client.local_cipher == agreed
    finally:
        client.close()  # closes its socket on the hub (closing `a` here, behind the hub's back, would leave the
        server.close()  # hub watching a descriptor number the next socket may reuse)
        b.close()


def test_a_channel_closed_by_the_peer_during_our_key_exchange_neither_stalls_nor_breaks_the_connection(hub):
    """paramiko's loop answers a peer's channel close itself, with a user message, which must wait while keys are
    exchanged; waiting in the loop, it never reads the rest of the exchange (paramiko issue 822: stuck until the
    wait times out, then the connection is lost). Here the client asks for new keys and a plain paramiko server
    closes a channel before it answers (its close was on its way): the client's answer goes out once the new
    keys are in force, and the connection carries on."""
    a, b = socket.socketpair()
    server = paramiko.Transport(b)
    server.add_server_key(paramiko.RSAKey.generate(1024))
    interface = _OneCommandServer()
    server.start_server(event=threading.Event(), server=interface)
    client = HubTransport(a, hub=hub)
    client.clear_to_send_timeout = 5.0  # paramiko's 30 s wait, shortened: the stall fails the test sooner
    try:
        client.start_client(timeout=20)
        client.auth_none("test")
        closing, kept = client.open_session(timeout=20), client.open_session(timeout=20)
        for channel in (closing, kept):
            channel.exec_command("x")
        served = {}
        for _ in range(2):
            channel = server.accept(20)
            served[channel.get_id()] = channel
        handlers = server._handler_table  # noqa: SLF001 - bound methods, taken when the transport was made
        negotiate = handlers[paramiko.common.MSG_KEXINIT]  # the server's answer to our KEXINIT

        def close_first(m):
            served[closing.remote_chanid].close()  # before the server's own KEXINIT: allowed, and on the wire
            return negotiate(m)

        handlers[paramiko.common.MSG_KEXINIT] = close_first
        client.renegotiate_keys()
        assert client.is_active() and server.is_active()
        deadline = time.monotonic() + 20
        while not closing.closed and time.monotonic() < deadline:
            time.sleep(0.01)
        assert closing.closed
        served[kept.remote_chanid].sendall(b"still here")
        kept.settimeout(20)
        assert kept.recv(100) == b"still here"
        kept.sendall(b"and back")
        served[kept.remote_chanid].settimeout(20)
        assert served[kept.remote_chanid].recv(100) == b"and back"
    finally:
        client.close()
        server.close()
        b.close()


@pytest.mark.filterwarnings("ignore::pytest.PytestUnhandledThreadExceptionWarning")  # the loop's death, on purpose
def test_a_hub_whose_loop_died_is_replaced_by_the_next_caller(monkeypatch):
    from devices import sshhub

    dying = sshhub.Hub(name="test-dying-hub")
    monkeypatch.setattr(sshhub, "_hub", dying)  # the process's own shared hub stays as it is
    assert sshhub.shared_hub() is dying
    real = sshhub.now_ns
    monkeypatch.setattr(sshhub, "now_ns", lambda: (_ for _ in ()).throw(RuntimeError("test: the loop dies"))
                        if threading.current_thread() is dying._thread else real())
    dying.call_soon(lambda: None)  # wakes its loop, which then reads the clock
    dying._thread.join(30)
    assert not dying._thread.is_alive()
    fresh = sshhub.shared_hub()
    try:
        assert fresh is not dying and fresh._thread.is_alive()
        done = threading.Event()
        fresh.call_soon(done.set)
        assert done.wait(30)
    finally:
        fresh.stop()
