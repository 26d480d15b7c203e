"""The host agent protocol (ARCHITECTURE.md) as the emulated host implements it, checked over real SSH
against the bench's host clocks and ground truth."""
from __future__ import annotations

import threading
import time

import pytest

from devices.emulated.host.agent import AGENT_FIELDS
from devices.errors import TransportClosed
from devices.ssh import SshTransport
from devices.timing import Deadline, now_ns

AGENT = "~/.cache/ocs-hil/hilagent-test.py"
# ground-truth stage -> the watch line it must produce
STAGE_FIELD = {"light_detected": ("rx_los", "0"), "cdr_locked": ("rx_lol", "0"), "phy_up": ("carrier", "1"),
               "port_active": ("state", "ACTIVE"), "light_lost": ("rx_los", "1"), "port_down": ("carrier", "0")}


@pytest.fixture(scope="module")
def ssh(server):
    with SshTransport(server.resource()) as t:
        t.run(f"mkdir -p ~/.cache/ocs-hil && cat > {AGENT}", stdin="# the agent program\n", check=True)
        yield t


@pytest.fixture(autouse=True)
def unpatched_switch(request):
    """Each test that patches the module's switch starts from no cross-connects, whatever ran before it on this
    worker (xdist hands a worker the file's tests in any subset)."""
    if "bench" in request.fixturenames:
        bench = request.getfixturevalue("bench")
        bench.ocs_apply({}, removes=list(bench.ocs_patches()))
        assert bench.wait_idle()
    yield


def probe_timesrv(ssh, bench, host: str, probes: int, prefix: str) -> None:
    """`probes` round trips to the agent's time responder: each token echoed with a host time that causality
    allows (the host read its clock between our send and our receive)."""
    with ssh.stream(f"python3 -u {AGENT} timesrv") as stream:
        for i in range(probes):
            sent = now_ns()
            stream.write(f"{prefix}{i}\n")
            recv_ns, line = stream.readline(Deadline(10))
            token, host_ns = line.split()
            assert token == f"{prefix}{i}"
            assert bench.host_time(host, sent) <= int(host_ns) <= bench.host_time(host, recv_ns)


def test_timesrv_answers_with_the_host_clock(ssh, bench, server):
    probe_timesrv(ssh, bench, server.host_name, 200, "t")


def test_timesrv_reads_its_clock_midway_when_the_hub_is_held_up(ssh, bench, server):
    """A token that waits in the emulator's socket while its SSH hub is busy: the host time answered is the
    clock midway between the token's arrival (kernel) and the reply, as an idle host's would be — so the wait
    falls on both legs of the probe alike and the harness's midpoint estimate stays unbiased. A stamp taken
    when the hub got to the token would come after the hub was free again."""
    from devices.sshhub import shared_hub

    host = server.host_name
    with ssh.stream(f"python3 -u {AGENT} timesrv") as stream:
        stream.write("warm\n")
        assert stream.readline(Deadline(10))[1].startswith("warm ")
        held = 0
        for i in range(5):
            busy, released = threading.Event(), []
            shared_hub().call_soon(lambda: (busy.set(), time.sleep(0.2), released.append(now_ns())))  # both ends'
            assert busy.wait(10)
            sent = now_ns()
            stream.write(f"held{i}\n")
            recv_ns, line = stream.readline(Deadline(10))
            host_ns = int(line.split()[1])
            # the harness time at which the host read its clock (drift: ppm, negligible over this span)
            read_at = sent + (host_ns - bench.host_time(host, sent))
            assert sent <= read_at <= recv_ns and released and recv_ns >= released[0]
            hold = released[0] - sent
            if hold < 100_000_000:  # this thread was late to send (a loaded machine): no wait to look at
                continue
            held += 1
            assert read_at - sent <= 0.8 * hold  # midway: ~0.5 of the wait; read when the hub got to it: >= 1
        assert held >= 1


def _read_watch(stream, until, deadline_s=10.0):
    lines = []
    deadline = Deadline(deadline_s)
    while not until(lines):
        item = stream.readline(deadline)
        assert item is not None, f"watch output stopped after {lines}"
        host_ns, netdev, field, value, interval = item[1].split()
        lines.append((int(host_ns), netdev, field, value, int(interval)))
    return lines


