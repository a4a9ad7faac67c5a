"""`steptp leir ...`: format, check and hash LEIR programs, one program per line."""
from __future__ import annotations

import json
from pathlib import Path
from typing import Annotated

import typer

from cli.common import FileArg, SignatureOpt, load_signature, read_lines, syntax_message
from leir.errors import LeirError, LeirSyntaxError
from leir.parse import parse_program
from leir.printer import format_program

app = typer.Typer(
    help="Work with LEIR text: canonical formatting, validation against a signature, alpha-hashing. "
         "FILE holds one program per line ('-' reads standard input); blank lines are skipped.",
    no_args_is_help=True,
)

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
