"""Two sessions, one verdict? Re-times a seeded sample of a lake's programs (at least `--states`
states, whole programs: a comparison is made within one session) on the measure stage's protocol,
and compares each step's effect class with the one of the lake's own timings:

    python benchmarks/bench_repeatability.py [LAKE] [--states 100] [--seed 0]

Prints the CPU, the steps compared (released steps and follow-up chains of the chosen programs),
how many the first session resolved (`faster`, `neutral` or `slower`), the share of those the second
session gives the same class (the issue-41 goal: at least 95%), the share among the steps both
sessions resolved, and the opposite verdicts (`faster` in one, `slower` in the other). The baseline
is the lake's own session: the ratio printed is agreement / 0.95.
"""
from __future__ import annotations

import argparse
import sys
import time
from collections import Counter
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from flows.config import load_params  # noqa: E402
from flows.keys import rank, stable_id  # noqa: E402
from flows.lake_queries import released_step_rows  # noqa: E402
from flows.measure import (  # noqa: E402
    TimingIndex,
    group_job,
    group_rows,
    measure_params,
    measuring_machine,
    passing_follow_ups,
    protocol_of,
    state_groups,
)
from flows.storage import read_table  # noqa: E402
from gpu_tasks.effect import RESOLVED  # noqa: E402

GOAL = 0.95


def chosen_groups(lake: Path, states: int, seed: int, target: str = "llvm"):
    released = released_step_rows(lake)
    groups = state_groups(read_table(lake, "programs").to_pylist(), read_table(lake, "steps").to_pylist(), released,
                          target, passing_follow_ups(lake, released))
    out, n = [], 0
    for g in sorted(groups, key=lambda g: rank(seed, "repeatability", g.program_id)):
        if n >= states:
            break
        out.append(g)
        n += len(g.states)
    return out


def retime(groups, cfg: dict, target: str = "llvm") -> list[dict]:
    from gpu_tasks.state_timing import session_fingerprint
    from gpu_tasks.timing import timing_pool

    rows = []
    with timing_pool(timeout_s=float(cfg["timeout_s"])) as pool:
        fp = pool.broadcast(session_fingerprint, target)[0]
        run_id = stable_id("repeatability", time.time_ns())
        for k, result in pool.imap([group_job(g, cfg, target) for g in groups]):
            session = {"target": target, "fingerprint": fp, "run_id": run_id, "protocol": protocol_of(cfg),
                       "sample_ms": int(cfg["min_repeat_ms"]),
                       "session_id": stable_id("timing-session", run_id, groups[k].program_id)}
            rows.extend(group_rows(groups[k], result, cfg, session))
            print(f"  {k + 1}/{len(groups)} {groups[k].family}: {len(groups[k].states)} states", file=sys.stderr,
                  flush=True)
    return rows


def agreement(groups, first: TimingIndex, second: TimingIndex) -> Counter:
    c = Counter()
    for g in groups:
        for before, after in g.pairs:
            key = before + after
            e1, e2 = first.compare(before, after, key).effect, second.compare(before, after, key).effect
            if e1 is None or e2 is None:
                continue
            c["steps"] += 1
            if e1 in RESOLVED:
                c["resolved_first"] += 1
                c["same_of_first"] += e1 == e2
                if e2 in RESOLVED:
                    c["resolved_both"] += 1
                    c["same_of_both"] += e1 == e2
            c["opposite"] += {e1, e2} == {"faster", "slower"}
            c[f"first_{e1}"] += 1
            c[f"second_{e2}"] += 1
    return c


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("lake", nargs="?", default="lake")
    parser.add_argument("--states", type=int, default=100, help="re-time programs until this many states")
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()
    lake = Path(args.lake)
    if not (lake / "timings").exists():
        print(f"bench_repeatability: {lake} has no timings; run `make run` first (or pass a lake)")
        return
    cfg = measure_params(load_params())
    timings = read_table(lake, "timings").to_pylist()
    machine = measuring_machine(timings, {r["state_id"] for r in timings}, "llvm")
    first = [r for r in timings if r["machine_id"] == machine and r["target"] == "llvm"]
    groups = chosen_groups(lake, args.states, args.seed)
    start = time.perf_counter()
    rows = retime(groups, cfg)
    c = agreement(groups, TimingIndex(first), TimingIndex(rows))
    print(f"CPU: {rows[0]['machine'] and __import__('json').loads(rows[0]['machine'])['cpu_model']}; "
          f"{sum(len(g.states) for g in groups)} states of {len(groups)} programs re-timed in "
          f"{time.perf_counter() - start:.0f} s (the lake's session: machine {machine})")
    print(f"steps compared: {c['steps']}; first session: "
          + ", ".join(f"{e} {c['first_' + e]}" for e in (*RESOLVED, "unresolved"))
          + "; second: " + ", ".join(f"{e} {c['second_' + e]}" for e in (*RESOLVED, "unresolved")))
    of_first = c["same_of_first"] / max(1, c["resolved_first"])
    of_both = c["same_of_both"] / max(1, c["resolved_both"])
    print(f"same class in the second session: {c['same_of_first']} of {c['resolved_first']} steps the first resolved "
          f"({100 * of_first:.1f}%; goal {100 * GOAL:.0f}%, ratio {of_first / GOAL:.3f}); {c['same_of_both']} of "
          f"{c['resolved_both']} resolved in both ({100 * of_both:.1f}%); opposite verdicts: {c['opposite']}")


if __name__ == "__main__":
    main()
