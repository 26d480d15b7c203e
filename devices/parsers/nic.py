"""Parsers of NIC port state as Linux tools print it (formats: shared spec protocols.md §2).

sysfs (`/sys/class/infiniband/<dev>/ports/<n>/…`, `/sys/class/net/<if>/…`), `ip -ts monitor link`,
`ip -o link`, `rdma link` (text and `-j`), `ethtool <if>`, `ethtool -m` lane flags, `mlxlink -d`.
"""
from __future__ import annotations

import calendar
import json
import math
import re
import time
from dataclasses import dataclass
from datetime import datetime

from devices.parsers.common import ParseError, single_line

# Kernel drivers/infiniband/core/sysfs.c word tables (index = numeric code).
IB_STATES = ("NOP", "DOWN", "INIT", "ARMED", "ACTIVE", "ACTIVE_DEFER")
IB_PHYS_STATES = ("<unknown>", "Sleep", "Polling", "Disabled", "PortConfigurationTraining", "LinkUp",
                  "LinkErrorRecovery", "Phy Test")
OPERSTATES = ("unknown", "notpresent", "down", "lowerlayerdown", "testing", "dormant", "up")
# iproute2 rdma/link.c physical_state words; index 4 prints ARMED (an upstream quirk).
RDMA_PHYS_STATES = ("NOP", "SLEEP", "POLLING", "DISABLED", "ARMED", "LINK_UP", "LINK_ERROR_RECOVER",
                    "PHY_TEST")


# ---------------------------------------------------------------- sysfs


@dataclass(frozen=True)
class IbPortState:
    """`/sys/class/infiniband/<dev>/ports/<n>/state` or `phys_state`: `4: ACTIVE`, `5: LinkUp`."""

    code: int
    name: str


@dataclass(frozen=True)
class IbRate:
    """`/sys/class/infiniband/<dev>/ports/<n>/rate`: `400 Gb/sec (4X NDR)`."""

    gbps: float
    width: int
    speed: str  # SDR, QDR, EDR, HDR, NDR, ... ('' when the kernel prints none)

    @property
    def mbps(self) -> int:
        return round(self.gbps * 1000)


_CODE_WORD = re.compile(r"(\d+): (.+)")


def _code_word(text: str, what: str, words: tuple[str, ...]) -> IbPortState:
    line = single_line(text, what)
    m = _CODE_WORD.fullmatch(line)
    if not m:
        raise ParseError(f"'<code>: <word>' ({what})", text)
    code, name = int(m.group(1)), m.group(2)
    known = words[code] if code < len(words) else None
    if known is not None and known != name:
        raise ParseError(f"{what} code {code} to read {known!r}", text)
    if known is None and name != "UNKNOWN":
        raise ParseError(f"{what} word for code {code}", text)
    return IbPortState(code, name)


def parse_ib_state(text: str) -> IbPortState:
    """`4: ACTIVE` -> IbPortState(4, 'ACTIVE')."""
    return _code_word(text, "IB port state", IB_STATES)


def parse_ib_phys_state(text: str) -> IbPortState:
    """`5: LinkUp` -> IbPortState(5, 'LinkUp')."""
    return _code_word(text, "IB port phys_state", IB_PHYS_STATES)


_RATE = re.compile(r"(\d+(?:\.\d+)?) Gb/sec \((\d+)X ?([A-Z0-9]*)\)")


def parse_ib_rate(text: str) -> IbRate:
    """`400 Gb/sec (4X NDR)` -> IbRate(400.0, 4, 'NDR')."""
    line = single_line(text, "IB port rate")
    m = _RATE.fullmatch(line)
    if not m:
        raise ParseError("'<n> Gb/sec (<w>X <speed>)'", text)
    return IbRate(float(m.group(1)), int(m.group(2)), m.group(3))


def parse_sysfs_int(text: str) -> int:
    """A `%d\\n` sysfs counter such as carrier_changes, carrier_up_count, counters/link_downed."""
    line = single_line(text, "an integer sysfs value")
    try:
        return int(line)
    except ValueError:
        raise ParseError("a decimal integer", text) from None


def parse_carrier(text: str) -> bool:
    """`/sys/class/net/<if>/carrier`: `1` -> True, `0` -> False."""
    line = single_line(text, "carrier")
    if line not in ("0", "1"):
        raise ParseError("carrier '0' or '1'", text)
    return line == "1"


