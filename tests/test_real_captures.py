"""Every parser against the corpus of real tool captures (tests/data/real/<tool>/): the values a reader of each
capture sees. Each file's first line names its public source; the rest is the capture, copied verbatim."""
from __future__ import annotations

import json
import math
import quopri
from pathlib import Path

import pytest

from devices.parsers.bench_tools import parse_ib_write_bw, parse_nccl_tests, parse_perftest_header
from devices.parsers.common import ParseError
from devices.parsers.gpu import (FIELD_ALIASES, canonical_field, parse_nvidia_smi_csv, parse_nvidia_smi_table,
                                 parse_nvidia_smi_topo)
from devices.parsers.ib_tools import parse_ibdev2netdev, parse_ibstat, parse_ibstatus, parse_ibv_devinfo
from devices.parsers.nic import (EthtoolSettings, parse_ethtool, parse_ethtool_json, parse_ethtool_module,
                                 parse_ip_link, parse_ip_link_json, parse_ip_link_oneline, parse_ip_monitor_line,
                                 parse_mlxlink, parse_rdma_link)
from harness.preflight import receiver_lit

REAL = Path(__file__).parent / "data" / "real"
MIN_PER_TOOL = {"ethtool-m": 5, "rdma-link": 5, "nccl-tests": 5, "perftest": 5, "nvidia-smi": 5, "ethtool": 5,
                "ip-link": 5, "mlxlink": 5, "ip-monitor": 5, "ip-j-link": 2, "ethtool-json": 1, "ibstat": 4,
                "ibstatus": 2, "ibv-devinfo": 3, "ibdev2netdev": 2, "nvidia-smi-table": 5, "nvidia-smi-topo": 2}


def capture(tool: str, name: str) -> str:
    head, _, body = (REAL / tool / name).read_text().partition("\n")
    assert head.startswith("# source: http"), f"{tool}/{name}: first line must name the public source"
    return body


def test_every_capture_names_its_source_and_the_corpus_is_wide_enough():
    counts: dict[str, int] = {}
    for path in sorted(REAL.glob("*/*.txt")):
        head = path.read_text().partition("\n")[0]
        assert head.startswith("# source: http") and head.count(" | ") >= 2, path.name
        counts[path.parent.name] = counts.get(path.parent.name, 0) + 1
    for tool, least in MIN_PER_TOOL.items():
        assert counts.get(tool, 0) >= least, (tool, counts)


# ---------------------------------------------------------------- ethtool -m

Y, N = True, False
ETHTOOL_M = {
    # name: (identifier, rx_loss_of_signal, rx_loss_of_lock, module_state, rx_power_dbm)
    "cmis-qsfpdd-400g-xdr4-arista-ethtool6.txt":
        (0x18, (), (), "ModuleReady", (3.52, 2.70, 2.65, 2.60) + (-math.inf,) * 4),
    "cmis-16lane-spectrum-both-up-ethtool6.4.txt": (None, (), (), "ModuleReady", ()),
    "cmis-16lane-spectrum-peer-down-ethtool6.4.txt": (None, (Y,) * 16, (Y,) * 16, "ModuleReady", ()),
    "cmis-16lane-spectrum-own-down-ethtool6.4.txt": (None, (Y,) * 16, (Y,) * 8 + (N,) * 8, "ModuleReady", ()),
    "cmis-qsfpdd-dac-mellanox-ethtool5.8-nolos.txt": (0x18, None, None, None, ()),
    "sff8636-qsfp-aoc-spectrum-both-up-ethtool6.4.txt": (None, (), (), None, ()),
    "sff8636-qsfp-aoc-spectrum-peer-down-ethtool6.4.txt": (None, (Y,) * 4, (Y,) * 4, None, ()),
    "sff8636-qsfp-40g-sr4-cx3-ethtool-pre5.13-nolos.txt": (0x0D, None, None, None, (-2.43,) + (-math.inf,) * 3),
    "sff8636-qsfp-40g-sr4-cx3-ethtool6-los-nolol.txt": (0x0D, (), None, None, (-2.45,) + (-math.inf,) * 3),
    "sff8636-qsfp28-100g-sr4-fs-lldpd477.txt": (0x11, None, None, None, ()),
    # SFF-8472 (SFP/SFP+): one receiver, no channel number, no LOS/LOL lines in any ethtool version
    "sff8472-sfp-1g-bx10-fs-lit-ixgbe-castellotti.txt": (0x03, None, None, None, (-5.62,)),
    "sff8472-sfp-grep-dbm-swp1-transceiver-exporter1.txt": (None, None, None, None, (-2.36,)),
    "sff8472-sfp-zero-diagnostics-cx2-mlx4-oledzki.txt": (0x03, None, None, None, (-math.inf,)),
}


@pytest.mark.parametrize("name", sorted(ETHTOOL_M))
def test_ethtool_module(name):
    identifier, los, lol, state, power = ETHTOOL_M[name]
    flags = parse_ethtool_module(capture("ethtool-m", name))
    assert (flags.identifier, flags.rx_loss_of_signal, flags.rx_loss_of_lock, flags.module_state) == \
        (identifier, los, lol, state)
    assert flags.rx_power_dbm == power
    assert flags.rx_los == (None if los is None else any(los))
    assert flags.rx_lol == (None if lol is None else any(lol))


