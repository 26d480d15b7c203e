"""The bench runtime a step is handed (`ctx.bench`), through its test double: one step's logic in milliseconds,
no emulator, and the safety rules every step inherits from the runtime's circuits."""
from __future__ import annotations

import json
from types import SimpleNamespace

import pytest

from devices.resources import Bench, OcsResource
from harness.bench import BenchBroken
from harness.bench.fake import fake_run
from harness.steps.spectrumx import SpectrumxParams, spectrumx_verdict

OCS = OcsResource(name="ocs1", protocol="polatis-tl1", url="tcp://127.0.0.1:1", size=(8, 8),
                  allowed_ports=frozenset(range(1, 17)))
LAB = Bench(name="lab-x", emulated=False, ocs={"ocs1": OCS}, hosts={}, nic_ports=())
STEP = SimpleNamespace(name="verdict", type="spectrumx_verdict", file="pb.yaml", line=3,
                       params=SpectrumxParams().model_dump())


def _profile(copies=None):
    return SimpleNamespace(name="burst-mode", source=" lab notes ", copies=copies,
                           fabric_detection=SimpleNamespace(mean_s=0.002), fabric_source="assumed: 2 ms")


@pytest.mark.parametrize("truth, emulated, words, detection_ms, data_plane", [
    (None, False, {"falsified": "falsified", "holds": "holds"}, None, "measured by the transfer tool on bench lab-x"),
    (SimpleNamespace(profile=_profile()), True,
     {"falsified": "inconsistent with the emulator's model", "holds": "consistent with the emulator's model"}, 2.0,
     "emulated: "),
    (SimpleNamespace(profile=_profile(copies="MixNet Fig. 9")), True,
     {"falsified": "inconsistent with the paper's own measured figures",
      "holds": "consistent with the paper's own measured figures"}, 2.0, "emulated: "),
])
def test_a_verdict_step_words_its_claims_by_the_bench_it_was_handed(tmp_path, truth, emulated, words, detection_ms,
                                                                    data_plane):
    """Words follow provenance: a real bench (truth None) → falsified/holds; the emulator's model, or a profile
    copying a paper's figures → (in)consistent with it. Through the public facets only: no run, no emulator."""
    ctx = fake_run(LAB, tmp_path, truth=truth)
    outcome = spectrumx_verdict(ctx, STEP)
    prov = json.loads((tmp_path / "verdict.json").read_text())["provenance"]
    assert outcome.ok and prov["emulated"] is emulated and prov["bench"] == "lab-x"
    assert prov["words"] == words
    assert prov["detection"]["ms"] == detection_ms and prov["data_plane"].startswith(data_plane)
    assert (prov["profile"] == "burst-mode") is emulated


class _Lease:
    lost = None


def test_the_circuits_a_step_is_handed_refuse_a_change_once_the_lease_is_lost_and_are_restored(tmp_path):
    """The rule lives in the runtime, so every step has it: lease taken over → the next apply is refused
    (BenchBroken, the run latched broken), and the run's teardown still puts the switch back."""
    lease = _Lease()
    ctx = fake_run(LAB, tmp_path, lease=lease)
    switch = ctx.switch("ocs1")
    switch.apply({1: 9})
    found = switch.patches()
    guard = ctx.bench.circuits("ocs1")
    assert ctx.bench.circuits("ocs1") is guard  # one guard per switch and run
    guard.apply({3: 12})
    assert switch.patches()[3] == 12
    lease.lost = "taken over by theirs"
    with pytest.raises(BenchBroken, match="bench lock lost"):
        guard.apply({5: 14})
    assert 5 not in switch.patches() and "bench lock lost" in ctx.broken
    ctx.teardown.close()
    assert switch.patches() == found and ctx.manifest_extra["restored"] == {"ocs1": True}


def test_a_fake_run_refuses_hosts_it_was_not_given(tmp_path):
    ctx = fake_run(LAB, tmp_path, sessions={"h1": "session-h1"})
    assert ctx.bench.hosts.open(["h1"]) == {"h1": "session-h1"}
    with pytest.raises(KeyError, match="h2"):
        ctx.bench.hosts.session("h2")


