"""Line-oriented byte channels to a switch: raw TCP (TCP_NODELAY) or pyserial URLs.

Both channels send one `write()` per line, accept `\\r`, `\\n` or `\\r\\n` from the peer, stamp each line on
the harness clock when the chunk holding its terminator arrived — TCP: the kernel's receive time of that chunk
(SO_TIMESTAMPNS, `devices.timing.ReceiveStamps`), not when a busy harness thread got to read it; pyserial
(serial, `socket://`, `rfc2217://`): the read time, pyserial gives no kernel stamp — and enforce the caller's
`Deadline` themselves (pyserial read timeouts return short data silently).
"""
from __future__ import annotations

import re
import socket
from abc import ABC, abstractmethod
from collections import deque
from typing import Iterator

from devices import wirelog
from devices.errors import DeviceError, DeviceTimeout, TransportClosed
from devices.timing import Deadline, Receipt, ReceiveStamps, enable_receive_stamps, now_ns

# How long one blocking read may wait before the deadline is re-checked.
_POLL_S = 0.05
# The longest line a peer may send. Polatis lines are < 100 bytes; a longer one is noise or a flood, and
# the driver must stay bounded whatever arrives: the rest of such a line is discarded up to its end.
MAX_LINE_BYTES = 64 * 1024
# The most a driver keeps of one reply before it calls the reply a flood: bytes and lines (a line costs
# ~60 bytes of Python besides its text). A 640x640 Polatis lists 1280 ports; a drained backlog is read
# up to MAX_REPLY_BYTES per command.
MAX_REPLY_BYTES = 1024 * 1024
MAX_REPLY_LINES = 8192
_EOL = re.compile(rb"[\r\n]")
_NOTHING = Receipt(0, 0, 0, "")


class LineTooLong(DeviceError):
    """The peer sent a line longer than MAX_LINE_BYTES (it was cut and the rest of it discarded)."""


def excerpt(text: str, limit: int = 200) -> str:
    """`text` for an error message: repr'd, cut to `limit` characters with the full length said."""
    if len(text) <= limit:
        return repr(text)
    return f"{text[:limit]!r}... ({len(text)} characters)"


class CutLine(str):
    """The first MAX_LINE_BYTES of an over-long line, in its place among the lines."""


class LineSplitter:
    """Splits a byte stream into lines on CR, LF or CRLF; drops empty lines. A line longer than
    `max_line` is cut: its head comes out as a `CutLine` in its place, the rest up to the next line end
    is dropped, so memory stays bounded whatever the peer sends."""

    def __init__(self, max_line: int = MAX_LINE_BYTES) -> None:
        self._buf = bytearray()
        self._after_cr = False
        self._discarding = False  # inside the tail of an over-long line
        self._max_line = max_line

    def feed(self, data: bytes) -> list[str]:
        # A reply is one or a few chunks of many short lines (RTRV-PATCH: a line per patch, on the reply thread
        # while a cycle's host lines arrive): split in C. `bytes.splitlines` ends lines at CR, LF and CRLF only,
        # as the loop below does, which still takes a chunk inside an over-long line's tail or with a line that
        # may be over-long.
        if self._discarding:
            return self._feed(data)
        if self._after_cr:
            self._after_cr = False
            if data[:1] == b"\n":  # LF of a CRLF pair split across reads
                data = data[1:]
        parts = (bytes(self._buf) + data if self._buf else data).splitlines(True)
        if not parts or max(map(len, parts)) > self._max_line:
            return self._feed(data)
        self._buf.clear()
        tail = parts[-1]
        if tail[-1:] not in (b"\n", b"\r"):
            self._buf += parts.pop()  # no line end yet
        elif tail[-1:] == b"\r":
            self._after_cr = True  # a LF first in the next chunk ends no line
        return [line.decode("utf-8", "replace") for part in parts if (line := part.rstrip(b"\r\n"))]

    def _feed(self, data: bytes) -> list[str]:
        lines: list[str] = []
        start = 0
        if self._after_cr and data[:1] == b"\n":  # LF of a CRLF pair split across reads
            start = 1
        self._after_cr = False
        while start < len(data):
            match = _EOL.search(data, start)
            end = match.start() if match else len(data)
            if not self._discarding:
                self._buf += data[start:end]
                if len(self._buf) > self._max_line:
                    lines.append(CutLine(self._buf[:self._max_line].decode("utf-8", "replace")))
                    self._buf.clear()
                    self._discarding = True
            if match is None:
                break
            if self._buf:
                lines.append(self._buf.decode("utf-8", "replace"))
                self._buf.clear()
            self._discarding = False
            start = end + 1
            if data[end:end + 1] == b"\r":
                if start < len(data):
                    if data[start:start + 1] == b"\n":
                        start += 1
                else:
                    self._after_cr = True
        return lines

    @property
    def pending(self) -> str:
        """Bytes received after the last line end (e.g. a `<` prompt)."""
        return self._buf.decode("utf-8", "replace")


