"""NIC output parsers: verbatim samples from the shared spec (protocols.md §2), bad input, and
render -> parse round trips against the emulator's renderers for arbitrary port states."""
from __future__ import annotations

import time
from dataclasses import dataclass

import pytest
from hypothesis import assume, given, settings, strategies as st

from devices.emulated import formats
from devices.emulated.nic import NicSnapshot
from devices.parsers import ParseError
from devices.parsers.nic import (IB_PHYS_STATES, IB_STATES, parse_carrier, parse_ethtool, parse_ethtool_json,
                                 parse_ethtool_module, parse_ib_phys_state, parse_ib_rate, parse_ib_state,
                                 parse_ip_link_json, parse_ip_link_oneline,
                                 parse_ip_monitor_line, parse_mlxlink, parse_operstate, parse_rdma_link,
                                 parse_rdma_link_json, parse_sysfs_int)


@dataclass(frozen=True)
class Model:  # a NicModel stand-in: formats are duck-typed
    netdev: str = "ens1f0np0"
    rdma_dev: str = "mlx5_0"
    rdma_port: int = 1
    mac: str = "0c:42:a1:00:00:01"
    ifindex: int = 3


snapshots = st.builds(
    NicSnapshot, rx_los=st.booleans(), rx_lol=st.booleans(), carrier=st.booleans(),
    phys_state=st.sampled_from(["LinkUp", "Polling", "Disabled"]),
    ib_state=st.sampled_from(["ACTIVE", "DOWN", "INIT"]),
    operstate=st.sampled_from(["up", "down", "lowerlayerdown"]),
    carrier_up_count=st.integers(0, 10**6), carrier_down_count=st.integers(0, 10**6),
    link_downed=st.integers(0, 10**4), rx_power_dbm=st.floats(-30, 5).map(lambda x: round(x, 2)),
    speed_mbps=st.sampled_from([400_000, 200_000, 100_000, 25_000]),
    admin_up=st.just(True), light_lost_ns=st.none(), lit_by=st.none(),  # the defaults (builds fills every field)
    module_state=st.sampled_from([None, "ModuleLowPwr", "ModulePwrUp", "ModuleReady", "ModulePwrDn"]),
    datapath_state=st.sampled_from([None, "DataPathDeactivated", "DataPathActivated"]))  # a CMIS module's states
models = st.builds(Model, netdev=st.from_regex(r"ens[1-9]f[01]np[01]", fullmatch=True),
                   rdma_dev=st.from_regex(r"mlx5_[0-9]", fullmatch=True), rdma_port=st.integers(1, 2),
                   mac=st.from_regex(r"([0-9a-f]{2}:){5}[0-9a-f]{2}", fullmatch=True), ifindex=st.integers(2, 999))


# ---------------------------------------------------------------- spec samples, verbatim


@pytest.mark.parametrize("text,code,name", [("4: ACTIVE\n", 4, "ACTIVE"), ("1: DOWN\n", 1, "DOWN"),
                                            ("2: INIT", 2, "INIT")])
def test_ib_state_spec_samples(text, code, name):
    state = parse_ib_state(text)
    assert (state.code, state.name) == (code, name)


@pytest.mark.parametrize("text,code,name", [("5: LinkUp\n", 5, "LinkUp"), ("2: Polling\n", 2, "Polling"),
                                            ("3: Disabled\n", 3, "Disabled"), ("7: Phy Test\n", 7, "Phy Test")])
def test_ib_phys_state_spec_samples(text, code, name):
    state = parse_ib_phys_state(text)
    assert (state.code, state.name) == (code, name)


@pytest.mark.parametrize("text,gbps,width,speed", [("400 Gb/sec (4X NDR)\n", 400, 4, "NDR"),
                                                   ("100 Gb/sec (4X EDR)\n", 100, 4, "EDR"),
                                                   ("2.5 Gb/sec (1X SDR)\n", 2.5, 1, "SDR")])
def test_ib_rate_spec_samples(text, gbps, width, speed):
    rate = parse_ib_rate(text)
    assert (rate.gbps, rate.width, rate.speed, rate.mbps) == (gbps, width, speed, round(gbps * 1000))


def test_sysfs_net_values():
    assert parse_carrier("1\n") is True and parse_carrier("0\n") is False
    assert parse_operstate("lowerlayerdown\n") == "lowerlayerdown"
    assert parse_sysfs_int("17\n") == 17


