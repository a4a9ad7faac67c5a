"""The transform stage: every strategy at every site of every verified original (parameter variants
capped), and the mathematical strategies again on the results of compute_inline (multi-step, depth
1..N) -> the `steps` table, one shard per workload family.

A profile may bound what the verify stage will have to check: `steps_per_strategy` keeps at most that
many steps of each strategy over the whole table (spread over the families in turn, each family's
steps in a seeded order), plus the compute_inline steps that the kept ones start from. Strategies with
fewer steps keep them all, so the cap trims the common rewrites (compute_inline chains, loop_split)
and never the rare ones. The cap is applied after the cached shard tasks, so changing it recomputes
nothing but the selection.

Steps whose result uses one of this project's extensions of the published LEIR format (`fast_exp`,
leir/ast.py EXTENSION_FNS) are made only when the profile's `leir_extensions` names it: released data
stays in the published format unless a profile opts in."""
from __future__ import annotations

import json
from pathlib import Path
from typing import NamedTuple

from prefect import flow
from prefect.task_runners import ThreadPoolTaskRunner

from flows.config import Params
from flows.keys import rank, stable_id
from flows.storage import read_table
from flows.tasks import by_family, run_tasks, shard_task, stage_key, write_table

PASSING = ("exact", "close")


def program_context(p: dict, params, leir: str | None = None):
    """The context the pipeline enumerates a program's states in (`leir`: a later state of it; the
    original by default): the program's own target (GPU-only strategies are offered on GPU
    programs only, CPU-only ones on CPU programs only), its measured rounding, the profile's LEIR
    extensions and parallel-work bound."""
    from leir.parse import parse_program
    from leir.signature import Signature
    from strategies.base import Context

    return Context(parse_program(leir or p["leir"]), Signature.from_json(p["signature"]),
                   p.get("target") or params.verify["target"], p.get("rounding_share"),
                   tuple(params.profile.get("leir_extensions") or ()),
                   min_parallel_work=int(params.profile.get("min_parallel_work") or 0))


def transform_shard(programs: list[dict], params) -> list[dict]:
    rows: dict[str, dict] = {}
    for p in programs:
        if p["verification_status"] not in PASSING:
            continue
        root = program_context(p, params)
        for row in _steps_from(root, p["program_id"], None, 0, params):
            rows.setdefault(row["step_id"], row)
    return [rows[k] for k in sorted(rows)]


def _steps_from(ctx, program_id: str, parent: str | None, depth: int, params) -> list[dict]:
    """Steps from one program state: all strategies at depth 0; after compute_inline, the
    mathematical ones (and compute_inline again) up to `inline_depth`. The state's transformations
    are collected first, so that each step's CoT weighs the other legal steps of its state."""
    from strategies.cot import state_steps
    from strategies.registry import registered

    prof = params.profile
    found = []
    for strategy in registered():
        if depth > 0 and strategy.level != "mathematical" and strategy.name != "compute_inline":
            continue
        found.extend((t, ctx) for t in strategy.transformations(
            ctx, limit=int(prof["max_steps_per_program_strategy"]), per_site=int(prof["max_variants_per_site"])))
    state = state_steps([(t, at.target) for t, at in found])
    out, inlined = [], []
    for t, at in found:
        row = step_row(t, Origin(program_id, parent, depth), ctx.signature, at, state)
        out.append(row)
        if t.strategy == "compute_inline" and depth < int(prof["inline_depth"]):
            inlined.append((row, t))
    for row, t in _explored(inlined, prof, params.seed):
        out.extend(_steps_from(ctx.with_program(t.after), program_id, row["step_id"], depth + 1, params))
    return out


