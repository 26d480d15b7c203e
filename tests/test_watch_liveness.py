"""A watch stream that goes quiet is noticed (issue #38, item 3): the agent's heartbeat (printed only after a
silence, never while lines flow), the emulated `watch_stall` fault, the cycle rules that mark a stalled host's
unreported stages unobserved instead of implying them from the first probe, and end to end: the stalled cycles
faulted with their cause, the others ok, the summary saying so."""
from __future__ import annotations

import queue
import subprocess
import sys
import threading
from pathlib import Path
from types import SimpleNamespace

import pandas as pd
import pytest
import yaml

from devices.agent import AGENT_FILE
from devices.hostagent import watch_heartbeat
from devices.resources import HostResource
from devices.timing import Deadline, now_ns
from harness.bench.observe import CycleWatch
from harness.bench.scripted import ScriptedObservations
from harness.bench.stages import PortRef, stage_events
from harness.cli import main
from harness.bench.hosts import HostGroup, HostSession, Observation

AGENT = "~/.cache/ocs-hil/hilagent-test.py"
WATCHED = ["light_detected", "cdr_locked", "phy_up", "port_active"]


# ---- the agent
def test_real_agent_prints_a_heartbeat_only_after_a_silence():
    """lo never changes: after its current values, one `HOST_NS alive` per heartbeat period, no more."""
    proc = subprocess.Popen([sys.executable, "-u", str(AGENT_FILE), "watch", "--interval-us", "1000",
                             "--ethtool-interval-us", "0", "--heartbeat-us", "50000", "lo"],
                            stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True)
    lines: queue.SimpleQueue = queue.SimpleQueue()
    threading.Thread(target=lambda: [lines.put(line) for line in proc.stdout], daemon=True).start()
    try:
        first = [lines.get(timeout=20).split() for _ in range(2)]
        assert sorted(f[2] for f in first) == ["carrier", "operstate"]
        beats = [watch_heartbeat(lines.get(timeout=20)) for _ in range(4)]
    finally:
        proc.stdin.close()
        proc.wait(timeout=20)
    assert all(b is not None for b in beats), beats
    gaps = [b - a for a, b in zip([int(first[-1][0])] + beats, beats)]
    assert all(g >= 50_000_000 for g in gaps), gaps  # never before a full period without a line


def test_heartbeat_lines_parse_and_others_are_not_heartbeats():
    assert watch_heartbeat("1700000000000000000 alive\n") == 1700000000000000000
    assert watch_heartbeat("1 lo carrier 1 0") is None
    assert watch_heartbeat("alive") is None


# ---- the emulated agent
def _read(stream, until, deadline_s=10.0):
    lines = []
    deadline = Deadline(deadline_s)
    while not until(lines):
        item = stream.readline(deadline)
        assert item is not None, f"watch output stopped after {lines}"
        lines.append(item[1].split())
    return lines


@pytest.fixture(scope="module")
def ssh(server):
    from devices.ssh import SshTransport

    with SshTransport(server.resource()) as t:
        t.run(f"mkdir -p ~/.cache/ocs-hil && cat > {AGENT}", stdin="# the agent program\n", check=True)
        yield t


def test_emulated_heartbeat_comes_a_period_after_the_last_line_not_while_changes_flow(ssh, bench, server):
    nic = bench.nic_ports(server.host_name)[0]
    period = 100_000_000
    command = (f"python3 -u {AGENT} watch --interval-us 1000 --ethtool-interval-us 2000 --heartbeat-us 100000 "
               f"{nic.netdev}={nic.rdma_dev}/{nic.rdma_port}")
    with ssh.stream(command) as stream:
        lines = _read(stream, lambda got: got and got[-1][-1] == "alive")
        bench.ocs_apply({nic.ocs_tx: nic.ocs_rx})
        lines += _read(stream, lambda got: ["state", "ACTIVE"] in [line[2:4] for line in got])
        lines += _read(stream, lambda got: got and got[-1][-1] == "alive")
        bench.ocs_apply({}, removes=[nic.ocs_tx])
    beats = [i for i, line in enumerate(lines) if line[-1] == "alive"]
    assert len(beats) >= 2 and beats[-1] == len(lines) - 1
    for i in beats:  # each a full period after the line before it (host clock; its drift is ppm)
        assert int(lines[i][0]) - int(lines[i - 1][0]) >= period - 1_000_000, lines


