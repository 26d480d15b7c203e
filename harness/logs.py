"""Where the harness's words go. Stdout carries a command's result only (a table, `--json`); everything
else — progress bars, run summaries, logs, warnings — goes to stderr through one console, plain (no colour,
no box drawing, no wrapping) when stderr is not a terminal. `-v` shows INFO logs (paramiko's connections
among them), `--debug` DEBUG logs and every wire record.

A run keeps two files in its directory (`run_logs`):
- console.log: what the console showed, or would have shown without `-q` (progress bars aside), plain text;
- wire.log: the devices' wire records (devices.wirelog): switch protocol bytes both ways, SSH commands with
  their exit status and time, one line each: `T_NS PEER ARROW TEXT` (T_NS on the harness clock).
Every secret the bench holds (`secrets_of`) is replaced by *** in both before a line is written.
"""
from __future__ import annotations

import contextlib
import dataclasses
import logging
import re
import sys
from datetime import datetime, timezone
from pathlib import Path
from typing import Iterator

from rich.console import Console
from rich.table import Table

from devices.timing import now_ns
from devices.wirelog import WIRE

CONSOLE_LOG, WIRE_LOG = "console.log", "wire.log"
WIDE = 4096  # a console that is not a terminal never wraps: a piped line stays one line
_HIDDEN = "***"
_PADDING = re.compile(r"[ \t]+(?=\n)")


_secrets: list[str] = []  # of the benches in use in this process, the longest first (one may hold another)


def scrub(text: str) -> str:
    """`text` with every known secret shown as ***."""
    for secret in _secrets:
        if secret in text:
            text = text.replace(secret, _HIDDEN)
    return text


def secrets_of(bench) -> set[str]:
    """Every resolved secret of a devices.resources.Bench: a resource's password or passphrase fields."""
    found = set()
    for resource in [*bench.ocs.values(), *bench.hosts.values()]:
        for f in dataclasses.fields(resource):
            value = getattr(resource, f.name)
            if ("password" in f.name or "passphrase" in f.name) and isinstance(value, str) and value:
                found.add(value)
    return found


def hide_secrets(bench) -> None:
    """From now on, the bench's secrets never reach the console, console.log or wire.log."""
    _secrets[:] = sorted(set(_secrets) | secrets_of(bench), key=len, reverse=True)


# ------------------------------------------------------------------------------------------ the console
class _Scrubbed:
    """A text file that hides the secrets in what it is given (and, not a terminal, a table's padding at the
    ends of lines)."""

    def __init__(self, file):
        self.file = file
        self.plain = not file.isatty()

    def write(self, text: str) -> int:
        return self.file.write(scrub(_PADDING.sub("", text) if self.plain else text))

    def flush(self) -> None:
        self.file.flush()

    def isatty(self) -> bool:
        return self.file.isatty()

    @property
    def encoding(self) -> str:
        return getattr(self.file, "encoding", None) or "utf-8"

    def fileno(self) -> int:
        return self.file.fileno()


_stderr: tuple[object, Console] | None = None  # (the sys.stderr it was made for, the console)
_run_consoles: list[Console] = []  # the running run's console.log (two runs in one process: each its own)


def console() -> Console:
    """The one stderr console (progress bars share it with `echo`, so a line printed while a bar is live
    goes above the bar). Plain and unwrapped when stderr is not a terminal."""
    global _stderr
    if _stderr is None or _stderr[0] is not sys.stderr:  # e.g. a test captured stderr since
        terminal = sys.stderr.isatty()
        made = Console(file=_Scrubbed(sys.stderr), highlight=False, emoji=False, soft_wrap=not terminal,
                       width=None if terminal else WIDE)
        _stderr = (sys.stderr, made)
    return _stderr[1]


def echo(*objects, quiet: bool = False, markup: bool = True) -> None:
    """Print to the console (not when `quiet`) and to the running run's console.log (always)."""
    sinks = ([] if quiet else [console()]) + _run_consoles
    boxes = {id(obj): obj.box for obj in objects if isinstance(obj, Table)}
    try:
        for sink in sinks:
            for obj in objects:
                if id(obj) in boxes:  # box drawing on a terminal only
                    obj.box = boxes[id(obj)] if sink.is_terminal else None
            sink.print(*objects, markup=markup)
    finally:
        for obj in objects:
            if id(obj) in boxes:
                obj.box = boxes[id(obj)]


