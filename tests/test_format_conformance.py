"""The emulated tools print what the real ones print: each emulated output's structure (record order, field names,
column positions, units) diffed against the real capture of the same tool and version (tests/data/real/)."""
from __future__ import annotations

import json
import quopri
import re
from dataclasses import dataclass
from pathlib import Path

import pytest

from devices.emulated import formats
from devices.emulated.formats import EmulatedGpu, ToolVersions
from devices.emulated.nic import NicSnapshot
from devices.emulated.profile import ProfileError, profile_from_dict
from devices.parsers.bench_tools import parse_ib_write_bw, parse_nccl_tests
from devices.parsers.gpu import parse_nvidia_smi_table
from devices.parsers.ib_tools import parse_ibdev2netdev, parse_ibstat, parse_ibstatus, parse_ibv_devinfo
from devices.parsers.nic import parse_ethtool_module, parse_mlxlink, parse_rdma_link, parse_rdma_link_json

REAL = Path(__file__).parent / "data" / "real"


def real(tool: str, name: str) -> str:
    return (REAL / tool / name).read_text().partition("\n")[2]


@dataclass(frozen=True)
class Model:
    netdev: str = "ens1f0np0"
    rdma_dev: str = "mlx5_0"
    rdma_port: int = 1
    mac: str = "02:00:00:00:00:01"
    ifindex: int = 5
    link_layer: str = "Ethernet"


# a port whose light arrives (carrier, LinkUp) and the physics default: a dark port (LOS/LOL, Polling, no carrier)
DARK = NicSnapshot()
UP = DARK._replace(rx_los=False, rx_lol=False, carrier=True, phys_state="LinkUp", ib_state="ACTIVE",
             operstate="up", carrier_up_count=1, rx_power_dbm=-1.5)


# ---------------------------------------------------------------- ethtool -m

def module_records(text: str) -> list[tuple[str, str]]:
    """(key with lane numbers folded, unit shape of the value) per `key : value` record, consecutive repeats
    (one per lane) folded to one."""
    out: list[tuple[str, str]] = []
    for line in text.splitlines():
        key, sep, value = line.partition(" : ")
        if not sep:
            continue
        shape = re.sub(r"-?\d+(\.\d+)?|-inf|\binf\b", "N", value.strip())
        record = (re.sub(r"\((Channel|Chan) \d+\)", r"(\1 #)", key.strip()), shape)
        if not out or out[-1] != record:
            out.append(record)
    return out


def keys(records):
    return [k for k, _ in records]


def assert_ordered_subset(emulated: list[str], real_keys: list[str]):
    """Every emulated record exists in the real capture, in the real capture's order."""
    missing = [k for k in emulated if k not in real_keys]
    assert not missing, f"records the real tool does not print: {missing}"
    positions = [real_keys.index(k) for k in emulated]
    assert positions == sorted(positions), list(zip(emulated, positions))


def test_ethtool_module_cmis_400g_matches_ethtool_6_4_capture():
    sample = module_records(real("ethtool-m", "cmis-qsfpdd-400g-xdr4-arista-ethtool6.txt"))
    text = formats.ethtool_module(UP)
    emulated = module_records(text)
    assert keys(emulated) == [k for k in keys(sample)]  # the same records in the same order
    shapes = dict(sample)
    for key, shape in emulated:  # units and number shapes as the real tool prints them
        if key in ("Laser tx bias current (Channel #)", "Transmit avg optical power (Channel #)",
                   "Rcvr signal avg optical power (Channel #)", "Module voltage", "Power class", "Max power",
                   "Laser wavelength", "Length (OM4)", "Module State", "Rx loss of signal"):
            assert shape == shapes[key], (key, shape, shapes[key])
    # `\t%-41s : value`: the real capture lost its TAB to a mail client; the column of " : " is the same
    assert {line.index(" : ") for line in text.splitlines()} == {42}
    assert {line.index(" : ") for line in real("ethtool-m", "cmis-qsfpdd-400g-xdr4-arista-ethtool6.txt")
            .splitlines() if " : " in line} == {41}
    flags = parse_ethtool_module(text)
    assert flags.cmis and len(flags.rx_power_dbm) == 8 and flags.module_state == "ModuleReady"


