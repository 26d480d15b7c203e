"""User-facing errors: one clear line, exit code 2, never a traceback."""
from __future__ import annotations


class InputError(Exception):
    """Bad input from the user: a file, a URL, a name. Printed as `file:line: message`, exit 2."""

    exit_code = 2

    def __init__(self, message: str, file: str | None = None, line: int | None = None):
        self.message, self.file, self.line = message, file, line
        super().__init__(self.format())

    def format(self) -> str:
        where = ""
        if self.file:
            where = f"{self.file}:{self.line}: " if self.line else f"{self.file}: "
        return f"{where}{self.message}"
