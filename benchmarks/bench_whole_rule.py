"""When a step that changes the number of nests needs its states timed whole: nest sums against
whole-state times on the steps a lake timed both ways, by the smaller side's time per call.

`python benchmarks/bench_whole_rule.py [LAKE] [--bound US]` (default: `lake`, after `make run`). The
lake's `timings` must hold whole-state rows for the steps to judge: a lake measured with
`measure.whole_changed_below_us: .inf` (every step that changes the number of nests timed whole, the
protocol before the bound existed) holds them all. For each released step whose two states have nest
and whole rows from one session, the step's effect is computed both ways
(`gpu_tasks.effect.step_effect`, paired by round) and the two compared: the share classed alike, the
share classed differently where both are resolved, the steps classed faster one way and slower the
other, and the nest-sum speedup over the whole-state speedup. Then, for `--bound`, how many of the
lake's states the rule would still time whole (the measure stage's cost). Pure arithmetic on the
lake's rows: no timing, so it may run beside other work.
"""
from __future__ import annotations

import argparse
import sys
from collections import Counter
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from flows.lake_queries import released_step_rows  # noqa: E402
from flows.measure import state_ids  # noqa: E402
from flows.storage import read_table  # noqa: E402
from gpu_tasks.effect import RESOLVED, compared_whole, step_effect  # noqa: E402

BUCKETS = ((0.0, 5.0), (5.0, 50.0), (50.0, 500.0), (500.0, float("inf")))


def both_ways(lake: Path) -> list[dict]:
    """Each released step timed both ways: nests changed, the smaller side's µs, the two effects."""
    rows = [r for r in read_table(lake, "timings").to_pylist() if r["status"] == "ok"]
    index = {(r["state_id"], r["unit"]): r for r in rows}
    after_of = {s["step_id"]: s["after_program_id"]
                for s in read_table(lake, "steps").select(["step_id", "after_program_id"]).to_pylist()}
    out = []
    for step in released_step_rows(lake):
        b, a = state_ids(step, after_of)
        nb, na, wb, wa = (index.get(k) for k in ((b, "nest"), (a, "nest"), (b, "state"), (a, "state")))
        if not (nb and na and wb and wa) or len({nb["session_id"], na["session_id"]}) != 1:
            continue
        nest = step_effect(nb["samples_us"], na["samples_us"], step["step_id"], paired=True)
        whole = step_effect(wb["samples_us"], wa["samples_us"], step["step_id"], paired=True)
        out.append({"changes": nb["n_nests"] != na["n_nests"], "small_us": min(nb["time_us"], na["time_us"]),
                    "nest": nest, "whole": whole, "strategy": step["strategy"]})
    return out


def report(steps: list[dict]) -> None:
    print("nests  | smaller side µs | steps | same class | differ, both resolved | opposite | "
          "nest/whole speedup p10 / median / p90 | within 10%")
    for changes in (True, False):
        for lo, hi in BUCKETS:
            group = [s for s in steps if s["changes"] == changes and lo <= s["small_us"] < hi]
            if not group:
                continue
            classes = [(s["nest"]["effect"], s["whole"]["effect"]) for s in group]
            differ = sum(x != y and x in RESOLVED and y in RESOLVED for x, y in classes)
            opposite = sum({x, y} == {"faster", "slower"} for x, y in classes)
            ratio = np.array([s["nest"]["speedup"] / s["whole"]["speedup"] for s in group])
            p10, p50, p90 = np.percentile(ratio, [10, 50, 90])
            print(f"{'change' if changes else 'same':6s} | {lo:g}-{hi:g} | {len(group)} | "
                  f"{100 * np.mean([x == y for x, y in classes]):.1f}% | {100 * differ / len(group):.1f}% | "
                  f"{opposite} | {p10:.3f} / {p50:.3f} / {p90:.3f} | "
                  f"{100 * np.mean(np.abs(np.log(ratio)) < np.log(1.1)):.1f}%")


def whole_states(lake: Path, bound: float, below: float) -> tuple[int, int, int]:
    """(states with nest rows, states the rule with `bound` times whole for their steps, with no bound)."""
    rows = [r for r in read_table(lake, "timings").to_pylist() if r["status"] == "ok" and r["unit"] == "nest"]
    nest = {r["state_id"]: r for r in rows}
    after_of = {s["step_id"]: s["after_program_id"]
                for s in read_table(lake, "steps").select(["step_id", "after_program_id"]).to_pylist()}
    counted: dict[float, set[str]] = {bound: set(), float("inf"): set()}
    for step in released_step_rows(lake):
        b, a = state_ids(step, after_of)
        if b not in nest or a not in nest:
            continue
        for limit, states in counted.items():
            if compared_whole((nest[b]["n_nests"], nest[a]["n_nests"]), (nest[b]["time_us"], nest[a]["time_us"]),
                              below, limit):
                states.update((b, a))
    return len(nest), len(counted[bound]), len(counted[float("inf")])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("lake", type=Path, nargs="?", default=Path("lake"))
    parser.add_argument("--bound", type=float, default=500.0, help="measure.whole_changed_below_us to count (µs)")
    parser.add_argument("--whole-below", type=float, default=5.0, help="measure.whole_below_us (µs)")
    args = parser.parse_args()
    if not (args.lake / "timings").exists() or not (args.lake / "samples").exists():
        print(f"bench_whole_rule: {args.lake} has no timings or released samples; run `make run` first "
              "(or pass a lake)")
        return
    steps = both_ways(args.lake)
    print(f"{len(steps)} released steps timed both ways in one session; by strategy where the nests change: "
          f"{Counter(s['strategy'] for s in steps if s['changes']).most_common(6)}")
    report(steps)
    total, bounded, unbounded = whole_states(args.lake, args.bound, args.whole_below)
    print(f"states timed by nests: {total}; timed whole for their steps: {unbounded} with every change of nests "
          f"whole, {bounded} with the bound {args.bound:g} µs ({100 * (1 - bounded / max(unbounded, 1)):.0f}% fewer; "
          "the agreement sample comes on top)")


if __name__ == "__main__":
    main()
