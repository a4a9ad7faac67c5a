"""`steptp translate` (PyTorch problem files -> verified LEIR) and `steptp workloads list|sample`.

translate prints one JSON line per file on stdout:
`{"file", "ok", "leir", "signature", "verification": {"status", "max_abs_err"}, "error"}`
(plus `"exception": {"type", "message", "file", "line"}` when the file raised: whatever one file
raises becomes its record and the batch goes on) and exits 1 when any file failed; the progress bar
goes to stderr.
"""
from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Annotated

import typer
from rich.console import Console
from rich.progress import Progress
from rich.table import Table

from cli.common import ITEM_ERRORS

workloads_app = typer.Typer(help="The catalogue of source programs: list workloads, sample instances.",
                            no_args_is_help=True)


def register(app: typer.Typer) -> None:
    """Add this module's commands to `app`."""
    app.command("translate")(translate_files)
    app.add_typer(workloads_app, name="workloads")


def translate_files(
    files: Annotated[list[Path], typer.Argument(help="KernelBench-style problem files")],
    set_: Annotated[list[str] | None, typer.Option("--set", help="override a module constant: NAME=VALUE")] = None,
    max_elements: Annotated[int | None, typer.Option(help="shrink size constants: every input at most N "
                                                          "elements")] = None,
    dtype: Annotated[str | None, typer.Option(help="translate for this float dtype (default: the inputs')")] = None,
    draws: Annotated[int, typer.Option(help="input draws for the verification")] = 3,
):
    """Translate PyTorch problem files to LEIR and verify each against PyTorch eager (float64)."""
    results = []
    with Progress(console=Console(stderr=True), transient=True) as progress:
        task = progress.add_task("translating", total=len(files))
        for path in files:
            progress.update(task, description=f"translating {path.name}")
            result = translate_one(path, set_ or [], max_elements, dtype, draws)
            print(json.dumps(result), flush=True)
            results.append(result)
            progress.advance(task)
    raise typer.Exit(0 if all(r["ok"] for r in results) else 1)


def translate_one(path: Path, assignments: list[str], max_elements: int | None, dtype: str | None,
                  draws: int = 3) -> dict:
    """The JSON record of one file (never raises for a bad file: the error goes in the record)."""
    from leir.errors import LeirError, describe_exception
    from leir.frontend import translate
    from leir.frontend.kernelbench import load_problem, parse_assignment

    record = {"file": str(path), "ok": False, "leir": None, "signature": None,
              "verification": {"status": None, "max_abs_err": None}, "error": None}
    try:
        overrides = dict(parse_assignment(a) for a in assignments)
        problem = load_problem(path, overrides, max_elements)
        translation = translate(problem.model, problem.inputs, dtype)
        record["leir"], record["signature"] = translation.text, translation.signature.to_json()
        verification = _verify(translation, draws)
    except ITEM_ERRORS as e:  # one bad file never stops the batch: its error is its record
        record["error"] = str(e) if isinstance(e, LeirError) else f"{type(e).__name__}: {e}"
        record["exception"] = describe_exception(e, str(path))
        return record
    record["verification"] = {"status": verification.status, "max_abs_err": verification.to_json()["max_abs_err"]}
    record["ok"] = verification.passed
    record["error"] = verification.error or None
    return record


def _verify(translation, draws: int):
    from gpu_tasks.verify import verify_against_reference

    return verify_against_reference(translation.program, translation.signature, translation.reference,
                                    draws=draws)


@workloads_app.command("list")
def list_workloads(
    as_json: Annotated[bool, typer.Option("--json", help="one JSON object per line")] = False,
    kind: Annotated[str | None, typer.Option(help="single or composite")] = None,
):
    """List the catalogue: name, kind, family, dtypes and shape parameters."""
    from workloads.registry import all_workloads

    chosen = [w for w in all_workloads() if kind is None or w.kind == kind]
    if as_json:
        for w in chosen:
            print(json.dumps(w.to_json()))
        return
    table = Table(title=f"{len(chosen)} workloads")
    for column in ("name", "kind", "family", "dtypes", "params (default profile)"):
        table.add_column(column)
    for w in chosen:
        params = ", ".join(f"{p.name}={_span_text(p.values('default'))}" for p in w.params)
        table.add_row(w.name, w.kind, w.family, ",".join(w.dtypes), params)
    Console().print(table)


def _span_text(values: list[int]) -> str:
    return str(values[0]) if len(values) == 1 else f"{values[0]}..{values[-1]}"


@workloads_app.command("sample")
def sample_workload(
    name: Annotated[str, typer.Argument(help="workload name (see `steptp workloads list`)")],
    seed: Annotated[int, typer.Option(help="sampling seed")] = 0,
    count: Annotated[int, typer.Option(help="number of instances")] = 1,
    profile: Annotated[str, typer.Option(help="default or full")] = "default",
    leir: Annotated[bool, typer.Option("--leir", help="also translate each instance to LEIR")] = False,
):
    """Deterministic instances of one workload (same seed and count, same shapes), as JSON lines."""
    from workloads.registry import get_workload
    from workloads.sampling import build, sample_instances

    try:
        workload = get_workload(name)
        instances = sample_instances(workload, seed, count, profile)
    except (KeyError, ValueError) as e:
        print(f"error: {e.args[0] if e.args else e}", file=sys.stderr)
        raise typer.Exit(2) from None
    for inst in instances:
        record = inst.to_json()
        if leir:
            from leir.frontend import translate

            module, inputs = build(workload, inst)
            translation = translate(module, inputs, inst.dtype)
            record["leir"], record["signature"] = translation.text, translation.signature.to_json()
        print(json.dumps(record))
