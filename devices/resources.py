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
    proxy_jump: tuple["JumpHost", ...] = ()  # SSH jump hosts in order to an ssh:// switch (NETCONF)
    passphrase: str | None = field(default=None, repr=False)  # of the URL's identity_file; from the environment


@dataclass(frozen=True)
class JumpHost:
    """One SSH hop on the way to a host (OpenSSH's ProxyJump): its own user, key and known_hosts."""

    address: str
    port: int = 22
    user: str = "root"
    identity_file: str | None = None
    known_hosts: str | None = None  # None: ~/.ssh/known_hosts

    def __str__(self) -> str:
        return f"{self.user}@{self.address}:{self.port}"


# Tools whose reading needs root on a Linux host: the module EEPROM (`ethtool -m`), the NIC's registers
# (mlxlink), link changes (`ip link set`) and the agent (raw sockets for its probes, `ethtool -m` in its watch).
PRIVILEGED_TOOLS = frozenset({"ethtool", "mlxlink"})
KNOWN_TOOLS = ("ethtool", "ip", "rdma", "mlxlink", "nvidia-smi")


@dataclass(frozen=True)
class HostResource:
    """A Linux host reached over SSH (through `proxy_jump` hops in order, or a `proxy_command`)."""

    name: str
    address: str
    port: int = 22
    user: str = "root"
    identity_file: str | None = None
    known_hosts: str | None = None
    strict_host_key: bool = True  # False only when the bench is emulated
    python: str = "python3"
    proxy_jump: tuple[JumpHost, ...] = ()
    proxy_command: str | None = None  # OpenSSH's ProxyCommand, %h %p %r already expanded
    passphrase: str | None = field(default=None, repr=False)  # of identity_file; from the environment, never logged
    become: str | None = None  # "sudo": the agent and privileged tools run under `sudo -n`
    tools: tuple[tuple[str, str], ...] = ()  # (tool name, absolute path) used instead of the bare name

    def tool(self, name: str) -> str:
        """The path the host runs `name` by (its `tools:` entry, else the bare name on its PATH)."""
        return dict(self.tools).get(name, name)

    def privileged(self, command: str) -> bool:
        """Whether `command` (a shell command line) needs root: a privileged tool, `ip link set`, or the agent."""
        words = command.split()
        if not words:
            return False
        first = words[0].rsplit("/", 1)[-1]
        return (first in PRIVILEGED_TOOLS or first == self.python.rsplit("/", 1)[-1]
                or (first == "ip" and words[1:3] == ["link", "set"]))

    def as_run(self, command: str) -> str:
        """`command` as this host runs it: its first word replaced by the declared tool path, and under
        `sudo -n` (never a password prompt) when it needs root and the host says `become: sudo`. A command
        line of several commands (`a && b`) is left as it is: only the harness's single tool calls are mapped."""
        head, sep, rest = command.partition(" ")
        if head in dict(self.tools) and not any(op in command for op in ("&&", "||", ";", "|")):
            command = self.tool(head) + sep + rest
        if self.become == "sudo" and self.privileged(command) and not command.startswith("sudo "):
            command = "sudo -n " + command
        return command


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
    gbps: float | None = None  # the port's physical rate, when the inventory states it

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
    host_workers: int = 0  # an emulated bench whose hosts worker processes serve (harness emulate --workers N)

    def ports_of(self, host: str) -> list[NicPort]:
        return [p for p in self.nic_ports if p.host == host]
