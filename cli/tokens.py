"""`steptp tokens`: token counts of LEIR programs against their TVMScript (TensorIR and plain) and CUDA
lowerings."""
from __future__ import annotations

import json
from pathlib import Path
from typing import Annotated

import typer

from cli.common import fail, load_signature, program_batch, read_text

BATCH_KEYS = ("id", "leir_tokens", "tensorir_tokens", "tir_tokens", "cuda_tokens", "error")


def tokens_command(
    file: Annotated[str | None, typer.Argument(help="File holding one LEIR program, or '-' for stdin.")] = None,
    signature: Annotated[Path | None, typer.Option("--signature", "-s", help="Signature JSON of FILE.")] = None,
    batch: Annotated[str | None, typer.Option(help='JSONL file (or "-"), one {"id", "signature", "leir"} '
                                              "per line.")] = None,
    workers: Annotated[int, typer.Option(min=1, help="Programs lowered at once, on threads (helps only with idle "
                                         "cores: the lowering mostly holds the GIL).")] = 1,
):
    """Count tokens (Qwen2.5/Qwen3 vocabulary) of the canonical LEIR, the TVMScript of its lowering in
    both forms and the CUDA source for sm_90. Nothing is executed and no GPU is needed, so any shape works.

    One program: `steptp tokens --signature SIG.json FILE` prints one JSON object with every count
    (tensorir_tokens: the TensorIR block form for the CPU; tir_tokens / tir_gpu_tokens: the plain
    form for the CPU and the GPU target; CUDA with and without TVM's preamble).
    Batch: `steptp tokens --batch PROGRAMS.jsonl` prints one line per program, in input order:
    {"id", "leir_tokens", "tensorir_tokens", "tir_tokens", "cuda_tokens", "error"} (CPU target). A bad
    line gets an error (counts null where they could not be made; "exception": {"type", "message",
    "file", "line"} when counting it raised) and the batch goes on; progress on stderr.
    Exit status 2 when some program had an error.
    """
    if batch is not None:
        if file is not None or signature is not None:
            fail("--batch takes no FILE or --signature")
        raise typer.Exit(run_batch(batch, workers))
    if file is None or signature is None:
        fail("give FILE and --signature, or --batch PROGRAMS.jsonl")
    raise typer.Exit(run_single(file, signature))


def run_single(file: str, signature: Path) -> int:
    from flows.token_stats import TOKENIZER, count_program
    from leir.errors import LeirSyntaxError
    from leir.parse import parse_program

    sig = load_signature(signature)
    name, text = read_text(file)
    try:
        parse_program(text)
    except LeirSyntaxError as e:
        typer.echo(f"{name}:{e.line}:{e.column}: error: {e.message()}", err=True)
        return 2
    counts = count_program(text, sig)
    typer.echo(json.dumps({**counts, "tokenizer": TOKENIZER}, sort_keys=False))
    if counts["error"]:
        typer.echo(f"error: {counts['error']}", err=True)
        return 2
    return 0


def run_batch(path: str, workers: int) -> int:
    from rich.console import Console
    from rich.progress import Progress

    from flows.token_stats import count_many

    entries = list(program_batch(path))
    jobs = [e["job"] for e in entries if "job" in e]
    failed = False
    with Progress(console=Console(stderr=True), transient=True) as progress:
        bar = progress.add_task("lowering and counting", total=len(jobs))
        results = count_many(jobs, workers, on_done=lambda: progress.advance(bar))
        for entry in entries:
            out = dict.fromkeys(BATCH_KEYS) | {"id": entry["id"]}
            if "job" in entry:
                result = next(results)
                out |= {k: v for k, v in result.items() if k in BATCH_KEYS}
                if out["error"]:
                    out["error"] = f"line {entry['line']}: {out['error']}"
                if result.get("exception"):
                    out["exception"] = result["exception"]
            else:
                out["error"] = entry["error"]
            failed = failed or out["error"] is not None
            typer.echo(json.dumps(out))
    return 2 if failed else 0


def register(app: typer.Typer) -> None:
    """Add `steptp tokens` to `app`."""
    app.command("tokens")(tokens_command)
