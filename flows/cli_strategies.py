"""`steptp strategies list`, `steptp apply`, `steptp sites`: the strategy library from the shell."""
from __future__ import annotations

import json
import random
from pathlib import Path
from typing import Annotated

import typer

from flows.cli_leir import fail, load_signature

strategies_app = typer.Typer(help="The 43 atomic strategies.", no_args_is_help=True)


def _read_program(file: str):
    from leir.errors import LeirSyntaxError
    from leir.parse import parse_program

    text = typer.get_text_stream("stdin").read() if file == "-" else _read(file)
    try:
        return parse_program(text)
    except LeirSyntaxError as e:
        fail(f"{'<stdin>' if file == '-' else file}:{e.line}:{e.column}: {e.message()}")


def _read(file: str) -> str:
    try:
        return Path(file).read_text(encoding="utf-8")
    except OSError as e:
        fail(f"cannot read {file}: {e}")


@strategies_app.command("list")
def list_(as_json: Annotated[bool, typer.Option("--json", help="One JSON array of objects.")] = False):
    """List the strategies: name, level, exactness, description (and whether it is implemented)."""
    from strategies.registry import ALL_NAMES, LEVEL_OF, get

    rows = []
    for name in ALL_NAMES:
        try:
            s = get(name)
            rows.append({"name": name, "level": s.level, "exactness": s.exactness, "description": s.description})
        except KeyError:
            rows.append({"name": name, "level": LEVEL_OF[name], "exactness": None, "description": None})
    if as_json:
        typer.echo(json.dumps(rows, indent=1))
        return
    from rich.console import Console
    from rich.table import Table

    table = Table("name", "level", "exactness", "description")
    for r in rows:
        table.add_row(r["name"], r["level"], r["exactness"] or "-", r["description"] or "(not implemented yet)")
    Console().print(table)


def register(app: typer.Typer) -> None:
    app.add_typer(strategies_app, name="strategies")

    @app.command("apply")
    def apply(strategy: Annotated[str, typer.Argument(help="A strategy name, or 'all' to try every one.")],
              file: Annotated[str, typer.Argument(help="File with one LEIR program ('-' for stdin).")],
              signature: Annotated[Path, typer.Option("--signature", "-s", help="Signature JSON.")],
              target: Annotated[str, typer.Option(help="llvm (CPU) or cuda.")] = "llvm",
              seed: Annotated[int, typer.Option(help="Seed for choosing among transformations with --max.")] = 0,
              max_: Annotated[int | None, typer.Option("--max", help="At most N transformations per strategy "
                                                       "(a seeded, deterministic choice).")] = None,
              cot: Annotated[bool, typer.Option(help="Include the chain of thought.")] = True):
        """Apply a strategy at every legal site and parameter; one JSON line per transformation:
        {"strategy", "site", "params", "after", "cot"}. Exit 1 if nothing applies."""
        from strategies.base import Context
        from strategies.cot import answer
        from strategies.registry import ALL_NAMES, get, registered

        program, sig = _read_program(file), load_signature(signature)
        ctx = Context(program, sig, target)
        try:
            chosen = registered() if strategy == "all" else [get(strategy)]
        except KeyError as e:
            fail(str(e.args[0]))
        if strategy != "all" and strategy not in ALL_NAMES:
            fail(f"unknown strategy {strategy!r}")
        count = 0
        for s in chosen:
            ts = list(s.transformations(ctx))
            if max_ is not None and len(ts) > max_:
                rng = random.Random(f"{seed}:{s.name}:{ctx.alpha}")
                ts = [ts[i] for i in sorted(rng.sample(range(len(ts)), max_))]
            for t in ts:
                row = {"strategy": t.strategy, "site": t.site.to_json(), "params": t.params, "after": t.after_text}
                if cot:
                    row["cot"] = answer(t)
                typer.echo(json.dumps(row))
                count += 1
        raise typer.Exit(0 if count else 1)

    @app.command("sites")
    def sites(file: Annotated[str, typer.Argument(help="File with one LEIR program ('-' for stdin).")],
              signature: Annotated[Path, typer.Option("--signature", "-s", help="Signature JSON.")],
              target: Annotated[str, typer.Option(help="llvm (CPU) or cuda.")] = "llvm"):
        """Which strategies apply where, without applying: one JSON line per strategy with legal sites."""
        from strategies.base import Context
        from strategies.registry import registered

        ctx = Context(_read_program(file), load_signature(signature), target)
        for s in registered():
            found = s.legal_sites(ctx)
            if found:
                typer.echo(json.dumps({"strategy": s.name, "level": s.level,
                                       "sites": [x.to_json() for x in found]}))
