"""Line framing and URL parsing shared by the OCS drivers."""
from __future__ import annotations

import time
from contextlib import contextmanager

import pytest
from hypothesis import HealthCheck, given, settings, strategies as st

from devices.ocs import Endpoint, OcsConfigError, parse_url
from devices.ocs.lines import LineSplitter

N = 16  # the `mixnet-testbed` profile's switch is 16x16


class RealtimeAhead:
    """CLOCK_REALTIME as read by us (devices.timing's `time`), 5 s ahead: a step faked on our side only, the
    machine's clock is never changed."""
    monotonic_ns = staticmethod(time.monotonic_ns)

    @staticmethod
    def time_ns():
        return time.time_ns() + 5_000_000_000


@contextmanager
def emulated_tl1_read_late(readable: list[int] | None = None):
    """The emulated `mixnet-testbed` switch over TL1 whose driver gets to its socket only 30 ms after data
    arrived (a busy harness): yields (bench, servers, switch); `readable` gets the instant each late read
    found the socket readable. Switch, servers and bench are stopped on exit (their records stay readable)."""
    import select

    from devices.emulated.ocs_server import OcsServers
    from devices.emulated.physics import OpticalBench
    from devices.emulated.profile import load_profile
    from devices.ocs import open_switch
    from devices.resources import OcsResource
    from devices.timing import now_ns

    bench = OpticalBench(load_profile("mixnet-testbed"), seed=3).start()
    servers = OcsServers(bench, pty=False).start()
    try:
        host, port = servers.tl1_address
        switch = open_switch(OcsResource(name="ocs1", protocol="polatis-tl1", url=f"tcp://{host}:{port}",
                                         size=(N, N), allowed_ports=frozenset(range(1, 2 * N + 1)),
                                         user="admin", password="root"), timeout_s=10)
        channel = switch._channel
        read = channel._read

        def late_read(timeout_s):
            if timeout_s > 0:
                select.select([channel._sock], [], [], 10)
                if readable is not None:
                    readable.append(now_ns())
                time.sleep(0.03)
            return read(timeout_s)

        channel._read = late_read
        try:
            yield bench, servers, switch
        finally:
            switch.close()
    finally:
        servers.stop()
        bench.stop()

texts = st.lists(st.text(st.characters(blacklist_characters="\r\n", codec="utf-8"), min_size=1, max_size=12)
                 .filter(lambda s: s.strip() == s and s), max_size=8)


@settings(suppress_health_check=[HealthCheck.too_slow])  # generation time is the machine's load, not ours
@given(lines=texts, endings=st.lists(st.sampled_from(["\r", "\n", "\r\n", "\n\n", "\r\n\r\n"]), min_size=8,
                                     max_size=8), cuts=st.lists(st.integers(0, 200), max_size=10))
def test_splitter_is_independent_of_line_ends_and_chunking(lines, endings, cuts):
    data = "".join(line + end for line, end in zip(lines, endings)).encode()
    splitter = LineSplitter()
    out: list[str] = []
    bounds = sorted({0, len(data), *[c % (len(data) + 1) for c in cuts]})
    for a, b in zip(bounds, bounds[1:]):
        out += splitter.feed(data[a:b])
    assert out == lines
    assert splitter.pending == ""


@settings(suppress_health_check=[HealthCheck.too_slow])  # generation time is the machine's load, not ours
@given(data=st.binary(max_size=120).map(lambda b: b.translate(bytes.maketrans(b"\x00\x01\x02\x03", b"\r\n\r\n"))),
       cuts=st.lists(st.integers(0, 200), max_size=10), max_line=st.sampled_from([4, 16, 1000]))
def test_splitter_splits_in_c_as_its_byte_loop_does(data, cuts, max_line):
    # `feed` splits a chunk with bytes.splitlines; `_feed`, the byte loop, is what it must equal (over-long
    # lines, CR, LF and CRLF split across chunks, invalid UTF-8)
    fast, loop = LineSplitter(max_line), LineSplitter(max_line)
    bounds = sorted({0, len(data), *[c % (len(data) + 1) for c in cuts]})
    for a, b in zip(bounds, bounds[1:]):
        got, want = fast.feed(data[a:b]), loop._feed(data[a:b])
        assert got == want and [type(x) for x in got] == [type(x) for x in want]
        assert fast.pending == loop.pending


