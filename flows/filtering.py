"""The filter stage: verified, de-duplicated, balanced steps, then samples split by family.

Every rule logs how many rows it kept (`RuleCount` rows become `reports/filter.json`). Choices are
deterministic: rows are ranked by sha256(seed, step_id) (`flows.keys.rank`), never by DuckDB's
`hash()` or `random()`, so a rebuild gives the same samples on any machine.
"""
from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

import duckdb
import pyarrow as pa
from prefect import flow
from prefect.task_runners import ThreadPoolTaskRunner

from flows.config import Params
from flows.keys import rank, stable_id
from flows.lake_queries import verified_sql
from flows.storage import read_table
from flows.tasks import group, write_table


@dataclass(frozen=True)
class RuleCount:
    """One rule's rows before and after it; a rule of `select_steps` also has a `key`, the rows it kept
    per strategy (what the card attributes a strategy's losses with) and, for a cap, a `note` saying
    whether it bound."""

    rule: str
    before: int
    after: int
    key: str = ""
    per_strategy: dict | None = None
    note: str = ""

    def to_json(self) -> dict:
        out = {"rule": self.rule, "before": self.before, "after": self.after}
        if self.key:
            out["key"] = self.key
        if self.note:
            out["note"] = self.note
        if self.per_strategy is not None:
            out["per_strategy"] = self.per_strategy
        return out


# The split's goals: the test split covers every strategy it can, with at least
# MIN_TEST_SAMPLES test samples of each strategy that has LARGE_STRATEGY samples or more, and holds about
# `filter.test_fraction` of the samples (within SHARE_SLACK of it, relative). A strategy found in two or
# more families keeps at least TRAIN_KEEPS of its samples (and one) in train; one found in a single
# family goes where its family goes (the card lists the strategies in one split only).
MIN_TEST_SAMPLES, LARGE_STRATEGY, TRAIN_KEEPS, SHARE_SLACK = 20, 100, 0.25, 0.25
EXACT_FAMILIES = 18  # up to this many families every subset is scored; above, a greedy cover


def split_families(counts: dict[str, dict[str, int]], seed: int, test_fraction: float) -> dict[str, str]:
    """family -> 'train' | 'test', whole families held out, chosen for coverage. `counts` is, per family
    (every family of the build, those without kept steps too), its kept steps per strategy.

    Among the sets of families whose test share is within SHARE_SLACK of `test_fraction` and that keep
    TRAIN_KEEPS of every multi-family strategy in train, the one chosen covers the most strategies,
    then gives MIN_TEST_SAMPLES to the most large strategies, then leaves the fewest strategies in one
    split only, then comes closest to `test_fraction`; ties by a seeded rank of the set. Every set is
    scored up to EXACT_FAMILIES families (`_exact_split`), a greedy cover is used above (`_greedy_split`).
    With two or more families, one at least is held out; with one, none. Deterministic: integer
    counts, sorted names, seeded ranks."""
    families = [f for f in sorted(counts) if sum(counts[f].values())]  # a family without samples is train
    chosen: set[str] = set()
    if len(families) >= 2:
        strategies = sorted({k for f in families for k, n in counts[f].items() if n})
        matrix = [[counts[f].get(k, 0) for k in strategies] for f in families]
        pick = _exact_split if len(families) <= EXACT_FAMILIES else _greedy_split
        chosen = pick(families, matrix, seed, test_fraction)
    return {f: ("test" if f in chosen else "train") for f in sorted(counts)}


def _limits(matrix: list[list[int]]) -> tuple[list[int], list[int], list[int]]:
    """Per strategy: its samples, the most the test split may take of them, and its test ask."""
    import math

    total = [sum(col) for col in zip(*matrix, strict=True)]
    spread = [sum(1 for v in col if v) for col in zip(*matrix, strict=True)]
    most = [n - max(1, math.ceil(TRAIN_KEEPS * n)) if where > 1 else n for n, where in zip(total, spread, strict=True)]
    ask = [MIN_TEST_SAMPLES if n >= LARGE_STRATEGY else 1 for n in total]
    return total, most, ask