def test_ethtool_module_cmis_lane_flags_match_the_16_lane_capture_layout():
    sample = real("ethtool-m", "cmis-16lane-spectrum-peer-down-ethtool6.4.txt")
    text = formats.ethtool_module(DARK)
    grep = [line for line in text.splitlines() if line.split(" : ")[0].strip() in
            ("Rx loss of signal", "Tx loss of signal", "Rx loss of lock", "Tx loss of lock")]
    lanes = lambda line: line.split(" : ")[1]  # noqa: E731
    assert [line.split(" : ")[0].strip() for line in grep] == \
        [line.split(" : ")[0].strip() for line in sample.splitlines()][:4]
    assert lanes(grep[0]) == "[ " + ", ".join(["Yes"] * 8) + " ]" and lanes(grep[1]) == "None"
    assert lanes(sample.splitlines()[0]).count("Yes") == 16  # that module reports two banks


def test_ethtool_module_before_6_4_prints_no_loss_lines_like_the_capture():
    old = ToolVersions(ethtool="5.8")
    text = formats.ethtool_module(DARK, tools=old)
    sample = module_records(real("ethtool-m", "cmis-qsfpdd-dac-mellanox-ethtool5.8-nolos.txt"))
    for name in ("Rx loss of signal", "Rx loss of lock", "Module State"):
        assert name not in keys(module_records(text)) and name not in keys(sample)
    flags = parse_ethtool_module(text)
    assert flags.rx_los is None and flags.rx_lol is None and flags.cmis
    mid = parse_ethtool_module(formats.ethtool_module(DARK, tools=ToolVersions(ethtool="6.1")))
    assert mid.rx_los is None and mid.module_state == "ModuleReady"  # 5.16 <= 6.1 < 6.4


def test_ethtool_module_sff8636_100g_matches_sff8636_captures():
    krzysztof = module_records(real("ethtool-m", "sff8636-qsfp-40g-sr4-cx3-ethtool6-los-nolol.txt"))
    fs = module_records(real("ethtool-m", "sff8636-qsfp28-100g-sr4-fs-lldpd477.txt"))
    signals = keys(module_records(real("ethtool-m", "sff8636-qsfp-aoc-spectrum-peer-down-ethtool6.4.txt")))
    text = formats.ethtool_module(UP._replace(speed_mbps=100_000))
    emulated = keys(module_records(text))
    # records beyond the 40G capture's are the 100G part's (from the QSFP28 capture) and its lane flags
    real_keys = keys(krzysztof)
    assert_ordered_subset([k for k in emulated if k in real_keys], real_keys)
    assert set(emulated) <= set(real_keys) | set(keys(fs)) | set(signals) | {"Tx fault"}
    block = [k for k in emulated if "loss of" in k or k == "Tx fault"]
    assert block == signals[:4] + ["Tx fault"]  # qsfp.c: LOS, Tx LOS, LOL, Tx LOL, Tx fault
    assert emulated.index("Revision Compliance") < emulated.index("Rx loss of signal") < \
        emulated.index("Module temperature")  # as in the 6.x capture
    assert dict(module_records(text))["Identifier"] == dict(fs)["Identifier"] == "NxN (QSFPN)"
    assert "(Channel #)" in "".join(k for k in emulated if k.startswith("Rcvr signal avg optical power(Channel"))
    assert len(parse_ethtool_module(text).rx_power_dbm) == 4


# ---------------------------------------------------------------- ethtool (link settings)

def settings_keys(text: str) -> list[str]:
    return [line.partition(":")[0].strip() for line in text.splitlines()[1:]
            if ":" in line and not line.startswith(" " * 16)]


