"""`steptp translate` (PyTorch problem files -> verified LEIR) and `steptp workloads list|sample`.

translate prints one JSON line per file on stdout:
`{"file", "ok", "leir", "signature", "verification": {"status", "max_abs_err"}, "error"}`
(plus `"exception": {"type", "message", "file", "line"}` when the file raised: whatever one file
raises becomes its record and the batch goes on) and exits 1 when any file failed; the progress bar
goes to stderr.

Each file runs in a process of its own (`gpu_tasks.pool.WorkerPool`, forked from this one after it
imported PyTorch and TVM, one fresh process per file) with a time limit and a memory limit; the
record is made in this process from the dict the file's process returns, and printed here. So a
file that hangs, exits, crashes, exhausts memory, raises KeyboardInterrupt or replaces `json.dumps`
costs its own record (with `"cause"`: timeout, exit, signal, memory, interrupted), never the batch or
another file's record. This is isolation from mistakes, not a sandbox: the file still runs as the
user, with the user's rights.
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

from cli.common import ITEM_ERRORS, fail, finite

workloads_app = typer.Typer(help="The catalogue of source programs: list workloads, sample instances.",
                            no_args_is_help=True)

DEFAULT_TIMEOUT_S = 300.0     # per file: tracing, shrinking probes and verification, on a busy 2-core machine
DEFAULT_MEMORY_MB = 4096      # per file, resident memory beyond what its process starts with (PyTorch, TVM)
AUTO_MAX_ELEMENTS = 4096      # the shrunk instance when the file's own sizes are too large to verify
# Verifying a program holds about this many times its buffers at once (the inputs of each draw, PyTorch's
# reference, the program's output, the comparison): KernelBench's 40_LayerNorm at its own sizes, 802 MiB
# of buffers, peaked at 8.8 GiB resident. The own sizes are verified only when that fits in --memory.
VERIFY_MEMORY_FACTOR = 12
EXIT_INTERRUPTED = 130


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
    max_elements: Annotated[int | None, typer.Option(min=1, help="shrink size constants for the verification: every "
                                                     "input at most N elements (default: the file's own sizes when "
                                                     "they can be verified, else at most "
                                                     f"{AUTO_MAX_ELEMENTS})")] = None,
    at_size: Annotated[AtSize, typer.Option(help="original: emit the program at the file's own sizes (traced on "
                                            "the meta device) and verify the same program structure at the "
                                            "shrunk instance; shrunk: emit the verified instance")]
    = AtSize.original,
    dtype: Annotated[str | None, typer.Option(help="translate for this float dtype (default: the inputs')")] = None,
    draws: Annotated[int, typer.Option(min=1, help="input draws for the verification")] = 3,
    timeout: Annotated[float, typer.Option(callback=finite, min=1.0,
                                           help="seconds each file may take (loading, tracing, verifying) before "
                                                "its process is killed and its record says timeout")]
    = DEFAULT_TIMEOUT_S,
    memory: Annotated[int, typer.Option(min=64, help="MiB of resident memory each file's process may use beyond "
                                        "what it starts with (PyTorch and TVM imported) before it is killed and "
                                        "its record says memory; a file's own sizes are verified only when "
                                        f"their buffers take at most 1/{VERIFY_MEMORY_FACTOR} of it")
                ] = DEFAULT_MEMORY_MB,
    workers: Annotated[int, typer.Option(min=1, help="files translated at once, each in its own process")] = 1,
):
    """Translate PyTorch problem files to LEIR and verify each against PyTorch eager (float64).

    One JSON line per file, in the order given: {"file", "ok", "leir", "signature", "verification",
    "error", "notes", "sizes", "verified_at"}. A program too large to verify at the file's own sizes is
    verified on a shrunk instance (every input at most --max-elements elements; "verified_at" says
    "own_size" or "shrunk") that makes the own-size program's size-dependent choices (a sum of more
    than 2^14 terms per element in two stages); "sizes" then gives the input shapes of the emitted
    program and of the verified instance (and the constants changed), and "same_structure" whether the
    two programs differ only in sizes and size-derived constants (needed for "ok"). A tensor the
    module builds in forward (`torch.tensor([...])`) is an input of the program, as a parameter is;
    "constants" gives its values and "notes" says so.

    Each file runs in its own process, limited by --timeout and --memory: whatever one file raises,
    and a hang, an exit, a crash or memory exhaustion, becomes its record ("exception": {"type",
    "message", "file", "line"}; "cause": timeout, exit, signal, memory or interrupted) and the batch
    goes on. Ctrl-C stops the batch (exit 130). Exit status 1 when any file failed.
    """
    from leir.frontend.kernelbench import ProblemError, parse_assignment

    assignments = set_ or []
    try:
        for assignment in assignments:
            parse_assignment(assignment)
    except ProblemError as e:
        fail(str(e))
    _warm_imports()
    from gpu_tasks.pool import Job, WorkerPool

    options = (assignments, max_elements, dtype, draws, AtSize(at_size).value, memory)
    jobs = [Job(translate_job, (str(path), *options), timeout_s=timeout) for path in files]
    failed, done = False, 0
    try:
        # auto_refresh off: no progress thread may hold a lock while a file's process is forked
        with Progress(console=Console(stderr=True), transient=True, auto_refresh=False) as progress:
            task = progress.add_task("translating", total=len(files))
            with WorkerPool(workers=min(workers, max(1, len(files))), timeout_s=timeout, start_method="fork",
                            memory_mb=memory, max_jobs_per_worker=1) as pool:
                for index, result in pool.imap(jobs):
                    record = file_record(files[index], result, timeout, memory)
                    print(json.dumps(record), flush=True)
                    failed = failed or not record["ok"]
                    done += 1
                    progress.update(task, advance=1, description=f"translated {files[index].name}", refresh=True)
    except KeyboardInterrupt:
        typer.echo(f"interrupted: {done} of {len(files)} files translated", err=True)
        raise typer.Exit(EXIT_INTERRUPTED) from None
    raise typer.Exit(1 if failed else 0)


def _warm_imports() -> None:
    """What every file's process needs, made ready once here so that each fork starts warm: PyTorch,
    the frontend, TVM through the verifier, the LEIR parsers' tables, and the modules PyTorch imports
    only when a model is first traced (about a second per process otherwise), by translating a small
    model on the meta device. Nothing here runs a kernel or starts a thread pool (forking a process
    whose thread pools run is unsafe); tqdm's monitor thread, which tracing would start, is off."""
    import torch

    import gpu_tasks.verify  # noqa: F401
    import leir.frontend.kernelbench  # noqa: F401
    from leir.frontend import translate
    from leir.parse import _fast_parser, spec_parser

    try:
        import tqdm

        tqdm.tqdm.monitor_interval = 0
    except ImportError:
        pass
    _fast_parser("start")
    spec_parser("start")

    class Warm(torch.nn.Module):
        def forward(self, x, y):
            return torch.softmax(torch.relu(x @ y) * 0.5, dim=1).sum(dim=0)

    try:
        translate(Warm(), [torch.empty(4, 4, device="meta"), torch.empty(4, 4, device="meta")])
    except Exception:  # only an optimisation: each file's process imports what it needs anyway
        pass


