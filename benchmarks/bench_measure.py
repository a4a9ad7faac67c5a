"""Nest-by-nest timing against whole-state timing, on the states of a lake, in one session:
`python benchmarks/bench_measure.py [LAKE] [--programs N]` (default: `lake`, every program).

For each original program of the lake's released steps, its states are timed both ways
(`gpu_tasks.state_timing`, `unit="state"` and `unit="nest"`), the order of the two alternating from one
program to the next. Prints the build and measuring seconds of each way (the baseline: whole states),
how far the nest sums lie from the whole-state times, and how often the two agree on a step's effect
(`faster` / `neutral` / `slower`); with the lake's own `timings` table, also how often whole-state
timing agrees with itself across the two sessions, the noise floor any method is judged against.
"""
from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from flows.lake_queries import released_step_rows  # noqa: E402
from flows.measure import state_groups, state_ids  # noqa: E402
from flows.storage import read_table  # noqa: E402
from gpu_tasks.effect import step_effect  # noqa: E402
from gpu_tasks.state_timing import StateGroupRequest, time_states_job  # noqa: E402

METHODS = ("state", "nest")


def time_both(lake: Path, programs: int | None) -> tuple[dict, dict]:
    groups = state_groups(read_table(lake, "programs").to_pylist(), read_table(lake, "steps").to_pylist(),
                          released_step_rows(lake), "llvm")[:programs]
    times: dict[str, dict] = {m: {} for m in METHODS}
    cost = {m: {"build_s": 0.0, "measure_s": 0.0, "wall_s": 0.0, "functions": 0} for m in METHODS}
    for k, group in enumerate(groups):
        ids = list(group.states)
        for method in (METHODS if k % 2 == 0 else METHODS[::-1]):
            start = time.perf_counter()
            result = time_states_job(StateGroupRequest(tuple(group.states[s] for s in ids), group.signature,
                                                       unit=method))
            c = cost[method]
            c["build_s"] += result.build_s
            c["measure_s"] += result.measure_s
            c["wall_s"] += time.perf_counter() - start
            c["functions"] += result.functions
            for sid, st in zip(ids, result.states, strict=True):
                if st.ok:
                    times[method][sid] = (st.median_us, st.spread)
        print(f"  {k + 1}/{len(groups)} {group.family}: {len(ids)} states", file=sys.stderr, flush=True)
    return times, cost


def effect_agreement(lake: Path, a: dict, b: dict) -> tuple[int, int, int]:
    """(steps with both states in both, same effect, opposite effects)."""
    after_of = {s["step_id"]: s["after_program_id"]
                for s in read_table(lake, "steps").select(["step_id", "after_program_id"]).to_pylist()}
    total = same = opposite = 0
    for step in released_step_rows(lake):
        before, after = state_ids(step, after_of)
        if not all(x in t for x in (before, after) for t in (a, b)):
            continue
        ea = step_effect(a[before][0], a[after][0], a[before][1], a[after][1])["effect"]
        eb = step_effect(b[before][0], b[after][0], b[before][1], b[after][1])["effect"]
        total += 1
        same += ea == eb
        opposite += {ea, eb} == {"faster", "slower"}
    return total, same, opposite


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("lake", nargs="?", default="lake")
    parser.add_argument("--programs", type=int, default=None, help="only the first N programs")
    args = parser.parse_args()
    lake = Path(args.lake)
    if not (lake / "samples").exists():
        print(f"bench_measure: {lake} has no released samples; run `make run` first (or pass a lake)")
        return
    from gpu_tasks.state_timing import session_fingerprint

    print(f"CPU: {session_fingerprint()['cpu_model']}")
    times, cost = time_both(lake, args.programs)
    for m in METHODS:
        c = cost[m]
        print(f"{m:>5}: {len(times[m])} states timed, {c['functions']} functions compiled, build {c['build_s']:.1f} s, "
              f"measure {c['measure_s']:.1f} s, wall {c['wall_s']:.1f} s ({len(times[m]) / c['wall_s']:.1f} states/s)")
    base, new = cost["state"], cost["nest"]
    print(f"whole-state / nest: build {base['build_s'] / new['build_s']:.2f}x, "
          f"wall {base['wall_s'] / new['wall_s']:.2f}x")
    common = sorted(set(times["state"]) & set(times["nest"]))
    ratio = np.array([times["nest"][s][0] / times["state"][s][0] for s in common])
    near = np.abs(np.log(ratio))
    print(f"nest sum / whole state over {len(common)} states: median {np.median(ratio):.3f}, "
          f"p10 {np.percentile(ratio, 10):.3f}, p90 {np.percentile(ratio, 90):.3f}; within 10%: "
          f"{100 * np.mean(near < np.log(1.1)):.1f}%")
    total, same, opposite = effect_agreement(lake, times["state"], times["nest"])
    print(f"step effects, nest vs whole state (same session): {same} of {total} agree "
          f"({100 * same / max(total, 1):.1f}%), {opposite} opposite")
    lake_rows = read_table(lake, "timings").to_pylist()
    if lake_rows:
        earlier = {r["state_id"]: (r["time_us"], r["spread"]) for r in lake_rows if r["status"] == "ok"}
        for m in METHODS:
            total, same, opposite = effect_agreement(lake, earlier, times[m])
            print(f"step effects, the lake's timings vs {m} now: {same} of {total} agree "
                  f"({100 * same / max(total, 1):.1f}%), {opposite} opposite")


if __name__ == "__main__":
    main()
