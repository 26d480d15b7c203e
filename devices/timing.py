"""Monotonic deadlines and command timings shared by every driver, and the kernel's receive time of socket
data (SO_TIMESTAMPNS) on the harness clock."""
from __future__ import annotations

import socket
import time
from dataclasses import dataclass
from typing import NamedTuple


def now_ns() -> int:
    """The harness clock: CLOCK_MONOTONIC in ns (shared by all processes on one machine)."""
    return time.monotonic_ns()


def cpu_wait_s() -> float | None:
    """Seconds the calling thread has spent runnable but waiting for a CPU (the kernel's schedstat run_delay),
    or None where the kernel does not report it. A timed loop that is late while this grows was held back by
    other load on the machine, not by its own work."""
    try:
        with open("/proc/thread-self/schedstat") as fh:
            return int(fh.read().split()[1]) / 1e9
    except (OSError, IndexError, ValueError):
        return None


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


class Receipt(NamedTuple):
    """When a line arrived, on the harness clock. `how` "kernel": the kernel's receive time, the true arrival
    within t_ns ± bound_ns; otherwise ("read", or "read (fallback: REASON)" where a kernel stamp could not be
    trusted) the read time: the true arrival lies in [earliest_ns, t_ns], earliest_ns being the last instant
    the channel was seen to hold no unread data (0: unknown)."""

    t_ns: int
    bound_ns: int
    earliest_ns: int
    how: str


@dataclass(frozen=True)
class CommandTiming:
    """When a command left the harness and when its completion came back (harness clock, ns); the true times
    lie within sent_ns ± sent_bound_ns and completed_ns ± completed_bound_ns, and `*_stamp` names each stamp.

    Sent, "write": sent_ns is taken just before the write, and its bound reaches to the write's return, when the
    kernel had taken the bytes (a TCP_NODELAY socket transmits them within the call unless its window is full;
    a serial line drains them at the baud rate after it — neither is observed). So the recorded time is the
    hand-over to the kernel, not the wire. Completed: the reply's Receipt; a read-time stamp (serial, or a
    kernel-stamp fallback) is the read, so its bound reaches back to the last time the line was seen idle, or to
    the send where that was earlier (no reply arrives before its command): honest, and as wide as the reader's
    lag. The defaults (bounds 0, stamps "") are for timings nobody bounded (fakes)."""

    sent_ns: int
    completed_ns: int
    sent_bound_ns: int = 0
    completed_bound_ns: int = 0
    sent_stamp: str = ""
    completed_stamp: str = ""

    @property
    def elapsed_s(self) -> float:
        return (self.completed_ns - self.sent_ns) / 1e9

    @classmethod
    def of(cls, write: tuple[int, int], reply: Receipt) -> "CommandTiming":
        """From a write's (before, after) harness times and its reply's Receipt."""
        before, after = write
        if reply.how == "kernel":
            bound = reply.bound_ns
        else:
            bound = max(0, reply.t_ns - max(before, reply.earliest_ns))
        return cls(before, reply.t_ns, after - before, bound, "write", reply.how)

    def until(self, last: "CommandTiming") -> "CommandTiming":
        """From this command's send to `last`'s completion (a sequence of commands as one)."""
        return CommandTiming(self.sent_ns, last.completed_ns, self.sent_bound_ns, last.completed_bound_ns,
                             self.sent_stamp, last.completed_stamp)


# ---------------------------------------------------------------------------------- kernel receive stamps
SO_TIMESTAMPNS = getattr(socket, "SO_TIMESTAMPNS", 35)  # Linux: the kernel's receive time of each segment
STAMP_SPACE = socket.CMSG_SPACE(16)  # one struct timespec


def enable_receive_stamps(sock: socket.socket) -> bool:
    """Ask the kernel to stamp what `sock` receives (read with `ReceiveStamps.recv`). False where it cannot."""
    try:
        sock.setsockopt(socket.SOL_SOCKET, SO_TIMESTAMPNS, 1)
    except OSError:
        return False
    return True


def kernel_realtime_ns(ancdata) -> int | None:
    """The SO_TIMESTAMPNS control message of a recvmsg (CLOCK_REALTIME, ns), or None."""
    for level, kind, data in ancdata:
        if level == socket.SOL_SOCKET and kind == SO_TIMESTAMPNS and len(data) >= 16:
            return (int.from_bytes(data[:8], "little", signed=True) * 1_000_000_000
                    + int.from_bytes(data[8:16], "little", signed=True))
    return None