def test_bench_check_sees_light_on_a_lit_sfp_and_none_on_a_dark_one():
    # an SFP reports no Rx LOS line, so `bench check` decides on the one lane's receive power
    lit = {name: receiver_lit(parse_ethtool_module(capture("ethtool-m", name)))
           for name in ETHTOOL_M if name.startswith("sff8472")}
    assert lit == {"sff8472-sfp-1g-bx10-fs-lit-ixgbe-castellotti.txt": True,
                   "sff8472-sfp-grep-dbm-swp1-transceiver-exporter1.txt": True,
                   "sff8472-sfp-zero-diagnostics-cx2-mlx4-oledzki.txt": False}
    # the thresholds' dBm lines (`Laser rx power low alarm threshold : 0.0028 mW / -25.53 dBm`) are not read
    fs = parse_ethtool_module(capture("ethtool-m", "sff8472-sfp-1g-bx10-fs-lit-ixgbe-castellotti.txt"))
    assert (fs.vendor_pn, fs.vendor_name, fs.vendor_sn, fs.cmis) == ("SFP-GE-BX", "FS", "S2202359108", False)


def test_ethtool_module_identity_fields():
    arista = parse_ethtool_module(capture("ethtool-m", "cmis-qsfpdd-400g-xdr4-arista-ethtool6.txt"))
    assert arista.cmis and arista.vendor_pn == "QDD-400G-XDR4" and arista.tx_fault == ()
    dac = parse_ethtool_module(capture("ethtool-m", "cmis-qsfpdd-dac-mellanox-ethtool5.8-nolos.txt"))
    assert dac.cmis and dac.vendor_pn == "MCP1660-W00AE30"
    assert not parse_ethtool_module(capture("ethtool-m", "sff8636-qsfp28-100g-sr4-fs-lldpd477.txt")).cmis


# ---------------------------------------------------------------- rdma link

RDMA = {
    # name: [(dev, port, state, physical_state, netdev, lid)]
    "roce-cx6dx-3fs283.txt": [("mlx5_0", 1, "ACTIVE", "LINK_UP", "p1p1", None),
                              ("mlx5_1", 1, "ACTIVE", "LINK_UP", "p1p2", None)],
    "rxe-softroce-3fs263.txt": [("rxe_0", 1, "ACTIVE", "LINK_UP", "p1p1", None)],
    "roce-and-ib-rdma-demo.txt": [("mlx5_0", 1, "ACTIVE", "LINK_UP", "ens3f0np0", None),
                                  ("mlx5_1", 1, "DOWN", "DISABLED", None, 65535)],
    "old-form-shared-pod-spiderpool.txt": [("mlx5_0", 1, "ACTIVE", "LINK_UP", None, None),
                                           ("mlx5_1", 1, "ACTIVE", "LINK_UP", None, None)],
    "old-form-sriov-vf-spiderpool.txt": [("mlx5_3", 1, "ACTIVE", "LINK_UP", "eth0", None)],
}


@pytest.mark.parametrize("name", sorted(RDMA))
def test_rdma_link(name):
    links = parse_rdma_link(capture("rdma-link", name))
    assert [(x.dev, x.port, x.state, x.physical_state, x.netdev, x.lid) for x in links] == RDMA[name]


def test_rdma_link_infiniband_and_roce_mixed():
    links = parse_rdma_link(capture("rdma-link", "ib-and-roce-cx6-sriov-operator635.txt"))
    assert [x.dev for x in links] == [f"mlx5_{i}" for i in range(9)]
    assert [x.lid for x in links] == [3, 65535, 35, 65535, None, 65535, 4, 65535, 36]
    assert [x.state for x in links if x.infiniband and x.lid != 65535] == ["ACTIVE"] * 4
    roce = links[4]
    assert (roce.netdev, roce.infiniband, roce.phys_state) == ("enp97s0f0", False, "LinkUp")
    assert links[0].subnet_prefix == "fe80:0000:0000:0000" and links[0].sm_lid == 1


# ---------------------------------------------------------------- mlxlink

MLXLINK = {
    # name: (state, physical_state, speed, width, fec, link_up)
    "cx4-hpe-840qsfp28-physical-linkup-sonic3578.txt":
        ("Physical LinkUp", "LinkUp", "100GbE", "4x", "Standard RS-FEC - RS(528,514)", True),
    "spectrum-switch-25g-sonic265.txt": ("Active", "LinkUp", "25GbE", "1x", "Firecode FEC", True),
    "cx6-200g-eth-an-fsm-enable-kontronn.txt":
        ("Active", "ETH_AN_FSM_ENABLE", "200G", "4x", "Standard RS-FEC (544,514)", True),
    "spectrum-25g-troubleshooting-nvidia-sonic-docs.txt": ("Active", "LinkUp", "25GbE", "1x", "Firecode FEC", True),
    # a switch port, not only a ConnectX NIC, reads ETH_AN_FSM_ENABLE while Active
    "spectrum2-1g-eth-an-fsm-enable-sonic-mgmt-ngts.txt": ("Active", "ETH_AN_FSM_ENABLE", "1G", "1x", "No FEC", True),
}


@pytest.mark.parametrize("name", sorted(MLXLINK))
def test_mlxlink(name):
    info = parse_mlxlink(capture("mlxlink", name))
    assert (info.state, info.physical_state, info.speed, info.width, info.fec, info.link_up) == MLXLINK[name]
    assert info.section("Operational Info")["Loopback Mode"] == "No Loopback"


def test_mlxlink_supported_info_section():
    info = parse_mlxlink(capture("mlxlink", "cx4-hpe-840qsfp28-physical-linkup-sonic3578.txt"))
    assert info.section("Supported Info") == {"Enabled Link Speed": "0x00f180c0 (100G,40G)"}


