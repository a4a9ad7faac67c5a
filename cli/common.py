"""What the command groups share: reading FILE or stdin (`read_text`, the one reader of every command's
input files), line by line, loading a signature, failing with a one-line message and exit code 2, and
`FILE:LINE:COL: error: ...` for syntax errors."""
from __future__ import annotations

import json
import sys
from collections.abc import Iterator
from enum import StrEnum
from pathlib import Path
from typing import Annotated

import typer

from leir.errors import LeirSyntaxError, SignatureError
from leir.signature import Signature

# What one item of a batch may raise without stopping the batch: any error, and user code (a problem
# file) that calls exit(); Ctrl-C (KeyboardInterrupt) still stops the run.
ITEM_ERRORS = (Exception, SystemExit)


class Form(StrEnum):
    """The lowering forms of `leir.lower.FORMS` (listed here so that `--help` needs no TVM)."""

    plain = "plain"
    tensorir = "tensorir"


FileArg = Annotated[str, typer.Argument(help="File with one LEIR program per line, or '-' for stdin.")]
SignatureOpt = Annotated[Path, typer.Option("--signature", "-s", help="Signature JSON "
                                            '({"tensors": [{"name", "shape", "dtype", "role"}, ...]}).')]


def read_text(file: str | Path) -> tuple[str, str]:
    """(display name, text) of FILE, or of standard input for '-': the one way every command reads its
    input files. A file that cannot be read, or that is not UTF-8 text, ends the command with
    `error: cannot read FILE: REASON` and exit status 2 (never a traceback)."""
    name = "<stdin>" if str(file) == "-" else str(file)
    try:
        if str(file) != "-":
            data = Path(file).read_bytes()
        elif hasattr(sys.stdin, "buffer"):
            data = sys.stdin.buffer.read()
        else:  # a text stream without bytes underneath (already decoded)
            return name, sys.stdin.read()
        return name, data.decode("utf-8")
    except OSError as e:
        fail(f"cannot read {name}: {e.strerror or e}")
    except UnicodeDecodeError as e:
        line = data.count(b"\n", 0, e.start) + 1
        fail(f"cannot read {name}: not UTF-8 text (byte 0x{data[e.start]:02x} on line {line}, offset {e.start})")


def read_lines(file: str) -> tuple[str, Iterator[tuple[int, str]]]:
    """(display name, iterator of (line number, text)) over the non-blank lines of FILE or stdin."""
    name, text = read_text(file)
    return name, ((i, line) for i, line in enumerate(text.splitlines(), start=1) if line.strip())


def load_signature(path: Path) -> Signature:
    _, text = read_text(path)
    try:
        return Signature.from_json(text)
    except SignatureError as e:
        fail(f"{path}: {e}")


def finite(value: float | None) -> float | None:
    """Typer callback of float options: NaN and infinities are not numbers of seconds or shares
    (click's range check lets NaN through, since every comparison with it is false)."""
    import math

    if value is not None and not math.isfinite(value):
        raise typer.BadParameter(f"{value} is not a finite number")
    return value


def fail(message: str, code: int = 2):
    typer.echo(f"error: {message}", err=True)
    raise typer.Exit(code)


def syntax_message(file: str, lineno: int, err: LeirSyntaxError) -> str:
    """`FILE:LINE:COL: error: ...` where LINE is the line of FILE (one program per line)."""
    line = lineno + err.line - 1
    return f"{file}:{line}:{err.column}: error: {err.message()}"


def program_batch(path: str) -> Iterator[dict]:
    """The lines of a program batch (JSON Lines `{"id", "signature", "leir"}`, "-" for stdin):
    `{"id", "line", "job": (leir, signature)}` per good line, `{"id", "error"}` per bad one."""
    _, text = read_text(path)
    for lineno, line in enumerate(text.splitlines(), start=1):
        if not line.strip():
            continue
        try:
            obj = json.loads(line)
        except json.JSONDecodeError as e:
            yield {"id": None, "error": f"line {lineno}: not JSON: {e.msg}"}
            continue
        if not isinstance(obj, dict):
            yield {"id": None, "error": f"line {lineno}: expected an object {{id, signature, leir}}"}
            continue
        missing = [k for k in ("signature", "leir") if k not in obj]
        if missing or not isinstance(obj.get("leir"), str):
            what = f"missing {', '.join(missing)}" if missing else "leir must be a string"
            yield {"id": obj.get("id"), "error": f"line {lineno}: {what}"}
            continue
        yield {"id": obj.get("id"), "line": lineno, "job": (obj["leir"], obj["signature"])}


def item_error(lineno: int | None, error: BaseException) -> dict:
    """`{"error", "exception"}` of a batch item that raised: the line, the type and message, and where."""
    from leir.errors import describe_exception

    info = describe_exception(error)
    prefix = f"line {lineno}: " if lineno else ""
    return {"error": f"{prefix}{info['type']}: {info['message']}", "exception": info}