def parse_operstate(text: str) -> str:
    """`/sys/class/net/<if>/operstate`: one of OPERSTATES."""
    line = single_line(text, "operstate")
    if line not in OPERSTATES:
        raise ParseError(f"operstate in {OPERSTATES}", text)
    return line


# ---------------------------------------------------------------- iproute2 link lines


@dataclass(frozen=True)
class IpLink:
    """One link as `ip link` / `ip monitor link` prints it."""

    ifindex: int
    ifname: str
    flags: frozenset[str]
    mtu: int | None
    operstate: str | None  # upper case as printed: UP, DOWN, LOWERLAYERDOWN, UNKNOWN, ...; None in a
    # flag-only `ip monitor` event (`3: wlp0s20f3: <BROADCAST,MULTICAST,UP>` with no mtu/state)
    mac: str | None
    peer: str | None = None  # the part after '@' (e.g. 'if2' of a veth)
    deleted: bool = False
    stamp: datetime | None = None  # `-ts` prefix: the host's *local* time, µs resolution, naive

    @property
    def admin_up(self) -> bool:
        """Administratively up (`ip link set dev X up`): the `UP` flag."""
        return "UP" in self.flags

    @property
    def carrier(self) -> bool:
        """Carrier as the flags show it (`LOWER_UP` present, `NO-CARRIER` absent)."""
        return "LOWER_UP" in self.flags and "NO-CARRIER" not in self.flags

    def stamp_ns(self, utc_offset_s: int | None = None) -> int:
        """The `-ts` stamp as Unix ns. `utc_offset_s` is the host's offset from UTC (seconds east);
        None means the local time zone of this process (right for emulated hosts on this machine)."""
        if self.stamp is None:
            raise ParseError("an event with a -ts timestamp", self.ifname)
        tt = self.stamp.timetuple()
        if utc_offset_s is None:
            seconds = int(time.mktime(tt[:8] + (-1,)))
        else:
            seconds = calendar.timegm(tt) - utc_offset_s
        return seconds * 1_000_000_000 + self.stamp.microsecond * 1000


_TS = re.compile(r"\[(\d{4}-\d{2}-\d{2}T\d{2}:\d{2}:\d{2})\.(\d{6})\] ")
_LINK_HEAD = re.compile(r"(Deleted )?(\d+): ([^:@\s]+)(?:@([^:\s]+))?: <([^>]*)>(.*)")
_MAC_ADDRESS = r"[0-9a-f]{2}(?::[0-9a-f]{2})+"
_MAC = re.compile(rf"link/\S+ ({_MAC_ADDRESS})")


def _parse_link_text(text: str, what: str, stamp: datetime | None, *, flags_only_ok: bool = False) -> IpLink:
    m = _LINK_HEAD.match(text)
    if not m:
        raise ParseError(f"{what}: 'N: IFNAME: <FLAGS> ...'", text)
    deleted, ifindex, ifname, peer, flags, rest = m.groups()
    words = rest.split()
    attrs: dict[str, str] = {}
    for i, word in enumerate(words[:-1]):
        if word in ("mtu", "state", "qdisc"):
            attrs[word] = words[i + 1]
    # The kernel also notifies flag changes alone (no IFLA_MTU/IFLA_OPERSTATE): iproute2 then prints the
    # head and a bare `link/ether` (real capture: tests/data/real/ip-monitor/).
    flags_only = flags_only_ok and words[:1] in ([], ["link/ether"])
    if "state" not in attrs and not flags_only:
        raise ParseError(f"{what} with 'state <OPERSTATE>'", text)
    try:
        mtu = int(attrs["mtu"]) if "mtu" in attrs else None
    except ValueError:
        raise ParseError(f"{what} with an integer mtu", text) from None
    mac = _MAC.search(rest)
    return IpLink(ifindex=int(ifindex), ifname=ifname, flags=frozenset(f for f in flags.split(",") if f),
                  mtu=mtu, operstate=attrs.get("state"), mac=mac.group(1) if mac else None, peer=peer,
                  deleted=bool(deleted), stamp=stamp)


def parse_ip_link(text: str) -> list[IpLink]:
    """`ip link [show]` in either form: one line per link (`-o`) or a head line followed by indented (or, as
    pasted, unindented `link/...`) continuation lines, which are joined to their head."""
    joined: list[str] = []
    for line in text.splitlines():
        if not line.strip():
            continue
        if joined and not _LINK_HEAD.match(line.lstrip()):
            joined[-1] += " " + line.strip()
        else:
            joined.append(line)
    return parse_ip_link_oneline("\n".join(joined))


