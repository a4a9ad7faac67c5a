"""Verified steps per second at release shapes: a program's steps verified together (the verify stage's
way, `gpu_tasks.group_verify`) against each pair verified whole (`verify_pair_job`, the way before it),
both in a worker pool, on the same steps of a lake, with their verdicts compared byte for byte:

    python benchmarks/bench_verify_groups.py [--lake LAKE] [--programs 60] [--workers 2] [--seed 1]

The steps are those of a seeded sample of the lake's programs (all their steps, as the verify stage
sees them; a release-profile lake gives release shapes). Each way starts with a cold pool (no build
cached anywhere); the pool's start-up is left out of both rates. Goal (issue: verification at release
shapes): at least 40 verified steps/s on 2 cores.
"""
from __future__ import annotations

import argparse
import json
import random
import sys
import time
from collections import Counter, defaultdict
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from flows.storage import read_table  # noqa: E402
from gpu_tasks import pair_groups  # noqa: E402
from gpu_tasks.jobs import verify_pair_job  # noqa: E402
from gpu_tasks.pool import Job, WorkerPool  # noqa: E402
from gpu_tasks.verify import as_verification, pair_request, verify_pairs  # noqa: E402

GOAL_STEPS_PER_S = 40.0


def sample_requests(lake: Path, programs: int, seed: int, draws: int) -> tuple[list, int]:
    signatures = {p["program_id"]: p["signature"] for p in read_table(lake, "programs").to_pylist()}
    by_program: dict[str, list[dict]] = defaultdict(list)
    for s in read_table(lake, "steps").to_pylist():
        by_program[s["program_id"]].append(s)
    chosen = sorted(by_program)
    random.Random(seed).shuffle(chosen)
    chosen = chosen[:programs]
    requests = [pair_request(s["before_leir"], s["after_leir"], signatures[p], draws=draws, seed=0)
                for p in chosen for s in sorted(by_program[p], key=lambda s: s["step_id"])]
    return requests, len(chosen)


def timed(workers: int, run) -> tuple[list, float]:
    with WorkerPool(workers=workers, timeout_s=60) as pool:
        pool.broadcast(len, ())  # every worker started before the clock does
        start = time.perf_counter()
        results = run(pool)
        return results, time.perf_counter() - start


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--lake", type=Path, default=Path("lake"), help="a built lake (default: make run's)")
    parser.add_argument("--programs", type=int, default=60, help="programs sampled (all their steps)")
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--draws", type=int, default=3)
    parser.add_argument("--max-group", type=int, default=pair_groups.MAX_GROUP,
                        help=f"pairs per group job (default {pair_groups.MAX_GROUP})")
    parser.add_argument("--grouped-only", action="store_true", help="skip the pair-by-pair run (no ratio)")
    args = parser.parse_args()
    pair_groups.MAX_GROUP = args.max_group

    requests, n_programs = sample_requests(args.lake, args.programs, args.seed, args.draws)
    grouped, t_grouped = timed(args.workers, lambda pool: verify_pairs(requests, pool))
    if args.grouped_only:
        print(f"steps: {len(requests)} of {n_programs} programs, groups of at most {args.max_group}: "
              f"{t_grouped:.1f} s, {len(requests) / t_grouped:.1f} verified steps/s")
        return 0
    whole, t_whole = timed(args.workers, lambda pool: [as_verification(r) for r in pool.run(
        Job(verify_pair_job, (r,), affinity=r.before) for r in requests)])
    same = sum(json.dumps(a.to_json(), sort_keys=True) == json.dumps(b.to_json(), sort_keys=True)
               for a, b in zip(grouped, whole, strict=True))
    rate_g, rate_w = len(requests) / t_grouped, len(requests) / t_whole
    print(f"steps: {len(requests)} of {n_programs} programs of {args.lake} ({args.draws} draws each), "
          f"{args.workers} workers")
    print(f"pair by pair (whole states): {t_whole:.1f} s, {rate_w:.1f} verified steps/s; "
          f"statuses {dict(Counter(v.status for v in whole))}")
    print(f"grouped by program (at most {args.max_group} per group): {t_grouped:.1f} s, {rate_g:.1f} verified "
          f"steps/s (ratio {rate_g / rate_w:.2f})")
    print(f"verdicts identical: {same} of {len(requests)}")
    print(f"goal >= {GOAL_STEPS_PER_S:.0f} steps/s: {'met' if rate_g >= GOAL_STEPS_PER_S else 'MISSED'} "
          f"(ratio {rate_g / GOAL_STEPS_PER_S:.2f})")
    return 0 if same == len(requests) else 1


if __name__ == "__main__":
    sys.exit(main())