def test_ip_monitor_spec_sample():
    lines = ["[2025-05-01T10:00:00.123456] 3: ens1f0np0: <NO-CARRIER,BROADCAST,MULTICAST,UP> mtu 9000 qdisc mq "
             "state DOWN group default",
             "    link/ether 0c:42:a1:00:00:01 brd ff:ff:ff:ff:ff:ff",
             "[2025-05-01T10:00:05.801234] 3: ens1f0np0: <BROADCAST,MULTICAST,UP,LOWER_UP> mtu 9000 qdisc mq "
             "state UP group default"]
    down, cont, up = (parse_ip_monitor_line(line) for line in lines)
    assert cont is None
    assert (down.ifindex, down.ifname, down.mtu, down.operstate, down.carrier) == (3, "ens1f0np0", 9000, "DOWN", False)
    assert up.carrier and up.operstate == "UP"
    # the two stamps are 5.677778 s apart whatever the time zone
    assert up.stamp_ns(0) - down.stamp_ns(0) == 5_677_778_000
    assert down.stamp_ns(0) == 1746093600_123456000  # 2025-05-01T10:00:00.123456 UTC


def test_ip_o_link_veth_and_deleted():
    text = ("1: lo: <LOOPBACK,UP,LOWER_UP> mtu 65536 qdisc noqueue state UNKNOWN mode DEFAULT group default qlen "
            "1000\\    link/loopback 00:00:00:00:00:00 brd 00:00:00:00:00:00\n"
            "101: vA@if201: <BROADCAST,MULTICAST,UP,LOWER_UP> mtu 1500 qdisc noqueue state UP mode DEFAULT group "
            "default qlen 1000\\    link/ether 2a:3b:4c:5d:6e:7f brd ff:ff:ff:ff:ff:ff link-netns hilp_b\n")
    lo, veth = parse_ip_link_oneline(text)
    assert lo.ifname == "lo" and lo.operstate == "UNKNOWN"
    assert (veth.ifindex, veth.ifname, veth.peer, veth.mac, veth.carrier) == (101, "vA", "if201",
                                                                              "2a:3b:4c:5d:6e:7f", True)
    gone = parse_ip_monitor_line("Deleted 101: vA@if201: <BROADCAST,MULTICAST> mtu 1500 qdisc noop state DOWN "
                                 "group default \\    link/ether 2a:3b:4c:5d:6e:7f brd ff:ff:ff:ff:ff:ff")
    assert gone.deleted and gone.stamp is None and gone.mac == "2a:3b:4c:5d:6e:7f"


def test_rdma_link_spec_sample_and_ib_fields():
    (link,) = parse_rdma_link("link mlx5_0/1 state ACTIVE physical_state LINK_UP netdev ens1f0np0\n")
    assert (link.dev, link.port, link.state, link.physical_state, link.netdev) == ("mlx5_0", 1, "ACTIVE",
                                                                                   "LINK_UP", "ens1f0np0")
    assert link.phys_state == "LinkUp"
    (ib,) = parse_rdma_link("link mlx5_2/1 subnet_prefix fe80:0000:0000:0000 lid 7 sm_lid 1 lmc 0 state ACTIVE "
                            "physical_state ARMED \n")
    assert ib.netdev is None and ib.phys_state == "PortConfigurationTraining"  # the ARMED quirk
    (j,) = parse_rdma_link_json('[{"ifindex":0,"ifname":"mlx5_0","port":1,"state":"DOWN",'
                                '"physical_state":"POLLING","netdev":"ens1f0np0","netdev_index":3}]')
    assert (j.dev, j.state, j.phys_state) == ("mlx5_0", "DOWN", "Polling")


def test_ethtool_module_real_captures():
    ido = ("        Rx loss of signal                         : [ Yes, Yes, Yes, Yes ]\n"
           "        Tx loss of signal                         : None\n"
           "        Rx loss of lock                           : [ Yes, Yes, Yes, Yes ]\n")
    flags = parse_ethtool_module(ido)
    assert flags.rx_los and flags.rx_lol and flags.rx_loss_of_signal == (True,) * 4
    arista = ("Rx loss of signal                         : None\n"
              "Tx loss of signal                         : None\n"
              "Rx loss of lock                           : None\n"
              "Tx loss of lock                           : None\n"
              "Tx fault                                  : None\n"
              "Module State                              : 0x03 (ModuleReady)\n")
    flags = parse_ethtool_module(arista)
    assert not flags.rx_los and not flags.rx_lol and flags.rx_loss_of_signal == ()
    powers = ("\tRcvr signal avg optical power(Channel 1)  : 0.7682 mW / -1.15 dBm\n"
              "\tRcvr signal avg optical power(Channel 2)  : 0.0000 mW / -inf dBm\n"
              "\tRcvr signal avg optical power (Channel 3) : 0.9720 mW / -0.12 dBm\n"  # newer ethtool spacing
              "\tRx loss of signal                         : [ No, Yes, No ]\n")
    flags = parse_ethtool_module(powers)
    assert flags.rx_power_dbm[0] == -1.15 and flags.rx_power_dbm[1] == float("-inf")
    assert flags.rx_power_dbm[2] == -0.12 and flags.rx_loss_of_signal == (False, True, False)
    one_lane = parse_ethtool_module("\tRx loss of signal                         : [ No, Yes, No, No ]\n")
    assert one_lane.rx_los and one_lane.rx_loss_of_signal == (False, True, False, False)