def test_splitter_keeps_a_prompt_until_the_next_line():
    splitter = LineSplitter()
    assert splitter.feed(b";\n<") == [";"]
    assert splitter.pending == "<"
    assert splitter.feed(b"   SID 24-05-01 12:00:00\n") == ["<   SID 24-05-01 12:00:00"]


@pytest.mark.parametrize("url, protocol, expected", [
    ("tcp://127.0.0.1:3082", "polatis-tl1", Endpoint("tcp", "127.0.0.1", 3082)),
    ("tcp://127.0.0.1", "polatis-tl1", Endpoint("tcp", "127.0.0.1", 3082)),
    ("tcp://127.0.0.1", "polatis-scpi", Endpoint("tcp", "127.0.0.1", 5025)),
    ("tcp://[::1]:5025", "polatis-scpi", Endpoint("tcp", "::1", 5025)),
    ("socket://127.0.0.1:5025", "polatis-scpi", Endpoint("serial", url="socket://127.0.0.1:5025")),
    ("rfc2217://127.0.0.1:7000", "polatis-scpi", Endpoint("serial", url="rfc2217://127.0.0.1:7000")),
    ("/dev/ttyUSB0", "polatis-scpi", Endpoint("serial", url="/dev/ttyUSB0")),
])
def test_parse_url_accepts(url, protocol, expected):
    assert parse_url(url, protocol) == expected


@pytest.mark.parametrize("url, protocol", [
    ("", "polatis-tl1"), ("tcp://:3082", "polatis-tl1"), ("tcp://h:0", "polatis-tl1"),
    ("http://h", "polatis-scpi"), ("socket://h:1", "polatis-tl1"), ("ttyUSB0", "polatis-scpi"),
    ("tcp://h:1", "calient-tl1"),
])
def test_parse_url_rejects(url, protocol):
    with pytest.raises(OcsConfigError):
        parse_url(url, protocol)


def test_a_tl1_reply_is_stamped_when_the_kernel_received_it_not_when_a_late_reader_read_it():
    """Against the emulated TL1 server (it answers an ENT-PATCH once its mirror settled: the ground truth),
    with a reader that gets to the socket only 30 ms after the reply arrived: the COMPLD's stamp is its
    arrival (at most when the socket became readable), not the read (which is 30 ms later)."""
    readable = []
    with emulated_tl1_read_late(readable) as (bench, _, switch):
        channel = switch._channel
        egress = N + 1
        timing = switch.connect(1, egress)
        reply_readable, bound = readable[-1], channel.last_bound_ns
    assert channel.receive_stamp == "kernel" and channel.stamps.fallbacks == 0, channel.stamps.reason
    settled = [e["t_ns"] for e in bench.ground_truth() if e["stage"] == "mirror_settled" and e["ocs_port"] == egress]
    assert len(settled) == 1
    assert timing.sent_ns < settled[0] <= timing.completed_ns + bound  # the switch answers once settled
    assert timing.completed_ns <= reply_readable + bound  # it had arrived before the late read began


def test_a_realtime_step_between_two_reads_falls_back_to_the_read_time_and_says_so(monkeypatch):
    """The kernel stamps in CLOCK_REALTIME. A step of it between two reads (faked on our side only: the
    machine's clock is never changed) makes that read's stamp ambiguous: the read time, with the reason. The
    next read agrees with the stepped offset, but the kernel's stamp then lands before the run of agreeing
    reads began: read time again. Stepping back, a backlog queued across the step is read time until a short
    read drained it; data after that is the kernel's again. Before the step, the stamp is the arrival, within
    its bound."""
    import socket

    import devices.timing as timing
    from devices.timing import ReceiveStamps, enable_receive_stamps, now_ns

    listener = socket.create_server(("127.0.0.1", 0))
    stamps = ReceiveStamps()
    reader = socket.create_connection(listener.getsockname())
    writer, _ = listener.accept()
    try:
        assert enable_receive_stamps(reader)
        before = now_ns()
        writer.sendall(b"a\n")
        got = stamps.recv(reader, 4096)
        after = now_ns()
        assert got.kernel and got.data == b"a\n" and before - got.bound_ns <= got.t_ns <= after + got.bound_ns
        assert stamps.fallbacks == 0

        monkeypatch.setattr(timing, "time", RealtimeAhead)
        for expected in ("CLOCK_REALTIME stepped by", "outside"):
            writer.sendall(b"b\n")
            start = now_ns()
            got = stamps.recv(reader, 4096)
            assert not got.kernel and start <= got.t_ns <= now_ns() and got.bound_ns == 0
            assert expected in stamps.reason, stamps.reason
        assert stamps.fallbacks == 2
        monkeypatch.undo()  # the clock steps back: what was queued across it is not trusted either
        writer.sendall(b"0123456789\n")
        time.sleep(0.01)  # all of it queued before the reads below
        chunks = []
        while len(b"".join(chunks)) < 11:
            got = stamps.recv(reader, 4)
            assert not got.kernel
            chunks.append(got.data)
        assert "queued before a CLOCK_REALTIME step" in stamps.reason, stamps.reason
        writer.sendall(b"c\n")  # after a short read drained the backlog, new data is stamped again
        got = stamps.recv(reader, 4096)
        assert got.kernel and got.data == b"c\n", stamps.reason
    finally:
        for sock in (reader, writer, listener):
            sock.close()


