"""What a command handler of the emulated host sees (`ExecContext`): the host, the bench, the exec'd command
line and the channel's I/O."""
from __future__ import annotations

import hashlib
import posixpath
import time
from typing import TYPE_CHECKING, Callable, Iterator

import paramiko

if TYPE_CHECKING:
    from devices.emulated.host.server import EmulatedHostServer


Handler = Callable[["ExecContext", list[str]], int]
POLL_S = 0.1  # how often blocked streaming handlers check whether the client went away


class ChannelGone(Exception):
    """The client closed the channel (or the connection dropped) while a handler was writing."""


class ExecContext:
    """What a command handler sees: the host, the bench, the exec'd command line and the channel I/O."""

    def __init__(self, server: "EmulatedHostServer", channel: paramiko.Channel, command: str):
        self.server = server
        self.bench = server.bench
        self.host = server.host_name
        self.channel = channel
        self.command = command
        self._redirect: list[bytes] | None = None
        self._stdin_buffer = b""
        self._stdin_fixed = False  # stdin is `_stdin_buffer` alone (a pipe's left side, or /dev/null), not the channel
        self.tty = False  # the session has a pty: its line discipline turns \n into \r\n and merges stderr
        self.bash = False  # run by the interactive login shell (bash), not by `sh -c` (dash)
        self.cwd = server.home  # the shell's working directory (`cd`); a session starts in the home directory

    def with_stdin(self, data: bytes | None) -> "ExecContext":
        """A subshell of this context (a pipe's stage: its `cd` stays its own) reading `data` as its whole
        stdin, or, for None, this context's stdin."""
        stage = ExecContext(self.server, self.channel, self.command)
        stage.tty, stage.bash, stage.cwd, stage._redirect = self.tty, self.bash, self.cwd, self._redirect
        stage._stdin_buffer, stage._stdin_fixed = (self._stdin_buffer, self._stdin_fixed) if data is None \
            else (data, True)
        return stage

    # ---- output
    def out(self, text: str | bytes) -> None:
        data = text.encode() if isinstance(text, str) else text
        if self._redirect is not None:
            self._redirect.append(data)
            return
        if self.tty:
            data = data.replace(b"\n", b"\r\n")
        if self.server.reply_delay_s > 0:  # fault injection: a slow (loaded) host
            time.sleep(self.server.reply_delay_s)
        try:
            self.channel.sendall(data)
        except (OSError, EOFError) as exc:
            raise ChannelGone() from exc

    def err(self, text: str | bytes) -> None:
        data = text.encode() if isinstance(text, str) else text
        try:
            if self.tty:
                self.channel.sendall(data.replace(b"\n", b"\r\n"))
                return
            self.channel.sendall_stderr(data)
        except (OSError, EOFError) as exc:
            raise ChannelGone() from exc

    # ---- input
    def read_stdin(self) -> bytes:
        """All of stdin, up to EOF (or the client closing)."""
        chunks = [self._stdin_buffer]
        self._stdin_buffer = b""
        while not self._stdin_fixed:
            data = self.channel.recv(65536)
            if not data:
                return b"".join(chunks)
            chunks.append(data)
        return b"".join(chunks)

    def stdin_chunks(self) -> Iterator[bytes]:
        """Stdin as it arrives, up to EOF (or the client closing): what a filter copying it at once reads."""
        if self._stdin_buffer:
            data, self._stdin_buffer = self._stdin_buffer, b""
            yield data
        while not self._stdin_fixed:
            data = self.channel.recv(65536)
            if not data:
                return
            yield data

    def stdin_lines(self) -> Iterator[bytes]:
        """Stdin line by line (without newline) until EOF."""
        while True:
            cut = self._stdin_buffer.find(b"\n")
            if cut >= 0:
                line, self._stdin_buffer = self._stdin_buffer[:cut], self._stdin_buffer[cut + 1:]
                yield line
                continue
            data = b"" if self._stdin_fixed else self.channel.recv(65536)
            if not data:
                return
            self._stdin_buffer += data

    def gone(self) -> bool:
        """The client closed the channel or the connection dropped."""
        transport = self.channel.get_transport()
        return self.channel.closed or transport is None or not transport.is_active()

    def stdin_closed(self) -> bool:
        """The client sent EOF on stdin (the agent's streaming subcommands stop then)."""
        return bool(self.channel.eof_received)

    def wait_stdin_eof_or_gone(self) -> None:
        """Block until stdin reaches EOF or the client goes away (discarding stdin). No polling: paramiko
        ends a blocked recv on EOF, on the channel's close and when the connection drops (every channel of a
        transport whose loop ends is closed), so a waiting command costs no wake-ups."""
        while self.channel.recv(65536):
            pass

    def sleep(self, seconds: float) -> bool:
        """Sleep, returning early (False) if the client goes away."""
        end = time.monotonic() + seconds
        while (left := end - time.monotonic()) > 0:
            if self.gone():
                return False
            time.sleep(min(left, POLL_S))
        return True

    def path(self, word: str) -> str:
        """A shell word as an absolute path (`~` is the user's home, a relative path from the working directory)."""
        if word == "~" or word.startswith("~/"):
            word = self.server.home + word[1:]
        if not word.startswith("/"):
            word = posixpath.join(self.cwd, word)
        return posixpath.normpath(word)


def fake_pid(*words: str) -> int:
    """A process id a tool prints, the same for the same words (a host, a NIC): stable output across runs."""
    return 1000 + int(hashlib.sha256(" ".join(words).encode()).hexdigest()[:8], 16) % 60000
