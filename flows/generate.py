"""The generate stage: sample catalogue instances, translate them to LEIR, and verify each against
PyTorch eager (float64) -> the `programs` table, one shard per workload family."""
from __future__ import annotations

import json
from dataclasses import dataclass, replace
from pathlib import Path

from flows.prefect_env import configure

configure()

from prefect import flow, task  # noqa: E402
from prefect.task_runners import ThreadPoolTaskRunner  # noqa: E402

from flows.config import Params  # noqa: E402
from flows.tasks import key_from_arg, run_tasks, shared_pool, stage_key, write_table  # noqa: E402


@dataclass(frozen=True)
class Shard:
    stage: str
    name: str            # the family: also the shard's file name
    items: tuple          # what the shard works on (workload names, or program ids)


def plan_generate(params) -> list[Shard]:
    from workloads.registry import all_workloads

    prof = params.profile
    by_family: dict[str, list[str]] = {}
    for w in all_workloads():
        by_family.setdefault(w.family, []).append(w.name)
    families = sorted(by_family) if prof["families"] == "all" else list(prof["families"])
    unknown = [f for f in families if f not in by_family]
    if unknown:
        raise ValueError(f"params.yaml selects unknown families: {', '.join(unknown)}; "
                         f"the catalogue has {', '.join(sorted(by_family))}")
    cap = int(prof["max_workloads_per_family"])
    return [Shard("generate", f, tuple(by_family[f][:cap])) for f in sorted(families)]


def generate_shard(shard: Shard, params, pool=None) -> list[dict]:
    from gpu_tasks.verify import verify_against_reference
    from leir.canon import program_id
    from leir.frontend import TranslationError, translate
    from workloads.registry import get_workload
    from workloads.sampling import build, sample_instance

    prof, seed = params.profile, params.seed
    rows: dict[str, dict] = {}
    for name in shard.items:
        w = get_workload(name)
        for k in range(int(prof["instances_per_workload"])):
            base = sample_instance(w, seed, k, prof["workload_profile"])
            for dtype in [d for d in prof["dtypes"] if d in w.dtypes]:
                inst = replace(base, dtype=dtype)
                module, inputs = build(w, inst)
                try:
                    tr = translate(module, inputs, dtype=dtype)
                except TranslationError:
                    continue  # counted by the report as catalogue instances without a program
                v = verify_against_reference(tr.program, tr.signature, tr.reference, params.verify["target"],
                                             int(params.verify["draws"]), seed,
                                             tolerances=params.verify["tolerance"], pool=pool)
                pid = program_id(tr.program, tr.signature)
                err = v.to_json()["max_abs_err"]
                rows.setdefault(pid, {
                    "program_id": pid, "workload": w.name, "level": w.kind, "family": w.family,
                    "shape_params": json.dumps(inst.params, sort_keys=True), "dtype": dtype,
                    "signature": tr.signature.dumps(), "leir": tr.text, "n_nests": len(tr.program.nests),
                    "source": "catalogue", "seed": seed, "verification_status": v.status,
                    "max_abs_err": err})
    return [rows[k] for k in sorted(rows)]



@task(cache_key_fn=key_from_arg, persist_result=True)
def generate_task(key: str, shard: Shard, raw: dict, profile: str) -> list[dict]:
    params = Params(raw, profile)
    return generate_shard(shard, params, shared_pool(params))


@flow(name="generate", task_runner=ThreadPoolTaskRunner(max_workers=1))
def generate_flow(raw: dict, profile: str, lake: str) -> dict:
    params, lake = Params(raw, profile), Path(lake)
    plan = plan_generate(params)
    calls = [(s.name, generate_task, (stage_key("generate", params, lake, s.items), s, raw, profile)) for s in plan]
    n = write_table(lake, "programs", run_tasks("generate: translate and verify", calls))
    return {"stage": "generate", "shards": len(plan), "rows": n}
