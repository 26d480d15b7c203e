"""Input errors: every problem in a user's file names the file and the line (or row).

`InputError` is defined here, at the bottom, because the trace library must not import the harness; the
harness re-exports it (`harness.errors.InputError`), so there is one input error for both.
"""
from __future__ import annotations

import re

_LINE_BREAKS = re.compile(r"\s*[\r\n\v\f\x1c-\x1e\x85\u2028\u2029]+\s*")  # what str.splitlines splits on


class InputError(Exception):
    """Bad input from the user: a file, a URL, a name. Printed as `file:line: message`, exit code 2."""

    exit_code = 2

    def __init__(self, message: str, file: str | None = None, line: int | None = None):
        self.message, self.file, self.line = message, file, line
        super().__init__(self.format())

    def format(self) -> str:
        where = ""
        if self.file:
            where = f"{self.file}:{self.line}: " if self.line else f"{self.file}: "
        # one line whatever the message quotes (a library's multi-line reason, a value with a newline)
        return f"{where}{_LINE_BREAKS.sub(' ', str(self.message)).strip()}"


class TraceFormatError(InputError, ValueError):
    """A trace file is malformed. `line` is the 1-based line in the file (header = line 1 for CSV), or
    the 1-based row for Parquet; the CLI prints `file:line: message` and exits 2."""