def test_mlxlink_troubleshooting_section():
    info = parse_mlxlink(capture("mlxlink", "spectrum-25g-troubleshooting-nvidia-sonic-docs.txt"))
    assert [title for title, _ in info.sections] == ["Operational Info", "Supported Info", "Troubleshooting Info"]
    assert info.section("Supported Info") == {"Enabled Link Speed": "0x38000000 (25G)",
                                              "Supported Cable Speed": "0x3c007011 (25G,10G,1G)"}
    assert info.section("Troubleshooting Info") == {"Status Opcode": "0", "Group Opcode": "N/A",
                                                    "Recommendation": "No issue was observed."}


# ---------------------------------------------------------------- ip monitor / ip -o link / ethtool


def _events(name):
    return [e for e in map(parse_ip_monitor_line, capture("ip-monitor", name).splitlines()) if e is not None]


def test_ip_monitor_flag_only_events():
    down = _events("wlan-admin-down-flag-only-syogaraj.txt")
    assert [(e.ifindex, e.ifname, e.operstate, "UP" in e.flags, e.mtu) for e in down] == \
        [(3, "wlp0s20f3", None, True, None), (3, "wlp0s20f3", "DOWN", False, 1500)]
    # the multi-line form carries the address on its continuation line, which the line parser skips
    assert parse_ip_monitor_line("    link/ether d4:54:8b:c4:7b:dd brd ff:ff:ff:ff:ff:ff") is None
    up = _events("wlan-admin-up-flag-only-syogaraj.txt")
    assert [e.operstate for e in up] == ["DOWN", None, None, None, None, "DORMANT", "UP", None, None]
    assert [e.carrier for e in up] == [False] * 6 + [True] * 3


def test_ip_monitor_labels_of_other_families_are_skipped():
    lines = capture("ip-monitor", "label-neigh-then-link-iproute2-manpage.txt").splitlines()
    assert parse_ip_monitor_line(lines[0]) is None  # [NEIGH]10.16.0.112 dev eth0 lladdr ... REACHABLE
    assert [(e.ifindex, e.ifname, e.operstate, e.carrier) for e in map(parse_ip_monitor_line, lines[1:]) if e] == \
        [(3, "eth1", "DOWN", False)]
    # with all-nsid the neighbour event comes without a family label, after `[nsid 0]`
    assert parse_ip_monitor_line(capture("ip-monitor", "all-nsid-neigh-iproute2-manpage.txt").strip()) is None
    with pytest.raises(ParseError, match="ip monitor link"):
        parse_ip_monitor_line("Settings for eth0:")  # not ip monitor output at all


def test_ip_o_link_older_iproute2():
    links = parse_ip_link_oneline(capture("ip-link", "bond-vlans-fusioninventory640.txt"))
    assert [x.ifname for x in links] == ["lo", "eth0", "eth1", "bond0", "bond0.3000", "bond0.3001", "bond0.3002",
                                         "bond0.3003"]
    assert [x.peer for x in links][4:] == ["bond0"] * 4
    assert all(x.carrier and x.operstate in ("UP", "UNKNOWN") for x in links)
    assert links[1].mac == "0c:c4:7a:03:24:fb" and links[0].mtu == 65536 and "SLAVE" in links[2].flags


def test_ethtool_settings_both_field_orders_and_a_refused_query():
    for name in ("e1g-ethtool5.4-ioctl-order-idosch.txt", "e1g-ethtool5.8-netlink-order-idosch.txt"):
        e1g = parse_ethtool(capture("ethtool", name))
        # the driver keeps reporting the last speed after the cable went: Link detected is the truth
        assert (e1g.ifname, e1g.speed_mbps, e1g.duplex, e1g.autoneg, e1g.link_detected) == \
            ("eth0", 1000, "Full", True, False), name
    tg3 = parse_ethtool(capture("ethtool", "tg3-bonded-slave-lkml2005.txt"))
    assert (tg3.ifname, tg3.speed_mbps, tg3.duplex, tg3.autoneg, tg3.link_detected) == \
        ("eth0", None, None, None, False)


def test_ethtool_settings():
    down = parse_ethtool(capture("ethtool", "rtl8126-5g-link-down-openwrt4.txt"))
    assert (down.ifname, down.speed_mbps, down.duplex, down.autoneg, down.link_detected) == \
        ("enp14s0", None, None, True, False)
    bond = parse_ethtool(capture("ethtool", "bond0-1g-systeminformation187.txt"))
    assert (bond.ifname, bond.speed_mbps, bond.duplex, bond.autoneg, bond.link_detected) == \
        ("bond0", 1000, "Full", False, True)


def test_ethtool_json_settings_of_a_link_that_is_down():
    settings = parse_ethtool_json(capture("ethtool-json", "copper-1g-no-link-lunn-netdev-2024.txt"))
    assert settings == EthtoolSettings("enp2s0", None, None, False, False)  # no speed/duplex keys without a link


def test_ip_monitor_all_labels_and_deleted_links():
    events = _events("ppp-deleted-labelled-node-iproute3.txt")
    assert [(e.ifindex, e.deleted) for e in events] == [(27, False), (27, True), (28, False), (28, True),
                                                        (29, False), (29, True)]
    assert {(e.ifname, e.operstate, e.mtu, e.carrier, e.mac) for e in events} == {("ppp0", "DOWN", 1500, False, None)}


