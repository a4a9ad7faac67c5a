"""The filter stage: verified, de-duplicated, balanced steps, then samples split by family.

Every rule logs how many rows it kept (`Counter` rows become `reports/filter.json`). Choices are
deterministic: rows are ranked by sha256(seed, step_id) (`flows.keys.rank`), never by DuckDB's
`hash()` or `random()`, so a rebuild gives the same samples on any machine.
"""
from __future__ import annotations

import json
import math
from dataclasses import dataclass
from pathlib import Path

import duckdb
import pyarrow as pa

from flows.prefect_env import configure

configure()

from prefect import flow  # noqa: E402
from prefect.task_runners import ThreadPoolTaskRunner  # noqa: E402

from flows.config import Params  # noqa: E402
from flows.keys import rank, stable_id  # noqa: E402
from flows.storage import read_table  # noqa: E402
from flows.tasks import group, write_table  # noqa: E402


@dataclass(frozen=True)
class Counter:
    rule: str
    before: int
    after: int

    def to_json(self) -> dict:
        return {"rule": self.rule, "before": self.before, "after": self.after}


def split_families(families: list[str], seed: int, test_fraction: float) -> dict[str, str]:
    """family -> 'train' | 'test': the ceil(fraction * n) families with the smallest seeded rank are
    held out (at least one when there are two or more families)."""
    ordered = sorted(sorted(set(families)), key=lambda f: rank(seed, "split", f))
    n_test = math.ceil(test_fraction * len(ordered)) if len(ordered) > 1 else 0
    return {f: ("test" if i < n_test else "train") for i, f in enumerate(ordered)}


def select_steps(programs: pa.Table, steps: pa.Table, verifications: pa.Table,
                 params) -> tuple[pa.Table, list[Counter]]:
    """Steps that are verified, unique per (program state, result) and within the balance caps."""
    f, seed = params.filter, params.seed
    target = params.verify["target"]
    con = duckdb.connect()
    ranks = pa.table({"step_id": steps.column("step_id"),
                      "rnk": [rank(seed, "step", s) for s in steps.column("step_id").to_pylist()]})
    con.register("programs", programs)
    con.register("steps", steps)
    con.register("verifications", verifications)
    con.register("ranks", ranks)
    counters = [Counter("steps generated", steps.num_rows, steps.num_rows)]

    def run(sql: str, args=None):
        return con.execute(sql, args or []).fetchall()  # DuckDB 2: consume every result

    def count(rel: str) -> int:
        return run(f"SELECT count(*) FROM {rel}")[0][0]

    run(f"""CREATE TEMP TABLE v AS
        SELECT s.*, p.family, r.rnk, v.status FROM steps s
        JOIN programs p USING (program_id) JOIN ranks r USING (step_id)
        JOIN verifications v ON v.step_id = s.step_id AND v.target = '{target}'""")
    counters.append(Counter("has a verification", steps.num_rows, count("v")))
    # A step of a GPU program verified on CUDA too (a GPU was present) must pass there as well.
    run(f"""CREATE TEMP TABLE ok AS SELECT * FROM v
        WHERE (status = 'exact' OR (status = 'close' AND exactness = 'reassociating'))
        AND NOT EXISTS (SELECT 1 FROM verifications c WHERE c.step_id = v.step_id AND c.target <> '{target}'
                        AND NOT (c.status = 'exact' OR (c.status = 'close' AND v.exactness = 'reassociating')))""")
    counters.append(Counter("verified (exact; close only for reassociating strategies)", count("v"), count("ok")))
    # Where several steps give the same result, keep the one of the rarest strategy (then the seeded
    # rank): an identity two strategies share stays labelled, and rare strategies are not lost.
    run("""CREATE TEMP TABLE uniq AS SELECT * EXCLUDE (n_strategy) FROM (
            SELECT *, count(*) OVER (PARTITION BY strategy) AS n_strategy FROM ok)
        QUALIFY row_number() OVER (PARTITION BY before_leir, after_program_id ORDER BY n_strategy, rnk) = 1""")
    counters.append(Counter("unique result per program state (alpha-equivalence)", count("ok"), count("uniq")))
    caps = _caps(f)
    con.register("caps", pa.table({"strategy": list(caps), "cap": list(caps.values())}))
    run("""CREATE TEMP TABLE capped AS SELECT u.* FROM uniq u LEFT JOIN caps c USING (strategy)
        QUALIFY row_number() OVER (PARTITION BY strategy ORDER BY rnk) <= coalesce(c.cap, $cap)""",
                {"cap": int(f["cap_per_strategy"])})
    counters.append(Counter("cap per strategy (easy strategies down-weighted)", count("uniq"), count("capped")))
    level_caps = pa.table({"level": list(f["cap_per_level"]), "lcap": [int(v) for v in f["cap_per_level"].values()]})
    con.register("level_caps", level_caps)
    run("""CREATE TEMP TABLE kept AS SELECT c.* FROM capped c LEFT JOIN level_caps l USING (level)
        QUALIFY row_number() OVER (PARTITION BY level ORDER BY rnk) <= coalesce(l.lcap, 1000000000)""")
    counters.append(Counter("cap per level", count("capped"), count("kept")))
    kept = con.sql("SELECT * EXCLUDE (rnk) FROM kept ORDER BY step_id").to_arrow_table()
    con.close()
    return kept, counters


