"""Benches with several switches: the emulated bench serving one switch per protocol over one physics
(`SwitchSlice`), and a turnaround whose ports span two switches — each switch commanded in every cycle, its
events named after it, every port's stages bounded from its own switch's send, each switch restored."""
from __future__ import annotations

import json
import textwrap
from pathlib import Path

import pandas as pd
import pytest
import yaml

from devices.emulated.bench import EmulatedBench, SwitchSlice
from devices.emulated.physics import OpticalBench
from devices.emulated.switching import OcsRefusal
from devices.emulated.profile import load_profile
from harness.bench.recorrect import recorrected_events
from harness.cli import main
from harness.events import STAGES_UP

FAST = {
    "name": "test-two-switches",
    "ocs": {"switch": {"dist": "uniform", "low_ms": 3, "high_ms": 6}, "dark": {"dist": "fixed", "ms": 0.2}},
    "nic": {"los_clear": {"dist": "fixed", "ms": 0.05}, "cdr_lock": {"dist": "uniform", "low_ms": 0.5, "high_ms": 1},
            "phy_up": {"dist": "uniform", "low_ms": 2, "high_ms": 4}, "port_active": {"dist": "fixed", "ms": 1},
            "link_down": {"dist": "fixed", "ms": 0.5}},
    "hosts": {"clock_offset_ms": [-30, 30], "drift_ppm": [-20, 20]},
    "topology": {"hosts": 4, "nics_per_host": 2, "ocs_size": [8, 8]},  # 4 ports a switch: a ring-shift moves
}


def test_a_switch_slice_numbers_and_owns_its_share_of_the_ports():
    physics = OpticalBench(load_profile("instant"), seed=1).start()
    try:
        a, b = SwitchSlice(physics, 0, 2), SwitchSlice(physics, 1, 2)
        assert a.ocs_size == b.ocs_size == (8, 8)
        # ingress 1..8 and egress 9..16 of each: the physics' odd ports are a's, its even ones b's
        assert [a.to_physics(p) for p in (1, 2, 9, 10)] == [1, 3, 17, 19]
        assert [b.to_physics(p) for p in (1, 2, 9, 10)] == [2, 4, 18, 20]
        assert all(s.from_physics(s.to_physics(p)) == p for s in (a, b) for p in range(1, 17))
        a.ocs_apply({1: 9, 2: 10})
        b.ocs_apply({1: 10})
        assert a.ocs_patches() == {1: 9, 2: 10} and b.ocs_patches() == {1: 10}
        assert physics.ocs_patches() == {1: 17, 3: 19, 2: 19 + 1}
        with pytest.raises(OcsRefusal, match="Invalid egress port 17"):
            a.ocs_apply({3: 17})  # beyond its own 8 x 8, though the physics has it
        with pytest.raises(OcsRefusal, match="Invalid ingress port 9"):
            b.ocs_apply({9: 10})
        b.ocs_apply({}, [1])
        assert b.ocs_patches() == {} and a.ocs_patches() == {1: 9, 2: 10}
    finally:
        physics.stop()


def test_same_seed_same_draws_whichever_switch_is_heard_first():
    """Two switches over one physics: each switch's commands are keyed by its own count, so the draws do not
    depend on which command reaches its server first (they did: one global count, 308 draws differed between
    two same-seed runs); the first switch draws exactly as a lone switch."""
    import time

    def settled(physics) -> list[tuple]:
        time.sleep(0.5)  # far past every due time of burst-mode's switch and NIC chain (tens of ms)
        physics.ocs_patches()  # runs whatever is due
        return sorted((d["command"], d["port"], d["stage"], d["delay_ns"]) for d in physics.draws())

    def run(order, slices=2):
        physics = OpticalBench(load_profile("burst-mode"), seed=7).start()
        try:
            switches = [SwitchSlice(physics, i, slices) for i in range(slices)]
            for step in ({1: 9, 2: 10}, {1: 10, 2: 9}):
                for i in order:
                    switches[i].ocs_apply(step, list(switches[i].ocs_patches()))
                settled(physics)
            return settled(physics)
        finally:
            physics.stop()

    forward, backward = run([0, 1]), run([1, 0])
    assert forward == backward
    assert {d[1] for d in forward} - {"ocs"}  # the NICs' draws are in it too, keyed by their switch's command
    alone = OpticalBench(load_profile("burst-mode"), seed=7).start()
    try:
        first = SwitchSlice(alone, 0, 2)
        for step in ({1: 9, 2: 10}, {1: 10, 2: 9}):
            alone.ocs_apply({first.to_physics(i): first.to_physics(e) for i, e in step.items()},
                            [first.to_physics(i) for i in first.ocs_patches()])
            settled(alone)
        lone = settled(alone)
    finally:
        alone.stop()
    assert lone == [d for d in forward if d[0] < 1 << 40]  # switch 0's keys are a lone switch's


