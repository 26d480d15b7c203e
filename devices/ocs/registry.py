"""The OCS protocol registry: everything the rest of the project knows about a switch protocol, in one entry.

An entry names the driver (loaded on first use), the URL schemes and default port, the refusal codes that
no retry can cure, and the emulator that speaks the protocol over the emulated bench. The inventory loader,
`harness ocs`, `harness emulate` and `EmulatedBench` read this table; nothing else lists protocol names.
A lab adds a protocol with one module and one `register_protocol(OcsProtocol(...))` call (labgrid's
power-backend-per-module pattern); registering a name twice is refused. The module comes from the lab's own
package through the entry-point group `ocs_hil.ocs`, loaded at the first look-up here, or from an `imports:`
list of its inventory or playbook (devices/plugins.py).
"""
from __future__ import annotations

import importlib
from dataclasses import dataclass, field
from typing import Any

from devices.plugins import GROUPS, PluginError, load_group

# pyserial URL handlers (serial.serial_for_url)
SERIAL_SCHEMES = ("socket", "rfc2217", "loop", "spy", "alt", "hwgrep", "cp2110")


class OcsConfigError(ValueError):
    """A protocol name or URL that cannot work; the message is one line for the user."""


@dataclass(frozen=True)
class OcsProtocol:
    """One OCS wire protocol.

    driver: "module:Class" implementing `devices.protocols.CircuitSwitch`, built as
        `Class(resource, channel, timeout_s=...)` over a line channel this registry opens when
        `line_channel` is set (TL1, SCPI), else as `Class(resource, endpoint, timeout_s=...)` (it opens its
        own transport, e.g. SSH).
    schemes: URL schemes it accepts; pyserial schemes (SERIAL_SCHEMES) mean a serial line.
    serial_paths: a bare device path (`/dev/ttyUSB0`, `COM3`) is a serial line for this protocol.
    permanent: "module:name" of the driver's own classification of refusal codes (`DeviceDenied.code`)
        that retrying cannot cure: a set of codes or a predicate `f(code) -> bool`.
    emulator: "module:function", called as `function(ocs_servers)` with the emulated bench's running
        `OcsServers` (one switch state, its login table and its fault plan); returns a running view with
        `url`, `description` (one line for `harness emulate`) and `stop()`.
    """

    name: str
    driver: str
    schemes: tuple[str, ...]
    default_port: int
    permanent: str
    emulator: str
    serial_paths: bool = False
    line_channel: bool = False
    summary: str = ""
    references: tuple[str, ...] = field(default=(), compare=False)

    def open(self, resource, endpoint, timeout_s: float):
        driver = load(self.driver)
        if not self.line_channel:
            return driver(resource, endpoint, timeout_s=timeout_s)
        from devices.ocs.lines import SerialLineChannel, TcpLineChannel

        channel = (TcpLineChannel(endpoint.host, endpoint.port) if endpoint.kind == "tcp"
                   else SerialLineChannel(endpoint.url, baudrate=resource.baudrate))
        try:
            return driver(resource, channel, timeout_s=timeout_s)
        except BaseException:
            channel.close()
            raise

    def start_emulator(self, ocs_servers):
        return load(self.emulator)(ocs_servers)

    def is_permanent(self, code: str) -> bool:
        rule = load(self.permanent)
        return bool(rule(str(code))) if callable(rule) else str(code) in rule


_PROTOCOLS: dict[str, OcsProtocol] = {}
DEFAULT_PROTOCOL = "polatis-tl1"  # what `harness ocs`, `harness emulate` and `emulated:PROFILE` use unless told


def register_protocol(protocol: OcsProtocol) -> OcsProtocol:
    """Add a protocol; a name that is already registered is refused (ValueError), never overwritten."""
    if protocol.name in _PROTOCOLS:
        raise ValueError(f"OCS protocol {protocol.name!r} is already registered "
                         f"(driver {_PROTOCOLS[protocol.name].driver})")
    if not protocol.schemes:
        raise ValueError(f"OCS protocol {protocol.name!r}: no URL schemes")
    _PROTOCOLS[protocol.name] = protocol
    return protocol


_plugin_problem: list[str] = []  # an installed protocol plugin that failed to load: named where it is missed


def _with_plugins() -> None:
    """Load the installed protocol plugins once. One that fails does not stop commands that do not need it; a
    look-up of a protocol that is not registered names it."""
    try:
        load_group(GROUPS["ocs"])
    except PluginError as exc:
        _plugin_problem.append(str(exc))


def protocol_names() -> tuple[str, ...]:
    _with_plugins()
    return tuple(_PROTOCOLS)


def get_protocol(name: str) -> OcsProtocol:
    _with_plugins()
    try:
        return _PROTOCOLS[name]
    except (KeyError, TypeError):
        raise OcsConfigError(f"unknown switch protocol {name!r} (choose from {', '.join(_PROTOCOLS)})"
                             + "".join(f"; {problem}" for problem in _plugin_problem)) from None


def load(target: str) -> Any:
    """`"package.module:attribute"` -> the attribute (imported on first use)."""
    module, _, attribute = target.partition(":")
    return getattr(importlib.import_module(module), attribute)


# ---- the built-in protocols ---------------------------------------------------------------------------
register_protocol(OcsProtocol(
    name="polatis-tl1", driver="devices.ocs.tl1:Tl1Switch", schemes=("tcp",), default_port=3082,
    line_channel=True,
    permanent="devices.ocs.tl1:PERMANENT_CODES",
    emulator="devices.emulated.bench:tl1_view",
    summary="Polatis TL1 over TCP (ENT-PATCH / DLT-PATCH / RTRV-PATCH)"))

register_protocol(OcsProtocol(
    name="polatis-scpi", driver="devices.ocs.scpi:ScpiSwitch", schemes=("tcp",) + SERIAL_SCHEMES,
    default_port=5025, serial_paths=True, line_channel=True,
    permanent="devices.ocs.scpi:is_permanent",
    emulator="devices.emulated.bench:scpi_view",
    summary="Polatis SCPI over TCP or a serial line (:OXC:SWIT:CONN:...)"))

register_protocol(OcsProtocol(
    name="polatis-netconf", driver="devices.ocs.netconf:NetconfSwitch", schemes=("ssh",), default_port=830,
    permanent="devices.ocs.netconf:PERMANENT_TAGS",
    emulator="devices.emulated.netconf_server:netconf_view",
    summary="Polatis NETCONF over SSH (optical-switch YANG: cross-connects/pair, opm-power, port-config)",
    references=("opennetworkinglab/onos models/polatis/src/main/yang/optical-switch@2018-03-22.yang",
                "opennetworkinglab/onos drivers/polatis/netconf (PolatisUtility, PolatisNetconfUtility)")))