def parse_ip_link_oneline(text: str) -> list[IpLink]:
    """`ip -o link [show]` output: one link per line (continuations joined with a backslash)."""
    links = []
    for line in text.splitlines():
        if line.strip():
            links.append(_parse_link_text(line.replace("\\", " "), "an 'ip -o link' line", None))
    return links


_LABEL = re.compile(r"\[(?:([A-Z]+)|nsid \d+|nsid current)\] ?")
# Events of other families that `ip monitor all` / `all-nsid` print unlabelled: a neighbour or route
# (`10.16.0.112 dev eth0 lladdr ... REACHABLE`, `default via ... dev ...`) or an address (`2: eth0    inet ...`).
_OTHER_EVENT = re.compile(r"(?:Deleted |Miss )?(?:\S+ )+dev \S+|(?:Deleted )?\d+: \S+\s+(?:inet6?|link/\S+) ")


def parse_ip_monitor_line(line: str) -> IpLink | None:
    """One line of `ip [-ts] [-o] monitor link` or of `ip monitor all` / `label` / `all-nsid`. Returns the link
    event; None for a line that is no link event: a continuation line (`    link/ether …`) of the multi-line
    form (it carries only the address) and an event of another family (`[NEIGH]`, `[ADDR]`, `[ROUTE]`, ... or,
    unlabelled, a neighbour, route or address line)."""
    body = line.rstrip("\n")
    stamp = None
    m = _TS.match(body)
    if m:
        stamp = datetime.strptime(m.group(1), "%Y-%m-%dT%H:%M:%S").replace(microsecond=int(m.group(2)))
        body = body[m.end():]
    while (label := _LABEL.match(body)) is not None:
        if label.group(1) not in (None, "LINK"):
            return None  # iproute2 labels every family it prints: [NEIGH], [ADDR], [ROUTE], [RULE], [NETCONF], ...
        body = body[label.end():]
    if body.startswith("["):
        raise ParseError("'[YYYY-MM-DDTHH:MM:SS.uuuuuu] ' timestamp or a '[FAMILY]' label", line)
    if body.startswith((" ", "\t")) and "link/" in body:
        return None
    if not _LINK_HEAD.match(body) and _OTHER_EVENT.match(body):
        return None
    return _parse_link_text(body.replace("\\", " "), "an 'ip monitor link' event", stamp, flags_only_ok=True)


def _json_array(text: str, command: str) -> list:
    """The JSON array a `-j` command prints."""
    try:
        records = json.loads(text)
    except json.JSONDecodeError:
        raise ParseError(f"a JSON array from '{command}'", text) from None
    if not isinstance(records, list):
        raise ParseError(f"a JSON array from '{command}'", text)
    return records


def _json_peer(record: dict) -> str | None:
    """The text form's `@PEER`: iproute2 prints `"link": NAME`, `"link": null` (text `@NONE`) or, for a peer in
    another namespace, `"link_index": N` (text `@ifN`)."""
    if "link" in record:
        return "NONE" if record["link"] is None else record["link"]
    return f"if{record['link_index']}" if "link_index" in record else None


def parse_ip_link_json(text: str) -> list[IpLink]:
    """`ip -j link [show]` / `ip -j addr`: the JSON array iproute2 prints (ifindex, ifname, flags, mtu, operstate,
    address), read to the same values as the text form: a tunnel's IPv4 `address` is not a MAC."""
    links = []
    for record in _json_array(text, "ip -j link"):
        try:
            address = record.get("address")
            links.append(IpLink(ifindex=int(record["ifindex"]), ifname=record["ifname"],
                                flags=frozenset(record["flags"]), mtu=record.get("mtu"),
                                operstate=record["operstate"],
                                mac=address if address and re.fullmatch(_MAC_ADDRESS, address) else None,
                                peer=_json_peer(record)))
        except (KeyError, TypeError, ValueError):
            raise ParseError("objects with ifindex, ifname, flags, operstate", json.dumps(record)) from None
    return links


# ---------------------------------------------------------------- rdma link


