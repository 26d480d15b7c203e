"""Renderers of real tool output from emulated NIC state (formats: shared spec protocols.md §2–§4).

Pure functions of (NicModel-like, NicSnapshot-like, host time) -> text, byte-for-byte in the layout the
real tools print (TABs, column widths, trailing newlines), so that the parsers in devices/parsers read the
emulator exactly as they read a bench. Inputs are duck-typed: anything with the NicModel / NicSnapshot
attributes works (unit tests use tiny stand-ins).
"""
from __future__ import annotations

import json
import math
import time
from dataclasses import dataclass
from typing import Iterable, Protocol, Sequence

from devices.parsers.gpu import canonical_field


class NicModelLike(Protocol):
    netdev: str
    rdma_dev: str
    rdma_port: int
    mac: str
    ifindex: int


class NicSnapshotLike(Protocol):
    rx_los: bool
    rx_lol: bool
    carrier: bool
    phys_state: str
    ib_state: str
    operstate: str
    carrier_up_count: int
    carrier_down_count: int
    link_downed: int
    rx_power_dbm: float
    speed_mbps: int
    admin_up: bool


def _version(text: str) -> tuple[int, ...]:
    try:
        return tuple(int(part) for part in str(text).split("."))
    except ValueError:
        raise ValueError(f"a version such as '6.4' or '2.17.6', got {text!r}") from None


@dataclass(frozen=True)
class ToolVersions:
    """The tool versions an emulated host behaves as (a profile's `tools:` pins them). Each renderer prints the
    layout of its version; the defaults are current releases."""

    ethtool: str = "6.7"  # < 6.4: no Rx/Tx loss of signal/lock lines; < 5.16: no CMIS Module State lines
    iproute2: str = "6.1"  # < 5.5: `rdma link` prints `IDX/PORT: DEV/PORT: ...` and -j ifname `DEV/PORT`
    nccl_tests: str = "2.17.6"  # >= 2.17: version and `Collective test starting` lines, `  #wrong` columns
    perftest: str = "24.07"  # the table unit without --report_gbits: MB/sec (perftest divides by 2^20)
    mft: str = "4.28.0"  # mlxlink; >= 4.20 prints a Tool Information section
    python: str = "3.12.3"  # python3 (Ubuntu 24.04's, as uname's kernel); < 3.7 (RHEL 8's 3.6): the agent refuses

    KNOWN = ("ethtool", "iproute2", "nccl_tests", "perftest", "mft", "python")

    def __post_init__(self):
        for name in self.KNOWN:
            _version(getattr(self, name))

    def at_least(self, tool: str, version: str) -> bool:
        return _version(getattr(self, tool)) >= _version(version)


CURRENT_TOOLS = ToolVersions()

IB_STATE_CODES = {"NOP": 0, "DOWN": 1, "INIT": 2, "ARMED": 3, "ACTIVE": 4, "ACTIVE_DEFER": 5}
IB_PHYS_CODES = {"Sleep": 1, "Polling": 2, "Disabled": 3, "PortConfigurationTraining": 4, "LinkUp": 5,
                 "LinkErrorRecovery": 6, "Phy Test": 7}
RDMA_PHYS_WORDS = {"Sleep": "SLEEP", "Polling": "POLLING", "Disabled": "DISABLED",
                   "PortConfigurationTraining": "ARMED", "LinkUp": "LINK_UP",
                   "LinkErrorRecovery": "LINK_ERROR_RECOVER", "Phy Test": "PHY_TEST"}
# Per-lane signalling of common IB/RoCE speeds: total Gb/s -> (width, speed name).
IB_RATES = {400: (4, "NDR"), 200: (4, "HDR"), 100: (4, "EDR"), 56: (4, "FDR"), 40: (4, "QDR"),
            50: (2, "HDR"), 25: (1, "EDR"), 10: (1, "QDR")}
MTU = 9000


# ---------------------------------------------------------------- sysfs


def sysfs_ib_state(snapshot: NicSnapshotLike) -> str:
    """`/sys/class/infiniband/<dev>/ports/<n>/state`: `"%d: %s\\n"`."""
    return f"{IB_STATE_CODES.get(snapshot.ib_state, 0)}: {snapshot.ib_state}\n"


def sysfs_ib_phys_state(snapshot: NicSnapshotLike) -> str:
    """`/sys/class/infiniband/<dev>/ports/<n>/phys_state`: `"%u: %s\\n"`."""
    return f"{IB_PHYS_CODES.get(snapshot.phys_state, 0)}: {snapshot.phys_state}\n"


def sysfs_ib_rate(speed_mbps: int) -> str:
    """`/sys/class/infiniband/<dev>/ports/<n>/rate`: `"%d%s Gb/sec (%dX%s)\\n"`."""
    gbps = speed_mbps // 1000
    width, name = IB_RATES.get(gbps, (1, ""))
    return f"{gbps} Gb/sec ({width}X{' ' + name if name else ''})\n"


def sysfs_net_file(snapshot: NicSnapshotLike, model: NicModelLike, name: str) -> str | None:
    """Contents of `/sys/class/net/<if>/<name>`, or None when the emulator does not provide that file."""
    values = {
        "carrier": str(int(snapshot.carrier)),
        "operstate": snapshot.operstate,
        "carrier_changes": str(snapshot.carrier_up_count + snapshot.carrier_down_count),
        "carrier_up_count": str(snapshot.carrier_up_count),
        "carrier_down_count": str(snapshot.carrier_down_count),
        "address": model.mac,
        "ifindex": str(model.ifindex),
        "mtu": str(MTU),
        "speed": str(snapshot.speed_mbps if snapshot.carrier else -1),
    }
    value = values.get(name)
    return None if value is None else value + "\n"


def sysfs_ib_port_file(snapshot: NicSnapshotLike, name: str, data_octets: tuple[float, float] = (0.0, 0.0)
                       ) -> str | None:
    """Contents of `/sys/class/infiniband/<dev>/ports/<n>/<name>` (None if not emulated). `data_octets`:
    (sent, received) — `counters/port_xmit_data` and `port_rcv_data` count octets / 4, as the kernel does."""
    if name in ("counters/port_xmit_data", "counters/port_rcv_data"):
        return f"{int(data_octets[name.endswith('rcv_data')]) // 4}\n"
    if name == "state":
        return sysfs_ib_state(snapshot)
    if name == "phys_state":
        return sysfs_ib_phys_state(snapshot)
    if name == "rate":
        return sysfs_ib_rate(snapshot.speed_mbps)
    if name == "link_layer":
        return "Ethernet\n"
    if name == "counters/link_downed":
        return f"{snapshot.link_downed & 0xFF}\n"
    if name == "counters/link_error_recovery":
        return "0\n"
    return None


