"""The unmeasured first cycle of a turnaround (it brings the bench into the pattern's first state):
- the first command waits until every host's watch has printed its current values — a watch that starts
  after the switch moved prints that cycle's changes as current values, and the cycle then waited out its
  `cycle_timeout_s` for transitions that never came (a loaded emulator starts a command's thread 0.2 s after
  its exec request; it used to be 0.2-0.5 ms before the first command);
- a fault in it (a timeout, a watch not live) is recorded as a cycle-0 fault naming what did arrive, and
  fails the step: never a silent 'ok, faults: 0';
- an emulated probe receiver that starts while probes already flow reports the first one it sees, as the
  real agent does (it waited for a flow's start it had missed).
The late start is forced, not left to load: the emulated watch of one host waits on a gate."""
from __future__ import annotations

import gc
import json
import queue
import re
import threading
import time
from pathlib import Path
from types import SimpleNamespace

import pytest
import yaml

import harness.bench.hosts as hosts
from devices.emulated.host import agent as emulated_agent, streams
from devices.emulated.physics import OpticalBench
from devices.resources import HostResource
from devices.ssh import SshTransport
from devices.timing import Deadline, now_ns
from harness.cli import main
from harness.bench.hosts import HostSession

PROFILE = {"name": "two-hosts", "description": "small, instant", "source": "none (a test fixture).",
           "ocs": {"switch": {"dist": "fixed", "ms": 1.0}, "dark": {"dist": "fixed", "ms": 0.0}},
           "nic": {k: {"dist": "fixed", "ms": 0.0} for k in ("los_clear", "cdr_lock", "phy_up", "port_active",
                                                            "link_down")},
           "hosts": {"clock_offset_ms": [-5, 5], "drift_ppm": [-10, 10]},
           "topology": {"hosts": 2, "nics_per_host": 2, "ocs_size": [8, 8]}}


def _run(tmp_path: Path, cycle_timeout_s: float) -> tuple[int, dict, list[dict]]:
    (tmp_path / "p.yaml").write_text(yaml.safe_dump(PROFILE))
    (tmp_path / "pb.yaml").write_text(yaml.safe_dump({
        "name": "first", "bench": f"emulated:{tmp_path / 'p.yaml'}", "seed": 1, "cycles": 1,
        "steps": [{"type": "turnaround", "name": "measure", "clock_warmup_s": 0.1, "probes": False,
                   "cycle_timeout_s": cycle_timeout_s}]}))
    code = main(["run", str(tmp_path / "pb.yaml"), "--out", str(tmp_path / "run"), "-q"])
    summary = json.loads((tmp_path / "run" / "summary.json").read_text())
    events = [json.loads(line) for line in (tmp_path / "run" / "events.jsonl").read_text().splitlines()]
    return code, summary, events


def _gate_watch(monkeypatch, host: str) -> SimpleNamespace:
    """`host`'s emulated watch starts only when `gate.open` is set (or, with `gate.opens_after_s`, that long
    after its exec request); `gate.moved_ns`: when the switch first moved."""
    gate = SimpleNamespace(open=threading.Event(), opens_after_s=None, opened_ns=None, moved_ns=None)
    apply = OpticalBench.ocs_apply

    def ocs_apply(self, *args, **kwargs):
        gate.moved_ns = gate.moved_ns or now_ns()
        return apply(self, *args, **kwargs)

    watch = emulated_agent.AGENT_COMMANDS["watch"]

    def gated(ctx, argv):
        if ctx.host == host:
            gate.open.wait(gate.opens_after_s or 60)
            gate.opened_ns = gate.opened_ns or now_ns()
        return watch(ctx, argv)

    monkeypatch.setattr(OpticalBench, "ocs_apply", ocs_apply)
    monkeypatch.setitem(emulated_agent.AGENT_COMMANDS, "watch", gated)
    return gate


