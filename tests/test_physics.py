"""OpticalBench against its own contract: stage order, delays drawn from the profile, ground truth."""
import numpy as np
import pytest

from analysis.accuracy import late_cycles
from devices.emulated.physics import OpticalBench
from devices.emulated.switching import OcsRefusal
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


def test_the_state_the_physics_keeps_is_not_walked_by_the_garbage_collector():
    """The rate log's entries and ground truth's distinct rows hold atomic values only, so collections stop tracking
    them (an entry after its state: two passes): a pod keeps ~10^5 of them, and a full collection that walked
    them held the GIL ~0.1 s."""
    import gc

    bench = OpticalBench(profile_from_dict(FAST), seed=1)
    mapping, a, b = pair(bench)
    bench.ocs_apply(mapping)
    assert bench.wait_idle()
    bench.ocs_apply({}, removes=[a.ocs_tx])
    assert bench.wait_idle()
    gc.collect()
    gc.collect()
    truth = bench._truth
    kept = list(bench._nic.rate_log) + [state for _, _, state in bench._nic.rate_log] + truth._keys + [truth._codes]
    assert len(bench._nic.rate_log) >= 6 and len(truth) >= 6
    assert [x for x in kept if gc.is_tracked(x)] == []


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
        with pytest.raises(OcsRefusal) as e:
            bench.ocs_apply({9: 5})
        assert e.value.kind == "invalid_port"
        with pytest.raises(OcsRefusal) as e:
            bench.ocs_apply({a.ocs_tx: 8})
        assert e.value.kind == "port_in_use"
        with pytest.raises(OcsRefusal) as e:
            bench.ocs_apply({3: b.ocs_rx})
        assert e.value.kind == "egress_in_use"
        with pytest.raises(OcsRefusal) as e:
            bench.ocs_apply({}, removes=[3])
        assert e.value.kind == "no_patch"
        assert bench.ocs_patches() == mapping
    finally:
        bench.stop()


def test_the_switch_records_when_each_changing_command_reached_it():
    """One truth row per command that moves a mirror: at the server's kernel stamp when it has one, else when
    the physics handled it; a command that changes nothing, or one refused, leaves none."""
    from devices.timing import now_ns

    bench = OpticalBench(profile_from_dict(FAST), seed=1).start()
    try:
        mapping, a, b = pair(bench)
        stamp = now_ns() - 3_000_000
        bench.ocs_apply(mapping, at_ns=stamp)
        before = now_ns()
        bench.ocs_apply({}, removes=[a.ocs_tx])
        after = now_ns()
        bench.ocs_apply({})
        with pytest.raises(OcsRefusal):
            bench.ocs_apply({}, removes=[a.ocs_tx])
        assert bench.wait_idle()
        arrived = [(t["t_ns"], t["port"]) for t in bench.ground_truth() if t["stage"] == "ocs_command_arrived"]
        assert len(arrived) == 2 and arrived[0] == (stamp, "kernel") and arrived[1][1] == "handled"
        assert before <= arrived[1][0] <= after
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


class FakeClock:
    """CLOCK_MONOTONIC under the test's control: a scheduler that runs only when told to is a late one."""

    def __init__(self, t_ns: int = 10**12):
        self.t_ns = t_ns

    def __call__(self) -> int:
        return self.t_ns

    def advance_ms(self, ms: float) -> None:
        self.t_ns += int(ms * 1e6)


def test_an_unwatched_mirror_observer_sees_no_further_moves():
    clock = FakeClock()
    bench = OpticalBench(profile_from_dict(FAST), seed=1, clock=clock)
    mapping, a, b = pair(bench)
    moves = []

    def observer(t_ns, ingress, egress, settled):
        moves.append((ingress, egress, settled))

    bench.on_mirror.append(observer)
    bench.ocs_apply(mapping)
    clock.advance_ms(50)
    bench.ocs_patches()  # a reader runs what is due
    assert sorted(moves) == sorted([(a.ocs_tx, b.ocs_rx, True), (b.ocs_tx, a.ocs_rx, True)])
    bench.unwatch_mirror(observer)
    bench.unwatch_mirror(observer)  # no longer there: nothing to do
    bench.ocs_apply({}, removes=[a.ocs_tx])
    clock.advance_ms(50)
    assert [t["stage"] for t in bench.ground_truth()].count("mirror_released") == 1 and len(moves) == 2


def truth_of(bench, host):
    return [(t["stage"], t["t_ns"]) for t in bench.ground_truth() if t["host"] == host]


