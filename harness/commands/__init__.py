"""One module per sub-command; see harness.cli. Here: what every command's arguments share.

Range-checked numeric command-line arguments: `type=integer(1, 10**7)`, `type=number(0, 3600, above=True)`.
A value out of range, not finite or not a number is argparse's own usage error (exit 2, one line, the range
named) before anything runs — a `--cycles 10**20` never reaches a plan it would have to build."""
from __future__ import annotations

import argparse
import math


def integer(low: int, high: int):
    def parse(text: str) -> int:
        try:
            value = int(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"expected an integer {low}..{high}, found {text[:40]!r}") from None
        if not low <= value <= high:
            raise argparse.ArgumentTypeError(f"expected an integer {low}..{high}, found {text[:40]}")
        return value
    parse.__name__ = "integer"
    return parse


def number(low: float, high: float, *, above: bool = False):
    """A finite number in [low, high] (`above`: low itself excluded)."""
    span = f"in ({low:g}, {high:g}]" if above else f"in [{low:g}, {high:g}]"

    def parse(text: str) -> float:
        try:
            value = float(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"expected a number {span}, found {text[:40]!r}") from None
        if not math.isfinite(value) or not (low < value if above else low <= value) or value > high:
            raise argparse.ArgumentTypeError(f"expected a finite number {span}, found {text[:40]}")
        return value
    parse.__name__ = "number"
    return parse


SEED = integer(0, 2**63 - 1)
TIMEOUT_S = number(0, 86400, above=True)
WORKERS = integer(1, 256)
