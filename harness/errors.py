"""User-facing errors: one clear line, exit code 2, never a traceback.

The class lives in `traces.errors` (the trace library must not import the harness); this is its harness name.
"""
from __future__ import annotations

from traces.errors import InputError

__all__ = ["InputError"]
