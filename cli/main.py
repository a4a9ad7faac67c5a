"""The `steptp` command line (Typer + Rich). Each command group lives in its own module."""
from __future__ import annotations

import typer

from cli import evaluate, lake, leir, lower, run, search, strategies, tokens, translate, verify

app = typer.Typer(
    name="steptp",
    help="Step-TP data lake: build, verify and release step-level datasets of LEIR tensor-program "
         "transformations, and use the toolchain directly (parse, lower, verify, translate).",
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
)
app.add_typer(leir.app, name="leir")
lower.register(app)
verify.register(app)
translate.register(app)
strategies.register(app)
lake.register(app)
run.register(app)
tokens.register(app)
evaluate.register(app)
search.register(app)


def main():  # pragma: no cover - console entry point
    app()


def _stack_dump_on_sigusr1() -> None:
    """`kill -USR1 <pid>` prints every thread's Python stack to stderr and carries on: how to see where
    a command that seems stuck is (the tests send it to a batch that does not stop when told to)."""
    import faulthandler
    import signal

    if hasattr(signal, "SIGUSR1"):
        faulthandler.register(signal.SIGUSR1, all_threads=True)


# The console script is `cli.main:app` (pyproject.toml), so the handler is set when this module loads.
_stack_dump_on_sigusr1()
