"""`steptp eval`: score model responses (evaluation.harness), three ways to say what to score:

- `steptp eval PREDICTIONS.jsonl`: lines `{"id", "signature", "original_IR", "response"}` (optional
  `"prompt"` or `"k"` for multi-answer prompts);
- `steptp eval --split test --predictions FILE [--lake lake]`: lines `{"sample_id" (or "id"),
  "response"}` scored against the lake's split (original, signature and prompt from the lake);
- `steptp eval --published FILE.jsonl`: the published release's chat JSONL, every answer re-verified
  (signature reconstructed from the prompt's wording), with a per-strategy count of exact, close and
  wrong answers.

With `--json`: one JSON line per input, in input order, then `{"summary": {<check>: <rate>, ..., "n": N}}`
(`--split test` adds `"summary_clean"`, the same rates over the test samples without structural overlap
with the train split; `--published` adds `"by_strategy"` to that last line). Without `--json`, `--split
test` prints both columns. Without: Rich tables. Progress on stderr.
Exit status 0 when every line was scored (whatever the scores), 2 on bad usage.
"""
from __future__ import annotations

import json
import os
import sys
from collections import Counter
from dataclasses import replace
from pathlib import Path
from typing import Annotated

import typer

from cli.common import finite, read_text
from cli.lake import DEFAULT_LAKE, LakeOpt

EXIT_OK, EXIT_USAGE = 0, 2


def register(app: typer.Typer) -> None:
    """Add this module's command to `app`."""
    app.command("eval")(evaluate_command)


def evaluate_command(
        predictions_file: Annotated[Path | None, typer.Argument(
            metavar="PREDICTIONS",
            help='JSON Lines {"id", "signature", "original_IR", "response"}; "-" reads stdin.')] = None,
        split: Annotated[str | None, typer.Option(
            help="Score against this split of the lake (e.g. test): the whole split and its clean part (no "
                 "structural overlap with train).")] = None,
        predictions: Annotated[Path | None, typer.Option(
            help='With --split: JSON Lines {"sample_id", "response"}.')] = None,
        published: Annotated[Path | None, typer.Option(
            help="Re-verify a published Step-TP chat JSONL file (messages: user prompt, assistant answer).")] = None,
        lake: LakeOpt = DEFAULT_LAKE,
        target: Annotated[str, typer.Option(help="llvm (CPU, default) or cuda (needs a GPU).")] = "llvm",
        as_json: Annotated[bool, typer.Option("--json", help="One JSON line per input, then a summary line.")] = False,
        workers: Annotated[int, typer.Option("--workers", "-j", min=0, help="Worker processes (0: one per core).")] = 0,
        no_time: Annotated[bool, typer.Option("--no-time", help="Skip timing (speedup_pass is null).")] = False,
        draws: Annotated[int, typer.Option(min=1, help="Seeded input draws per answer.")] = 3,
        seed: Annotated[int, typer.Option(help="Seed of the input draws.")] = 0,
        timeout: Annotated[float, typer.Option(callback=finite, min=0.1,
                                               help="Seconds per verification before timeout.")] = 60.0,
        repeats: Annotated[int, typer.Option(min=3, help="Timing samples per side.")] = 7,
        min_repeat_ms: Annotated[int, typer.Option(min=1, help="Minimum length of one timing sample.")] = 50,
        speedup_margin: Annotated[float, typer.Option(callback=finite,
            min=0.0, help="speedup_pass needs a speedup above 1 + this margin.")] = 0.05,
        label_cap: Annotated[int, typer.Option(
            min=1, help="At most this many transformations tried per strategy label check.")] = 500):
    """Score model responses: format, difference, build, execution, equality, speed, strategy label,
    number of answers.

    Give PREDICTIONS.jsonl, or --split test --predictions FILE (scored against the lake), or --published
    FILE (the published release re-verified, with exact / close / wrong counts per strategy).

    With --json: one JSON line per input, in input order, with "id", format_pass, different_pass,
    build_pass, execute_pass, equal_pass, close_pass, speedup_pass, strategy_label_pass (the answer
    verifies and is the named strategy: the library's result or the strategy's effect in another
    spelling), strategy_label_exact_pass (the library's result), require_num_pass, "status", "error"
    and "detail"; then {"summary": {check: rate, ..., "n": N}}.
    Exit status 0 once every line is scored, 2 on bad usage.
    """
    from evaluation.harness import EvalOptions

    options = EvalOptions(target=target, draws=draws, seed=seed, time=not no_time, speedup_margin=speedup_margin,
                          repeats=repeats, min_repeat_ms=min_repeat_ms, label_cap=label_cap)
    lines = _inputs(predictions_file, split, predictions, published, lake)
    if published is not None:
        options = replace(options, bare_json=True, strategy_keys=("applied_strategy", "applied_strategies"))
    results = _run(lines, options, workers, timeout)
    _report(results, as_json, published is not None, _clean_ids(split, lake) if split is not None else None)
    raise typer.Exit(EXIT_OK)