# ---------------------------------------------------------------- iproute2


def ip_stamp(host_ns: int) -> str:
    """`-ts` prefix: `[%Y-%m-%dT%H:%M:%S.%06ld] ` in local time."""
    seconds, rest = divmod(host_ns, 1_000_000_000)
    return time.strftime("[%Y-%m-%dT%H:%M:%S", time.localtime(seconds)) + f".{rest // 1000:06d}] "


def _link_flags(carrier: bool, admin_up: bool = True) -> str:
    if not admin_up:
        return "<BROADCAST,MULTICAST>"  # set down: no UP, and the kernel prints no NO-CARRIER without it
    return "<BROADCAST,MULTICAST,UP,LOWER_UP>" if carrier else "<NO-CARRIER,BROADCAST,MULTICAST,UP>"


def ip_link_lines(model: NicModelLike, carrier: bool, operstate: str, *, oneline: bool,
                  monitor: bool, host_ns: int | None = None, admin_up: bool = True) -> str:
    """One link as `ip link` (monitor=False) or `ip monitor link` (monitor=True) prints it.

    `ip link` adds `mode DEFAULT … qlen 1000`; the monitor event does not. `-o` joins the address line
    with a backslash; `-ts` (host_ns given) prefixes the event line.
    """
    head = f"{model.ifindex}: {model.netdev}: {_link_flags(carrier, admin_up)} mtu {MTU} qdisc mq state {operstate.upper()}"
    head += " group default" if monitor else " mode DEFAULT group default qlen 1000"
    address = f"    link/ether {model.mac} brd ff:ff:ff:ff:ff:ff"
    prefix = ip_stamp(host_ns) if host_ns is not None else ""
    if oneline:
        return f"{prefix}{head}\\{address}\n"
    return f"{prefix}{head}\n{address}\n"


def ip_o_link(ports: Iterable[tuple[NicModelLike, NicSnapshotLike]]) -> str:
    """`ip -o link`: loopback first, then every NIC port."""
    lines = ["1: lo: <LOOPBACK,UP,LOWER_UP> mtu 65536 qdisc noqueue state UNKNOWN mode DEFAULT group default "
             "qlen 1000\\    link/loopback 00:00:00:00:00:00 brd 00:00:00:00:00:00\n"]
    for model, snapshot in ports:
        lines.append(ip_link_lines(model, snapshot.carrier, snapshot.operstate, oneline=True, monitor=False,
                                   admin_up=snapshot.admin_up))
    return "".join(lines)


def ip_link_json(ports: Iterable[tuple[NicModelLike, NicSnapshotLike]], *, include_loopback: bool = True) -> str:
    """`ip -j link`: iproute2's JSON array on one line (print_linkinfo's keys, in its order)."""
    links = []
    if include_loopback:
        links.append({"ifindex": 1, "ifname": "lo", "flags": ["LOOPBACK", "UP", "LOWER_UP"], "mtu": 65536,
                      "qdisc": "noqueue", "operstate": "UNKNOWN", "linkmode": "DEFAULT", "group": "default",
                      "txqlen": 1000, "link_type": "loopback", "address": "00:00:00:00:00:00",
                      "broadcast": "00:00:00:00:00:00"})
    for m, s in ports:
        flags = _link_flags(s.carrier, s.admin_up).strip("<>").split(",")
        links.append({"ifindex": m.ifindex, "ifname": m.netdev, "flags": flags, "mtu": MTU, "qdisc": "mq",
                      "operstate": s.operstate.upper(), "linkmode": "DEFAULT", "group": "default", "txqlen": 1000,
                      "link_type": "ether", "address": m.mac, "broadcast": "ff:ff:ff:ff:ff:ff"})
    return json.dumps(links, separators=(",", ":")) + "\n"


def rdma_link(ports: Iterable[tuple[NicModelLike, NicSnapshotLike]], *, as_json: bool,
              tools: ToolVersions = CURRENT_TOOLS) -> str:
    """`rdma link` (iproute2 rdma/link.c): every attribute printed as `"name %s "`, so a line ends with a blank;
    InfiniBand ports add subnet_prefix/lid/sm_lid/lmc and have no netdev. iproute2 < 5.5 led with `IDX/PORT: `
    and named the port `DEV/PORT` in JSON too. `-j` prints one JSON array line."""
    new = tools.at_least("iproute2", "5.5")
    records, lines = [], []
    for i, (m, s) in enumerate(ports):
        ib = getattr(m, "link_layer", "Ethernet") == "InfiniBand"
        record = {"ifindex": i, "ifname": m.rdma_dev if new else f"{m.rdma_dev}/{m.rdma_port}",
                  "port": m.rdma_port}
        if ib:
            record.update(subnet_prefix="fe80:0000:0000:0000", lid=getattr(m, "lid", m.ifindex),
                          sm_lid=getattr(m, "sm_lid", 1), lmc=0)
        record.update(state=s.ib_state, physical_state=RDMA_PHYS_WORDS.get(s.phys_state, "UNKNOWN"))
        if not ib:
            record.update(netdev=m.netdev, netdev_index=m.ifindex)
        if not new:  # the old writer put ifindex and port before ifname
            record = {"ifindex": i, "port": m.rdma_port, **{k: v for k, v in record.items() if k not in
                                                            ("ifindex", "port")}}
        records.append(record)
        head = f"link {m.rdma_dev}/{m.rdma_port} " if new else f"{i}/{m.rdma_port}: {m.rdma_dev}/{m.rdma_port}: "
        attrs = "".join(f"{k} {v} " for k, v in record.items() if k not in ("ifindex", "ifname", "port",
                                                                           "netdev_index"))
        lines.append(head + attrs + "\n")
    if as_json:
        return json.dumps(records, separators=(",", ":")) + "\n"
    return "".join(lines)


# ---------------------------------------------------------------- ethtool


