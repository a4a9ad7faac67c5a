"""The project's LEIR errors: every failure on bad input is one of these, with a position."""
from __future__ import annotations


class LeirError(Exception):
    """Base class of every error the `leir` package raises on bad input."""


class LeirSyntaxError(LeirError):
    """Text that is not LEIR: 1-based line and column, what was found, what was expected."""

    def __init__(self, line: int, column: int, found: str, expected: list[str], detail: str = ""):
        self.line, self.column, self.found, self.expected, self.detail = line, column, found, expected, detail
        super().__init__(self.message())

    def message(self) -> str:
        msg = self.detail or f"unexpected {self.found}"
        if self.expected:
            msg += ", expected " + _one_of(self.expected)
        return msg

    def __str__(self) -> str:
        return f"{self.line}:{self.column}: error: {self.message()}"


class SignatureError(LeirError):
    """A signature that is malformed (JSON form of LEIR.md §4.2)."""


def _one_of(items: list[str]) -> str:
    if len(items) == 1:
        return items[0]
    if len(items) <= 24:
        return "one of " + ", ".join(items)
    return "one of " + ", ".join(items[:24]) + f", ... ({len(items)} in all)"
