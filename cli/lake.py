"""`steptp sql` and `steptp lake status`: query and inspect the lake."""
from __future__ import annotations

import json
import os
import sys
from pathlib import Path
from typing import Annotated

import typer

from cli.common import fail, finite

lake_app = typer.Typer(help="Inspect the data lake.", no_args_is_help=True)
LakeOpt = Annotated[Path, typer.Option("--lake", envvar="STEPTP_LAKE", help="The lake folder.")]
DEFAULT_LAKE = Path("lake")


@lake_app.command("status")
def status(lake: LakeOpt = DEFAULT_LAKE,
           as_json: Annotated[bool, typer.Option("--json", help="Print JSON instead of a table.")] = False):
    """Tables (shards, rows), the last run, the last scheduled (nightly) run and the release versions.
    Exit status 1 when a shard cannot be read or a release is not whole (each named), 2 with no lake."""
    import pyarrow.parquet as pq

    from flows.lake_guard import release_problems
    from flows.storage import SCHEDULED_RUN_LOG, TABLES, shards

    if not lake.is_dir():
        fail(f"no lake at {lake} (run `steptp run` first, or pass --lake)")
    tables, unreadable = {}, {}
    for name in TABLES:
        files = shards(lake, name) if (lake / name).exists() else []
        rows = 0
        for f in files:
            try:
                rows += pq.ParquetFile(f).metadata.num_rows
            except (OSError, ValueError) as e:  # a truncated or foreign file: named, never a traceback
                unreadable[str(f)] = " ".join(str(e).split())
        tables[name] = {"shards": len(files), "rows": rows}
    releases = sorted(p.name for p in (lake / "releases").glob("v*")) if (lake / "releases").exists() else []
    damaged = {r: problems for r in releases if (problems := release_problems(lake / "releases" / r))}
    last_run, scheduled = (_log(p) for p in (lake / "last_run.json", lake / SCHEDULED_RUN_LOG))
    info = {"lake": str(lake), "tables": tables, "last_run": last_run, "last_scheduled_run": scheduled,
            "releases": releases, "damaged_releases": damaged, "unreadable_shards": unreadable}
    if as_json:
        typer.echo(json.dumps(info, indent=1))
        if damaged or unreadable:
            raise typer.Exit(1)
        return
    from rich.console import Console
    from rich.markup import escape
    from rich.table import Table

    table = Table("table", "shards", "rows", title=f"lake: {lake}")
    for name, t in tables.items():
        table.add_row(name, str(t["shards"]), str(t["rows"]))
    console = Console()
    console.print(table)
    for path, reason in unreadable.items():
        console.print(escape(f"unreadable shard (not counted): {path}: {reason}"))
    console.print(f"last run: {last_run or '-'}")
    console.print(f"last scheduled run: {escape(scheduled_run_line(scheduled))}")
    console.print(f"releases: {', '.join(r + (' (DAMAGED)' if r in damaged else '') for r in releases) or '-'}")
    for r, problems in damaged.items():
        console.print(escape(f"  {r}: {'; '.join(problems)} (not a whole release: move it out of the lake)"))
    if damaged or unreadable:  # exit 1: a script that checks the lake notices
        raise typer.Exit(1)


def _log(path: Path) -> dict | None:
    """One of the lake's JSON logs; a damaged one is reported in place of its contents."""
    if not path.exists():
        return None
    try:
        value = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as e:
        return {"message": f"cannot read {path}: {e}"}
    return value if isinstance(value, dict) else {"message": f"{path}: not a JSON object"}


def scheduled_run_line(run: dict | None) -> str:
    """The nightly build's last run: when, its state and the release it made (or none), then its
    message (why nothing was released, the gate's failures) indented below."""
    if not run:
        return "- (none yet: `steptp serve` schedules the nightly build)"
    when = run.get("finished_at") or run.get("started_at") or "?"
    state = run.get("state") or "?"
    if state == "Running":
        outcome = "release pending"
    else:
        outcome = f"released v{run['release']}" if run.get("release") else "no release"
    lines = [f"{when} {state}, {outcome} (flow run {run.get('flow_run_name') or run.get('flow_run_id')})"]
    message = (run.get("message") or "").strip().splitlines()
    lines += [f"  {m}" for m in message[:12]] + (["  ..."] if len(message) > 12 else [])
    return "\n".join(lines)