def test_ethtool_settings_sample():
    text = ("Settings for ens1f0np0:\n\tSupported ports: [ FIBRE ]\n\tSpeed: 400000Mb/s\n\tDuplex: Full\n"
            "\tAuto-negotiation: on\n\tPort: FIBRE\n\tLink detected: yes\n")
    s = parse_ethtool(text)
    assert (s.ifname, s.speed_mbps, s.duplex, s.autoneg, s.link_detected) == ("ens1f0np0", 400000, "Full", True, True)
    down = parse_ethtool("Settings for x:\n\tSpeed: Unknown!\n\tDuplex: Unknown! (255)\n\tLink detected: no\n")
    assert down.speed_mbps is None and down.duplex is None and not down.link_detected


def test_mlxlink_link_up_comes_from_state_not_the_an_fsm_word():
    up = parse_mlxlink(formats.mlxlink(Model(), NicSnapshot(False, False, True, "LinkUp", "ACTIVE", "up")))
    assert (up.state, up.physical_state, up.link_up, up.speed) == ("Active", "ETH_AN_FSM_ENABLE", True, "400G")
    dark = parse_mlxlink(formats.mlxlink(Model(), NicSnapshot(True, True, False, "Polling", "DOWN", "down")))
    assert (dark.state, dark.physical_state, dark.link_up, dark.speed) == ("Polling", "ETH_AN_FSM_ENABLE", False,
                                                                           "N/A")


# ---------------------------------------------------------------- bad input


@pytest.mark.parametrize("parser,text", [
    (parse_ib_state, "ACTIVE"), (parse_ib_state, "4: DOWN"), (parse_ib_state, "4: ACTIVE\n1: DOWN\n"),
    (parse_ib_phys_state, "9: Bogus"), (parse_ib_rate, "400 Gbps"), (parse_carrier, "2"),
    (parse_operstate, "UP"), (parse_sysfs_int, "x1"), (parse_rdma_link, "port mlx5_0 state ACTIVE"),
    (parse_rdma_link_json, '{"ifname": "x"}'), (parse_rdma_link_json, '[{"ifname": "x"}]'),
    (parse_ethtool, "Link detected: yes"), (parse_ethtool, "Settings for x:\n\tSpeed: fast\n\tLink detected: no"),
    (parse_ethtool_module, "no module records here"), (parse_ethtool_module, "Rx loss of signal : maybe"),
    (parse_mlxlink, "Troubleshooting Info\n---\nStatus Opcode : 0\n"), (parse_ip_link_oneline, "eth0 is up"),
    (parse_ip_monitor_line, "[yesterday] 3: x: <UP> state UP"),
    (parse_ethtool_json, "Settings for x:"), (parse_ethtool_json, "[]"), (parse_ethtool_json, '[{"ifname": "x"}]'),
    (parse_ethtool_json, '[{"ifname": "x", "link-detected": "no"}]'), (parse_ip_link_json, '[{"ifname": "x"}]'),
])
def test_bad_text_raises_parse_error_naming_what_was_expected(parser, text):
    with pytest.raises(ParseError, match="^expected ") as info:
        parser(text)
    assert isinstance(info.value, ValueError)


# ---------------------------------------------------------------- renderer <-> parser round trips


