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
from enum import StrEnum
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


class AtSize(StrEnum):
    original = "original"
    shrunk = "shrunk"


def translate_files(
    files: Annotated[list[Path], typer.Argument(help="KernelBench-style problem files")],
    set_: Annotated[list[str] | None, typer.Option("--set", help="override a module constant: NAME=VALUE")] = None,
    max_elements: Annotated[int | None, typer.Option(help="shrink size constants for the verification: every "
                                                          "input at most N elements")] = None,
    at_size: Annotated[AtSize, typer.Option(help="original: emit the program at the file's own sizes (traced on "
                                            "the meta device) and verify the same program structure at the "
                                            "--max-elements instance; shrunk: emit the verified instance")]
    = AtSize.original,
    dtype: Annotated[str | None, typer.Option(help="translate for this float dtype (default: the inputs')")] = None,
    draws: Annotated[int, typer.Option(help="input draws for the verification")] = 3,
):
    """Translate PyTorch problem files to LEIR and verify each against PyTorch eager (float64).

    One JSON line per file: {"file", "ok", "leir", "signature", "verification", "error", "notes",
    "sizes"}. With --max-elements the verification runs on a shrunk instance; "sizes" gives the
    input shapes of the emitted program and of the verified instance (and the constants changed),
    and "same_structure" whether the two programs differ only in sizes (needed for "ok"). Whatever
    one file raises becomes its record ("exception": {"type", "message", "file", "line"}) and the
    batch goes on. Exit status 1 when any file failed.
    """
    results = []
    with Progress(console=Console(stderr=True), transient=True) as progress:
        task = progress.add_task("translating", total=len(files))
        for path in files:
            progress.update(task, description=f"translating {path.name}")
            result = translate_one(path, set_ or [], max_elements, dtype, draws, at_size)
            print(json.dumps(result), flush=True)
            results.append(result)
            progress.advance(task)
    raise typer.Exit(0 if all(r["ok"] for r in results) else 1)


def translate_one(path: Path, assignments: list[str], max_elements: int | None, dtype: str | None,
                  draws: int = 3, at_size: AtSize | str = AtSize.original) -> dict:
    """The JSON record of one file (never raises for a bad file: the error goes in the record)."""
    from leir.errors import LeirError, describe_exception
    from leir.frontend import translate
    from leir.frontend.kernelbench import load_problem, load_problem_meta, parse_assignment, read_constants
    from leir.frontend.sizes import same_structure

    record = {"file": str(path), "ok": False, "leir": None, "signature": None,
              "verification": {"status": None, "max_abs_err": None}, "error": None, "notes": []}
    try:
        overrides = dict(parse_assignment(a) for a in assignments)
        problem = load_problem(path, overrides, max_elements, strict=False)
        record["notes"] = problem.notes
        verified = translate(problem.model, problem.inputs, dtype)
        emitted, same = verified, True
        if AtSize(at_size) is AtSize.original and problem.shrunk:
            try:
                full = load_problem_meta(path, overrides)
                emitted = translate(full.model, full.inputs, dtype)
            except ITEM_ERRORS as e:  # e.g. Python that needs values: the verified instance is emitted instead
                record["notes"] = [*problem.notes, "the file's own sizes could not be traced on the meta device "
                                   f"({type(e).__name__}: {e}); the verified instance is emitted"]
            same = same_structure(emitted.program, verified.program)
            record["sizes"] = {"emitted": _shapes(emitted), "verified": _shapes(verified),
                               "constants_changed": {k: [read_constants(path, overrides).get(k), v]
                                                     for k, v in problem.shrunk.items()}}
            record["same_structure"] = same
        record["leir"], record["signature"] = emitted.text, emitted.signature.to_json()
        verification = _verify(verified, draws)
    except ITEM_ERRORS as e:  # one bad file never stops the batch: its error is its record
        record["error"] = str(e) if isinstance(e, LeirError) else f"{type(e).__name__}: {e}"
        record["exception"] = describe_exception(e, str(path))
        return record
    record["verification"] = {"status": verification.status, "max_abs_err": verification.to_json()["max_abs_err"]}
    record["ok"] = verification.passed and same
    record["error"] = verification.error or (None if same else "the program at the file's sizes differs from the "
                                             "verified instance in more than sizes (shrink less, or --at-size shrunk)")
    return record


def _shapes(translation) -> dict:
    return {t.name: list(t.shape) for t in translation.signature.tensors}


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
    for column in ("name", "kind", "family", "dtypes", "params (role: model values)"):
        table.add_column(column)
    for w in chosen:
        params = ", ".join(f"{p.name}={p.same_as}" if p.same_as else
                           f"{p.name}({p.role or 'fixed'}):{_span_text(p.values('default'))}" for p in w.params)
        table.add_row(w.name, w.kind, w.family, ",".join(w.dtypes), params)
    Console().print(table)


def _span_text(values: list[int]) -> str:
    return str(values[0]) if len(values) == 1 else f"{values[0]}..{values[-1]}"


@workloads_app.command("sample")
def sample_workload(
    name: Annotated[str, typer.Argument(help="workload name (see `steptp workloads list`)")],
    seed: Annotated[int, typer.Option(help="sampling seed")] = 0,
    count: Annotated[int, typer.Option(help="number of instances")] = 1,
    profile: Annotated[str, typer.Option(help="shape profile: tiny, default or release "
                                               "(workloads/shapes.py)")] = "default",
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
