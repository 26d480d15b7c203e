"""Optical circuit switch drivers: Polatis TL1 (TCP) and Polatis SCPI (TCP or serial).

`open_switch(resource)` picks the driver from `resource.protocol` and the transport from `resource.url`.
Bad protocol names or URLs raise `OcsConfigError` (a ValueError) before any connection is made.
"""
from __future__ import annotations

import re
from dataclasses import dataclass

from devices.ocs.lines import LineChannel, SerialLineChannel, TcpLineChannel
from devices.protocols import CircuitSwitch
from devices.resources import OcsResource

PROTOCOLS = ("polatis-tl1", "polatis-scpi")
DEFAULT_PORTS = {"polatis-tl1": 3082, "polatis-scpi": 5025}
# pyserial URL handlers (serial.serial_for_url); anything else with a scheme is rejected up front.
SERIAL_SCHEMES = ("socket", "rfc2217", "loop", "spy", "alt", "hwgrep", "cp2110")


class OcsConfigError(ValueError):
    """A protocol name or URL that cannot work; the message is one line for the user."""


@dataclass(frozen=True)
class Endpoint:
    kind: str  # "tcp" | "serial"
    host: str = ""
    port: int = 0
    url: str = ""  # the pyserial URL or device path for "serial"


def parse_url(url: str, protocol: str) -> Endpoint:
    """Validate a switch URL: `tcp://HOST[:PORT]`, a pyserial URL, or a device path (SCPI only)."""
    check_protocol(protocol)
    url = url.strip()
    if not url:
        raise OcsConfigError("empty switch URL")
    scheme, sep, rest = url.partition("://")
    if not sep:
        if protocol == "polatis-scpi" and (url.startswith("/") or re.fullmatch(r"COM\d+", url)):
            return Endpoint("serial", url=url)
        raise OcsConfigError(f"bad switch URL {url!r}: expected tcp://HOST:PORT"
                             + (", a pyserial URL or a device path" if protocol == "polatis-scpi" else ""))
    scheme = scheme.lower()
    if scheme == "tcp":
        host, colon, port_text = rest.rstrip("/").rpartition(":")
        if not colon:
            host, port_text = rest.rstrip("/"), str(DEFAULT_PORTS[protocol])
        host = host.strip("[]")
        if not host:
            raise OcsConfigError(f"bad switch URL {url!r}: no host")
        try:
            port = int(port_text)
        except ValueError:
            raise OcsConfigError(f"bad switch URL {url!r}: port {port_text!r} is not a number") from None
        if not 0 < port < 65536:
            raise OcsConfigError(f"bad switch URL {url!r}: port {port} out of range")
        return Endpoint("tcp", host=host, port=port)
    if scheme in SERIAL_SCHEMES:
        if protocol != "polatis-scpi":
            raise OcsConfigError(f"{protocol} runs over tcp://HOST:PORT, not {scheme}://")
        return Endpoint("serial", url=url)
    raise OcsConfigError(f"bad switch URL {url!r}: unknown scheme {scheme!r} "
                         f"(use tcp://" + (", " + ", ".join(f"{s}://" for s in SERIAL_SCHEMES)
                                            if protocol == "polatis-scpi" else "") + ")")


def check_protocol(protocol: str) -> None:
    if protocol not in PROTOCOLS:
        raise OcsConfigError(f"unknown switch protocol {protocol!r} (choose from {', '.join(PROTOCOLS)})")


def open_channel(endpoint: Endpoint, baudrate: int = 38400) -> LineChannel:
    if endpoint.kind == "tcp":
        return TcpLineChannel(endpoint.host, endpoint.port)
    return SerialLineChannel(endpoint.url, baudrate=baudrate)


def open_switch(resource: OcsResource, *, timeout_s: float = 30.0) -> CircuitSwitch:
    """Connect to the switch described by `resource` (and log in for TL1 when a user is given)."""
    from devices.ocs.scpi import ScpiSwitch
    from devices.ocs.tl1 import Tl1Switch

    endpoint = parse_url(resource.url, resource.protocol)
    channel = open_channel(endpoint, resource.baudrate)
    try:
        if resource.protocol == "polatis-tl1":
            return Tl1Switch(resource, channel, timeout_s=timeout_s)
        return ScpiSwitch(resource, channel, timeout_s=timeout_s)
    except BaseException:
        channel.close()
        raise


__all__ = ["Endpoint", "OcsConfigError", "PROTOCOLS", "open_switch", "parse_url"]
