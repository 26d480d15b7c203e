"""CMIS module and data-path states (issue 37 item 5): declared in the one stage table as optional stages, modelled by
the emulated NIC only where a profile gives their delays (off by default: every other draw and truth unchanged for the
same seed), and read by the agent from `ethtool -m`'s "Module State" (a real CMIS capture). The link-up settings a NIC
exposes (`ethtool --show-priv-flags`) read as ethtool prints them."""
from __future__ import annotations

from pathlib import Path

import pytest

from analysis.stages import (BY_NAME, CHAIN, FULL_PORT_CHAIN, NIC_PROFILE_KEYS, OPTIONAL_STAGES, PORT_CHAIN,
                             STAGES_UP, WATCH_STAGES)
from devices.agent.hilagent import parse_module_flags
from devices.emulated.physics import OpticalBench
from devices.emulated.profile import ProfileError, load_profile, profile_from_dict

REAL = Path(__file__).parent / "data" / "real" / "ethtool-m"
CMIS = {"module_ready": {"dist": "fixed", "ms": 4}, "datapath_activated": {"dist": "fixed", "ms": 6}}


def profile(cmis: bool, per_port: dict | None = None) -> dict:
    nic = {"los_clear": {"dist": "lognormal", "mean_ms": 1.0, "p99_ms": 2.0}, "cdr_lock": {"dist": "fixed", "ms": 2},
           "phy_up": {"dist": "gamma", "mean_ms": 5, "cv": 0.3}, "port_active": {"dist": "fixed", "ms": 3},
           "link_down": {"dist": "fixed", "ms": 2}}
    return {"name": "p", "ocs": {"switch": {"dist": "lognormal", "mean_ms": 25, "p99_ms": 30},
                                 "dark": {"dist": "fixed", "ms": 1}},
            "nic": {**nic, **(CMIS if cmis else {})}, "per_port": per_port or {},
            "topology": {"hosts": 2, "nics_per_host": 2, "ocs_size": [8, 8]}}


class FakeClock:
    def __init__(self):
        self.t_ns = 10**12

    def __call__(self):
        return self.t_ns


def cycles(spec: dict, seed: int = 7, n: int = 4):
    clock = FakeClock()
    bench = OpticalBench(profile_from_dict(spec), seed=seed, clock=clock).start()  # its thread delivers changes
    changes = []
    for host in bench.hosts:
        bench.subscribe(host, changes.append)
    ports = bench.all_nic_ports()
    for c in range(n):
        mapping = {p.ocs_tx: ports[(i + c % 3 + 1) % len(ports)].ocs_rx for i, p in enumerate(ports)}
        if c:
            bench.ocs_apply({}, removes=list(mapping))
        bench.ocs_apply(mapping)
        for _ in range(40):
            clock.t_ns += 5_000_000
            bench.nic_snapshot(ports[0].host, ports[0].netdev)
    assert bench.wait_idle()
    bench.stop()
    return bench, changes


def test_the_table_declares_them_between_light_and_phy_without_changing_the_default_chain():
    assert OPTIONAL_STAGES == ("module_ready", "datapath_activated")
    assert FULL_PORT_CHAIN == ("light_detected", "cdr_locked", "module_ready", "datapath_activated", "phy_up",
                               "port_active", "first_packet")
    assert PORT_CHAIN == tuple(s for s in FULL_PORT_CHAIN if s not in OPTIONAL_STAGES)
    assert not set(OPTIONAL_STAGES) & (set(STAGES_UP) | set(CHAIN) | set(NIC_PROFILE_KEYS))
    assert WATCH_STAGES[("module_state", "ModuleReady")] == "module_ready"
    assert WATCH_STAGES[("datapath_state", "DataPathActivated")] == "datapath_activated"
    assert BY_NAME["datapath_activated"].after == "module_ready" and BY_NAME["module_ready"].after == "cdr_locked"


def test_a_cmis_profile_passes_module_ready_and_datapath_activated_before_phy_up():
    bench, changes = cycles(profile(cmis=True))
    for port in bench.all_nic_ports():
        truth = [(t["stage"], t["t_ns"]) for t in bench.ground_truth() if (t["host"], t["port"]) ==
                 (port.host, port.netdev)]
        ups = [i for i, (stage, _) in enumerate(truth) if stage == "light_detected"]
        assert len(ups) == 4
        for i in ups:  # every bring-up: the full chain, each at least its fixed delay after the one before
            chain = truth[i:i + 6]
            assert [s for s, _ in chain] == list(FULL_PORT_CHAIN[:-1])
            t = dict(chain)
            assert t["module_ready"] - t["cdr_locked"] >= 4e6 and t["datapath_activated"] - t["module_ready"] >= 6e6
            assert t["phy_up"] > t["datapath_activated"]
    seen = {(c.field, c.value) for c in changes}
    assert {("module_state", "ModuleReady"), ("datapath_state", "DataPathActivated"), ("module_state", "ModuleLowPwr"),
            ("datapath_state", "DataPathDeactivated")} <= seen
    snap = bench.nic_snapshot(bench.all_nic_ports()[0].host, bench.all_nic_ports()[0].netdev)
    assert (snap.module_state, snap.datapath_state, snap.ib_state) == ("ModuleReady", "DataPathActivated", "ACTIVE")


