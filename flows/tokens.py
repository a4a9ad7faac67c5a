"""The tokens stage: the `tokens` table and reports/token_efficiency.{json,png,md}.

One cached task per workload family lowers and counts that family's program states (programs and the
distinct after-states of its steps); the key is the states' content, the stage parameters, the code
hash of the packages that decide the lowering, and the source of the counting code and tokenizer
name. Runs after `filter` (it reads the samples' token counts) and before `report` (whose catalog
then has a `tokens` view). `flows.pipeline` runs it.
"""
from __future__ import annotations

import hashlib
import json
from dataclasses import asdict
from pathlib import Path

import pyarrow as pa
from prefect import flow
from prefect.task_runners import ThreadPoolTaskRunner

from flows.config import ROOT, Params
from flows.keys import rank
from flows.storage import read_table
from flows.tasks import by_family, run_tasks, shard_task, stage_key, write_table
from flows.token_stats import (
    TOKENIZER,
    State,
    build_token_report,
    program_states,
    token_rows,
)

LOWERING_THREADS = 1  # 2 threads or 2 processes measured no faster (flows.token_stats.count_many)


def counting_code() -> str:
    """sha256 of the counting code (not in flows.tasks.code_hash, which covers leir/workloads/...)."""
    h = hashlib.sha256(TOKENIZER.encode())
    for name in ("flows/token_stats.py",):
        h.update((ROOT / name).read_bytes())
    return h.hexdigest()[:16]


@shard_task
def tokens_task(key: str, states: list[dict]) -> list[dict]:
    return token_rows([State(**s) for s in states], workers=LOWERING_THREADS)


def sample_rows(samples, steps, programs) -> list[dict]:
    """Samples' token counts with their split and family (of their first step's program)."""
    family_of = {p["program_id"]: p["family"] for p in programs}
    program_of = {s["step_id"]: s["program_id"] for s in steps}
    out = []
    for s in samples.select(["sample_id", "split", "step_ids", "prompt_tokens", "answer_tokens"]).to_pylist():
        ids = json.loads(s["step_ids"] or "[]")
        family = family_of.get(program_of.get(ids[0])) if ids else None
        out.append({"split": s["split"], "family": family, "prompt_tokens": s["prompt_tokens"],
                    "answer_tokens": s["answer_tokens"]})
    return out


def cap_states(rows: list[dict], cap: int, seed: int) -> list[dict]:
    """The programs of a family and at most `cap` of its step states (seeded by the state's id), in
    id order: lowering to TIR and CUDA costs ~0.1 s a state, too much for every state at scale."""
    chosen = sorted((r for r in rows if r["kind"] == "step"), key=lambda r: rank(seed, "tokens", r["program_id"]))
    keep = {r["program_id"] for r in chosen[:cap]}
    return [r for r in rows if r["kind"] == "program" or r["program_id"] in keep]


@flow(name="tokens", task_runner=ThreadPoolTaskRunner(max_workers=1))
def tokens_flow(raw: dict, profile: str, lake: str, reports: str) -> dict:
    params, lake = Params(raw, profile), Path(lake)
    programs, steps = read_table(lake, "programs").to_pylist(), read_table(lake, "steps").to_pylist()
    states = [asdict(s) for s in program_states(programs, steps)]
    families = by_family(pa.Table.from_pylist(states)) if states else {}
    cap = params.profile.get("token_states_per_family")
    if cap is not None:  # every program, and a seeded sample of its family's after-states
        families = {f: cap_states(rows, int(cap), params.seed) for f, rows in families.items()}
    code = counting_code()
    calls = [(f, tokens_task, (stage_key("tokens", params, code, rows), rows)) for f, rows in families.items()]
    results = run_tasks("tokens: lower and count", calls)
    n = write_table(lake, "tokens", results)
    rows = [r for f in sorted(results) for r in results[f]]
    samples = sample_rows(read_table(lake, "samples"), steps, programs)
    figures = build_token_report(rows, samples, Path(reports))
    return {"stage": "tokens", "shards": len(calls), "rows": n, **figures}

