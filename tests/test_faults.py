"""Fault injection building blocks: fault plans, the physics of a flapping port, OCS faults against the real
TL1/SCPI drivers (DENY, silence + reconnect, line noise over a pty), the disk-full wrapper under the event
log, and the injector on a running emulated bench."""
from __future__ import annotations

import json
import time

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from devices.emulated.bench import EmulatedBench
from devices.emulated.faults import FaultInjector, FaultSpecError, FullDiskFile, plan_faults
from devices.emulated.ocs_server import CommandFaults, OcsServers
from devices.emulated.physics import OpticalBench
from devices.emulated.profile import load_profile, profile_from_dict
from devices.errors import DeviceDenied, DeviceError, DeviceTimeout
from devices.ocs import open_switch
from devices.resources import OcsResource
from devices.ssh import SshTransport
from harness.eventlog import EventLog, EventLogError, read_events
from harness.events import Event

N = 16
ALL = frozenset(range(1, 2 * N + 1))
SLOW_NIC = {
    "name": "faults-physics",
    "ocs": {"switch": {"dist": "fixed", "ms": 1}, "dark": {"dist": "fixed", "ms": 0.1}},
    "nic": {"los_clear": {"dist": "fixed", "ms": 0.05}, "cdr_lock": {"dist": "fixed", "ms": 0.1},
            "phy_up": {"dist": "fixed", "ms": 0.5}, "port_active": {"dist": "fixed", "ms": 0.3},
            "link_down": {"dist": "fixed", "ms": 0.1}},
    "topology": {"hosts": 2, "nics_per_host": 1, "ocs_size": [4, 4]},
}


# ------------------------------------------------------------------------------------------ fault plans
@settings(max_examples=60, deadline=None)
@given(cycles=st.integers(1, 60), seed=st.integers(0, 2**32 - 1),
       schedule=st.lists(st.integers(1, 60), max_size=6), p=st.floats(0, 1))
def test_plan_holds_the_schedule_is_seeded_and_stays_in_range(cycles, seed, schedule, p):
    schedule = [c for c in schedule if c <= cycles]
    entries = [{"kind": "ssh_drop", "cycles": schedule}] if schedule else []
    if p > 0:
        entries.append({"kind": "ocs_deny", "probability": p})
    plan = plan_faults(entries, cycles, np.random.default_rng(seed))
    again = plan_faults(entries, cycles, np.random.default_rng(seed))
    assert plan == again  # same seed, same faults (a resumed run meets the same ones)
    assert set(plan) <= set(range(1, cycles + 1))
    drops = {c for c, fs in plan.items() if any(f.kind == "ssh_drop" for f in fs)}
    assert drops == set(schedule)
    if p == 1:
        assert all(any(f.kind == "ocs_deny" for f in plan.get(c, [])) for c in range(1, cycles + 1))


def test_plan_probability_matches_its_rate():
    plan = plan_faults([{"kind": "clock_step", "probability": 0.25}], 4000, np.random.default_rng(1))
    rate = len(plan) / 4000
    assert abs(rate - 0.25) < 4 * (0.25 * 0.75 / 4000) ** 0.5  # 4 sigma of a binomial


@pytest.mark.parametrize("entry, key", [
    ({"kind": "meteor"}, "kind"),
    ({"kind": "ssh_drop"}, None),  # neither cycles nor probability
    ({"kind": "ssh_drop", "cycles": [0]}, "cycles"),
    ({"kind": "ssh_drop", "cycles": [99]}, "cycles"),
    ({"kind": "ocs_deny", "probability": 1.5}, "probability"),
    ({"kind": "ocs_deny", "cycles": [1], "count": 0}, "count"),
    ({"kind": "port_flap", "cycles": [1], "flaps": "three"}, "flaps"),
    ({"kind": "port_flap", "cycles": [1], "colour": "red"}, "colour"),
    ({"kind": "harness_kill", "cycles": [1], "signal": "SIGSEGV"}, "signal"),
])
def test_bad_fault_entries_name_the_key(entry, key):
    with pytest.raises(FaultSpecError) as info:
        plan_faults([{"kind": "ssh_drop", "cycles": [1]}, entry], 10, np.random.default_rng(0))
    assert info.value.index == 1 and info.value.key == key


def _is_subsequence(short: bytes, long: bytes) -> bool:
    it = iter(long)
    return all(b in it for b in short)


@settings(max_examples=80, deadline=None)
@given(reply=st.lists(st.binary(min_size=1, max_size=30).filter(lambda b: b"\r\n" not in b), min_size=1,
                      max_size=5).map(lambda lines: b"\r\n".join(lines) + b"\r\n"), seed=st.integers(0, 2**32))