@dataclass(frozen=True)
class RdmaLink:
    """One port of `rdma link`: `link mlx5_0/1 state ACTIVE physical_state LINK_UP netdev ens1f0np0`."""

    dev: str
    port: int
    state: str
    physical_state: str  # rdma's word (LINK_UP, POLLING, ARMED, ...)
    netdev: str | None
    lid: int | None = None  # InfiniBand ports print subnet_prefix, lid, sm_lid, lmc; RoCE ports do not
    sm_lid: int | None = None
    subnet_prefix: str | None = None

    @property
    def infiniband(self) -> bool:
        return self.lid is not None

    @property
    def phys_state(self) -> str:
        """The sysfs word for physical_state (LinkUp, Polling, ...), for comparing across tools."""
        try:
            return IB_PHYS_STATES[RDMA_PHYS_STATES.index(self.physical_state)]
        except ValueError:
            return self.physical_state


_OLD_RDMA_HEAD = re.compile(r"\d+/\d+:")


def _int_or_none(value: str | None) -> int | None:
    return int(value) if value is not None and value.isdigit() else None


def parse_rdma_link(text: str) -> list[RdmaLink]:
    """`rdma link [show]` text output: `link DEV/PORT key value ...` (iproute2 >= 5.5) or the older
    `IDX/PORT: DEV/PORT: key value ...`; InfiniBand ports add subnet_prefix, lid, sm_lid, lmc."""
    links = []
    for line in text.splitlines():
        if not line.strip():
            continue
        words = line.split()
        if len(words) >= 2 and _OLD_RDMA_HEAD.fullmatch(words[0]) and words[1].endswith(":"):
            words = ["link", words[1][:-1]] + words[2:]
        if len(words) < 2 or words[0] != "link" or "/" not in words[1]:
            raise ParseError("'link DEV/PORT key value ...' or 'IDX/PORT: DEV/PORT: key value ...'", line)
        dev, _, port = words[1].partition("/")
        attrs = dict(zip(words[2::2], words[3::2]))
        if "state" not in attrs or "physical_state" not in attrs or not port.isdigit():
            raise ParseError("'link DEV/PORT ... state S physical_state P'", line)
        links.append(RdmaLink(dev, int(port), attrs["state"], attrs["physical_state"], attrs.get("netdev"),
                              _int_or_none(attrs.get("lid")), _int_or_none(attrs.get("sm_lid")),
                              attrs.get("subnet_prefix")))
    return links


def parse_rdma_link_json(text: str) -> list[RdmaLink]:
    """`rdma -j link` output: a JSON array of objects with ifname, port, state, physical_state, netdev
    (iproute2 < 5.5 wrote ifname as `DEV/PORT`)."""
    links = []
    for record in _json_array(text, "rdma -j link"):
        try:
            links.append(RdmaLink(record["ifname"].partition("/")[0], int(record["port"]), record["state"],
                                  record["physical_state"], record.get("netdev"), record.get("lid"),
                                  record.get("sm_lid"), record.get("subnet_prefix")))
        except (KeyError, TypeError, ValueError):
            raise ParseError("objects with ifname, port, state, physical_state", json.dumps(record)) from None
    return links


# ---------------------------------------------------------------- ethtool


@dataclass(frozen=True)
class EthtoolSettings:
    """`ethtool <if>`: the fields the harness reads."""

    ifname: str
    speed_mbps: int | None  # None for `Unknown!`
    duplex: str | None
    autoneg: bool | None
    link_detected: bool


def _tab_fields(lines: list[str]) -> dict[str, str]:
    fields: dict[str, str] = {}
    for line in lines:
        key, sep, value = line.strip().partition(":")
        if sep:
            fields.setdefault(key.strip(), value.strip())
    return fields


def parse_ethtool(text: str) -> EthtoolSettings:
    """`Settings for IF:` followed by TAB-indented `Key: value` lines."""
    lines = text.splitlines()
    head = re.fullmatch(r"Settings for (\S+):", lines[0].strip()) if lines else None
    if not head:
        raise ParseError("'Settings for IF:' (ethtool)", text)
    fields = _tab_fields(lines[1:])
    if "Link detected" not in fields or fields["Link detected"] not in ("yes", "no"):
        raise ParseError("'Link detected: yes|no' (ethtool)", text)
    speed = fields.get("Speed")
    speed_mbps = None
    if speed is not None and not speed.startswith("Unknown"):
        m = re.fullmatch(r"(\d+)Mb/s", speed)
        if not m:
            raise ParseError("'Speed: <n>Mb/s' or 'Speed: Unknown!' (ethtool)", speed)
        speed_mbps = int(m.group(1))
    duplex = fields.get("Duplex")
    if duplex is not None and duplex.startswith("Unknown"):
        duplex = None
    autoneg = {"on": True, "off": False}.get(fields.get("Auto-negotiation", ""))
    return EthtoolSettings(head.group(1), speed_mbps, duplex, autoneg, fields["Link detected"] == "yes")