_PAIR_INTERRUPTED_NS = 20_000  # a pair this wide was interrupted between its reads (~0.1-2 µs otherwise)


class ClockPair(NamedTuple):
    """CLOCK_REALTIME read between two harness-clock reads: `offset_ns` = realtime - monotonic, known to
    +-`width_ns`/2 (where in [before, after] the realtime read fell)."""

    mono_ns: int  # the middle of [before, after]
    offset_ns: int
    width_ns: int

    @classmethod
    def now(cls) -> "ClockPair":
        """A pair; one interrupted between its reads (the thread preempted, or the interpreter switching to
        another thread: up to its switch interval) is read once more, and the narrower kept — its width bounds
        every stamp converted with it."""
        pair = cls._read()
        if pair.width_ns > _PAIR_INTERRUPTED_NS:
            again = cls._read()
            if again.width_ns < pair.width_ns:
                return again
        return pair

    @classmethod
    def _read(cls) -> "ClockPair":
        before = now_ns()
        realtime = time.time_ns()
        after = now_ns()
        mid = (before + after) // 2
        return cls(mid, realtime - mid, after - before)


class Received(NamedTuple):
    data: bytes
    t_ns: int  # harness clock: the kernel's receive time, or the read time (`kernel` False)
    bound_ns: int  # the conversion's bound: the true receive time is within t_ns +- bound_ns (0 when read time)
    kernel: bool


class ReceiveStamps:
    """recvmsg with SO_TIMESTAMPNS -> (data, its kernel receive time on the harness clock, bound): one per
    reader, created (or given `since`, a pair taken) before its socket can receive (a stamp from before is not
    trusted).

    The kernel stamps in CLOCK_REALTIME; the harness clock is CLOCK_MONOTONIC. Linux slews both alike
    (adjtimex frequency and offset corrections change their common rate), so realtime - monotonic changes only
    when realtime is stepped (settimeofday, an NTP step, a leap second). Each read takes a realtime/monotonic
    pair and compares it with the one before: while the two agree within their widths, the offset has not moved
    since, and a stamp taken in between converts to within `bound_ns` (this pair's half-width plus the largest
    step the comparison could miss). A step between two reads makes that read's stamp ambiguous (before or after
    the step?): it falls back to the read time, counted in `fallbacks` with the `reason`, and so does every read
    that drains a backlog queued across the step (a read that filled its buffer may leave older data behind).
    A stamp later than its own read, or earlier than this run of agreeing pairs began, falls back too."""

    def __init__(self, since: ClockPair | None = None) -> None:
        # `since`: a pair taken before the socket could receive (a client's, before it connected: the peer's
        # first bytes may come before this reader exists); default now
        self._last = since or ClockPair.now()
        self._steady_since_ns = self._last.mono_ns - self._last.width_ns
        self._backlog_suspect = False
        self.fallbacks = 0
        self.reason = ""  # why the last fallback happened

    def recv(self, sock: socket.socket, size: int) -> Received:
        """One `sock.recvmsg(size)`; its errors (BlockingIOError, timeouts, OSError) propagate."""
        data, ancdata, _, _ = sock.recvmsg(size, STAMP_SPACE)
        return self.stamp(data, ancdata, full=len(data) >= size)

    def stamp(self, data: bytes, ancdata, full: bool) -> Received:
        pair = ClockPair.now()
        last, self._last = self._last, pair
        missable = (pair.width_ns + last.width_ns) // 2 + 1  # two agreeing pairs can still differ by this
        why = ""
        realtime = kernel_realtime_ns(ancdata)
        if abs(pair.offset_ns - last.offset_ns) > missable:
            why = f"CLOCK_REALTIME stepped by {pair.offset_ns - last.offset_ns} ns since the last read"
            self._steady_since_ns = pair.mono_ns - pair.width_ns
            self._backlog_suspect = full  # a full buffer may have left data from before the step queued
        elif self._backlog_suspect:
            why = "data queued before a CLOCK_REALTIME step"
            self._backlog_suspect = full
        elif realtime is None:
            why = "no kernel receive stamp"
        bound = pair.width_ns // 2 + missable
        if not why:
            t_ns = realtime - pair.offset_ns
            if t_ns > pair.mono_ns + bound or t_ns < self._steady_since_ns - bound:
                why = f"kernel stamp {t_ns} ns outside [{self._steady_since_ns}, {pair.mono_ns}] of its own read"
            else:
                return Received(data, t_ns, bound, True)
        self.fallbacks += 1
        self.reason = why
        return Received(data, pair.mono_ns, 0, False)