@pytest.mark.parametrize("stepped", [False, True], ids=["kernel-stamp", "realtime-step-fallback"])
def test_the_tl1_commands_recorded_times_and_bounds_contain_the_emulators_truth(monkeypatch, stepped):
    """A TL1 ENT-PATCH against the emulated switch, read by a reader that gets to the socket 30 ms late. The
    switch's truth: when the command reached its kernel, and when it wrote the reply (the client's kernel has
    the reply between its write's start and end, on loopback). The driver's CommandTiming must hold both
    within its bounds, through to the recorded `ocs_command_sent` / `_completed` events. With a CLOCK_REALTIME
    step faked on our side (as above) the reply falls back to the read time: still containing the truth, with a
    bound as wide as the late read, and saying why."""
    import devices.timing as timing_module
    from harness.bench.circuits import Applied
    from harness.bench.stages import ocs_events

    with emulated_tl1_read_late() as (_, servers, switch):
        channel = switch._channel
        if stepped:
            monkeypatch.setattr(timing_module, "time", RealtimeAhead)
        timing = switch.connect(1, N + 1)
        monkeypatch.undo()
    served = [s for s in servers.tl1_served if s.command.startswith("ENT-PATCH")]
    assert len(served) == 1
    truth = served[0]
    # the reply reached the client's kernel at one instant of [reply_write_ns, reply_written_ns]: the recorded
    # interval must reach it (a read-time stamp 30 ms after it, with no bound, would not)
    assert timing.completed_ns - timing.completed_bound_ns <= truth.reply_written_ns
    assert truth.reply_write_ns <= timing.completed_ns + timing.completed_bound_ns
    events = ocs_events("r", 1, "ocs1", timing.sent_ns, timing.completed_ns,
                        Applied(timing, timing.sent_ns).ocs_stamps)
    sent, completed = events
    assert (sent.t_ns, sent.uncertainty_ns, sent.source) == (timing.sent_ns, timing.sent_bound_ns, "harness:write")
    assert (completed.t_ns, completed.uncertainty_ns) == (timing.completed_ns, timing.completed_bound_ns)
    if stepped:
        assert channel.stamps.fallbacks >= 1 and completed.source.startswith("harness:read (fallback: ")
        assert timing.completed_bound_ns >= 30_000_000  # the late read is inside it, honestly
    else:
        assert channel.stamps.fallbacks == 0, channel.stamps.reason
        assert completed.source == "harness:kernel"
        assert timing.completed_bound_ns < 1_000_000  # the kernel's stamp: the conversion's bound, not the lag
        # the command reached the switch's kernel during our write (loopback): inside the sent bound
        assert timing.sent_ns - timing.sent_bound_ns <= truth.arrived_ns <= timing.sent_ns + timing.sent_bound_ns