def parse_ethtool_priv_flags(text: str) -> dict[str, bool]:
    """`ethtool --show-priv-flags IF`: `Private flags for IF:` then one `name: on|off` per flag (names padded);
    a driver without private flags prints the head alone ({})."""
    lines = text.strip("\n").splitlines()
    if not lines or not re.fullmatch(r"Private flags for \S+:", lines[0].strip()):
        raise ParseError("'Private flags for IF:' (ethtool --show-priv-flags)", text)
    flags: dict[str, bool] = {}
    for line in lines[1:]:
        m = re.fullmatch(r"(\S+)\s*: (on|off)", line.strip())
        if not m:
            raise ParseError("'NAME: on|off' (ethtool --show-priv-flags)", line)
        flags[m.group(1)] = m.group(2) == "on"
    return flags


def parse_ethtool_json(text: str) -> EthtoolSettings:
    """`ethtool --json <if>` (netlink ethtool): an array of one object. `speed` is read only as an integer (Mb/s);
    the real capture of a link that is down carries no `speed` or `duplex` key at all."""
    records = _json_array(text, "ethtool --json")
    try:
        (record,) = records
        speed, duplex, link = record.get("speed"), record.get("duplex"), record["link-detected"]
        if not isinstance(link, bool) or (speed is not None and not isinstance(speed, (int, str))):
            raise TypeError
        return EthtoolSettings(record["ifname"], speed if isinstance(speed, int) else None,
                               None if duplex is None or duplex.startswith("Unknown") else duplex,
                               record.get("auto-negotiation"), link)
    except (KeyError, TypeError, AttributeError, ValueError):
        raise ParseError("one object with ifname and a boolean link-detected (ethtool --json)", text) from None


@dataclass(frozen=True)
class ModuleFlags:
    """`ethtool -m <if>`: identity and per-lane flags (lane 1 first).

    A flag tuple is empty when the tool printed `None` (no lane flagged) and None when it printed no such
    line at all: ethtool < 6.4 prints no `Rx loss of signal/lock` for SFF-8636 or CMIS modules, and 6.4+
    prints `Rx loss of lock` only for modules with a CDR; SFF-8472 (SFP) dumps print neither. `rx_power_dbm` holds
    per-lane receive power (one lane for an SFP: `Receiver signal average optical power`)."""

    rx_loss_of_signal: tuple[bool, ...] | None
    rx_loss_of_lock: tuple[bool, ...] | None
    tx_fault: tuple[bool, ...] | None = None
    rx_power_dbm: tuple[float, ...] = ()
    identifier: int | None = None  # SFF-8024 code: 0x0d QSFP+, 0x11 QSFP28 (SFF-8636), 0x18 QSFP-DD, 0x19 OSFP
    module_state: str | None = None  # CMIS only: ModuleReady, ModuleLowPwr, ...
    vendor_pn: str | None = None
    vendor_name: str | None = None
    vendor_sn: str | None = None

    @property
    def rx_los(self) -> bool | None:
        """Any lane has Rx loss of signal; None when the tool did not report it."""
        return None if self.rx_loss_of_signal is None else any(self.rx_loss_of_signal)

    @property
    def rx_lol(self) -> bool | None:
        """Any lane has Rx loss of lock; None when the tool did not report it."""
        return None if self.rx_loss_of_lock is None else any(self.rx_loss_of_lock)

    @property
    def cmis(self) -> bool:
        return self.identifier is not None and self.identifier >= 0x18


_LANES = re.compile(r"\[ ((?:Yes|No)(?:, (?:Yes|No))*) \]")
_RX_POWER = re.compile(r".*(?:Rx|Rcvr|Receiver).*power.*?\(?Channel (\d+)\)?.*?:.*?(-?[\d.]+|-inf) dBm")
# SFF-8472 (SFP/SFP+) has one receiver and no channel: ethtool's sfpdiag prints its average power (or OMA, when the
# module reports that instead) as `%.4f mW / %.2f dBm`; read the dBm, else convert the mW.
_SFP_RX_POWER = re.compile(r"\s*Receiver signal (?:average optical power|OMA)\s*: "
                           r"(-?[\d.]+) mW(?: / (-?[\d.]+|-inf) dBm)?")
_HEX_CODE = re.compile(r"0x([0-9a-fA-F]{2})\b")
_MODULE_STATE = re.compile(r"0x[0-9a-fA-F]{2} \((\w+)\)")