def ethtool(model: NicModelLike, snapshot: NicSnapshotLike, *, tools: ToolVersions = CURRENT_TOOLS) -> str:
    """`ethtool <if>`: `Settings for IF:` then TAB-indented fields. ethtool >= 5.6 answers over netlink and prints
    `Auto-negotiation` right after `Duplex`; the ioctl path of older releases prints it after `Transceiver`
    (netdev, 2020-10-27: the same NIC under ethtool 5.4 and 5.8). `Lanes:` exists since 5.12."""
    speed = f"{snapshot.speed_mbps}Mb/s" if snapshot.carrier else "Unknown!"
    duplex = "Full" if snapshot.carrier else "Unknown! (255)"
    lanes = module_lanes(snapshot.speed_mbps)
    modes = f"{snapshot.speed_mbps}baseSR{lanes}/Full"
    netlink = tools.at_least("ethtool", "5.6")
    autoneg = "\tAuto-negotiation: on\n"
    return (f"Settings for {model.netdev}:\n"
            f"\tSupported ports: [ FIBRE ]\n"
            f"\tSupported link modes:   {modes}\n"
            f"\tSupported pause frame use: Symmetric\n"
            f"\tSupports auto-negotiation: Yes\n"
            f"\tSupported FEC modes: RS\n"
            f"\tAdvertised link modes:  {modes}\n"
            f"\tAdvertised pause frame use: Symmetric\n"
            f"\tAdvertised auto-negotiation: Yes\n"
            f"\tAdvertised FEC modes: RS\n"
            f"\tSpeed: {speed}\n"
            + (f"\tLanes: {lanes}\n" if snapshot.carrier and tools.at_least("ethtool", "5.12") else "")
            + f"\tDuplex: {duplex}\n"
            + (autoneg if netlink else "")
            + "\tPort: FIBRE\n"
            "\tPHYAD: 0\n"
            "\tTransceiver: internal\n"
            + ("" if netlink else autoneg)
            + "\tSupports Wake-on: d\n"
            "\tWake-on: d\n"
            f"\tLink detected: {'yes' if snapshot.carrier else 'no'}\n")


# mlx5's private flags as a ConnectX-5/6 under a 6.x kernel lists them (mlx5e_priv_flags, in that order) with the
# driver's defaults: where a driver exposes link-up behaviour it is here, so device identity records them verbatim
MLX5_PRIV_FLAGS = (("rx_cqe_moder", True), ("tx_cqe_moder", False), ("rx_cqe_compress", False),
                   ("rx_striding_rq", True), ("rx_no_csum_complete", False), ("xdp_tx_mpwqe", True),
                   ("skb_tx_mpwqe", True), ("tx_port_ts", False))


def ethtool_priv_flags(netdev: str, flags=MLX5_PRIV_FLAGS) -> str:
    """`ethtool --show-priv-flags IF` (ethtool's `%-*s: %s`, names padded to the longest)."""
    width = max((len(name) for name, _ in flags), default=0)
    return f"Private flags for {netdev}:\n" + "".join(f"{name:<{width}}: {'on' if on else 'off'}\n"
                                                     for name, on in flags)


def _module_line(name: str, value: str) -> str:
    return f"\t{name:<41} : {value}\n"


def _lane_status(flagged: bool, lanes: int) -> str:
    """ethtool's module_show_lane_status: `None` when no lane is flagged, else one Yes/No per lane."""
    return "[ " + ", ".join(["Yes"] * lanes) + " ]" if flagged else "None"


def _mw_dbm(mw: float) -> str:
    """sff-common.c: `%.4f mW / %.2f dBm`, -inf for no light."""
    return f"{mw:.4f} mW / {10 * math.log10(mw):.2f} dBm" if mw > 0 else f"{mw:.4f} mW / -inf dBm"


def module_lanes(speed_mbps: int) -> int:
    """Media lanes of the module the emulated port claims: CMIS (QSFP-DD) with 8 lanes from 400G, else an
    SFF-8636 QSFP28 with 4."""
    return 8 if speed_mbps >= 400_000 else 4


# CMIS 5 Table 8-6 module state codes, named as ethtool's cmis.c prints them
_CMIS_MODULE_STATES = {"ModuleLowPwr": 1, "ModulePwrUp": 2, "ModuleReady": 3, "ModulePwrDn": 4}


def ethtool_module(snapshot: NicSnapshotLike, *, rx_los: bool | None = None, rx_lol: bool | None = None,
                   tools: ToolVersions = CURRENT_TOOLS) -> str:
    """`ethtool -m <if>`: record order, names and units of ethtool's qsfp.c (SFF-8636, 100G SR4) or cmis.c
    (CMIS 4.0 QSFP-DD, 400G SR8), as in the real captures under tests/data/real/ethtool-m/.

    `rx_los` / `rx_lol` override the snapshot with the latched flags (clear-on-read on real modules). ethtool
    < 6.4 prints no loss-of-signal/lock lines at all; < 5.16 no CMIS Module State / LowPwr lines."""
    los = snapshot.rx_los if rx_los is None else rx_los
    lol = snapshot.rx_lol if rx_lol is None else rx_lol
    dbm = snapshot.rx_power_dbm
    rx_mw = 10 ** (dbm / 10) if dbm > -40 else 0.0
    lanes = module_lanes(snapshot.speed_mbps)
    signals = [("Rx loss of signal", _lane_status(los, lanes)), ("Tx loss of signal", "None"),
               ("Rx loss of lock", _lane_status(lol, lanes)), ("Tx loss of lock", "None"),
               ("Tx fault", "None")] if tools.at_least("ethtool", "6.4") else []
    if lanes == 8:
        records = [("Identifier", "0x18 (QSFP-DD Double Density 8X Pluggable Transceiver (INF-8628))"),
                   ("Power class", "6"), ("Max power", "12.00W"), ("Connector", "0x0c (MPO Parallel Optic)"),
                   ("Cable assembly length", "0.00m"), ("Tx CDR bypass control", "No"),
                   ("Rx CDR bypass control", "No"), ("Tx CDR", "Yes"), ("Rx CDR", "Yes"),
                   ("Transmitter technology", "0x00 (850 nm VCSEL)"), ("Laser wavelength", "850.000nm"),
                   ("Laser wavelength tolerance", "15.000nm"), ("Length (SMF)", "0.00km"), ("Length (OM5)", "0m"),
                   ("Length (OM4)", "100m"), ("Length (OM3 50/125um)", "70m"), ("Length (OM2 50/125um)", "0m"),
                   ("Vendor name", "OCS-HIL"), ("Vendor OUI", "00:00:00"), ("Vendor PN", "EMU-400G-SR8"),
                   ("Vendor rev", "A0"), ("Vendor SN", "EMU00000001"), ("Date code", "240101"),
                   ("Revision compliance", "Rev. 4.0")] + signals
        if tools.at_least("ethtool", "5.16"):
            state = getattr(snapshot, "module_state", None) or "ModuleReady"  # None: a module that shows no resets
            records += [("Module State", f"0x{_CMIS_MODULE_STATES[state]:02x} ({state})"),
                        ("LowPwrAllowRequestHW", "Off"), ("LowPwrRequestSW", "Off")]
        rx_name = "Rcvr signal avg optical power (Channel {})"
    else:
        records = [("Identifier", "0x11 (QSFP28)"), ("Extended identifier", "0x8c"),
                   ("Extended identifier description", "2.5W max. Power consumption"),
                   ("Extended identifier description", "CDR present in TX, CDR present in RX"),
                   ("Extended identifier description", "High Power Class (> 3.5 W) not enabled"),
                   ("Power set", "Off"), ("Power override", "On"), ("Connector", "0x0c (MPO Parallel Optic)"),
                   ("Transceiver codes", "0x80 0x00 0x00 0x00 0x00 0x00 0x00 0x00"),
                   ("Transceiver type", "100G Ethernet: 100G Base-SR4 or 25GBase-SR"),
                   ("Encoding", "0x05 (64B/66B)"), ("BR, Nominal", "25500Mbps"), ("Rate identifier", "0x00"),
                   ("Length (SMF,km)", "0km"), ("Length (OM3 50um)", "70m"), ("Length (OM2 50um)", "0m"),
                   ("Length (OM1 62.5um)", "0m"), ("Length (Copper or Active cable)", "50m"),
                   ("Transmitter technology", "0x00 (850 nm VCSEL)"), ("Laser wavelength", "850.000nm"),
                   ("Laser wavelength tolerance", "15.000nm"), ("Vendor name", "OCS-HIL"),
                   ("Vendor OUI", "00:00:00"), ("Vendor PN", "EMU-100G-SR4"), ("Vendor rev", "A0"),
                   ("Vendor SN", "EMU00000001"), ("Date code", "240101"),
                   ("Revision Compliance", "Revision not specified")] + signals
        rx_name = "Rcvr signal avg optical power(Channel {})"
    records += [("Module temperature", "45.00 degrees C / 113.00 degrees F"), ("Module voltage", "3.3000 V")]
    if lanes == 4:
        records.append(("Alarm/warning flags implemented", "No"))
    records += [(f"Laser tx bias current (Channel {i})", "7.500 mA") for i in range(1, lanes + 1)]
    records += [(f"Transmit avg optical power (Channel {i})", _mw_dbm(0.8)) for i in range(1, lanes + 1)]
    records += [(rx_name.format(i), _mw_dbm(rx_mw)) for i in range(1, lanes + 1)]
    return "".join(_module_line(k, v) for k, v in records)


