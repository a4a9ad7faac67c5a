"""Strategy throughput: sites enumerated per second and transformations applied per second,
over every registered strategy, on one core.

Corpus: the 12 example programs (tests/data/programs.jsonl) and 20 catalogue originals at default
shapes (the survey's deterministic sample, `cli.strategies.sample_catalogue`). For each program
and strategy: `Strategy.sites` in full, then `Strategy.transformations` with at most 2 parameter
variants per site (the default profile's `max_variants_per_site`) and no other cap; each
transformation is a legal, non-trivial, alpha-checked rewrite with its facts. One `Context` per
program is shared by all strategies, as in the transform stage (its analyses are computed once).

Baseline: the pipeline's goal that transforming never be slower than verifying, whose goal is
25 verified pairs/s on 2 cores (benchmarks/bench_verify.py). The ratio printed is
transformations/s divided by 25. `--strict` exits 1 below ratio 1.
"""
from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from leir import Signature, parse_program  # noqa: E402
from strategies.base import Context  # noqa: E402
from strategies.registry import registered  # noqa: E402

BASELINE_PAIRS_PER_S = 25.0
PER_SITE = 2
CATALOGUE = 20


def corpus(catalogue: int) -> list[tuple[str, Context]]:
    from cli.strategies import sample_catalogue

    rows = [json.loads(x) for x in (ROOT / "tests/data/programs.jsonl").read_text().splitlines() if x.strip()]
    out = [(r["name"], Context(parse_program(r["leir"]), Signature.from_json(r["signature"]))) for r in rows]
    return out + [(p.name, p.context) for p in sample_catalogue(catalogue)]


def measure(programs: list[tuple[str, Context]]) -> dict[str, dict]:
    stats = {s.name: {"sites": 0, "sites_s": 0.0, "transformations": 0, "transformations_s": 0.0}
             for s in registered()}
    for _, ctx in programs:
        ctx = ctx.with_program(ctx.program)  # fresh analyses, shared by the strategies below
        for s in registered():
            c = Context(ctx.program, ctx.signature, "cuda") if s.name == "loop_binding" else ctx
            row = stats[s.name]
            start = time.perf_counter()
            row["sites"] += sum(1 for _ in s.sites(c))
            middle = time.perf_counter()
            row["transformations"] += sum(1 for _ in s.transformations(c, per_site=PER_SITE))
            row["sites_s"] += middle - start
            row["transformations_s"] += time.perf_counter() - middle
    return stats


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--catalogue", type=int, default=CATALOGUE, help="catalogue originals in the corpus")
    ap.add_argument("--strict", action="store_true", help="exit 1 when transformations/s is below the baseline")
    args = ap.parse_args()

    start = time.perf_counter()
    programs = corpus(args.catalogue)
    print(f"corpus: {len(programs)} programs ({len(programs) - args.catalogue} examples, {args.catalogue} catalogue "
          f"originals), {sum(len(c.program.nests) for _, c in programs)} nests; built in "
          f"{time.perf_counter() - start:.1f} s")
    stats = measure(programs)
    sites = sum(r["sites"] for r in stats.values())
    sites_s = sum(r["sites_s"] for r in stats.values())
    made = sum(r["transformations"] for r in stats.values())
    made_s = sum(r["transformations_s"] for r in stats.values())
    print(f"strategies: {len(stats)} registered")
    print(f"sites enumerated:        {sites:6d} in {sites_s:6.2f} s = {sites / sites_s:8.1f} sites/s")
    print(f"transformations applied: {made:6d} in {made_s:6.2f} s = {made / made_s:8.1f} transformations/s "
          f"(at most {PER_SITE} variants per site)")
    ratio = made / made_s / BASELINE_PAIRS_PER_S
    print(f"ratio against the verification goal ({BASELINE_PAIRS_PER_S:.0f} verified pairs/s): {ratio:.1f}x")
    print("slowest strategies (sites + transformations time over the corpus):")
    slow = sorted(stats.items(), key=lambda kv: -(kv[1]["sites_s"] + kv[1]["transformations_s"]))[:6]
    for name, r in slow:
        total = r["sites_s"] + r["transformations_s"]
        rate = r["transformations"] / r["transformations_s"] if r["transformations_s"] else 0.0
        print(f"  {name:58s} {total:6.2f} s  {r['transformations']:5d} transformations  {rate:8.1f}/s")
    print(f"total time {time.perf_counter() - start:.1f} s")
    return 1 if args.strict and ratio < 1 else 0


if __name__ == "__main__":
    raise SystemExit(main())
