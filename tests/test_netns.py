"""The real data plane: agent processes inside network namespaces, carrier driven by the physics, probes
through the u32+mirred OCS cross-connect. Needs root; skipped otherwise. Bounds are loose on purpose
(a loaded 2-core machine); speed is measured in benchmarks/bench_probe.py."""
import contextlib
import itertools
import os
import queue
import subprocess
import sys
import threading
import time

import pytest

from devices.agent import AGENT_FILE, build_probe_template
from devices.emulated.netns import NetnsError, NetnsPlane, list_netns, netns_available
from devices.emulated.physics import OpticalBench
from devices.emulated.profile import profile_from_dict

pytestmark = pytest.mark.netns
_UNAVAILABLE = netns_available()
if _UNAVAILABLE:
    pytest.skip(f"network namespaces: {_UNAVAILABLE}", allow_module_level=True)

_COUNTER = itertools.count()
WAIT_S = 20.0  # generous: only a broken plane takes this long


def fast_profile(hosts: int = 3, offset_ms: float = 0.0) -> dict:
    return {
        "name": "netns-fast",
        "ocs": {"switch": {"dist": "fixed", "ms": 15}, "dark": {"dist": "fixed", "ms": 1}},
        "nic": {"los_clear": {"dist": "fixed", "ms": 1}, "cdr_lock": {"dist": "fixed", "ms": 2},
                "phy_up": {"dist": "fixed", "ms": 5}, "port_active": {"dist": "fixed", "ms": 0},
                "link_down": {"dist": "fixed", "ms": 2}},
        "hosts": {"clock_offset_ms": [offset_ms, offset_ms], "drift_ppm": [0, 0]},
        "topology": {"hosts": hosts, "nics_per_host": 1, "ocs_size": [4, 4]},
    }


@pytest.fixture
def prefix():
    name = f"hilt{os.getpid() % 100000}{next(_COUNTER)}"
    yield name
    assert not [n for n in list_netns() if n.startswith(name)], "namespaces left behind"


@pytest.fixture
def bench():
    b = OpticalBench(profile_from_dict(fast_profile()), seed=3).start()
    yield b
    b.stop()


class Lines:
    """A process's stdout lines, read on a thread, fetched with a timeout."""

    def __init__(self, proc: subprocess.Popen):
        self.proc = proc
        self._q: queue.SimpleQueue = queue.SimpleQueue()
        self.seen: list[str] = []  # every line taken so far, for a failure's message
        threading.Thread(target=self._pump, daemon=True).start()

    def _pump(self):
        for line in self.proc.stdout:
            self._q.put(line.split())
        self._q.put(None)

    def next_matching(self, predicate, timeout: float = WAIT_S) -> list[str]:
        end = time.monotonic() + timeout
        while (left := end - time.monotonic()) > 0:
            try:
                words = self._q.get(timeout=left)
            except queue.Empty:
                break
            if words is None:
                raise AssertionError(f"process ended (rc {self.proc.wait()}) before the expected line; "
                                     f"{self.came()}")
            self.seen.append(" ".join(words))
            if predicate(words):
                return words
        raise AssertionError(f"expected line did not come within {timeout} s; {self.came()}")

    def came(self) -> str:
        return f"{len(self.seen)} lines came, the last: {self.seen[-8:]}"

    def finish(self) -> list[list[str]]:
        """Close stdin (the agent's stop signal) and return the remaining lines."""
        self.proc.stdin.close()
        assert self.proc.wait(timeout=WAIT_S) == 0, self.came()
        rest = []
        while (words := self._q.get(timeout=WAIT_S)) is not None:
            rest.append(words)
        return rest


def agent(plane: NetnsPlane, host: str, *args: str) -> Lines:
    proc = plane.run_in(host, [sys.executable, "-u", str(AGENT_FILE), *args], stdin=subprocess.PIPE,
                        stdout=subprocess.PIPE, text=True)
    return Lines(proc)


