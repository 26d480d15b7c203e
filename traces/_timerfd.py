"""Wake an asyncio loop at exact CLOCK_MONOTONIC instants through a Linux timerfd.

asyncio's own timers round up to whole milliseconds (epoll's timeout unit); a timerfd fires at its
nanosecond deadline and wakes epoll at once, so a replay can be on time without spinning the CPU.
Python 3.11 has no os.timerfd_create, hence ctypes. `MonotonicTimer.create()` returns None where timerfd
is unavailable (non-Linux); callers then fall back to sleeping and yielding."""
from __future__ import annotations

import asyncio
import ctypes
import ctypes.util
import heapq
import itertools
import os
import sys

from devices.timing import now_ns

_CLOCK_MONOTONIC = 1
_TFD_NONBLOCK = os.O_NONBLOCK
_TFD_CLOEXEC = getattr(os, "O_CLOEXEC", 0o2000000)
_TFD_TIMER_ABSTIME = 1


class _Timespec(ctypes.Structure):
    _fields_ = [("tv_sec", ctypes.c_long), ("tv_nsec", ctypes.c_long)]


class _Itimerspec(ctypes.Structure):
    _fields_ = [("it_interval", _Timespec), ("it_value", _Timespec)]


def _libc():
    if not sys.platform.startswith("linux"):
        return None
    try:
        libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6", use_errno=True)
        libc.timerfd_create.argtypes = [ctypes.c_int, ctypes.c_int]
        libc.timerfd_settime.argtypes = [ctypes.c_int, ctypes.c_int, ctypes.POINTER(_Itimerspec),
                                         ctypes.POINTER(_Itimerspec)]
        return libc
    except (OSError, AttributeError):
        return None


class TimerHandle:
    """A scheduled callback of `MonotonicTimer.call_at`; `cancel()` before it runs and it never does."""

    __slots__ = ("_entry",)

    def __init__(self, entry: list):
        self._entry = entry

    def cancel(self) -> None:
        self._entry[2] = None


class MonotonicTimer:
    """Callbacks and futures due at given `now_ns()` instants; one timerfd armed at the earliest one."""

    def __init__(self, loop: asyncio.AbstractEventLoop, libc, fd: int):
        self._loop, self._libc, self._fd = loop, libc, fd
        self._heap: list[list] = []  # [deadline_ns, seq, callback or None once cancelled]
        self._seq = itertools.count()
        self._armed: int | None = None
        self._futures: set[asyncio.Future] = set()  # wait_until's, cancelled on close
        loop.add_reader(fd, self._fire)

    @classmethod
    def create(cls, loop: asyncio.AbstractEventLoop) -> "MonotonicTimer | None":
        libc = _libc()
        if libc is None:
            return None
        fd = libc.timerfd_create(_CLOCK_MONOTONIC, _TFD_NONBLOCK | _TFD_CLOEXEC)
        if fd < 0:
            return None
        try:
            return cls(loop, libc, fd)
        except (NotImplementedError, RuntimeError):  # a loop without add_reader
            os.close(fd)
            return None

    def call_at(self, deadline_ns: int, callback) -> TimerHandle:
        """Run `callback()` from the loop at `deadline_ns` or later, never before. Callbacks run without a task
        or future of their own: a streaming endpoint wakes once per write on this."""
        entry = [deadline_ns, next(self._seq), callback]
        heapq.heappush(self._heap, entry)
        if self._armed is None or deadline_ns < self._armed:
            self._arm(deadline_ns)
        return TimerHandle(entry)

    def wait_until(self, deadline_ns: int) -> asyncio.Future:
        future = self._loop.create_future()
        self._futures.add(future)

        def fire() -> None:
            self._futures.discard(future)
            if not future.done():
                future.set_result(None)
        self.call_at(deadline_ns, fire)
        return future

    def _arm(self, deadline_ns: int) -> None:
        spec = _Itimerspec()
        # An all-zero it_value would disarm the timer; any past instant fires at once.
        spec.it_value.tv_sec, spec.it_value.tv_nsec = divmod(max(deadline_ns, 1), 1_000_000_000)
        if self._libc.timerfd_settime(self._fd, _TFD_TIMER_ABSTIME, ctypes.byref(spec), None) != 0:
            raise OSError(ctypes.get_errno(), "timerfd_settime failed")
        self._armed = deadline_ns

    def _fire(self) -> None:
        try:
            os.read(self._fd, 8)
        except BlockingIOError:
            pass
        self._armed = None
        now = now_ns()
        heap, due = self._heap, []
        while heap and heap[0][0] <= now:
            callback = heapq.heappop(heap)[2]
            if callback is not None:
                due.append(callback)
        if heap:
            self._arm(heap[0][0])
        for callback in due:  # after re-arming: a callback may schedule (and arm) again
            try:
                callback()
            except Exception as exc:  # noqa: BLE001 - reported as the loop reports a failed callback
                self._loop.call_exception_handler({"message": "MonotonicTimer callback failed", "exception": exc})

    def close(self) -> None:
        self._loop.remove_reader(self._fd)
        os.close(self._fd)
        for future in self._futures:
            future.cancel()
        self._futures.clear()
        self._heap.clear()
