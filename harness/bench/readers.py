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
from dataclasses import dataclass
from typing import Callable

from devices.errors import DeviceError, TransportClosed


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
        """Deliver `stream`'s lines in batches (those that arrived together, with their arrival time)."""
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
