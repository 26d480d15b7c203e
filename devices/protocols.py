"""Small protocol ABCs. Steps and the runner are written against these, never against a driver class."""
from __future__ import annotations

from abc import ABC, abstractmethod
from dataclasses import dataclass
from typing import Iterator, Mapping, Sequence

from devices.timing import CommandTiming, Deadline


class CircuitSwitch(ABC):
    """An optical circuit switch. Ports are integers as the switch numbers them (ingress 1..N, egress N+1..N+M).

    Every mutating call returns the CommandTiming of the command(s) it sent; `apply` is an idempotent
    reconcile: read the state, remove conflicts, add what is missing, confirm. Refusals raise
    DeviceDenied with `permanent` set by the driver, which alone knows its protocol's codes.
    """

    timeout_s: float = 30.0  # default deadline of one command (s); callers may set it

    def reconnect(self) -> None:
        """Open a fresh session after a timeout or a dropped connection (no-op where there is none)."""

    def take_events(self) -> list:
        """What the switch said on its own since the last call (devices.ocs.base.DeviceEvent: TL1
        autonomous messages, SCPI error-queue entries found at connect), oldest first; [] where the
        protocol has none."""
        return []

    @abstractmethod
    def identify(self) -> str: ...

    @abstractmethod
    def patches(self) -> dict[int, int]:
        """Current cross-connects, ingress -> egress."""

    @abstractmethod
    def connect(self, ingress: int, egress: int) -> CommandTiming: ...

    @abstractmethod
    def disconnect(self, ingresses: Sequence[int]) -> CommandTiming: ...

    @abstractmethod
    def apply(self, mapping: Mapping[int, int], *, exclusive: bool = False) -> CommandTiming:
        """Make `mapping` (ingress -> egress) hold. With exclusive=True, also drop every other patch on
        the allowed ports. Atomic where the protocol allows (SCPI `:oxc:swit:conn:only`)."""

    @abstractmethod
    def port_power(self, ports: Sequence[int]) -> dict[int, float]:
        """Optical power in dBm per port."""

    def close(self) -> None:  # pragma: no cover - trivial default
        pass


@dataclass(frozen=True)
class CommandResult:
    command: str
    exit_status: int
    stdout: str
    stderr: str
    timing: CommandTiming


class LineStream(ABC):
    """Lines from a long-running remote command, each with the harness time it was received."""

    @abstractmethod
    def __iter__(self) -> Iterator[tuple[int, str]]: ...

    @abstractmethod
    def readline(self, deadline: Deadline) -> tuple[int, str] | None:
        """Next (recv_ns, line) or None when the deadline passes. Raises TransportClosed at EOF."""

    @abstractmethod
    def write(self, data: str) -> None: ...

    @abstractmethod
    def close(self) -> None: ...


class CommandTransport(ABC):
    """Runs shell commands on a host (SSH on a bench; the same SSH against an emulated host)."""

    @abstractmethod
    def run(self, command: str, *, deadline: Deadline | None = None, stdin: str | bytes | None = None,
            check: bool = False) -> CommandResult: ...

    @abstractmethod
    def stream(self, command: str) -> LineStream: ...

    @abstractmethod
    def close(self) -> None: ...
