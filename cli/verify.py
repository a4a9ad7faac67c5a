"""`steptp verify` and `steptp time`: check and measure transformations of LEIR programs.

Both read pairs either from a JSON Lines batch (one `{"id", "signature", "before", "after"}` per line)
or from two files of one program each plus a signature file, and print one JSON line per pair on
stdout, in input order. A line that cannot be understood gets status `invalid` with the reason (and
`"exception": {"type", "message", "file", "line"}` when something raised on it); the batch always
completes. Progress goes to stderr.
"""
from __future__ import annotations

import json
import os
import sys
from collections.abc import Iterator
from contextlib import nullcontext
from dataclasses import dataclass
from pathlib import Path
from typing import Annotated

import typer
from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

from cli.common import ITEM_ERRORS, Form, finite, read_lines, read_text

EXIT_OK, EXIT_SOME_FAILED, EXIT_USAGE = 0, 1, 2

BatchOpt = Annotated[Path | None, typer.Option(
    "--batch", "-b", help='JSON Lines of pairs {"id", "signature", "before", "after"}; "-" reads stdin.')]
SignatureOpt = Annotated[Path | None, typer.Option(
    "--signature", "-s", help="Signature JSON of the single pair BEFORE AFTER.")]
BeforeArg = Annotated[Path | None, typer.Argument(help="File with the original program (single-pair mode).")]
AfterArg = Annotated[Path | None, typer.Argument(help="File with the transformed program (single pair).")]
TargetOpt = Annotated[str, typer.Option("--target", help="llvm (CPU, default) or cuda (needs a GPU).")]
ArchOpt = Annotated[str, typer.Option("--arch", help="CUDA architecture when --target cuda.")]
FormOpt = Annotated[Form, typer.Option("--form", help="Lowering form of both sides: plain (loops and stores) or "
                                       "tensorir (TVM's block form); they compute the same values.")]


@dataclass(frozen=True)
class PairLine:
    """One input pair, or why it is malformed (`error`)."""

    id: object
    signature: object = None
    before: str = ""
    after: str = ""
    error: str = ""
    exception: dict | None = None  # what making its request raised, if it did


def register(app: typer.Typer) -> None:
    """Add this module's commands to `app`."""
    app.command("verify")(verify)
    app.command("time")(time_pairs)


def verify(batch: BatchOpt = None, signature: SignatureOpt = None, before: BeforeArg = None,
           after: AfterArg = None, target: TargetOpt = "llvm", arch: ArchOpt = "sm_90",
           workers: Annotated[int, typer.Option("--workers", "-j", min=0,
                                                help="Worker processes (0: one per core).")] = 0,
           draws: Annotated[int, typer.Option(min=1, help="Seeded input draws per pair.")] = 3,
           seed: Annotated[int, typer.Option(help="Seed of the input draws.")] = 0,
           timeout: Annotated[float, typer.Option(callback=finite, min=0.1, help="Seconds per pair before it is "
                                                  "reported as timeout.")] = 60.0,
           tolerances: Annotated[Path | None, typer.Option(
               help="YAML or JSON {dtype: {max_abs, max_rel, rel_l2}} overriding the default table "
                    "(the format of params.yaml verify.tolerance).")] = None,
           form: FormOpt = Form.plain):
    """Verify transformations: compare each AFTER with its BEFORE on seeded input draws.

    Prints one JSON line per pair, in input order: {"id", "status", "max_abs_err", "max_rel_err",
    "rel_l2_err", "draws", "error"}; status is exact, close, mismatch, build_error, runtime_error,
    timeout, crash or invalid.

    Exit status: 0 every pair exact or close; 1 at least one pair has another status; 2 bad usage
    (missing or unreadable files, options that do not go together).
    """
    from gpu_tasks.pool import WorkerPool
    from gpu_tasks.verify import iter_verify_pairs, pair_request

    table = _tolerance_mapping(tolerances)
    lines, requests = _requests(_pair_lines(batch, signature, before, after), lambda p: pair_request(
        p.before, p.after, p.signature, target=target, arch=arch, draws=draws, seed=seed, tolerances=table,
        form=form.value))
    size = max(1, min(workers or os.cpu_count() or 1, len(requests)))
    with WorkerPool(workers=size, timeout_s=timeout) if requests else nullcontext() as pool:
        results = iter_verify_pairs(requests, pool)
        failed = _emit(lines, results, _verification_row, lambda r: r.passed, "verifying")
    raise typer.Exit(EXIT_SOME_FAILED if failed else EXIT_OK)


def time_pairs(batch: BatchOpt = None, signature: SignatureOpt = None, before: BeforeArg = None,
               after: AfterArg = None, target: TargetOpt = "llvm", arch: ArchOpt = "sm_90",
               repeats: Annotated[int, typer.Option(min=3, help="Samples per side.")] = 7,
               min_repeat_ms: Annotated[int, typer.Option(min=1, help="Minimum length of one sample.")] = 50,
               timeout: Annotated[float, typer.Option(callback=finite, min=0.1, help="Seconds per pair.")] = 300.0,
               form: FormOpt = Form.plain):
    """Time transformations: BEFORE and AFTER measured interleaved, one pair at a time per machine.

    Prints one JSON line per pair, in input order: {"id", "status", "before_us", "after_us", "speedup",
    "spread", "repeats", "flagged", "fingerprint", "error"}; status is ok or the failure (invalid,
    build_error, runtime_error, timeout, crash). spread = interquartile range / median (larger side).

    Exit status: 0 every pair timed; 1 at least one pair failed; 2 bad usage.
    """
    from gpu_tasks.timing import iter_time_pairs, timing_pool, timing_request

    lines, requests = _requests(_pair_lines(batch, signature, before, after), lambda p: timing_request(
        p.before, p.after, p.signature, target=target, arch=arch, repeats=repeats, min_repeat_ms=min_repeat_ms,
        form=form.value))
    with timing_pool(timeout_s=timeout) if requests else nullcontext() as pool:
        results = iter_time_pairs(requests, pool)
        failed = _emit(lines, results, _timing_row, lambda r: r.status == "ok", "timing")
    raise typer.Exit(EXIT_SOME_FAILED if failed else EXIT_OK)