def _exact_split(families: list[str], matrix: list[list[int]], seed: int, test_fraction: float) -> set[str]:
    """Score every non-empty proper subset of the families (numpy, one row per subset)."""
    import numpy as np

    m = np.array(matrix, dtype=np.int64)
    total, most, ask = (np.array(x, dtype=np.int64) for x in _limits(matrix))
    n_fam = len(families)
    subsets = np.arange(1, 2 ** n_fam - 1, dtype=np.int64)
    bits = ((subsets[:, None] >> np.arange(n_fam)) & 1).astype(np.int64)
    test = bits @ m                                      # subsets x strategies: test samples
    held, samples = test.sum(1), int(total.sum())
    wanted = test_fraction * samples
    keeps = (test <= most).all(1)
    near = np.abs(held - wanted) <= SHARE_SLACK * wanted
    feasible = keeps & near if (keeps & near).any() else keeps if keeps.any() else np.ones(len(subsets), bool)
    covered = (test > 0).sum(1)
    asks_met = ((test >= ask) & (total >= LARGE_STRATEGY)).sum(1)
    one_split = ((test == total) & (total > 0)).sum(1) + ((test == 0) & (total > 0)).sum(1)
    distance = np.abs(held - wanted)
    # lexicographic: most covered, most asks met, fewest strategies in one split, nearest share
    order = np.lexsort((distance, one_split, -asks_met, -covered, ~feasible))
    best = order[0]
    key = (feasible[best], covered[best], asks_met[best], one_split[best], distance[best])
    ties = [i for i in order[:4096] if (feasible[i], covered[i], asks_met[i], one_split[i], distance[i]) == key]
    names = [frozenset(f for j, f in enumerate(families) if bits[i, j]) for i in ties]
    return min(names, key=lambda s: rank(seed, "split", ",".join(sorted(s))))


def _greedy_split(families: list[str], matrix: list[list[int]], seed: int, test_fraction: float) -> set[str]:
    """A greedy cover (many families): each strategy asks the test split for its `ask`; the family that
    fills the most asks (each weighs 1, a strategy's first sample 1 more) per share of the samples it
    adds is held out, ties by seeded rank, while the share stays within SHARE_SLACK above the target;
    then families by seeded rank while that brings the share closer to `test_fraction`."""
    total, most, ask = _limits(matrix)
    samples = sum(total)
    wanted = test_fraction * samples
    ordered = sorted(range(len(families)), key=lambda i: (rank(seed, "split", families[i]), families[i]))
    in_test, test = [0] * len(total), []

    def allowed(i: int) -> bool:
        return i not in test and all(in_test[k] + n <= most[k] for k, n in enumerate(matrix[i]) if n)

    def hold_out(i: int) -> None:
        test.append(i)
        for k, n in enumerate(matrix[i]):
            in_test[k] += n

    def gain(i: int) -> float:
        filled = sum(min(ask[k] - in_test[k], n) / ask[k] + (1.0 if in_test[k] == 0 else 0.0)
                     for k, n in enumerate(matrix[i]) if n and ask[k] > in_test[k])
        return filled / (max(1, sum(matrix[i])) / max(1, samples))

    while True:
        room = (1 + SHARE_SLACK) * wanted - sum(in_test)
        scored = [(gain(i), i) for i in ordered if allowed(i) and sum(matrix[i]) <= room]
        scored = [(g, i) for g, i in scored if g > 0]
        if not scored:
            break
        best = max(g for g, _ in scored)
        hold_out(next(i for g, i in scored if g == best))
    while True:
        held = sum(in_test)
        if held >= wanted and test:
            break
        closer = [i for i in ordered if allowed(i)
                  and (not test or abs(held + sum(matrix[i]) - wanted) < abs(held - wanted))]
        if not closer:
            break
        hold_out(closer[0])
    return {families[i] for i in _improve(set(test), matrix, ordered, wanted)}


