"""What the ranking cost model buys the search: the same searches started from the offline model with
and without its ranker, on the bench programs:

    python benchmarks/bench_ranker_search.py [--prior lake/cost_model/model.json] [--budget 40]

For each program of `bench_search.py` (the B form, as translated from PyTorch) and each starting
point, one beam search (the `steptp search` defaults: library policy ranked by the cost model, the
prior blended half and half with the program's analysis): its best speedup, and how many states it
verified before its first state within 90% of the best speedup either search found on that program
(`states to 90%`; fewer is better; `-` when it never got there). The baseline named: the prior's
regressor alone (the model before the ranker: `PriorModel` with its ranker removed); the ratio is its
states to 90% over the ranker's. Both searches of a program run one after the other in one session.
"""
from __future__ import annotations

import argparse
import statistics
import sys
from dataclasses import replace
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "benchmarks"))


def states_to(result, threshold: float) -> int | None:
    """The number of states verified up to the first accepted one at `threshold` speedup or more."""
    verified = 0
    for node in result.nodes[1:]:
        verified += 1
        if node.accepted and node.speedup and node.speedup >= threshold:
            return verified
    return None


def main() -> int:
    from bench_search import ISSUE_14, programs

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--prior", type=Path, default=ROOT / "lake" / "cost_model" / "model.json",
                        help="an offline cost model with a ranker (the cost_model stage's output)")
    parser.add_argument("--programs", nargs="*", default=ISSUE_14)
    parser.add_argument("--budget", type=int, default=40, help="states verified per search (the README's)")
    parser.add_argument("--seed", type=int, default=1)
    args = parser.parse_args()

    from leir.frontend import translate
    from search.cost_model import PriorModel
    from search.drivers import Budget
    from search.runner import Pools, run_search

    try:
        prior = PriorModel.load(args.prior)
    except ValueError as e:
        print(f"{e}; build the lake first (make run)")
        return 1
    if prior.ranker is None:
        print(f"{args.prior} has no ranker: rebuild it with this version (`steptp stage cost_model`)")
        return 1
    starts = {"regressor": replace(prior, ranker=None), "ranker": prior}
    catalogue = programs()
    ratios = []
    print(f"prior {args.prior} ({prior.info.get('rows')} states, ranker on {prior.info.get('ranking_rows')}); "
          f"beam, budget {args.budget}, seed {args.seed}")
    print("| program | regressor: best, states to 90% | ranker: best, states to 90% | ratio |")
    print("| --- | --- | --- | --- |")
    with Pools() as pools:
        for name in args.programs:
            module, inputs = catalogue[name]
            tr = translate(module, inputs)
            found = {k: run_search(tr.program, tr.signature, "beam", "library", Budget(args.budget, 3600.0), args.seed,
                                   pools=pools, as_result=True, policy_options={"ranked": True, "prior": p})
                     for k, p in starts.items()}
            best = max(r.best.speedup for r in found.values())
            steps = {k: states_to(r, 0.9 * best) for k, r in found.items()}
            ratio = steps["regressor"] / steps["ranker"] if steps["regressor"] and steps["ranker"] else None
            if ratio:
                ratios.append(ratio)
            cells = [f"{found[k].best.speedup:.1f}x, {steps[k] if steps[k] else '-'}" for k in starts]
            print(f"| {name} | {cells[0]} | {cells[1]} | {'-' if ratio is None else f'{ratio:.2f}'} |", flush=True)
    if ratios:
        print(f"geometric mean of the ratios (regressor's states to 90% / ranker's): "
              f"{statistics.geometric_mean(ratios):.2f} over {len(ratios)} programs")
    return 0


if __name__ == "__main__":
    sys.exit(main())
