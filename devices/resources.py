"""Resource records: *where* a device is. Plain frozen data, no I/O (labgrid's Resource/Driver split)."""
from __future__ import annotations

from dataclasses import dataclass, field


@dataclass(frozen=True)
class OcsResource:
    """An optical circuit switch reachable at `url`.

    url: ``tcp://HOST:PORT`` (TL1 or SCPI over TCP) or a pyserial URL / device path for SCPI over serial
    (``socket://``, ``rfc2217://``, ``/dev/ttyUSB0``, ``loop://``).
    allowed_ports: the only ports the harness may touch (safety allowlist).
    plan_from_confirmed_read: `apply` may plan from the driver's own last confirming read (no read round
    trip before the change; docs/ocs.md). Off unless asked for: a patch re-made behind our back from an
    allowed port to a port outside the allowlist would be removed by a change planned from memory.
    """

    name: str
    protocol: str  # a name in the OCS protocol registry (devices/ocs/registry.py)
    url: str
    size: tuple[int, int]  # (ingress count N, egress count M)
    allowed_ports: frozenset[int]
    user: str | None = None
    password: str | None = field(default=None, repr=False)  # resolved from the environment, never logged
    baudrate: int = 38400
    plan_from_confirmed_read: bool = False


@dataclass(frozen=True)
class HostResource:
    """A Linux host reached over SSH."""

    name: str
    address: str
    port: int = 22
    user: str = "root"
    identity_file: str | None = None
    known_hosts: str | None = None
    strict_host_key: bool = True  # False only when the bench is emulated
    python: str = "python3"


@dataclass(frozen=True)
class NicPort:
    """One NIC port and its two fibres into the OCS: TX -> OCS ingress `ocs_tx`, OCS egress `ocs_rx` -> RX."""

    host: str
    netdev: str  # e.g. ens1f0np0
    rdma_dev: str  # e.g. mlx5_0
    rdma_port: int
    ocs: str
    ocs_tx: int
    ocs_rx: int

    @property
    def key(self) -> str:
        return f"{self.host}:{self.netdev}"


@dataclass(frozen=True)
class Bench:
    """Everything on one bench, as the inventory describes it."""

    name: str
    emulated: bool
    ocs: dict[str, OcsResource]
    hosts: dict[str, HostResource]
    nic_ports: tuple[NicPort, ...]
    source: str = "<memory>"  # inventory file, for error messages

    def ports_of(self, host: str) -> list[NicPort]:
        return [p for p in self.nic_ports if p.host == host]