def register(app: typer.Typer) -> None:
    app.add_typer(lake_app, name="lake")

    @app.command("sql")
    def sql(query: Annotated[str, typer.Argument(help="A DuckDB query over the lake's views (programs, steps, "
                                                 "verifications, timings, samples, tokens, steps_verified, "
                                                 "steps_all). Queries only: SELECT, FROM, WITH, VALUES, "
                                                 "DESCRIBE, SHOW, SUMMARIZE.")],
            lake: LakeOpt = DEFAULT_LAKE,
            fmt: Annotated[str, typer.Option("--format", help="table, csv, json (one object per line) or "
                                             "parquet (written to --output).")] = "table",
            output: Annotated[Path | None, typer.Option(help="Output file (required for parquet); never inside "
                                                        "the lake.")] = None,
            timeout: Annotated[float, typer.Option(min=0.001, callback=finite,
                                                   help="Seconds the query may run before it is cancelled.")]
            = 300.0):
        """Run a read-only SQL query on the lake and print the result.

        The query can only read the lake's tables: any statement that is not a query (ATTACH, DETACH,
        COPY, INSTALL, LOAD, EXPORT, SET, CREATE, ...) is refused before anything runs, DuckDB's
        external access is off except for the lake's shard files, extensions are neither installed nor
        loaded, and its configuration is locked. Nothing is written to the lake (--output inside it is
        refused). A query that runs past --timeout, or is interrupted with Ctrl-C, is cancelled. Cells
        print as plain text. Exit status 2 on a refused, failing or cancelled query, or when --lake is
        not a lake; 130 on Ctrl-C.
        """
        import duckdb

        from flows.storage import StorageError, is_lake, read_only_connection, read_only_query

        if fmt not in ("table", "csv", "json", "parquet"):
            fail(f"--format must be table, csv, json or parquet, got {fmt!r}")
        if fmt == "parquet" and output is None:
            fail("--format parquet needs --output FILE")
        if not lake.exists():
            fail(f"no lake at {lake} (run `steptp run` first, or pass --lake)")
        if output is not None:
            _check_output(output, lake)
        if not is_lake(lake):
            fail(f"{lake} is not a lake: it has no catalog.duckdb and no table folder such as programs/ "
                 "(run `steptp run` first, or pass --lake)")
        try:
            con = read_only_connection(lake)
        except (StorageError, duckdb.Error) as e:
            fail(str(e).splitlines()[0])
        try:
            frame = _run_cancellable(con, lambda: _arrow(read_only_query(con, query)), timeout)
        except (StorageError, duckdb.Error) as e:
            fail(str(e).splitlines()[0] if str(e) else type(e).__name__)
        finally:
            con.close()
        if frame is not None:
            _print(frame, fmt, output)


def _check_output(output: Path, lake: Path) -> None:
    target = output.resolve()
    if target.is_relative_to(lake.resolve()):
        fail(f"--output {output} is inside the lake {lake}: write results elsewhere (the lake holds its tables only)")
    if not target.parent.is_dir():
        fail(f"cannot write {output}: there is no folder {target.parent}")
    if target.is_dir():
        fail(f"cannot write {output}: it is a folder")


def _arrow(result):
    return None if result is None else result.to_arrow_table()


def _run_cancellable(con, work, timeout: float):
    """`work()` in a thread, cancelled (DuckDB's interrupt) after `timeout` seconds or on Ctrl-C: a
    query that never ends must not hold the terminal."""
    import threading

    box: dict = {}

    def run():
        try:
            box["value"] = work()
        except BaseException as e:  # handed to the caller's thread
            box["error"] = e

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    try:
        thread.join(timeout)
    except KeyboardInterrupt:
        con.interrupt()
        thread.join(10)
        fail("interrupted: the query was cancelled", code=130)
    if thread.is_alive():
        con.interrupt()
        thread.join(10)
        fail(f"the query ran past --timeout {timeout:g} s and was cancelled")
    if "error" in box:
        raise box["error"]
    return box.get("value")


def _print(frame, fmt: str, output: Path | None):
    import pyarrow.csv as pacsv
    import pyarrow.parquet as pq

    if fmt == "parquet":  # --output checked by the command
        pq.write_table(frame, output)
        return
    if fmt == "csv":
        target = output.open("wb") if output else sys.stdout.buffer
        pacsv.write_csv(frame, target)
        return
    if fmt == "json":  # batch by batch: millions of rows never become one string
        target = output.open("w", encoding="utf-8") if output else sys.stdout
        try:
            for batch in frame.to_batches(max_chunksize=4096):
                target.write("".join(json.dumps(r, default=str) + "\n" for r in batch.to_pylist()))
        finally:
            if output:
                target.close()
        return
    from rich.console import Console
    from rich.table import Table
    from rich.text import Text

    table = Table()
    for c in frame.column_names:
        table.add_column(Text(c))
    for r in frame.to_pylist():  # Text: a cell is shown as it is, never read as Rich markup
        table.add_row(*(Text("" if v is None else str(v)) for v in r.values()))
    Console(width=int(os.environ.get("COLUMNS", "160"))).print(table)
