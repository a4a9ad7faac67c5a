"""`steptp strategies list`, `steptp apply`, `steptp sites`: the strategy library from the shell."""
from __future__ import annotations

import json
import random
from pathlib import Path
from typing import Annotated

import typer

from cli.common import ITEM_ERRORS, fail, finite, item_error, load_signature, program_batch, read_text

strategies_app = typer.Typer(help="The 43 atomic strategies.", no_args_is_help=True)


def _read_program(file: str):
    from leir.errors import LeirSyntaxError
    from leir.parse import parse_program

    name, text = read_text(file)
    try:
        return parse_program(text)
    except LeirSyntaxError as e:
        fail(f"{name}:{e.line}:{e.column}: {e.message()}")


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
              file: Annotated[str | None, typer.Argument(help="File with one LEIR program ('-' for stdin).")]
              = None,
              signature: Annotated[Path | None, typer.Option("--signature", "-s", help="Signature JSON.")] = None,
              target: Annotated[str, typer.Option(help="llvm (CPU) or cuda.")] = "llvm",
              seed: Annotated[int, typer.Option(help="Seed for choosing among transformations with --max.")] = 0,
              max_: Annotated[int | None, typer.Option("--max", min=1, help="At most N transformations per strategy "
                                                       "(a seeded, deterministic choice).")] = None,
              cot: Annotated[bool, typer.Option(help="Include the chain of thought.")] = True,
              extensions: Annotated[bool, typer.Option(help="Allow results that use this project's extensions of "
                                                       "the published LEIR format (fast_exp, fast_log, fast_erf); "
                                                       "--no-extensions: the published format only, as "
                                                       "released data.")] = True,
              rounding_share: Annotated[float | None, typer.Option(callback=finite, min=0.0,
                  help="The share of the dtype's tolerance the program's own rounding uses against its "
                       "float64 reference (the programs table's rounding_share): above 0.2 no "
                       "reassociating step is proposed, as in the pipeline.")] = None,
              batch: Annotated[str | None, typer.Option(help='JSONL file (or "-"), one {"id", "signature", '
                                                        '"leir"} per line, instead of FILE.')] = None,
              site: Annotated[str | None, typer.Option(help="Only the step at this site: its JSON as a record "
                                                       "gives it (the `site` of a step or of a trajectory; "
                                                       "with --params).")] = None,
              params: Annotated[str | None, typer.Option(help="With --site: the step's parameters (JSON, as "
                                                         "recorded; default {}).")] = None):
        """Apply a strategy at every legal site and parameter; one JSON line per transformation:
        {"strategy", "site", "params", "after", "cot"} ("id" first with --batch). With --site (and
        --params), only the step recorded at that site with those parameters: what replays a released
        step or a trajectory's step byte for byte (exit 1 when it is not legal there). A strategy that
        raises on a program gives one line {"strategy", "error", "exception": {"type", "message",
        "file", "line"}} and the others go on; with --batch, a program that cannot be read gives {"id",
        "error"} and the batch goes on. Exit 1 if nothing applies (with --batch: if some program got
        no transformation or an error)."""
        from strategies.registry import ALL_NAMES, get, registered

        try:
            chosen = registered() if strategy == "all" else [get(strategy)]
        except KeyError as e:
            fail(str(e.args[0]))
        if strategy != "all" and strategy not in ALL_NAMES:
            fail(f"unknown strategy {strategy!r}")
        from leir.ast import EXTENSION_FNS

        chosen_step = _recorded_step(strategy, site, params)
        options = (target, seed, max_, cot, EXTENSION_FNS if extensions else (), rounding_share, chosen_step)
        if batch is not None:
            if file is not None or signature is not None:
                fail("--batch takes no FILE or --signature")
            raise typer.Exit(_apply_batch(batch, chosen, options))
        if file is None or signature is None:
            fail("give FILE and --signature, or --batch PROGRAMS.jsonl")
        program, sig = _read_program(file), load_signature(signature)
        count, errors = _apply_program(program, sig, chosen, options, {})
        raise typer.Exit(0 if count else 1)

    @app.command("sites")
    def sites(file: Annotated[str, typer.Argument(help="File with one LEIR program ('-' for stdin).")],
              signature: Annotated[Path, typer.Option("--signature", "-s", help="Signature JSON.")],
              target: Annotated[str, typer.Option(help="llvm (CPU) or cuda.")] = "llvm"):
        """Which strategies apply where, without applying: one JSON line per strategy with legal sites.
        A strategy that raises on the program prints one line {"strategy", "error", "exception"} and
        the others go on; exit status 1 when one did."""
        from strategies.base import Context
        from strategies.registry import registered

        ctx = Context(_read_program(file), load_signature(signature), target)
        errors = 0
        for s in registered():
            try:
                found = s.legal_sites(ctx)
                rows = [x.to_json() for x in found]
            except ITEM_ERRORS as e:  # one strategy's failure on this program must not hide the others
                typer.echo(json.dumps({"strategy": s.name} | item_error(None, e)))
                errors += 1
                continue
            if rows:
                typer.echo(json.dumps({"strategy": s.name, "level": s.level, "sites": rows}))
        raise typer.Exit(1 if errors else 0)