def test_ethtool_settings_field_order_follows_the_pinned_release():
    netlink = settings_keys(real("ethtool", "e1g-ethtool5.8-netlink-order-idosch.txt"))
    ioctl = settings_keys(real("ethtool", "e1g-ethtool5.4-ioctl-order-idosch.txt"))
    assert netlink != ioctl and sorted(netlink) == sorted(ioctl)  # same fields, Auto-negotiation moved
    current = formats.ethtool(Model(), UP)
    assert current.startswith("Settings for ens1f0np0:\n\tSupported ports: ")  # TABs, as the rtl8126 capture
    assert "\tLanes: 8\n" in current  # ethtool >= 5.12 with a link
    assert_ordered_subset([k for k in settings_keys(current) if k != "Lanes"], netlink)
    assert_ordered_subset(settings_keys(formats.ethtool(Model(), DARK)),
                          settings_keys(real("ethtool", "rtl8126-5g-link-down-openwrt4.txt")))
    old = formats.ethtool(Model(), UP, tools=ToolVersions(ethtool="5.4"))
    assert "Lanes" not in old
    assert_ordered_subset(settings_keys(old), ioctl)
    with pytest.raises(AssertionError):
        assert_ordered_subset(settings_keys(old), netlink)


# ---------------------------------------------------------------- rdma link


def test_rdma_link_roce_line_has_the_real_trailing_blank():
    sample = real("rdma-link", "roce-cx6dx-3fs283.txt").splitlines()[0]
    line = formats.rdma_link([(Model(), UP)], as_json=False).rstrip("\n")
    pattern = r"link \S+/\d+ state [A-Z_]+ physical_state [A-Z_]+ netdev \S+ "
    assert re.fullmatch(pattern, sample) and re.fullmatch(pattern, line)


def test_rdma_link_infiniband_form_matches_the_ib_capture():
    sample = real("rdma-link", "ib-and-roce-cx6-sriov-operator635.txt").splitlines()[0]
    line = formats.rdma_link([(Model(link_layer="InfiniBand"), UP)], as_json=False).rstrip("\n")
    shape = lambda text: [w for w in text.split()[2::2]]  # noqa: E731 - the attribute names, in order
    assert shape(line) == shape(sample) == ["subnet_prefix", "lid", "sm_lid", "lmc", "state", "physical_state"]
    (ib,) = parse_rdma_link(line)
    assert ib.infiniband and ib.netdev is None and ib.subnet_prefix == "fe80:0000:0000:0000"
    (j,) = parse_rdma_link_json(formats.rdma_link([(Model(link_layer="InfiniBand"), UP)], as_json=True))
    assert j.infiniband and j.dev == "mlx5_0"


def test_rdma_link_before_iproute2_5_5_prints_the_index_form():
    sample = real("rdma-link", "old-form-sriov-vf-spiderpool.txt").splitlines()[0]
    old = ToolVersions(iproute2="5.4")
    line = formats.rdma_link([(Model(), UP)], as_json=False, tools=old).rstrip("\n")
    pattern = r"\d+/\d+: \S+/\d+: state [A-Z_]+ physical_state [A-Z_]+ netdev \S+"
    assert re.fullmatch(pattern, sample) and re.fullmatch(pattern + " ", line)
    (link,) = parse_rdma_link(line)
    assert (link.dev, link.port, link.netdev) == ("mlx5_0", 1, "ens1f0np0")
    (j,) = parse_rdma_link_json(formats.rdma_link([(Model(), UP)], as_json=True, tools=old))
    assert j.dev == "mlx5_0"  # iproute2 < 5.5 wrote ifname "mlx5_0/1"


# ---------------------------------------------------------------- mlxlink


def mlx_layout(text: str) -> tuple[list[str], set[int], list[str]]:
    lines = text.splitlines()
    titles = [lines[i] for i in range(len(lines) - 1) if lines[i + 1] and set(lines[i + 1]) == {"-"}]
    colons = {line.index(": ") for line in lines if " : " in line}
    return titles, colons, [line[:line.index(":")].strip() for line in lines if " : " in line]