def test_line_noise_model(reply, seed):
    """garbage: the reply survives intact around a noise line without `;` (framing is never faked);
    drop_chars: a subsequence 1-3 bytes shorter."""
    faults = CommandFaults(seed)
    noisy = faults.corrupt(reply, "garbage")
    assert _is_subsequence(reply, noisy) and len(noisy) > len(reply)
    extra = bytearray(noisy)
    for b in reply:  # remove the reply's bytes in order; what is left is the noise + its line end
        del extra[extra.index(b)]
    assert b";" not in extra
    dropped = faults.corrupt(reply, "drop_chars")
    assert _is_subsequence(dropped, reply) and 1 <= len(reply) - len(dropped) <= 3 or len(reply) == 1


# ------------------------------------------------------------------------------------------ physics
def _stages(truth, host, port):
    return [r["stage"] for r in truth if r["host"] == host and r["port"] == port]


def test_flapping_port_keeps_light_and_retrains_before_going_active():
    with OpticalBench(profile_from_dict(SLOW_NIC), seed=1) as bench:
        (a, b) = bench.all_nic_ports()
        bench.set_port_fault(b.host, b.netdev, "flap", flaps=2, flap_ms=0.4)
        bench.ocs_apply({a.ocs_tx: b.ocs_rx})
        assert bench.wait_idle()
        assert _stages(bench.ground_truth(), b.host, b.netdev) == [
            "light_detected", "cdr_locked", "phy_up", "port_down", "phy_up", "port_down", "phy_up", "port_active"]
        snap = bench.nic_snapshot(b.host, b.netdev)
        assert snap.carrier and snap.ib_state == "ACTIVE" and not snap.rx_los
        assert snap.carrier_down_count == 2 and snap.carrier_up_count == 3
        # cleared: the next light-on trains once
        bench.set_port_fault(b.host, b.netdev, None)
        bench.ocs_apply({}, [a.ocs_tx])
        assert bench.wait_idle()
        bench.ocs_apply({a.ocs_tx: b.ocs_rx})
        assert bench.wait_idle()
        tail = _stages(bench.ground_truth(), b.host, b.netdev)[8:]
        assert tail == ["light_lost", "port_down", "light_detected", "cdr_locked", "phy_up", "port_active"]
    with pytest.raises(ValueError):
        OpticalBench(profile_from_dict(SLOW_NIC)).set_port_fault("gpu1", "ens1f0np0", "flap", flaps=0)


# ------------------------------------------------------------------------------------------ OCS faults
@pytest.fixture
def ocs():
    bench = OpticalBench(load_profile("instant"), seed=2).start()
    servers = OcsServers(bench).start()
    yield bench, servers
    servers.stop()
    bench.stop()


def _tl1(servers, timeout_s=5.0):
    host, port = servers.tl1_address
    return open_switch(OcsResource(name="ocs1", protocol="polatis-tl1", url=f"tcp://{host}:{port}", size=(N, N),
                                   allowed_ports=ALL, user="admin", password="root"), timeout_s=timeout_s)


def test_tl1_deny_is_the_switchs_refusal_and_changes_nothing(ocs):
    bench, servers = ocs
    switch = _tl1(servers)
    try:
        servers.faults.arm("deny", count=1)
        with pytest.raises(DeviceDenied) as info:
            switch.apply({1: 17})
        assert info.value.code == "SNVS"
        assert bench.ocs_patches() == {}
        switch.apply({1: 17})  # one refusal only
        assert bench.ocs_patches() == {1: 17}
        assert [k for _, k, _ in servers.faults.fired] == ["deny"]
    finally:
        switch.close()


def test_tl1_denied_dlt_patch_leaves_the_pipelined_ent_patch_on_ports_still_patched(ocs):
    """The ENT-PATCH sent with a refused DLT-PATCH still runs, on ports still patched: refused as a conflict
    (SROF), nothing moves; the refusal names both, and the retry makes the whole change."""
    bench, servers = ocs
    switch = _tl1(servers)
    try:
        switch.apply({1: 17})
        servers.faults.arm("deny", count=1)
        with pytest.raises(DeviceDenied) as info:
            switch.apply({1: 18, 2: 17})
        assert (info.value.code, info.value.after) == ("SNVS", ("ENT-PATCH denied SROF",))
        assert [c.split(":")[0] for _, _, c in servers.faults.fired] == ["DLT-PATCH"]
        assert bench.ocs_patches() == {1: 17}
        switch.apply({1: 18, 2: 17})
        assert bench.ocs_patches() == {1: 18, 2: 17}
    finally:
        switch.close()


def test_tl1_silence_times_out_then_a_reconnect_recovers(ocs):
    bench, servers = ocs
    switch = _tl1(servers)
    try:
        servers.faults.arm("silence", count=1)
        switch.timeout_s = 0.3  # short only where a timeout is the point; clean calls keep 5 s
        with pytest.raises(DeviceTimeout):
            switch.apply({2: 18})
        switch.timeout_s = 5
        assert bench.ocs_patches() == {}  # a swallowed command has no effect
        switch.reconnect()
        switch.apply({2: 18})
        assert switch.patches() == bench.ocs_patches() == {2: 18}
    finally:
        switch.close()


