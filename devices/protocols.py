"""Small protocol ABCs. Steps and the runner are written against these, never against a driver class."""
from __future__ import annotations

from abc import ABC, abstractmethod
from dataclasses import dataclass
from typing import Generator, Generic, Iterator, Mapping, Sequence, TypeVar

from devices.timing import CommandTiming, Deadline, now_ns

T = TypeVar("T")


class Pending(Generic[T]):
    """A command on the wire whose reply is still to come. A driver writes it as `steps`, a generator that
    yields once, right after the write, the harness time taken just before it (the command's sent stamp), and
    returns what the call returns; made with `done`, the call has already ended. Creating it runs the steps
    up to the write on this thread (raising what they raise before it); `finish()`, on one thread, exactly
    once, awaits the reply. A caller may do other work between the two — the harness feeds host lines while
    a switch settles — but must finish: the steps may hold the session's lock until then."""

    def __init__(self, steps: Generator[int, None, T]):
        self._steps: Generator[int, None, T] | None = steps
        try:
            self.sent_ns = next(steps)
        except StopIteration as ended:  # nothing to send (a plan that was already in place)
            self._ended(ended.value)

    @classmethod
    def done(cls, value: T) -> "Pending[T]":
        """A call that already ended (a driver that cannot write before it waits: the whole call ran)."""
        pending = cls.__new__(cls)
        pending._ended(value)
        return pending

    def _ended(self, value: T) -> None:
        self._steps, self._value, self.sent_ns = None, value, getattr(value, "sent_ns", 0)

    def finish(self) -> T:
        steps, self._steps = self._steps, None
        if steps is not None:
            try:
                next(steps)
            except StopIteration as ended:
                self._value = ended.value
            else:
                steps.close()
                raise RuntimeError("a driver's steps yield once, after the write")
        return self._value


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

    def begin_apply(self, mapping: Mapping[int, int], *, exclusive: bool = False) -> Pending[CommandTiming]:
        """`apply` up to its change's write: `Pending.finish()` awaits the reply and returns its CommandTiming
        (`sent_ns`: the change's sent stamp, known now). A driver that cannot split the two runs the whole
        `apply` here."""
        return Pending.done(self.apply(mapping, exclusive=exclusive))

    @abstractmethod
    def port_power(self, ports: Sequence[int]) -> dict[int, float]:
        """Optical power in dBm per port."""

    def close(self) -> None:  # pragma: no cover - trivial default
        pass


class SteppedSwitch(CircuitSwitch):
    """A switch whose driver writes `apply` as steps (`_apply_steps`: a generator as `Pending` takes it, yielding
    once its change is written): `begin_apply` runs them up to that write, `apply` through to the reply."""

    def apply(self, mapping: Mapping[int, int], *, exclusive: bool = False) -> CommandTiming:
        return self.begin_apply(mapping, exclusive=exclusive).finish()

    def begin_apply(self, mapping: Mapping[int, int], *, exclusive: bool = False) -> Pending[CommandTiming]:
        return Pending(self._apply_steps(mapping, exclusive))

    @abstractmethod
    def _apply_steps(self, mapping: Mapping[int, int], exclusive: bool) -> Generator[int, None, CommandTiming]: ...


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

    def caught_up_ns(self) -> int:
        """Harness time up to which every line that reached this machine has been received: a silence is the
        peer's only up to it (a stream read as it arrives: now)."""
        return now_ns()


class CommandTransport(ABC):
    """Runs shell commands on a host (SSH on a bench; the same SSH against an emulated host)."""

    @abstractmethod
    def run(self, command: str, *, deadline: Deadline | None = None, stdin: str | bytes | None = None,
            check: bool = False) -> CommandResult: ...

    @abstractmethod
    def stream(self, command: str) -> LineStream: ...

    @abstractmethod
    def close(self) -> None: ...