def truth_ns(bench: OpticalBench, stage: str, host: str, after: int = 0) -> int:
    return next(t["t_ns"] for t in bench.ground_truth() if t["stage"] == stage and t["host"] == host
                and t["t_ns"] >= after)


def test_plane_layout_and_cleanup(bench, prefix):
    with NetnsPlane(bench, prefix) as plane:
        names = list_netns()
        assert {f"{prefix}ocs", f"{prefix}h1", f"{prefix}h2", f"{prefix}h3"} <= set(names)
        a = bench.all_nic_ports()[0]
        out = subprocess.run(["ip", "-n", plane.netns_of(a.host), "-o", "link", "show", a.netdev],
                             capture_output=True, text=True, check=True).stdout
        assert out.startswith(f"{a.ifindex}: {a.netdev}@if{plane.port(a.host, a.netdev).ocs_ifindex}:")
        assert a.mac in out and "NO-CARRIER" in out  # no light yet
        addr = subprocess.run(["ip", "-n", plane.netns_of(a.host), "-o", "-4", "addr", "show", a.netdev],
                              capture_output=True, text=True, check=True).stdout
        assert f"inet {plane.port(a.host, a.netdev).ip}/15" in addr


def test_refuses_host_clock_offsets(prefix):
    b = OpticalBench(profile_from_dict(fast_profile(offset_ms=3.0)))
    with pytest.raises(NetnsError, match="clock offset"):
        NetnsPlane(b, prefix).start()


def test_agent_timesrv_and_watch_inside_a_namespace(bench, prefix):
    with NetnsPlane(bench, prefix) as plane:
        a = bench.all_nic_ports()[0]
        ts = agent(plane, a.host, "timesrv")
        before = time.time_ns()
        ts.proc.stdin.write("x1\n")
        ts.proc.stdin.flush()
        token, stamp = ts.next_matching(lambda w: True)
        assert token == "x1" and before <= int(stamp) <= time.time_ns()
        ts.finish()

        watch = agent(plane, a.host, "watch", "--interval-us", "500", "--ethtool-interval-us", "0", a.netdev)
        assert watch.next_matching(lambda w: w[2] == "carrier")[1:4] == [a.netdev, "carrier", "0"]
        for up in (True, False, True):
            sent = plane.set_carrier(a.host, a.netdev, up)
            assert plane.settle()
            acked = time.time_ns()
            line = watch.next_matching(lambda w: w[2] == "carrier")
            host_ns, interval = int(line[0]), int(line[4])
            assert line[3] == str(int(up))
            # The change happened between our request and the kernel's ack; the line's window must hold it.
            assert host_ns > sent and host_ns - interval < acked
        watch.finish()
        assert not plane.errors


