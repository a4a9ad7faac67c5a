"""Verified pairs per second with the worker pool, against one fresh process per pair.

The pairs are small-shape originals (tests/data/programs.jsonl) and transformations of them made
by changing loop kinds (serial, unrolled, parallel, vectorized) plus the identity. The pool run
starts cold (no build cached anywhere); its start-up (fork server importing TVM) is reported apart.
The fresh-process way verifies each pair in `python -c` that imports TVM, builds both programs and
compares them, as the published tool does, on a sample of the same pairs.

Goal: at least 25 verified pairs/s on 2 cores, and at least 10x the fresh-process way.
`--strict` exits with status 1 when a goal is missed.
"""
from __future__ import annotations

import argparse
import json
import subprocess
import sys
import time
from collections import Counter
from dataclasses import replace
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from gpu_tasks.pool import WorkerPool  # noqa: E402
from gpu_tasks.verify import pair_request, verify_pairs  # noqa: E402
from leir import Program, format_program, parse_program  # noqa: E402

PROGRAMS = ROOT / "tests" / "data" / "programs.jsonl"
GOAL_PAIRS_PER_S, GOAL_RATIO = 25.0, 10.0

FRESH_SCRIPT = """
import json, sys
from gpu_tasks.verify import verify_pair
p = json.loads(sys.stdin.read())
print(verify_pair(p["before"], p["after"], p["signature"]).status)
"""


def kind_changes(text: str) -> list[str]:
    """Each non-bound loop of each top-level nest turned into each other kind, one at a time."""
    program = parse_program(text)
    out = []
    for n, nest in enumerate(program.nests):
        for i, loop in enumerate(nest.loops):
            for kind in ("L", "U", "P", "V"):
                if loop.kind == "B" or kind == loop.kind:
                    continue
                loops = nest.loops[:i] + (replace(loop, kind=kind),) + nest.loops[i + 1:]
                nests = program.nests[:n] + (replace(nest, loops=loops),) + program.nests[n + 1:]
                out.append(format_program(Program(nests)))
    return out


def load_pairs() -> list[dict]:
    pairs = []
    for line in PROGRAMS.read_text().splitlines():
        ex = json.loads(line)
        for after in [ex["leir"], *kind_changes(ex["leir"])]:
            pairs.append({"before": ex["leir"], "after": after, "signature": ex["signature"]})
    return pairs


def bench_pool(pairs: list[dict], workers: int) -> tuple[float, float, Counter]:
    start = time.perf_counter()
    with WorkerPool(workers=workers) as pool:
        ready = time.perf_counter()
        results = verify_pairs([pair_request(p["before"], p["after"], p["signature"]) for p in pairs], pool)
        done = time.perf_counter()
    return ready - start, len(pairs) / (done - ready), Counter(v.status for v in results)


def bench_fresh(pairs: list[dict]) -> tuple[float, Counter]:
    statuses = Counter()
    start = time.perf_counter()
    for p in pairs:
        proc = subprocess.run([sys.executable, "-c", FRESH_SCRIPT], input=json.dumps(p), capture_output=True,
                              text=True, cwd=ROOT, check=True)
        statuses[proc.stdout.strip()] += 1
    return len(pairs) / (time.perf_counter() - start), statuses


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--fresh-sample", type=int, default=4, help="pairs verified the fresh-process way")
    parser.add_argument("--strict", action="store_true", help="exit 1 when a goal is missed")
    args = parser.parse_args()

    pairs = load_pairs()
    startup, pool_rate, pool_statuses = bench_pool(pairs, args.workers)
    sample = pairs[:: max(1, len(pairs) // args.fresh_sample)][: args.fresh_sample]
    fresh_rate, fresh_statuses = bench_fresh(sample)
    ratio = pool_rate / fresh_rate

    print(f"pairs: {len(pairs)} from {PROGRAMS.name} (identity + loop-kind changes), 3 draws each")
    print(f"pool ({args.workers} workers, cold caches): {pool_rate:.1f} verified pairs/s "
          f"(+ {startup:.1f} s start-up once); statuses {dict(pool_statuses)}")
    print(f"fresh process per pair ({len(sample)} pairs): {fresh_rate:.2f} verified pairs/s; "
          f"statuses {dict(fresh_statuses)}")
    print(f"ratio pool / fresh process: {ratio:.0f}x")
    met = pool_rate >= GOAL_PAIRS_PER_S and ratio >= GOAL_RATIO
    print(f"goal (>= {GOAL_PAIRS_PER_S:.0f} pairs/s and >= {GOAL_RATIO:.0f}x): {'met' if met else 'MISSED'}")
    return 1 if args.strict and not met else 0


if __name__ == "__main__":
    sys.exit(main())