def _apply_program(program, sig, chosen, options, head: dict) -> tuple[int, int]:
    """Print every transformation of `program` by each strategy of `chosen`, each line starting with
    `head`; a strategy that raises prints one error line and the next goes on. (transformations, errors)"""
    from strategies.base import Context
    from strategies.cot import answer

    target, seed, max_, cot, extensions, rounding_share, recorded = options
    ctx = Context(program, sig, target, rounding_share, tuple(extensions))
    count = errors = 0
    for s in chosen:
        try:
            rows = list(_strategy_rows(s, ctx, seed, max_, cot, answer, recorded))
        except ITEM_ERRORS as e:  # one strategy's bug on this program must not hide the others
            typer.echo(json.dumps(head | {"strategy": s.name} | item_error(None, e)))
            errors += 1
            continue
        for row in rows:
            typer.echo(json.dumps(head | row))
        count += len(rows)
    return count, errors


def _recorded_step(strategy: str, site: str | None, params: str | None) -> tuple[dict, dict] | None:
    """(site, params) of `--site`/`--params`, checked: JSON objects, one strategy."""
    if site is None:
        if params is not None:
            fail("--params needs --site")
        return None
    if strategy == "all":
        fail("--site needs one strategy, not 'all'")
    parsed = []
    for name, text in (("--site", site), ("--params", params or "{}")):
        try:
            value = json.loads(text)
        except json.JSONDecodeError as e:
            fail(f"{name}: not JSON ({e.msg} at line {e.lineno}, column {e.colno})")
        if not isinstance(value, dict):
            fail(f"{name}: expected a JSON object, got {type(value).__name__}")
        parsed.append(value)
    from strategies.base import Illegal
    from strategies.registry import get

    try:
        get(strategy).params_type.from_json(parsed[1])
    except Illegal as e:   # a field of the wrong type or name: said before anything is tried
        fail(f"--params: {strategy} {e}")
    return parsed[0], parsed[1]


def _strategy_rows(s, ctx, seed: int, max_: int | None, cot: bool, answer, recorded: tuple[dict, dict] | None = None):
    if recorded is not None:
        t = s.replay(ctx, *recorded)
        ts = [] if t is None else [t]
    else:
        ts = list(s.transformations(ctx))
    if max_ is not None and len(ts) > max_:
        rng = random.Random(f"{seed}:{s.name}:{ctx.alpha}")
        ts = [ts[i] for i in sorted(rng.sample(range(len(ts)), max_))]
    for t in ts:
        row = {"strategy": t.strategy, "site": t.site.to_json(), "params": t.params, "after": t.after_text}
        if cot:
            row["cot"] = answer(t, ctx)  # the CoT reasons on the target the step was made for
        yield row


def _apply_batch(path: str, chosen, options) -> int:
    from leir.parse import parse_program
    from leir.signature import Signature

    failed = False
    for entry in program_batch(path):
        head = {"id": entry["id"]}
        if "job" not in entry:
            typer.echo(json.dumps(head | {"error": entry["error"]}))
            failed = True
            continue
        leir, sig = entry["job"]
        try:
            program, signature = parse_program(leir), Signature.from_json(sig)
        except ITEM_ERRORS as e:
            typer.echo(json.dumps(head | item_error(entry["line"], e)))
            failed = True
            continue
        count, errors = _apply_program(program, signature, chosen, options, head)
        failed = failed or errors > 0 or count == 0
    return 1 if failed else 0


# --- the survey ----------------------------------------------------------------------