def _inputs(predictions_file, split, predictions, published, lake) -> list:
    from evaluation.inputs import lake_predictions, parse_predictions
    from evaluation.published import published_from_text
    from flows.lake_queries import split_sources

    modes = [predictions_file is not None, split is not None or predictions is not None, published is not None]
    if sum(modes) != 1:
        _usage("give PREDICTIONS.jsonl, or --split SPLIT --predictions FILE, or --published FILE")
    if predictions_file is not None:
        return parse_predictions(read_text(predictions_file)[1])
    if published is not None:
        return published_from_text(read_text(published)[1])
    if split is None or predictions is None:
        _usage("--split and --predictions go together")
    if not (lake / "samples").exists():
        _usage(f"{lake}: no samples table (build the lake first, or give --lake)")
    rows = []
    for text in read_text(predictions)[1].splitlines():
        if text.strip():
            try:
                rows.append(json.loads(text))
            except (json.JSONDecodeError, RecursionError):
                rows.append(None)  # reported as a malformed line
    return lake_predictions(split_sources(lake, split), rows, split)


def _clean_ids(split: str, lake: Path) -> set | None:
    """The test split's samples without structural overlap with the train split (the `structural_overlap`
    flag of the samples table), or None for another split (a train sample's flag says the opposite: its
    structure recurs in the test split) or a lake without flags."""
    from flows.lake_queries import structural_overlap

    flags = structural_overlap(lake, split)
    if split != "test" or not flags or all(v is None for v in flags.values()):
        return None
    return {k for k, v in flags.items() if not v}


def _run(lines: list, options, workers: int, timeout: float) -> list:
    from contextlib import nullcontext

    from rich.console import Console
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

    from evaluation.harness import evaluate
    from gpu_tasks.pool import WorkerPool

    size = max(1, workers or os.cpu_count() or 1)
    columns = (TextColumn("[bold]{task.description}"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn())
    with Progress(*columns, console=Console(stderr=True), transient=True) as bar:
        tasks: dict[str, int] = {}

        def progress(phase: str, done: int, total: int) -> None:
            if phase not in tasks:
                tasks[phase] = bar.add_task(phase, total=total)
            bar.update(tasks[phase], completed=done)

        # verification workers sit idle while the timing worker measures (builds are over by then)
        with WorkerPool(workers=size, timeout_s=timeout) if lines else nullcontext() as pool:
            return evaluate(lines, options, pool, progress=progress)


def _report(results: list, as_json: bool, published: bool, clean: set | None = None) -> None:
    from evaluation.harness import CHECKS, by_strategy, summarize

    summary = summarize(results)
    clean_summary = summarize([r for r in results if r.id in clean]) if clean is not None else None
    strategies = by_strategy(results) if published else None
    if as_json:
        for r in results:
            sys.stdout.write(json.dumps(r.to_json()) + "\n")
        last = {"summary": summary} | ({"summary_clean": clean_summary} if clean is not None else {}) | (
            {"by_strategy": strategies} if published else {})
        sys.stdout.write(json.dumps(last) + "\n")
        sys.stdout.flush()
        return
    from rich.console import Console
    from rich.table import Column, Table

    console = Console()
    def fmt(rate):
        return "n/a" if rate is None else f"{rate:.1%}"

    if clean_summary is None:
        table = Table("check", "rate", title=f"{summary['n']} lines")
        for name in CHECKS:
            table.add_row(name, fmt(summary[name]))
    else:  # the whole split and its clean part (no structural overlap with the train split)
        table = Table("check", f"whole split ({summary['n']})", f"clean part ({clean_summary['n']})",
                      title=f"{summary['n']} lines, {clean_summary['n']} without structural overlap")
        for name in CHECKS:
            table.add_row(name, fmt(summary[name]), fmt(clean_summary[name]))
    console.print(table)
    statuses = Table("status", "lines")
    for status, count in sorted(Counter(r.status for r in results).items()):
        statuses.add_row(status, str(count))
    console.print(statuses)
    if strategies is not None:
        per = Table(Column("strategy", overflow="fold"), "exact", "close", "wrong", "total",
                    title="published answers re-verified")
        for name, row in strategies.items():
            per.add_row(name, *(str(row[k]) for k in ("exact", "close", "wrong", "total")))
        console.print(per)


def _usage(message: str):
    typer.echo(f"error: {message}", err=True)
    raise typer.Exit(EXIT_USAGE)
