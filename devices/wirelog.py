"""The wire log's device side: what drivers said to their peers and heard back, as records of the standard
`logging` logger `ocs_hil.wire` (the harness writes them to a run's wire.log: harness.logs).

Each record carries `t_ns` (the harness clock: a write's start, a read's receive stamp), `peer` (the
channel: a URL or a host name) and `arrow` (`>` sent, `<` received, `$` an SSH command, `=` its end, `#`
the channel's state). Nothing is formatted unless the logger is enabled, so a driver pays one level check
per write or read when no wire log is kept. Secrets must never reach a record: a channel names its own
(`hidden`: a TL1 login's password, shown as *** both ways, an echo included); harness.logs also scrubs every
secret the bench holds before a line is written.
"""
from __future__ import annotations

import logging
import re

WIRE = logging.getLogger("ocs_hil.wire")
_CONTROL = re.compile(rb"[\x00-\x1f\x7f\\]")
_RARE = re.compile(rb"[\x00-\x08\x0b\x0c\x0e-\x1f\x7f]")  # the control bytes but TAB, LF and CR


def enabled() -> bool:
    return WIRE.isEnabledFor(logging.DEBUG)


def record(t_ns: int, peer: str, arrow: str, data: bytes | str, hidden: tuple[bytes, ...] = ()) -> None:
    """One record of `data`, a line of text per line of it (split after each LF), CR, LF and other control bytes
    escaped (`\\r`, `\\n`, `\\xNN`), so the bytes can be read back exactly and one record is one line;
    each of `hidden` (the channel's secrets) shown as ***."""
    if not data or not WIRE.isEnabledFor(logging.DEBUG):
        return
    raw = data.encode("utf-8", "backslashreplace") if isinstance(data, str) else bytes(data)
    for secret in hidden:
        raw = raw.replace(secret, b"***")
    _emit(t_ns, peer, arrow, _Shown(raw))


def note(t_ns: int, peer: str, arrow: str, text: str) -> None:
    """A line about the channel (a connection made, a command's exit status), not bytes on it."""
    if WIRE.isEnabledFor(logging.DEBUG):
        _emit(t_ns, peer, arrow, text)


def _emit(t_ns: int, peer: str, arrow: str, shown) -> None:
    # `makeRecord` + `handle`, not `debug`: the caller's frame is not looked up (a third of a record's cost)
    WIRE.handle(WIRE.makeRecord(WIRE.name, logging.DEBUG, peer, 0, "%s", (shown,), None,
                                extra={"t_ns": t_ns, "peer": peer, "arrow": arrow}))


class _Shown:
    """Rendered when a handler formats the record, not when a driver logs it."""

    __slots__ = ("data",)

    def __init__(self, data: bytes):
        self.data = data

    def __str__(self) -> str:
        """One line per line of the data: a handler prefixes each (harness.logs)."""
        data = self.data
        if _RARE.search(data) is None:
            # Only CR, LF, TAB and backslash to escape (a switch's reply: tens of lines, formatted on the reply
            # thread while a cycle's host lines arrive): whole-chunk replaces, a NUL (which the data then does
            # not hold) after each line end where a record line ends — what `_lines` makes line by line.
            data = data.replace(b"\\", b"\\\\").replace(b"\t", b"\\t")
            data = data.replace(b"\r\n", b"\\r\\n\0").replace(b"\r", b"\\r\0").replace(b"\n", b"\\n\0")
            return data.removesuffix(b"\0").replace(b"\0", b"\n").decode("utf-8", "backslashreplace")
        return self._lines()

    def _lines(self) -> str:
        return "\n".join(_CONTROL.sub(_escape, piece).decode("utf-8", "backslashreplace")
                         for piece in self.data.splitlines(keepends=True))


_NAMED = {b"\r": b"\\r", b"\n": b"\\n", b"\t": b"\\t", b"\\": b"\\\\"}


def _escape(match: re.Match) -> bytes:
    byte = match.group()
    return _NAMED.get(byte) or b"\\x%02x" % byte[0]