def test_mlxlink_sections_and_columns_match_real_mlxlink():
    sample_titles, sample_colons, sample_keys = mlx_layout(real("mlxlink", "cx4-hpe-840qsfp28-physical-linkup-"
                                                                         "sonic3578.txt"))
    text = formats.mlxlink(Model(), UP)
    titles, colons, emulated_keys = mlx_layout(text)
    assert colons == sample_colons == {32}
    assert text.startswith("\nOperational Info\n----------------\n")  # printTitle: blank line, title, underline
    assert titles[0] == sample_titles[0] == "Operational Info"
    assert emulated_keys[:7] == sample_keys[:7] == ["State", "Physical state", "Speed", "Width", "FEC",
                                                    "Loopback Mode", "Auto Negotiation"]
    assert titles == ["Operational Info", "Troubleshooting Info", "Tool Information"]
    spectrum = parse_mlxlink(real("mlxlink", "spectrum-25g-troubleshooting-nvidia-sonic-docs.txt"))
    assert list(parse_mlxlink(text).section("Troubleshooting Info")) == \
        list(spectrum.section("Troubleshooting Info")) == ["Status Opcode", "Group Opcode", "Recommendation"]
    info = parse_mlxlink(text)
    cx6 = parse_mlxlink(real("mlxlink", "cx6-200g-eth-an-fsm-enable-kontronn.txt"))
    assert (info.state, info.physical_state, info.fec) == (cx6.state, cx6.physical_state, cx6.fec)
    assert info.link_up and info.speed == "400G" and info.width == "8x"


def test_mlxlink_dark_port_is_polling_not_up():
    info = parse_mlxlink(formats.mlxlink(Model(), DARK))
    assert (info.state, info.link_up, info.speed, info.width, info.fec) == ("Polling", False, "N/A", "N/A", "N/A")


# ---------------------------------------------------------------- ip -j link

def test_ip_json_keys_come_in_iproutes_order():
    mail = real("ip-j-link", "veth-other-netns-ip-s-s-j-netdev-2022.txt")
    real_lo, real_veth = json.loads(quopri.decodestring(mail.encode()))
    emulated_lo, emulated_port = json.loads(formats.ip_link_json([(Model(), UP)]))
    assert list(emulated_lo) == [k for k in real_lo if k != "stats64"]  # `-s` adds stats64; nothing else differs
    assert_ordered_subset(list(emulated_port), list(real_veth))
    assert set(real_veth) - set(emulated_port) == {"link_index", "link_netnsid", "stats64"}  # netns peer, -s


# ---------------------------------------------------------------- perftest

END = formats.PerftestEnd(lid=0, qpn=0x108, psn=0x63AD7D, rkey=0x17EEDF, vaddr=0x7F760C947000, gid=bytes(16))


def skeleton(line: str) -> str:
    """The whitespace of a row with every number replaced by `#`."""
    return re.sub(r"[\d.]+", "#", line)


def test_ib_write_bw_rows_and_units_match_each_perftest_version():
    old_sample = real("perftest", "perftest273-post-list-gbits-tabs.txt").splitlines()
    old = formats.ib_write_bw_output("ib0", END, END, [(8, 224958464, 0.0, 0.48, 7.498617)], report_gbits=True,
                                     tools=ToolVersions(perftest="23.04")).splitlines()
    sample_row = next(line for line in old_sample if line.startswith(" 8 "))
    row = next(line for line in old if line.startswith(" 8 "))
    assert row == sample_row  # the same numbers print the same bytes, TABs included
    header = next(line for line in old if "#bytes" in line)
    assert header == next(line for line in old_sample if "#bytes" in line)
    mb = formats.ib_write_bw_output("mlx5_0", END, END, [(65536, 5000, 11.0, 11.0, 0.18)], report_gbits=False,
                                    tools=ToolVersions(perftest="23.04"))
    assert next(line for line in mb.splitlines() if "#bytes" in line) == \
        next(line for line in real("perftest", "perftest234-server-mbsec-tabs.txt").splitlines() if "#bytes" in line)
    new = formats.ib_write_bw_output("mlx5_0", END, END, [(8, 224958464, 0.0, 0.48, 7.498617)], report_gbits=False)
    assert "BW peak[MiB/sec]" in new  # perftest 24.07 relabelled the unit
    assert skeleton(next(line for line in new.splitlines() if line.startswith(" 8 "))) == \
        skeleton(sample_row).replace("\t\t   ", "\t\t     ")
    assert parse_ib_write_bw(new).unit == "MiB/sec"