def _improve(test: set[int], matrix: list[list[int]], ordered: list[int], wanted: float) -> set[int]:
    """Local search from the greedy cover, on the exact search's order of sets: the best move (add a
    family, remove one, swap one for one, two for one or one for two; in seeded-rank order) while one
    improves."""
    total, most, ask = _limits(matrix)

    def key(members: set[int]) -> tuple:
        held = [sum(matrix[i][k] for i in members) for k in range(len(total))]
        share = sum(held)
        keeps = all(h <= m for h, m in zip(held, most, strict=True))
        near = abs(share - wanted) <= SHARE_SLACK * wanted
        covered = sum(1 for h in held if h)
        asks = sum(1 for h, a, n in zip(held, ask, total, strict=True) if n >= LARGE_STRATEGY and h >= a)
        one_split = sum(1 for h, n in zip(held, total, strict=True) if n and h in (0, n))
        return (keeps and near and bool(members), covered, asks, -one_split, -abs(share - wanted))

    current = key(test)
    for _ in range(10 * len(ordered)):  # each step improves the key; this bounds the steps anyway
        moves = [test | {i} for i in ordered if i not in test] + [test - {i} for i in ordered if i in test]
        inside, outside = [i for i in ordered if i in test], [i for i in ordered if i not in test]
        moves += [(test - {i}) | {j} for i in inside for j in outside]
        moves += [(test - {i, i2}) | {j} for a, i in enumerate(inside) for i2 in inside[a + 1:] for j in outside]
        moves += [(test - {i}) | {j, j2} for i in inside for a, j in enumerate(outside) for j2 in outside[a + 1:]]
        scored = [(key(m), m) for m in moves]
        best = max((k for k, _ in scored), default=current)
        if best <= current:
            break
        test, current = next(m for k, m in scored if k == best), best
    return test


def family_strategy_counts(kept: pa.Table, programs: pa.Table) -> dict[str, dict[str, int]]:
    """Per family of `programs` (in name order), its kept steps per strategy: what the split covers."""
    counts: dict[str, dict[str, int]] = {f: {} for f in sorted(set(programs.column("family").to_pylist()))}
    for family, strategy in zip(kept.column("family").to_pylist(), kept.column("strategy").to_pylist(), strict=True):
        per = counts.setdefault(family, {})
        per[strategy] = per.get(strategy, 0) + 1
    return {f: dict(sorted(per.items())) for f, per in sorted(counts.items())}


def split_rows(counts: dict[str, dict[str, int]], split_of: dict[str, str]) -> list[dict]:
    """The `splits` table: per family its split, kept steps and strategies (JSON)."""
    return [{"family": f, "split": split_of[f], "kept_steps": sum(per.values()),
             "strategies": json.dumps(per, sort_keys=True)} for f, per in sorted(counts.items())]


def overlapping_states(train_states: set[str], test_states: set[str]) -> dict[str, bool]:
    """For each test state (LEIR text), whether every top-level nest of it has a twin among the nests
    of the train states with names and sizes abstracted (leir.canon.structure_hashes): a model trained
    on the train split has seen that structure, at other sizes or with other names."""
    from leir.canon import structure_hashes_of

    hashes = structure_hashes_of([*sorted(train_states), *sorted(test_states)])
    seen = {h for text in sorted(train_states) for h in hashes[text]}
    return {text: bool(hashes[text]) and all(h in seen for h in hashes[text]) for text in sorted(test_states)}


