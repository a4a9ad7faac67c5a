"""The cost_model stage: the offline cost model, learned from every state the build timed.

`search.cost_model.PriorModel` is trained on the `timings` rows of the machine that measured the
release, and saved to `lake/cost_model/model.json` (a DVC output, copied into the release): a
regressor (LEIR-tree features -> log2 µs) and a ranker (`rank:pairwise` over the states of each
program beside their original, `search.cost_model.state_features`); `steptp search` ranks its first
proposals by the ranker, before any state of the new search is timed. Its ranking quality is
measured the honest way, on families it never saw: a model trained on the train split's families
ranks the test split's states, and `reports/cost_model.json` gives the regressor's Spearman
correlation between predicted and measured times over all held-out states, and within each held-out
program (the ranking a search needs: states of one program) the ranker's median Spearman and top-1 /
top-5 recall of the program's fastest state, per family too, beside the regressor's own. The split
is the filter stage's (`lake/splits`), the one of the samples.
Beside it, `static_estimate`: how the static estimate the chains of thought reason from ranks the same
held-out states without any training, the baseline a learned ranking has to beat.
"""
from __future__ import annotations

import json
from pathlib import Path

from prefect import flow

from flows.config import Params
from flows.lake_queries import family_splits
from flows.measure import measure_params, measuring_machine
from flows.storage import read_table
from flows.tasks import say

MODEL_PATH = Path("cost_model") / "model.json"
MIN_STATES_PER_PROGRAM = 3  # a within-program correlation needs at least this many states


def training_rows(lake: Path, target: str, unit: str = "nest") -> tuple[list[dict], str | None]:
    """The timed states of the measuring machine (ok rows, one per state: in `unit`, the measure
    stage's, where the state has such a row, else its other one), and the machine's id."""
    timings = [r for r in read_table(lake, "timings").to_pylist() if r["status"] == "ok" and r["target"] == target]
    machine = measuring_machine(timings, {r["state_id"] for r in timings}, target)
    one: dict[str, dict] = {}
    for r in sorted((r for r in timings if r["machine_id"] == machine), key=lambda r: r["unit"] != unit):
        one.setdefault(r["state_id"], r)
    return list(one.values()), machine


def spearman(a, b) -> float | None:
    import pandas as pd

    if len(a) < MIN_STATES_PER_PROGRAM or len(set(a)) < 2 or len(set(b)) < 2:
        return None  # a constant side has no rank correlation
    value = pd.Series(list(a)).corr(pd.Series(list(b)), method="spearman")
    return None if value != value else float(value)  # NaN: a constant side


def ranking_set(rows: list[dict], states, keep: list[int]):
    """The ranking model's training data (`search.cost_model.RankingSet`) from the rows `keep` whose
    program's original was timed: `states` are every row's `state_features`."""
    import math

    import numpy as np

    from search.cost_model import RankingSet, ranking_matrix

    root = {r["program_id"]: i for i, r in enumerate(rows) if r["state_id"] == r["program_id"]}
    idx = [i for i in keep if rows[i]["program_id"] in root]
    roots = [root[rows[i]["program_id"]] for i in idx]
    matrix = np.vstack([ranking_matrix(states[r], states[i])[0] for i, r in zip(idx, roots, strict=True)]) \
        if idx else np.zeros((0, 2 * states.shape[1]))
    speedup = np.array([math.log2(rows[r]["time_us"] / rows[i]["time_us"]) for i, r in zip(idx, roots, strict=True)])
    return RankingSet(matrix, speedup, [rows[i]["program_id"] for i in idx]), idx


def parsed_states(rows: list[dict]) -> list:
    """Each row's state (its `leir`) parsed, the states sharing their unchanged nests
    (`leir.object_cache.share_nests`): the figures kept by nest are then computed once per distinct
    nest of a program, not once per state."""
    from leir.object_cache import share_nests
    from leir.parse import parse_program

    return share_nests(parse_program(r["leir"]) for r in rows)


