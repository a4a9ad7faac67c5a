"""`steptp lower`: print the TVMScript (TIR) or the CUDA source of one LEIR program."""
from __future__ import annotations

import sys
from enum import StrEnum
from pathlib import Path
from typing import Annotated

import typer

from cli.common import ITEM_ERRORS, Form, fail, item_error, load_signature, program_batch, read_text


class Target(StrEnum):
    llvm = "llvm"
    cuda = "cuda"


class Emit(StrEnum):
    tir = "tir"
    cuda = "cuda"


def lower_command(
    file: Annotated[str | None, typer.Argument(help="File holding one LEIR program, or '-' for stdin.")] = None,
    signature: Annotated[Path | None, typer.Option("--signature", "-s", help="Signature JSON "
                                                   '({"tensors": [{"name", "shape", "dtype", "role"}, ...]}).')]
    = None,
    target: Annotated[Target | None, typer.Option(help="llvm (the host CPU) or cuda. Default: cuda with "
                                                  "--emit cuda, llvm otherwise.")] = None,
    emit: Annotated[Emit, typer.Option(help="tir: TVMScript of the lowered PrimFunc; cuda: CUDA C source "
                                       "(no GPU or compiler needed).")] = Emit.tir,
    arch: Annotated[str, typer.Option(help="CUDA architecture.")] = "sm_90",
    batch: Annotated[str | None, typer.Option(help='JSONL file (or "-"), one {"id", "signature", "leir"} per '
                                              "line: one JSON line per program instead.")] = None,
    form: Annotated[Form, typer.Option(help="plain: loops and buffer stores (fast to build); tensorir: "
                                       "TVM's block form (T.sblock per statement, iterator kinds, reads/writes, "
                                       "T.init), which tvm.s_tir.Schedule and MetaSchedule accept. Both compute "
                                       "the same values.")] = Form.plain,
):
    """Lower one program to TVM TIR and print it (or its CUDA source).

    The output is deterministic: the same program and signature always print the same bytes, and
    parses back with `tvm.script.from_source`. Errors go to stderr as `FILE:LINE:COL: error: ...`
    (syntax) or `error: ...` (lowering), exit 2.

    Batch: `steptp lower --batch PROGRAMS.jsonl` prints one JSON line per program, in input order:
    {"id", "tir" (or "cuda"), "error"}; a program that cannot be lowered, whatever it raises, gets its
    error (and "exception": {"type", "message", "file", "line"}) and the batch goes on. Exit status 1
    when some program failed, 2 on bad usage.
    """
    kind = (target or (Target.cuda if emit is Emit.cuda else Target.llvm)).value
    if emit is Emit.cuda and kind != "cuda":
        fail("--emit cuda needs --target cuda")
    if batch is not None:
        if file is not None or signature is not None:
            fail("--batch takes no FILE or --signature")
        raise typer.Exit(_lower_batch(batch, kind, emit, arch, form.value))
    if file is None or signature is None:
        fail("give FILE and --signature, or --batch PROGRAMS.jsonl")
    from leir.errors import LeirError, LeirSyntaxError
    from leir.parse import parse_program

    sig = load_signature(signature)
    name, text = read_text(file)
    try:
        program = parse_program(text)
    except LeirSyntaxError as e:
        typer.echo(f"{name}:{e.line}:{e.column}: error: {e.message()}", err=True)
        raise typer.Exit(2) from None
    try:
        out = _lowered(program, sig, kind, emit, arch, form.value)
    except LeirError as e:
        fail(str(e))
    sys.stdout.write(out if out.endswith("\n") else out + "\n")


def _lowered(program, signature, kind: str, emit: Emit, arch: str, form: str) -> str:
    from leir.lower import cuda_source, lower_to_script  # imports TVM (~2 s): only when needed

    return (cuda_source(program, signature, arch, form) if emit is Emit.cuda
            else lower_to_script(program, signature, kind, form))


def _lower_batch(path: str, kind: str, emit: Emit, arch: str, form: str) -> int:
    import json

    from rich.console import Console
    from rich.progress import Progress

    from leir.parse import parse_program
    from leir.signature import Signature

    entries = list(program_batch(path))
    key = emit.value
    failed = False
    with Progress(console=Console(stderr=True), transient=True) as progress:
        bar = progress.add_task("lowering", total=len(entries))
        for entry in entries:
            out = {"id": entry["id"], key: None, "error": entry.get("error")}
            if "job" in entry:
                leir, sig = entry["job"]
                try:
                    out[key] = _lowered(parse_program(leir), Signature.from_json(sig), kind, emit, arch, form)
                except ITEM_ERRORS as e:  # whatever one program raises is its own line's error
                    out |= item_error(entry["line"], e)
            failed = failed or out["error"] is not None
            typer.echo(json.dumps(out))
            progress.advance(bar)
    return 1 if failed else 0


def register(app: typer.Typer) -> None:
    """Add `steptp lower` to `app`."""
    app.command("lower")(lower_command)
