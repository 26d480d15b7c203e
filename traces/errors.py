"""Trace errors: every problem in a user's file names the file and the line (or row)."""
from __future__ import annotations

from harness.errors import InputError


class TraceFormatError(InputError, ValueError):
    """A trace file is malformed. `line` is the 1-based line in the file (header = line 1 for CSV), or
    the 1-based row for Parquet; the CLI prints `file:line: message` and exits 2."""