def error_line(text: str) -> None:
    """One line on stderr, also in quiet mode (what stopped a run must never be silent)."""
    echo(" ".join(str(text).split()), markup=False)


# ------------------------------------------------------------------------------------------ levels
class _EchoHandler(logging.Handler):
    def emit(self, record: logging.LogRecord) -> None:
        try:
            echo(_wire_line(record) if record.name == WIRE.name else self.format(record), markup=False)
        except Exception:
            self.handleError(record)


_verbosity = 0


@contextlib.contextmanager
def verbosity(n: int = 0) -> Iterator[None]:
    """0: warnings and errors; 1 (-v): INFO too, paramiko's included; 2 (--debug): DEBUG, wire records too.
    Log lines and Python warnings go to the console (stderr) and the running run's console.log, until the
    block ends (a command run in-process leaves logging as it found it)."""
    global _verbosity
    root, paramiko_log = logging.getLogger(), logging.getLogger("paramiko")
    saved = _verbosity, root.level, paramiko_log.level
    _verbosity = n
    level = {0: logging.WARNING, 1: logging.INFO}.get(n, logging.DEBUG)
    handler = _EchoHandler(level)
    handler.setFormatter(logging.Formatter("%(levelname)s %(name)s: %(message)s"))
    root.addHandler(handler)
    root.setLevel(level)
    # paramiko logs every reset socket on its own threads and the harness reports transport failures itself:
    # quiet unless asked for
    paramiko_log.setLevel(logging.CRITICAL if n == 0 else level)
    _wire_level()
    logging.captureWarnings(True)
    try:
        yield
    finally:
        logging.captureWarnings(False)
        root.removeHandler(handler)
        _verbosity = saved[0]
        root.setLevel(saved[1])
        paramiko_log.setLevel(saved[2])
        _wire_level()


# ------------------------------------------------------------------------------------------ a run's files
def _wire_line(record: logging.LogRecord) -> str:
    """`T_NS PEER ARROW TEXT`, one such line per line of the record (devices.wirelog: a chunk read is one)."""
    head = f"{getattr(record, 't_ns', 0)} {getattr(record, 'peer', '-')} {getattr(record, 'arrow', '#')} "
    return scrub("\n".join(head + line for line in record.getMessage().split("\n")))


class _WireFormatter(logging.Formatter):
    def format(self, record: logging.LogRecord) -> str:
        return _wire_line(record)


_wire_handlers: list[logging.Handler] = []


def _wire_level() -> None:
    """Wire records are made only when someone keeps them: a run's wire.log, or --debug."""
    WIRE.setLevel(logging.DEBUG if _verbosity >= 2 or _wire_handlers else logging.WARNING)
    WIRE.propagate = _verbosity >= 2  # to the console with --debug only


@contextlib.contextmanager
def run_logs(run_dir: Path) -> Iterator[None]:
    """console.log and wire.log in `run_dir` (appended to: a resumed run continues them) while the run lasts."""
    run_dir = Path(run_dir)
    with open(run_dir / CONSOLE_LOG, "a", encoding="utf-8") as console_file:
        handler = logging.FileHandler(run_dir / WIRE_LOG, encoding="utf-8")
        handler.setFormatter(_WireFormatter())
        t_ns, utc = now_ns(), datetime.now(timezone.utc).isoformat(timespec="microseconds")
        handler.stream.write(f"# {run_dir.name}: T_NS PEER ARROW TEXT; T_NS on the harness clock (CLOCK_MONOTONIC), "
                             f"{t_ns} = {utc}; > sent, < received (control bytes escaped), $ an SSH command, "
                             "= its end, # the channel\n")
        sink = Console(file=_Scrubbed(console_file), highlight=False, emoji=False, soft_wrap=True, width=WIDE,
                       color_system=None, force_terminal=False)
        _run_consoles.append(sink)
        _wire_handlers.append(handler)
        WIRE.addHandler(handler)
        _wire_level()
        try:
            yield
        finally:
            WIRE.removeHandler(handler)
            _wire_handlers.remove(handler)
            _wire_level()
            handler.close()
            _run_consoles.remove(sink)