def _caps(f: dict) -> dict[str, int]:
    base = int(f["cap_per_strategy"])
    return {s: max(1, int(base * float(f["easy_weight"]))) for s in f.get("easy_strategies", [])}


def assemble_samples(kept: pa.Table, programs: pa.Table, params, count_tokens=None) -> tuple[list[dict], list[Counter]]:
    """Single-answer samples (one per kept step) and multi-answer samples (k steps of one program
    state with distinct strategies, for a seeded fraction of states), split by family."""
    from leir.parse import parse_program
    from leir.signature import Signature
    from strategies.cot import TASK_MULTI, combine_answers, prompt

    f, seed = params.filter, params.seed
    count_tokens = count_tokens or (lambda text: None)
    sigs = {r["program_id"]: r["signature"] for r in programs.select(["program_id", "signature"]).to_pylist()}
    targets = program_targets(programs, params.verify["target"])
    rows = kept.to_pylist()
    split_of = split_families([r["family"] for r in programs.to_pylist()], seed, float(f["test_fraction"]))
    prompts: dict[tuple[str, str], str] = {}

    def target_of(row) -> str:  # the program's target, whatever the strategy (issue 25)
        return targets[row["program_id"]]

    def prompt_for(row, task=None):
        key = (row["before_leir"], task or "", target_of(row))
        if key not in prompts:
            program, sig = parse_program(row["before_leir"]), Signature.from_json(sigs[row["program_id"]])
            args = (program, sig, target_of(row)) + ((task,) if task is not None else ())
            prompts[key] = prompt(*args)
        return prompts[key]

    samples = []
    for r in rows:
        samples.append(_sample(split_of[r["family"]], prompt_for(r), r["cot"], [r], count_tokens))
    by_state: dict[tuple[str, str], list[dict]] = {}  # (state, target): one target per prompt
    for r in sorted(rows, key=lambda r: rank(seed, "multi", r["step_id"])):
        by_state.setdefault((r["before_leir"], target_of(r)), []).append(r)
    k, fraction, multi = int(f["multi_answer_k"]), float(f["multi_answer_fraction"]), 0
    for state in sorted(by_state, key=lambda s: rank(seed, "state", *s)):
        if rank(seed, "pick", *state) >= _threshold(fraction):
            continue
        chosen, seen = [], set()
        for r in by_state[state]:
            if r["strategy"] not in seen:
                chosen.append(r)
                seen.add(r["strategy"])
            if len(chosen) == k:
                break
        if len(chosen) == k:
            task = TASK_MULTI.format(k=k)
            samples.append(_sample(split_of[chosen[0]["family"]], prompt_for(chosen[0], task),
                                   combine_answers([r["cot"] for r in chosen]), chosen, count_tokens))
            multi += 1
    counters = [Counter("single-answer samples", len(rows), len(rows)),
                Counter("multi-answer samples (program states with k distinct strategies)", len(by_state), multi)]
    return sorted(samples, key=lambda s: s["sample_id"]), counters


def program_targets(programs: pa.Table, default: str) -> dict[str, str]:
    """program_id -> the program's target (`llvm` or `cuda`); `default` for a lake made before programs
    had one (no `target` column, or a null)."""
    names = ["program_id"] + (["target"] if "target" in programs.column_names else [])
    return {r["program_id"]: r.get("target") or default for r in programs.select(names).to_pylist()}


def _threshold(fraction: float) -> str:
    """The rank (32 hex digits) below which a share `fraction` of uniformly ranked items falls."""
    return f"{min(int(fraction * 16**32), 16**32 - 1):032x}"


def _sample(split: str, prompt_text: str, answer: str, rows: list[dict], count_tokens) -> dict:
    ids = [r["step_id"] for r in rows]
    return {"sample_id": stable_id("sample", ids), "split": split, "prompt": prompt_text, "answer": answer,
            "step_ids": json.dumps(ids), "strategies": json.dumps([r["strategy"] for r in rows]),
            "prompt_tokens": count_tokens(prompt_text), "answer_tokens": count_tokens(answer)}


@flow(name="filter", task_runner=ThreadPoolTaskRunner(max_workers=1))
def filter_flow(raw: dict, profile: str, lake: str, reports: str) -> dict:
    from flows.token_stats import count_tokens

    params, lake = Params(raw, profile), Path(lake)
    programs = read_table(lake, "programs")
    kept, counters = select_steps(programs, read_table(lake, "steps"), read_table(lake, "verifications"), params)
    samples, more = assemble_samples(kept, programs, params, count_tokens)
    by_split = group(samples, lambda s: s["split"])
    write_table(lake, "samples", by_split)
    Path(reports).mkdir(parents=True, exist_ok=True)
    (Path(reports) / "filter.json").write_text(json.dumps([c.to_json() for c in counters + more], indent=1) + "\n")
    return {"stage": "filter", "kept_steps": kept.num_rows, "samples": len(samples)}