def row_features(rows: list[dict], programs: list):
    """`search.cost_model.state_features` of each row's state (`programs`, `parsed_states`), one row of
    the matrix per row, computed a program's states together so that its nests' static estimates stay
    kept (the release lake's 20,966 states: ~3x faster than states parsed apart; the same floats)."""
    import numpy as np

    from search.cost_model import state_features

    features = {i: state_features(programs[i])
                for i in sorted(range(len(rows)), key=lambda i: (rows[i]["program_id"], rows[i]["state_id"]))}
    return np.vstack([features[i] for i in range(len(rows))])


def held_out_quality(rows: list[dict], states, split: dict[str, str], seed: int, static: bool = False) -> dict:
    """Train on the train families, rank the test families' states (`ranking_quality`): across programs
    by the regressor's predicted time (`spearman`), within a program by the ranker
    (`spearman_within_program`, top-k recall, per family; the regressor's own under `regressor`).
    `states` are the rows' `search.cost_model.state_features`. With `static`, also how the static
    estimate the chains of thought reason from (`strategies.analysis.cost.estimated_cycles`, no
    training at all; its column of `states`) ranks the same states, under `static_estimate`: the
    baseline a learned model has to beat."""
    import math

    import xgboost as xgb

    from search.cost_model import ESTIMATE_PARTS, FEATURE_NAMES, PriorModel

    train = [i for i, r in enumerate(rows) if split.get(r["family"]) == "train"]
    test = [i for i, r in enumerate(rows) if split.get(r["family"]) == "test"]
    if not train or len(test) < MIN_STATES_PER_PROGRAM:
        return {"train_states": len(train), "test_states": len(test), "spearman": None, "spearman_within_program": None}
    features = states[:, :len(FEATURE_NAMES)]
    model = PriorModel.train(features[train], [math.log2(rows[i]["time_us"]) for i in train], seed=seed,
                             ranking=ranking_set(rows, states, train)[0])
    predicted = model.log2_us(features[test])
    held_out = [{**rows[i], "predicted": float(p)} for p, i in zip(predicted, test, strict=True)]
    regressor = ranking_quality(held_out)
    out = {"train_states": len(train), "test_states": len(test),
           "test_families": sorted({r["family"] for r in held_out}), **regressor,
           "regressor": {k: v for k, v in regressor.items() if k != "per_family"}}
    ranked_set, ranked = ranking_set(rows, states, test)
    if model.ranker is not None and ranked:
        score = model.ranker.predict(xgb.DMatrix(ranked_set.matrix, nthread=1))
        ranker = ranking_quality([{**rows[i], "predicted": -float(s)} for s, i in zip(score, ranked, strict=True)])
        out.update({k: ranker[k] for k in ("programs_within", "spearman_within_program", "top1_recall", "top5_recall")})
        out["per_family"] = {f: {**v, "spearman": regressor["per_family"].get(f, {}).get("spearman")}
                             for f, v in ranker["per_family"].items()}
    if static:
        column = len(FEATURE_NAMES) + [n for n, _ in ESTIMATE_PARTS].index("all")  # = static_estimate(program)
        estimated = [{**rows[i], "predicted": float(states[i, column])} for i in test]
        out["static_estimate"] = {k: v for k, v in ranking_quality(estimated).items() if k != "per_family"}
    return out


def static_estimate(program) -> float:
    """log2 of the static estimate of the whole program (CPU model), the CoT's figure."""
    import math

    from strategies.analysis.cost import estimated_cycles

    return math.log2(max(1.0, estimated_cycles(program, range(len(program.nests)))))


TOP_K = (1, 5)


