"""The verify stage: every step, before against after, on seeded draws in the worker pool -> the
`verifications` table, one shard per workload family."""
from __future__ import annotations

from pathlib import Path

from prefect import flow
from prefect.task_runners import ThreadPoolTaskRunner

from flows.cluster import on_cluster
from flows.config import Params
from flows.keys import stable_id
from flows.storage import RowCache, StorageError, read_table
from flows.tasks import (
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

# Statuses that are no verdict on the step: the worker died or ran out of time, or running failed.
# None of them replaces a verdict the lake holds.
UNCOMPUTED = ("crash", "timeout", "runtime_error")
# The worker died or ran out of time: the next run tries the step again (a runtime error is the
# program's own and stays, unless a refusal kept it out of the lake: then it is tried again too).
RETRIED = ("crash", "timeout")
VERDICTS = ("exact", "close", "mismatch")
# On a Dask cluster a family's steps go out in tasks of whole programs of at most this many steps, so
# that the workers share a family (one task per family left a worker idle while the other verified
# the largest family). Locally a family stays one task: its pool takes the groups of all its programs
# at once, with no tail per task.
CLUSTER_TASK_STEPS = 64


class UncomputedVerifications(StorageError):
    """A verify run that could not compute verdicts the lake already holds: nothing is written."""


def verify_targets(program_target: str | None, params, gpu: bool) -> list[str]:
    """The targets a step is verified on: `verify.target` always (LEIR's semantics do not depend on
    the target, so the step of a GPU program is checked on the CPU too), and CUDA as well for the step
    of a GPU program when a GPU is present."""
    base = params.verify["target"]
    return [base] + (["cuda"] if gpu and program_target == "cuda" and base != "cuda" else [])


def verify_shard(steps: list[dict], signatures: dict[str, str], params, pool=None,
                 targets: list[str] | None = None) -> list[dict]:
    """One verification row per step, on `targets` (one per step; `verify.target` for all without)."""
    from gpu_tasks.verify import pair_request, verify_pairs

    draws, tolerances = int(params.verify["draws"]), params.verify["tolerance"]
    targets = targets or [params.verify["target"]] * len(steps)
    requests = [pair_request(s["before_leir"], s["after_leir"], signatures[s["program_id"]], target=target,
                             draws=draws, seed=params.seed, tolerances=tolerances)
                for s, target in zip(steps, targets, strict=True)]
    results = verify_pairs(requests, pool)
    version = _tvm_version()
    rows = []
    for s, target, v in zip(steps, targets, results, strict=True):
        j = v.to_json()  # non-finite errors become null
        rows.append({"step_id": s["step_id"], "target": target, "status": v.status, "max_abs_err": j["max_abs_err"],
                     "max_rel_err": j["max_rel_err"], "rel_l2_err": j["rel_l2_err"], "draws": v.draws,
                     "bitwise_equal": v.bitwise_equal, "error_message": v.error or None, "tvm_version": version})
    return rows


def _tvm_version() -> str:
    from importlib.metadata import version

    return version("apache-tvm")


@shard_task
def verify_task(key: str, steps: list[dict], signatures: dict, raw: dict, profile: str,
                targets: list[str] | None = None) -> list[dict]:
    params = Params(raw, profile)
    return verify_shard(steps, signatures, params, shared_pool(params), targets)


def start_verify_pool(raw: dict, profile: str) -> int:
    """Start this process's verification pool (`flows.tasks.shared_pool`) now rather than in the first
    task (its fork server imports TVM: some 5 s); returns the pool's size (0: verifying in-process). A
    benchmark warms every worker with it, as the local runner's pool is warm from the stages before."""
    pool = shared_pool(Params(raw, profile))
    return 0 if pool is None else pool.size


def gpu_present(pool=None) -> bool:
    """Whether a CUDA GPU is present, asked in a worker (the flow's own process never imports TVM)."""
    from gpu_tasks.runner import cuda_present

    return (pool.broadcast(cuda_present)[0] is True) if pool is not None else cuda_present()


@flow(name="verify", task_runner=ThreadPoolTaskRunner(max_workers=1))
def verify_flow(raw: dict, profile: str, lake: str) -> dict:
    params, lake = Params(raw, profile), Path(lake)
    programs = read_table(lake, "programs").to_pylist()
    family_of = {p["program_id"]: p["family"] for p in programs}
    signatures = {p["program_id"]: p["signature"] for p in programs}
    target_of = {p["program_id"]: p.get("target") for p in programs}
    gpu = any(t == "cuda" for t in target_of.values()) and gpu_present(shared_pool(params))
    steps = group(read_table(lake, "steps").to_pylist(), lambda s: family_of[s["program_id"]])
    cluster = on_cluster()
    cache, attempts = RowCache(lake, "verify"), RowCache(lake, "verify-attempts")
    calls, known, keys, items, tried = [], {}, {}, {}, {}
    for family, rows in steps.items():
        items[family] = [(r, t) for r in rows for t in verify_targets(target_of[r["program_id"]], params, gpu)]
        keys[family] = {(r["step_id"], t): step_key(r, signatures[r["program_id"]], params, t)
                        for r, t in items[family]}
        cached = cache.load(family)
        known[family] = {k: cached[key] for k, key in keys[family].items()
                         if key in cached and cached[key]["status"] not in RETRIED}
        tried[family] = attempts.load(family)
        todo = [(r, t) for r, t in items[family] if (r["step_id"], t) not in known[family]]
        for part, chunk in enumerate(task_chunks(todo, CLUSTER_TASK_STEPS if cluster else None)):
            todo_steps, targets = [r for r, _ in chunk], [t for _, t in chunk]
            sigs = {r["program_id"]: signatures[r["program_id"]] for r in todo_steps}
            # a step whose worker died or timed out before runs again, under a task key of its own
            todo_keys = [keys[family][(r["step_id"], t)] for r, t in chunk]
            again = sorted((k, tried[family][k]["n"]) for k in todo_keys if k in tried[family])
            calls.append((f"{family}#{part}", verify_task,
                          (stage_key("verify", params, lake, todo_steps, sigs, targets, *again),
                           todo_steps, sigs, raw, profile, targets)))
    fresh: dict[str, list[dict]] = {}
    for name, rows in run_tasks("verify: build, run, compare", calls).items():
        fresh.setdefault(name.rpartition("#")[0], []).extend(rows)
    every = [v for rows in fresh.values() for v in rows]
    lost = uncomputed_verdicts(lake, every)
    refused = {(v["step_id"], v["target"]) for v in lost}
    for family in steps:
        # counted before any refusal, and never down: a step that died, or whose refused row is
        # replayed, runs under a task key it never had (never a cached failure again)
        bump = [(v["step_id"], v["target"]) for v in fresh.get(family, [])
                if v["status"] in RETRIED or (v["step_id"], v["target"]) in refused]
        current = set(keys[family].values())
        counts = {k: n for k, n in tried[family].items() if k in current}
        counts.update({keys[family][k]: {"n": counts.get(keys[family][k], {"n": 0})["n"] + 1} for k in bump})
        if counts or tried[family]:
            attempts.save(family, counts)
    refuse_uncomputed(lake, every, lost)
    results = {}
    for family in steps:
        by_id = {**known[family], **{(v["step_id"], v["target"]): v for v in fresh.get(family, [])}}
        results[family] = [by_id[(r["step_id"], t)] for r, t in items[family]]
        cache.save(family, {keys[family][k]: v for k, v in by_id.items()})
    n = write_table(lake, "verifications", results)
    reused = sum(len(k) for k in known.values())
    on_cuda = sum(1 for rows in results.values() for v in rows if v["target"] == "cuda")
    gpu_steps = sum(1 for rows in steps.values() for r in rows if target_of[r["program_id"]] == "cuda")
    say(f"verify: {n - reused} verifications run, {reused} reused from earlier runs; {gpu_steps} steps of GPU "
        f"programs, {on_cuda} of them also verified on CUDA" + ("" if gpu else " (no GPU on this machine)"))
    return {"stage": "verify", "shards": len(calls), "rows": n, "verified": n - reused, "reused": reused,
            "gpu_program_steps": gpu_steps, "verified_on_cuda": on_cuda}


def task_chunks(items: list[tuple[dict, str]], most: int | None) -> list[list[tuple[dict, str]]]:
    """`items` ((step, target), in order) in runs of whole programs of at most `most` items each (a
    program with more is a run of its own); all in one run without `most`, none without items."""
    if not items:
        return []
    if most is None:
        return [items]
    programs: dict[str, list[tuple[dict, str]]] = {}  # in order of first appearance
    for item in items:
        programs.setdefault(item[0]["program_id"], []).append(item)
    chunks: list[list[tuple[dict, str]]] = []
    for program in programs.values():
        if chunks and len(chunks[-1]) + len(program) <= most:
            chunks[-1].extend(program)
        else:
            chunks.append(list(program))
    return chunks


def uncomputed_verdicts(lake: Path, fresh: list[dict]) -> list[dict]:
    """The fresh rows that could not be computed (UNCOMPUTED) where the lake's verifications table
    holds a verdict for the same step and target (the step id covers both programs, so the old verdict
    is about the same step)."""
    failed = [v for v in fresh if v["status"] in UNCOMPUTED]
    if not failed:
        return []
    held = {(v["step_id"], v["target"]): v["status"] for v in read_table(lake, "verifications").to_pylist()}
    return [v for v in failed if held.get((v["step_id"], v["target"])) in VERDICTS]


def refuse_uncomputed(lake: Path, fresh: list[dict], lost: list[dict] | None = None) -> None:
    """Raise UncomputedVerifications, before anything is written, when some fresh rows could not be
    computed where the lake holds verdicts (`lost`, found here unless given): a broken environment or
    protocol would otherwise replace the lake's evidence with its failures."""
    lost = uncomputed_verdicts(lake, fresh) if lost is None else lost
    if lost:
        first = lost[0]
        raise UncomputedVerifications(
            f"verify: {len(lost)} of {len(fresh)} verifications could not be computed where the lake holds a "
            f"verdict (first: step {first['step_id']} on {first['target']}: {first['status']}: "
            f"{first.get('error_message') or 'no message'}); the lake's verifications are kept and nothing "
            "was written: fix the cause and run the stage again")


def step_key(step: dict, signature: str, params: Params, target: str | None = None) -> str:
    """What decides a step's verification row: the step, both programs, the signature, the protocol's
    parameters, the target when it is not `verify.target`, and the code that lowers and runs them."""
    other = (target,) if target not in (None, params.verify["target"]) else ()
    return stable_id("verify-step", step["step_id"], step["before_leir"], step["after_leir"], signature,
                     params.seed, params.verify, code_hash(STAGE_CODE["verify"]), *other, length=32)
