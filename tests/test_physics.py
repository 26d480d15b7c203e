"""OpticalBench against its own contract: stage order, delays drawn from the profile, ground truth."""
import numpy as np
import pytest

from devices.emulated.physics import OcsCommandError, OpticalBench
from devices.emulated.profile import load_profile, profile_from_dict

FAST = {
    "name": "fast",
    "ocs": {"switch": {"dist": "fixed", "ms": 20}, "dark": {"dist": "fixed", "ms": 1}},
    "nic": {"los_clear": {"dist": "fixed", "ms": 1}, "cdr_lock": {"dist": "fixed", "ms": 2},
            "phy_up": {"dist": "fixed", "ms": 5}, "port_active": {"dist": "fixed", "ms": 3},
            "link_down": {"dist": "fixed", "ms": 2}},
    "hosts": {"clock_offset_ms": [10, 10], "drift_ppm": [0, 0]},
    "topology": {"hosts": 2, "nics_per_host": 1, "ocs_size": [4, 4]},
}


def pair(bench):
    a, b = bench.all_nic_ports()
    return {a.ocs_tx: b.ocs_rx, b.ocs_tx: a.ocs_rx}, a, b


def test_bring_up_follows_profile_stage_delays():
    bench = OpticalBench(profile_from_dict(FAST), seed=1).start()
    try:
        mapping, a, b = pair(bench)
        settle = bench.ocs_apply(mapping)
        assert bench.wait_idle()
        truth = [t for t in bench.ground_truth() if t["host"] == a.host]
        stages = [t["stage"] for t in truth]
        assert stages == ["light_detected", "cdr_locked", "phy_up", "port_active"]
        t = {x["stage"]: x["t_ns"] for x in truth}
        # Each stage is at least its profile delay after the previous one; scheduling only adds lateness.
        assert t["light_detected"] - settle >= 1e6
        assert t["cdr_locked"] - t["light_detected"] >= 2e6
        assert t["phy_up"] - t["cdr_locked"] >= 5e6
        assert t["port_active"] - t["phy_up"] >= 3e6
        snap = bench.nic_snapshot(a.host, a.netdev)
        assert (snap.rx_los, snap.carrier, snap.ib_state, snap.operstate) == (False, True, "ACTIVE", "up")
        assert bench.ocs_port_power(b.ocs_rx) > -10 and bench.ocs_port_power(4 + 3) == -60.0
    finally:
        bench.stop()


def test_removing_a_patch_drops_the_link_and_counts_it():
    bench = OpticalBench(profile_from_dict(FAST), seed=1).start()
    try:
        mapping, a, b = pair(bench)
        bench.ocs_apply(mapping)
        assert bench.wait_idle()
        bench.ocs_apply({}, removes=[a.ocs_tx])
        assert bench.wait_idle()
        snap = bench.nic_snapshot(b.host, b.netdev)
        assert (snap.rx_los, snap.carrier, snap.ib_state, snap.carrier_down_count) == (True, False, "DOWN", 1)
        down = [t["stage"] for t in bench.ground_truth() if t["host"] == b.host][-2:]
        assert down == ["light_lost", "port_down"]
        assert bench.nic_snapshot(a.host, a.netdev).carrier  # the other direction is still patched
    finally:
        bench.stop()


def test_first_packet_needs_both_ends_active_and_a_probe():
    bench = OpticalBench(profile_from_dict(FAST), seed=1).start()
    try:
        mapping, a, b = pair(bench)
        seen = []
        bench.subscribe(b.host, lambda c: seen.append(c))
        bench.probe_start(a.host, a.netdev, 100_000)
        bench.ocs_apply(mapping)
        assert bench.wait_idle()
        firsts = [c for c in seen if c.field == "probe_first"]
        assert len(firsts) == 1 and firsts[0].value.startswith(a.mac)
        truth = {t["stage"]: t["t_ns"] for t in bench.ground_truth() if t["host"] == b.host}
        latest_active = max(t["t_ns"] for t in bench.ground_truth() if t["stage"] == "port_active")
        assert latest_active <= truth["first_packet"] <= latest_active + 100_000 + 5e6
    finally:
        bench.stop()


def test_invalid_commands_change_nothing():
    bench = OpticalBench(profile_from_dict(FAST), seed=1).start()
    try:
        mapping, a, b = pair(bench)
        bench.ocs_apply(mapping)
        with pytest.raises(OcsCommandError) as e:
            bench.ocs_apply({9: 5})
        assert e.value.code == "IIAC"
        with pytest.raises(OcsCommandError) as e:
            bench.ocs_apply({a.ocs_tx: 8})
        assert e.value.code == "SROF"
        with pytest.raises(OcsCommandError) as e:
            bench.ocs_apply({3: b.ocs_rx})
        assert e.value.code == "SROF"
        with pytest.raises(OcsCommandError) as e:
            bench.ocs_apply({}, removes=[3])
        assert e.value.code == "IDNV"
        assert bench.ocs_patches() == mapping
    finally:
        bench.stop()


def test_host_clock_carries_offset():
    bench = OpticalBench(profile_from_dict(FAST), seed=1)
    import time
    diff = bench.host_clock_ns(bench.hosts[0]) - time.time_ns()
    assert abs(diff - 10e6) < 5e6


def test_lognormal_profile_matches_its_mean_and_p99():
    p = load_profile("mixnet-testbed")
    rng = np.random.default_rng(0)
    x = np.array([p.ocs["switch"].sample(rng) for _ in range(20000)])
    assert abs(x.mean() - 0.044) < 0.001
    assert abs(np.quantile(x, 0.99) - 0.064) < 0.003
