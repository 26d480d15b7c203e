"""SshTransport against the emulated SSH host over real SSH on 127.0.0.1 (no paramiko mocks)."""
from __future__ import annotations

import dataclasses
import socket
import threading
import time

import pytest

from devices.emulated.host.server import EmulatedHostServer
from devices.errors import DeviceTimeout, TransportClosed
from devices.parsers.clock_tools import parse_date_ns
from devices.ssh import AuthenticationFailed, CommandFailed, HostKeyError, SshTransport
from devices.timing import Deadline


def test_run_returns_stdout_stderr_status_and_timing(ssh, bench, server):
    result = ssh.run("cat /sys/class/infiniband/mlx5_0/ports/1/state /no/such/file")
    assert result.exit_status == 1
    assert result.stdout == "1: DOWN\n"
    assert result.stderr == "cat: /no/such/file: No such file or directory\n"
    assert 0 < result.timing.sent_ns < result.timing.completed_ns
    before = bench.host_clock_ns(server.host_name)
    stamp = parse_date_ns(ssh.run("date +%s.%N").stdout)
    assert before <= stamp <= bench.host_clock_ns(server.host_name)


def test_stdin_is_delivered_then_eof(ssh):
    payload = "".join(f"line {i}\n" for i in range(20000))  # larger than one SSH window packet
    assert ssh.run("cat", stdin=payload).stdout == payload
    assert ssh.run("cat", stdin=payload.encode()).stdout == payload


def test_check_raises_with_the_command_and_its_error(ssh):
    with pytest.raises(CommandFailed, match=r"'frobnicate' exited 127: sh: 1: frobnicate: not found") as info:
        ssh.run("frobnicate", check=True)
    assert info.value.result.exit_status == 127
    assert ssh.run("true", check=True).exit_status == 0


def test_deadline_bounds_a_slow_command(ssh):
    start = time.monotonic()
    with pytest.raises(DeviceTimeout, match="deadline"):
        ssh.run("echo early && sleep 30", deadline=Deadline(0.4))
    assert time.monotonic() - start < 10  # far below the 30 s the command would take
    assert ssh.run("echo still usable").stdout == "still usable\n"


def test_thousands_of_fast_commands_on_one_connection_never_fail(ssh):
    ssh.run("true")  # the module's transport connects lazily; in random order this test may be its first user
    connects = ssh.connects
    assert connects >= 1
    failures = []
    for i in range(3000):
        result = ssh.run(f"echo {i}")
        if result.exit_status != 0 or result.stdout != f"{i}\n":
            failures.append((i, result))
    assert failures == []
    assert ssh.connects == connects  # one connection throughout


def test_many_channels_at_once_from_threads(ssh):
    errors: list[BaseException] = []

    def worker(k: int) -> None:
        try:
            for i in range(40):
                assert ssh.run(f"echo {k}-{i}").stdout == f"{k}-{i}\n"
        except BaseException as exc:  # noqa: BLE001 - reported below
            errors.append(exc)

    threads = [threading.Thread(target=worker, args=(k,)) for k in range(8)]
    with ssh.stream("ip -ts monitor link"):  # a long-lived channel open alongside
        for t in threads:
            t.start()
        for t in threads:
            t.join(60)
    assert errors == []


def test_stream_lines_deadline_and_eof(ssh, server):
    ssh.run("mkdir -p ~/.cache/ocs-hil && cat > ~/.cache/ocs-hil/agent.py", stdin="# agent\n", check=True)
    with ssh.stream("python3 -u ~/.cache/ocs-hil/agent.py timesrv") as stream:
        assert stream.readline(Deadline(0.2)) is None  # nothing asked, nothing answered
        stream.write("a\nb\n")
        got = [stream.readline(Deadline(10)), stream.readline(Deadline(10))]
        assert [line.split()[0] for _, line in got] == ["a", "b"]
        stream.close_stdin()
        with pytest.raises(TransportClosed, match="ended"):
            while stream.readline(Deadline(10)) is not None:
                pass
        assert stream.exit_status == 0
    with ssh.stream("echo one && echo two") as stream:
        assert [line for _, line in stream] == ["one", "two"]