class LineChannel(ABC):
    """Send lines, receive lines with their arrival time. `receive_stamp` says which: "kernel" (the kernel's
    receive time, falling back to the read time where it cannot be trusted: `stamps.fallbacks`, `.reason`)
    or "read" (when this process read the bytes). `last_receipt`: the last line's stamp, its bound and
    provenance (devices.timing.Receipt); `last_write`: the last write's (before, after) harness times."""

    receive_stamp = "read"

    def __init__(self, description: str):
        self.description = description
        self._splitter = LineSplitter()
        self._ready: deque[tuple[Receipt, str]] = deque()
        self.last_receipt = Receipt(0, 0, 0, "")
        self.last_write = (0, 0)
        self.hidden: tuple[bytes, ...] = ()  # secrets (a login's password) the wire log shows as ***
        self._quiet_ns = 0  # the last instant this channel was seen to hold no unread data

    @property
    def last_bound_ns(self) -> int:
        return self.last_receipt.bound_ns

    def write_line(self, text: str, eol: str = "\r\n") -> int:
        """Send `text` + `eol` in one write; returns the harness time just before the write (`last_write`:
        before and after it)."""
        data = (text + eol).encode("utf-8")
        sent_ns = now_ns()
        self._write(data)
        self.last_write = (sent_ns, now_ns())
        wirelog.record(sent_ns, self.description, ">", data, self.hidden)
        return sent_ns

    def read_line(self, deadline: Deadline) -> tuple[int, str]:
        """Next non-empty line as (recv_ns, text). Raises DeviceTimeout (with the partial data),
        LineTooLong (the rest of that line is skipped, the stream goes on) or TransportClosed."""
        while True:
            # checked per line, not per read: a flood of lines must not outlast the deadline either
            if deadline.expired():
                unread = [line for _, line in list(self._ready)[-12:]]  # what arrived, read or not
                raise DeviceTimeout(f"no complete line from {self.description} before the deadline",
                                    "\n".join(unread + [self._splitter.pending]))
            if self._ready:
                break
            remaining = deadline.remaining()
            chunk, receipt = self._take(_POLL_S if remaining is None else min(_POLL_S, remaining))
            if chunk:
                self._ready.extend((receipt, line) for line in self._splitter.feed(chunk))
        self.last_receipt, line = self._ready.popleft()
        if isinstance(line, CutLine):
            raise LineTooLong(f"{self.description} sent a line longer than {MAX_LINE_BYTES} bytes "
                              f"(the rest was discarded): {excerpt(line)}")
        return self.last_receipt.t_ns, line

    def drain(self, deadline: Deadline | None = None) -> Iterator[tuple[int, str]]:
        """Yield whatever has been received but not read, as (recv_ns, line), one read at a time: at
        most about MAX_REPLY_BYTES and not past `deadline`, so a peer that floods the line cannot keep
        this going."""
        while self._ready:
            self.last_receipt, line = self._ready.popleft()
            yield self.last_receipt.t_ns, line
        taken = 0
        while taken < MAX_REPLY_BYTES and not (deadline and deadline.expired()):
            chunk, receipt = self._take(0.0)
            if not chunk:
                break
            taken += len(chunk)
            for line in self._splitter.feed(chunk):
                self.last_receipt = receipt
                yield receipt.t_ns, line

    def _take(self, timeout_s: float) -> tuple[bytes, Receipt]:
        started = now_ns()
        chunk, receipt = self._read(timeout_s)
        if not chunk:  # nothing was there at some instant after `started`: what comes next arrived later
            self._quiet_ns = max(self._quiet_ns, started)  # a pyserial read may have seen a later one
        else:
            wirelog.record(receipt.t_ns, self.description, "<", chunk, self.hidden)
        return chunk, receipt

    @abstractmethod
    def _write(self, data: bytes) -> None: ...

    @abstractmethod
    def _read(self, timeout_s: float) -> tuple[bytes, Receipt]:
        """(up to 64 KiB, when it arrived: a Receipt); b'' when nothing arrived in timeout_s; raises
        TransportClosed at EOF."""

    @abstractmethod
    def close(self) -> None: ...

    def reopen(self) -> None:
        """Close and open the connection again (after a timeout or a drop), dropping anything buffered."""
        self.close()
        self._splitter = LineSplitter()
        self._ready.clear()
        self._quiet_ns = 0
        self._open()

    def _open(self) -> None:
        raise TransportClosed(f"{self.description}: this channel cannot be reopened")


