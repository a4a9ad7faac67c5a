"""The follow_ups stage: the steps an enabling step says it makes legal, made and verified.

A released step whose chain of thought claims no benefit of its own but names the steps it makes
legal next (`claim = 'enabling'`, the strategies in `enables`) is justified by what comes after it.
Here those follow-ups are made on its after-state, at the nests it changed: for each strategy it
names, the first `follow_ups.per_strategy` sites there (one parameter variant each, the first legal
one in the strategy's own order), at most `follow_ups.per_step` in all. Each is verified against the
original program on the verify stage's protocol (draws, tolerances, target) and kept in the
`follow_ups` table: the steps schema (`parent_step_id` is the enabling step, `depth` one more) with
its verification. The measure stage times the passing ones on the same session as the enabling step,
and the release derives each enabling step's `chain_speedup` from them (`flows.measure`).

Deterministic data, like `steps`: the same lake gives the same rows (one shard per family), never
read back by the stages before it.
"""
from __future__ import annotations

import json
from pathlib import Path

from prefect import flow
from prefect.task_runners import ThreadPoolTaskRunner

from flows.config import Params
from flows.lake_queries import released_step_rows
from flows.storage import read_table
from flows.tasks import group, run_tasks, say, shard_task, shared_pool, stage_key, write_table
from flows.transform import Origin, program_context, step_row

DEFAULTS = {"per_strategy": 1, "per_step": 3}


def follow_up_params(params: Params) -> dict:
    return {**DEFAULTS, **(params.raw.get("follow_ups") or {}), **(params.profile.get("follow_ups") or {})}


def make_follow_ups(step: dict, program: dict, params: Params, cfg: dict) -> list[dict]:
    """The follow-up step rows of one enabling step (see the module docstring), in the order of its
    `enables` list."""
    from leir.parse import parse_program
    from strategies.analysis.tree import changed_nests
    from strategies.registry import get

    ctx = program_context(program, params, step["after_leir"])
    _, nests = changed_nests(parse_program(step["before_leir"]), ctx.program)
    out: list[dict] = []
    for name in json.loads(step.get("enables") or "[]"):
        strategy = get(name)
        made = 0
        for site in strategy.sites(ctx):
            if made >= int(cfg["per_strategy"]) or len(out) >= int(cfg["per_step"]):
                break
            if site.nest not in nests:
                continue
            t = next((t for p in strategy.parameters(ctx, site) if (t := strategy.apply(ctx, site, p)) is not None),
                     None)
            if t is not None:
                out.append(step_row(t, Origin(step["program_id"], step["step_id"], int(step["depth"]) + 1),
                                    ctx.signature, ctx))
                made += 1
    return out


def follow_up_shard(steps: list[dict], programs: dict[str, dict], params: Params, pool=None) -> list[dict]:
    """Every follow-up of `steps` (enabling steps of one family) with its verification against the
    original program, by step id."""
    from gpu_tasks.verify import pair_request, verify_pairs

    cfg = follow_up_params(params)
    rows: dict[str, dict] = {}
    for step in sorted(steps, key=lambda s: s["step_id"]):
        for row in make_follow_ups(step, programs[step["program_id"]], params, cfg):
            rows.setdefault(row["step_id"], row)
    made = [rows[k] for k in sorted(rows)]
    v = params.verify
    requests = [pair_request(programs[r["program_id"]]["leir"], r["after_leir"], programs[r["program_id"]]["signature"],
                             target=v["target"], draws=int(v["draws"]), seed=params.seed, tolerances=v["tolerance"])
                for r in made]
    for row, result in zip(made, verify_pairs(requests, pool), strict=True):
        j = result.to_json()
        row.update({"status": result.status, "max_abs_err": j["max_abs_err"], "max_rel_err": j["max_rel_err"],
                    "error_message": result.error or None})
    return made


def passing(follow_up: dict, parent_exactness: str) -> bool:
    """Whether a follow-up's verification passes for its chain: `exact`, or `close` where the enabling
    step or the follow-up reassociates (the filter's rule for one step)."""
    return follow_up["status"] == "exact" or (follow_up["status"] == "close" and "reassociating" in (
        follow_up["exactness"], parent_exactness))


@shard_task
def follow_up_task(key: str, steps: list[dict], programs: dict, raw: dict, profile: str) -> list[dict]:
    params = Params(raw, profile)
    return follow_up_shard(steps, programs, params, shared_pool(params))


@flow(name="follow_ups", task_runner=ThreadPoolTaskRunner(max_workers=1))
def follow_ups_flow(raw: dict, profile: str, lake: str, reports: str) -> dict:
    params, lake = Params(raw, profile), Path(lake)
    programs = {p["program_id"]: p for p in read_table(lake, "programs").to_pylist()}
    enabling = [s for s in released_step_rows(lake) if s.get("claim") == "enabling"]
    by_family = group(enabling, lambda s: programs[s["program_id"]]["family"])
    cfg = follow_up_params(params)
    calls = []
    for family, rows in by_family.items():
        mine = {r["program_id"]: programs[r["program_id"]] for r in rows}
        calls.append((family, follow_up_task, (stage_key("follow_ups", params, lake, rows, mine, cfg), rows, mine, raw,
                                               profile)))
    results = run_tasks("follow_ups: make and verify", calls)
    n = write_table(lake, "follow_ups", results)
    parent_exactness = {s["step_id"]: s["exactness"] for s in enabling}
    ok = sum(passing(r, parent_exactness[r["parent_step_id"]]) for rows in results.values() for r in rows)
    covered = len({r["parent_step_id"] for rows in results.values() for r in rows
                   if passing(r, parent_exactness[r["parent_step_id"]])})
    say(f"follow_ups: {n} follow-ups of {len(enabling)} enabling steps, {ok} verified; "
        f"{covered} enabling steps have one")
    return {"stage": "follow_ups", "shards": len(calls), "rows": n, "verified": ok, "enabling_steps": len(enabling),
            "enabling_with_follow_up": covered}
