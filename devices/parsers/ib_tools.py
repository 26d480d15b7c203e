"""Parsers of the RDMA port tools labs read besides `rdma link` and sysfs: `ibstat` and `ibstatus`
(infiniband-diags), `ibv_devinfo` (rdma-core) and `ibdev2netdev` (MLNX_OFED / DOCA). Formats held to real
captures in tests/data/real/{ibstat,ibstatus,ibv-devinfo,ibdev2netdev}/.

Each reads records by their words, not by their indentation (pasted copies lose the TABs or flatten them),
skips lines it does not know (`ibpanic:`/`ibwarn:` messages, `ibv_devinfo -v` capability lists, a poster's
comments) and raises ParseError when the text holds no record of the tool at all.
"""
from __future__ import annotations

import re
from dataclasses import dataclass

from devices.parsers.common import ParseError
from devices.parsers.nic import IbPortState, IbRate, parse_ib_phys_state, parse_ib_rate, parse_ib_state


def _key_value(line: str) -> tuple[str, str] | None:
    key, sep, value = line.strip().partition(":")
    return (key.strip(), value.strip()) if sep and key.strip() else None


def _int(text: str | None, base: int = 10) -> int | None:
    try:
        return int(text, base) if text is not None else None
    except ValueError:
        return None


# ---------------------------------------------------------------- ibstat


@dataclass(frozen=True)
class IbstatPort:
    """One port of `ibstat`: `State` (Active, Down, Initializing, Armed) and `Physical state` (LinkUp, Polling,
    Disabled, ...) are ibstat's words; `rate_gbps` is the `Rate:` number (Gb/s)."""

    ca: str
    port: int
    state: str
    physical_state: str
    rate_gbps: float | None
    link_layer: str | None  # InfiniBand / Ethernet
    base_lid: int | None
    sm_lid: int | None
    port_guid: str | None
    ca_type: str | None  # MT4129 ...
    firmware: str | None

    @property
    def active(self) -> bool:
        return self.state == "Active"


_CA = re.compile(r"CA '([^']+)'")
_PORT_HEAD = re.compile(r"Port (\d+):")


def parse_ibstat(text: str) -> list[IbstatPort]:
    """`ibstat` (every CA, or one): `CA 'mlx5_0'` then `Key: value` lines, one `Port N:` block per port."""
    ports: list[IbstatPort] = []
    ca: str | None = None
    ca_fields: dict[str, str] = {}
    port: int | None = None
    fields: dict[str, str] = {}
    seen_ca = False

    def close_port() -> None:
        if ca is None or port is None:
            return
        if "State" not in fields or "Physical state" not in fields:
            raise ParseError(f"'State:' and 'Physical state:' in port {port} of CA '{ca}' (ibstat)", text)
        ports.append(IbstatPort(ca, port, fields["State"], fields["Physical state"],
                                float(fields["Rate"]) if re.fullmatch(r"\d+(\.\d+)?", fields.get("Rate", "")) else None,
                                fields.get("Link layer"), _int(fields.get("Base lid")), _int(fields.get("SM lid")),
                                fields.get("Port GUID"), ca_fields.get("CA type"), ca_fields.get("Firmware version")))

    for line in text.splitlines():
        stripped = line.strip()
        if m := _CA.fullmatch(stripped):
            close_port()
            ca, ca_fields, port, fields, seen_ca = m.group(1), {}, None, {}, True
        elif (m := _PORT_HEAD.fullmatch(stripped)) and ca is not None:
            close_port()
            port, fields = int(m.group(1)), {}
        elif ca is not None and (kv := _key_value(stripped)) and not stripped.startswith(("ibpanic", "ibwarn")):
            (fields if port is not None else ca_fields).setdefault(*kv)
    close_port()
    if not seen_ca:
        raise ParseError("\"CA '<name>'\" blocks (ibstat)", text)
    return ports


# ---------------------------------------------------------------- ibstatus


@dataclass(frozen=True)
class IbstatusPort:
    """One `Infiniband device 'mlx5_0' port 1 status:` block: the sysfs files ibstatus prints."""

    dev: str
    port: int
    state: IbPortState  # 4: ACTIVE
    phys_state: IbPortState  # 5: LinkUp
    rate: IbRate | None
    link_layer: str | None
    base_lid: int | None
    sm_lid: int | None
    default_gid: str | None


_IBSTATUS_HEAD = re.compile(r"Infiniband device '([^']+)' port (\d+) status:")