def test_pushed_lines_arrive_on_the_hub_per_packet_and_give_their_window_back(ssh):
    """`deliver`: a stream's lines handed over on the hub's thread as its loop takes each packet off the socket,
    a packet's lines in one call; the bytes consumed so are given back to the peer's window, so a stream longer
    than its channel's window keeps flowing (without that, it stops after 32 KB here); the end once."""
    from devices.ssh import SshLineStream
    from devices.sshhub import stamp_arrivals

    ssh.run("mkdir -p ~/.cache/ocs-hil && cat > ~/.cache/ocs-hil/agent.py", stdin="# agent\n", check=True)
    channel = ssh._transport().open_session(window_size=32768)
    stamp_arrivals(channel)
    channel.exec_command("python3 -u ~/.cache/ocs-hil/agent.py timesrv")
    stream = SshLineStream(channel, "timesrv", "test")
    got, batches, threads, ended = [], [], set(), threading.Event()

    def on_lines(recv_ns, lines):
        got.extend(lines)
        batches.append(len(lines))
        threads.add(threading.current_thread().name)

    assert stream.deliver(on_lines, ended.set)
    tokens = [f"t{i}" for i in range(4000)]  # ~100 KB of replies: 3 windows
    stream.write("".join(t + "\n" for t in tokens))
    deadline = Deadline(30)
    while len(got) < len(tokens) and not deadline.expired():
        time.sleep(0.01)
    assert [line.split()[0] for line in got] == tokens
    assert threads == {"ssh-hub"} and max(batches) > 1 and not ended.is_set()
    stream.close_stdin()
    assert ended.wait(30)
    assert stream.deliver(None, None) and len(got) == len(tokens)


def test_reconnects_after_a_dropped_connection(server):
    with SshTransport(server.resource(), retries=3, backoff_s=0.05) as ssh:
        assert ssh.run("true").exit_status == 0
        assert server.drop_connections() >= 1
        deadline = time.monotonic() + 10
        while ssh._client.get_transport().is_active() and time.monotonic() < deadline:  # noqa: SLF001
            time.sleep(0.01)
        assert ssh.run("echo back").stdout == "back\n"
        assert ssh.connects == 2


def test_a_command_cut_by_a_drop_is_not_rerun(server):
    with SshTransport(server.resource()) as ssh:
        ssh.connect()
        threading.Timer(0.3, server.drop_connections).start()
        with pytest.raises(TransportClosed, match="connection lost during 'sleep 20'"):
            ssh.run("sleep 20", deadline=Deadline(15))
        assert ssh.connects == 1


def test_gives_up_after_bounded_retries(bench):
    with EmulatedHostServer(bench, bench.hosts[1]) as server:
        resource = server.resource()
    start = time.monotonic()
    with SshTransport(resource, retries=2, backoff_s=0.05, connect_timeout=2) as ssh:
        with pytest.raises(TransportClosed, match="cannot connect after 3 attempts"):
            ssh.run("true")
    assert time.monotonic() - start < 10


def test_connect_timeout_is_separate_from_command_deadlines():
    silent = socket.socket()
    silent.bind(("127.0.0.1", 0))
    silent.listen(1)  # accepts TCP but never speaks SSH
    try:
        resource = dataclasses.replace(_dummy_resource(), port=silent.getsockname()[1])
        start = time.monotonic()
        with SshTransport(resource, connect_timeout=0.3, retries=0, password="hunter2-secret") as ssh:
            with pytest.raises(TransportClosed) as info:
                ssh.run("true", deadline=Deadline(60))
        assert time.monotonic() - start < 10
        assert "hunter2-secret" not in str(info.value)
    finally:
        silent.close()


def _dummy_resource():
    from devices.resources import HostResource
    return HostResource(name="h", address="127.0.0.1", port=1, user="lab", strict_host_key=False)