def test_ib_write_bw_settings_lines_match_the_capture():
    sample = real("perftest", "perftest234-server-mbsec-tabs.txt").splitlines()
    text = formats.ib_write_bw_output("mlx5_0", END, END, [(65536, 5000, 11.0, 11.0, 0.18)], report_gbits=True)
    for prefix in (" Dual-port       : OFF\t\tDevice         : mlx5_0", " Number of qps   : 1\t\tTransport type : IB",
                   " Connection type : RC\t\tUsing SRQ      : OFF", " Mtu             : 4096[B]",
                   " rdma_cm QPs\t : OFF", " local address: LID 0000 QPN 0x0108 PSN 0x63ad7d RKey 0x17eedf VAddr "
                   "0x007f760c947000"):
        assert prefix in sample and prefix in text.splitlines(), prefix


# ---------------------------------------------------------------- nccl-tests


def column_ends(line: str) -> list[int]:
    return [m.end() for m in re.finditer(r"\S+", line)]


def nccl(version: str) -> str:
    timing = formats.NcclTiming(36.5, 0.0, 0.0, 0)
    ranks = [formats.NcclRank(0, "gpu0", 0, 4242, 0x18, "NVIDIA H100 80GB HBM3")]
    return formats.nccl_tests_output("all_reduce_perf", ranks, [(8, 2, "float", "sum", -1, timing, timing)],
                                     min_bytes=8, max_bytes=8, step_factor=2, warmup_iters=1, iters=20, check=True,
                                     tools=ToolVersions(nccl_tests=version))


def test_nccl_tests_2_17_lines_and_columns_match_the_capture():
    sample = real("nccl-tests", "dstack-lambda-b200-nccl-tests-2.17.6.txt").splitlines()
    text = nccl("2.17.6").splitlines()
    assert text[0].split()[:4] == sample[0].split()[:4] == ["#", "nccl-tests", "version", "2.17.6"]
    assert text[1] == sample[1].replace("all_reduce_perf", "all_reduce_perf")
    header = next(line for line in text if "redop" in line)
    assert header.rstrip() == next(line for line in sample if "redop" in line)
    row = next(line for line in text if line.strip().startswith("8 "))
    assert column_ends(row) == column_ends(next(line for line in sample if line.strip().startswith("8 ")))
    assert parse_nccl_tests("\n".join(text)).version == "2.17.6"


def test_nccl_tests_before_2_17_match_the_older_capture():
    sample = real("nccl-tests", "eks-efa-t4-tag-output-nccl2.12.txt").splitlines()
    untag = [line.partition("<stdout>:")[2] for line in sample]
    text = nccl("2.13.6").splitlines()
    assert not text[0].startswith("# nccl-tests version")
    assert next(line for line in text if "redop" in line) == next(line for line in untag if "redop" in line)
    row = next(line for line in text if line.strip().startswith("8 "))
    assert column_ends(row) == column_ends(next(line for line in untag if line.strip().startswith("8 ")))
    assert "[0x18]" in next(line for line in text if "Rank" in line)  # older rank lines: [0xBUS]


# ---------------------------------------------------------------- nvidia-smi


def test_nvidia_smi_header_renames_aliases_like_the_driver():
    gpus = [formats.EmulatedGpu(0)]
    text = formats.nvidia_smi_query(gpus, ["index", "name", "memory.total", "clocks.sm"], 0, header=True,
                                    units=True)
    header, row = text.splitlines()
    assert header == "index, name, memory.total [MiB], clocks.current.sm [MHz]"
    sample_header = real("nvidia-smi", "linux-x86_64__nvidia-h100-80gb-hbm3__590.48.01.csv.txt").splitlines()[0]
    for cell in header.split(", ")[1:]:
        assert cell in sample_header.split(", ")
    assert re.fullmatch(r"0, NVIDIA H100 80GB HBM3, \d+ MiB, \d+ MHz", row)


# ---------------------------------------------------------------- profile pins


