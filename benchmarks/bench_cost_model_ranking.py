"""How well the search's starting points rank the states of one program, on held-out families:

    python benchmarks/bench_cost_model_ranking.py [LAKE]

The offline model (`search.cost_model.PriorModel`, trained here on the train split's families exactly
as the cost_model stage does): its regressor of log2 µs (the model before the ranker) and its ranker
(`rank:pairwise` over the states of each program beside their original); the search's analytic
estimate (`search.analysis.log2_speedup`); the blends the search can start from
(`CostModel(prior_weight=w, analytic=True)`); and the static estimate the chains of thought reason
from (`strategies.analysis.cost.estimated_cycles`). Each predicts a state's time relative to its
original program and is scored on the held-out families' states by `flows.cost_model.ranking_quality`:
the median within-program Spearman and the top-1 / top-5 recall of each program's fastest measured
state (goal of the ranking issue: 0.6 and 0.8), then the ranker per held-out family. The baseline
named: the regressor (the ratio column is each figure over its own). Also the seconds to compute the
features of a state and to train.
"""
from __future__ import annotations

import argparse
import math
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))


def main() -> int:
    import time

    import numpy as np

    from flows.cost_model import parsed_states, ranking_quality, ranking_set, row_features, training_rows
    from flows.lake_queries import family_splits
    from search.analysis import DEFAULT_MACHINE, log2_speedup
    from search.cost_model import FEATURE_NAMES, PriorModel
    from strategies.analysis.cost import estimated_cycles

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("lake", nargs="?", type=Path, default=Path("lake"), help="a built lake (default: make run's)")
    args = parser.parse_args()
    rows, machine = training_rows(args.lake, "llvm", "nest")
    rows = sorted(rows, key=lambda r: r["state_id"])
    split = family_splits(args.lake)
    roots = {r["program_id"]: i for i, r in enumerate(rows) if r["state_id"] == r["program_id"]}
    train = [i for i, r in enumerate(rows) if split.get(r["family"]) == "train"]
    test = [i for i, r in enumerate(rows) if split.get(r["family"]) == "test" and r["program_id"] in roots]
    if not train or not test:
        print(f"{args.lake}: no timed states in both splits; build the lake first (make run)")
        return 1
    programs = parsed_states(rows)
    start = time.perf_counter()
    states = row_features(rows, programs)
    featurise_ms = 1000 * (time.perf_counter() - start) / len(rows)
    start = time.perf_counter()
    model = PriorModel.train(states[train, :len(FEATURE_NAMES)], [math.log2(rows[i]["time_us"]) for i in train],
                             seed=0, ranking=ranking_set(rows, states, train)[0])
    train_s = time.perf_counter() - start
    root_of = [roots[rows[i]["program_id"]] for i in test]

    def cycles(p) -> float:
        return math.log2(max(1.0, estimated_cycles(p, range(len(p.nests)))))

    regressor = model.log2_us(states[test, :len(FEATURE_NAMES)])
    root_regressor = model.log2_us(states[root_of, :len(FEATURE_NAMES)])
    ranker = np.concatenate([-model.log2_speedup(programs[r], [programs[i]], states[r]) for i, r in zip(test, root_of,
                                                                                                        strict=True)])
    analytic = np.array([-log2_speedup(programs[r], programs[i], DEFAULT_MACHINE) for i, r in zip(test, root_of,
                                                                                                    strict=True)])
    # each as log2(time / the original's time): lower is faster
    predictions = {
        "regressor (the model before the ranker)": regressor - root_regressor,
        "ranker (PriorModel.log2_speedup)": ranker,
        "search analytic (search.analysis)": analytic,
        "CoT static estimate (analysis.cost)": np.array([cycles(programs[i]) - cycles(programs[r])
                                                         for i, r in zip(test, root_of, strict=True)]),
    }
    for w in (0.5, 0.8):
        predictions[f"search start ({w:g} ranker + {1 - w:g} analytic)"] = w * ranker + (1 - w) * analytic
    print(f"{args.lake}: {len(train)} training states, {len(test)} held-out states "
          f"({len({rows[i]['family'] for i in test})} families), machine {machine}; features "
          f"{featurise_ms:.1f} ms per state, training {train_s:.0f} s (regressor and ranker, one thread)")
    base = None
    held_out = [rows[i] for i in test]
    for name, pred in predictions.items():
        q = ranking_quality([{**r, "predicted": float(p)} for r, p in zip(held_out, pred, strict=True)])
        within = q["spearman_within_program"]
        base = base or within
        print(f"  {name:42s} within-program Spearman {within:.3f} (ratio {within / base:.2f}), top-1 "
              f"{q['top1_recall']:.3f}, top-5 {q['top5_recall']:.3f} over {q['programs_within']} programs")
        if name.startswith("ranker"):
            per_family = q["per_family"]
    print("  the ranker per held-out family (within-program Spearman, top-1, top-5, programs):")
    for family, f in per_family.items():
        if f["programs_within"]:
            print(f"    {family:28s} {f['spearman_within_program']:.3f}  {f['top1_recall']:.3f}  "
                  f"{f['top5_recall']:.3f}  {f['programs_within']}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