def test_watch_reports_each_change_at_the_next_poll_tick(ssh, bench, server):
    host = server.host_name
    nic = bench.nic_ports(host)[0]
    other = bench.nic_ports(host)[1]
    interval_us, ethtool_us = 2000, 5000
    command = (f"python3 -u {AGENT} watch --interval-us {interval_us} --ethtool-interval-us {ethtool_us} "
               f"{nic.netdev}={nic.rdma_dev}/{nic.rdma_port} {other.netdev}={other.rdma_dev}/{other.rdma_port}")
    with ssh.stream(command) as stream:
        initial = _read_watch(stream, lambda lines: len(lines) == 2 * len(AGENT_FIELDS))
        for netdev in (nic.netdev, other.netdev):
            snap = bench.nic_snapshot(host, netdev)
            got = {field: value for _, n, field, value, _ in initial if n == netdev}
            assert {interval for *_, interval in initial} == {0}  # initial values, as the real agent
            assert got == {"rx_los": "1", "rx_lol": "1", "carrier": "0", "operstate": snap.operstate,
                           "phys_state": snap.phys_state, "state": snap.ib_state}
        start = len(bench.ground_truth())
        bench.ocs_apply({nic.ocs_tx: nic.ocs_rx})
        changes = _read_watch(stream, lambda lines: ("state", "ACTIVE") in [(f, v) for _, _, f, v, _ in lines]
                              and ("rx_lol", "0") in [(f, v) for _, _, f, v, _ in lines])
        bench.ocs_apply({}, removes=[nic.ocs_tx])
        # until every field has its final value: carrier and state share a tick, rx_los has its own grid
        changes += _read_watch(stream, lambda lines: {("carrier", "0"), ("state", "DOWN"), ("rx_los", "1")}
                               <= {(f, v) for _, _, f, v, _ in lines})
    truth = [g for g in bench.ground_truth()[start:] if g["host"] == host and g["port"] == nic.netdev
             and g["stage"] in STAGE_FIELD]
    assert {g["stage"] for g in truth} == set(STAGE_FIELD)
    assert all(netdev == nic.netdev for _, netdev, *_ in changes)  # the untouched port stayed silent
    for g in truth:
        field, value = STAGE_FIELD[g["stage"]]
        (line,) = [c for c in changes if (c[2], c[3]) == (field, value)]
        step_ns = (ethtool_us if field in ("rx_los", "rx_lol") else interval_us) * 1000
        assert line[4] == step_ns
        # the change happened in (HOST_NS - INTERVAL_NS, HOST_NS] on the host clock
        assert bench.host_time(host, g["t_ns"]) <= line[0] <= bench.host_time(host, g["t_ns"] + step_ns)
    final = bench.nic_snapshot(host, nic.netdev)
    last = {field: value for _, netdev, field, value, _ in initial + changes if netdev == nic.netdev}
    assert last["carrier"] == str(int(final.carrier)) and last["state"] == final.ib_state


def test_watch_without_rdma_or_ethtool_watches_netdev_fields_until_stdin_closes(ssh, bench, server):
    nic = bench.nic_ports(server.host_name)[1]
    with ssh.stream(f"python3 -u {AGENT} watch --interval-us 1000 --ethtool-interval-us 0 {nic.netdev}") as s:
        initial = _read_watch(s, lambda lines: len(lines) == 2)
        assert sorted(field for _, _, field, _, _ in initial) == ["carrier", "operstate"]
        assert s.readline(Deadline(0.2)) is None
        s.close_stdin()
        with pytest.raises(TransportClosed):
            s.readline(Deadline(10))
        assert s.exit_status == 0


def test_watch_rejects_unknown_ports(ssh):
    result = ssh.run(f"python3 -u {AGENT} watch --interval-us 1000 eth9=mlx5_9/1")
    assert result.exit_status == 2 and "no such port eth9=mlx5_9/1" in result.stderr
    assert ssh.run(f"python3 -u {AGENT} watch ens1f0np0=mlx5_0/1").exit_status == 2
    assert ssh.run(f"python3 -u {AGENT} frobnicate").exit_status == 2


