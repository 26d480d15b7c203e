"""What every output parser shares: one error type that says what was expected."""
from __future__ import annotations


class ParseError(ValueError):
    """Tool output did not have the expected shape. The message names what was expected and what came."""

    def __init__(self, expected: str, got: str):
        shown = got if len(got) <= 120 else got[:117] + "..."
        super().__init__(f"expected {expected}, got {shown!r}")
        self.expected, self.got = expected, got


def single_line(text: str, what: str) -> str:
    """The one line of a sysfs-style file (trailing newline optional)."""
    stripped = text.strip()
    if not stripped or "\n" in stripped:
        raise ParseError(f"one line of {what}", text)
    return stripped