# --- input -----------------------------------------------------------------------------------------

def _pair_lines(batch: Path | None, signature: Path | None, before: Path | None, after: Path | None
                ) -> list[PairLine]:
    if batch is not None:
        if signature is not None or before is not None or after is not None:
            _usage("--batch takes no BEFORE/AFTER files and no --signature (each line has its own)")
        return [_parse_line(n, text) for n, text in _read_lines(batch)]
    if signature is None or before is None or after is None:
        _usage("give --batch PAIRS.jsonl, or --signature SIG.json BEFORE AFTER")
    sig = _read_text(signature)
    try:
        sig_obj = json.loads(sig)
    except json.JSONDecodeError as e:
        _usage(f"{signature}: not JSON: {e}")
    return [PairLine(None, sig_obj, _read_text(before).strip(), _read_text(after).strip())]


def _requests(lines: list[PairLine], make) -> tuple[list[PairLine], list]:
    """The request of every well-formed line; a line whose request cannot be made (whatever it raises)
    becomes an error line with the exception, and the batch goes on."""
    from leir.errors import describe_exception

    out, requests = [], []
    for line in lines:
        if not line.error:
            try:
                requests.append(make(line))
            except ITEM_ERRORS as e:
                info = describe_exception(e)
                line = PairLine(line.id, error=f"{info['type']}: {info['message']}", exception=info)
        out.append(line)
    return out, requests


def _tolerance_mapping(path: Path | None) -> dict | None:
    """The tolerance file as a mapping, checked here so that a bad file is a usage error."""
    if path is None:
        return None
    import yaml

    from gpu_tasks.tolerances import tolerance_table

    try:
        mapping = yaml.safe_load(_read_text(path))
        tolerance_table(mapping)
    except (yaml.YAMLError, AttributeError, KeyError, TypeError, ValueError) as e:
        _usage(f"{path}: not a tolerance table {{dtype: {{max_abs, max_rel, rel_l2}}}}: {e}")
    return mapping


def _read_lines(path: Path) -> Iterator[tuple[int, str]]:
    return read_lines(str(path))[1]


def _read_text(path: Path) -> str:
    return read_text(path)[1]


def _parse_line(lineno: int, text: str) -> PairLine:
    where = f"line {lineno}"
    try:
        obj = json.loads(text)
    except json.JSONDecodeError as e:
        return PairLine(None, error=f"{where}: not JSON: {e}")
    if not isinstance(obj, dict):
        return PairLine(None, error=f'{where}: expected an object {{"id", "signature", "before", "after"}}')
    pair_id = obj.get("id")
    missing = [k for k in ("id", "signature", "before", "after") if k not in obj]
    if missing:
        return PairLine(pair_id, error=f"{where}: missing {', '.join(missing)}")
    for key in ("before", "after"):
        if not isinstance(obj[key], str):
            return PairLine(pair_id, error=f"{where}: {key} must be LEIR text (a string)")
    if not isinstance(obj["signature"], dict | str):
        return PairLine(pair_id, error=f"{where}: signature must be an object")
    return PairLine(pair_id, obj["signature"], obj["before"], obj["after"])


def _usage(message: str):
    typer.echo(f"error: {message}", err=True)
    raise typer.Exit(EXIT_USAGE)


# --- output ----------------------------------------------------------------------------------------

def _emit(lines: list[PairLine], results: Iterator, row, passed, verb: str) -> bool:
    """Print one row per line in input order, with a progress bar on stderr; True if any failed."""
    failed = False
    console = Console(stderr=True)
    columns = (TextColumn(f"[bold]{verb}"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn())
    with Progress(*columns, console=console, transient=True) as progress:
        task = progress.add_task(verb, total=len(lines))
        for line in lines:
            if line.error:
                out, ok = {"id": line.id, **_invalid_row(row, line.error)}, False
                if line.exception:
                    out["exception"] = line.exception
            else:
                result = next(results)
                out, ok = {"id": line.id, **row(result)}, passed(result)
            failed |= not ok
            sys.stdout.write(json.dumps(out) + "\n")
            sys.stdout.flush()
            progress.advance(task)
    return failed


def _verification_row(v) -> dict:
    j = v.to_json()
    return {k: j[k] for k in ("status", "max_abs_err", "max_rel_err", "rel_l2_err", "draws", "error")}


def _timing_row(t) -> dict:
    j = t.to_json()
    keys = ("status", "before_us", "after_us", "speedup", "spread", "repeats", "flagged", "fingerprint",
            "error")
    return {k: j[k] for k in keys}


def _invalid_row(row, error: str) -> dict:
    from gpu_tasks.timing import Timing
    from gpu_tasks.verification import failure

    placeholder = failure("invalid", error) if row is _verification_row else Timing("invalid", error=error)
    return row(placeholder)