# --- in the file's own process --------------------------------------------------------------------

def translate_job(path: str, assignments: list[str], max_elements: int | None, dtype: str | None, draws: int,
                  at_size: str, memory_mb: int = DEFAULT_MEMORY_MB) -> dict:
    """The record of one file, made in the file's own process (a `WorkerPool` job). The file's output
    goes to stderr (stdout carries the records); whatever it raises, KeyboardInterrupt included,
    becomes the record."""
    import faulthandler
    import os
    import signal

    from leir.errors import describe_exception

    sys.stdout.flush()
    os.dup2(2, 1)
    sys.stdout = sys.stderr
    # A crash in native code ends this process with its signal, which the record names; TVM's and
    # Python's crash handlers would only add pages of native backtrace to stderr.
    faulthandler.disable()
    for crash in (signal.SIGSEGV, signal.SIGBUS, signal.SIGILL, signal.SIGFPE):
        signal.signal(crash, signal.SIG_DFL)
    try:
        record = translate_one(Path(path), assignments, max_elements, dtype, draws, at_size, memory_mb)
    except BaseException as e:  # not the user's Ctrl-C (the batch's process handles that): the file's own
        record = _empty_record(Path(path))
        record["error"] = f"{type(e).__name__} raised by the problem file: {e}"
        record["exception"] = describe_exception(e, path)
        record["cause"] = "interrupted" if isinstance(e, KeyboardInterrupt) else "exception"
    if _out_of_memory(record.get("exception")):
        record["cause"] = "memory"
        record["error"] = f"memory: the file allocated past the memory limit ({record['error']})"
    return record


def _out_of_memory(info: dict | None) -> bool:
    """An allocation failed (the memory limit): Python's MemoryError, PyTorch's allocator error."""
    if not info:
        return False
    message = str(info.get("message") or "")
    return info.get("type") == "MemoryError" or any(m in message for m in ("can't allocate memory", "MemoryError"))


