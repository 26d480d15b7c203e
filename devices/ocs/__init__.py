"""Optical circuit switch drivers, one module per protocol, named in the registry (`devices/ocs/registry.py`).

`open_switch(resource)` picks the driver from `resource.protocol` and the transport from `resource.url`.
Bad protocol names or URLs raise `OcsConfigError` (a ValueError) before any connection is made.
"""
from __future__ import annotations

import re
from dataclasses import dataclass
from typing import TYPE_CHECKING
from urllib.parse import parse_qsl

from devices.ocs.registry import (SERIAL_SCHEMES, OcsConfigError, get_protocol, protocol_names,
                                  register_protocol)

if TYPE_CHECKING:  # annotations only: every `harness` start-up imports this package for the protocol names
    from devices.protocols import CircuitSwitch
    from devices.resources import OcsResource


@dataclass(frozen=True)
class Endpoint:
    kind: str  # "serial", or the network scheme: "tcp" | "ssh"
    host: str = ""
    port: int = 0
    url: str = ""  # the pyserial URL or device path for "serial"
    options: tuple[tuple[str, str], ...] = ()  # URL query, e.g. ssh://h:830?known_hosts=FILE

    def option(self, name: str, default: str | None = None) -> str | None:
        return dict(self.options).get(name, default)


def parse_url(url: str, protocol: str) -> Endpoint:
    """Validate a switch URL against what `protocol` accepts: `SCHEME://HOST[:PORT][?k=v]`, a pyserial URL,
    or a device path."""
    entry = get_protocol(protocol)
    network = [s for s in entry.schemes if s not in SERIAL_SCHEMES]
    expected = ", ".join([f"{s}://HOST:PORT" for s in network]
                         + [f"{s}://" for s in entry.schemes if s in SERIAL_SCHEMES]
                         + (["a device path"] if entry.serial_paths else []))
    url = url.strip()
    if not url:
        raise OcsConfigError("empty switch URL")
    scheme, sep, rest = url.partition("://")
    if not sep:
        if entry.serial_paths and (url.startswith("/") or re.fullmatch(r"COM\d+", url)):
            return Endpoint("serial", url=url)
        raise OcsConfigError(f"bad switch URL {url!r}: expected {expected}")
    scheme = scheme.lower()
    if scheme not in entry.schemes:
        raise OcsConfigError(f"bad switch URL {url!r}: unknown scheme {scheme!r} for {protocol} "
                             f"(use {expected})")
    if scheme in SERIAL_SCHEMES:
        return Endpoint("serial", url=url)
    rest, _, query = rest.partition("?")
    hostport = rest.rstrip("/")
    if hostport.startswith("["):  # [IPv6]:PORT
        host, _, tail = hostport[1:].partition("]")
        port_text = tail.removeprefix(":") or str(entry.default_port)
    else:
        host, colon, port_text = hostport.rpartition(":")
        if not colon:
            host, port_text = hostport, str(entry.default_port)
    if not host:
        raise OcsConfigError(f"bad switch URL {url!r}: no host")
    try:
        port = int(port_text)
    except ValueError:
        raise OcsConfigError(f"bad switch URL {url!r}: port {port_text!r} is not a number") from None
    if not 0 < port < 65536:
        raise OcsConfigError(f"bad switch URL {url!r}: port {port} out of range")
    return Endpoint(scheme, host=host, port=port, options=tuple(parse_qsl(query)))


def open_switch(resource: OcsResource, *, timeout_s: float = 30.0) -> CircuitSwitch:
    """Connect to the switch described by `resource` (and log in where the protocol has a login)."""
    endpoint = parse_url(resource.url, resource.protocol)
    return get_protocol(resource.protocol).open(resource, endpoint, timeout_s)


__all__ = ["Endpoint", "OcsConfigError", "get_protocol", "open_switch", "parse_url", "protocol_names",
           "register_protocol"]