def test_the_first_command_waits_for_a_watch_that_starts_late(tmp_path, monkeypatch):
    gate = _gate_watch(monkeypatch, "gpu2")
    gate.opens_after_s = 0.3  # the harness's wait is bounded far above this (WATCH_READY_S)
    code, summary, events = _run(tmp_path, cycle_timeout_s=20)
    # Before the fix the switch moved ~1 ms after the watch's exec request, 0.3 s before the watch started,
    # and the first cycle waited 20 s for gpu2's transitions.
    assert gate.opened_ns < gate.moved_ns
    assert code == 0 and summary["outcome"] == "completed" and summary["summary"]["faults"] == 0
    assert gc.isenabled()  # the step's cycles ran with the collector under their control: it is back on
    measured = [e for e in events if e["cycle"] == 1 and e["stage"] == "port_active"]
    assert sorted(e["host"] for e in measured) == ["gpu1", "gpu1", "gpu2", "gpu2"]


def test_a_timed_out_first_cycle_is_a_recorded_fault_naming_what_arrived(tmp_path, monkeypatch):
    gate = _gate_watch(monkeypatch, "gpu2")  # never opens during the run: gpu2 reports nothing
    monkeypatch.setattr(hosts, "WATCH_READY_S", 0.2)
    try:
        code, summary, events = _run(tmp_path, cycle_timeout_s=0.5)
    finally:
        gate.open.set()
    faults = {(e["cycle"], e["port"], e["source"]) for e in events if e["stage"] == "fault"}
    # gpu2's watch printed nothing at all: past its liveness deadline, each cycle also names that silence
    stalls = {(c, p, s) for c, p, s in faults if re.fullmatch(
        r"(settling: )?watch-stall:gpu2: no line or heartbeat for \d+ ms \(deadline \d+ ms\)", s)}
    assert {c for c, _, _ in stalls} == {0, 1} and len(stalls) == 2, faults
    faults -= stalls
    fields = ", ".join(f"{netdev} {f}" for netdev in ("ens1f0np0", "ens2f0np0")
                       for f in ("carrier", "operstate", "phys_state", "state"))
    missing = "cdr_locked+light_detected+phy_up+port_active"
    assert faults == {
        (0, "", f"settling: host:gpu2: watch gave no current value of {fields} within 0.2 s"),
        (0, "ens1f0np0", f"settling: timeout:missing {missing} after 0.5 s; saw nothing"),
        (0, "ens2f0np0", f"settling: timeout:missing {missing} after 0.5 s; saw nothing"),
        (1, "ens1f0np0", f"timeout:missing {missing}"),  # a measured cycle: its stage events are the record
        (1, "ens2f0np0", f"timeout:missing {missing}")}
    assert not [e for e in events if e["cycle"] == 0 and e["stage"] != "fault"]  # nothing else of it recorded
    assert code == 1 and summary["summary"]["status"] == "failed" and summary["summary"]["faults"] == 7
    checks = {c["name"]: c for c in summary["summary"]["steps"]["measure"]["checks"]}
    assert not checks["bench brought into the pattern's first state"]["ok"]
    assert "gpu2: watch gave no current value" in checks["bench brought into the pattern's first state"]["detail"]
    # gpu1 was live: its ports reached the first state and were measured
    assert sorted(e["port"] for e in events if e["cycle"] == 1 and e["stage"] == "port_active" and
                  e["host"] == "gpu1") == ["ens1f0np0", "ens2f0np0"]


class _FedStream:
    """A watch stream whose lines the test writes (read on a reader thread of its own: no file descriptor)."""
    command = "watch"

    def __init__(self):
        self.lines: queue.SimpleQueue = queue.SimpleQueue()

    def __iter__(self):
        while (line := self.lines.get()) is not None:
            yield now_ns(), line

    def close(self):
        self.lines.put(None)

    def caught_up_ns(self) -> int:  # read as it comes (LineStream's)
        return now_ns()