def select_steps(programs: pa.Table, steps: pa.Table, verifications: pa.Table,
                 params) -> tuple[pa.Table, list[RuleCount]]:
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
    counters = [RuleCount("steps generated", steps.num_rows, steps.num_rows, "generated", _per_strategy(steps))]

    def run(sql: str, args=None):
        return con.execute(sql, args or []).fetchall()  # DuckDB 2: consume every result

    def count(rel: str) -> int:
        return run(f"SELECT count(*) FROM {rel}")[0][0]

    def per_strategy(rel: str) -> dict[str, int]:
        return dict(run(f"SELECT strategy, count(*) FROM {rel} GROUP BY 1 ORDER BY 1"))

    run("""CREATE TEMP TABLE v AS
        SELECT s.*, p.family, r.rnk, v.status FROM steps s
        JOIN programs p USING (program_id) JOIN ranks r USING (step_id)
        JOIN verifications v ON v.step_id = s.step_id AND v.target = $target""", {"target": target})
    counters.append(RuleCount("has a verification", steps.num_rows, count("v"), "has_verification", per_strategy("v")))
    # A step of a GPU program verified on CUDA too (a GPU was present) must pass there as well.
    run(f"""CREATE TEMP TABLE ok AS SELECT * FROM v
        WHERE {verified_sql("status", "exactness")}
        AND NOT EXISTS (SELECT 1 FROM verifications c WHERE c.step_id = v.step_id AND c.target <> $target
                        AND NOT {verified_sql("c.status", "v.exactness")})""", {"target": target})
    counters.append(RuleCount("verified (exact; close only for reassociating strategies)", count("v"), count("ok"),
                            "verified", per_strategy("ok")))
    # Where several steps give the same result, keep the one of the rarest strategy (then the seeded
    # rank): an identity two strategies share stays labelled, and rare strategies are not lost.
    run("""CREATE TEMP TABLE uniq AS SELECT * EXCLUDE (n_strategy) FROM (
            SELECT *, count(*) OVER (PARTITION BY strategy) AS n_strategy FROM ok)
        QUALIFY row_number() OVER (PARTITION BY before_leir, after_program_id ORDER BY n_strategy, rnk) = 1""")
    counters.append(RuleCount("unique result per program state (alpha-equivalence)", count("ok"), count("uniq"),
                            "unique", per_strategy("uniq")))
    caps = _caps(f)
    con.register("caps", pa.table({"strategy": list(caps), "cap": list(caps.values())}))
    run("""CREATE TEMP TABLE capped AS SELECT u.* FROM uniq u LEFT JOIN caps c USING (strategy)
        QUALIFY row_number() OVER (PARTITION BY strategy ORDER BY rnk) <= coalesce(c.cap, $cap)""",
                {"cap": int(f["cap_per_strategy"])})
    before = per_strategy("uniq")
    counters.append(RuleCount("cap per strategy (easy strategies down-weighted)", count("uniq"), count("capped"),
                            "cap_per_strategy", per_strategy("capped"),
                            _cap_note(before, lambda k: caps.get(k, int(f["cap_per_strategy"])), "strategy")))
    level_caps = pa.table({"level": list(f["cap_per_level"]), "lcap": [int(v) for v in f["cap_per_level"].values()]})
    con.register("level_caps", level_caps)
    run("""CREATE TEMP TABLE kept AS SELECT c.* FROM capped c LEFT JOIN level_caps l USING (level)
        QUALIFY row_number() OVER (PARTITION BY level ORDER BY rnk) <= coalesce(l.lcap, 1000000000)""")
    per_level = dict(run("SELECT level, count(*) FROM capped GROUP BY 1 ORDER BY 1"))
    level_cap = {k: int(v) for k, v in f["cap_per_level"].items()}
    counters.append(RuleCount("cap per level", count("capped"), count("kept"), "cap_per_level", per_strategy("kept"),
                            _cap_note(per_level, lambda k: level_cap.get(k, 1_000_000_000), "level")))
    kept = con.sql("SELECT * EXCLUDE (rnk) FROM kept ORDER BY step_id").to_arrow_table()
    con.close()
    return kept, counters


def _per_strategy(steps: pa.Table) -> dict[str, int]:
    out: dict[str, int] = {}
    for k in steps.column("strategy").to_pylist():
        out[k] = out.get(k, 0) + 1
    return dict(sorted(out.items()))