def ranking_quality(states: list[dict]) -> dict:
    """How well `predicted` (lower: faster) ranks the states by `time_us`: the Spearman correlation
    over all states (across programs, where sheer size decides most of it), and what a search needs,
    within each program: the median Spearman over programs with MIN_STATES_PER_PROGRAM states or more,
    and top-k recall, the share of those programs whose fastest measured state is among the k
    predicted fastest. The same per family under `per_family`."""
    from statistics import median

    def figures(group: list[dict]) -> dict:
        by_program: dict[str, list[dict]] = {}
        for s in group:
            by_program.setdefault(s["program_id"], []).append(s)
        ranked = [p for p in by_program.values() if len(p) >= MIN_STATES_PER_PROGRAM]
        within = [c for p in ranked if (c := spearman([s["predicted"] for s in p], [s["time_us"] for s in p]))
                  is not None]
        out = {"states": len(group), "programs_within": len(ranked),
               "spearman": spearman([s["predicted"] for s in group], [s["time_us"] for s in group]),
               "spearman_within_program": median(within) if within else None}
        for k in TOP_K:
            hits = [_fastest_in_top(p, k) for p in ranked]
            out[f"top{k}_recall"] = sum(hits) / len(hits) if hits else None
        return out

    families = sorted({s["family"] for s in states})
    return {**figures(states), "per_family": {f: figures([s for s in states if s["family"] == f]) for f in families}}


def _fastest_in_top(states: list[dict], k: int) -> bool:
    """Whether the program's fastest measured state is among its `k` predicted fastest (ties in the
    prediction by state id, so that the answer is deterministic)."""
    fastest = min(states, key=lambda s: (s["time_us"], s["state_id"]))
    top = sorted(states, key=lambda s: (s["predicted"], s["state_id"]))[:k]
    return any(s["state_id"] == fastest["state_id"] for s in top)


@flow(name="cost_model")
def cost_model_flow(raw: dict, profile: str, lake: str, reports: str) -> dict:
    import math

    from search.cost_model import FEATURE_NAMES, PriorModel

    params, lake = Params(raw, profile), Path(lake)
    target = params.verify["target"]
    rows, machine = training_rows(lake, target, str(measure_params(params)["unit"]))
    out = {"stage": "cost_model", "states": len(rows), "machine_id": machine}
    path = lake / MODEL_PATH
    if not rows:
        path.unlink(missing_ok=True)
        say("cost_model: no timed states; no model")
        _write_report(Path(reports), {**out, "quality": None})
        return out
    rows = sorted(rows, key=lambda r: r["state_id"])
    states = row_features(rows, parsed_states(rows))
    split = family_splits(lake)  # the filter stage's split (flows.filtering.split_families)
    quality = held_out_quality(rows, states, split, params.seed, static=True)
    info = {"machine": json.loads(rows[0]["machine"]), "target": target, "trained_on": "all timed states",
            "families": len({r["family"] for r in rows}), "held_out": quality}
    PriorModel.train(states[:, :len(FEATURE_NAMES)], [math.log2(r["time_us"]) for r in rows], seed=params.seed,
                     info=info, ranking=ranking_set(rows, states, list(range(len(rows))))[0]).save(path)
    _write_report(Path(reports), {**out, "quality": quality})
    say(f"cost_model: {len(rows)} states; held-out families: Spearman {_fmt(quality['spearman'])} over all "
        f"states (regressor), {_fmt(quality['spearman_within_program'])} within a program (ranker, median; the "
        f"regressor's {_fmt((quality.get('regressor') or {}).get('spearman_within_program'))}), top-1 / top-5 "
        f"recall of a program's fastest state {_fmt(quality.get('top1_recall'))} / {_fmt(quality.get('top5_recall'))}"
        + _static_line(quality.get("static_estimate")))
    return {**out, "spearman": quality["spearman"], "spearman_within_program": quality["spearman_within_program"]}


def _static_line(q: dict | None) -> str:
    if not q:
        return ""
    return (f"; the CoT's static estimate on the same states: {_fmt(q['spearman'])} over all, "
            f"{_fmt(q['spearman_within_program'])} within, top-1 / top-5 {_fmt(q['top1_recall'])} / "
            f"{_fmt(q['top5_recall'])}")


def _fmt(x) -> str:
    return "n/a" if x is None else f"{x:.3f}"


def _write_report(reports: Path, data: dict) -> None:
    reports.mkdir(parents=True, exist_ok=True)
    (reports / "cost_model.json").write_text(json.dumps(data, indent=1, sort_keys=True, default=str) + "\n")