def parse_ibstatus(text: str) -> list[IbstatusPort]:
    """`ibstatus [dev[:port]]`: a head line per port, then `key:<TABs> value` lines, blocks apart by a blank."""
    blocks: list[tuple[str, int, dict[str, str]]] = []
    for line in text.splitlines():
        stripped = line.strip()
        if m := _IBSTATUS_HEAD.fullmatch(stripped):
            blocks.append((m.group(1), int(m.group(2)), {}))
        elif blocks and (kv := _key_value(stripped)):
            blocks[-1][2].setdefault(*kv)
    if not blocks:
        raise ParseError("\"Infiniband device '<dev>' port <n> status:\" blocks (ibstatus)", text)
    ports = []
    for dev, port, fields in blocks:
        if "state" not in fields or "phys state" not in fields:
            raise ParseError(f"'state:' and 'phys state:' for {dev} port {port} (ibstatus)", text)
        ports.append(IbstatusPort(dev, port, parse_ib_state(fields["state"]), parse_ib_phys_state(fields["phys state"]),
                                  parse_ib_rate(fields["rate"]) if "rate" in fields else None, fields.get("link_layer"),
                                  _int(fields.get("base lid"), 16), _int(fields.get("sm lid"), 16),
                                  fields.get("default gid")))
    return ports


# ---------------------------------------------------------------- ibv_devinfo


@dataclass(frozen=True)
class IbvPort:
    port: int
    state: str  # PORT_ACTIVE, PORT_DOWN, PORT_INIT, PORT_ARMED
    link_layer: str | None
    active_mtu: int | None
    port_lid: int | None
    sm_lid: int | None
    phys_state: str | None = None  # only with -v: LINK_UP, POLLING, DISABLED, ...

    @property
    def active(self) -> bool:
        return self.state == "PORT_ACTIVE"


@dataclass(frozen=True)
class IbvDevice:
    hca_id: str
    transport: str | None  # "InfiniBand (0)" also for RoCE; link_layer tells them apart
    fw_ver: str | None
    node_guid: str | None
    vendor_part_id: int | None
    board_id: str | None
    ports: tuple[IbvPort, ...]


def _word(value: str | None) -> str | None:
    """`PORT_ACTIVE (4)` -> `PORT_ACTIVE`; `4096 (5)` -> `4096`."""
    return value.split(" (")[0].strip() if value is not None else None


def parse_ibv_devinfo(text: str) -> list[IbvDevice]:
    """`ibv_devinfo [-v] [-d dev]`: `hca_id:` starts a device, `port:` a port (whatever the indentation); the
    device's and each port's `key: value` lines follow. `-v` capability lists (lines without a colon) and
    GID tables are skipped."""
    devices: list[tuple[str, dict[str, str], list[tuple[int, dict[str, str]]]]] = []
    for line in text.splitlines():
        kv = _key_value(line)
        if kv is None or not devices and kv[0] != "hca_id":
            continue
        key, value = kv
        if key == "hca_id":
            devices.append((value, {}, []))
        elif key == "port" and value.isdigit():
            devices[-1][2].append((int(value), {}))
        else:
            (devices[-1][2][-1][1] if devices[-1][2] else devices[-1][1]).setdefault(key, value)
    if not devices:
        raise ParseError("'hca_id: <dev>' records (ibv_devinfo)", text)
    out = []
    for hca_id, fields, port_fields in devices:
        ports = []
        for number, p in port_fields:
            if "state" not in p:
                raise ParseError(f"'state:' for {hca_id} port {number} (ibv_devinfo)", text)
            ports.append(IbvPort(number, _word(p["state"]), p.get("link_layer"), _int(_word(p.get("active_mtu"))),
                                 _int(p.get("port_lid")), _int(p.get("sm_lid")), _word(p.get("phys_state"))))
        out.append(IbvDevice(hca_id, fields.get("transport"), fields.get("fw_ver"), fields.get("node_guid"),
                             _int(fields.get("vendor_part_id")), fields.get("board_id"), tuple(ports)))
    return out


# ---------------------------------------------------------------- ibdev2netdev


@dataclass(frozen=True)
class Ibdev2netdev:
    """`mlx5_0 port 1 ==> ib0 (Up)`: the RDMA port, its netdev and the netdev's up/down (not the RDMA state;
    `-v` adds that as `port_state`)."""

    dev: str
    port: int
    netdev: str
    netdev_up: bool
    port_state: str | None = None  # -v: ACTIVE, DOWN, INIT, ...
    pci: str | None = None  # -v


_IBDEV2NETDEV = re.compile(r"(?:(?P<pci>[0-9a-fA-F]{4}:[0-9a-fA-F]{2}:[0-9a-fA-F]{2}\.\d)\s+)?(?P<dev>\S+)"
                           r"(?:\s+\(.*?\).*?)?\s+port\s+(?P<port>\d+)\s+(?:\((?P<state>\w+)\)\s+)?==>\s+"
                           r"(?P<netdev>\S+)\s+\((?P<up>Up|Down)\)")


def parse_ibdev2netdev(text: str) -> list[Ibdev2netdev]:
    """`ibdev2netdev [-v]`, one port per line (also re-spaced by `column -t`; text after the line is ignored)."""
    out = []
    for line in text.splitlines():
        if m := _IBDEV2NETDEV.match(line.strip()):
            out.append(Ibdev2netdev(m["dev"], int(m["port"]), m["netdev"], m["up"] == "Up", m["state"], m["pci"]))
    if not out and text.strip():
        raise ParseError("'<dev> port <n> ==> <netdev> (Up|Down)' lines (ibdev2netdev)", text)
    return out