# ---------------------------------------------------------------- mlxlink


def _mlx_record(key: str, value: str) -> str:
    """mlxlink_record.cpp: `key << setw(lineLen - key.length()) << ": "` with lineLen 34, so the colon sits in
    column 33 (`State                           : Active`, as in the real captures)."""
    return f"{key:<32}: {value}\n"


def _mlx_section(title: str, records: Sequence[tuple[str, str]]) -> str:
    """printTitle: a blank line, the title, a dash underline of its length."""
    return "\n" + title + "\n" + "-" * len(title) + "\n" + "".join(_mlx_record(k, v) for k, v in records)


def mlxlink(model: NicModelLike, snapshot: NicSnapshotLike, tools: ToolVersions = CURRENT_TOOLS) -> str:
    """`mlxlink -d <dev>` of a ConnectX Ethernet port: Operational Info, Troubleshooting Info and (MFT >= 4.20)
    Tool Information. State is the port manager FSM word (Disable, Polling, Physical LinkUp, Active); Physical
    state is the Ethernet AN FSM word, which a ConnectX-6 Dx/7 reports as ETH_AN_FSM_ENABLE also while the link
    is up (real capture in tests/data/real/mlxlink/). Speed, Width and FEC read N/A while the link is down."""
    up = snapshot.phys_state == "LinkUp"
    if up and snapshot.ib_state == "ACTIVE":
        state = "Active"
    elif up:
        state = "Physical LinkUp"
    elif snapshot.phys_state == "Disabled":
        state = "Disable"
    else:
        state = "Polling"
    lanes = module_lanes(snapshot.speed_mbps)
    operational = [("State", state), ("Physical state", "ETH_AN_FSM_ENABLE"),
                   ("Speed", f"{snapshot.speed_mbps // 1000}G" if up else "N/A"),
                   ("Width", f"{lanes}x" if up else "N/A"),
                   ("FEC", "Standard RS-FEC (544,514)" if up else "N/A"),
                   ("Loopback Mode", "No Loopback"), ("Auto Negotiation", "ON")]
    # The recommendation text comes from the NIC firmware. For a dark port this is the emulator's own wording:
    # no public capture of a lit-cable, no-light port was found.
    advice = ("0", "N/A", "No issue was observed") if up or not snapshot.rx_los else \
        ("57", "N/A", "signal not detected")
    trouble = list(zip(("Status Opcode", "Group Opcode", "Recommendation"), advice))
    text = _mlx_section("Operational Info", operational) + _mlx_section("Troubleshooting Info", trouble)
    if tools.at_least("mft", "4.20"):
        text += _mlx_section("Tool Information", [("Firmware Version", "28.39.2048"), ("amBER Version", "2.13"),
                                                  ("MFT Version", f"mft {tools.mft}")])
    return text


# ---------------------------------------------------------------- nvidia-smi


@dataclass(frozen=True)
class EmulatedGpu:
    index: int
    name: str = "NVIDIA H100 80GB HBM3"
    memory_total_mib: int = 81559
    memory_used_mib: int = 0
    utilization_gpu: int = 0
    utilization_memory: int = 0
    temperature_c: int = 31
    power_draw_w: float = 69.87
    power_limit_w: float = 700.0
    clocks_sm_mhz: int = 1980
    driver_version: str = "550.54.15"
    pstate: str = "P0"

    @property
    def uuid(self) -> str:
        return f"GPU-{self.index:08x}-0000-4000-8000-{self.index:012x}"

    @property
    def pci_bus_id(self) -> str:
        return f"00000000:{0x18 + 0x10 * self.index:02X}:00.0"


# field -> (unit or None, value getter)
GPU_FIELDS = {
    "index": (None, lambda g, t: str(g.index)),
    "name": (None, lambda g, t: g.name),
    "uuid": (None, lambda g, t: g.uuid),
    "pci.bus_id": (None, lambda g, t: g.pci_bus_id),
    "driver_version": (None, lambda g, t: g.driver_version),
    "pstate": (None, lambda g, t: g.pstate),
    "timestamp": (None, lambda g, t: nvidia_timestamp(t)),
    "temperature.gpu": (None, lambda g, t: str(g.temperature_c)),
    "utilization.gpu": ("%", lambda g, t: str(g.utilization_gpu)),
    "utilization.memory": ("%", lambda g, t: str(g.utilization_memory)),
    "memory.total": ("MiB", lambda g, t: str(g.memory_total_mib)),
    "memory.used": ("MiB", lambda g, t: str(g.memory_used_mib)),
    "memory.free": ("MiB", lambda g, t: str(g.memory_total_mib - g.memory_used_mib)),
    "power.draw": ("W", lambda g, t: f"{g.power_draw_w:.2f}"),
    "power.limit": ("W", lambda g, t: f"{g.power_limit_w:.2f}"),
    "clocks.sm": ("MHz", lambda g, t: str(g.clocks_sm_mhz)),
    "clocks.current.sm": ("MHz", lambda g, t: str(g.clocks_sm_mhz)),
    "fan.speed": ("%", lambda g, t: "[N/A]"),
}