def catalogue_originals(n: int, seed: int = 0, dtype: str = "float32", shapes: str = "default",
                        workloads: list[str] | None = None) -> list:
    """A deterministic sample of `n` catalogue originals, as (SurveyProgram, Translation) pairs, at the
    shape profile `shapes`: families in name order, taken round-robin, each family's workloads in a
    seeded order (only the named `workloads` when given); `dtype` where the workload offers it (as the
    profiles do), else the instance's. Untranslatable ones are skipped."""
    from dataclasses import replace

    from leir.frontend import TranslationError, translate
    from strategies.base import Context
    from strategies.survey import SurveyProgram
    from workloads.registry import all_workloads
    from workloads.sampling import build, sample_instance

    chosen = all_workloads()
    if workloads:
        known = {w.name for w in chosen}
        unknown = [name for name in workloads if name not in known]
        if unknown:
            raise KeyError(f"unknown workload{'s' if len(unknown) > 1 else ''} {', '.join(unknown)}; "
                           "`steptp workloads list` names them")
        chosen = [w for w in chosen if w.name in workloads]
    by_family: dict[str, list] = {}
    for w in chosen:
        by_family.setdefault(w.family, []).append(w)
    for family, ws in by_family.items():
        random.Random(f"survey:{seed}:{family}").shuffle(ws)
    order = [ws[i] for i in range(max(map(len, by_family.values())))
             for _, ws in sorted(by_family.items()) if i < len(ws)]
    out = []
    for w in order:
        if len(out) >= n:
            break
        inst = sample_instance(w, seed, 0, shapes)
        if dtype in w.dtypes:
            inst = replace(inst, dtype=dtype)
        try:
            module, inputs = build(w, inst)
            tr = translate(module, inputs, dtype=inst.dtype)
        except TranslationError:
            continue
        out.append((SurveyProgram(w.name, Context(tr.program, tr.signature)), tr))
    return out


def sample_catalogue(n: int, seed: int = 0, dtype: str = "float32", shapes: str = "default") -> list:
    """The SurveyPrograms of `catalogue_originals`."""
    return [p for p, _ in catalogue_originals(n, seed, dtype, shapes)]


def verified_originals(found: list, workers: int, timeout_s: float, seed: int = 0,
                       own_factor: float | None = None) -> tuple[list, list[dict]]:
    """The originals of `found` that verify against PyTorch (as the generate stage requires before
    any strategy sees a program) and whose own outputs are evidence in their dtype (not identical on
    every draw: a float16 program that saturates to a constant cannot tell a right step from a wrong
    one); the others as {"program", "status", "error"}: a strategy is not to blame for them."""
    from dataclasses import replace

    from flows.config import load_params, own_error_factor
    from gpu_tasks.pool import WorkerPool
    from gpu_tasks.verify import pair_request, verify_against_references, verify_pairs

    own_factor = own_error_factor(load_params()) if own_factor is None else own_factor
    with WorkerPool(workers=workers, timeout_s=timeout_s) as pool:
        results = verify_against_references([(tr.program, tr.signature, tr.reference, tr.reference_in_dtype)
                                             for _, tr in found], pool, seed=seed, own_factor=own_factor)
        passing = [(p, tr) for (p, tr), v in zip(found, results, strict=True) if v.status in ("exact", "close")]
        own = dict(zip([p.name for p, _ in passing],
                       verify_pairs([pair_request(tr.program, tr.program, tr.signature, seed=seed)
                                     for _, tr in passing], pool), strict=True))
    kept, left_out = [], []
    for (program, _), reference in zip(found, results, strict=True):
        v = own.get(program.name, reference)
        if v.status in ("exact", "close"):
            # as the transform stage does: how far rounding alone moves it decides whether
            # reassociating strategies may propose steps on it (strategies.analysis.numerics)
            measured = replace(program.context, rounding_share=reference.tolerance_share)
            kept.append(replace(program, context=measured))
        else:
            left_out.append({"program": program.name, "status": v.status,
                             "error": (v.error or "").splitlines()[0][:160] if v.error else ""})
    return kept, left_out


def pool_verifier(workers: int, timeout_s: float, target: str = "llvm", draws: int = 3, seed: int = 0):
    """`verify(items)` for the survey: every pair in a `WorkerPool` through `verify_pairs`."""
    def verify(items):
        from gpu_tasks.pool import WorkerPool
        from gpu_tasks.verify import pair_request, verify_pairs

        requests = [pair_request(t.before, t.after, sig, target=target, draws=draws, seed=seed) for t, sig in items]
        with WorkerPool(workers=workers, timeout_s=timeout_s) as pool:
            return verify_pairs(requests, pool)
    return verify