def test_profile_pins_tool_versions_and_rejects_bad_pins():
    profile = profile_from_dict({"tools": {"ethtool": "5.16", "iproute2": "5.4"}})
    assert profile.tools == {"ethtool": "5.16", "iproute2": "5.4"}
    tools = ToolVersions(**profile.tools)
    assert not tools.at_least("ethtool", "6.4") and tools.at_least("ethtool", "5.16")
    for bad in ({"ethtool": "new"}, {"wireshark": "4.0"}, ["ethtool"]):
        with pytest.raises(ProfileError, match="tools"):
            profile_from_dict({"tools": bad}, "bench.yaml")


# ---------------------------------------------------------------- ibstat / ibv_devinfo / ibdev2netdev

def ibstat_shape(text: str) -> list[tuple[int, str]]:
    """(leading TABs, key) per line: the block structure ibstat prints."""
    return [(len(line) - len(line.lstrip("\t")), line.strip().split("'")[0].split(":")[0])
            for line in text.splitlines()]


def test_ibstat_blocks_match_the_real_ibstat():
    capture = real("ibstat", "h100-roce-and-ib-some-down-polling-gpud-tabs.txt")
    blocks = ["CA '" + b for b in capture.split("CA '")[1:]]
    up, dark = blocks[0], next(b for b in blocks if "Polling" in b)  # mlx5_0 Active/LinkUp, mlx5_11 Down/Polling
    for snapshot, sample in ((UP, up), (DARK, dark)):
        text = formats.ibstat([(Model(), snapshot._replace(speed_mbps=400_000))])
        assert ibstat_shape(text) == ibstat_shape(sample)
        mine, theirs = parse_ibstat(text)[0], parse_ibstat(sample)[0]
        assert (mine.state, mine.physical_state, mine.rate_gbps, mine.link_layer, mine.base_lid) == \
            (theirs.state, theirs.physical_state, theirs.rate_gbps, theirs.link_layer, theirs.base_lid)
    # mlx5 derives a RoCE port's GUIDs from its MAC: the real mlx5_0's node and port GUIDs from that rule
    node, port = formats._guids("a0:88:c2:ad:ea:b8")
    assert (f"0x{node}", f"0x{port}") == ("0xa088c20300adeab8", "0xa288c2fffeadeab8")
    assert "Node GUID: 0xa088c20300adeab8" in up and "Port GUID: 0xa288c2fffeadeab8" in up


def devinfo_columns(text: str) -> list[tuple[str, int]]:
    """(key, column where its value starts, TABs expanded to 8) per `key: value` line."""
    out = []
    for line in text.expandtabs(8).splitlines():
        m = re.match(r"(\s*)(\w[\w ]*):(\s+)\S", line)
        if m:
            out.append((m.group(2), m.end() - 1))
    return out


def test_ibv_devinfo_keys_and_value_columns_match_real_ibv_devinfo():
    text = formats.ibv_devinfo([(Model(), DARK)])
    roce = real("ibv-devinfo", "cx6dx-roce-port-down-spaces-deepep60.txt")  # rdma-core of 2025, TABs as spaces
    assert devinfo_columns(text) == devinfo_columns(roce)  # the same keys, order and value columns (40, 24, 48)
    tabs = real("ibv-devinfo", "cx3-mlx4-two-hcas-two-ports-tabs-heioy.txt")  # the TABs as printed
    assert [c for c in devinfo_columns(tabs) if c[0] != "Device ports"][:18] == devinfo_columns(text)
    assert [line.count("\t") for line in text.splitlines()[:18]] == \
        [line.count("\t") for line in tabs.splitlines() if "Device ports" not in line][:18]
    (mine,), (theirs,) = parse_ibv_devinfo(text), parse_ibv_devinfo(roce)
    assert (mine.transport, mine.ports[0].state, mine.ports[0].link_layer, mine.ports[0].active_mtu) == \
        (theirs.transport, theirs.ports[0].state, theirs.ports[0].link_layer, theirs.ports[0].active_mtu)


