"""Every host's agent streams read without a thread per stream. A stream on the SSH hub pushes its lines
(`SshLineStream.deliver`): they are delivered on the hub's thread as its loop takes each packet off the socket,
all the packet's complete lines in one call. Any other stream with a file descriptor is served by one reader
thread: a selector over the descriptors (paramiko's `Channel.fileno()` is readable while the channel holds data or
has ended). Each registered stream gets `on_lines(recv_ns, lines)` (or `on_line(recv_ns, line)` per line) and
`on_end(reason)` once when it ends; `remove()` (ours closing it) ends delivery without `on_end`.

A stream without a file descriptor (a scripted fake) gets a thread of its own, as before."""
from __future__ import annotations

import selectors
import socket
import threading
import time
from dataclasses import dataclass
from typing import Callable

from devices.errors import DeviceError, TransportClosed
from devices.ssh import MAX_STREAM_LINE_BYTES


@dataclass(eq=False)
class _Entry:
    stream: object
    on_lines: Callable[[int, list[str]], None]
    on_end: Callable[[str], None]


class StreamReaders:
    """Register streams with `add`; `poll(timeout)` serves what is ready (the thread's loop body, callable
    from a test without the thread)."""

    def __init__(self, *, start_on_use: bool = False) -> None:
        self._start_on_use = start_on_use  # the thread starts with the first stream it must read
        self._selector = selectors.DefaultSelector()
        self._wake_r, self._wake_w = socket.socketpair()
        self._wake_r.setblocking(False)
        self._selector.register(self._wake_r, selectors.EVENT_READ, None)
        self._lock = threading.Lock()
        self._pending: list[tuple[str, _Entry]] = []
        self._entries: dict[int, _Entry] = {}  # fd -> entry
        self._fd_of: dict[int, int] = {}  # id(stream) -> fd it was registered with (closing it closes the fd)
        self._thread: threading.Thread | None = None
        self._stopped = False

    def add(self, stream, on_line: Callable[[int, str], None], on_end: Callable[[str], None]) -> None:
        self.add_lines(stream, lambda recv_ns, lines: [on_line(recv_ns, line) for line in lines], on_end)

    def add_lines(self, stream, on_lines: Callable[[int, list[str]], None], on_end: Callable[[str], None]) -> None:
        """Deliver `stream`'s lines in batches (those that arrived together, with their arrival time), within
        the line bounds (`LineBounds`: a stream past them is ended with the bound as its reason)."""
        bounds = LineBounds(stream, on_lines, on_end)
        on_lines, on_end = bounds.on_lines, bounds.on_end
        entry = _Entry(stream, on_lines, on_end)
        deliver = getattr(stream, "deliver", None)
        if callable(deliver) and deliver(on_lines, lambda: on_end(_ended(stream))):
            return
        if not callable(getattr(stream, "read_available", None)):
            threading.Thread(target=_read_in_thread, args=(entry,), daemon=True,
                             name=f"reader-{getattr(stream, 'command', 'stream')[:40]}").start()
            return
        if self._start_on_use:
            self.start()
        self._request("add", entry)

    def remove(self, stream) -> None:
        """Stop delivering `stream`'s lines (its owner closes it); no `on_end`."""
        deliver = getattr(stream, "deliver", None)
        if callable(deliver) and deliver(None, None):
            return
        self._request("remove", _Entry(stream, None, None))

    def _request(self, op: str, entry: _Entry) -> None:
        with self._lock:
            self._pending.append((op, entry))
        self._wake_w.send(b"x")

    def start(self) -> "StreamReaders":
        with self._lock:
            if self._thread is None:
                self._thread = threading.Thread(target=self._loop, daemon=True, name="host-readers")
                self._thread.start()
        return self

    def _loop(self) -> None:
        while not self._stopped:
            self.poll(None)

    def poll(self, timeout: float | None) -> int:
        """Serve pending registrations and every ready stream once; returns the lines delivered."""
        delivered = 0
        ready = self._selector.select(timeout)
        if any(key.data is None for key, _ in ready):
            self._apply_pending()  # first: a stream removed meanwhile delivers nothing more
        for key, _ in ready:
            entry = key.data
            if entry is None or self._entries.get(key.fd) is not entry:
                continue
            try:
                lines, ended = entry.stream.read_available()
                reason = "" if not ended else _ended(entry.stream)
            except (TransportClosed, DeviceError, OSError, EOFError) as exc:
                lines, ended, reason = [], True, str(exc)
            if lines:
                entry.on_lines(lines[-1][0], [line for _, line in lines])
                delivered += len(lines)
            if ended:
                self._drop(entry.stream)
                entry.on_end(reason)
        return delivered

    def _apply_pending(self) -> None:
        try:
            while self._wake_r.recv(4096):
                pass
        except BlockingIOError:
            pass
        with self._lock:
            pending, self._pending = self._pending, []
        for op, entry in pending:
            if op == "remove":
                self._drop(entry.stream)
                continue
            try:
                fd = entry.stream.fileno()
            except (OSError, EOFError, AttributeError) as exc:  # closed before it was registered
                entry.on_end(str(exc))
                continue
            stale = self._entries.get(fd)
            if stale is not None:  # that stream was closed and its descriptor number reused
                self._drop(stale.stream)
            self._entries[fd] = entry
            self._fd_of[id(entry.stream)] = fd
            self._selector.register(fd, selectors.EVENT_READ, entry)

    def _drop(self, stream) -> None:
        fd = self._fd_of.pop(id(stream), None)
        if fd is not None and self._entries.get(fd) is not None and self._entries[fd].stream is stream:
            del self._entries[fd]
            try:
                self._selector.unregister(fd)
            except (KeyError, ValueError, OSError):
                pass

    def __len__(self) -> int:
        return len(self._entries)