class TcpLineChannel(LineChannel):
    """A plain TCP connection with Nagle disabled (a split write otherwise costs ~40 ms); what arrives is
    stamped with the kernel's receive time (SO_TIMESTAMPNS)."""

    receive_stamp = "kernel"

    def __init__(self, host: str, port: int, connect_timeout_s: float = 10.0):
        super().__init__(f"tcp://{host}:{port}")
        self._address, self._connect_timeout_s = (host, port), connect_timeout_s
        self._open()

    def _open(self) -> None:
        self.stamps = ReceiveStamps()  # before the connection exists: nothing it reads predates it
        try:
            self._sock = socket.create_connection(self._address, timeout=self._connect_timeout_s)
        except OSError as exc:
            raise TransportClosed(f"cannot connect to {self.description}: {exc}") from exc
        self._sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        enable_receive_stamps(self._sock)
        wirelog.note(now_ns(), self.description, "#", "connected")

    def _write(self, data: bytes) -> None:
        try:
            self._sock.sendall(data)
        except OSError as exc:
            raise TransportClosed(f"{self.description}: send failed: {exc}") from exc

    def _read(self, timeout_s: float) -> tuple[bytes, Receipt]:
        try:
            self._sock.settimeout(timeout_s if timeout_s > 0 else 0.0)
            data, stamp, bound, kernel = self.stamps.recv(self._sock, 65536)
        except (socket.timeout, BlockingIOError):
            return b"", _NOTHING
        except OSError as exc:
            raise TransportClosed(f"{self.description}: receive failed: {exc}") from exc
        if not data:
            raise TransportClosed(f"{self.description} closed the connection")
        if kernel:
            return data, Receipt(stamp, bound, stamp - bound, "kernel")
        return data, Receipt(stamp, 0, self._quiet_ns, f"read (fallback: {self.stamps.reason})")

    def close(self) -> None:
        wirelog.note(now_ns(), self.description, "#", "closed")
        try:
            self._sock.close()
        except OSError:
            pass


class SerialLineChannel(LineChannel):
    """Any pyserial URL or device path: `socket://`, `rfc2217://`, `loop://`, `/dev/ttyUSB0`, a pty."""

    def __init__(self, url: str, baudrate: int = 38400, exclusive: bool = True):
        super().__init__(url)
        self._url, self._baudrate, self._exclusive = url, baudrate, exclusive
        self._open()

    def _open(self) -> None:
        import serial  # pyserial; imported here so TCP-only users do not pay for it

        url = self._url
        kwargs = {"baudrate": self._baudrate, "timeout": _POLL_S, "write_timeout": 10.0}
        if "://" not in url:
            kwargs["exclusive"] = self._exclusive  # only local device paths support locking
        try:
            self._port = serial.serial_for_url(url, **kwargs)
        except (serial.SerialException, ValueError, OSError) as exc:
            raise TransportClosed(f"cannot open serial line {url}: {exc}") from exc
        sock = getattr(self._port, "_socket", None)
        if isinstance(sock, socket.socket):  # socket:// and rfc2217:// leave Nagle on
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        self._serial_exception = serial.SerialException
        wirelog.note(now_ns(), self.description, "#", "opened")

    def _write(self, data: bytes) -> None:
        try:
            self._port.write(data)
            self._port.flush()
        except (self._serial_exception, OSError) as exc:
            raise TransportClosed(f"{self.description}: write failed: {exc}") from exc

    def _read(self, timeout_s: float) -> tuple[bytes, Receipt]:
        """pyserial gives no kernel receive time (nor does its socket:// or rfc2217:// socket): the read time,
        after the last instant the line was seen idle."""
        try:
            checked = now_ns()
            waiting = self._port.in_waiting
            if not waiting:
                self._quiet_ns = checked
            if waiting:
                data = self._port.read(waiting)
            elif timeout_s <= 0:
                data = b""
            else:
                if self._port.timeout != timeout_s:
                    self._port.timeout = timeout_s
                data = self._port.read(1)
        except (self._serial_exception, OSError) as exc:
            raise TransportClosed(f"{self.description}: read failed: {exc}") from exc
        return data, Receipt(now_ns(), 0, self._quiet_ns, "read")

    def close(self) -> None:
        wirelog.note(now_ns(), self.description, "#", "closed")
        try:
            self._port.close()
        except (self._serial_exception, OSError):
            pass
