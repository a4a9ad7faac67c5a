"""What the command groups share: reading FILE or stdin line by line, loading a signature, failing
with a one-line message and exit code 2, and `FILE:LINE:COL: error: ...` for syntax errors."""
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


def read_lines(file: str) -> tuple[str, Iterator[tuple[int, str]]]:
    """(display name, iterator of (line number, text)) over the non-blank lines of FILE or stdin."""
    if file == "-":
        name, lines = "<stdin>", sys.stdin.read().splitlines()
    else:
        path = Path(file)
        try:
            lines = path.read_text(encoding="utf-8").splitlines()
        except (OSError, UnicodeDecodeError) as e:
            fail(f"cannot read {file}: {e}")
        name = file
    return name, ((i, line) for i, line in enumerate(lines, start=1) if line.strip())


def load_signature(path: Path) -> Signature:
    try:
        return Signature.from_json(path.read_text(encoding="utf-8"))
    except OSError as e:
        fail(f"cannot read signature {path}: {e}")
    except SignatureError as e:
        fail(f"{path}: {e}")


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
    try:
        text = sys.stdin.read() if path == "-" else Path(path).read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as e:
        fail(f"cannot read {path}: {e}")
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
