"""`HostilePeer`: a TCP switch that misbehaves on purpose, for tests and `benchmarks/peer_fuzz.py`;
`connect_crowd` / `read_all`: many clients at once against a server, from one thread.

It knows nothing of the drivers: it splits what it receives into commands (TL1 ends them with `;`, SCPI
with a line end) and answers each with the steps a script returns for it — bytes to send, pauses, a
flood, a close. Everything it received is kept in `commands`, so a test can prove what was (not) sent.
"""
from __future__ import annotations

import re
import selectors
import socket
import threading
import time
from dataclasses import dataclass
from typing import Callable, Iterable, Union


@dataclass(frozen=True)
class Pause:
    seconds: float


@dataclass(frozen=True)
class Flood:
    """Send `chunk` over and over for `seconds` (or until the client goes away)."""

    chunk: bytes
    seconds: float


@dataclass(frozen=True)
class Close:
    """Drop the connection."""


Step = Union[bytes, Pause, Flood, Close]
TERMINATORS = {"tl1": re.compile(rb";"), "scpi": re.compile(rb"\r\n|\r|\n")}


class HostilePeer:
    """One listening socket on 127.0.0.1; connections are served one after another by one thread."""

    def __init__(self, respond: Callable[[str], Iterable[Step]], dialect: str = "scpi",
                 greeting: Iterable[Step] = ()):
        self.respond, self._split = respond, TERMINATORS[dialect]  # may be swapped between connections
        self._greeting = list(greeting)
        self._listener = socket.create_server(("127.0.0.1", 0))
        self._listener.settimeout(0.05)
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._serve, daemon=True, name="hostile-peer")
        self.commands: list[str] = []

    @property
    def address(self) -> tuple[str, int]:
        return self._listener.getsockname()[:2]

    def url(self) -> str:
        host, port = self.address
        return f"tcp://{host}:{port}"

    def start(self) -> "HostilePeer":
        self._thread.start()
        return self

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(timeout=5)
        self._listener.close()

    def __enter__(self) -> "HostilePeer":
        return self.start()

    def __exit__(self, *exc) -> None:
        self.stop()

    def _serve(self) -> None:
        while not self._stop.is_set():
            try:
                conn, _ = self._listener.accept()
            except (socket.timeout, OSError):
                continue
            with conn:
                conn.settimeout(0.05)
                try:
                    self._session(conn)
                except OSError:
                    pass  # the client went away

    def _session(self, conn: socket.socket) -> None:
        if not self._play(conn, self._greeting):
            return
        buffer = b""
        while not self._stop.is_set():
            try:
                data = conn.recv(65536)
            except socket.timeout:
                continue
            if not data:
                return
            buffer += data
            *commands, buffer = self._split.split(buffer)
            for raw in commands:
                text = raw.decode("utf-8", "replace").strip()
                if text:
                    self.commands.append(text)
                    if not self._play(conn, self.respond(text)):
                        return

    def _play(self, conn: socket.socket, steps: Iterable[Step]) -> bool:
        """Perform the steps; False when the connection is to be (or was) dropped."""
        for step in steps:
            if self._stop.is_set():
                return False
            if isinstance(step, bytes):
                if not self._send(conn, step, time.monotonic() + 5):
                    return False
            elif isinstance(step, Pause):
                self._stop.wait(step.seconds)
            elif isinstance(step, Flood):
                end = time.monotonic() + step.seconds
                while time.monotonic() < end and not self._stop.is_set():
                    if not self._send(conn, step.chunk, end):
                        return False
            elif isinstance(step, Close):
                return False
        return True

    def _send(self, conn: socket.socket, data: bytes, until: float) -> bool:
        """Send what the client accepts before `until` (a client that stops reading is not waited for)."""
        view = memoryview(data)
        while view and time.monotonic() < until and not self._stop.is_set():
            try:
                view = view[conn.send(view):]
            except socket.timeout:
                continue
            except OSError:
                return False
        return True


def connect_crowd(address: tuple[str, int], n: int, timeout_s: float = 30.0) -> list[socket.socket]:
    """n connections started at the same moment (non-blocking connects, so the server's listen backlog
    is exercised), returned blocking with a timeout."""
    socks = []
    for _ in range(n):
        sock = socket.socket()
        sock.setblocking(False)
        sock.connect_ex(address)
        socks.append(sock)
    with selectors.DefaultSelector() as selector:
        for sock in socks:
            selector.register(sock, selectors.EVENT_WRITE)
        pending, end = set(socks), time.monotonic() + timeout_s
        while pending and time.monotonic() < end:
            for key, _ in selector.select(timeout=0.5):
                pending.discard(key.fileobj)
                selector.unregister(key.fileobj)
    for sock in socks:
        sock.settimeout(timeout_s)
    return socks


def read_all(socks, done: Callable[[bytes], bool], timeout_s: float = 60.0,
             order: list | None = None) -> dict[socket.socket, bytes]:
    """Read from every socket at once until `done(data)` holds for each, it closes or errs, or the
    deadline passes; `order` (if given) gets the sockets in the order they finished."""
    received = {sock: b"" for sock in socks}
    pending = set(socks)
    with selectors.DefaultSelector() as selector:
        for sock in socks:
            selector.register(sock, selectors.EVENT_READ)
        end = time.monotonic() + timeout_s
        while pending and time.monotonic() < end:
            for key, _ in selector.select(timeout=0.5):
                try:
                    chunk = key.fileobj.recv(65536)
                except OSError:
                    chunk = b""
                received[key.fileobj] += chunk
                if not chunk or done(received[key.fileobj]):
                    if order is not None:
                        order.append(key.fileobj)
                    pending.discard(key.fileobj)
                    selector.unregister(key.fileobj)
    return received
