"""How well the search's starting points rank the states of one program, on held-out families:

    python benchmarks/bench_cost_model_ranking.py [LAKE]

The learned model (`search.cost_model.PriorModel`, trained here on the train split's families exactly
as the cost_model stage does), the search's analytic estimate (`search.analysis.log2_speedup`), their
blend as the search starts from it (`CostModel(prior_weight=0.5, analytic=True)`), and the static
estimate the chains of thought reason from (`strategies.analysis.cost.estimated_cycles`), each as a
prediction of a state's time relative to its original program, scored on the held-out families'
states by `flows.cost_model.ranking_quality`: the median within-program Spearman and the top-1 / top-5
recall of each program's fastest measured state (goal of the ranking issue: 0.6 and 0.8). The
baseline named: the learned model (the ratio column is each figure over its own).
"""
from __future__ import annotations

import argparse
import math
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))


def main() -> int:
    import numpy as np

    from flows.cost_model import ranking_quality, training_rows
    from flows.lake_queries import family_splits
    from leir.parse import parse_program
    from search.analysis import DEFAULT_MACHINE, log2_speedup
    from search.cost_model import PriorModel, program_features
    from strategies.analysis.cost import estimated_cycles

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("lake", nargs="?", type=Path, default=Path("lake"), help="a built lake (default: make run's)")
    args = parser.parse_args()
    rows, machine = training_rows(args.lake, "llvm", "nest")
    rows = sorted(rows, key=lambda r: r["state_id"])
    split = family_splits(args.lake)
    roots = {r["program_id"]: parse_program(r["leir"]) for r in rows if r["state_id"] == r["program_id"]}
    train = [r for r in rows if split.get(r["family"]) == "train"]
    test = [r for r in rows if split.get(r["family"]) == "test" and r["program_id"] in roots]
    if not train or not test:
        print(f"{args.lake}: no timed states in both splits; build the lake first (make run)")
        return 1
    model = PriorModel.train(np.vstack([program_features(parse_program(r["leir"])) for r in train]),
                             [math.log2(r["time_us"]) for r in train], seed=0)
    programs = [parse_program(r["leir"]) for r in test]

    def cycles(p) -> float:
        return math.log2(max(1.0, estimated_cycles(p, range(len(p.nests)))))

    learned = model.log2_us(np.vstack([program_features(p) for p in programs]))
    root_learned = {pid: float(model.log2_us([p])[0]) for pid, p in roots.items()}
    root_cycles = {pid: cycles(p) for pid, p in roots.items() if any(r["program_id"] == pid for r in test)}
    # each as log2(time / the original's time): lower is faster
    predictions = {
        "learned model (PriorModel)": [learned[i] - root_learned[r["program_id"]] for i, r in enumerate(test)],
        "search analytic (search.analysis)": [-log2_speedup(roots[r["program_id"]], p, DEFAULT_MACHINE)
                                              for r, p in zip(test, programs, strict=True)],
        "CoT static estimate (analysis.cost)": [cycles(p) - root_cycles[r["program_id"]]
                                                for r, p in zip(test, programs, strict=True)],
    }
    a, b = predictions["learned model (PriorModel)"], predictions["search analytic (search.analysis)"]
    predictions["search start (0.5 model + 0.5 analytic)"] = [0.5 * x + 0.5 * y for x, y in zip(a, b, strict=True)]
    print(f"{args.lake}: {len(train)} training states, {len(test)} held-out states "
          f"({len({r['family'] for r in test})} families), machine {machine}")
    base = None
    for name, pred in predictions.items():
        q = ranking_quality([{**r, "predicted": float(p)} for r, p in zip(test, pred, strict=True)])
        within = q["spearman_within_program"]
        base = base or within
        print(f"  {name:42s} within-program Spearman {within:.3f} (ratio {within / base:.2f}), top-1 "
              f"{q['top1_recall']:.3f}, top-5 {q['top5_recall']:.3f} over {q['programs_within']} programs")
    return 0


if __name__ == "__main__":
    sys.exit(main())
