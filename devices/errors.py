"""Exceptions raised by drivers. Each carries enough context to print one clear line."""
from __future__ import annotations


class DeviceError(Exception):
    """A device answered, but not with success (or not in a form we understand)."""


class DeviceTimeout(DeviceError):
    """No complete answer before the deadline. `partial` holds whatever did arrive."""

    def __init__(self, message: str, partial: str = ""):
        super().__init__(message if not partial else f"{message} (partial reply: {partial[-200:]!r})")
        self.partial = partial


class DeviceDenied(DeviceError):
    """The device refused a command with its own error code (TL1 DENY, SCPI error queue).

    `permanent`: the driver knows the refusal will not go away by retrying (bad port, bad command, bad
    login); callers retry only refusals that are not permanent (e.g. a busy switch).
    `after`: how the commands sent together with this one, after it, ended (`ENT-PATCH denied SROF`,
    `ENT-PATCH COMPLD`): the device ran them although this one was refused."""

    def __init__(self, command: str, code: str, text: str = "", *, permanent: bool = False,
                 after: tuple[str, ...] = ()):
        detail = f"{code}" + (f" ({text})" if text else "")
        then = f"; sent after it: {', '.join(after)}" if after else ""
        super().__init__(f"{command!r} denied by device: {detail}{then}")
        self.command, self.code, self.text, self.permanent = command, code, text, bool(permanent)
        self.after = tuple(after)


class PortNotAllowed(DeviceError):
    """A command would touch an OCS port that the inventory does not list. Nothing was sent."""


class TransportClosed(DeviceError):
    """The connection dropped; the caller may reconnect."""


class OutputTooLong(DeviceError):
    """A device sent more than a read may keep (bytes or lines): the read stopped there, and the message
    names the bound, so a flood never grows the harness's memory."""


class ReadBudget:
    """The one bound of a read from a device: at most `max_bytes` bytes and `max_lines` lines, counted as the
    data arrives (`take`), `OutputTooLong` naming `what` and the bound the moment either is passed."""

    def __init__(self, what: str, max_bytes: int, max_lines: int):
        self.what, self.max_bytes, self.max_lines = what, int(max_bytes), int(max_lines)
        self.bytes = self.lines = 0

    def take(self, data: bytes | str) -> None:
        self.bytes += len(data)
        self.lines += data.count(b"\n" if isinstance(data, bytes) else "\n")
        if self.bytes > self.max_bytes or self.lines > self.max_lines:
            raise OutputTooLong(f"{self.what}: more than {self.max_bytes} bytes or {self.max_lines} lines "
                                "(the read was stopped at this bound)")