def test_a_watch_is_live_once_every_sysfs_field_gave_its_current_value():
    stream = _FedStream()
    session = HostSession(HostResource(name="h1", address="127.0.0.1"), transport=SimpleNamespace())
    session.agent = SimpleNamespace(watch=lambda ports, interval_us, ethtool_us, heartbeat_us: stream)
    sink = queue.SimpleQueue()
    session.start_watch([("eth0", "mlx5_0", 1), ("eth1", None, None)], 200, 1000, sink)
    every = ["eth0 carrier", "eth0 operstate", "eth0 phys_state", "eth0 state", "eth1 carrier", "eth1 operstate"]
    assert session.wait_watching(Deadline(0)) == every
    for line in ("1 eth0 carrier 1 0", "2 eth0 operstate up 0", "3 eth0 phys_state LinkUp 0", "4 eth0 rx_los 0 0",
                 "5 eth1 carrier 0 0", "6 eth1 operstate down 0", "7 eth0 state DOWN 200000"):  # a change: not it
        stream.lines.put(line)
    for _ in range(7):
        sink.get(timeout=30)  # the reader thread has handled every line
    assert session.wait_watching(Deadline(0)) == ["eth0 state"]
    stream.lines.put("8 eth0 state ACTIVE 0")
    assert session.wait_watching(Deadline(30)) == []
    stream.close()


def _flow_reaches(bench, nic) -> int:
    """Light the port's loopback circuit and wait until the probe flow's first probe has arrived; its time."""
    start = len(bench.ground_truth())
    bench.ocs_apply({nic.ocs_tx: nic.ocs_rx})  # loopback: the port receives its own probes
    deadline = Deadline(30)
    while not (arrived := [g for g in bench.ground_truth()[start:] if g["stage"] == "first_packet"]):
        assert not deadline.expired(), "the probes never got through"
        time.sleep(0.005)
    return arrived[0]["t_ns"]


class _InboxMarker:
    """Put on an agent's inbox: `taken` is set when its thread routes it (it reads `netdev`), so everything put
    before it has been taken off; no stream has its key."""

    field, t_ns = "marker", 0

    def __init__(self):
        self.taken = threading.Event()

    @property
    def netdev(self) -> str:
        self.taken.set()
        return "marker"


@pytest.mark.parametrize("flow_starts", ["before the receiver's command", "while the receiver registers"])
def test_a_probe_receiver_started_while_probes_flow_reports_the_first_it_sees(bench, server, monkeypatch,
                                                                             flow_starts):
    host, agent = server.host_name, "~/.cache/ocs-hil/hilagent-late.py"
    nic = bench.nic_ports(host)[1]
    if flow_starts == "while the receiver registers":  # between the stream's creation and its registration
        add = streams.AgentStreams.add

        def late_add(self, stream):
            if isinstance(stream, emulated_agent._ProbeRecvStream):
                delivered = [0]  # the latest change the physics handed this host's subscribers, the agent's first
                unsubscribe = bench.subscribe(host, lambda c: delivered.__setitem__(0, max(delivered[0], c.t_ns)))
                try:
                    first = _flow_reaches(bench, nic)
                    deadline = Deadline(30)  # ... and the flow's first probe went by, to nobody: it reached the
                    while delivered[0] < first:  # agent's inbox, and the agent's thread took all before a marker
                        assert not deadline.expired()
                        time.sleep(0.001)
                finally:
                    unsubscribe()
                marker = _InboxMarker()
                self._inbox.put(marker)  # (a probe every 100 µs: on a loaded machine the inbox is never empty)
                assert marker.taken.wait(30)
                time.sleep(0.05)  # the host's thread routes what it took off its inbox
            add(self, stream)

        monkeypatch.setattr(streams.AgentStreams, "add", late_add)
    with SshTransport(server.resource()) as ssh:
        ssh.run(f"mkdir -p ~/.cache/ocs-hil && cat > {agent}", stdin="# the agent program\n", check=True)
        sender = ssh.stream(f"python3 -u {agent} probe-send --iface {nic.netdev} --template {'00' * 74} "
                            f"--interval-us 100")
        if flow_starts == "before the receiver's command":
            _flow_reaches(bench, nic)
        started = now_ns()  # no receiver has registered yet
        with ssh.stream(f"python3 -u {agent} probe-recv --iface {nic.netdev} --gap-us 1000") as recv:
            item = recv.readline(Deadline(30))
            read = now_ns()
            assert item is not None, "a receiver started mid-flow never reported a probe"
            host_ns, kind, mac, seq = item[1].split()
            assert (kind, mac) == ("first", nic.mac)
            assert bench.host_time(host, started) <= int(host_ns) <= bench.host_time(host, read)
        sender.close_stdin()
        sender.close()
    bench.ocs_apply({}, removes=[nic.ocs_tx])