@settings(max_examples=60, deadline=None)
@given(models, snapshots)
def test_every_tool_reports_the_state_it_was_given(model, snap):
    assert parse_ib_state(formats.sysfs_ib_state(snap)).name == snap.ib_state
    assert parse_ib_state(formats.sysfs_ib_state(snap)).code == IB_STATES.index(snap.ib_state)
    phys = parse_ib_phys_state(formats.sysfs_ib_phys_state(snap))
    assert phys.name == snap.phys_state and phys.code == IB_PHYS_STATES.index(snap.phys_state)
    assert parse_ib_rate(formats.sysfs_ib_rate(snap.speed_mbps)).mbps == snap.speed_mbps
    assert parse_carrier(formats.sysfs_net_file(snap, model, "carrier")) == snap.carrier
    assert parse_operstate(formats.sysfs_net_file(snap, model, "operstate")) == snap.operstate
    assert parse_sysfs_int(formats.sysfs_net_file(snap, model, "carrier_changes")) == \
        snap.carrier_up_count + snap.carrier_down_count
    assert parse_sysfs_int(formats.sysfs_ib_port_file(snap, "counters/link_downed")) == snap.link_downed % 256
    links = parse_ip_link_oneline(formats.ip_o_link([(model, snap)]))
    assert [link.ifname for link in links] == ["lo", model.netdev]
    assert (links[1].carrier, links[1].operstate, links[1].mac, links[1].ifindex) == \
        (snap.carrier, snap.operstate.upper(), model.mac, model.ifindex)
    for as_json, parse in ((False, parse_rdma_link), (True, parse_rdma_link_json)):
        (rdma,) = parse(formats.rdma_link([(model, snap)], as_json=as_json))
        assert (rdma.dev, rdma.port, rdma.state, rdma.phys_state, rdma.netdev) == \
            (model.rdma_dev, model.rdma_port, snap.ib_state, snap.phys_state, model.netdev)
    settings_ = parse_ethtool(formats.ethtool(model, snap))
    assert settings_.link_detected == snap.carrier
    assert settings_.speed_mbps == (snap.speed_mbps if snap.carrier else None)
    module = parse_ethtool_module(formats.ethtool_module(snap))
    assert (module.rx_los, module.rx_lol) == (snap.rx_los, snap.rx_lol)
    lanes = formats.module_lanes(snap.speed_mbps)
    assert module.rx_power_dbm == pytest.approx((snap.rx_power_dbm,) * lanes, abs=0.006)
    info = parse_mlxlink(formats.mlxlink(model, snap))
    assert info.link_up == (snap.phys_state == "LinkUp")


@settings(max_examples=100, deadline=None)
@given(models, st.booleans(), st.sampled_from(["up", "down"]), st.booleans(),
       st.integers(1_600_000_000 * 10**9, 2_000_000_000 * 10**9))
def test_ip_monitor_stamp_round_trips_to_the_microsecond(model, carrier, operstate, oneline, host_ns):
    text = formats.ip_link_lines(model, carrier, operstate, oneline=oneline, monitor=True, host_ns=host_ns)
    events = [e for e in map(parse_ip_monitor_line, text.splitlines()) if e is not None]
    assert len(events) == 1
    event = events[0]
    assert (event.ifname, event.carrier, event.operstate) == (model.netdev, carrier, operstate.upper())
    seconds = host_ns // 10**9
    # local time is ambiguous around a DST change; the parser cannot know which side it was
    assume(time.localtime(seconds - 3600).tm_isdst == time.localtime(seconds + 3600).tm_isdst)
    assert event.stamp_ns() == host_ns // 1000 * 1000
    assert event.stamp_ns(utc_offset_s=time.localtime(seconds).tm_gmtoff) == host_ns // 1000 * 1000


def _real(tool: str, name: str) -> str:
    from pathlib import Path

    return (Path(__file__).parent / "data" / "real" / tool / name).read_text().partition("\n")[2]


def test_mlxlink_excerpt_without_its_state_line():
    # an excerpt of a real capture as posters cut it: every line but `State`
    full = _real("mlxlink", "cx4-hpe-840qsfp28-physical-linkup-sonic3578.txt")
    excerpt = "\n".join(line for line in full.splitlines() if not line.startswith("State "))
    info = parse_mlxlink(excerpt)
    assert (info.state, info.physical_state, info.speed, info.link_up) == (None, "LinkUp", "100GbE", True)
    fsm = _real("mlxlink", "cx6-200g-eth-an-fsm-enable-kontronn.txt")
    info = parse_mlxlink("\n".join(line for line in fsm.splitlines() if not line.startswith("State ")))
    assert (info.state, info.physical_state, info.link_up) == (None, "ETH_AN_FSM_ENABLE", None)  # cannot tell
    with pytest.raises(ParseError, match="Operational Info"):
        parse_mlxlink(_real("ethtool", "rtl8126-5g-link-down-openwrt4.txt"))


def test_ip_monitor_labels_with_timestamps():
    stamped = "[2024-05-02T10:00:00.123456] [ROUTE]10.0.0.0/24 dev eth0 proto kernel scope link src 10.0.0.1"
    assert parse_ip_monitor_line(stamped) is None
    assert parse_ip_monitor_line("[ADDR]2: eth0    inet 10.0.0.1/24 brd 10.0.0.255 scope global eth0") is None
    link = parse_ip_monitor_line("[2024-05-02T10:00:00.123456] [LINK]3: eth1: <BROADCAST,MULTICAST> mtu 1500 "
                                 "qdisc pfifo_fast state DOWN group default")
    assert (link.ifname, link.operstate, link.stamp.microsecond) == ("eth1", "DOWN", 123456)
    with pytest.raises(ParseError, match="label"):
        parse_ip_monitor_line("[garbage")