def test_a_late_scheduler_cannot_reorder_a_link_down_after_the_next_light_up():
    """Remove a circuit and re-make it at once, then let the scheduler run only a second later: the carrier
    still drops (port_down at light_lost + link_down) before the new light, every stage at its due time.
    Scheduling follow-ups from when the late action ran would light the port first and skip the drop."""
    clock = FakeClock()
    bench = OpticalBench(profile_from_dict(FAST), seed=1, clock=clock)  # no scheduler thread: only readers run it
    mapping, a, b = pair(bench)
    bench.ocs_apply(mapping)
    clock.advance_ms(100)
    assert bench.nic_snapshot(b.host, b.netdev).ib_state == "ACTIVE"
    t0 = clock()
    bench.ocs_apply({}, removes=[a.ocs_tx])
    bench.ocs_apply({a.ocs_tx: b.ocs_rx})
    clock.advance_ms(1000)  # the machine was busy: nothing ran for a second
    after = [(s, t - t0) for s, t in truth_of(bench, b.host) if t >= t0]
    ms = 10**6
    assert after == [("light_lost", 1 * ms), ("port_down", 3 * ms), ("light_detected", 21 * ms),
                     ("cdr_locked", 23 * ms), ("phy_up", 28 * ms), ("port_active", 31 * ms)]
    snap = bench.nic_snapshot(b.host, b.netdev)
    assert snap.carrier_down_count == 1 and snap.carrier_up_count == 2 and snap.ib_state == "ACTIVE"
    late = bench.lateness()
    assert late["max_ms"] == pytest.approx(1000 - 1, abs=1e-6)  # the release was due 1 ms in, ran at 1000 ms
    # ... yet every stage shows at its due time: each draw realised as drawn, no cycle late
    draws = bench.draws_frame()
    assert set(draws.loc[(draws["command"] == 3) & (draws["stage"] == "los_clear"), "due_ns"]) == {t0 + 21 * ms}
    assert not draws["late_ns"].any() and late_cycles(draws, [(-1, 0), (1, t0)]) == []
    # on a bench that realises its changes in a kernel when they run, the same lateness is the draws', and each
    # draw knows when its action was due, so it is assigned to the cycle it belongs to
    clock = FakeClock()
    bench = OpticalBench(profile_from_dict(FAST), seed=1, clock=clock)
    bench.realise_when_run()
    bench.ocs_apply(mapping)
    clock.advance_ms(100)
    bench.nic_snapshot(b.host, b.netdev)
    t0 = clock()
    bench.ocs_apply({}, removes=[a.ocs_tx])
    bench.ocs_apply({a.ocs_tx: b.ocs_rx})
    clock.advance_ms(1000)
    bench.nic_snapshot(b.host, b.netdev)
    assert {d["late_ns"] for d in bench.draws() if d["command"] == 3 and d["stage"] == "los_clear"} \
        == {int(1000 * ms - 21 * ms)}
    late = late_cycles(bench.draws_frame(), [(-1, 0), (1, t0)])
    assert [(r["cycle"], r["late_ms"]) for r in late] == [(1, pytest.approx(999, abs=1e-6))]


def test_readers_see_the_state_due_now_even_without_a_scheduler_thread():
    clock = FakeClock()
    bench = OpticalBench(profile_from_dict(FAST), seed=1, clock=clock)
    mapping, a, b = pair(bench)
    bench.ocs_apply(mapping)
    clock.advance_ms(19.999)
    assert bench.ocs_port_power(a.ocs_rx) == -60.0
    clock.advance_ms(0.001)  # the mirror settles at 20 ms ...
    assert bench.ocs_port_power(a.ocs_rx) > -10 and bench.nic_snapshot(a.host, a.netdev).rx_los
    clock.advance_ms(1)  # ... and the receiver sees the light 1 ms later
    assert not bench.nic_snapshot(a.host, a.netdev).rx_los


LOGNORMAL = dict(FAST, ocs={"switch": {"dist": "lognormal", "mean_ms": 25, "p99_ms": 30},
                            "dark": {"dist": "uniform", "low_ms": 0.1, "high_ms": 0.3}},
                 nic=dict(FAST["nic"], los_clear={"dist": "lognormal", "mean_ms": 1.0, "p99_ms": 2.0},
                          phy_up={"dist": "gamma", "mean_ms": 5, "cv": 0.3}),
                 topology={"hosts": 4, "nics_per_host": 2, "ocs_size": [16, 16]})