def test_a_watch_packet_s_lines_become_what_the_line_parsers_make_of_each():
    """The one pass over a packet's lines gives, line by line, what `watch_line_fields` / `watch_heartbeat` give:
    a watch observation, a heartbeat, or a fault naming the malformed line (the rest of the packet still counts)."""
    from devices.errors import DeviceError
    from devices.hostagent import watch_heartbeat, watch_line_fields

    delivered = {}
    session = HostSession(HostResource(name="h1", address="127.0.0.1"), transport=SimpleNamespace(),
                          readers=SimpleNamespace(add_lines=lambda stream, on_lines, on_end: delivered.update(
                              on_lines=on_lines)))
    session.agent = SimpleNamespace(watch=lambda ports, interval_us, ethtool_us, heartbeat_us:
                                    SimpleNamespace(caught_up_ns=now_ns))
    got = []
    sink = SimpleNamespace(put_many=got.extend, put=got.append)
    session.start_watch([("eth0", None, None)], 200, 1000, sink)
    lines = ["11 eth0 carrier 1 200000", "", "  ", "12 alive", "13 eth0 bogus 1 0", "x eth0 carrier 1 0",
             f"{2**63} eth0 carrier 1 0", "14 eth0 carrier 1 -1", "15 eth0 carrier 1", "16 alive now",
             " 17  eth0\tstate  ACTIVE 0 ", "18 eth0 operstate up 0", "1_9 eth0 rx_los 0 2_0", "x alive"]
    delivered["on_lines"](777, lines)
    want = []
    for line in lines:
        if not line.strip():
            continue
        try:
            if (beat := watch_heartbeat(line)) is not None:
                want.append(hosts.Observation("alive", "h1", "", "alive", "", beat, 0, 777))
                continue
            host_ns, netdev, field, value, interval_ns = watch_line_fields(line)
            want.append(hosts.Observation("watch", "h1", netdev, field, value, host_ns, interval_ns, 777))
        except DeviceError as exc:
            want.append(hosts.Observation("fault", "h1", "", "agent_output", str(exc)[:300], 0, 0, 777))
    assert got == want
    assert [o.kind for o in got].count("fault") == 7
    assert session.watch_heard_ns == 777  # heard from
    assert session.wait_watching(Deadline(0)) == ["eth0 carrier"]  # operstate's current value came, carrier's not


def test_a_host_s_one_probe_receiver_gives_each_line_its_port():
    """Over several ports the receiver's lines name their port: each becomes that port's probe observation; a line
    naming a port it was not asked for, or without a port, is a fault of its own (the rest still count)."""
    delivered, asked = {}, []
    session = HostSession(HostResource(name="h1", address="127.0.0.1"), transport=SimpleNamespace(),
                          readers=SimpleNamespace(add_lines=lambda stream, on_lines, on_end: delivered.update(
                              on_lines=on_lines)))
    session.agent = SimpleNamespace(probe_recv=lambda iface, gap_us, udp_port: asked.append(iface) or object())
    got = []
    session.start_probe_recv(["eth0", "eth1"], 2000, 4791, SimpleNamespace(put_many=got.extend, put=got.append))
    assert asked == [["eth0", "eth1"]]
    delivered["on_lines"](5, ["11 first 0C:42:A1:00:00:01 7 eth1", "12 last 0c:42:a1:00:00:01 9 eth0",
                              "13 first 0c:42:a1:00:00:01 3 eth9", "14 first 0c:42:a1:00:00:01 3"])
    assert [(o.kind, o.netdev, o.field, o.value, o.host_ns) for o in got[:2]] == [
        ("probe", "eth1", "first", "0c:42:a1:00:00:01 7", 11), ("probe", "eth0", "last", "0c:42:a1:00:00:01 9", 12)]
    assert [(o.kind, o.field) for o in got[2:]] == [("fault", "agent_output")] * 2
    assert "eth9" in got[2].value and "NETDEV" in got[3].value