def _cap_note(sizes: dict[str, int], cap_of, what: str) -> str:
    """Whether a cap bound: the groups it cut, or, when it cut none, the closest a group came to its cap."""
    cut = sorted(k for k, n in sizes.items() if n > cap_of(k))
    if cut:
        return f"bound for {len(cut)} {what}{'s' if len(cut) > 1 else ''}: " + ", ".join(
            f"{k} {sizes[k]} -> {cap_of(k)}" for k in cut)
    if not sizes:
        return "did not bind: nothing to cap"
    top = max(sorted(sizes), key=lambda k: sizes[k] / cap_of(k))
    return f"did not bind: the {what} closest to its cap, {top}, has {sizes[top]} of its cap of {cap_of(top)}"


def _caps(f: dict) -> dict[str, int]:
    base = int(f["cap_per_strategy"])
    return {s: max(1, int(base * float(f["easy_weight"]))) for s in f.get("easy_strategies", [])}


def assemble_samples(kept: pa.Table, programs: pa.Table, params, count_tokens=None,
                     split_of: dict[str, str] | None = None) -> tuple[list[dict], list[RuleCount]]:
    """Single-answer samples (one per kept step) and multi-answer samples (k steps of one program
    state with distinct strategies, for a seeded fraction of states), split by family (`split_of`, by
    default `split_families` of the kept steps); test samples carry their structural overlap."""
    from leir.parse import parse_program
    from leir.signature import Signature
    from strategies.cot import TASK_MULTI, combine_answers, prompt

    f, seed = params.filter, params.seed
    count_tokens = count_tokens or (lambda text: None)
    sigs = {r["program_id"]: r["signature"] for r in programs.select(["program_id", "signature"]).to_pylist()}
    targets = program_targets(programs, params.verify["target"])
    rows = kept.to_pylist()
    if split_of is None:
        split_of = split_families(family_strategy_counts(kept, programs), seed, float(f["test_fraction"]))
    prompts: dict[tuple[str, str], str] = {}

    def target_of(row) -> str:  # the program's target, whatever the strategy
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
    # Structural overlap across the split, both ways: a test sample whose before-state's every nest has a
    # twin in the train states (what a model trained on train has seen), a train sample whose before-state's
    # every nest has a twin in the test states (what a score on test partly repeats).
    states = {sp: {t for r in rows if split_of[r["family"]] == sp for t in (r["before_leir"], r["after_leir"])}
              for sp in ("train", "test")}
    overlap = {sp: overlapping_states(states[other], {r["before_leir"] for r in rows if split_of[r["family"]] == sp})
               for sp, other in (("test", "train"), ("train", "test"))}
    before_of = {r["step_id"]: r["before_leir"] for r in rows}
    for sample in samples:
        sample["structural_overlap"] = overlap[sample["split"]][before_of[json.loads(sample["step_ids"])[0]]]
    counters = [RuleCount("single-answer samples", len(rows), len(rows)),
                RuleCount("multi-answer samples (program states with k distinct strategies)", len(by_state), multi)]
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
            "prompt_tokens": count_tokens(prompt_text), "answer_tokens": count_tokens(answer),
            "structural_overlap": None}


@flow(name="filter", task_runner=ThreadPoolTaskRunner(max_workers=1))
def filter_flow(raw: dict, profile: str, lake: str, reports: str) -> dict:
    from flows.token_stats import count_tokens

    params, lake = Params(raw, profile), Path(lake)
    programs = read_table(lake, "programs")
    kept, counters = select_steps(programs, read_table(lake, "steps"), read_table(lake, "verifications"), params)
    counts = family_strategy_counts(kept, programs)
    split_of = split_families(counts, params.seed, float(params.filter["test_fraction"]))
    samples, more = assemble_samples(kept, programs, params, count_tokens, split_of)
    by_split = group(samples, lambda s: s["split"])
    write_table(lake, "samples", by_split)
    write_table(lake, "splits", {"families": split_rows(counts, split_of)})
    Path(reports).mkdir(parents=True, exist_ok=True)
    (Path(reports) / "filter.json").write_text(json.dumps([c.to_json() for c in counters + more], indent=1) + "\n")
    return {"stage": "filter", "kept_steps": kept.num_rows, "samples": len(samples)}