def nvidia_timestamp(host_ns: int) -> str:
    """`YYYY/MM/DD HH:MM:SS.mmm` in local time."""
    seconds, rest = divmod(host_ns, 1_000_000_000)
    return time.strftime("%Y/%m/%d %H:%M:%S", time.localtime(seconds)) + f".{rest // 1_000_000:03d}"


def nvidia_smi_query(gpus: Sequence[EmulatedGpu], fields: Sequence[str], host_ns: int, *,
                     header: bool, units: bool) -> str:
    """`nvidia-smi --query-gpu=FIELDS --format=csv[,noheader][,nounits]`. Unknown fields: KeyError."""
    specs = [GPU_FIELDS[f] for f in fields]
    lines = []
    if header:
        # nvidia-smi prints a field's first name in the header whatever alias was queried (clocks.sm ->
        # clocks.current.sm [MHz]; real captures in tests/data/real/nvidia-smi/)
        lines.append(", ".join(f"{canonical_field(f)} [{u}]" if u else canonical_field(f)
                               for f, (u, _) in zip(fields, specs)))
    for gpu in gpus:
        cells = []
        for unit, get in specs:
            value = get(gpu, host_ns)
            cells.append(f"{value} {unit}" if units and unit and not value.startswith("[") else value)
        lines.append(", ".join(cells))
    return "".join(line + "\n" for line in lines)


# ---------------------------------------------------------------- clocks


def date_ns(host_ns: int) -> str:
    """`date +%s.%N`."""
    seconds, rest = divmod(host_ns, 1_000_000_000)
    return f"{seconds}.{rest:09d}\n"


def chronyc_tracking(offset_s: float, freq_ppm: float, *, ref_id: str = "7F7F0101",
                     ref_name: str = "ntp1.example", stratum: int = 3) -> str:
    """`chronyc tracking` (chrony client.c). `offset_s` > 0: system clock ahead ("fast")."""
    def seconds(x: float) -> str:
        return f"{abs(x):.9f} seconds"

    return (f"Reference ID    : {ref_id} ({ref_name})\n"
            f"Stratum         : {stratum}\n"
            f"Ref time (UTC)  : Thu May 01 10:00:00 2025\n"
            f"System time     : {seconds(offset_s)} {'fast' if offset_s >= 0 else 'slow'} of NTP time\n"
            f"Last offset     : {-offset_s:+.9f} seconds\n"
            f"RMS offset      : {abs(offset_s):.9f} seconds\n"
            f"Frequency       : {abs(freq_ppm):.3f} ppm {'fast' if freq_ppm >= 0 else 'slow'}\n"
            f"Residual freq   : +0.001 ppm\n"
            f"Skew            : 0.020 ppm\n"
            f"Root delay      : 0.000345678 seconds\n"
            f"Root dispersion : 0.000123456 seconds\n"
            f"Update interval : 64.2 seconds\n"
            f"Leap status     : Normal\n")


def chronyc_tracking_csv(offset_s: float, freq_ppm: float, *, ref_time_s: float, ref_id: str = "7F7F0101",
                         ref_name: str = "ntp1.example", stratum: int = 3) -> str:
    """`chronyc -c tracking` (client.c's CSV: raw signed values, System time is the correction: > 0 when slow).
    The same dispersion and delay as `chronyc_tracking`."""
    return (f"{ref_id},{ref_name},{stratum},{ref_time_s:.9f},{-offset_s:.9f},{-offset_s:.9f},{abs(offset_s):.9f},"
            f"{freq_ppm:.3f},0.001,0.020,0.000345678,0.000123456,64.2,Normal\n")


# ---------------------------------------------------------------- benchmark tools (protocols.md §3.2, §3.3)


def nccl_float(value: float, width: int) -> str:
    """nccl-tests' getFloatStr: by the count of integer digits, `%*.2f`, `.1f` or `.0f` (always leaving a
    leading blank), else `%*.1e` (e.g. a time of 1.2e+06 µs in a 7-wide column). A value that rounds up
    into one more digit (9999.996) takes the next, shorter form."""
    digits, bound = 0, 1
    while value >= bound:
        digits, bound = digits + 1, bound * 10
    forms = [".2f", ".1f", ".0f"][max(0, digits - (width - 3)):]
    for form in forms:
        text = f"{value:{width}{form}}"
        if len(text) <= width:
            return text
    return f"{value:{width}.1e}"


@dataclass(frozen=True)
class NcclTiming:
    """One phase (out-of-place or in-place) of an nccl-tests row. `wrong` None prints `N/A`."""

    time_us: float
    algbw_gbs: float
    busbw_gbs: float
    wrong: int | None


@dataclass(frozen=True)
class NcclRank:
    rank: int
    host: str
    device: int
    pid: int
    bus: int
    gpu_name: str


# nccl-tests < 2.17 (real captures in tests/data/real/nccl-tests/): ` #wrong` and one blank before the count.
_NCCL_HEADER_OLD = (
    "#\n"
    "#                                                              out-of-place                       in-place  "
    "        \n"
    "#       size         count      type   redop    root     time   algbw   busbw #wrong     time   algbw   "
    "busbw #wrong\n"
    "#        (B)    (elements)                               (us)  (GB/s)  (GB/s)            (us)  (GB/s)  "
    "(GB/s)       \n")
_NCCL_HEADER = (
    "#\n"
    "#                                                              out-of-place                       in-place  "
    "        \n"
    "#       size         count      type   redop    root     time   algbw   busbw  #wrong     time   algbw   "
    "busbw  #wrong \n"
    "#        (B)    (elements)                               (us)  (GB/s)  (GB/s)             (us)  (GB/s)  "
    "(GB/s)         \n")


def _nccl_phase(t: NcclTiming, new: bool = True) -> str:
    wrong = "N/A" if t.wrong is None else str(t.wrong)
    return (f"  {nccl_float(t.time_us, 7)}  {nccl_float(t.algbw_gbs, 6)}  {nccl_float(t.busbw_gbs, 6)}"
            f"{'  ' if new else ' '}{wrong:>6}")