# What a host stream may deliver: the agent prints lines < 200 bytes, and at most a few thousand a second
# (a burst of watch lines per cycle; counters: one per port per interval). Far more is a flood — a host
# fault — and is cut off before it can fill the harness's memory or queues.
MAX_LINE_CHARS = MAX_STREAM_LINE_BYTES
MAX_LINES_PER_S = 200_000
MAX_CHARS_PER_S = 32 * 2**20


class LineBounds:
    """One stream's line bounds: a line longer than MAX_LINE_CHARS, or more than MAX_LINES_PER_S lines or
    MAX_CHARS_PER_S characters within one second, ends the stream: `on_end` gets the bound that was passed
    (once), nothing more is delivered, the stream is closed (off the delivering thread)."""

    def __init__(self, stream, on_lines, on_end, clock: Callable[[], float] = time.monotonic):
        self._stream, self._deliver, self._end, self._clock = stream, on_lines, on_end, clock
        self._window, self._lines, self._chars = clock(), 0, 0
        self._ended = False
        self._lock = threading.Lock()

    def on_lines(self, recv_ns: int, lines: list[str]) -> None:
        if self._ended:
            return
        now = self._clock()
        if now - self._window >= 1.0:
            self._window, self._lines, self._chars = now, 0, 0
        self._lines += len(lines)
        chars = sum(map(len, lines))
        self._chars += chars
        longest = max(map(len, lines), default=0)
        if longest > MAX_LINE_CHARS:
            return self._fault(f"a line longer than {MAX_LINE_CHARS} characters")
        if self._lines > MAX_LINES_PER_S or self._chars > MAX_CHARS_PER_S:
            return self._fault(f"more than {MAX_LINES_PER_S} lines or {MAX_CHARS_PER_S} characters "
                               "within one second")
        self._deliver(recv_ns, lines)

    def _fault(self, bound: str) -> None:
        what = getattr(self._stream, "command", "stream")
        self.on_end(f"{what!r} sent {bound}: stream ended (a flood, not data)")
        close = getattr(self._stream, "close", None)
        if callable(close):  # not here: the hub delivers under the channel's pipe lock
            threading.Thread(target=close, daemon=True, name="close-flood").start()

    def on_end(self, reason: str) -> None:
        with self._lock:
            if self._ended:
                return
            self._ended = True
        self._end(reason)


def _ended(stream) -> str:
    return f"ended (exit status {getattr(stream, 'exit_status', None)}): {getattr(stream, 'stderr', '')}"


def _read_in_thread(entry: _Entry) -> None:
    try:
        for recv_ns, line in entry.stream:
            entry.on_lines(recv_ns, [line])
        reason = _ended(entry.stream)
    except (TransportClosed, DeviceError, OSError, EOFError) as exc:
        reason = str(exc)
    entry.on_end(reason)


_shared: StreamReaders | None = None
_shared_lock = threading.Lock()


def shared_readers() -> StreamReaders:
    """The process's one reader (its thread started once a stream needs it)."""
    global _shared
    with _shared_lock:
        if _shared is None:
            _shared = StreamReaders(start_on_use=True)
        return _shared
