"""The live bench of one run, between the runner and the steps (labgrid's Target + Strategy, pytest-embedded's
one log): guarded circuits (`circuits`), one observation log with `expect()` (`observe`), the stage table and
the pure conversion from observations to stage events (`stages`), and all emulator glue (`emulated`).

Steps say what to do; this package keeps the bench safe and turns host lines into events."""
from __future__ import annotations

from devices.errors import DeviceError


class BenchBroken(DeviceError):
    """An unrecoverable fault: the bench is latched broken and what depends on it is skipped. `causes`:
    the transient faults met on the way (each retry)."""

    def __init__(self, message: str, causes: list[str] | None = None):
        super().__init__(message)
        self.causes = list(causes or [])