def run_cycles(seed, cycles, step_ms, *, kernel=False, arrived_ms_ago=None):
    """Reconfigure all ports `cycles` times; the scheduler runs every `step_ms` (large = late). `kernel`: the
    bench realises its changes when they run; `arrived_ms_ago`: each command reached the switch that long before
    the switch got to it, after a reader had looked (its mirrors can start no earlier than that look)."""
    clock = FakeClock()
    bench = OpticalBench(profile_from_dict(LOGNORMAL), seed=seed, clock=clock)
    if kernel:
        bench.realise_when_run()
    ports = bench.all_nic_ports()
    for c in range(cycles):
        shift = c % (len(ports) - 1) + 1
        mapping = {p.ocs_tx: ports[(i + shift) % len(ports)].ocs_rx for i, p in enumerate(ports)}
        if c:
            bench.ocs_apply({}, removes=list(mapping))
        if arrived_ms_ago is not None:
            bench.ocs_patches()  # a reader looks now
        bench.ocs_apply(mapping, at_ns=None if arrived_ms_ago is None else clock() - int(arrived_ms_ago * 1e6))
        for _ in range(int(200 / step_ms)):
            clock.advance_ms(step_ms)
            bench.nic_snapshot(ports[0].host, ports[0].netdev)
    return bench


def test_same_seed_same_delays_whatever_the_timing():
    on_time, late = run_cycles(3, 6, 0.05), run_cycles(3, 6, 100)
    draws = [(d["command"], d["port"], d["stage"], d["delay_ns"]) for d in on_time.draws()]
    assert draws == [(d["command"], d["port"], d["stage"], d["delay_ns"]) for d in late.draws()]
    assert len({d[3] for d in draws if d[2] == "los_clear"}) == 6 * 8  # one draw per (command, port)

    def relative(bench):  # truth times after each command's mirror settle
        truth = bench.ground_truth()
        return sorted((t["stage"], t["host"], t["port"], t["t_ns"] - max(s["t_ns"] for s in truth if
                       s["stage"] == "mirror_settled" and s["t_ns"] <= t["t_ns"])) for t in truth
                      if t["host"] != "ocs" and any(s["stage"] == "mirror_settled" and s["t_ns"] <= t["t_ns"]
                                                    for s in truth))
    assert relative(on_time) == relative(late)
    assert late.lateness()["p50_ms"] > 10 and on_time.lateness()["max_ms"] <= 0.05
    other = [(d["command"], d["port"], d["stage"], d["delay_ns"]) for d in run_cycles(4, 6, 100).draws()]
    assert other != draws


def test_keyed_draws_follow_the_profile():
    """KS against the profile's own CDF, per stage, over draws of many (command, port) keys."""
    import scipy.stats

    clock = FakeClock()
    bench = OpticalBench(profile_from_dict(LOGNORMAL), seed=5, clock=clock)
    ports = bench.all_nic_ports()
    for c in range(150):
        bench.ocs_apply({p.ocs_tx: ports[(i + 1 + c % 7) % 8].ocs_rx for i, p in enumerate(ports)})
        clock.advance_ms(200)
        bench.ocs_apply({}, removes=[p.ocs_tx for p in ports])
        clock.advance_ms(200)
    profile = profile_from_dict(LOGNORMAL)
    for stage, delay in (("switch", profile.ocs["switch"]), ("los_clear", profile.nic["los_clear"]),
                         ("phy_up", profile.nic["phy_up"]), ("dark", profile.ocs["dark"])):
        x = np.array([d["delay_ns"] for d in bench.draws() if d["stage"] == stage]) / 1e9
        assert len(x) >= 150
        assert scipy.stats.kstest(x, delay._dist.cdf).pvalue > 0.001, stage


def test_data_plane_updates_only_changed_ports(monkeypatch):
    """Reconfiguring all 256 ports evaluates O(ports) receivers in all, not O(ports²)."""
    clock = FakeClock()
    big = dict(FAST, topology={"hosts": 32, "nics_per_host": 8, "ocs_size": [256, 256]})
    bench = OpticalBench(profile_from_dict(big), seed=1, clock=clock)
    ports = bench.all_nic_ports()
    for p in ports:
        bench.probe_start(p.host, p.netdev, 100_000)
    evaluated = []
    original = bench._probes.update
    monkeypatch.setattr(bench._probes, "update", lambda t, ps: (evaluated.append(len(ps := tuple(ps))),
                                                               original(t, ps)))
    bench.ocs_apply({p.ocs_tx: ports[(i + 1) % 256].ocs_rx for i, p in enumerate(ports)})
    clock.advance_ms(100)
    firsts = [t for t in bench.ground_truth() if t["stage"] == "first_packet"]
    assert len(firsts) == 256 and sum(evaluated) <= 4 * 256


