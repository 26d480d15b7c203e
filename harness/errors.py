"""User-facing errors: one clear line, exit code 2, never a traceback; and the run's stop on a signal.

The class lives in `traces.errors` (the trace library must not import the harness); this is its harness name.
"""
from __future__ import annotations

from traces.errors import InputError

__all__ = ["Aborted", "InputError"]


class Aborted(Exception):
    """SIGTERM (or SIGINT) arrived; the run stops and tears down."""

    def __init__(self, signame: str = "SIGTERM"):
        super().__init__(signame)
        self.signame = signame
