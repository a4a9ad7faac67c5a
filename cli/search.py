"""`steptp search`: multi-step search from one LEIR program (search.drivers, search.runner).

`steptp search --driver greedy --signature SIG.json FILE [--policy library|random|llm] [--budget N]
[--seed S] --json` prints one JSON object: `{"best_speedup", "best_leir", "trajectory": [{"strategy",
"params", "leir", "status", "speedup", ...}], "states_verified", "wall_s", ...}`. Without `--json`, a
short table. Exit status 0 when the search ran (whatever it found), 2 on bad usage.
"""
from __future__ import annotations

import json
import sys
from enum import StrEnum
from pathlib import Path
from typing import Annotated

import typer

from cli.common import fail, finite, load_signature, read_text


class Driver(StrEnum):
    chain = "chain"
    greedy = "greedy"
    beam = "beam"
    bfs = "bfs"
    dfs = "dfs"
    mcts = "mcts"


class PolicyName(StrEnum):
    library = "library"
    random = "random"
    llm = "llm"


def register(app: typer.Typer) -> None:
    """Add `steptp search` to `app`."""
    app.command("search")(search_command)


def search_command(
        file: Annotated[str, typer.Argument(help="File holding one LEIR program, or '-' for stdin.")],
        signature: Annotated[Path, typer.Option("--signature", "-s", help="Signature JSON of the program.")],
        driver: Annotated[Driver, typer.Option(help="Search driver.")] = Driver.greedy,
        policy: Annotated[PolicyName, typer.Option(
            help="library (ordered legal actions), random (seeded), or llm (OpenAI-compatible endpoint: "
                 "STEPTP_LLM_BASE_URL, STEPTP_LLM_MODEL, STEPTP_LLM_API_KEY).")] = PolicyName.library,
        budget: Annotated[int, typer.Option(min=1, help="States verified (and timed) at most.")] = 16,
        wall: Annotated[float, typer.Option(callback=finite, min=1.0, help="Wall-time budget in seconds.")] = 600.0,
        seed: Annotated[int, typer.Option(help="Seed of every random choice.")] = 0,
        depth: Annotated[int, typer.Option(min=1, help="Longest trajectory, in atomic steps (a macro's steps "
                                                    "count one each).")] = 64,  # search.drivers.DriverConfig
        branching: Annotated[int, typer.Option(min=1, help="Children per expanded state.")] = 4,
        width: Annotated[int, typer.Option(min=1, help="Beam width.")] = 2,
        ucb: Annotated[float, typer.Option(callback=finite, min=0.0, help="MCTS exploration constant.")] = 1.4,
        iterations: Annotated[int, typer.Option(min=1, help="MCTS iterations.")] = 64,
        target: Annotated[str, typer.Option(help="llvm (CPU) or cuda (needs a GPU).")] = "llvm",
        repeats: Annotated[int, typer.Option(min=3, help="Timing samples per side.")] = 5,
        min_repeat_ms: Annotated[int, typer.Option(min=1, help="Minimum length of one timing sample.")] = 10,
        base_url: Annotated[str | None, typer.Option(help="llm: endpoint base URL (else the env).")] = None,
        model: Annotated[str | None, typer.Option(help="llm: model name (else the env).")] = None,
        proposals: Annotated[int, typer.Option(min=1, help="llm: proposals asked per state.")] = 3,
        cost_model: Annotated[bool, typer.Option(
            "--cost-model/--no-cost-model",
            help="Rank the policy's proposals with the cost model learned from this search's measurements.")] = True,
        prior: Annotated[Path | None, typer.Option(
            help="The offline cost model the ranking starts from, before this search has timed anything "
                 "(default: lake/cost_model/model.json when the lake has one, the pipeline's cost_model "
                 "stage output). --no-prior starts from the policy's own order.")] = None,
        no_prior: Annotated[bool, typer.Option("--no-prior", help="Do not use an offline cost model.")] = False,
        as_json: Annotated[bool, typer.Option("--json", help="Print the result as one JSON object.")] = False):
    """Search for a faster equivalent of FILE: every state verified against the original and timed
    against it in the same session (speedup = original time / state time)."""
    from leir.errors import LeirError
    from leir.parse import parse_program
    from search.drivers import Budget, DriverConfig

    sig = load_signature(signature)
    _, text = read_text(file)
    try:
        program = parse_program(text.strip())
    except LeirError as e:
        fail(f"{file}: {e}")
    from leir.validate import validate

    problems = validate(program, sig)
    if problems:  # what `leir check` refuses has no speedup to find (a write to an input, unset memory)
        fail(f"{file}: not a valid program for this signature ({problems[0].code}: {problems[0]}); "
             "`steptp leir check` lists every problem")
    options = {}
    if policy is PolicyName.llm:
        from search.policies import LlmConfig

        try:
            options = {"config": LlmConfig.from_env(base_url, model), "proposals": proposals}
        except ValueError as e:
            fail(str(e))
    options["ranked"] = cost_model
    options["prior"] = None if no_prior or not cost_model else _prior(prior)
    from search.runner import SearchSettings, run_search

    config = DriverConfig(depth=depth, branching=branching, width=width, ucb_c=ucb, iterations=iterations)
    result = run_search(program, sig, driver.value, policy.value, Budget(budget, wall), seed, config=config,
                        settings=SearchSettings(target=target, repeats=repeats, min_repeat_ms=min_repeat_ms),
                        policy_options=options)
    if as_json:
        sys.stdout.write(json.dumps(result, sort_keys=False) + "\n")
    else:
        _print(result)


DEFAULT_PRIOR = Path("lake") / "cost_model" / "model.json"


def _prior(path: Path | None):
    """The offline cost model at `path` (an error when it cannot be read), or at the default place
    when there is one there (none otherwise: the search starts from the policy's order)."""
    from search.cost_model import PriorModel

    if path is None:
        if not DEFAULT_PRIOR.exists():
            return None
        path = DEFAULT_PRIOR
    try:
        return PriorModel.load(path)
    except ValueError as e:
        fail(str(e))


def _print(result: dict) -> None:
    from rich.console import Console
    from rich.table import Table

    table = Table(title=f"{result['driver']} / {result['policy']}: best speedup {result['best_speedup']:.2f}x, "
                        f"{result['states_verified']} states verified in {result['wall_s']:.1f} s")
    for col in ("depth", "strategy", "params", "status", "speedup"):
        table.add_column(col)
    for i, step in enumerate(result["trajectory"], start=1):
        sp = step["speedup"]
        table.add_row(str(i), step["strategy"], json.dumps(step["params"]), step["status"],
                      f"{sp:.2f}x" if sp is not None else "-")
    console = Console()
    console.print(table)
    console.print(result["best_leir"], soft_wrap=True, highlight=False, markup=False)