def test_emulated_watch_stall_prints_nothing_then_what_changed_with_its_true_bounds(ssh, bench, server):
    host = server.host_name
    nic = bench.nic_ports(host)[1]
    command = (f"python3 -u {AGENT} watch --interval-us 1000 --ethtool-interval-us 0 --heartbeat-us 50000 "
               f"{nic.netdev}={nic.rdma_dev}/{nic.rdma_port}")
    with ssh.stream(command) as stream:
        _read(stream, lambda got: len(got) == 4)
        start = len(bench.ground_truth())
        server.watch_stalled_until_ns = stalled = now_ns() + 400_000_000
        bench.ocs_apply({nic.ocs_tx: nic.ocs_rx})
        silent = stream.readline(Deadline(0.3))
        assert silent is None or int(silent[0]) >= stalled, silent  # neither lines nor heartbeats
        resumed = _read(stream, lambda got: ["state", "ACTIVE"] in [line[2:4] for line in got])
        bench.ocs_apply({}, removes=[nic.ocs_tx])
    truth = {g["stage"]: g for g in bench.ground_truth()[start:] if g["port"] == nic.netdev}
    line = next(line for line in resumed if line[2:4] == ["state", "ACTIVE"])
    host_ns, interval = int(line[0]), int(line[4])
    assert interval >= 300_000_000  # reaching back to the last tick before the stall
    active = bench.host_time(host, truth["port_active"]["t_ns"])
    assert host_ns - interval < active <= host_ns


def test_an_emulator_running_late_still_dates_each_heartbeat_when_it_was_due():
    """The emulated agent polls on its own clock whatever the emulator's thread is doing: held up 0.85 s, its
    stream's timer finds every beat it missed due at once, and each is printed dated a period after the one
    before, not when the late thread got to it (that would be a silence the agent never had)."""
    from devices.emulated.host.agent import _Tick, _WatchStream

    armed, out = [], []
    ctx = SimpleNamespace(host="h1", out=out.append,
                          server=SimpleNamespace(watch_stalled_until_ns=0,
                                                 agent_streams=lambda: SimpleNamespace(arm=armed.append)),
                          bench=SimpleNamespace(host_time=lambda host, t: t + 7))
    period = 100_000_000
    stream = _WatchStream(ctx, {"eth0": ("carrier",)}, 1_000_000, 2_000_000, heartbeat=period)
    stream.printed_ns = 0
    stream.write([(period, _Tick(*stream.timer, period))])  # now_ns() is far past every due time here
    while armed[-1].t_ns <= 8 * period:
        stream.write([(armed[-1].t_ns, armed[-1])])
    assert [int(line.split()[0]) - 7 for line in out] == [k * period for k in range(1, 9)]
    assert all(line.split()[1] == "alive" for line in out)


# ---- what counts as a silence
PERIOD = 100_000_000  # the agent's heartbeat