def test_ibstatus_blocks_match_the_real_ibstatus():
    capture = real("ibstatus", "a100-hdr-all-active-gpud.txt")  # TABs arrived as spaces: compare columns
    roce = capture[capture.index("Infiniband device 'mlx5_8'"):]  # its RoCE port, Active at 40 Gb/sec
    text = formats.ibstatus([(Model(rdma_dev="mlx5_8"), UP._replace(speed_mbps=40_000))])
    assert text.expandtabs(8) == roce
    tabs = real("ibstatus", "cx3-mlx4-two-ports-fdr-tabs-heioy.txt")  # the TABs as printed, InfiniBand ports
    ib = formats.ibstatus([(Model(rdma_dev="mlx4_0", link_layer="InfiniBand"), UP._replace(speed_mbps=56_000))])
    first = tabs[:tabs.index("\n\n") + 2]
    assert [line.split(":")[0] + line[line.index(":"):].split(" ")[0] for line in ib.splitlines() if ":" in line] \
        == [line.split(":")[0] + line[line.index(":"):].split(" ")[0] for line in first.splitlines() if ":" in line]
    (mine,), theirs = parse_ibstatus(ib), parse_ibstatus(first)[0]
    assert (mine.state, mine.phys_state, mine.rate, mine.link_layer) == \
        (theirs.state, theirs.phys_state, theirs.rate, theirs.link_layer)


def test_ibdev2netdev_line_matches_the_real_one():
    sample = real("ibdev2netdev", "sriov-ib-vf-in-pod-down-sriov-operator382.txt")
    text = formats.ibdev2netdev([(Model(netdev="net1", rdma_dev="mlx5_3"), DARK)])
    assert text == sample  # `mlx5_3 port 1 ==> net1 (Down)`, byte for byte
    assert parse_ibdev2netdev(formats.ibdev2netdev([(Model(), UP)]))[0].netdev_up


# ---------------------------------------------------------------- the default nvidia-smi table

def smi_layout(text: str) -> list[tuple[int, tuple[int, ...]]]:
    """(length, column of every `|` or `+`) per table line."""
    return [(len(line), tuple(i for i, c in enumerate(line) if c in "|+")) for line in text.splitlines()
            if line[:1] in "|+"]


def test_nvidia_smi_table_matches_the_550_capture_line_for_line():
    sample = real("nvidia-smi-table", "h100x8-550.90.07-gpud.txt")
    gpus = [EmulatedGpu(i) for i in range(8)]
    text = formats.nvidia_smi_table(gpus, 1_737_368_306 * 10**9)
    assert smi_layout(text) == smi_layout(sample)  # every line's width and separators
    fixed = [line for line in sample.splitlines() if not re.search(r"\d", line)]  # rules, heads, process table
    assert [line for line in text.splitlines() if not re.search(r"\d", line)] == fixed
    mine, theirs = parse_nvidia_smi_table(text), parse_nvidia_smi_table(sample)
    assert [(g.index, g.name, g.memory_total_mib, g.persistence, g.mig_mode) for g in mine.gpus] == \
        [(g.index, g.name, g.memory_total_mib, g.persistence, g.mig_mode) for g in theirs.gpus]
    assert [g.bus_id for g in mine.gpus] == [g.pci_bus_id for g in gpus] and mine.driver_version == "550.54.15"
    assert re.fullmatch(r"\w{3} \w{3} [ \d]\d \d\d:\d\d:\d\d \d{4} *", text.splitlines()[0])


# ---------------------------------------------------------------- end to end: `bench discover` and its fallbacks

@pytest.fixture(scope="module")
def bench():
    from devices.emulated.bench import EmulatedBench

    with EmulatedBench("instant", seed=2) as eb:
        yield eb


def _run(server, command: str):
    from devices.ssh import SshTransport
    from devices.timing import Deadline

    transport = SshTransport(server.resource(), connect_timeout=5.0)
    try:
        return transport.run(command, deadline=Deadline(10.0), check=False)
    finally:
        transport.close()


def _refuse_query(real_nvidia_smi):
    def nvidia_smi(ctx, argv):  # a driver whose nvidia-smi does not answer --query-gpu (the table it does)
        if any(a.startswith("--query-gpu") for a in argv):
            ctx.err("Invalid combination of input arguments. Please run 'nvidia-smi -h' for help.\n")
            return 2
        return real_nvidia_smi(ctx, argv)
    return nvidia_smi