def _empty_record(path: Path) -> dict:
    return {"file": str(path), "ok": False, "leir": None, "signature": None,
            "verification": {"status": None, "max_abs_err": None}, "error": None, "notes": []}


def translate_one(path: Path, assignments: list[str], max_elements: int | None, dtype: str | None,
                  draws: int = 3, at_size: AtSize | str = AtSize.original,
                  memory_mb: int = DEFAULT_MEMORY_MB) -> dict:
    """The JSON record of one file (never raises for a bad file: the error goes in the record);
    `memory_mb`: what its verification may hold (the file's own sizes are verified only within it)."""
    from leir.errors import LeirError, describe_exception
    from leir.frontend import translate
    from leir.frontend.kernelbench import load_problem, load_problem_meta, parse_assignment, read_constants
    from leir.frontend.sizes import same_structure

    record = _empty_record(path)
    try:
        overrides = dict(parse_assignment(a) for a in assignments)
        full, too_large = None, ""
        if max_elements is None:
            full, too_large = _own_size(path, overrides, dtype, memory_mb)
            if too_large:
                max_elements = AUTO_MAX_ELEMENTS
        # shrinking on its own accord, the instance may shrink --set constants too (the emitted program
        # keeps them); asked with --max-elements, --set values stay as given
        problem = load_problem(path, overrides, max_elements, strict=False, shrink_overrides=bool(too_large))
        record["notes"] = problem.notes
        if too_large:
            record["notes"] = [f"the program at the file's own sizes is too large to verify ({too_large}); it is "
                               f"verified on a shrunk instance (every input at most {AUTO_MAX_ELEMENTS} elements)",
                               *problem.notes]
        original = AtSize(at_size) is AtSize.original and bool(problem.shrunk)
        if original and full is None:
            try:
                meta = load_problem_meta(path, overrides)
                full = translate(meta.model, meta.inputs, dtype)
            except ITEM_ERRORS as e:  # e.g. Python that needs values: the verified instance is emitted instead
                record["notes"] = [*record["notes"], "the file's own sizes could not be traced on the meta device "
                                   f"({type(e).__name__}: {e}); the verified instance is emitted"]
        # the instance makes the own-size program's size-dependent choices (a long sum in two stages), so
        # that the two programs differ only in sizes and size-derived constants
        follow = full is not None and original
        verified = translate(problem.model, problem.inputs, dtype, cascades=full.cascades if follow else None)
        emitted, same = (full if follow else verified), True
        record["verified_at"] = "shrunk" if problem.shrunk else "own_size"
        if original:
            same = same_structure(emitted.program, verified.program, emitted.size_constants + verified.size_constants)
            if follow and any(full.cascades):
                record["notes"] = [*record["notes"], f"{sum(full.cascades)} sum(s) of the own-size program run in "
                                   "two stages (more than 2^14 terms per element); the shrunk instance sums them "
                                   "the same way"]
            record["sizes"] = {"emitted": _shapes(emitted), "verified": _shapes(verified),
                               "constants_changed": {k: [read_constants(path, overrides).get(k), v]
                                                     for k, v in problem.shrunk.items()}}
            record["same_structure"] = same
        record["leir"], record["signature"] = emitted.text, emitted.signature.to_json()
        constants, notes = _constants_of(emitted, verified)
        record["notes"] = [*record["notes"], *notes]
        if constants:
            record["constants"] = constants
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


CONSTANT_VALUES_LISTED = 4096  # elements of a forward-built constant the record lists


def _constants_of(emitted, verified) -> tuple[dict, list[str]]:
    """The values (name -> nested lists, for those small enough to list) and a note per tensor the module
    builds in `forward`: the program takes each as an input (the published order puts constants after
    the inputs), so it equals the module only when called with these values; the verification draws
    random ones, as it does for parameters."""
    names = [t.name for t in emitted.signature.tensors if t.role == "input"]
    built = [n for n in names if n in verified.constants] if emitted is verified else []
    if not built and not verified.constants:
        return {}, []
    values = {n: verified.constants[n].tolist() for n in built if verified.constants[n].size <= CONSTANT_VALUES_LISTED}
    notes = [f"input {n} is the {list(verified.constants[n].shape)} tensor the module builds in forward (a constant, "
             "not a parameter): the program takes it as an input; call it with the values in 'constants'"
             + ("" if n in values else f" (not listed: more than {CONSTANT_VALUES_LISTED} elements)")
             for n in built] or [f"the module builds {len(verified.constants)} tensor(s) in forward; the program "
                                 "takes them as inputs after the forward inputs (values at the verified sizes only)"]
    return values, notes