def test_probes_follow_the_physics_and_the_mirrors(bench, prefix):
    with NetnsPlane(bench, prefix) as plane:
        a, b, c = bench.all_nic_ports()
        pa, pb = plane.port(a.host, a.netdev), plane.port(b.host, b.netdev)
        epoch = bench.host_clock_params(a.host)["epoch_ns"]  # host realtime = monotonic + epoch (offset 0)
        gap_us = "20000"
        rx_b = agent(plane, b.host, "probe-recv", "--iface", b.netdev, "--gap-us", gap_us)
        rx_c = agent(plane, c.host, "probe-recv", "--iface", c.netdev, "--gap-us", gap_us)
        template = build_probe_template(a.mac, b.mac, pa.ip, pb.ip)
        tx = agent(plane, a.host, "probe-send", "--iface", a.netdev, "--template", template.hex(),
                   "--interval-us", "1000")
        time.sleep(0.2)  # probes run into a dark switch: nothing may arrive

        t_apply = bench.ocs_apply({a.ocs_tx: b.ocs_rx, b.ocs_tx: a.ocs_rx})
        first_b = rx_b.next_matching(lambda w: w[1] == "first")
        assert first_b[2] == a.mac
        active = max(truth_ns(bench, "port_active", a.host), truth_ns(bench, "port_active", b.host))
        first_mono = int(first_b[0]) - epoch
        assert active >= t_apply
        # Frames can only pass once both OCS-side veths are up, which follows the physics' events.
        assert -1_000_000 <= first_mono - active <= 5_000_000_000

        # Re-point A's transmitter from B to C: probes now reach C and stop at B.
        repoint = bench.ocs_apply({a.ocs_tx: c.ocs_rx}, removes=[a.ocs_tx])
        first_c = rx_c.next_matching(lambda w: w[1] == "first")
        assert first_c[2] == a.mac
        c_active = truth_ns(bench, "port_active", c.host, after=repoint)
        assert -1_000_000 <= int(first_c[0]) - epoch - c_active <= 5_000_000_000
        last_b = rx_b.next_matching(lambda w: w[1] == "last")
        assert last_b[2] == a.mac
        time.sleep(0.1)
        summary = tx.finish()
        assert summary and summary[-1][0] == "sent" and int(summary[-1][1]) > 0
        late_b = rx_b.finish()
        rx_c.finish()
        assert int(last_b[3]) < int(first_c[3])
        # Nothing reached B after the re-point (a stall could add first/last pairs, but only older ones).
        assert all(int(w[3]) < int(first_c[3]) for w in late_b)
        assert plane.redirects() == {a.ocs_tx: c.ocs_rx, b.ocs_tx: a.ocs_rx}
        assert not plane.errors


@contextlib.contextmanager
def one_host_beside_a_two_port_host(prefix: str):
    """Host A (one NIC) and host B (two NICs) on one switch, their namespaces up: (bench, plane); the plane
    logged no errors by the end."""
    profile = fast_profile(hosts=2)
    profile["topology"] = {"hosts": 2, "nics_per_host": 2, "ocs_size": [4, 4]}
    two = OpticalBench(profile_from_dict(profile), seed=3).start()
    try:
        with NetnsPlane(two, prefix) as plane:
            yield two, plane
            assert not plane.errors, plane.errors
    finally:
        two.stop()


def test_one_receiver_over_a_host_s_ports_names_the_port_of_each_line(prefix):
    """`probe-recv` over several ports: each line ends with the port the probe came in on (the line protocol of
    ARCHITECTURE.md, as `devices.hostagent.parse_port_probe_line` reads it); a re-pointed flow is `first` on its
    new port and `last` on its old one."""
    from devices.hostagent import parse_port_probe_line

    with one_host_beside_a_two_port_host(prefix) as (two, plane):
        a, _, b1, b2 = two.all_nic_ports()
        assert b1.host == b2.host != a.host
        pa, pb = plane.port(a.host, a.netdev), plane.port(b1.host, b1.netdev)
        rx = agent(plane, b1.host, "probe-recv", "--iface", b1.netdev, "--iface", b2.netdev, "--gap-us", "20000")
        template = build_probe_template(a.mac, b1.mac, pa.ip, pb.ip)
        tx = agent(plane, a.host, "probe-send", "--iface", a.netdev, "--template", template.hex(),
                   "--interval-us", "1000")
        two.ocs_apply({a.ocs_tx: b1.ocs_rx, b1.ocs_tx: a.ocs_rx})
        port, first_1 = parse_port_probe_line(" ".join(rx.next_matching(lambda w: w[1] == "first")))
        assert (port, first_1.src_mac) == (b1.netdev, a.mac)
        two.ocs_apply({a.ocs_tx: b2.ocs_rx}, removes=[a.ocs_tx])
        seen = {}  # (kind, port) -> its line: the old port's last and the new one's first come in either order
        while not {("first", b2.netdev), ("last", b1.netdev)} <= seen.keys():
            port, probe = parse_port_probe_line(" ".join(rx.next_matching(lambda w: True)))
            seen.setdefault((probe.kind, port), probe)
        first_2, last_1 = seen["first", b2.netdev], seen["last", b1.netdev]
        assert first_2.src_mac == last_1.src_mac == a.mac and first_1.seq <= last_1.seq < first_2.seq, \
            (first_1, last_1, first_2, rx.came())
        tx.finish()
        rest = rx.finish()
        assert all(len(w) == 5 and w[4] in (b1.netdev, b2.netdev) for w in rest), rest