def test_schedule_report_warns_only_when_the_machine_made_it_late():
    """In process a late scheduler realises every drawn delay (the report stays quiet); the switch starting well
    after its command came, or a kernel bench run late, does not (the report names the stages)."""
    on_time, late = run_cycles(3, 30, 0.05), run_cycles(3, 30, 100, kernel=True)
    assert run_cycles(3, 30, 100).schedule_report()["warning"] is None
    started_late = run_cycles(3, 30, 0.05, arrived_ms_ago=60).schedule_report()
    assert started_late["warning"] and started_late["late"] == ["switch"]
    good = on_time.schedule_report()
    assert good["warning"] is None and good["lateness_ms"]["max_ms"] <= 0.05
    assert good["stages"]["los_clear"]["ks_p"] > 0.001 and not any(s["missed"] for s in good["stages"].values())
    bad = late.schedule_report()
    assert bad["warning"] and "los_clear" in bad["late"] and bad["stages"]["los_clear"]["ks_p"] < 0.01
    s = bad["stages"]["los_clear"]
    assert s["realised_p99_ms"] > s["profile_p99_ms"] + 10 and s["profile_p99_ms"] == \
        good["stages"]["los_clear"]["profile_p99_ms"]  # same draws, realised late


def test_the_schedule_report_read_a_block_of_draws_at_a_time_is_the_report_of_them_all(monkeypatch):
    """A campaign's ~10^7 draws are reported one stage and one block at a time: the same numbers as from the whole
    draws table at once (analysis.accuracy.realised_vs_profile over every draw)."""
    from analysis.accuracy import realised_vs_profile

    bench = run_cycles(3, 30, 100, kernel=True)
    draws = bench.draws_frame()
    u = np.full(len(draws), np.nan)
    for (port, stage), rows in draws.groupby(["port", "stage"]).groups.items():
        delay = bench.profile.ocs[stage] if port == "ocs" else bench.profile.nic_delay(port, stage)
        cdf = delay.cdf((draws.loc[rows, "delay_ns"] + draws.loc[rows, "late_ns"]).to_numpy(dtype=float) / 1e9)
        if cdf is not None:
            u[draws.index.get_indexer(rows)] = cdf
    whole = realised_vs_profile(draws.assign(u_realised=u))
    monkeypatch.setattr("devices.emulated.physics.DRAW_BLOCK", 7)
    blocked = bench.schedule_report()
    assert len(draws) > 7 * 10 and blocked.pop("lateness_ms")["n"] > 0
    assert blocked == whole and blocked["late"]


@pytest.mark.parametrize("dark_ms, switch_ms", [(0, 0), (5, 1)])
def test_a_new_far_end_transmitter_breaks_the_link_even_without_a_dark_gap(dark_ms, switch_ms):
    """One command swaps every circuit (SCPI and NETCONF send the whole map at once). With no dark time (0, 0),
    or the new mirror settling before the old one lets go (5 ms dark, 1 ms switch: never dark at all), the
    receiver now sees another transmitter: it loses lock and the link at once, then trains on the new one."""
    clock = FakeClock()
    profile = dict(FAST, ocs={"switch": {"dist": "fixed", "ms": switch_ms}, "dark": {"dist": "fixed", "ms": dark_ms}},
                   topology={"hosts": 2, "nics_per_host": 2, "ocs_size": [4, 4]})
    bench = OpticalBench(profile_from_dict(profile), seed=1, clock=clock)
    p = bench.all_nic_ports()
    bench.ocs_apply({p[0].ocs_tx: p[1].ocs_rx, p[1].ocs_tx: p[0].ocs_rx, p[2].ocs_tx: p[3].ocs_rx,
                     p[3].ocs_tx: p[2].ocs_rx})
    clock.advance_ms(100)
    t0 = clock()
    swap = {p[0].ocs_tx: p[2].ocs_rx, p[2].ocs_tx: p[0].ocs_rx, p[1].ocs_tx: p[3].ocs_rx, p[3].ocs_tx: p[1].ocs_rx}
    bench.ocs_apply(swap, removes=list(swap))
    clock.advance_ms(100)
    ms = 10**6
    after = [(t["stage"], t["t_ns"] - t0) for t in bench.ground_truth()
             if t["port"] == p[2].netdev and t["host"] == p[2].host and t["t_ns"] >= t0]
    new = switch_ms * ms  # the new transmitter's light is there from the moment its mirror settles
    expected = [("port_down", new), ("light_detected", new + 1 * ms), ("cdr_locked", new + 3 * ms),
                ("phy_up", new + 8 * ms), ("port_active", new + 11 * ms)]
    if dark_ms == switch_ms == 0:  # the old light goes first, for no measurable time
        expected.insert(0, ("light_lost", 0))
    assert after == expected
    for port, peer in ((p[0], p[2]), (p[2], p[0]), (p[1], p[3]), (p[3], p[1])):
        snap = bench.nic_snapshot(port.host, port.netdev)
        assert (snap.carrier_down_count, snap.carrier_up_count, snap.ib_state, snap.lit_by) == (1, 2, "ACTIVE",
                                                                                               peer.key)