def test_ip_monitor_veth_pair_created_then_deleted():
    text = capture("ip-monitor", "veth-pair-created-then-deleted-d2si-overlay3.txt")
    events = [e for e in map(parse_ip_monitor_line, text.splitlines()) if e is not None]
    assert [(e.ifindex, e.ifname, e.deleted) for e in events] == [(32, "veth2", False), (33, "veth1", False),
                                                                  (33, "veth1", True), (32, "veth2", True)]
    assert {(e.operstate, e.mtu, e.carrier, e.peer, "UP" in e.flags) for e in events} == {("DOWN", 1500, False,
                                                                                          None, False)}
    # the multi-line reader joins each event to its `link/ether` line and so reads the addresses too
    assert [(x.ifname, x.deleted, x.mac) for x in parse_ip_link(text)] == [
        ("veth2", False, "b6:95:d6:b4:21:e9"), ("veth1", False, "a6:e0:7a:da:a9:ea"),
        ("veth1", True, "a6:e0:7a:da:a9:ea"), ("veth2", True, "b6:95:d6:b4:21:e9")]


def test_ip_monitor_tap_up_with_unknown_operstate_mac_change_and_delete():
    text = capture("ip-monitor", "tap-up-mac-change-deleted-jithendiran-lab.txt")
    events = [e for e in map(parse_ip_monitor_line, text.splitlines()) if e is not None]
    assert [(e.ifindex, e.ifname, e.operstate, e.carrier, e.deleted) for e in events] == [
        (5, "tap0", "DOWN", False, False), (5, "tap0", "UNKNOWN", True, False), (5, "tap0", "UNKNOWN", True, False),
        (5, "tap0", "DOWN", False, False), (5, "tap0", "DOWN", False, True)]
    # state reads UNKNOWN while the link is up: carrier comes from LOWER_UP, not from `state`
    assert [x.mac for x in parse_ip_link(text)] == ["12:91:c5:b4:5d:6e"] * 2 + ["46:f7:6f:38:72:ea"] * 3


# ---------------------------------------------------------------- ip -j link / ip -j addr

def _links(links):
    return [(x.ifindex, x.ifname, x.operstate, x.carrier, x.mtu, x.mac, x.peer) for x in links]


def test_ip_json_laptop_dump():
    links = parse_ip_link_json(capture("ip-j-link", "netplan-laptop-ip-d-j-addr-fixture.txt"))
    assert _links(links) == [
        (1, "lo", "UNKNOWN", True, 65536, "00:00:00:00:00:00", None),
        (2, "enp0s31f6", "UP", True, 1500, "54:e1:ad:5f:24:b4", None),
        (5, "wlan0", "UP", True, 1500, "1c:4d:70:e4:e4:0e", None),
        (41, "wg0", "UNKNOWN", True, 1420, None, None),  # link_type none: no address at all
        (46, "wwan0", "DOWN", False, 1500, "a2:23:44:c4:4e:f8", None),
        (48, "tun0", "UNKNOWN", True, 1480, None, "NONE")]  # sit: the address is IPv4, `"link": null` is `@NONE`
    assert "NOARP" in links[4].flags and "LOWER_UP" not in links[4].flags


def test_ip_json_from_netdev_mail_reads_like_the_text_form():
    # the mail body is quoted-printable, as the mail declares; decode it as a mail reader does
    text = quopri.decodestring(capture("ip-j-link", "veth-other-netns-ip-s-s-j-netdev-2022.txt").encode()).decode()
    lo, veth = parse_ip_link_json(text)
    assert _links([lo, veth]) == [(1, "lo", "UNKNOWN", True, 65536, "00:00:00:00:00:00", None),
                                  (2, "veth2", "UP", True, 1500, "8e:c0:a5:7d:87:ad", "if2")]  # text: veth2@if2
    assert json.loads(text)[1]["stats64"]["tx"]["carrier_changes"] == 2


def test_ip_link_multi_line_form():
    router = parse_ip_link(capture("ip-link", "router-lan-ports-lowerlayerdown-mcdebian44.txt"))
    assert [(x.ifindex, x.ifname, x.peer, x.operstate, x.carrier) for x in router] == [
        (1, "lo", None, "UNKNOWN", True), (2, "eth0", None, "UP", True), (3, "eth1", None, "UP", True),
        (4, "lan4", "eth1", "LOWERLAYERDOWN", False), (5, "lan3", "eth1", "LOWERLAYERDOWN", False),
        (6, "lan2", "eth1", "LOWERLAYERDOWN", False), (7, "lan1", "eth1", "UP", True)]
    assert router[3].mac == "02:e0:96:70:5f:c3" and router[6].mac == "02:3b:45:92:19:06"
    assert "NO-CARRIER" in router[3].flags and router[0].mtu == 65536
    (vbox,) = parse_ip_link(capture("ip-link", "opensuse-eth0-unknown-kiwi595.txt"))
    assert (vbox.ifname, vbox.operstate, vbox.carrier, vbox.mac, vbox.mtu) == \
        ("eth0", "UNKNOWN", True, "08:00:27:3d:5c:c5", 1500)
    (bridge,) = parse_ip_link(capture("ip-link", "bridge-unindented-paste-uroot3190.txt"))
    assert (bridge.ifindex, bridge.ifname, bridge.operstate, bridge.carrier, bridge.mac) == \
        (6, "testbrg2", "DOWN", False, "e6:00:18:a8:c0:2f")
    dsl = parse_ip_link(capture("ip-link", "openwrt-router-ifb-dsl-ancistrus22.txt"))
    assert [x.ifname for x in dsl] == ["lo", "ifb0", "ifb1", "sit0", "ip6tnl0", "dsl0", "bcmsw"]
    assert (dsl[5].flags, dsl[5].mtu, dsl[5].operstate, dsl[5].mac) == (frozenset(), 0, "DOWN", None)
    assert (dsl[6].operstate, dsl[6].carrier, dsl[6].mtu, dsl[6].mac) == ("UNKNOWN", True, 2048, "08:02:8e:e6:b2:4e")
    assert dsl[1].mac == "66:4e:b4:be:90:a0" and dsl[3].mac is None  # link/sit carries an IPv4 address
    # the one-line captures read the same through the multi-line reader
    oneline = capture("ip-link", "bond-vlans-fusioninventory640.txt")
    assert parse_ip_link(oneline) == parse_ip_link_oneline(oneline)


