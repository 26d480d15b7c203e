"""Keep-alive HTTP/1.1 connections for the timed replay, opened ahead of need.

A request is bytes built before its deadline (`request_bytes`) and written straight to the connection's
socket, so its send instant is stamped as the write returns; the response is parsed by httptools (llhttp, the
parser uvicorn uses) — status line, headers, chunked or sized bodies, keep-alive. The pool keeps a connection
idle or opening for each request announced ahead (`expect`: the replay announces a request when its task is
made, `lookahead_s` before it is due) plus `spare` more, opening them in the background, so a send waits for a
connection only when more are in flight than the pool may hold or a burst outruns the handshakes under way.
"""
from __future__ import annotations

import asyncio
import ssl
from collections import deque
from urllib.parse import urlsplit

import httptools


class ResponseError(Exception):
    """The answer could not be read to its end (connection closed, bad HTTP)."""


class Response:
    """One answer being read. Subclasses may consume body pieces as they come (`on_body`); `done` is a future
    set (result None) when the answer's last byte has been parsed, or set to a ResponseError."""

    __slots__ = ("status", "done", "chunks")

    def __init__(self, loop: asyncio.AbstractEventLoop):
        self.status: int | None = None
        self.done = loop.create_future()
        self.chunks: list[bytes] = []

    def on_body(self, piece: bytes) -> None:
        self.chunks.append(piece)

    def body(self) -> bytes:
        return b"".join(self.chunks)


class Connection(asyncio.Protocol):
    """One keep-alive connection carrying one request at a time."""

    def __init__(self, pool: "ConnectionPool"):
        self._pool = pool
        self._parser = httptools.HttpResponseParser(self)
        self._response: Response | None = None
        self.transport: asyncio.Transport | None = None
        self.closed = False

    def send(self, data: bytes, response: Response) -> None:
        """Write a whole request; its answer goes to `response`. The bytes are in the socket (or, if the socket
        is full, in the transport's buffer) when this returns."""
        self._response = response
        self.transport.write(data)

    def abort(self) -> None:
        """Drop the connection (a timed-out answer leaves it mid-message, unusable)."""
        if self.transport is not None:
            self.transport.abort()

    # asyncio.Protocol
    def connection_made(self, transport) -> None:
        self.transport = transport

    def data_received(self, data: bytes) -> None:
        try:
            self._parser.feed_data(data)
        except httptools.HttpParserError as exc:
            self._fail(ResponseError(f"bad HTTP response: {exc}"))
            self.transport.abort()

    def connection_lost(self, exc) -> None:
        self.closed = True
        self._fail(ResponseError("connection closed before the answer ended"))
        self._pool._lost(self)  # noqa: SLF001 - the pool's own callback

    def _fail(self, exc: Exception) -> None:
        response, self._response = self._response, None
        if response is not None and not response.done.done():
            response.done.set_exception(exc)

    # httptools callbacks
    def on_headers_complete(self) -> None:
        if self._response is not None:
            self._response.status = self._parser.get_status_code()

    def on_body(self, body: bytes) -> None:
        if self._response is not None:
            self._response.on_body(body)

    def on_message_complete(self) -> None:
        response, self._response = self._response, None
        if response is None:  # an answer nobody asked for: the connection is out of step
            self.transport.abort()
            return
        if not response.done.done():
            response.done.set_result(None)
        if self._parser.should_keep_alive():
            self._pool._release(self)  # noqa: SLF001
        else:
            self.transport.close()


def request_bytes(method: str, path: str, host: str, body: bytes = b"",
                  content_type: str = "application/json") -> bytes:
    head = f"{method} {path} HTTP/1.1\r\nHost: {host}\r\n"
    if body or method in ("POST", "PUT", "PATCH"):
        head += f"Content-Type: {content_type}\r\nContent-Length: {len(body)}\r\n"
    return head.encode("latin-1") + b"\r\n" + body