def test_probe_first_packet_after_the_link_comes_up(ssh, bench, server):
    host = server.host_name
    nic = bench.nic_ports(host)[1]
    with ssh.stream(f"python3 -u {AGENT} probe-recv --iface {nic.netdev} --gap-us 1000") as recv:
        sender = ssh.stream(f"python3 -u {AGENT} probe-send --iface {nic.netdev} --template {'00' * 74} "
                            f"--interval-us 100")
        # both commands running before the light comes (a receiver started late, as a real one, reports the
        # first probe after its start, not the flow's first)
        until = time.monotonic() + 10
        while time.monotonic() < until and not (
                server.agent_streams().routed(nic.netdev, "probe_first") and bench.probing(host, nic.netdev)):
            time.sleep(0.005)
        start = len(bench.ground_truth())
        bench.ocs_apply({nic.ocs_tx: nic.ocs_rx})  # loopback: the port receives its own probes
        item = recv.readline(Deadline(10))
        assert item is not None, "no first packet"
        host_ns, kind, mac, seq = item[1].split()
        (first,) = [g for g in bench.ground_truth()[start:] if g["stage"] == "first_packet"]
        active = [g for g in bench.ground_truth()[start:] if g["stage"] == "port_active"]
        assert (kind, mac) == ("first", nic.mac) and int(seq) >= 0
        assert int(host_ns) == bench.host_time(host, first["t_ns"])  # a kernel stamp: exact
        assert first["t_ns"] >= active[0]["t_ns"]
        sender.close_stdin()  # probe-send ends when its stdin closes
        with pytest.raises(TransportClosed):
            while sender.readline(Deadline(10)) is not None:
                pass
        assert sender.exit_status == 0 and sender.stderr == ""
        sender.close()
    bench.ocs_apply({}, removes=[nic.ocs_tx])


def test_counters_sample_the_bytes_a_running_transfer_moved_at_each_tick(ssh, bench, server):
    """The emulated sampler's values are the fabric's integration at each tick: a 1 GiB ib_write_bw over a
    400 Gb/s circuit rises at the circuit's rate and ends exactly 2^30 octets (/4) higher."""
    from devices.hostagent import parse_counter_line

    me = bench.nic_ports(server.host_name)[0]
    peer = next(m for m in bench.all_nic_ports() if m.host != me.host)
    bench.ocs_apply({me.ocs_tx: peer.ocs_rx, peer.ocs_tx: me.ocs_rx})
    assert bench.wait_idle()
    counter = f"/sys/class/infiniband/{me.rdma_dev}/ports/{me.rdma_port}/counters/port_xmit_data"
    start_words = int(ssh.run(f"cat {counter}", check=True).stdout)
    with ssh.stream(f"python3 -u {AGENT} counters --interval-us 500 {me.rdma_dev}/{me.rdma_port}") as stream:
        done = ssh.run(f"ib_write_bw -d {me.rdma_dev} -s 1048576 -n 1024 --link-gbps 400 {peer.host}", check=True)
        end_host_ns = bench.host_clock_ns(me.host)
        samples = []
        while not samples or samples[-1].host_ns < end_host_ns:
            item = stream.readline(Deadline(10))
            assert item is not None, f"counter output stopped after {samples[-3:]}"
            samples.append(parse_counter_line(item[1]))
    assert "1048576" in done.stdout
    words = [s.xmit_words for s in samples]
    assert words == sorted(words) and words[-1] == start_words + (1 << 30) // 4
    assert int(ssh.run(f"cat {counter}", check=True).stdout) == words[-1]
    rates = [(b.xmit_words - a.xmit_words) * 4 / ((b.host_ns - a.host_ns) / 1e9) for a, b in zip(samples, samples[1:])]
    assert max(rates) == pytest.approx(50e9, rel=1e-3)  # the circuit's 400 Gb/s between two ticks
    assert all(s.read_ns == 0 and s.port == f"{me.rdma_dev}/{me.rdma_port}" for s in samples)


def test_a_hosts_streams_share_one_subscription_and_get_only_their_changes():
    """The physics calls one callback per change of a host, whatever its number of streams; a probe receiver
    writes the first packets of its own port only (not another port's, not another field's change)."""
    import threading
    from types import SimpleNamespace

    from devices.emulated.nic import NicChange
    from devices.emulated.host.agent import _ProbeRecvStream
    from devices.emulated.host.streams import AgentStreams

    callbacks, written, wrote = [], [], threading.Event()
    bench = SimpleNamespace(subscribe=lambda host, cb: callbacks.append(cb) or (lambda: None),
                            host_time=lambda host, t: t + 1000)
    server = SimpleNamespace(host_name="gpu1", bench=bench)
    streams = AgentStreams(server)
    ctx = SimpleNamespace(bench=bench, host="gpu1", out=lambda text: (written.append(text), wrote.set()))
    mine, other = _ProbeRecvStream(ctx, "ens2f0np0"), _ProbeRecvStream(ctx, "ens3f0np0")
    streams.add(mine)
    streams.add(other)
    streams.remove(other)
    assert len(callbacks) == 1
    for netdev, field in (("ens1f0np0", "probe_first"), ("ens2f0np0", "carrier"), ("ens3f0np0", "probe_first"),
                          ("ens2f0np0", "probe_first")):
        callbacks[0](NicChange(mine.started, "gpu1", netdev, field, "0c:42:a1:00:01:01 7"))
    assert wrote.wait(10)  # the changes are handled in order: the earlier ones were dropped, not delayed
    streams.close()
    assert written == [f"{mine.started + 1000} first 0c:42:a1:00:01:01 7\n"]


