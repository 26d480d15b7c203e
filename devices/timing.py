"""Monotonic deadlines and command timings shared by every driver."""
from __future__ import annotations

import time
from dataclasses import dataclass


def now_ns() -> int:
    """The harness clock: CLOCK_MONOTONIC in ns (shared by all processes on one machine)."""
    return time.monotonic_ns()


class Deadline:
    """A point on the monotonic clock. Pass it down the call stack instead of loose timeouts."""

    __slots__ = ("_end_ns",)

    def __init__(self, seconds: float | None):
        self._end_ns = None if seconds is None else now_ns() + int(seconds * 1e9)

    @classmethod
    def at(cls, end_ns: int | None) -> "Deadline":
        d = cls(None)
        d._end_ns = end_ns
        return d

    def remaining(self) -> float | None:
        """Seconds left (never negative), or None for no deadline."""
        if self._end_ns is None:
            return None
        return max(0.0, (self._end_ns - now_ns()) / 1e9)

    def expired(self) -> bool:
        return self._end_ns is not None and now_ns() >= self._end_ns

    def sooner(self, seconds: float) -> "Deadline":
        """This deadline or `seconds` from now, whichever comes first."""
        other = now_ns() + int(seconds * 1e9)
        return Deadline.at(other if self._end_ns is None else min(self._end_ns, other))


@dataclass(frozen=True)
class CommandTiming:
    """When a command left the harness and when its completion came back (harness clock, ns)."""

    sent_ns: int
    completed_ns: int

    @property
    def elapsed_s(self) -> float:
        return (self.completed_ns - self.sent_ns) / 1e9
