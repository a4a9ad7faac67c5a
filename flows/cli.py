"""The `steptp` command line (Typer + Rich). Each command group lives in its own module."""
from __future__ import annotations

import typer

from flows import (
    cli_eval,
    cli_gpu,
    cli_lake,
    cli_leir,
    cli_lower,
    cli_run,
    cli_search,
    cli_strategies,
    cli_tokens,
    cli_translate,
)

app = typer.Typer(
    name="steptp",
    help="Step-TP data lake: build, verify and release step-level datasets of LEIR tensor-program "
         "transformations, and use the toolchain directly (parse, lower, verify, translate).",
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
)
app.add_typer(cli_leir.app, name="leir")
cli_lower.register(app)
cli_gpu.register(app)
cli_translate.register(app)
cli_strategies.register(app)
cli_lake.register(app)
cli_run.register(app)
cli_tokens.register(app)
cli_eval.register(app)
cli_search.register(app)


def main():  # pragma: no cover - console entry point
    app()