def test_one_probe_receiver_over_several_ports_names_each_line_s_port():
    """`probe-recv` over several ports (a host's one receiver): it gets the first probes of its ports only, each
    line ending with its port (what `parse_port_probe_line` reads, as from the real agent); the changes its host's
    thread hands it at once make one write."""
    from types import SimpleNamespace

    from devices.emulated.nic import NicChange
    from devices.emulated.host.agent import _ProbeRecvStream
    from devices.emulated.host.streams import AgentStreams
    from devices.hostagent import ProbeLine, parse_port_probe_line

    callbacks, written = [], []
    bench = SimpleNamespace(subscribe=lambda host, cb: callbacks.append(cb) or (lambda: None),
                            host_time=lambda host, t: t + 1000)
    streams = AgentStreams(SimpleNamespace(host_name="gpu1", bench=bench))
    ctx = SimpleNamespace(bench=bench, host="gpu1", out=written.append)
    both = _ProbeRecvStream(ctx, "ens1f0np0", "ens2f0np0")
    streams.add(both)
    for netdev, field in (("ens2f0np0", "probe_first"), ("ens3f0np0", "probe_first"),
                          ("ens1f0np0", "carrier"), ("ens1f0np0", "probe_first")):
        callbacks[0](NicChange(both.started + 5, "gpu1", netdev, field, "0c:42:a1:00:01:01 7"))
    until = time.monotonic() + 10
    while time.monotonic() < until and "".join(written).count("\n") < 2:
        time.sleep(0.005)
    streams.close()
    assert [parse_port_probe_line(line) for line in "".join(written).splitlines()] == [
        (netdev, ProbeLine(both.started + 1005, "first", "0c:42:a1:00:01:01", 7)) for netdev in ("ens2f0np0", "ens1f0np0")]
    change = NicChange(both.started + 5, "gpu1", "ens1f0np0", "probe_first", "0c:42:a1:00:01:01 8")
    assert both.lines([(0, change), (0, change)]).count("\n") == 2  # handed over together: one write


def test_probe_stamps_are_taken_at_the_socket_on_both_legs(ssh, bench, server):
    """The clock probe's legs are stamped alike: t1 when the token went to the socket (not before the channel's
    locks and encryption), t4 when the hub took the reply off the socket (not when a thread got round to
    reading it); a reply read late keeps its arrival stamp."""
    host = server.host_name
    with ssh.stream(f"python3 -u {AGENT} timesrv") as stream:
        for i in range(20):
            before = now_ns()
            stream.write(f"s{i}\n")
            assert before <= stream.sent_ns <= now_ns()
            deadline = Deadline(10)
            while not stream._channel.recv_ready():  # the reply is in the channel, not yet read
                assert not deadline.expired(), "no reply"
                time.sleep(0.0005)
            in_channel = now_ns()
            recv_ns, line = stream.readline(Deadline(10))
            assert stream.sent_ns <= recv_ns <= in_channel
            token, host_ns = line.split()
            assert token == f"s{i}"
            assert bench.host_time(host, stream.sent_ns) <= int(host_ns) <= bench.host_time(host, recv_ns)