@pytest.mark.parametrize("kind", ["garbage", "drop_chars"])
def test_tl1_line_noise_never_yields_a_wrong_answer(ocs, kind):
    """Noise is skipped or makes the command fail (then a reconnect resynchronises); the driver never
    reports a state the switch is not in."""
    bench, servers = ocs
    switch = _tl1(servers)
    try:
        for i in range(1, 9):
            servers.faults.arm(kind, count=1, changes_only=False)
            switch.timeout_s = 0.3
            try:
                got = switch.patches()
                assert got == bench.ocs_patches()
            except DeviceError:
                switch.timeout_s = 5
                switch.reconnect()
            switch.timeout_s = 5
            servers.faults.clear()
            switch.apply({i: 16 + i})
            assert switch.patches() == bench.ocs_patches()
        assert len(servers.faults.fired) == 8
    finally:
        switch.close()


def test_scpi_serial_line_noise_then_reopen_of_the_pty(ocs):
    bench, servers = ocs
    switch = open_switch(OcsResource(name="ocs1", protocol="polatis-scpi", url=servers.pty_path, size=(N, N),
                                     allowed_ports=ALL), timeout_s=5)
    try:
        outcomes = set()
        for i in range(1, 7):
            servers.faults.arm("garbage" if i % 2 else "drop_chars", count=1, changes_only=False)
            switch.timeout_s = 0.3
            try:
                switch.apply({i: 16 + i})
                outcomes.add("ok")
            except DeviceError:
                outcomes.add("error")
                switch.timeout_s = 5
                switch.reconnect()  # reopens the serial line
            switch.timeout_s = 5
            servers.faults.clear()
            switch.apply({i: 16 + i})  # idempotent: reconciles from the reported state
            assert switch.patches() == bench.ocs_patches()
        assert bench.ocs_patches() == {i: 16 + i for i in range(1, 7)}
        assert "error" in outcomes  # an untagged protocol cannot tell noise from a reply
    finally:
        switch.close()


# ------------------------------------------------------------------------------------------ disk full
def _event(cycle: int) -> Event:
    return Event("r", cycle, "phy_up", "gpu1", "mlx5_0", "ens1f0np0", 17, 1000 + cycle, 0, 10, "agent-watch:carrier")


def test_disk_full_keeps_every_durable_cycle_and_cuts_the_rest(tmp_path):
    log = EventLog(tmp_path / "events.jsonl")
    log._file = wrapper = FullDiskFile(log._file)
    for cycle in (1, 2):
        log.extend([_event(cycle)] * 3)
        log.flush()
    wrapper.armed = True
    log.extend([_event(3)] * 3)
    with pytest.raises(EventLogError) as info:
        log.flush()
    assert "disk full" in str(info.value) and info.value.durable_events == 6
    log.close()
    events = read_events(tmp_path / "events.jsonl")
    assert sorted(events["cycle"].unique()) == [1, 2] and len(events) == 6
    assert wrapper.failures >= 1


# ------------------------------------------------------------------------------------------ injector
def test_injector_arms_and_disarms_on_a_running_bench(tmp_path):
    with EmulatedBench(profile_from_dict(SLOW_NIC), seed=3, workdir=tmp_path / "bench") as bench:
        ports = [p.key for p in bench.physics.all_nic_ports()]
        injector = FaultInjector(bench, ports, np.random.default_rng(0))
        server = bench.host_servers["gpu1"]
        ssh = SshTransport(server.resource())
        ssh.connect()
        plan = plan_faults([{"kind": "ssh_drop", "cycles": [1], "target": "gpu1", "after_ms": 0},
                            {"kind": "port_never_up", "cycles": [1], "target": ports[1]},
                            {"kind": "slow_host", "cycles": [1], "target": "gpu2", "delay_ms": 5},
                            {"kind": "clock_step", "cycles": [1], "target": "gpu2", "step_ms": 7},
                            {"kind": "ocs_deny", "cycles": [1], "count": 2}], 1, np.random.default_rng(0))
        before = bench.physics.host_clock_params("gpu2")["offset_ns"]
        injector.arm(1, plan[1])
        assert bench.physics.host_clock_params("gpu2")["offset_ns"] - before == 7_000_000
        assert bench.host_servers["gpu2"].reply_delay_s == pytest.approx(0.005)
        deadline = time.monotonic() + 10
        while not any(f["kind"] == "ssh_drop" for f in injector.fired):
            assert time.monotonic() < deadline
            time.sleep(0.01)
        drop = next(f for f in injector.fired if f["kind"] == "ssh_drop")
        assert drop["connections"] >= 1 and drop["target"] == "gpu1"
        assert ssh.run("hostname", check=True).stdout == "gpu1\n"  # the transport reconnects
        assert ssh.connects == 2
        injector.disarm()
        assert bench.host_servers["gpu2"].reply_delay_s == 0
        assert bench.ocs_servers.faults.take("ENT-PATCH", True) is None
        host, _, netdev = ports[1].partition(":")
        assert bench.physics.port_fault(host, netdev) is None
        assert json.dumps(injector.fired)  # the injection record is plain data
        ssh.close()