def test_strict_host_key_checking(bench, server, tmp_path):
    strict = dataclasses.replace(server.resource(), strict_host_key=True)
    with SshTransport(strict) as ssh:  # the emulator's known_hosts names this host key
        assert ssh.run("hostname").stdout == f"{server.host_name}\n"
    with EmulatedHostServer(bench, bench.hosts[2]) as other:
        wrong = dataclasses.replace(strict, known_hosts=str(other.known_hosts_path))  # other port: no entry
        with SshTransport(wrong, retries=0) as ssh, pytest.raises(HostKeyError, match="not in known_hosts"):
            ssh.connect()
        # same [host]:port, different key: rejected even when the bench is emulated
        forged = tmp_path / "known_hosts"
        key_line = other.known_hosts_path.read_text().split(" ", 1)[1]
        forged.write_text(f"[127.0.0.1]:{server.port} {key_line}")
        for strictness in (True, False):
            bad = dataclasses.replace(strict, known_hosts=str(forged), strict_host_key=strictness)
            with SshTransport(bad, retries=0) as ssh, pytest.raises(HostKeyError, match="does not match"):
                ssh.connect()
        # emulated bench, no matching entry: AutoAdd is allowed, and the inventory's file is only read (issue
        # 38, reproduction 10: the unverified key was appended to a known_hosts a real inventory may share)
        shared = tmp_path / "shared_known_hosts"
        shared.write_text(other.known_hosts_path.read_text())
        relaxed = dataclasses.replace(wrong, known_hosts=str(shared), strict_host_key=False)
        with SshTransport(relaxed) as ssh:
            assert ssh.run("true").exit_status == 0
        assert shared.read_text() == other.known_hosts_path.read_text()
        missing = dataclasses.replace(strict, known_hosts=str(tmp_path / "absent"))
        with SshTransport(missing, retries=0) as ssh, pytest.raises(HostKeyError, match="does not exist"):
            ssh.connect()


def test_wrong_identity_is_refused_without_leaking_secrets(bench, server):
    with EmulatedHostServer(bench, bench.hosts[3]) as other:
        wrong_key = dataclasses.replace(server.resource(), identity_file=str(other.client_key_path))
        with SshTransport(wrong_key, retries=3, password="hunter2-secret") as ssh:
            start = time.monotonic()
            with pytest.raises(AuthenticationFailed) as info:
                ssh.connect()
            assert time.monotonic() - start < 5  # not retried
        message = str(info.value)
        assert "hunter2-secret" not in message and "PRIVATE KEY" not in message
        assert server.host_name in message and str(server.port) in message


class _RealtimeAhead:
    """CLOCK_REALTIME as devices.timing reads it, 5 s ahead: a step faked on our side only."""
    monotonic_ns = staticmethod(time.monotonic_ns)

    @staticmethod
    def time_ns():
        return time.time_ns() + 5_000_000_000


def test_receive_stamps_say_how_replies_were_dated_across_reconnects_and_after_close(server, monkeypatch):
    """Replies dated by the kernel's receive stamp; a CLOCK_REALTIME step (faked on our side) makes the reads
    around it fall back to the read time: counted, with the reason, and still counted after a reconnect and
    once the transport is closed."""
    import devices.timing as timing

    with SshTransport(server.resource(), retries=3, backoff_s=0.05) as ssh:
        assert ssh.receive_stamps()["reason"] == "never connected"
        assert ssh.run("true").exit_status == 0
        assert ssh.receive_stamps() == {"stamp": "kernel", "fallbacks": 0, "reason": ""}
        monkeypatch.setattr(timing, "time", _RealtimeAhead)
        assert ssh.run("true").exit_status == 0
        monkeypatch.undo()
        stepped = ssh.receive_stamps()
        assert stepped["stamp"] == "kernel" and stepped["fallbacks"] >= 1, stepped
        # the read across the step names it; the next ones find their stamps before the run of agreeing reads
        assert "CLOCK_REALTIME stepped" in stepped["reason"] or "outside" in stepped["reason"], stepped
        assert server.drop_connections() >= 1
        deadline = time.monotonic() + 10
        while ssh._client.get_transport().is_active() and time.monotonic() < deadline:  # noqa: SLF001
            time.sleep(0.01)
        assert ssh.run("true").exit_status == 0 and ssh.connects == 2
        assert ssh.receive_stamps()["fallbacks"] >= stepped["fallbacks"]
    assert ssh.receive_stamps()["fallbacks"] >= stepped["fallbacks"]