def test_emulated_time_responder_stamps_midway_between_arrival_and_reply(monkeypatch):
    """HOST_NS is the host clock midway between the token's arrival on the hub and the reply's send, so the
    responder thread's wake-up does not lengthen the outbound leg alone."""
    import types

    from devices import sshhub
    from devices.emulated.host import agent

    pipe = sshhub.ArrivalStampedPipe()
    monkeypatch.setattr(sshhub, "now_ns", lambda: 1_000)
    pipe.feed(b"c7\n")
    pipe.close()
    monkeypatch.setattr(agent, "now_ns", lambda: 3_000)  # the thread reads and answers later
    sent = []
    channel = types.SimpleNamespace(in_buffer=pipe, recv=lambda n: pipe.read(n), sendall=sent.append)
    bench = types.SimpleNamespace(host_time=lambda host, mono: mono + 5_000_000)
    ctx = types.SimpleNamespace(bench=bench, host="gpu1", channel=channel)
    assert agent.AGENT_COMMANDS["timesrv"](ctx, ["timesrv"]) == 0
    assert sent == [b"c7 5002000\n"]


def test_timesrv_is_answered_on_the_hub_without_the_commands_thread(ssh, bench, server, monkeypatch):
    """A probe's reply leaves from the SSH hub as the token arrives: the time responder needs no command
    thread (here the command's thread never runs), and the stamp lies between the send and the receive."""
    from devices.emulated.host import ssh as host_ssh

    started = []
    monkeypatch.setattr(host_ssh.HostsLoop, "run_command", lambda self, target, args, name: started.append(name))
    probe_timesrv(ssh, bench, server.host_name, 5, "h")
    assert len(started) == 1  # the exec request was taken, its thread never started


def test_time_responder_hands_replies_to_the_commands_thread_when_the_window_is_short():
    """A send from the hub must never wait for the client: with the window short the reply goes to the
    command's thread, and every later one too (in order); the client's window is given back as tokens arrive."""
    import types

    from devices.emulated.host.agent import TimeResponder

    sent, acks = [], []
    channel = types.SimpleNamespace(out_window_size=4, out_max_packet_size=32768, send=sent.append,
                                    _check_add_window=lambda n: acks.append(n) or 0)
    pipe = TimeResponder(channel, types.SimpleNamespace(host_time=lambda host, mono: 7), "gpu1")
    pipe.feed(b"a1\nb")
    channel.out_window_size = 1 << 20
    pipe.feed(b"2\n")
    assert sent == [] and pipe.read(100) == b"a1 7\nb2 7\n" and acks == [4, 2]
    pipe2 = TimeResponder(channel, types.SimpleNamespace(host_time=lambda host, mono: 7), "gpu1")
    pipe2.feed(b"c3\n")
    assert sent == [b"c3 7\n"] and len(pipe2) == 0


def test_a_stream_whose_channel_is_gone_at_its_first_lines_ends_unregistered():
    """The client gone before the initial values are written: the command ends (no wait on its own lock)
    and no change is routed to it any more."""
    import threading
    from types import SimpleNamespace

    from devices.emulated.host.agent import _ProbeRecvStream
    from devices.emulated.host.context import ChannelGone
    from devices.emulated.host.streams import AgentStreams

    def gone(text):
        raise ChannelGone()

    bench = SimpleNamespace(subscribe=lambda host, cb: (lambda: None), probe_flow=lambda host, netdev: None)
    streams = AgentStreams(SimpleNamespace(host_name="gpu1", bench=bench))
    ctx = SimpleNamespace(bench=bench, host="gpu1", out=gone, server=SimpleNamespace(agent_streams=lambda: streams))
    stream = _ProbeRecvStream(ctx, "ens1f0np0")
    ended = threading.Event()

    def serve():
        try:
            stream.serve(lambda: "0 first x 1\n")
        except ChannelGone:
            ended.set()

    threading.Thread(target=serve, daemon=True).start()
    assert ended.wait(10)
    streams.close()
    assert stream.closed and all(not routes for routes in streams._routes.values())