def _lane_flags(fields: dict[str, str], name: str) -> tuple[bool, ...] | None:
    if name not in fields:
        return None
    value = fields[name]
    if value == "None":
        return ()
    m = _LANES.fullmatch(value)
    if not m:
        raise ParseError(f"'{name}' value None or '[ Yes, No, ... ]'", value)
    return tuple(word == "Yes" for word in m.group(1).split(", "))


def parse_ethtool_module(text: str) -> ModuleFlags:
    """`ethtool -m <if>`: `\\t%-41s : value` records (SFF-8636 and CMIS layouts, any ethtool version).

    Raises ParseError when the text has no module record at all."""
    lines = text.splitlines()
    fields = {}
    for line in lines:
        key, sep, value = line.partition(" : ")
        if sep:
            fields.setdefault(key.strip(), value.strip())
    if not fields:
        raise ParseError("'Key : value' records (ethtool -m)", text)
    power: dict[int, float] = {}
    for line in lines:
        if m := _RX_POWER.match(line):
            power[int(m.group(1))] = float(m.group(2))
        elif m := _SFP_RX_POWER.match(line):
            mw = float(m.group(1))
            power.setdefault(1, float(m.group(2)) if m.group(2) else
                             (10 * math.log10(mw) if mw > 0 else -math.inf))
    code = _HEX_CODE.match(fields.get("Identifier", ""))
    state = _MODULE_STATE.match(fields.get("Module State", ""))
    return ModuleFlags(
        rx_loss_of_signal=_lane_flags(fields, "Rx loss of signal"),
        rx_loss_of_lock=_lane_flags(fields, "Rx loss of lock"),
        tx_fault=_lane_flags(fields, "Tx fault"),
        rx_power_dbm=tuple(power[k] for k in sorted(power)),
        identifier=int(code.group(1), 16) if code else None,
        module_state=state.group(1) if state else None,
        vendor_pn=fields.get("Vendor PN"),
        vendor_name=fields.get("Vendor name"),
        vendor_sn=fields.get("Vendor SN"),
    )


# ---------------------------------------------------------------- mlxlink


@dataclass(frozen=True)
class MlxlinkInfo:
    """`mlxlink -d <dev>`: Operational Info plus every section as (title, ((key, value), ...))."""

    state: str | None  # None in an excerpt without its State line
    physical_state: str | None
    speed: str | None
    width: str | None
    fec: str | None
    sections: tuple[tuple[str, tuple[tuple[str, str], ...]], ...]

    def section(self, title: str) -> dict[str, str]:
        for name, records in self.sections:
            if name == title:
                return dict(records)
        raise KeyError(title)

    @property
    def link_up(self) -> bool | None:
        """The port manager state says the link is up. Physical state is the AN/PHY FSM word and does not
        say it: a ConnectX-6 Dx Ethernet link that is up reads `ETH_AN_FSM_ENABLE`. Without a State line only
        `LinkUp` says so; anything else leaves it unknown (None)."""
        if self.state is None:
            return True if self.physical_state == "LinkUp" else None
        return self.state in ("Active", "Physical LinkUp")


def parse_mlxlink(text: str) -> MlxlinkInfo:
    """Sections are a title (normally dash-underlined) followed by `Key<pad>: value` records; real mlxlink pads
    keys to 32 columns. Any line without a `key : value` record starts a new section."""
    sections: list[tuple[str, list[tuple[str, str]]]] = []
    for line in text.splitlines():
        stripped = line.strip()
        if not stripped or set(stripped) == {"-"}:
            continue
        if " : " in line or line.rstrip().endswith(" :"):
            if sections:
                key, _, value = line.rstrip().partition(" :")
                sections[-1][1].append((key.strip(), value.strip()))
            continue
        if stripped.startswith(("-E-", "-W-", "-I-")):  # mlxlink's errors, warnings and notes
            continue
        sections.append((stripped.removesuffix(" #"), []))
    frozen = tuple((title, tuple(records)) for title, records in sections)
    operational = dict(next((r for t, r in frozen if t == "Operational Info"), ()))
    if not operational.keys() & {"State", "Physical state", "Speed"}:
        raise ParseError("an 'Operational Info' section with State, Physical state or Speed (mlxlink)", text)
    return MlxlinkInfo(operational.get("State"), operational.get("Physical state"), operational.get("Speed"),
                       operational.get("Width"), operational.get("FEC"), frozen)