def test_one_sender_over_a_host_s_ports_sends_each_port_s_own_frame(prefix):
    """`probe-send` over several ports (one process and one SSH session for a host's ports): each port sends its
    own template every tick, so the peer hears whichever port its circuit comes from, with that port's MAC; at the
    end, one summary line per port."""
    with one_host_beside_a_two_port_host(prefix) as (two, plane):
        a, _, b1, b2 = two.all_nic_ports()
        pa = plane.port(a.host, a.netdev)
        rx = agent(plane, a.host, "probe-recv", "--iface", a.netdev, "--gap-us", "20000")
        tx = agent(plane, b1.host, "probe-send", "--interval-us", "1000",
                   *(w for b in (b1, b2) for w in ("--iface", b.netdev, "--template",
                                                   build_probe_template(b.mac, a.mac, plane.port(b.host, b.netdev).ip,
                                                                        pa.ip).hex())))
        two.ocs_apply({b1.ocs_tx: a.ocs_rx, a.ocs_tx: b1.ocs_rx})
        assert rx.next_matching(lambda w: w[1] == "first")[2] == b1.mac
        two.ocs_apply({b2.ocs_tx: a.ocs_rx, a.ocs_tx: b2.ocs_rx}, removes=[b1.ocs_tx, a.ocs_tx])
        assert rx.next_matching(lambda w: w[1] == "first" and w[2] != b1.mac)[2] == b2.mac
        summary = tx.finish()
        assert [w[4] for w in summary] == [b1.netdev, b2.netdev], summary
        assert all(w[0] == "sent" and int(w[1]) > 0 and w[2] == "errors" for w in summary), summary
        rx.finish()


def test_a_receiver_starting_while_a_neighbour_port_carries_probes_reports_none_of_them(prefix):
    """A packet socket opened for one protocol hears every port of its namespace until it is bound to one: a
    `probe-recv` on an idle port, started while its neighbour port carries probes, must print nothing."""
    with one_host_beside_a_two_port_host(prefix) as (two, plane):
        a, _, b1, b2 = two.all_nic_ports()
        pa, pb = plane.port(a.host, a.netdev), plane.port(b1.host, b1.netdev)
        two.ocs_apply({a.ocs_tx: b1.ocs_rx, b1.ocs_tx: a.ocs_rx})
        busy = agent(plane, b1.host, "probe-recv", "--iface", b1.netdev, "--gap-us", "20000")
        tx = agent(plane, a.host, "probe-send", "--iface", a.netdev, "--interval-us", "5", "--spin-us", "1000",
                   "--template", build_probe_template(a.mac, b1.mac, pa.ip, pb.ip).hex())
        busy.next_matching(lambda w: w[1] == "first")  # probes flow into b1 now
        for _ in range(16):  # each start is one chance to hear b1 before its bind
            idle = agent(plane, b1.host, "probe-recv", "--iface", b2.netdev, "--gap-us", "20000")
            time.sleep(0.05)
            assert idle.finish() == [], f"{b2.netdev} carries no probes, yet its receiver printed lines"
        tx.finish()
        busy.finish()


def test_a_failed_start_removes_what_it_built(bench, prefix, monkeypatch):
    import devices.emulated.netns as netns

    real_run = netns._run

    def failing_tc(argv, stdin=None):
        if argv[0] == "tc":
            raise NetnsError("injected tc failure")
        return real_run(argv, stdin)

    monkeypatch.setattr(netns, "_run", failing_tc)
    plane = NetnsPlane(bench, prefix)
    with pytest.raises(NetnsError, match="injected"):
        plane.start()
    assert not [n for n in list_netns() if n.startswith(prefix)]
    assert plane._on_mirror not in bench.on_mirror