def test_snapshot_copy_matches_replace_and_refuses_unknown_fields():
    from devices.emulated.nic import NicSnapshot, _with

    old = NicSnapshot(rx_power_dbm=-3.2, lit_by="gpu1:ens1f0np0")
    changes = {"carrier": True, "phys_state": "LinkUp", "carrier_up_count": 4}
    new = _with(old, changes)
    assert new == old._replace(**changes) and type(new) is NicSnapshot
    assert new.carrier is True and new.rx_power_dbm == -3.2 and new.carrier_up_count == 4
    assert old.carrier is False  # the old snapshot, handed out to readers, is untouched
    with pytest.raises(TypeError, match="carier"):
        _with(old, {"carier": True})


def test_the_memory_the_physics_holds_does_not_grow_with_the_commands_it_ran():
    """An emulated campaign runs in the harness's process: after 2N reconfigurations the physics holds what it
    held after N (its ground truth, drawn delays and lateness on disk but for a chunk), where in-memory columns
    held ~1 KB more per reconfiguration of two ports. Every row is still there, in order. Measured in a process
    of its own: another test's emulator threads would allocate meanwhile."""
    import subprocess
    import sys
    from pathlib import Path

    code = """
import sys, tracemalloc
from collections import deque
sys.path.insert(0, "tests")
import devices.emulated.columns
devices.emulated.columns.CHUNK = 64  # a chunk to disk every few reconfigurations
from test_physics import FAST, FakeClock, pair
from devices.emulated.physics import OpticalBench
from devices.emulated.profile import profile_from_dict

clock = FakeClock()
bench = OpticalBench(profile_from_dict(FAST), seed=1, clock=clock)  # no scheduler thread: readers run it
assert bench._nic.rate_log.maxlen is not None  # bounded on its own; here a short one, full before N
bench._nic.rate_log = deque(maxlen=64)
mapping, a, b = pair(bench)

def reconfigure(times):
    for _ in range(times):
        bench.ocs_apply(mapping)
        clock.advance_ms(50)
        bench.ocs_apply({}, removes=[a.ocs_tx, b.ocs_tx])
        clock.advance_ms(50)
        bench.nic_snapshot(b.host, b.netdev)  # a reader: the schedule runs what is due
        bench._nic.pending.clear()  # what the scheduler thread hands to the hosts' subscribers

reconfigure(20)  # first draws, distinct truth rows, imports
tracemalloc.start()
reconfigure(200)
after_n = tracemalloc.get_traced_memory()[0]
reconfigure(200)
after_2n = tracemalloc.get_traced_memory()[0]
tracemalloc.stop()
truth, draws = bench.ground_truth_frame(), bench.draws_frame()
print((after_2n - after_n) / 200, truth.t_ns.is_monotonic_increasing,
      *truth.stage.value_counts()[["light_lost", "port_active"]].tolist(), len(draws),
      bool((draws.due_ns >= 0).all() and (draws.late_ns >= 0).all()))
"""
    out = subprocess.run([sys.executable, "-c", code], cwd=Path(__file__).resolve().parents[1], capture_output=True,
                         text=True, timeout=120)
    assert out.returncode == 0, out.stderr[-2000:]
    grown, ordered, lost, active, draws, ran = out.stdout.split()
    assert float(grown) < 100  # bytes a reconfiguration
    assert ordered == "True" and int(lost) == int(active) == 420 * 2
    # each draw's due time and lateness set when it ran, its chunk on disk or not
    assert int(draws) == 420 * 12 and ran == "True"
