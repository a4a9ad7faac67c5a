"""The generate stage: sample catalogue instances, translate them to LEIR, and verify each against
PyTorch eager (float64) -> the `programs` table, one shard per workload family."""
from __future__ import annotations

import json
from dataclasses import dataclass, replace
from pathlib import Path

from prefect import flow
from prefect.task_runners import ThreadPoolTaskRunner

from flows.config import Params, own_error_factor
from flows.keys import in_share
from flows.tasks import prepared_ahead, run_tasks, shard_task, shared_pool, stage_key, write_table


@dataclass(frozen=True)
class Shard:
    stage: str
    name: str            # the family: also the shard's file name
    items: tuple          # (workload name, pinned shape params as JSON, or None for the sampled instances)


def plan_generate(params) -> list[Shard]:
    """One shard per family: the profile's workloads of that family (its `workloads` list, or the
    first `max_workloads_per_family` of each of its `families`), then its `pinned` instances."""
    from workloads.registry import all_workloads

    prof = params.profile
    by_family: dict[str, list[str]] = {}
    for w in all_workloads():
        by_family.setdefault(w.family, []).append(w.name)
    chosen: dict[str, list[tuple]] = {}
    if prof.get("workloads"):
        for name in prof["workloads"]:
            chosen.setdefault(_workload(name).family, []).append((name, None))
    else:
        families = sorted(by_family) if prof["families"] == "all" else list(prof["families"])
        unknown = [f for f in families if f not in by_family]
        if unknown:
            raise ValueError(f"params.yaml selects unknown families: {', '.join(unknown)}; "
                             f"the catalogue has {', '.join(sorted(by_family))}")
        cap = int(prof.get("max_workloads_per_family") or 10**9)
        chosen = {f: [(n, None) for n in by_family[f][:cap]] for f in families}
    for pin in prof.get("pinned") or []:
        item = (pin["workload"], json.dumps(pin["params"], sort_keys=True))
        chosen.setdefault(_workload(pin["workload"]).family, []).append(item)
    return [Shard("generate", f, tuple(chosen[f])) for f in sorted(chosen)]


def _workload(name: str):
    from workloads.registry import get_workload

    try:
        return get_workload(name)
    except KeyError:
        raise ValueError(f"params.yaml selects unknown workload {name!r} (see `steptp workloads list`)") from None


def instances_of(workload, params, pinned: str | None = None) -> list:
    """The instances of one shard item, before the dtypes are applied: the profile's
    `instances_per_workload` sampled ones, or the one pinned instance (`shape_source = "pinned"`)."""
    from workloads.sampling import Instance, sample_instance

    prof, seed = params.profile, params.seed
    if pinned is not None:
        return [Instance(workload.name, seed, -1, prof["workload_profile"], json.loads(pinned), workload.dtypes[0],
                         "pinned")]
    count = int(prof["instances_per_workload"])
    return [sample_instance(workload, seed, k, prof["workload_profile"]) for k in range(count)]


def program_dtypes(prof: dict, workload, pinned: str | None = None) -> list[str]:
    """The dtypes an instance is built in: the profile's `dtypes`, then its `extra_dtypes` that list the
    workload (sampled instances only; pinned ones are the search's float32 programs), where the
    workload offers them."""
    dtypes = list(prof["dtypes"])
    if pinned is None:
        dtypes += [d for d, names in (prof.get("extra_dtypes") or {}).items()
                   if workload.name in names and d not in dtypes]
    return [d for d in dtypes if d in workload.dtypes]


def program_target(program_id: str, seed: int, gpu_share: float) -> str:
    """The target an original program is written for (it belongs to the program, never to a
    strategy): `cuda` for a seeded `gpu_share` of the programs, keyed by the program's identity, `llvm`
    for the others. Every state of the program, and every prompt about it, keeps that target."""
    return "cuda" if in_share(gpu_share, seed, "target", program_id) else "llvm"