def tc_show(plane: NetnsPlane, dev: str) -> str:
    return subprocess.run(["tc", "-n", plane.ocs_netns, "filter", "show", "dev", dev, "ingress"],
                          capture_output=True, text=True, check=True).stdout


def test_mirror_moves_rewire_the_ocs_filters_as_tc_sees_them(bench, prefix):
    with NetnsPlane(bench, prefix) as plane:
        a, b, c = bench.all_nic_ports()
        pa, pb, pc = (plane.port(m.host, m.netdev) for m in (a, b, c))
        assert "mirred" not in tc_show(plane, pa.ocs_dev)
        bench.ocs_apply({a.ocs_tx: b.ocs_rx})
        assert bench.wait_idle() and plane.settle()
        shown = tc_show(plane, pa.ocs_dev)
        assert f"mirred (Egress Redirect to device {pb.ocs_dev})" in shown and "800::800" in shown
        bench.ocs_apply({a.ocs_tx: c.ocs_rx}, removes=[a.ocs_tx])
        assert bench.wait_idle() and plane.settle()
        assert f"mirred (Egress Redirect to device {pc.ocs_dev})" in tc_show(plane, pa.ocs_dev)
        bench.ocs_apply({}, removes=[a.ocs_tx])
        assert bench.wait_idle() and plane.settle()
        assert tc_show(plane, pa.ocs_dev).strip() == ""
        # The netlink requests mean what the equivalent tc command means.
        subprocess.run(plane.tc_command(pa, pb), check=True)
        assert f"mirred (Egress Redirect to device {pb.ocs_dev})" in tc_show(plane, pa.ocs_dev)
        subprocess.run(plane.tc_command(pa, None), check=True)
        assert tc_show(plane, pa.ocs_dev).strip() == ""
        assert not plane.errors


def test_probe_send_builds_its_own_frame_from_dst_mac(bench, prefix):
    with NetnsPlane(bench, prefix) as plane:
        a, b, _ = bench.all_nic_ports()
        bench.ocs_apply({a.ocs_tx: b.ocs_rx, b.ocs_tx: a.ocs_rx})
        rx = agent(plane, b.host, "probe-recv", "--iface", b.netdev, "--gap-us", "20000", "--udp-port", "5000")
        tx = agent(plane, a.host, "probe-send", "--iface", a.netdev, "--dst-mac", b.mac, "--interval-us", "1000",
                   "--udp-port", "5000")
        first = rx.next_matching(lambda w: w[1] == "first")
        assert first[2] == a.mac  # the agent read its own MAC from sysfs
        assert tx.finish()[-1][0] == "sent"
        rx.finish()


def test_hosts_starting_the_agent_at_once_share_one_whole_copy(bench, prefix, monkeypatch):
    """Two hosts' commands upload and start the agent at the same moment. Each must get the same file, complete
    and still there: unlocked, the second made its own directory (the first one's was then deleted by its
    finalizer, under the first command: FileNotFoundError), or ran the copy while it was being written (no
    output). Directory creation is slowed so that the threads surely overlap there."""
    import tempfile as tempfile_module

    made = []
    real = tempfile_module.TemporaryDirectory

    def slow_directory(*args, **kwargs):
        time.sleep(0.02)
        made.append(real(*args, **kwargs))
        return made[-1]

    monkeypatch.setattr(tempfile_module, "TemporaryDirectory", slow_directory)
    plane = NetnsPlane(bench, prefix)  # not started: no namespaces, only its copies of the agent
    source = AGENT_FILE.read_bytes()
    start, paths = threading.Barrier(8), []

    def upload():
        start.wait()
        paths.append(plane.agent_file(source))

    threads = [threading.Thread(target=upload) for _ in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    import gc

    gc.collect()  # a replaced directory's finalizer runs here at the latest
    assert len(made) == 1 and len(set(paths)) == 1
    assert open(paths[0], "rb").read() == source
    plane.stop()