class _WatchedHost:
    """A host session whose watch reports what `on_apply` says after each switch command (host clock = harness
    clock): the minimum `links.wire` reads, no agent behind it."""

    clock = None

    def __init__(self, name: str):
        self.name, self.sink, self.started = name, None, []

    def start_watch(self, ports, interval_us, ethtool_interval_us, sink, heartbeat_us=0):
        from devices.timing import now_ns

        self.sink = sink
        self.started.append([p[0] for p in ports])
        for netdev, *_ in ports:  # the current values, printed first
            self.report(netdev, [("carrier", "1"), ("state", "ACTIVE")], now_ns(), interval_ns=0)

    def wait_watching(self, deadline):
        return []

    def to_harness(self, host_ns):
        return host_ns, 0, 0

    def report(self, netdev, changes, at_ns, interval_ns=1000):
        from harness.bench.hosts import Observation

        self.sink.put_many([Observation("watch", self.name, netdev, f, v, at_ns, interval_ns, at_ns)
                            for f, v in changes])


def _wired_bench(tmp_path, on_apply, lease=None):
    from devices.ocs.fake import FakeSwitch

    class Switch(FakeSwitch):
        def apply(self, mapping, *, exclusive=False):
            timing = super().apply(mapping, exclusive=exclusive)
            on_apply(mapping)
            return timing

    host = _WatchedHost("h1")
    ctx = fake_run(LAB, tmp_path, sessions={"h1": host}, lease=lease)
    ctx.switches["ocs1"] = Switch(OCS)
    ports = [SimpleNamespace(key=f"h1:eth{i}", host="h1", netdev=f"eth{i}", rdma_dev=f"mlx5_{i}", rdma_port=1)
             for i in range(2)]
    return ctx, host, ports


def test_wiring_waits_for_every_moved_port_to_train_and_says_what_arrived_when_one_does_not(tmp_path):
    """links.wire: applied, then each awaited port's carrier and RDMA state read from the one observation log —
    lines from before the command do not count; a port that only got its carrier is reported as such."""
    from devices.timing import now_ns

    script = {"eth0": [("carrier", "0"), ("state", "DOWN"), ("carrier", "1"), ("state", "ACTIVE")],
              "eth1": [("carrier", "0"), ("state", "DOWN"), ("carrier", "1")]}

    def on_apply(mapping):
        for netdev, changes in script.items():
            host.report(netdev, changes, now_ns())

    ctx, host, ports = _wired_bench(tmp_path, on_apply)
    wired = ctx.bench.links.wire("ocs1", {1: 10, 2: 9}, 0.3, ports=ports[:1])
    assert wired.up and wired.seen == "" and ctx.switches["ocs1"].patches() == {1: 10, 2: 9}
    stale = now_ns()
    host.report("eth1", [("carrier", "1"), ("state", "ACTIVE")], stale - 10_000_000)  # before the next command
    wired = ctx.bench.links.wire("ocs1", {1: 9, 2: 10}, 0.3, ports=ports)
    assert not wired.up and host.started == [["eth0"], ["eth1"]]  # one watch per port and run
    assert "h1:eth0" not in wired.seen
    assert wired.seen.startswith("h1:eth1: saw phy_up, missing port_active (its watch: before the command "
                                 "carrier 1, state ACTIVE; since carrier 0, state DOWN, carrier 1)"), wired.seen


def test_a_failed_wiring_latches_and_later_wirings_are_refused_with_its_cause(tmp_path):
    """labgrid's never_retry: the lease lost during a run → the wiring refused (BenchBroken, the switch
    untouched) — and every later wiring refused at once, naming that first cause, even with the lease back."""
    from harness.bench.links import WiringRefused

    lease = _Lease()
    ctx, host, ports = _wired_bench(tmp_path, lambda mapping: None, lease=lease)
    switch = ctx.switch("ocs1")
    found = switch.patches()
    assert ctx.bench.links.wire("ocs1", {1: 10}, 0.1).up  # no port awaited: applied, nothing to train
    lease.lost = "taken over by theirs"
    with pytest.raises(BenchBroken, match="bench lock lost"):
        ctx.bench.links.wire("ocs1", {3: 12}, 0.1, ports=ports)
    assert 3 not in switch.patches()
    lease.lost = None
    with pytest.raises(WiringRefused, match="an earlier wiring failed: bench lock lost: taken over by theirs"):
        ctx.bench.links.wire("ocs1", {5: 14}, 0.1)
    assert 5 not in switch.patches()
    ctx.teardown.close()
    assert switch.patches() == found