# ---------------------------------------------------------------- nccl-tests

NCCL = {
    # name: (rows, first (size, count, type, redop, root), last out-of-place busbw, avg busbw, ranks, version)
    "dstack-lambda-b200-nccl-tests-2.17.6.txt": (29, (8, 2, "float", "sum", -1), 696.06, 137.179, 0, "2.17.6"),
    "coreweave-gb200-nvl72.txt": (5, (536870912, 134217728, "float", "sum", -1), 834.57, 745.53, 1, None),
    "eks-efa-t4-tag-output-nccl2.12.txt": (31, (0, 0, "float", "sum", -1), 3.11, 1.15327, 2, None),
    "skypilot-gke-h200-allgather-tag-output.txt":
        (24, (1024, 16, "float", "none", -1), 325.72, 122.073, 16, None),
    "gcp-a4-h200-allgather-nccl2.26.txt": (24, (1024, 16, "float", "none", -1), 325.52, 121.902, 16, None),
    "nccl258-v100-old-error-columns.txt": (4, (8, 2, "float", "sum", None), 0.0, None, 4, None),
    "nccl644-allgather-11-columns.txt": (13, (65536, 2048, "float", "", None), 7.32, None, 0, None),
}


@pytest.mark.parametrize("name", sorted(NCCL))
def test_nccl_tests(name):
    n_rows, first, last_busbw, avg, ranks, version = NCCL[name]
    result = parse_nccl_tests(capture("nccl-tests", name))
    row = result.rows[0]
    assert len(result.rows) == n_rows
    assert (row.size_bytes, row.count, row.dtype, row.redop, row.root) == first
    assert result.rows[-1].out_of_place.busbw_gbs == last_busbw
    assert result.avg_busbw_gbs == avg and len(result.ranks) == ranks and result.version == version
    assert all(r.in_place is not None for r in result.rows)


def test_nccl_tests_summary_lines_pasted_without_their_hash():
    first = parse_nccl_tests(capture("nccl-tests", "summary-only-no-hash-kernel515-nccltests362.txt"))
    second = parse_nccl_tests(capture("nccl-tests", "summary-only-no-hash-indented-kernel68-nccltests362.txt"))
    assert [(r.avg_busbw_gbs, r.out_of_bounds, r.rows) for r in (first, second)] == [(481.0, 0, []), (104.0, 0, [])]
    with pytest.raises(ParseError, match="result row or an 'Avg bus bandwidth'"):
        parse_nccl_tests(capture("ethtool", "rtl8126-5g-link-down-openwrt4.txt"))  # another tool's output


def test_nccl_tests_details_a_reader_sees():
    dstack = parse_nccl_tests(capture("nccl-tests", "dstack-lambda-b200-nccl-tests-2.17.6.txt"))
    assert dstack.collective == "all_reduce_perf"
    big = dstack.rows[-1]
    assert (big.size_bytes, big.out_of_place.time_us, big.in_place.algbw_gbs, big.in_place.wrong) == \
        (2147483648, 5784.75, 374.88, 0)
    eks = parse_nccl_tests(capture("nccl-tests", "eks-efa-t4-tag-output-nccl2.12.txt"))
    assert eks.ranks == [{"rank": 0, "host": "test-nccl-efa-worker-0", "device": 0},
                         {"rank": 1, "host": "test-nccl-efa-worker-1", "device": 0}]
    assert eks.settings["maxBytes"] == "1073741824" and eks.out_of_bounds == 0
    assert eks.rows[-2].out_of_place.time_us == 171351
    sky = parse_nccl_tests(capture("nccl-tests", "skypilot-gke-h200-allgather-tag-output.txt"))
    assert sky.ranks[15] == {"rank": 15, "host": "nc-d87e1263-worker1", "device": 7}
    old = parse_nccl_tests(capture("nccl-tests", "nccl258-v100-old-error-columns.txt"))
    assert [r.out_of_place.max_error for r in old.rows] == [1e-07, 3e-08, 3e-08, 3e-08]
    assert old.rows[3].in_place.time_us == 278.1 and old.rows[0].out_of_place.wrong is None
    coreweave = parse_nccl_tests(capture("nccl-tests", "coreweave-gb200-nvl72.txt"))
    assert coreweave.rows[3].out_of_place.time_us == 10094 and coreweave.ranks[0]["rank"] == 71


# ---------------------------------------------------------------- perftest

PERFTEST = {
    # name: (test, Device, Link type, Mtu, qps, unit, local QPN, remote GID)
    "perftest273-post-list-gbits-tabs.txt":
        ("RDMA_Write Post List BW Test", "ib0", "Ethernet", "4096[B]", "1", "Gb/sec", None, None),
    "perftest240-server-tabs-as-spaces.txt":
        ("RDMA_Write BW Test", "mlx5_0", "Ethernet", "4096[B]", "1", None, "0x2da6",
         "00:00:00:00:00:00:00:00:00:00:255:255:11:00:00:88"),
    "perftest234-server-mbsec-tabs.txt":
        ("RDMA_Write BW Test", "mlx5_0", "Ethernet", "4096[B]", "1", "MB/sec", "0x0108",
         "00:00:00:00:00:00:00:00:00:00:255:255:10:255:255:04"),
    "perftest214-infiniband-indented.txt":
        ("RDMA_Write BW Test", "ibp5", "IB", "4096[B]", "1", None, "0x0867",
         "254:128:00:00:00:00:00:00:148:109:174:03:00:50:24:232"),
    "perftest-ngc108-bidirectional-header.txt":
        ("RDMA_Write Bidirectional BW Test", "mlx5_3", None, None, "2", None, None, None),
}


