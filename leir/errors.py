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
    """A signature that is malformed (JSON form of docs/leir.md §4.2)."""


def _one_of(items: list[str]) -> str:
    if len(items) == 1:
        return items[0]
    if len(items) <= 24:
        return "one of " + ", ".join(items)
    return "one of " + ", ".join(items[:24]) + f", ... ({len(items)} in all)"


def describe_exception(error: BaseException, source: str | None = None) -> dict:
    """`{"type", "message", "file", "line"}` of an exception, for the error line of a batch item.

    The location is the innermost traceback frame in `source` (the user's own file, e.g. a problem
    file whose code raised) when the traceback passes through it, else the innermost frame; a
    `SyntaxError` gives its own file and line. `file` and `line` are None when nothing is known.
    """
    import os
    import traceback

    file, line = None, None
    if isinstance(error, SyntaxError) and error.filename:
        file, line = error.filename, error.lineno
    elif error.__traceback__ is not None:
        frames = traceback.extract_tb(error.__traceback__)
        wanted = os.path.realpath(source) if source else None
        chosen = [f for f in frames if wanted and os.path.realpath(f.filename) == wanted] or frames
        if chosen:
            file, line = chosen[-1].filename, chosen[-1].lineno
    message = error.message() if isinstance(error, LeirSyntaxError) else str(error)
    return {"type": type(error).__name__, "message": message, "file": file, "line": line}