def test_the_emulated_bench_writes_one_switch_per_protocol_with_its_own_ports():
    with EmulatedBench(load_profile("instant"), seed=2, protocol="polatis-tl1,polatis-netconf") as bench:
        inventory = yaml.safe_load(bench.inventory_path.read_text())
        ocs = inventory["ocs"]
        assert {n: s["protocol"] for n, s in ocs.items()} == {"ocs1": "polatis-tl1", "ocs2": "polatis-netconf"}
        assert ocs["ocs2"]["url"].startswith("ssh://") and ocs["ocs1"]["size"] == ocs["ocs2"]["size"] == [8, 8]
        nics = [nic for host in inventory["hosts"].values() for nic in host["nics"]]
        # rails: each host's first NIC on ocs1, its second on ocs2, numbered as each switch numbers its ports
        assert [n["ocs"] for n in nics] == ["ocs1", "ocs2"] * 4
        assert [(n["tx"], n["rx"]) for n in nics if n["ocs"] == "ocs2"] == [(1, 9), (2, 10), (3, 11), (4, 12)]
        for name, switch in ocs.items():
            assert switch["allowed_ports"] == [str(p) for p in (1, 2, 3, 4, 9, 10, 11, 12)]


def _playbook(tmp_path: Path, cycles: int, **step) -> Path:
    path = tmp_path / "pb.yaml"
    path.write_text(yaml.safe_dump({"name": "two", "seed": 5, "cycles": cycles, "steps": [
        {"type": "turnaround", "name": "measure", "cycle_timeout_s": 20, "clock_warmup_s": 0.3, **step}]}))
    return path


def test_a_turnaround_over_two_switches_of_different_protocols(tmp_path, capsys):
    profile = tmp_path / "fast.yaml"
    profile.write_text(yaml.safe_dump(FAST))
    run = tmp_path / "run"
    code = main(["run", str(_playbook(tmp_path, 4)), "--bench", f"emulated:{profile}?ocs=polatis-tl1,polatis-scpi",
                 "--out", str(run), "--json", "-q"])
    assert code == 0, capsys.readouterr()
    events = pd.read_parquet(run / "events.parquet")
    assert not (events["stage"] == "fault").any()
    # every cycle commands both switches, each command's events named after its switch
    ocs = events[events["stage"].isin(["ocs_command_sent", "ocs_command_completed"])]
    assert sorted(ocs.groupby(["cycle", "device"]).size().items()) == \
        [((c, d), 2) for c in (1, 2, 3, 4) for d in ("ocs1", "ocs2")]
    # every port (4 per switch), every cycle, every up-stage, once
    per = events[events["stage"].isin(STAGES_UP[2:])].groupby(["cycle", "host", "port", "stage"]).size()
    assert len(per) == 4 * 8 * 5 and (per == 1).all()
    # each port's chain is tied to its own switch's send: no stage bounded below it, and the first stage's
    # lower bound is exactly that send when nothing earlier bounds it more tightly
    inventory = yaml.safe_load((run / "bench" / "inventory.yaml").read_text())
    switch_of = {(h, n["netdev"]): n["ocs"] for h, host in inventory["hosts"].items() for n in host["nics"]}
    sent = ocs[ocs["stage"] == "ocs_command_sent"].set_index(["cycle", "device"])["t_ns"]
    chain = events[events["stage"].isin(STAGES_UP[2:])]
    own = [sent[(c, switch_of[(h, p)])] for c, h, p in zip(chain["cycle"], chain["host"], chain["port"])]
    assert (chain["t_ns"] - chain["uncertainty_ns"] >= pd.Series(own, index=chain.index)).all()
    record = json.loads((run / "summary.json").read_text())
    summary = record["summary"]
    acc = {r["stage"]: r for r in summary["accuracy"]}
    assert acc["all"]["n"] >= 4 * 8 * 5 and acc["all"]["coverage"] >= 0.95 and acc["all"]["abs_err_p99_ms"] < 2.0
    assert summary["lost_events"]["in_ok_cycles"] == 0 and summary["lost_events"]["in_faulted_cycles"] == 0
    assert summary["ocs_command"]["not_causal"] == 0
    # the summary per switch, and each switch restored and verified at teardown
    per_switch = summary["results"]["measure"]
    assert per_switch["ocs1_cycles"] == per_switch["ocs2_cycles"] == 4
    assert 3 <= per_switch["ocs2_command_p50_ms"] and per_switch["ocs1_turnaround_p50_ms"] >= 3 + 0.05 + 0.5 + 2 + 1
    assert "| ocs2 | 4 |" in (run / "summary.md").read_text()
    assert record["summary"]["status"] == "ok"
    assert json.loads((run / "manifest.json").read_text())["extra"]["restored"] == {"ocs1": True, "ocs2": True}
    # `harness report` converts the run again from its raw record: the same per-switch commands
    again = recorrected_events(run)
    resent = again[again["stage"] == "ocs_command_sent"].set_index(["cycle", "device"])["t_ns"]
    assert resent.sort_index().equals(sent.sort_index())
    assert len(again[again["stage"].isin(STAGES_UP[2:])]) == len(chain)