@pytest.mark.parametrize("name", sorted(PERFTEST))
def test_perftest_header(name):
    test, device, link, mtu, qps, unit, qpn, remote_gid = PERFTEST[name]
    header = parse_perftest_header(capture("perftest", name))
    s = header.settings
    assert (header.test, s["Device"], s.get("Link type"), s.get("Mtu"), s["Number of qps"], header.unit) == \
        (test, device, link, mtu, qps, unit)
    assert s["Dual-port"] == "OFF" and s["Transport type"] == "IB" and s["Connection type"] == "RC"
    assert s["Using SRQ"] == "OFF"  # the second column of a TAB- or space-separated pair
    assert (header.local[0]["QPN"] if header.local else None) == qpn
    assert (header.remote[0]["GID"] if header.remote else None) == remote_gid


def test_perftest_result_row_with_tabs():
    result = parse_ib_write_bw(capture("perftest", "perftest273-post-list-gbits-tabs.txt"))
    (row,) = result.rows
    assert (row.size_bytes, row.iterations, row.bw_peak, row.bw_average, row.msg_rate_mpps, row.unit) == \
        (8, 224958464, 0.0, 0.48, 7.498617, "Gb/sec")
    assert result.settings["rdma_cm QPs"] == "OFF" and result.settings["Post List"] == "128"


# ---------------------------------------------------------------- nvidia-smi

GPUS = {
    # capture: (name, memory.total, clocks.current.sm, power.limit unit)
    "linux-x86_64__nvidia-h100-80gb-hbm3__590.48.01.csv.txt": ("NVIDIA H100 80GB HBM3", 81559, 345),
    "linux-x86_64__nvidia-h100-mig__590.48.01.csv.txt": ("NVIDIA H100 80GB HBM3", 81559, 345),
    "linux-x86_64__nvidia-h200__590.48.01.csv.txt": ("NVIDIA H200", 143771, 345),
    "linux-x86_64__nvidia-l40s__595.80.csv.txt": ("NVIDIA L40S", 46068, 2520),
    "linux-x86_64__nvidia-geforce-rtx-2080-super__595.71.05.csv.txt": ("NVIDIA GeForce RTX 2080 SUPER", 8192, 765),
    "windows-x86_64__nvidia-geforce-rtx-2080-super__591.86.csv.txt": ("NVIDIA GeForce RTX 2080 SUPER", 8192, 300),
}


@pytest.mark.parametrize("name", sorted(GPUS))
def test_nvidia_smi_query_gpu(name):
    gpu_name, memory_total, sm_mhz = GPUS[name]
    text = capture("nvidia-smi", name)
    query = parse_nvidia_smi_csv(text)
    (record,) = query.records()
    assert (record["name"], record["memory.total"], record["clocks.current.sm"]) == (gpu_name, memory_total, sm_mhz)
    assert query.units[query.fields.index("clocks.current.sm")] == "MHz"
    assert query.units[query.fields.index("memory.total")] == "MiB"
    assert query.column("clocks.sm") == [sm_mhz]  # the alias a caller queries reads the renamed header
    driver = name.split("__")[-1].removesuffix(".csv.txt")
    assert record["driver_version"] == driver
    # the same answer parsed with the field list as queried (aliases as the caller wrote them)
    queried = [{"clocks.current.sm": "clocks.sm", "name": "gpu_name"}.get(f, f) for f in query.fields]
    assert parse_nvidia_smi_csv(text, queried).records() == query.records()


def test_field_aliases_are_nvidia_smis_own():
    pairs = set()
    for line in capture("nvidia-smi", "help-query-gpu-alias-lines-590.48.01.txt").splitlines():
        names = [part.strip().strip('"') for part in line.split(" or ")]
        pairs |= {(alias, names[0]) for alias in names[1:]}
    assert set(FIELD_ALIASES.items()) <= pairs
    assert canonical_field("clocks.sm") == "clocks.current.sm" and canonical_field("index") == "index"


def test_nvidia_smi_590_deprecated_and_unsupported_values_read_as_none():
    # driver >= 590 answers six fields with `[Requested functionality has been deprecated]`
    for name in GPUS:
        (record,) = parse_nvidia_smi_csv(capture("nvidia-smi", name)).records()
        assert not [k for k, v in record.items() if isinstance(v, str) and v.startswith("[")], name
        assert record["display_mode"] is None and record["clocks.applications.graphics"] is None, name
        assert record["power.management"] is None and isinstance(record["power.draw"], float), name


# ---------------------------------------------------------------- nvidia-smi topo -m

def test_nvidia_smi_topo_pasted_with_spaces_reads_like_tabs():
    spaces = parse_nvidia_smi_topo(capture("nvidia-smi-topo", "rtx6000ada-4gpu-4nic-spaces-stelline.txt"))
    assert spaces.links["GPU0"] == {"GPU0": "X", "GPU1": "NODE", "GPU2": "SYS", "GPU3": "SYS", "NIC0": "NODE",
                                    "NIC1": "NODE", "NIC2": "SYS", "NIC3": "SYS"}
    assert spaces.nic_names == {f"NIC{i}": f"mlx5_{i}" for i in range(4)}
    assert spaces.cpu_affinity == {"GPU0": "0-31", "GPU1": "0-31", "GPU2": "32-63", "GPU3": "32-63"}
    assert spaces.numa_affinity == {"GPU0": "0", "GPU1": "0", "GPU2": "1", "GPU3": "1"}
    assert spaces.closest_gpus("mlx5_0") == ["GPU0", "GPU1"] and spaces.closest_gpus("mlx5_3") == ["GPU2", "GPU3"]
    tabs = parse_nvidia_smi_topo(capture("nvidia-smi-topo", "a100-8gpu-10nic-nv12-tabs.txt"))
    assert tabs.links["GPU0"]["GPU0"] == "X" and tabs.closest_gpus("mlx5_0") == ["GPU0", "GPU1"]


