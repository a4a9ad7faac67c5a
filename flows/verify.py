"""The verify stage: every step, before against after, on seeded draws in the worker pool -> the
`verifications` table, one shard per workload family."""
from __future__ import annotations

from pathlib import Path

from flows.prefect_env import configure

configure()

from prefect import flow  # noqa: E402
from prefect.task_runners import ThreadPoolTaskRunner  # noqa: E402

from flows.config import Params  # noqa: E402
from flows.keys import stable_id  # noqa: E402
from flows.storage import RowCache, read_table  # noqa: E402
from flows.tasks import (  # noqa: E402
    STAGE_CODE,
    code_hash,
    group,
    run_tasks,
    say,
    shard_task,
    shared_pool,
    stage_key,
    write_table,
)


def verify_shard(steps: list[dict], signatures: dict[str, str], params, pool=None) -> list[dict]:
    from gpu_tasks.verify import pair_request, verify_pairs

    target, draws = params.verify["target"], int(params.verify["draws"])
    tolerances = params.verify["tolerance"]
    requests = [pair_request(s["before_leir"], s["after_leir"], signatures[s["program_id"]], target=target,
                             draws=draws, seed=params.seed, tolerances=tolerances) for s in steps]
    results = verify_pairs(requests, pool)
    version = _tvm_version()
    rows = []
    for s, v in zip(steps, results, strict=True):
        j = v.to_json()  # non-finite errors become null
        rows.append({"step_id": s["step_id"], "target": target, "status": v.status, "max_abs_err": j["max_abs_err"],
                     "max_rel_err": j["max_rel_err"], "rel_l2_err": j["rel_l2_err"], "draws": v.draws,
                     "bitwise_equal": v.bitwise_equal, "error_message": v.error or None, "tvm_version": version})
    return rows


def _tvm_version() -> str:
    from importlib.metadata import version

    return version("apache-tvm")


@shard_task
def verify_task(key: str, steps: list[dict], signatures: dict, raw: dict, profile: str) -> list[dict]:
    params = Params(raw, profile)
    return verify_shard(steps, signatures, params, shared_pool(params))


@flow(name="verify", task_runner=ThreadPoolTaskRunner(max_workers=1))
def verify_flow(raw: dict, profile: str, lake: str) -> dict:
    params, lake = Params(raw, profile), Path(lake)
    programs = read_table(lake, "programs").to_pylist()
    family_of = {p["program_id"]: p["family"] for p in programs}
    signatures = {p["program_id"]: p["signature"] for p in programs}
    steps = group(read_table(lake, "steps").to_pylist(), lambda s: family_of[s["program_id"]])
    cache, calls, known, keys = RowCache(lake, "verify"), [], {}, {}
    for family, rows in steps.items():
        keys[family] = {r["step_id"]: step_key(r, signatures[r["program_id"]], params) for r in rows}
        cached = cache.load(family)
        known[family] = {r["step_id"]: cached[keys[family][r["step_id"]]] for r in rows
                         if keys[family][r["step_id"]] in cached}
        todo = [r for r in rows if r["step_id"] not in known[family]]
        if todo:
            sigs = {r["program_id"]: signatures[r["program_id"]] for r in todo}
            calls.append((family, verify_task, (stage_key("verify", params, lake, todo, sigs), todo, sigs, raw,
                                                profile)))
    fresh = run_tasks("verify: build, run, compare", calls)
    results = {}
    for family, rows in steps.items():
        by_id = {**known[family], **{v["step_id"]: v for v in fresh.get(family, [])}}
        results[family] = [by_id[r["step_id"]] for r in rows]
        cache.save(family, {keys[family][i]: v for i, v in by_id.items()})
    n = write_table(lake, "verifications", results)
    reused = sum(len(k) for k in known.values())
    say(f"verify: {n - reused} steps verified, {reused} reused from earlier runs")
    return {"stage": "verify", "shards": len(calls), "rows": n, "verified": n - reused, "reused": reused}


def step_key(step: dict, signature: str, params: Params) -> str:
    """What decides a step's verification row: the step, both programs, the signature, the protocol's
    parameters and the code that lowers and runs them."""
    return stable_id("verify-step", step["step_id"], step["before_leir"], step["after_leir"], signature,
                     params.seed, params.verify, code_hash(STAGE_CODE["verify"]), length=32)