def _watched_host():
    """One host's watch over a stream whose reader caught up at `reader["caught_up"]`; `deliver(recv_ns, lines)`."""
    delivered, reader = {}, {"caught_up": 0}
    session = HostSession(HostResource(name="h1", address="127.0.0.1"), transport=SimpleNamespace(),
                          readers=SimpleNamespace(add_lines=lambda stream, on_lines, on_end: delivered.update(
                              on_lines=on_lines)))
    stream = SimpleNamespace(caught_up_ns=lambda: reader["caught_up"])
    session.agent = SimpleNamespace(watch=lambda ports, interval_us, ethtool_us, heartbeat_us: stream)
    group = HostGroup({"h1": session})
    group.liveness_ns = session.watch_gap_ns = 3 * PERIOD
    session.start_watch([("eth0", None, None)], 200, 1000, SimpleNamespace(put_many=lambda b: None, put=print),
                        heartbeat_us=PERIOD // 1000)
    return group, reader, lambda recv_ns, lines: delivered["on_lines"](recv_ns, lines)


def test_lines_printed_on_time_but_received_late_are_no_silence_of_the_agent():
    """A harness (or the emulator in its process) held up 0.8 s receives the agent's beats late and at once: their
    arrival has a gap, the agent's own clock has none. Not a stall."""
    group, reader, deliver = _watched_host()
    base = 10 * PERIOD
    deliver(base, [f"{base} eth0 carrier 1 0"])
    deliver(base + 8 * PERIOD, [f"{base + k * PERIOD} alive" for k in range(1, 9)])
    reader["caught_up"] = base + 8 * PERIOD
    assert group.silence("h1", base, base + 8 * PERIOD) == 0


def test_an_agent_that_printed_nothing_for_a_while_on_its_own_clock_was_silent():
    group, reader, deliver = _watched_host()
    base = 10 * PERIOD
    deliver(base, [f"{base} eth0 carrier 1 0"])
    deliver(base + 8 * PERIOD, [f"{base + 8 * PERIOD} alive"])  # stopped 0.8 s, then a beat
    reader["caught_up"] = base + 9 * PERIOD
    assert group.silence("h1", base, base + 9 * PERIOD) == 8 * PERIOD


def test_a_silence_going_on_counts_only_up_to_when_the_reader_last_caught_up():
    """Nothing heard for 0.8 s: the agent's silence if the stream's reader was current all along; if the reader
    itself last caught up 50 ms after the last line, the rest may be lines waiting unread — not yet a silence."""
    group, reader, deliver = _watched_host()
    base = 10 * PERIOD
    deliver(base, [f"{base} eth0 carrier 1 0"])
    reader["caught_up"] = base + PERIOD // 2
    assert group.silence("h1", base, base + 8 * PERIOD) == PERIOD // 2
    reader["caught_up"] = base + 8 * PERIOD
    assert group.silence("h1", base, base + 8 * PERIOD) == 8 * PERIOD


# ---- the cycle rules
class Liveness:
    """What CycleWatch asks of the hosts' watches (harness.bench.hosts.HostGroup)."""

    def __init__(self, heard: int, liveness_ns: int = 300_000_000):
        self.heard_ns, self.liveness_ns, self.gaps = heard, liveness_ns, []

    def heard(self, host: str) -> int:
        return self.heard_ns

    def silence(self, host: str, since: int, now: int) -> int:
        return max([now - max(self.heard_ns, since)] + [min(b, now) - max(a, since) for a, b in self.gaps if b > since])


PORT = PortRef("h1:eth0", "h1", "eth0", "mlx5_0", 9)
SENT = 1_000_000_000


def _cycle(liveness, seen=()):
    s = ScriptedObservations()
    watch = CycleWatch({PORT.key: set(WATCHED + ["first_packet"])}, {("h1", "eth0"): PORT.key}, SENT, SENT + 20_000_000,
                       s.convert, peer_mac={PORT.key: "02:00:00:00:00:01"}, liveness=liveness)
    fields = {"light_detected": ("rx_los", "0"), "cdr_locked": ("rx_lol", "0"), "phy_up": ("carrier", "1"),
              "port_active": ("state", "ACTIVE")}
    for i, stage in enumerate(seen):
        watch.feed(s.watch("h1", "eth0", *fields[stage], SENT + 21_000_000 + i * 1_000_000))
    watch.feed(s.probe("h1", "eth0", "02:00:00:00:00:01", SENT + 30_000_000))
    return watch, s


def _events(watch, s, done):
    arrivals = watch.result(done)
    return arrivals, stage_events("r", 1, {PORT.key: PORT}, "ocs1", SENT, SENT + 20_000_000, arrivals, s.convert)


def test_a_live_quiet_watch_lets_a_stage_passed_between_polls_be_implied():
    live = Liveness(heard=SENT - 5_000_000)
    watch, s = _cycle(live, seen=["light_detected", "cdr_locked", "phy_up"])
    complete = SENT + 31_000_000
    assert not watch.settled(complete) and not watch.settled(complete + 60_000_000)  # grace, then its heartbeat
    live.heard_ns = complete + 70_000_000  # a heartbeat: the watch ran after the probe, nothing was missed
    assert watch.settled(complete + 71_000_000)
    arrivals, events = _events(watch, s, complete + 71_000_000)
    assert not arrivals.causes and not arrivals.unobserved
    assert {e.stage: e.source for e in events}["port_active"] == "between-polls:before first_packet"


@pytest.mark.parametrize("seen", [(), ("light_detected", "cdr_locked")])
def test_a_stalled_watch_faults_the_cycle_and_implies_nothing(seen):
    live = Liveness(heard=SENT - 5_000_000)
    watch, s = _cycle(live, seen=seen)
    complete = SENT + 31_000_000
    assert not watch.settled(complete)
    assert not watch.settled(SENT + 299_000_000)  # silent within the cycle: not for its deadline yet
    assert watch.look_ns() == SENT + 300_000_000  # when the wait looks again
    assert watch.settled(SENT + 300_000_000)
    arrivals, events = _events(watch, s, SENT + 300_000_000)
    assert arrivals.unobserved == {PORT.key: [st for st in WATCHED if st not in seen]}
    by_stage = {e.stage: e for e in events}
    assert set(by_stage) == {"ocs_command_sent", "ocs_command_completed", "first_packet", "fault", *seen}
    assert all(by_stage[st].source.startswith("agent-watch:") for st in seen)
    assert by_stage["fault"].host == "h1" and by_stage["fault"].source.startswith("watch-stall:h1: no line or heartbeat")
    assert not arrivals.missing


def test_a_silence_during_the_cycle_faults_it_even_when_the_watch_came_back():
    """Not one that ended as the cycle began (its lines' intervals reach back over it): one within the cycle."""
    live = Liveness(heard=SENT + 29_000_000, liveness_ns=15_000_000)
    live.gaps = [(SENT + 2_000_000, SENT + 20_000_000)]
    watch, s = _cycle(live, seen=WATCHED)
    assert watch.settled(SENT + 31_000_000)
    arrivals, events = _events(watch, s, SENT + 31_000_000)
    assert [c for _, c in arrivals.causes][0].startswith("watch-stall:h1: no line or heartbeat for 18 ms")
    assert not arrivals.unobserved  # what it did report stands, with its own bounds
    assert {e.stage for e in events} >= set(WATCHED)


def test_heartbeats_are_observations_that_mark_no_stage():
    live = Liveness(heard=SENT)
    watch, s = _cycle(live)
    watch.feed(Observation("alive", "h1", "", "alive", "", SENT, 0, SENT))
    assert not watch.arrivals.kept.keys() - {(PORT.key, "first_packet")}


# ---- end to end
PROFILE = {
    "name": "liveness",
    "ocs": {"switch": {"dist": "uniform", "low_ms": 15, "high_ms": 20}, "dark": {"dist": "fixed", "ms": 0.2}},
    "nic": {"los_clear": {"dist": "fixed", "ms": 0.05}, "cdr_lock": {"dist": "uniform", "low_ms": 0.5, "high_ms": 1},
            "phy_up": {"dist": "uniform", "low_ms": 2, "high_ms": 4}, "port_active": {"dist": "fixed", "ms": 1},
            "link_down": {"dist": "fixed", "ms": 0.5}},
    "hosts": {"clock_offset_ms": [-30, 30], "drift_ppm": [-20, 20]},
    "topology": {"hosts": 2, "nics_per_host": 2, "ocs_size": [8, 8]},
}


def _run(tmp_path: Path, cycles: int, faults: list | None = None) -> tuple[int, Path]:
    profile = tmp_path / "profile.yaml"
    profile.write_text(yaml.safe_dump(PROFILE))
    step = {"type": "turnaround", "name": "measure", "cycle_timeout_s": 5, "clock_warmup_s": 0.3, "ocs_timeout_s": 2.0,
            **({"faults": faults} if faults else {})}
    pb = tmp_path / "pb.yaml"
    pb.write_text(yaml.safe_dump({"name": "r", "seed": 5, "cycles": cycles, "steps": [step]}))
    out = tmp_path / "runs"
    code = main(["run", str(pb), "--bench", f"emulated:{profile}", "--out", str(out / "run"), "-q"])
    (run,) = [p for p in out.iterdir() if p.is_dir()]
    return code, run


def _stalls(events: pd.DataFrame) -> dict[int, list[str]]:
    faults = events[(events["stage"] == "fault")]
    return {int(c): sorted(g["source"]) for c, g in faults.groupby("cycle")}


def _check_stalled(events: pd.DataFrame, stalled: set[int], host: str = "gpu1") -> None:
    faults = _stalls(events)
    marked = {c for c, sources in faults.items() if any(s.startswith(f"watch-stall:{host}: ") for s in sources)}
    assert stalled <= marked, faults
    # the stalled host's ports: no stage event implied from the first probe as if watched
    mine = events[events["cycle"].isin(marked) & (events["host"] == host) & events["stage"].isin(WATCHED)]
    assert not mine["source"].str.startswith("between-polls:before first_packet").any(), mine
    return marked


def test_reproduction_a_quiet_watch_is_not_ok(tmp_path, monkeypatch):
    """The audit's case: gpu1's agent stops printing (its stream open) in cycles 3 and 4, while probes still flow.
    Before: every cycle "ok", gpu1's stages implied from the first probe. Now: those cycles faulted, naming the
    host and the silence; the others ok and whole."""
    from devices.emulated.host import agent
    from harness.bench.hosts import HostGroup

    stalled = {"on": False}
    lines, started = agent._WatchStream.lines, HostGroup.cycle_started
    monkeypatch.setattr(agent._WatchStream, "lines", lambda self, items: (
        lambda text: "" if stalled["on"] and self.ctx.host == "gpu1" else text)(lines(self, items)))
    monkeypatch.setattr(HostGroup, "cycle_started", lambda self, cycle, begin: (
        stalled.update(on=cycle in (3, 4)), started(self, cycle, begin))[1])
    code, run = _run(tmp_path, 6)
    events = pd.read_parquet(run / "events.parquet")
    assert code == 1, _stalls(events)
    marked = _check_stalled(events, {3, 4})
    assert marked == {3, 4}, _stalls(events)
    assert set(_stalls(events)) == {3, 4}, _stalls(events)
    # after the stall the stream resumed: cycle 6 has every stage of gpu1's ports
    six = events[(events["cycle"] == 6) & (events["host"] == "gpu1")]
    assert set(six["stage"]) >= set(WATCHED) | {"first_packet"}
    summary = (run / "summary.md").read_text()
    assert "watch stalled" in summary and "gpu1: 2" in summary
    console = (run / "console.log").read_text()
    assert "cycle 3: gpu1's watch silent" in console


def test_watch_stall_fault_kind_faults_its_cycles_and_the_stream_comes_back(tmp_path):
    code, run = _run(tmp_path, 6, [{"kind": "watch_stall", "cycles": [3], "target": "gpu1", "stall_ms": 600}])
    events = pd.read_parquet(run / "events.parquet")
    assert code == 1
    marked = _check_stalled(events, {3})
    assert marked <= {3, 4}, _stalls(events)
    assert set(_stalls(events)) == marked, _stalls(events)  # no other fault
    import json

    fired = json.loads((run / "manifest.json").read_text())["extra"]["faults_injected"]["measure"]
    assert [(f["kind"], f["cycle"], f["target"]) for f in fired] == [("watch_stall", 3, "gpu1")]
    six = events[(events["cycle"] == 6) & (events["host"] == "gpu1")]
    assert set(six["stage"]) >= set(WATCHED) | {"first_packet"}