@strategies_app.command("survey")
def survey_(programs: Annotated[int, typer.Option("--programs", min=1, help="Catalogue originals to sample.")] = 40,
            as_json: Annotated[bool, typer.Option("--json", help="One JSON object instead of the table.")] = False,
            cap: Annotated[int, typer.Option(min=1, help="Applications verified per program and strategy.")] = 2,
            per_site: Annotated[int, typer.Option(min=1, help="Parameter variants per site.")] = 2,
            inline_cap: Annotated[int, typer.Option(min=0, help="compute_inline results per program for the "
                                                    "mathematical strategies.")] = 2,
            workers: Annotated[int, typer.Option(min=1, help="Verification worker processes.")] = 2,
            timeout_s: Annotated[float, typer.Option(callback=finite, min=0.1,
                                                     help="Time limit per verification.")] = 60.0,
            seed: Annotated[int, typer.Option(help="Seed of the program sample and application choice.")] = 0,
            dtype: Annotated[str, typer.Option(help="dtype of the sampled programs (float32, float16, bfloat16, "
                                                    "float64), where the workload offers it.")] = "float32",
            shapes: Annotated[str, typer.Option(help="Shape profile of the instances: default (realistic, "
                                                     "the default budget), release or tiny.")] = "default",
            check_originals: Annotated[bool, typer.Option(help="Leave out originals that do not verify against "
                                                          "PyTorch themselves (the pipeline never transforms "
                                                          "them) or whose outputs do not depend on the "
                                                          "inputs in this dtype.")] = True,
            strategy: Annotated[list[str] | None, typer.Option("--strategy", help="Only these strategies "
                                                               "(repeatable).")] = None,
            workload: Annotated[list[str] | None, typer.Option("--workload", help="Only these catalogue workloads "
                                                               "(repeatable), e.g. to reproduce a failure the "
                                                               "release build reported.")] = None):
    """Per strategy: sites on a deterministic sample of catalogue originals (plus one compute_inline
    step for the mathematical strategies), applications, and how many verify as declared."""
    import sys
    import time

    from strategies.survey import survey

    start = time.perf_counter()
    if dtype not in ("float32", "float16", "float64", "bfloat16"):
        fail(f"--dtype must be float32, float16, float64 or bfloat16, got {dtype!r}")
    if shapes not in ("default", "release", "tiny"):
        fail(f"--shapes must be default, release or tiny, got {shapes!r}")
    try:
        found = catalogue_originals(programs, seed, dtype, shapes, workload or None)
    except KeyError as e:
        fail(str(e.args[0]))
    typer.echo(f"{len(found)} programs translated in {time.perf_counter() - start:.1f} s", err=True)
    sample, left_out = [p for p, _ in found], []
    if check_originals:
        sample, left_out = verified_originals(found, workers, timeout_s, seed)
        typer.echo(f"{len(left_out)} originals left out: they do not verify against PyTorch in {dtype}, or their "
                   "outputs do not depend on the inputs there", err=True)
    try:
        result = survey(sample, pool_verifier(workers, timeout_s, seed=seed), strategy or None, cap=cap,
                        per_site=per_site, inline_cap=inline_cap, seed=seed,
                        progress=lambda name: print(f"  enumerated {name}", file=sys.stderr, flush=True))
    except KeyError as e:
        fail(str(e.args[0]))
    typer.echo(f"done in {time.perf_counter() - start:.1f} s", err=True)
    if as_json:
        typer.echo(json.dumps({**result.to_json(), "dtype": dtype, "shapes": shapes, "left_out": left_out}, indent=1))
        return
    typer.echo(f"Survey of {len(result.programs)} {dtype} catalogue originals at {shapes} shapes (cap {cap} "
               f"applications per program and strategy, {per_site} variants per site, {inline_cap} compute_inline "
               f"steps for the mathematical strategies, seed {seed}):\n")
    typer.echo(result.table())
    if left_out:
        typer.echo(f"\nLeft out, because the original itself does not verify against PyTorch in {dtype} (or its "
                   "outputs are no evidence there):")
        for row in left_out:
            typer.echo(f"- {row['program']}: {row['status']}: {row['error']}")