def test_watch_reads_a_loss_of_light_shorter_than_a_poll_latched(ssh, bench, server):
    """Re-pairing a lit port at once (the `instant` profile: the light goes and comes back at one instant) is a
    loss of light no poll sees live. `ethtool -m` reads the module's LOS flag latched, so the agent's next poll
    reads it set ("1") and the poll after that clear ("0"): the light came back within the "1"'s interval, one
    poll before the "0"'s own — what harness.bench.stages.own_bound allows for."""
    host = server.host_name
    nic, other = bench.nic_ports(host)[:2]
    ethtool_us = 5000
    bench.ocs_apply({nic.ocs_tx: nic.ocs_rx})
    assert bench.wait_idle()
    with ssh.stream(f"python3 -u {AGENT} watch --interval-us 2000 --ethtool-interval-us {ethtool_us} "
                    f"{nic.netdev}={nic.rdma_dev}/{nic.rdma_port}") as stream:
        initial = _read_watch(stream, lambda lines: len(lines) == len(AGENT_FIELDS))
        assert ("rx_los", "0") in [(f, v) for _, _, f, v, _ in initial]
        start = len(bench.ground_truth())
        bench.ocs_apply({other.ocs_tx: nic.ocs_rx}, removes=[nic.ocs_tx])
        changes = _read_watch(stream, lambda lines: ("rx_los", "0") in [(f, v) for _, _, f, v, _ in lines])
    los = [(host_ns, value, interval) for host_ns, _, field, value, interval in changes if field == "rx_los"]
    step = ethtool_us * 1000
    assert [(value, interval) for _, value, interval in los] == [("1", step), ("0", step)]
    (set_at, _, _), (clear_at, _, _) = los
    assert abs(clear_at - (set_at + step)) <= step // 1000  # the very next poll (on the host's drifting clock)
    truth = {g["stage"]: bench.host_time(host, g["t_ns"]) for g in bench.ground_truth()[start:]
             if g["host"] == host and g["port"] == nic.netdev and g["stage"] in ("light_lost", "light_detected")}
    assert truth["light_lost"] == truth["light_detected"]  # dark for no time at all
    assert set_at - step < truth["light_detected"] <= set_at  # within the "1"'s interval, not the "0"'s


def test_install_names_the_python_it_runs_under_and_refuses_a_missing_or_old_one(server, monkeypatch):
    """The agent is checked where it will run, once, at install: its Python's version is kept; a host whose
    python3 is older than the agent needs (a RHEL 8 host's 3.6.8) or has none at the inventory's path is an error
    naming it and the inventory's `python:`, not a stream that dies later."""
    import dataclasses

    from devices.errors import DeviceError
    from devices.hostagent import HostAgent

    with SshTransport(server.resource()) as t:
        agent = HostAgent(t)
        agent.install()
        assert agent.python_version == server.tools.python
        monkeypatch.setattr(server, "tools", dataclasses.replace(server.tools, python="3.6.8"))
        with pytest.raises(DeviceError, match=r"needs Python 3\.7 or newer; /usr/bin/python3 is 3\.6\.8; name a "
                                              r"newer Python 3 in the inventory \(`python:`\)"):
            HostAgent(t).install()
        monkeypatch.undo()
        with pytest.raises(DeviceError, match=r"cannot run '/opt/python3\.11/bin/python3' on the host .*`python:`"):
            HostAgent(t, python="/opt/python3.11/bin/python3").install()


def test_install_writes_the_agent_aside_and_renames_it_so_a_shared_home_never_holds_half_of_it(server, monkeypatch):
    """Hosts that share a home (NFS, as clusters do) install the same content-addressed path at once: written in
    place, one host's `cat >` truncated the file under another host's start (1 of 160 parallel installs against one
    real sshd's home ran the agent on an empty file). The upload goes to a path of its own, then `mv -f` renames it
    over the agent's path whole; the emulated host's `mv` renames as GNU mv does."""
    from devices.agent import agent_path, agent_source
    from devices.hostagent import HostAgent

    with SshTransport(server.resource()) as t:
        commands = []
        run = t.run
        monkeypatch.setattr(t, "run", lambda command, **kw: commands.append(command) or run(command, **kw))
        HostAgent(t).install()
        HostAgent(t).install()
        monkeypatch.undo()
        final = agent_path().removeprefix("~/")
        uploads = [c for c in commands if "cat >" in c]
        assert len(uploads) == 2
        for upload in uploads:
            partial = upload.split("cat > ", 1)[1].split(" && ", 1)[0]
            assert partial.startswith(f"{final}.partial-") and upload.endswith(f"&& mv -f {partial} {final}")
        assert uploads[0] != uploads[1]  # each install its own partial file
        listed = t.run(f"ls {final.rsplit('/', 1)[0]}", check=True).stdout.split()
        assert final.rsplit("/", 1)[1] in listed and not [n for n in listed if ".partial-" in n]  # none left behind
        assert t.run(f"cat {final}", check=True).stdout == agent_source()
        missing = t.run("mv -f nothing-here elsewhere")
        assert (missing.exit_status, missing.stderr) == (1, "mv: cannot stat 'nothing-here': No such file or directory\n")