def test_off_by_default_and_the_other_draws_do_not_move():
    plain, plain_changes = cycles(profile(cmis=False))
    cmis, _ = cycles(profile(cmis=True))
    assert not {c.field for c in plain_changes} & {"module_state", "datapath_state"}
    assert not {t["stage"] for t in plain.ground_truth()} & set(OPTIONAL_STAGES)
    key = lambda d: (d["command"], d["port"], d["stage"], d["delay_ns"])  # noqa: E731
    plain_draws = [key(d) for d in plain.draws()]
    cmis_draws = [key(d) for d in cmis.draws()]
    # the same delay for every (command, port, stage) both profiles draw; the CMIS one only adds its two stages
    assert sorted(plain_draws) == sorted(d for d in cmis_draws if d[2] not in OPTIONAL_STAGES)
    assert {d[2] for d in cmis_draws} - {d[2] for d in plain_draws} == set(OPTIONAL_STAGES)
    # the built-in profiles give no CMIS delays
    for name in ("instant", "sim-25ms", "burst-mode", "mixnet-testbed", "spectrumx-pod"):
        p = load_profile(name)
        assert not any(p.has_cmis(f"{h}:x") for h in ("gpu1",)), name


def test_one_port_can_have_cmis_and_half_a_pair_is_refused():
    p = profile_from_dict(profile(cmis=False, per_port={"gpu1:ens1f0np0": CMIS}))
    assert p.has_cmis("gpu1:ens1f0np0") and not p.has_cmis("gpu1:ens2f0np0")
    with pytest.raises(ProfileError, match="module_ready and datapath_activated"):
        profile_from_dict(dict(profile(cmis=False), nic={**profile(cmis=False)["nic"],
                                                          "module_ready": CMIS["module_ready"]}))


def test_the_agent_reads_module_state_from_a_real_cmis_capture():
    text = (REAL / "cmis-qsfpdd-400g-xdr4-arista-ethtool6.txt").read_text().partition("\n")[2]
    assert "Module State                              : 0x03 (ModuleReady)" in text
    assert parse_module_flags(text)["module_state"] == "ModuleReady"
    # an SFF-8636 module prints no Module State: nothing watched for it
    sff = (REAL / "sff8636-qsfp-40g-sr4-cx3-ethtool6-los-nolol.txt").read_text().partition("\n")[2]
    assert "module_state" not in parse_module_flags(sff)


@pytest.mark.parametrize("state", ["ModuleLowPwr", "ModulePwrUp", "ModuleReady", "ModulePwrDn"])
def test_the_emulated_ethtool_prints_the_module_state_as_the_parsers_read_it(state):
    from devices.emulated import formats
    from devices.emulated.nic import NicSnapshot
    from devices.parsers.nic import parse_ethtool_module

    text = formats.ethtool_module(NicSnapshot(module_state=state))  # the 400G CMIS layout
    assert parse_ethtool_module(text).module_state == parse_module_flags(text)["module_state"] == state


def test_a_cmis_bench_records_module_ready_against_the_truth(tmp_path, run_playbook):
    """End to end on the emulated bench: the agent's module_state watch marks module_ready, matched to the truth; the
    data-path state no `ethtool -m` prints stays in the truth only, and is not counted as lost."""
    import yaml

    spec = profile(cmis=True)
    spec["nic"] = {**{k: {"dist": "fixed", "ms": v} for k, v in (("los_clear", 1), ("cdr_lock", 1), ("phy_up", 3),
                                                                   ("port_active", 1), ("link_down", 1))}, **CMIS}
    spec["ocs"] = {"switch": {"dist": "fixed", "ms": 2}, "dark": {"dist": "fixed", "ms": 1}}
    (tmp_path / "cmis.yaml").write_text(yaml.safe_dump(spec))
    (tmp_path / "pb.yaml").write_text(yaml.safe_dump({"name": "t", "seed": 3, "cycles": 2, "steps": [
        {"type": "turnaround", "name": "measure", "cycle_timeout_s": 20, "clock_warmup_s": 0.3}]}))
    result = run_playbook(tmp_path / "pb.yaml", bench=f"emulated:{tmp_path / 'cmis.yaml'}")
    events, truth = result.events(), result.ground_truth()
    ports = 4 * 2  # ports x cycles
    assert (events["stage"] == "module_ready").sum() == ports and (truth["stage"] == "module_ready").sum() == ports
    assert (truth["stage"] == "datapath_activated").sum() == ports and "datapath_activated" not in set(events["stage"])
    summary = result.summary()["summary"]
    accuracy = {r["stage"]: r for r in summary["accuracy"]}
    assert accuracy["module_ready"]["n"] == ports and accuracy["module_ready"]["coverage"] == 1.0
    assert summary["lost_events"]["in_ok_cycles"] == 0


def test_private_flags_read_as_ethtool_prints_them():
    from devices.emulated.formats import MLX5_PRIV_FLAGS, ethtool_priv_flags
    from devices.parsers import ParseError
    from devices.parsers.nic import parse_ethtool_priv_flags

    flags = (("link-down-on-close", False), ("fw-lldp-agent", True), ("legacy-rx", False))  # another driver's names
    # ethtool's own printf("%-*s: %s\n", max_len, name, on ? "on" : "off"), written out here
    text = "Private flags for eth3:\n" + "".join("%-*s: %s\n" % (18, n, "on" if v else "off") for n, v in flags)
    assert parse_ethtool_priv_flags(text) == dict(flags) == parse_ethtool_priv_flags(ethtool_priv_flags("eth3", flags))
    assert parse_ethtool_priv_flags(ethtool_priv_flags("ens1f0np0")) == dict(MLX5_PRIV_FLAGS)
    assert ethtool_priv_flags("x").startswith("Private flags for x:\nrx_cqe_moder       : on\n")
    assert parse_ethtool_priv_flags("Private flags for lo:\n") == {}  # a driver without any
    for bad in ("", "Cannot get private flag names: Operation not supported\n", text.replace(": on", ": yes")):
        with pytest.raises(ParseError):
            parse_ethtool_priv_flags(bad)