def test_a_serial_read_time_is_bounded_back_to_the_last_idle_instant_or_the_send():
    """pyserial gives only the read time: a reply read 30 ms late is bounded back to the last read that found
    the line idle (after the send) — the peer's write of the reply lies inside; without such a read, back to
    the send."""
    import socket

    from devices.ocs.lines import SerialLineChannel
    from devices.timing import CommandTiming, Deadline, now_ns

    listener = socket.create_server(("127.0.0.1", 0))
    channel = SerialLineChannel(f"socket://127.0.0.1:{listener.getsockname()[1]}")
    peer, _ = listener.accept()
    try:
        for idle_read in (False, True):
            channel.write_line("*OPC?")
            assert peer.recv(64) == b"*OPC?\r\n"
            if idle_read:
                assert list(channel.drain()) == []  # found nothing: whatever comes next arrived after this
                idle = now_ns()
            write = now_ns()
            peer.sendall(b"1\n")
            written = now_ns()
            time.sleep(0.03)  # a busy harness reads it late
            _, line = channel.read_line(Deadline(5))
            timing = CommandTiming.of(channel.last_write, channel.last_receipt)
            assert line == "1" and timing.completed_stamp == "read"
            assert timing.completed_ns - timing.completed_bound_ns <= written
            assert write <= timing.completed_ns + timing.completed_bound_ns
            assert timing.completed_bound_ns >= 30_000_000
            reach = timing.completed_ns - timing.completed_bound_ns
            assert reach == timing.sent_ns if not idle_read else timing.sent_ns < reach <= idle
    finally:
        channel.close()
        for sock in (peer, listener):
            sock.close()


def test_the_emulated_switch_acts_from_the_latest_instant_its_command_can_have_arrived():
    """A kernel receive stamp converts to the harness clock within a bound (the realtime/monotonic pair read after
    it, wide when its thread was preempted in between: its midpoint then lies up to half the width early). The
    switch's physics and its `ocs_command_arrived` truth start from the stamp plus that bound, so a command is
    never acted on before the harness wrote it (one 8 x 8 run had an arrival 454 µs before the recorded send: its
    light_lost truth fell before the cycle began, and the harness rightly dropped 40 of the 64 lines as stale)."""
    import asyncio

    from devices.emulated.ocs_server import _StampedConnection
    from devices.timing import Received

    class Stamps:
        def __init__(self, received):
            self.received = received

        def recv(self, sock, size):
            return self.received

    def read(received):
        connection = _StampedConnection.__new__(_StampedConnection)
        connection._stamps, connection._sock, connection._lost = Stamps(received), None, False
        return asyncio.run(connection.read())

    assert read(Received(b"ENT-PATCH::1,17:3:;", 5_000_000, 480_000, True)) == (b"ENT-PATCH::1,17:3:;", 5_480_000)
    assert read(Received(b"x;", 5_000_000, 0, False)) == (b"x;", None)  # no stamp: the physics takes its own time


def test_a_clock_pair_interrupted_between_its_reads_is_read_again(monkeypatch):
    """A realtime/monotonic pair whose reads a preemption or a thread switch split (1 ms apart) bounds its
    conversions only to half that: it is read once more and the narrower kept; a narrow pair is read once."""
    import devices.timing as timing

    mono = iter([0, 1_000_000, 2_000_000, 2_000_100, 3_000_000, 3_000_050])
    real = iter([10_000_000_400_000, 10_000_002_000_050, 10_000_003_000_025])
    monkeypatch.setattr(timing, "now_ns", lambda: next(mono))
    monkeypatch.setattr(timing, "time", type("Clock", (), {"time_ns": staticmethod(lambda: next(real))}))
    assert timing.ClockPair.now() == timing.ClockPair(2_000_050, 10_000_000_000_000, 100)
    assert timing.ClockPair.now() == timing.ClockPair(3_000_025, 10_000_000_000_000, 50)
    assert next(mono, None) is None and next(real, None) is None  # the narrow one took one reading


@settings(suppress_health_check=[HealthCheck.too_slow])  # generation time is the machine's load, not ours
@given(data=st.one_of(st.binary(max_size=80),
                      st.lists(st.sampled_from([b"\r", b"\n", b"\r\n", b"\t", b"\\", b"\x00", b"\x7f", b"\xe2\x82",
                                                b'"1,65"', b"COMPLD", b"\xc3\xa9", b" "]), max_size=24)
                      .map(b"".join)))
def test_the_wire_log_escapes_a_chunk_at_once_as_line_by_line(data):
    # `_Shown` escapes a chunk of only CR, LF, TAB and backslash with whole-chunk replaces; `_lines`, the
    # per-line escape that any other control byte takes, is what it must equal
    from devices.wirelog import _Shown

    shown = _Shown(data)
    assert str(shown) == shown._lines()