def nccl_tests_output(collective: str, ranks: Sequence[NcclRank],
                      rows: Sequence[tuple[int, int, str, str, int, NcclTiming, NcclTiming]], *,
                      min_bytes: int, max_bytes: int, step_factor: int, warmup_iters: int, iters: int,
                      check: bool, tools: ToolVersions = CURRENT_TOOLS) -> str:
    """What an nccl-tests binary (e.g. `alltoall_perf`) prints: settings line, devices, the table
    (`%12li  %12li  %8s  %6s  %6i` then per phase `  %7s  %6s  %6s  %6s`), out-of-bounds and average
    bus bandwidth trailer. Rows: (size, count, type, redop, root, out-of-place, in-place)."""
    new = tools.at_least("nccl_tests", "2.17")
    lines = [f"# nccl-tests version {tools.nccl_tests} nccl-headers=22602 nccl-library=22602\n",
             f"# Collective test starting: {collective}\n"] if new else []
    lines += [f"# nThread 1 nGpus 1 minBytes {min_bytes} maxBytes {max_bytes} step: {step_factor}(factor) "
              f"warmup iters: {warmup_iters} iters: {iters} agg iters: 1 validation: {int(check)} graph: 0\n",
              "#\n", "# Using devices\n"]
    for r in ranks:
        bus = f"[0000:{r.bus:02x}:00]" if new else f"[0x{r.bus:02x}]"
        lines.append(f"#  Rank {r.rank:2d} Group  0 Pid {r.pid:6d} on {r.host:>10s} device {r.device:2d} "
                     f"{bus} {r.gpu_name}\n")
    lines.append(_NCCL_HEADER if new else _NCCL_HEADER_OLD)
    busbw = []
    for size, count, dtype, redop, root, out_of_place, in_place in rows:
        lines.append(f"{size:12d}  {count:12d}  {dtype:>8s}  {redop:>6s}  {root:6d}"
                     f"{_nccl_phase(out_of_place, new)}{_nccl_phase(in_place, new)}\n")
        busbw += [out_of_place.busbw_gbs, in_place.busbw_gbs]
    avg = sum(busbw) / len(busbw) if busbw else 0.0
    lines.append(f"# Out of bounds values : 0 OK\n# Avg bus bandwidth    : {avg:g} \n#\n")
    if new:
        lines.append(f"# Collective test concluded: {collective}\n#\n")
    return "".join(lines)


PERFTEST_RULE = "-" * 87


def _c_alt_hex(value: int, width: int) -> str:
    """C's `%#0Nx`: `0x` and zero padding, except that zero prints without the prefix."""
    return f"{value:0{width}x}" if value == 0 else f"{value:#0{width}x}"


@dataclass(frozen=True)
class PerftestEnd:
    """One side of a perftest connection: the `local/remote address:` line and its GID line."""

    lid: int
    qpn: int
    psn: int
    rkey: int
    vaddr: int
    gid: bytes  # 16 bytes


def _perftest_address(side: str, end: PerftestEnd) -> str:
    gid = ":".join(f"{b:02d}" for b in end.gid)
    return (f" {side} address: LID {_c_alt_hex(end.lid, 4)} QPN {_c_alt_hex(end.qpn, 6)} "
            f"PSN {_c_alt_hex(end.psn, 6)} RKey {_c_alt_hex(end.rkey, 8)} VAddr {_c_alt_hex(end.vaddr, 16)}\n"
            f" GID: {gid}\n")


def ib_write_bw_output(device: str, local: PerftestEnd, remote: PerftestEnd,
                       rows: Sequence[tuple[int, int, float, float, float]], *, report_gbits: bool,
                       qps: int = 1, mtu: int = 4096, gid_index: int = 3, link_type: str = "Ethernet",
                       tools: ToolVersions = CURRENT_TOOLS) -> str:
    """perftest `ib_write_bw` client output: settings block, both addresses, the result table with
    perftest_parameters.h's REPORT_FMT. Rows: (bytes, iterations, BW peak, BW average, MsgRate) with bandwidths
    already in the printed unit. perftest 24.07 (April 2024) relabelled MB/sec as MiB/sec (the arithmetic was
    always 2^20) and widened the gap before MsgRate from 3 to 5 blanks."""
    new = tools.at_least("perftest", "24.07")
    unit = "Gb/sec" if report_gbits else ("MiB/sec" if new else "MB/sec")
    row_fmt = " %-7lu    %-10lu       %-7.2lf            %-7.2lf\t\t" + ("     " if new else "   ") + "%-7.6lf\n"
    head = (f"{PERFTEST_RULE}\n"
            f"                    RDMA_Write BW Test\n"
            f" Dual-port       : OFF\t\tDevice         : {device}\n"
            f" Number of qps   : {qps}\t\tTransport type : IB\n"
            f" Connection type : RC\t\tUsing SRQ      : OFF\n"
            f" PCIe relax order: ON\n"
            f" ibv_wr* API     : ON\n"
            f" TX depth        : 128\n"
            f" CQ Moderation   : 100\n"
            f" Mtu             : {mtu}[B]\n"
            f" Link type       : {link_type}\n"
            f" GID index       : {gid_index}\n"
            f" Max inline data : 0[B]\n"
            f" rdma_cm QPs\t : OFF\n"
            f" Data ex. method : Ethernet\n"
            f"{PERFTEST_RULE}\n")
    table = [f"{PERFTEST_RULE}\n",
             f" #bytes     #iterations    BW peak[{unit}]    BW average[{unit}]   MsgRate[Mpps]\n"]
    for size, iters, peak, average, rate in rows:
        table.append(row_fmt % (size, iters, peak, average, rate))
    table.append(f"{PERFTEST_RULE}\n")
    return head + _perftest_address("local", local) + _perftest_address("remote", remote) + "".join(table)


_TOPO_LEGEND = """Legend:

  X    = Self
  SYS  = Connection traversing PCIe as well as the SMP interconnect between NUMA nodes (e.g., QPI/UPI)
  NODE = Connection traversing PCIe as well as the interconnect between PCIe Host Bridges within a NUMA node
  PHB  = Connection traversing PCIe as well as a PCIe Host Bridge (typically the CPU)
  PXB  = Connection traversing multiple PCIe bridges (without traversing the PCIe Host Bridge)
  PIX  = Connection traversing at most a single PCIe bridge
  NV#  = Connection traversing a bonded set of # NVLinks
"""