def test_bench_discover_reads_the_same_bench_through_every_fallback(bench):
    from harness.preflight import discover_host

    name, server = sorted(bench.host_servers.items())[0]
    saved = dict(server.commands)

    def facts():
        found = discover_host(server.resource(), timeout_s=10.0)
        nics = [(n["rdma_dev"], n["rdma_port"], n["netdev"], n["state"], n.get("closest_gpus")) for n in found["nics"]]
        gpus = [(g["index"], g["name"], g["pci_bus_id"]) for g in found["gpus"]]
        return found["found_by"], nics, gpus

    try:
        by, nics, gpus = facts()
        assert by == {"rdma_ports": "rdma link", "gpus": "nvidia-smi --query-gpu"}
        truth = [(m.rdma_dev, m.rdma_port, m.netdev) for m in bench.physics.nic_ports(name)]
        assert [n[:3] for n in nics] == truth and len(gpus) == len(server.gpus) and nics[0][4]
        del server.commands["rdma"]
        server.commands["nvidia-smi"] = _refuse_query(saved["nvidia-smi"])
        assert facts() == ({"rdma_ports": "ibstat + ibdev2netdev", "gpus": "nvidia-smi"}, nics, gpus)
        del server.commands["ibstat"], server.commands["ibdev2netdev"]
        assert facts()[0]["rdma_ports"] == "ibv_devinfo + sysfs" and facts()[1] == nics
        del server.commands["ibv_devinfo"]
        assert facts()[0]["rdma_ports"] == "ibstatus + sysfs" and facts()[1] == nics
        del server.commands["ibstatus"]
        by, none, _ = facts()
        assert none == [] and by["rdma_ports"].startswith("none of rdma, ibstat, ibv_devinfo")
    finally:
        server.commands.clear()
        server.commands.update(saved)


# ---------------------------------------------------------------- uname and ls against the real tools (peers)

def test_uname_answers_like_gnu_uname(bench):
    import subprocess

    server = sorted(bench.host_servers.values(), key=lambda s: s.host_name)[0]
    for args in ("", "-s", "-r -n", "-m -s", "-x"):
        peer = subprocess.run(["uname", *args.split()], capture_output=True, text=True)
        mine = _run(server, f"uname {args}")
        assert (mine.exit_status, len(mine.stdout.split()), mine.stderr.splitlines()[:1]) == \
            (peer.returncode, len(peer.stdout.split()), peer.stderr.splitlines()[:1]), args
    fields = _run(server, "uname -a").stdout.split()
    assert fields[:2] == ["Linux", server.host_name] and fields[-1] == "GNU/Linux" and "SMP" in fields


def test_ls_lists_the_sysfs_classes_like_gnu_ls(bench, tmp_path):
    import subprocess

    server = sorted(bench.host_servers.values(), key=lambda s: s.host_name)[0]
    devs = sorted({m.rdma_dev for m in bench.physics.nic_ports(server.host_name)})
    root = tmp_path / "sys" / "class" / "infiniband"
    for dev in devs + ["mlx5_10"]:  # byte order puts mlx5_10 before mlx5_2, as real ls and ibdev2netdev show
        (root / dev).mkdir(parents=True)
    peer = subprocess.run(["ls", str(root)], capture_output=True, text=True, env={"LC_ALL": "C"}, cwd=tmp_path)
    mine = _run(server, "ls /sys/class/infiniband")
    assert mine.stdout.splitlines() == [d for d in peer.stdout.splitlines() if d != "mlx5_10"] == devs
    assert peer.stdout.splitlines().index("mlx5_10") == 2
    # several paths, one missing: GNU ls heads each directory and names the missing one on stderr, status 2
    peer = subprocess.run(["ls", "nope", "sys/class/infiniband"], capture_output=True, text=True,
                          env={"LC_ALL": "C"}, cwd=tmp_path)
    mine = _run(server, "ls nope /sys/class/infiniband")
    assert mine.exit_status == peer.returncode == 2
    assert mine.stderr == peer.stderr and mine.stdout.splitlines()[0] == "/sys/class/infiniband:"
    assert peer.stdout.splitlines()[0] == "sys/class/infiniband:"