def test_a_dry_run_and_its_refusals_over_two_switches(tmp_path, capsys):
    pb = _playbook(tmp_path, 2)
    assert main(["run", str(pb), "--bench", "emulated:instant?ocs=polatis-tl1,polatis-scpi", "--dry-run"]) == 0
    err = capsys.readouterr().err
    assert "cycle 1: ocs1 " in err and "; ocs2 " in err
    # a schedule that pairs ports of different switches cannot be wired: refused before anything runs
    schedule = tmp_path / "schedule.yaml"
    schedule.write_text(yaml.safe_dump({"cycles": [["gpu1:ens1f0np0 <-> gpu2:ens2f0np0",
                                                    "gpu1:ens2f0np0 <-> gpu2:ens1f0np0"]]}))
    pb = _playbook(tmp_path, 2, pattern="schedule", schedule=str(schedule),
                   ports=["gpu1:ens1f0np0", "gpu1:ens2f0np0", "gpu2:ens1f0np0", "gpu2:ens2f0np0"])
    assert main(["run", str(pb), "--bench", "emulated:instant?ocs=polatis-tl1,polatis-scpi", "--dry-run"]) == 2
    assert "a circuit stays within one switch" in capsys.readouterr().err
    assert main(["run", str(pb), "--bench", "emulated:instant?ocs=polatis-tl1,no-such", "--dry-run"]) == 2
    assert "unknown switch protocol 'no-such'" in capsys.readouterr().err


def test_each_ports_chain_starts_at_its_own_switchs_send():
    """A stage passed between two polls is bounded below by the command that caused it: on a cycle that commands
    two switches, the one its port is cabled to (`PortRef.ocs`), not the cycle's first send."""
    from harness.bench.stages import Arrivals, CycleEvents, OcsCommand, PortRef, stage_events
    from harness.bench.hosts import Observation

    ms = 1_000_000
    ports = {"h1:a": PortRef("h1:a", "h1", "a", "mlx5_0", 9, "ocs1"),
             "h1:b": PortRef("h1:b", "h1", "b", "mlx5_1", 9, "ocs2")}
    convert = lambda host, host_ns: (host_ns, 0, 0)  # noqa: E731 - a host on the harness clock
    # carrier up seen at 130 ms by a poll 40 ms apart: light_detected passed between polls, bounded below by
    # the command alone
    kept = {(k, "phy_up"): Observation("watch", "h1", ports[k].netdev, "carrier", "1", 130 * ms, 40 * ms, 131 * ms)
            for k in ports}
    arrivals = Arrivals(kept=kept, done_ns=140 * ms)
    commands = (OcsCommand("ocs1", 100 * ms, 104 * ms), OcsCommand("ocs2", 112 * ms, 117 * ms))
    events = stage_events("r", 1, ports, "ocs1", 100 * ms, 117 * ms, arrivals, convert, commands=commands)
    low = {(e.port, e.stage): e.t_ns - e.uncertainty_ns for e in events if e.port}
    assert low[("a", "light_detected")] == 100 * ms and low[("b", "light_detected")] == 112 * ms
    assert [(e.device, e.stage) for e in events if not e.port] == [
        ("ocs1", "ocs_command_sent"), ("ocs1", "ocs_command_completed"),
        ("ocs2", "ocs_command_sent"), ("ocs2", "ocs_command_completed")]
    # built while the cycle waits, the same
    built = CycleEvents("r", 1, ports, 100 * ms, convert, sent_by_ocs={"ocs1": 100 * ms, "ocs2": 112 * ms})
    again = stage_events("r", 1, ports, "ocs1", 100 * ms, 117 * ms, arrivals, convert, built=built,
                         commands=commands)
    assert again == events


