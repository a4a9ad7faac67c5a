"""`steptp leir ...`: format, check and hash LEIR programs, one program per line."""
from __future__ import annotations

import json
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Annotated

import typer

from leir.errors import LeirError, LeirSyntaxError, SignatureError
from leir.parse import parse_program
from leir.printer import format_program
from leir.signature import Signature

app = typer.Typer(
    help="Work with LEIR text: canonical formatting, validation against a signature, alpha-hashing. "
         "FILE holds one program per line ('-' reads standard input); blank lines are skipped.",
    no_args_is_help=True,
)

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


@app.command("fmt")
def fmt(file: FileArg):
    """Print each program in canonical form (no whitespace, minimal parentheses), in input order.

    A line that does not parse prints nothing on stdout and `FILE:LINE:COL: error: ...` on stderr;
    the command goes on. Exit status: 0 all lines parsed, 2 some line failed.
    """
    name, lines = read_lines(file)
    failed = False
    for lineno, text in lines:
        try:
            typer.echo(format_program(parse_program(text)))
        except LeirSyntaxError as e:
            failed = True
            typer.echo(syntax_message(name, lineno, e), err=True)
    raise typer.Exit(2 if failed else 0)


@app.command("check")
def check(file: FileArg, signature: SignatureOpt):
    """Validate each program against the signature; print one JSON object per program.

    `{"ok": true, "intermediates": {name: {"shape", "dtype", "scope"}}, "nests": N}` or
    `{"ok": false, "errors": [{"code", "message", "nest", "statement"}, ...]}` (syntax errors carry
    `line` and `column`). Exit status: 0 all valid, 1 some program invalid, 2 unusable signature/file.
    """
    from leir.validate import intermediates_json, validate

    sig = load_signature(signature)
    name, lines = read_lines(file)
    invalid = False
    for lineno, text in lines:
        try:
            program = parse_program(text)
        except LeirSyntaxError as e:
            invalid = True
            err = {"code": "syntax", "message": e.message(), "line": lineno + e.line - 1, "column": e.column}
            typer.echo(json.dumps({"ok": False, "errors": [err]}))
            continue
        problems = validate(program, sig)
        if problems:
            invalid = True
            typer.echo(json.dumps({"ok": False, "errors": [p.to_json() for p in problems]}))
        else:
            typer.echo(json.dumps({"ok": True, "intermediates": intermediates_json(program, sig),
                                   "nests": len(program.nests)}))
    raise typer.Exit(1 if invalid else 0)


@app.command("hash")
def hash_(file: FileArg,
          signature: Annotated[Path | None, typer.Option("--signature", "-s", help="Signature JSON; without "
                                                         "it, known tensors are inferred (never written = "
                                                         "input, never read = output).")] = None):
    """Print one alpha-equivalence hash (sha256 hex) per program: programs that differ only in the
    names of intermediates and loop indices hash the same. Exit 2 if a line failed to parse."""
    from leir.canon import alpha_hash

    sig = load_signature(signature) if signature is not None else None
    name, lines = read_lines(file)
    failed = False
    for lineno, text in lines:
        try:
            typer.echo(alpha_hash(parse_program(text), sig))
        except LeirSyntaxError as e:
            failed = True
            typer.echo(syntax_message(name, lineno, e), err=True)
        except LeirError as e:
            failed = True
            typer.echo(f"{name}:{lineno}: error: {e}", err=True)
    raise typer.Exit(2 if failed else 0)