# ---------------------------------------------------------------- default nvidia-smi table

SMI_TABLE = {
    # name: (driver, cuda, gpus, first GPU (index, name, bus_id, used, total MiB, util %, mig mode), processes)
    "h100x8-550.90.07-gpud.txt":
        ("550.90.07", "12.4", 8, (0, "NVIDIA H100 80GB HBM3", "00000000:19:00.0", 1, 81559, 0, "Disabled"), 0),
    "geforce-err-fan-525.125.06-gpud.txt":
        ("525.125.06", "12.0", 1, (0, "NVIDIA GeForce ...", "00000000:01:00.0", 2021, 23028, 0, None), 0),
    "h100-load-590.48.01-gpu-exporter.txt":
        ("590.48.01", "13.1", 1, (0, "NVIDIA H100 80GB HBM3", "00000000:00:09.0", 19818, 81559, 100, "Disabled"), 3),
    "h100-mig-load-590.48.01-gpu-exporter.txt":
        ("590.48.01", "13.1", 1, (0, "NVIDIA H100 80GB HBM3", "00000000:00:09.0", 11125, 81559, None, "Enabled"), 3),
    "l40s-load-595.80-gpu-exporter.txt":
        ("595.80", "13.2", 1, (0, "NVIDIA L40S", "00000000:01:00.0", 1235, 46068, 9, None), 2),
    "rtx4080s-desktop-595.71.05-gpu-exporter.txt":
        ("595.71.05", "13.2", 1, (0, "NVIDIA GeForce RTX 4080 ...", "00000000:01:00.0", 1474, 16376, 7, None), 7),
    "rtx2080s-windows-wddm-591.86-gpu-exporter.txt":
        ("591.86", "13.1", 1, (0, "NVIDIA GeForce RTX 2080 ...", "00000000:0C:00.0", 1296, 8192, 7, None), 12),
}


@pytest.mark.parametrize("name", sorted(SMI_TABLE))
def test_nvidia_smi_default_table(name):
    driver, cuda, n_gpus, first, n_processes = SMI_TABLE[name]
    table = parse_nvidia_smi_table(capture("nvidia-smi-table", name))
    g = table.gpus[0]
    assert (table.driver_version, table.cuda_version, len(table.gpus), len(table.processes)) == \
        (driver, cuda, n_gpus, n_processes)
    assert (g.index, g.name, g.bus_id, g.memory_used_mib, g.memory_total_mib, g.util_pct, g.mig_mode) == first
    assert [x.index for x in table.gpus] == list(range(n_gpus))


def test_nvidia_smi_default_table_details():
    h100 = parse_nvidia_smi_table(capture("nvidia-smi-table", "h100x8-550.90.07-gpud.txt"))
    assert [g.bus_id[9:11] for g in h100.gpus] == ["19", "3B", "4C", "5D", "9B", "BB", "CB", "DB"]
    assert (h100.gpus[7].temp_c, h100.gpus[7].power_w, h100.gpus[7].power_cap_w) == (23, 72, 700)
    err = parse_nvidia_smi_table(capture("nvidia-smi-table", "geforce-err-fan-525.125.06-gpud.txt")).gpus[0]
    assert (err.fan_pct, err.temp_c, err.perf, err.compute_mode) == (None, 38, "P5", "E. Process")  # fan `ERR!`
    mig = parse_nvidia_smi_table(capture("nvidia-smi-table", "h100-mig-load-590.48.01-gpu-exporter.txt"))
    assert {(p.gi, p.ci) for p in mig.processes} == {("2", "0")}  # the MIG devices table is not read as GPUs
    desk = parse_nvidia_smi_table(capture("nvidia-smi-table", "rtx4080s-desktop-595.71.05-gpu-exporter.txt"))
    assert (desk.gpus[0].fan_pct, desk.gpus[0].display_active, desk.processes[0].kind) == (0, "On", "C+G")
    windows = parse_nvidia_smi_table(capture("nvidia-smi-table", "rtx2080s-windows-wddm-591.86-gpu-exporter.txt"))
    assert (windows.gpus[0].persistence, windows.gpus[0].fan_pct, windows.processes[0].memory_mib) == ("WDDM", 38, None)
    assert windows.processes[1].name == "...e Experience\\NVIDIA Share.exe"
    with pytest.raises(ParseError, match="NVIDIA-SMI"):
        parse_nvidia_smi_table(capture("nvidia-smi-topo", "rtx6000ada-4gpu-4nic-spaces-stelline.txt"))


# ---------------------------------------------------------------- ibstat / ibstatus / ibv_devinfo / ibdev2netdev