@pytest.fixture(scope="module")
def two_switches():
    with EmulatedBench(load_profile("instant"), seed=3, protocol="polatis-tl1,polatis-scpi") as bench:
        yield bench


def test_harness_ocs_reaches_each_switch_of_a_bench_inventory(two_switches, capsys):
    inventory = str(two_switches.inventory_path)
    assert main(["ocs", "--bench", inventory, "--ocs", "ocs2", "connect", "1", "9"]) == 0
    assert main(["ocs", "--bench", inventory, "--ocs", "ocs2", "--json", "list"]) == 0
    assert json.loads(capsys.readouterr().out.splitlines()[-1]) == {"1": 9}
    assert main(["ocs", "--bench", inventory, "--ocs", "ocs1", "--json", "list"]) == 0
    assert json.loads(capsys.readouterr().out) == {}  # the other switch's ports, its own patches
    # a port the inventory does not allow is refused by the driver even when named (ocs2 allows 1-4, 9-12)
    assert main(["ocs", "--bench", inventory, "--ocs", "ocs2", "connect", "5", "13"]) == 1
    assert "not in the allowed ports" in capsys.readouterr().err
    assert main(["ocs", "--bench", inventory, "--ocs", "ocs2", "--allowed-ports", "1-16", "apply", "--exclusive",
                 "2:10"]) == 0
    assert main(["ocs", "--bench", inventory, "--ocs", "ocs2", "--json", "list"]) == 0
    assert json.loads(capsys.readouterr().out.splitlines()[-1]) == {"2": 10}
    assert main(["ocs", "--bench", inventory, "--ocs", "ocs2", "disconnect", "2"]) == 0
    assert two_switches.physics.ocs_patches() == {}


@pytest.mark.parametrize("argv, fragment", [
    (["list"], "the bench has switches ocs1, ocs2; name one"),
    (["--ocs", "ocs9", "list"], "--ocs ocs9: the bench has ocs1, ocs2"),
    (["--ocs", "ocs1", "--protocol", "polatis-scpi", "list"], "--protocol: the inventory says it"),
])
def test_harness_ocs_bench_refusals(two_switches, argv, fragment, capsys):
    assert main(["ocs", "--bench", str(two_switches.inventory_path)] + argv) == 2
    assert fragment in capsys.readouterr().err
    assert main(["ocs", "--url", "tcp://127.0.0.1:1", "--ocs", "ocs1", "list"]) == 2
    assert "--ocs: names a switch of --bench" in capsys.readouterr().err


def test_one_silent_switch_of_two_latches_the_bench_and_both_are_restored(tmp_path, capsys):
    """ocs1 swallows its changes in cycle 2 (its retries time out): the cycle records ocs2's command whole and
    ocs1's send, the bench is latched broken after ocs2's reply came, and both switches are put back."""
    profile = tmp_path / "fast.yaml"
    profile.write_text(yaml.safe_dump(FAST))
    run = tmp_path / "run"
    pb = _playbook(tmp_path, 3, ocs_timeout_s=1.0, retries=1, retry_backoff_s=0.05,
                   faults=[{"kind": "ocs_silence", "count": 20, "cycles": [2]}])
    code = main(["run", str(pb), "--bench", f"emulated:{profile}?ocs=polatis-tl1,polatis-scpi", "--out", str(run),
                 "--json", "-q"])
    assert code == 1, capsys.readouterr()
    events = pd.read_parquet(run / "events.parquet")
    two = events[events["cycle"] == 2]
    ocs = two[two["stage"].str.startswith("ocs_command")]
    assert sorted(zip(ocs["device"], ocs["stage"])) == [("ocs1", "ocs_command_sent"),
                                                         ("ocs2", "ocs_command_completed"),
                                                         ("ocs2", "ocs_command_sent")]
    faults = list(two.loc[two["stage"] == "fault", "source"])
    assert any(f.startswith("broken:ocs ocs1: gave up") for f in faults), faults
    assert not (events["cycle"] == 3).any()  # skipped: the bench is latched
    manifest = json.loads((run / "manifest.json").read_text())
    assert manifest["extra"]["restored"] == {"ocs1": True, "ocs2": True}
