"""How many catalogue originals match PyTorch, per dtype and family.

Translates every catalogue workload (or the `--families` / `--workload` given) at one shape profile
(`--shapes release` by default: the release build's instances, `sample_instance(w, seed, 0)`), in
each `--dtype`, and verifies each original against PyTorch eager in float64 on the verify stage's
seeded draws with the dtype's tolerance (params.yaml `verify.tolerance`): what the generate stage
does before any strategy sees a program. Prints, per dtype, the share of originals that verify
(`exact`/`close`) overall and per family, and every original that does not, with the reason.

    .venv/bin/python benchmarks/bench_originals.py --dtype float16 --dtype bfloat16 [--shapes release]
        [--families gemm,conv] [--workload matmul] [--workers 2] [--save rows.jsonl] [--load rows.jsonl]

A workload that does not translate is counted apart (`untranslated`), not as a failure.
"""
from __future__ import annotations

import argparse
import json
import sys
import time
from collections import defaultdict
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

PASSED = ("exact", "close")


def translated(dtype: str, shapes: str, seed: int, families: set[str] | None, names: set[str] | None):
    """(workload, Translation) for each selected workload in `dtype`, and the untranslated names."""
    from dataclasses import replace

    from leir.frontend import TranslationError, translate
    from workloads.registry import all_workloads
    from workloads.sampling import build, sample_instance

    out, skipped = [], []
    for w in all_workloads():
        if (families and w.family not in families) or (names and w.name not in names):
            continue
        inst = replace(sample_instance(w, seed, 0, shapes), dtype=dtype)
        try:
            module, inputs = build(w, inst)
            out.append((w, translate(module, inputs, dtype=dtype)))
        except TranslationError:
            skipped.append(w.name)
    return out, skipped


def measure(dtype: str, shapes: str, seed: int, families, names, workers: int) -> list[dict]:
    from flows.config import load_params, own_error_factor
    from gpu_tasks.pool import WorkerPool
    from gpu_tasks.verify import verify_against_references

    params = load_params(ROOT / "params.yaml")
    verify = params.verify
    found, skipped = translated(dtype, shapes, seed, families, names)
    with WorkerPool(workers=workers, timeout_s=float(verify["timeout_s"])) as pool:
        results = verify_against_references([(tr.program, tr.signature, tr.reference, tr.reference_in_dtype)
                                             for _, tr in found], pool, draws=int(verify["draws"]), seed=seed,
                                            tolerances=verify["tolerance"], own_factor=own_error_factor(params))
    rows = [{"dtype": dtype, "workload": w.name, "family": w.family, "status": v.status,
             "max_abs_err": v.max_abs_err, "tolerance_share": v.tolerance_share,
             "error": (v.error or "").splitlines()[0][:200] if v.error else "", "leir_chars": len(tr.text)}
            for (w, tr), v in zip(found, results, strict=True)]
    rows += [{"dtype": dtype, "workload": n, "family": "", "status": "untranslated"} for n in skipped]
    return rows


def report(rows: list[dict]) -> str:
    lines = []
    for dtype in dict.fromkeys(r["dtype"] for r in rows):
        mine = [r for r in rows if r["dtype"] == dtype and r["status"] != "untranslated"]
        ok = sum(r["status"] in PASSED for r in mine)
        lines.append(f"{dtype}: {ok} of {len(mine)} originals verify against PyTorch "
                     f"({100 * ok / max(1, len(mine)):.1f}%)")
        by_family = defaultdict(list)
        for r in mine:
            by_family[r["family"]].append(r)
        for family in sorted(by_family):
            rs = by_family[family]
            good = sum(r["status"] in PASSED for r in rs)
            lines.append(f"  {family:22s} {good:3d}/{len(rs):<3d}")
        for r in mine:
            if r["status"] not in PASSED:
                lines.append(f"  - {r['workload']} ({r['family']}): {r['status']}: {r['error']}")
        skipped = [r["workload"] for r in rows if r["dtype"] == dtype and r["status"] == "untranslated"]
        if skipped:
            lines.append(f"  untranslated: {', '.join(skipped)}")
    return "\n".join(lines)


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--dtype", action="append", help="float32, float16, bfloat16, float64 (repeatable)")
    ap.add_argument("--shapes", default="release", choices=("default", "release", "tiny"))
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--families", default="", help="comma-separated families (default: all)")
    ap.add_argument("--workload", action="append", help="only these workloads (repeatable)")
    ap.add_argument("--workers", type=int, default=2)
    ap.add_argument("--save", help="write the rows as JSON lines")
    ap.add_argument("--load", help="re-print the figures of saved rows")
    args = ap.parse_args(argv)
    if args.load:
        rows = [json.loads(line) for line in Path(args.load).read_text().splitlines() if line.strip()]
        print(report(rows))
        return
    families = set(filter(None, args.families.split(","))) or None
    names = set(args.workload) if args.workload else None
    rows = []
    for dtype in args.dtype or ["float32"]:
        start = time.perf_counter()
        rows += measure(dtype, args.shapes, args.seed, families, names, args.workers)
        print(f"{dtype}: measured in {time.perf_counter() - start:.0f} s", file=sys.stderr, flush=True)
    if args.save:
        Path(args.save).write_text("".join(json.dumps(r) + "\n" for r in rows))
    print(report(rows))


if __name__ == "__main__":
    main()