IBSTAT = {
    # name: (ports, first (ca, port, state, physical_state, rate, link_layer, base_lid), not Active)
    "h100-roce-and-ib-some-down-polling-gpud-tabs.txt":
        (12, ("mlx5_0", 1, "Active", "LinkUp", 400.0, "Ethernet", 0), {"mlx5_11": "Polling", "mlx5_5": "Disabled"}),
    "a100-hdr-ibpanic-trailer-gpud-spaces.txt":
        (8, ("mlx5_0", 1, "Active", "LinkUp", 200.0, "InfiniBand", 13247), {}),
    "a100-ib-and-roce-all-active-gpud-tabs.txt":
        (9, ("mlx5_0", 1, "Active", "LinkUp", 200.0, "Ethernet", 0), {}),
    "cx3-mlx4-two-ports-fdr-tabs-heioy.txt":
        (4, ("mlx4_0", 1, "Active", "LinkUp", 56.0, "InfiniBand", 10), {}),
}


@pytest.mark.parametrize("name", sorted(IBSTAT))
def test_ibstat(name):
    n, first, down = IBSTAT[name]
    ports = parse_ibstat(capture("ibstat", name))
    p = ports[0]
    assert len(ports) == n
    assert (p.ca, p.port, p.state, p.physical_state, p.rate_gbps, p.link_layer, p.base_lid) == first
    assert {x.ca: x.physical_state for x in ports if not x.active} == down


def test_ibstat_two_port_cas_and_the_ibpanic_trailer():
    cx3 = parse_ibstat(capture("ibstat", "cx3-mlx4-two-ports-fdr-tabs-heioy.txt"))
    assert [(p.ca, p.port, p.base_lid, p.sm_lid) for p in cx3] == [("mlx4_0", 1, 10, 9), ("mlx4_0", 2, 12, 9),
                                                                 ("mlx4_1", 1, 1, 7), ("mlx4_1", 2, 4, 7)]
    panic = parse_ibstat(capture("ibstat", "a100-hdr-ibpanic-trailer-gpud-spaces.txt"))
    assert [p.ca for p in panic] == [f"mlx5_{i}" for i in range(8)]  # mlx5_8 vanished: ibpanic line, no block
    assert panic[-1].port_guid == "0x00155dfffd3411f2" and panic[0].ca_type == "MT4124"


def test_ibstatus():
    a100 = parse_ibstatus(capture("ibstatus", "a100-hdr-all-active-gpud.txt"))
    assert [(p.dev, p.state.name, p.phys_state.name, p.rate.gbps, p.rate.speed) for p in a100[:2]] == \
        [("mlx5_0", "ACTIVE", "LinkUp", 200.0, "HDR"), ("mlx5_1", "ACTIVE", "LinkUp", 200.0, "HDR")]
    assert (a100[0].base_lid, a100[0].sm_lid, a100[0].link_layer) == (0x33BF, 1, "InfiniBand")
    assert (a100[-1].dev, a100[-1].link_layer, a100[-1].rate.gbps, a100[-1].default_gid) == \
        ("mlx5_8", "Ethernet", 40.0, "unknown")
    cx3 = parse_ibstatus(capture("ibstatus", "cx3-mlx4-two-ports-fdr-tabs-heioy.txt"))
    assert [(p.dev, p.port, p.base_lid, p.rate.speed) for p in cx3] == \
        [("mlx4_0", 1, 3, "FDR"), ("mlx4_0", 2, 2, "FDR")]


def test_ibv_devinfo():
    cx3 = parse_ibv_devinfo(capture("ibv-devinfo", "cx3-mlx4-two-hcas-two-ports-tabs-heioy.txt"))
    assert [(d.hca_id, d.vendor_part_id, [(p.port, p.state, p.port_lid) for p in d.ports]) for d in cx3] == [
        ("mlx4_1", 4099, [(1, "PORT_ACTIVE", 22), (2, "PORT_DOWN", 0)]),
        ("mlx4_0", 4099, [(1, "PORT_ACTIVE", 32), (2, "PORT_DOWN", 0)])]
    (roce,) = parse_ibv_devinfo(capture("ibv-devinfo", "cx6dx-roce-port-down-spaces-deepep60.txt"))
    assert (roce.hca_id, roce.fw_ver, roce.ports[0].state, roce.ports[0].link_layer, roce.ports[0].active_mtu) == \
        ("mlx5_12", "22.38.1900", "PORT_DOWN", "Ethernet", 1024)
    (flat,) = parse_ibv_devinfo(capture("ibv-devinfo", "cx7-ib-vf-port-init-flattened-network-operator1646.txt"))
    assert (flat.board_id, flat.ports[0].state, flat.ports[0].sm_lid, flat.ports[0].link_layer) == \
        ("MT_0000000838", "PORT_INIT", 4, "InfiniBand")  # the port's fields lost their indent in the paste


def test_ibdev2netdev():
    imbue = parse_ibdev2netdev(capture("ibdev2netdev", "h100-cx7-ib-cx6-eth-column-t-comments-imbue4.txt"))
    assert len(imbue) == 12 and {(x.dev, x.netdev) for x in imbue if x.netdev_up} == \
        {("mlx5_1", "enp27s0f0np0"), ("mlx5_7", "enp157s0f0np0")}
    assert imbue[2] == parse_ibdev2netdev("mlx5_10 port 1 ==> ibp204s0 (Down)")[0]
    (vf,) = parse_ibdev2netdev(capture("ibdev2netdev", "sriov-ib-vf-in-pod-down-sriov-operator382.txt"))
    assert (vf.dev, vf.port, vf.netdev, vf.netdev_up) == ("mlx5_3", 1, "net1", False)


@pytest.mark.parametrize("parse", [parse_ibstat, parse_ibstatus, parse_ibv_devinfo, parse_ibdev2netdev,
                                   parse_nvidia_smi_table])
def test_new_parsers_refuse_another_tools_output(parse):
    with pytest.raises(ParseError):
        parse(capture("ethtool", "rtl8126-5g-link-down-openwrt4.txt"))