class ConnectionPool:
    """Up to `limit` connections to one http(s) origin. `acquire()` hands out an idle connection at once when
    there is one; after every hand-out the pool opens connections in the background until `spare` are idle
    or opening again. A connection comes back by itself when its answer has been read."""

    def __init__(self, url: str, limit: int, spare: int = 0):
        parts = urlsplit(url)
        if parts.scheme not in ("http", "https") or not parts.hostname:
            raise ValueError(f"expected an http(s)://HOST[:PORT] URL, found {url!r}")
        self.host, self.port = parts.hostname, parts.port or (443 if parts.scheme == "https" else 80)
        self.authority = parts.netloc
        self._ssl = ssl.create_default_context() if parts.scheme == "https" else None
        self.limit, self.spare = limit, spare
        self._loop = asyncio.get_running_loop()
        self._idle: list[Connection] = []  # last in, first out: the most recently used connection
        self._busy: set[Connection] = set()
        self._waiters: deque[asyncio.Future] = deque()
        self._opening = 0
        self._expected = 0  # requests announced (`expect`) that have not taken a connection yet
        self._tasks: set[asyncio.Task] = set()
        self._closed = False

    @property
    def size(self) -> int:
        """Connections open or opening."""
        return len(self._idle) + len(self._busy) + self._opening

    def expect(self) -> None:
        """A request will take a connection soon (`take(expected=True)`): one is opened for it now, if none is
        idle or opening for it, so its handshake is over before it is due."""
        self._expected += 1
        if len(self._idle) + self._opening < self.spare + self._expected:
            self._top_up()

    def take(self, expected: bool = False) -> Connection | None:
        """An idle connection, or None (then `acquire`). `expected`: by a request announced with `expect`."""
        if expected:
            self._expected -= 1
        idle = self._idle
        if not idle:
            return None
        conn = idle.pop()
        self._busy.add(conn)
        if len(idle) + self._opening < self.spare + self._expected:
            self._top_up()
        return conn

    async def acquire(self) -> Connection:
        """A connection, once one is idle (after `take` gave None: an `expect`ed request is counted there)."""
        conn = self.take()
        if conn is not None:
            return conn
        waiter = self._loop.create_future()
        self._waiters.append(waiter)
        self._top_up()
        try:
            return await waiter
        except asyncio.CancelledError:
            if waiter.done() and not waiter.cancelled():  # handed over just as the wait was cancelled
                self._release(waiter.result())
            raise

    async def warm(self, count: int) -> None:
        """Open connections until `count` (within the limit) are open; returns when they are (or failed)."""
        todo = max(0, min(count, self.limit) - self.size)
        self._opening += todo
        await asyncio.gather(*(self._open() for _ in range(todo)))

    async def close(self) -> None:
        self._closed = True
        for task in list(self._tasks):
            task.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)
        for conn in [*self._idle, *self._busy]:
            conn.abort()
        self._idle.clear()
        self._busy.clear()
        for waiter in self._waiters:
            if not waiter.done():
                waiter.set_exception(ResponseError("connection pool closed"))

    def _top_up(self) -> None:
        want = min(self.spare + self._expected + len(self._waiters) - len(self._idle) - self._opening,
                   self.limit - self.size)
        if want <= 0:
            return
        self._opening += want  # counted now: a task not yet started is a connection on its way
        for _ in range(want):
            task = self._loop.create_task(self._open())
            self._tasks.add(task)
            task.add_done_callback(self._tasks.discard)

    async def _open(self) -> None:
        """One more connection (already counted in `_opening`), handed to a waiter or made idle."""
        try:
            _, conn = await self._loop.create_connection(lambda: Connection(self), self.host, self.port,
                                                         ssl=self._ssl)
        except OSError as exc:  # not raised: a background opening has nobody to raise to
            self._opening -= 1
            self._fail_waiter(exc)  # an unreachable endpoint fails the request that needed the connection
            return
        except BaseException:
            self._opening -= 1
            raise
        self._opening -= 1
        self._busy.add(conn)
        self._release(conn)

    def _fail_waiter(self, exc: Exception) -> None:
        while self._waiters:
            waiter = self._waiters.popleft()
            if not waiter.done():
                waiter.set_exception(exc)
                return

    def _release(self, conn: Connection) -> None:
        """`conn` is free: to the first waiter, else idle."""
        if conn.closed or self._closed:
            self._busy.discard(conn)
            conn.abort()
            return
        while self._waiters:
            waiter = self._waiters.popleft()
            if not waiter.done():
                waiter.set_result(conn)  # stays busy
                return
        self._busy.discard(conn)
        self._idle.append(conn)

    def _lost(self, conn: Connection) -> None:
        self._busy.discard(conn)
        try:
            self._idle.remove(conn)
        except ValueError:
            pass
        if not self._closed and (self._waiters or len(self._idle) + self._opening < self.spare + self._expected):
            self._top_up()