# A shard's instances go to verification this many at a time (the pool's workers take them in
# parallel) while the next ones are translated and their PyTorch references computed in a thread of
# this process (flows.tasks.prepared_ahead): one at a time, the translation left the pool idle and the
# pool left it waiting (release profile, AMD EPYC 2 cores: 222 s -> 170 s, the same `programs` bytes).
GENERATE_CHUNK = 8


def generate_shard(shard: Shard, params, pool=None) -> list[dict]:
    """The programs of one shard: each instance of its workloads in each dtype, translated and verified
    against PyTorch; the first instance of a program (by its id) keeps its row."""
    from functools import partial

    from gpu_tasks.verify import verify_requests
    from leir.canon import program_id
    from workloads.shapes import estimate_work

    prof, seed = params.profile, params.seed
    items = [(w, replace(base, dtype=dtype)) for name, pinned in shard.items for w in [_workload(name)]
             for base in instances_of(w, params, pinned) for dtype in program_dtypes(prof, w, pinned)]
    chunks = [items[k:k + GENERATE_CHUNK] for k in range(0, len(items), GENERATE_CHUNK)]
    rows: dict[str, dict] = {}
    for translated in prepared_ahead(chunks, partial(_translated, params=params), ahead=pool is not None):
        verdicts = verify_requests([request for *_, request in translated], pool)
        for (w, inst, tr, _), v in zip(translated, verdicts, strict=True):
            pid, verdict = program_id(tr.program, tr.signature), v.to_json()
            rows.setdefault(pid, {
                "program_id": pid, "workload": w.name, "level": w.kind, "family": w.family,
                "shape_params": json.dumps(inst.params, sort_keys=True), "dtype": inst.dtype,
                "signature": tr.signature.dumps(), "leir": tr.text, "n_nests": len(tr.program.nests),
                "source": "catalogue", "seed": seed, "verification_status": v.status,
                "max_abs_err": verdict["max_abs_err"], "shape_source": inst.shape_source,
                "work": estimate_work(w, inst.params),
                "rounding_share": verdict["tolerance_share"] if v.passed else None})
    return [rows[k] for k in sorted(rows)]


def _translated(items: list, params) -> list[tuple]:
    """(workload, instance, translation, its verification request) of each of `items` that translates
    (the others are counted by the report as catalogue instances without a program)."""
    from gpu_tasks.verify import reference_request
    from leir.frontend import TranslationError, translate
    from workloads.sampling import build

    out = []
    for w, inst in items:
        module, inputs = build(w, inst)
        try:
            tr = translate(module, inputs, dtype=inst.dtype)
        except TranslationError:
            continue
        out.append((w, inst, tr, reference_request(
            tr.program, tr.signature, tr.reference, tr.reference_in_dtype, params.verify["target"],
            int(params.verify["draws"]), params.seed, tolerances=params.verify["tolerance"],
            own_factor=own_error_factor(params))))
    return out


@shard_task
def generate_task(key: str, shard: Shard, raw: dict, profile: str) -> list[dict]:
    params = Params(raw, profile)
    return generate_shard(shard, params, shared_pool(params))


@flow(name="generate", task_runner=ThreadPoolTaskRunner(max_workers=1))
def generate_flow(raw: dict, profile: str, lake: str) -> dict:
    params, lake = Params(raw, profile), Path(lake)
    plan = plan_generate(params)
    calls = [(s.name, generate_task, (stage_key("generate", params, lake, s.items), s, raw, profile)) for s in plan]
    results = run_tasks("generate: translate and verify", calls)
    # The target is set after the cached tasks: a new `gpu_share` translates and verifies nothing again.
    results = {family: [{**r, "target": program_target(r["program_id"], params.seed, params.gpu_share)} for r in rows]
               for family, rows in results.items()}
    n = write_table(lake, "programs", results)
    return {"stage": "generate", "shards": len(plan), "rows": n}