def _own_size(path: Path, overrides: dict, dtype: str | None, memory_mb: int = DEFAULT_MEMORY_MB):
    """(the translation at the file's own sizes, traced on the meta device, and why it is too large to
    verify, "" when it is not: its statements within the guard's limit, its buffers within the guard's
    and within `memory_mb` / VERIFY_MEMORY_FACTOR); (None, "") when it cannot be traced there (Python
    that needs values): then the file is verified at its own sizes, as before."""
    from gpu_tasks.guard import buffer_bytes, limit_violation
    from leir.frontend import translate
    from leir.frontend.kernelbench import load_problem_meta

    try:
        meta = load_problem_meta(path, overrides)
        full = translate(meta.model, meta.inputs, dtype)
    except ITEM_ERRORS:
        return None, ""
    why = limit_violation(full.program, full.signature)
    budget = memory_mb * 2**20 // VERIFY_MEMORY_FACTOR
    if not why and (nbytes := buffer_bytes(full.program, full.signature)) > budget:
        why = (f"{nbytes:,} bytes of buffers exceed the limit of {budget:,} ({memory_mb} MiB of --memory / "
               f"{VERIFY_MEMORY_FACTOR}, what a verification holds at once)")
    return full, why


# --- back in the batch's process: the record from what came back --------------------------------

# Each field of a record, with the types it may have: a result that does not fit is no record.
RECORD_FIELDS = {"ok": (bool,), "leir": (str, type(None)), "signature": (dict, type(None)),
                 "verification": (dict,), "error": (str, type(None)), "notes": (list,), "sizes": (dict,),
                 "same_structure": (bool,), "exception": (dict,), "cause": (str,), "constants": (dict,),
                 "verified_at": (str,)}


def file_record(path: Path, result, timeout: float, memory: int) -> dict:
    """The record of `path` from what its process returned: a record (fields checked and copied; the
    file name is this process's), or a `JobFailure` (timeout, exit, signal) turned into one."""
    from gpu_tasks.pool import JobFailure

    record = _empty_record(path)
    if isinstance(result, JobFailure):
        cause, error = _failure_text(result, timeout, memory)
        return record | {"error": error, "cause": cause}
    if not isinstance(result, dict) or any(k in RECORD_FIELDS and not isinstance(v, RECORD_FIELDS[k])
                                           for k, v in result.items()):
        return record | {"error": "the file's process returned something that is not a record", "cause": "exception"}
    return record | {k: v for k, v in result.items() if k in RECORD_FIELDS}


def _failure_text(failure, timeout: float, memory: int) -> tuple[str, str]:
    if failure.kind == "timeout":
        return "timeout", (f"timeout: no record within the time limit of {timeout:g} s (--timeout); the file's "
                           "process was killed")
    if failure.kind == "memory":
        return "memory", (f"memory: the file's process used more than the memory limit of {memory} MiB "
                          "(--memory); it was killed")
    if failure.kind == "crash" and failure.exitcode is not None and failure.exitcode < 0:
        import signal

        name = signal.Signals(-failure.exitcode).name
        hint = " (by the system's out-of-memory killer, or another process)" if name == "SIGKILL" else ""
        return "signal", f"signal {name}: the file's process was killed{hint} before it returned a record"
    if failure.kind == "crash" and failure.exitcode is not None:
        return "exit", (f"exit status {failure.exitcode}: the file's process exited before it returned a record "
                        "(os._exit, or a crash in native code)")
    return "exception", f"the file's process failed: {failure.message}"


def _shapes(translation) -> dict:
    return {t.name: list(t.shape) for t in translation.signature.tensors}


def _verify(translation, draws: int):
    """As the generate stage judges an original: against PyTorch in float64, each draw's bounds raised
    to `verify.pytorch_error_factor` times PyTorch's own error in the program's dtype where that is
    larger (a float32 batch norm's own rounding is no fault of the translation)."""
    from flows.config import load_params, own_error_factor
    from gpu_tasks.verify import verify_against_reference

    return verify_against_reference(translation.program, translation.signature, translation.reference,
                                    draws=draws, own_fn=translation.reference_in_dtype,
                                    own_factor=own_error_factor(load_params()))


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
    count: Annotated[int, typer.Option(min=1, help="number of instances")] = 1,
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
