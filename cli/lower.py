"""`steptp lower`: print the TVMScript (TIR) or the CUDA source of one LEIR program."""
from __future__ import annotations

import sys
from enum import StrEnum
from pathlib import Path
from typing import Annotated

import typer

from cli.common import Form, fail, load_signature


class Target(StrEnum):
    llvm = "llvm"
    cuda = "cuda"


class Emit(StrEnum):
    tir = "tir"
    cuda = "cuda"


def _read_text(file: str) -> tuple[str, str]:
    """(display name, text) of FILE, or of stdin for '-'."""
    if file == "-":
        return "<stdin>", sys.stdin.read()
    try:
        return file, Path(file).read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as e:
        fail(f"cannot read {file}: {e}")


def lower_command(
    file: Annotated[str, typer.Argument(help="File holding one LEIR program, or '-' for stdin.")],
    signature: Annotated[Path, typer.Option("--signature", "-s", help="Signature JSON "
                                            '({"tensors": [{"name", "shape", "dtype", "role"}, ...]}).')],
    target: Annotated[Target | None, typer.Option(help="llvm (the host CPU) or cuda. Default: cuda with "
                                                  "--emit cuda, llvm otherwise.")] = None,
    emit: Annotated[Emit, typer.Option(help="tir: TVMScript of the lowered PrimFunc; cuda: CUDA C source "
                                       "(no GPU or compiler needed).")] = Emit.tir,
    arch: Annotated[str, typer.Option(help="CUDA architecture.")] = "sm_90",
    form: Annotated[Form, typer.Option(help="plain: loops and buffer stores (fast to build); tensorir: "
                                       "TVM's block form (T.sblock per statement, iterator kinds, reads/writes, "
                                       "T.init), which tvm.s_tir.Schedule and MetaSchedule accept. Both compute "
                                       "the same values.")] = Form.plain,
):
    """Lower one program to TVM TIR and print it (or its CUDA source).

    The output is deterministic: the same program and signature always print the same bytes, and
    parses back with `tvm.script.from_source`. Errors go to stderr as `FILE:LINE:COL: error: ...`
    (syntax) or `error: ...` (lowering), exit 2.
    """
    from leir.errors import LeirError, LeirSyntaxError
    from leir.parse import parse_program

    kind = (target or (Target.cuda if emit is Emit.cuda else Target.llvm)).value
    if emit is Emit.cuda and kind != "cuda":
        fail("--emit cuda needs --target cuda")
    sig = load_signature(signature)
    name, text = _read_text(file)
    try:
        program = parse_program(text)
    except LeirSyntaxError as e:
        typer.echo(f"{name}:{e.line}:{e.column}: error: {e.message()}", err=True)
        raise typer.Exit(2) from None
    from leir.lower import cuda_source, lower_to_script  # imports TVM (~2 s): only when needed

    try:
        out = (cuda_source(program, sig, arch, form.value) if emit is Emit.cuda
               else lower_to_script(program, sig, kind, form.value))
    except LeirError as e:
        fail(str(e))
    sys.stdout.write(out if out.endswith("\n") else out + "\n")


def register(app: typer.Typer) -> None:
    """Add `steptp lower` to `app`."""
    app.command("lower")(lower_command)
