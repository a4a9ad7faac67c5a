"""What each producing stage computes for one shard (a workload family), without the orchestration.

- generate: sample catalogue instances, translate them to LEIR, verify against PyTorch (float64);
- transform: every strategy at every site of every verified original (parameter variants capped),
  and the mathematical strategies again on the results of compute_inline (multi-step, depth 1..N);
- verify: every step, before against after, in the worker pool.
Each function returns table rows (dicts); `flows.pipeline` caches and writes them.
"""
from __future__ import annotations

import json
from dataclasses import dataclass, replace

from flows.keys import stable_id

PASSING = ("exact", "close")


@dataclass(frozen=True)
class Shard:
    stage: str
    name: str            # the family: also the shard's file name
    items: tuple          # what the shard works on (workload names, or program ids)


# --- generate ----------------------------------------------------------------------------------------

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


# --- transform ---------------------------------------------------------------------------------------

def transform_shard(programs: list[dict], params) -> list[dict]:
    from leir.parse import parse_program
    from leir.signature import Signature
    from strategies.base import Context

    rows: dict[str, dict] = {}
    for p in programs:
        if p["verification_status"] not in PASSING:
            continue
        sig = Signature.from_json(p["signature"])
        root = Context(parse_program(p["leir"]), sig, params.verify["target"])
        for row in _steps_from(root, p["program_id"], None, 0, params):
            rows.setdefault(row["step_id"], row)
    return [rows[k] for k in sorted(rows)]


def _steps_from(ctx, program_id: str, parent: str | None, depth: int, params) -> list[dict]:
    """Steps from one program state: all strategies at depth 0; after compute_inline, the
    mathematical ones (and compute_inline again) up to `inline_depth`."""
    from strategies.registry import registered

    prof = params.profile
    out = []
    for strategy in registered():
        if depth > 0 and strategy.level != "mathematical" and strategy.name != "compute_inline":
            continue
        for t in strategy.transformations(ctx, limit=int(prof["max_steps_per_program_strategy"]),
                                          per_site=int(prof["max_variants_per_site"])):
            row = step_row(t, program_id, parent, depth, ctx.signature)
            out.append(row)
            if t.strategy == "compute_inline" and depth < int(prof["inline_depth"]):
                out.extend(_steps_from(ctx.with_program(t.after), program_id, row["step_id"], depth + 1, params))
    return out


def step_row(t, program_id: str, parent: str | None, depth: int, signature) -> dict:
    from leir.canon import program_id as pid_of
    from strategies.cot import answer

    step_id = stable_id("step", program_id, parent, t.before_text, t.strategy, t.site.to_json(), t.params)
    return {"step_id": step_id, "program_id": program_id, "parent_step_id": parent, "depth": depth,
            "strategy": t.strategy, "level": t.level, "site": json.dumps(t.site.to_json(), sort_keys=True),
            "params": t.params_json(), "before_leir": t.before_text, "after_leir": t.after_text,
            "after_program_id": pid_of(t.after, signature), "exactness": t.exactness, "cot": answer(t)}


# --- verify ------------------------------------------------------------------------------------------

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