def nvidia_smi_topo(gpus: Sequence[EmulatedGpu], rdma_devs: Sequence[str], *, nvlinks: int = 18,
                    cores_per_numa: int = 48) -> str:
    """`nvidia-smi topo -m` as the driver prints it (tests/data/real/nvidia-smi-topo/): tab-separated, ` X `
    on the diagonal, NIC rows padded with empty affinity cells, then the legend and the NIC legend. The
    board: two NUMA nodes, each GPU behind a PCIe switch shared with NIC `index * len(nics) // len(gpus)`."""
    n_gpu, n_nic = len(gpus), len(rdma_devs)
    half = max(1, (n_gpu + 1) // 2)
    numa_gpu = [g.index // half for g in gpus]
    nic_gpu = {j: [i for i, g in enumerate(gpus) if g.index * n_nic // max(n_gpu, 1) == j] for j in range(n_nic)}
    numa_nic = [numa_gpu[nic_gpu[j][0]] if nic_gpu[j] else 0 for j in range(n_nic)]
    names = [f"GPU{g.index}" for g in gpus] + [f"NIC{j}" for j in range(n_nic)]

    def link(a: int, b: int) -> str:
        if a == b:
            return " X "
        if a < n_gpu and b < n_gpu:
            return f"NV{nvlinks}"
        numa = (numa_gpu + numa_nic)
        gpu_of = lambda k: [k] if k < n_gpu else nic_gpu[k - n_gpu]  # noqa: E731
        if set(gpu_of(a)) & set(gpu_of(b)):
            return "PIX"
        return "NODE" if numa[a] == numa[b] else "SYS"

    def affinity(numa: int) -> str:
        c = cores_per_numa
        return f"{numa * c}-{numa * c + c - 1},{(numa + 2) * c}-{(numa + 2) * c + c - 1}"

    lines = ["\t" + "\t".join(names + ["CPU Affinity", "NUMA Affinity"])]
    for a, name in enumerate(names):
        cells = [link(a, b) for b in range(len(names))]
        tail = [affinity(numa_gpu[a]), str(numa_gpu[a])] if a < n_gpu else ["", ""]
        lines.append("\t".join([name] + cells + tail))
    text = "\n".join(lines) + "\n\n" + _TOPO_LEGEND
    if n_nic:
        text += "\nNIC Legend:\n\n" + "".join(f"  NIC{j}: {dev}\n" for j, dev in enumerate(rdma_devs))
    return text + "\n"


# ---------------------------------------------------------------- RDMA port tools (ibstat, ibv_devinfo, ibdev2netdev)
# Layouts held to real captures in tests/data/real/{ibstat,ibv-devinfo,ibdev2netdev}/ by
# tests/test_format_conformance.py.

IBSTAT_STATES = {"DOWN": "Down", "INIT": "Initializing", "ARMED": "Armed", "ACTIVE": "Active"}  # ibstat.c words
IBSTAT_PHYS = {"Phy Test": "PhyTest"}  # the other sysfs words are ibstat's as they are
CA_TYPE, PART_ID, FW_VER, BOARD_ID = "MT4129", 4129, "28.39.1002", "MT_0000000838"  # ConnectX-7


def _guids(mac: str) -> tuple[str, str]:
    """(node GUID, port GUID) as mlx5 derives them from the port's MAC: the node GUID inserts 03:00, the RoCE
    port GUID is the EUI-64 (ff:fe inserted, universal/local bit flipped) — the pattern of the real captures."""
    b = [int(x, 16) for x in mac.split(":")]
    node = b[:3] + [0x03, 0x00] + b[3:]
    port = [b[0] ^ 0x02] + b[1:3] + [0xFF, 0xFE] + b[3:]
    return "".join(f"{x:02x}" for x in node), "".join(f"{x:02x}" for x in port)


def _by_device(ports: Iterable[tuple[NicModelLike, NicSnapshotLike]]) -> dict[str, list]:
    devices: dict[str, list] = {}
    for m, s in sorted(ports, key=lambda p: (p[0].rdma_dev, p[0].rdma_port)):
        devices.setdefault(m.rdma_dev, []).append((m, s))
    return devices


def _rate_gbps(model: NicModelLike, snapshot: NicSnapshotLike) -> int:
    """The port rate ibstat and ibstatus print: a RoCE port that is not Active reads 40 (mlx5 reports 4X QDR
    without a link; every down port of the real ibstat captures does)."""
    ib = getattr(model, "link_layer", "Ethernet") == "InfiniBand"
    return snapshot.speed_mbps // 1000 if ib or snapshot.ib_state == "ACTIVE" else 40


def ibstat(ports: Iterable[tuple[NicModelLike, NicSnapshotLike]]) -> str:
    """`ibstat`: one `CA 'dev'` block per device, TAB-indented `Key: value` lines, a `Port N:` block per port."""
    out = []
    for dev, dev_ports in _by_device(ports).items():
        node, _ = _guids(dev_ports[0][0].mac)
        out.append(f"CA '{dev}'\n\tCA type: {CA_TYPE}\n\tNumber of ports: {len(dev_ports)}\n"
                   f"\tFirmware version: {FW_VER}\n\tHardware version: 0\n\tNode GUID: 0x{node}\n"
                   f"\tSystem image GUID: 0x{node}\n")
        for m, s in dev_ports:
            ib = getattr(m, "link_layer", "Ethernet") == "InfiniBand"
            _, port_guid = _guids(m.mac)
            out.append(f"\tPort {m.rdma_port}:\n\t\tState: {IBSTAT_STATES.get(s.ib_state, s.ib_state.title())}\n"
                       f"\t\tPhysical state: {IBSTAT_PHYS.get(s.phys_state, s.phys_state)}\n"
                       f"\t\tRate: {_rate_gbps(m, s)}\n"
                       f"\t\tBase lid: {getattr(m, 'lid', m.ifindex) if ib else 0}\n\t\tLMC: 0\n"
                       f"\t\tSM lid: {getattr(m, 'sm_lid', 1) if ib else 0}\n"
                       f"\t\tCapability mask: {'0xa651ec48' if ib else '0x00010000'}\n"
                       f"\t\tPort GUID: 0x{port_guid}\n\t\tLink layer: {'InfiniBand' if ib else 'Ethernet'}\n")
    return "".join(out)


def _colon(guid_hex: str) -> str:
    return ":".join(guid_hex[i:i + 4] for i in range(0, 16, 4))


def ibv_devinfo(ports: Iterable[tuple[NicModelLike, NicSnapshotLike]]) -> str:
    """`ibv_devinfo` (rdma-core devinfo.c, no -v): device fields TAB-padded to column 40, `port:` at 16, port
    fields to column 48; a blank line after each device."""
    out = []
    for dev, dev_ports in _by_device(ports).items():
        node, _ = _guids(dev_ports[0][0].mac)
        out.append(f"hca_id:\t{dev}\n\ttransport:\t\t\tInfiniBand (0)\n\tfw_ver:\t\t\t\t{FW_VER}\n"
                   f"\tnode_guid:\t\t\t{_colon(node)}\n\tsys_image_guid:\t\t\t{_colon(node)}\n"
                   f"\tvendor_id:\t\t\t0x02c9\n\tvendor_part_id:\t\t\t{PART_ID}\n\thw_ver:\t\t\t\t0x0\n"
                   f"\tboard_id:\t\t\t{BOARD_ID}\n\tphys_port_cnt:\t\t\t{len(dev_ports)}\n")
        for m, s in dev_ports:
            ib = getattr(m, "link_layer", "Ethernet") == "InfiniBand"
            state = f"PORT_{s.ib_state} ({IB_STATE_CODES.get(s.ib_state, 0)})"
            out.append(f"\t\tport:\t{m.rdma_port}\n\t\t\tstate:\t\t\t{state}\n\t\t\tmax_mtu:\t\t4096 (5)\n"
                       f"\t\t\tactive_mtu:\t\t{'4096 (5)' if ib else '1024 (3)'}\n"
                       f"\t\t\tsm_lid:\t\t\t{getattr(m, 'sm_lid', 1) if ib else 0}\n"
                       f"\t\t\tport_lid:\t\t{getattr(m, 'lid', m.ifindex) if ib else 0}\n"
                       f"\t\t\tport_lmc:\t\t0x00\n\t\t\tlink_layer:\t\t{'InfiniBand' if ib else 'Ethernet'}\n\n")
    return "".join(out)


def ibstatus(ports: Iterable[tuple[NicModelLike, NicSnapshotLike]]) -> str:
    """`ibstatus` (a script over sysfs): a head line per port, `key:<TABs> value` with one blank before the value,
    then a blank line. A RoCE port's default GID reads `unknown`, its lids 0x0, as in the real capture."""
    out = []
    for dev_ports in _by_device(ports).values():
        for m, s in dev_ports:
            ib = getattr(m, "link_layer", "Ethernet") == "InfiniBand"
            _, port_guid = _guids(m.mac)
            gid = "fe80:0000:0000:0000:" + _colon(port_guid) if ib else "unknown"
            lid, sm_lid = (getattr(m, "lid", m.ifindex), getattr(m, "sm_lid", 1)) if ib else (0, 0)
            out.append(f"Infiniband device '{m.rdma_dev}' port {m.rdma_port} status:\n\tdefault gid:\t {gid}\n"
                       f"\tbase lid:\t {lid:#x}\n\tsm lid:\t\t {sm_lid:#x}\n\tstate:\t\t {sysfs_ib_state(s)}"
                       f"\tphys state:\t {sysfs_ib_phys_state(s)}\trate:\t\t {sysfs_ib_rate(_rate_gbps(m, s) * 1000)}"
                       f"\tlink_layer:\t {'InfiniBand' if ib else 'Ethernet'}\n\n")
    return "".join(out)


def ibdev2netdev(ports: Iterable[tuple[NicModelLike, NicSnapshotLike]]) -> str:
    """`ibdev2netdev`: `dev port N ==> netdev (Up|Down)`, Up when the netdev's operstate is up."""
    return "".join(f"{m.rdma_dev} port {m.rdma_port} ==> {m.netdev} ({'Up' if s.operstate == 'up' else 'Down'})\n"
                   for dev_ports in _by_device(ports).values() for m, s in dev_ports)


# ---------------------------------------------------------------- the default nvidia-smi table

_SMI_RULE = "+-----------------------------------------+------------------------+----------------------+\n"
_SMI_WIDE = "+-----------------------------------------------------------------------------------------+\n"


def nvidia_smi_table(gpus: Sequence[EmulatedGpu], host_ns: int) -> str:
    """The default `nvidia-smi` output in the 89-column layout of drivers 530-580 (real capture of 550.90.07 in
    tests/data/real/nvidia-smi-table/): date line, header, three lines per GPU, then the process table."""
    import time as _time

    driver = gpus[0].driver_version if gpus else "550.54.15"
    lines = [_time.strftime("%a %b %e %H:%M:%S %Y", _time.localtime(host_ns // 1_000_000_000)) + "       \n",
             _SMI_WIDE,
             f"| NVIDIA-SMI {driver:<22} Driver Version: {driver:<14} CUDA Version: {'12.4':<9}|\n",
             "|-----------------------------------------+------------------------+----------------------+\n",
             "| GPU  Name                 Persistence-M | Bus-Id          Disp.A | Volatile Uncorr. ECC |\n",
             "| Fan  Temp   Perf          Pwr:Usage/Cap |           Memory-Usage | GPU-Util  Compute M. |\n",
             "|                                         |                        |               MIG M. |\n",
             "|=========================================+========================+======================|\n"]
    for g in gpus:
        lines += [f"| {g.index:>3}  {g.name:<29}{'On':>4}  |   {g.pci_bus_id} {'Off':>3} | {'0':>20} |\n",
                  f"| {'N/A':>3}{str(g.temperature_c) + 'C':>6}{g.pstate:>6}{str(round(g.power_draw_w)) + 'W':>16} / "
                  f"{str(round(g.power_limit_w)) + 'W':>5} |{str(g.memory_used_mib) + 'MiB':>11} / "
                  f"{str(g.memory_total_mib) + 'MiB':>9} |{str(g.utilization_gpu) + '%':>8}{'Default':>13} |\n",
                  f"|{'':41}|{'':24}|{'Disabled':>21} |\n", _SMI_RULE]
    lines += ["\n", _SMI_WIDE,
              "| Processes:                                                                              |\n",
              "|  GPU   GI   CI        PID   Type   Process name                              GPU Memory |\n",
              "|        ID   ID                                                               Usage      |\n",
              "|=========================================================================================|\n",
              "|  No running processes found                                                             |\n",
              _SMI_WIDE]
    return "".join(lines)


UNAME_OPTIONS = "snrvmpio"  # `uname -a` prints these fields in this order, whatever order they were asked in


def uname_fields(host: str, *, release: str = "6.8.0-45-generic",
                 version: str = "#45-Ubuntu SMP PREEMPT_DYNAMIC Fri Aug 30 12:02:04 UTC 2024") -> tuple[str, ...]:
    """`uname` fields: kernel name, node name, release, version, machine, processor, hardware platform, OS."""
    return ("Linux", host, release, version, "x86_64", "x86_64", "x86_64", "GNU/Linux")