def _explored(inlined: list, prof: dict, seed: int) -> list:
    """The compute_inline results whose own steps are enumerated: at most the profile's
    `inline_branches` of them per state (a seeded choice; all without the key). Every inlining is a
    step either way; the cap bounds the chains (8 inlinings of 8 inlinings of a 19-nest attention
    block are 64 states, each with every mathematical strategy) inside the enumeration, where a cap
    after it paid for steps it then dropped (the release build made 170,679 to keep 31,853)."""
    branches = prof.get("inline_branches")
    if branches is None or len(inlined) <= int(branches):
        return inlined
    ids = sorted((row["step_id"] for row, _ in inlined), key=lambda i: rank(seed, "inline", i))[:int(branches)]
    return [(row, t) for row, t in inlined if row["step_id"] in ids]


class Origin(NamedTuple):
    """Where a step comes from: its program, the step whose result it rewrites (None: the original)
    and how many steps lie before it."""

    program_id: str
    parent: str | None
    depth: int


def step_row(t, origin: Origin, signature, ctx=None, state=None) -> dict:
    """One `steps` row; its CoT reasons on `ctx`'s target (the context `t` was enumerated in) and
    weighs the other steps of `state` (strategies.cot.StateSteps), when given."""
    from leir.canon import program_id as pid_of
    from strategies.cot import answer, reasoning

    program_id, parent, depth = origin

    step_id = stable_id("step", program_id, parent, t.before_text, t.strategy, t.site.to_json(), t.params)
    why = reasoning(t, ctx, state)
    return {"step_id": step_id, "program_id": program_id, "parent_step_id": parent, "depth": depth,
            "strategy": t.strategy, "level": t.level, "site": json.dumps(t.site.to_json(), sort_keys=True),
            "params": t.params_json(), "before_leir": t.before_text, "after_leir": t.after_text,
            "after_program_id": pid_of(t.after, signature), "exactness": t.exactness,
            "cot": answer(t, ctx, state, why), "claim": why.claim, "enables": json.dumps(list(why.enables))}



@shard_task
def transform_task(key: str, programs: list[dict], raw: dict, profile: str) -> list[dict]:
    return transform_shard(programs, Params(raw, profile))


@flow(name="transform", task_runner=ThreadPoolTaskRunner(max_workers=1))
def transform_flow(raw: dict, profile: str, lake: str) -> dict:
    params, lake = Params(raw, profile), Path(lake)
    families = by_family(read_table(lake, "programs"))
    calls = [(f, transform_task, (stage_key("transform", params, lake, rows), rows, raw, profile))
             for f, rows in families.items()]
    results = run_tasks("transform: apply strategies", calls)
    generated = sum(len(rows) for rows in results.values())
    cap = params.profile.get("steps_per_strategy")
    if cap is not None:
        results = cap_per_strategy(results, int(cap), params.seed)
    n = write_table(lake, "steps", results)
    return {"stage": "transform", "shards": len(calls), "rows": n, "generated": generated}


def cap_per_strategy(shards: dict[str, list[dict]], cap: int, seed: int) -> dict[str, list[dict]]:
    """At most `cap` steps of each strategy over all shards, taken from the families in turn (each
    family's steps of that strategy in a seeded order), plus the ancestors of every kept step (a step
    after compute_inline starts from that step's after-state). Shards keep their rows' order."""
    by_id = {r["step_id"]: r for rows in shards.values() for r in rows}
    queues: dict[str, dict[str, list[str]]] = {}
    for family in sorted(shards):
        for r in shards[family]:
            queues.setdefault(r["strategy"], {}).setdefault(family, []).append(r["step_id"])
    keep: dict[str, None] = {}
    for strategy in sorted(queues):
        lists = [sorted(ids, key=lambda i, f=family: rank(seed, "cap", f, strategy, i))
                 for family, ids in sorted(queues[strategy].items())]
        taken = 0
        for turn in range(max(len(ids) for ids in lists)):
            for ids in lists:
                if turn < len(ids) and taken < cap:
                    keep[ids[turn]] = None
                    taken += 1
    for step_id in list(keep):
        parent = by_id[step_id]["parent_step_id"]
        while parent is not None and parent not in keep:
            keep[parent] = None
            parent = by_id[parent]["parent_step_id"]
    return {family: [r for r in rows if r["step_id"] in keep] for family, rows in shards.items()}
