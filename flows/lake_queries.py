"""What the lake's tables say about a release: the released steps (with their verification and
family), each strategy's coverage, the family splits, and what a model is scored against per split.
Domain queries over the tables that flows.storage stores; the stages that release, report, validate,
measure and evaluate share them."""
from __future__ import annotations

import json
from pathlib import Path

import pyarrow as pa

from flows.storage import read_table


def verified_sql(status: str = "v.status", exactness: str = "s.exactness") -> str:
    """The SQL condition that a step verified as its strategy declares: exact, or close where the step
    reassociates (`status` and `exactness` name the columns; values are never interpolated)."""
    return f"({status} = 'exact' OR ({status} = 'close' AND {exactness} = 'reassociating'))"


def release_inputs(lake: Path, params=None):
    """The released steps (joined with their verification and family) and the strategies the
    selection could produce (those with at least one verified step)."""
    import duckdb

    con = duckdb.connect()
    for name in ("programs", "steps", "verifications", "samples"):
        con.register(name, read_table(lake, name))
    con.register("released", pa.table({"step_id": released_ids(lake)}))
    steps = con.sql("""SELECT s.step_id, s.program_id, s.strategy, s.level, s.before_leir, s.after_leir, s.exactness,
                              v.status,
                              p.family
                       FROM steps s JOIN released USING (step_id) JOIN programs p USING (program_id)
                       JOIN verifications v USING (step_id) WHERE v.target = $target
                       ORDER BY s.step_id""", params={"target": _target(params)}).to_arrow_table()
    producible = [r[0] for r in con.execute(f"""SELECT DISTINCT s.strategy FROM steps s JOIN verifications v
        USING (step_id) WHERE v.target = $target AND {verified_sql()} ORDER BY 1""",
                                            {"target": _target(params)}).fetchall()]
    con.close()
    return steps, producible


def _target(params) -> str:
    """The verify stage's target: a GPU program's step may also have a CUDA row."""
    return params.verify["target"] if params is not None else "llvm"


def released_ids(lake: Path) -> list[str]:
    """The step ids the samples release, sorted."""
    return sorted({i for row in read_table(lake, "samples").column("step_ids").to_pylist() for i in json.loads(row)})


def released_step_rows(lake: Path) -> list[dict]:
    """The whole `steps` rows of the released steps, by step id."""
    wanted = set(released_ids(lake))
    return [r for r in read_table(lake, "steps").to_pylist() if r["step_id"] in wanted]


def strategy_coverage(lake: Path, released: pa.Table, target: str = "llvm") -> list[dict]:
    """Per strategy: the programs with a site, the steps made (after the profile's verification budget),
    those that verified, and those released; what the card says for a strategy short of samples."""
    import duckdb

    con = duckdb.connect()
    for name in ("steps", "verifications"):
        con.register(name, read_table(lake, name))
    con.register("released", released.select(["strategy"]))
    rows = con.sql(f"""WITH made AS (
                          SELECT s.strategy, count(DISTINCT s.program_id) AS programs, count(*) AS steps,
                                 count(*) FILTER (WHERE {verified_sql()}) AS verified
                          FROM steps s JOIN verifications v USING (step_id) WHERE v.target = $target
                          GROUP BY 1),
                      out AS (SELECT strategy, count(*) AS released FROM released GROUP BY 1)
                      SELECT made.*, coalesce(out.released, 0) AS released
                      FROM made LEFT JOIN out USING (strategy) ORDER BY strategy""",
                   params={"target": target}).fetchall()
    con.close()
    from strategies.registry import registered

    made = {r[0]: dict(zip(("strategy", "programs", "steps", "verified", "released"), r, strict=True)) for r in rows}
    for strategy in registered():
        made.setdefault(strategy.name, {"strategy": strategy.name, "programs": 0, "steps": 0, "verified": 0,
                                        "released": 0})
    return [made[k] for k in sorted(made)]


def family_splits(lake: Path) -> dict[str, str]:
    """family -> 'train' | 'test', as the filter stage chose it (the `splits` table): the one split of
    every stage that holds families out (samples, the cost model's held-out quality, the measured
    configs). A family the table does not list (no program when the filter ran) is train."""
    table = read_table(lake, "splits")
    return dict(zip(table.column("family").to_pylist(), table.column("split").to_pylist(), strict=True))


def split_sources(lake: Path, split: str) -> dict[str, tuple[object, str, str]]:
    """sample_id -> (signature as JSON object, original LEIR, prompt) for the samples of `split`: what
    a model is scored against (`steptp eval --split`). The original is the first step's before-state."""
    samples = [s for s in read_table(lake, "samples").to_pylist() if s["split"] == split]
    steps = {s["step_id"]: s for s in read_table(lake, "steps").select(["step_id", "program_id", "before_leir"])
             .to_pylist()}
    sigs = {p["program_id"]: p["signature"] for p in read_table(lake, "programs")
            .select(["program_id", "signature"]).to_pylist()}
    out = {}
    for sample in samples:
        step = steps[json.loads(sample["step_ids"])[0]]
        out[sample["sample_id"]] = (json.loads(sigs[step["program_id"]]), step["before_leir"], sample["prompt"])
    return out


def structural_overlap(lake: Path, split: str) -> dict[str, bool | None]:
    """sample_id -> the sample's `structural_overlap` flag (test: its structure was seen in train; train:
    its structure recurs in test), for `split`:
    what `steptp eval --split` scores the clean part on."""
    table = read_table(lake, "samples").select(["sample_id", "split", "structural_overlap"]).to_pylist()
    return {r["sample_id"]: r["structural_overlap"] for r in table if r["split"] == split}
