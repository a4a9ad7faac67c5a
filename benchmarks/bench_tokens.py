"""Token efficiency of LEIR against TIR and CUDA on the catalogue (issue 7).

Translates every catalogue original at its default shapes (`sample_instance(w, seed, 0)`, float32;
workloads that do not translate are skipped and counted), counts the tokens of the canonical LEIR,
the TVMScript of its lowering (CPU and GPU target) and the CUDA source for sm_90 with the Qwen
vocabulary, and prints the median LEIR/TIR and LEIR/CUDA reductions overall and per family against
the published 60% and 83%.

    .venv/bin/python benchmarks/bench_tokens.py [--workers 1] [--families gemm,softmax]
        [--save rows.jsonl] [--load rows.jsonl] [--report-dir DIR]

`--save` keeps the counted rows; `--load` re-prints the figures from them without translating.
`--report-dir` also writes token_efficiency.{json,png,md} there (the report stage's files).
"""
from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from flows.token_stats import (  # noqa: E402
    PUBLISHED_REDUCTION,
    State,
    build_token_report,
    summarise,
    token_rows,
)


def catalogue_states(seed: int, families: set[str] | None) -> tuple[list[State], list[str]]:
    """One state per catalogue workload that translates (float32, default shapes), and the skipped."""
    from leir.canon import program_id
    from leir.frontend import translate
    from workloads.registry import all_workloads
    from workloads.sampling import build, sample_instance

    states, skipped = {}, []
    for w in all_workloads():
        if families and w.family not in families:
            continue
        try:
            module, inputs = build(w, sample_instance(w, seed, 0))
            tr = translate(module, inputs, dtype="float32")
        except Exception as e:  # noqa: BLE001 - TranslationError, or a workload that cannot build
            skipped.append(f"{w.name}: {type(e).__name__}: {str(e).strip().splitlines()[-1][:120] if str(e) else ''}")
            continue
        pid = program_id(tr.program, tr.signature)
        states.setdefault(pid, State(pid, w.family, "program", w.name, tr.text, tr.signature.dumps()))
    return [states[k] for k in sorted(states)], skipped


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--workers", type=int, default=1)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--families", default="")
    ap.add_argument("--save", type=Path)
    ap.add_argument("--load", type=Path)
    ap.add_argument("--report-dir", type=Path)
    args = ap.parse_args(argv)
    families = set(filter(None, args.families.split(",")))
    if args.load:
        rows = [json.loads(x) for x in args.load.read_text().splitlines() if x]
        skipped = []
    else:
        t0 = time.perf_counter()
        states, skipped = catalogue_states(args.seed, families or None)
        t1 = time.perf_counter()
        rows = token_rows(states, workers=args.workers)
        t2 = time.perf_counter()
        print(f"translated {len(states)} workloads in {t1 - t0:.0f} s ({len(skipped)} skipped); "
              f"counted in {t2 - t1:.0f} s with {args.workers} worker(s)")
        for s in skipped:
            print(f"  skipped {s}")
        if args.save:
            args.save.write_text("".join(json.dumps(r, sort_keys=True) + "\n" for r in rows))
    summary = summarise(rows, [])
    print_figures(summary)
    if args.report_dir:
        build_token_report(rows, [], args.report_dir)
        print(f"report written to {args.report_dir}")
    return 0


def print_figures(summary: dict) -> None:
    overall = summary["overall"]
    print(f"\nstates counted: {overall['states']} (lowering errors: {summary['errors']})")
    print(f"{'family':24} {'n':>4} {'LEIR/TIR':>9} {'red.%':>6} {'LEIR/TIRgpu':>11} {'LEIR/CUDA':>10} {'red.%':>6}"
          f" {'LEIR/CUDAk':>10}")
    for name, s in [("OVERALL", overall), *summary["families"].items()]:
        r = s["ratios"]
        print(f"{name:24} {s['states']:>4} {_med(r['leir_tir']):>9} {_red(r['leir_tir']):>6} "
              f"{_med(r['leir_tir_gpu']):>11} {_med(r['leir_cuda']):>10} {_red(r['leir_cuda']):>6} "
              f"{_med(r['leir_cuda_kernels']):>10}")
    for name, goal in PUBLISHED_REDUCTION.items():
        got = overall["ratios"][name]["reduction_percent"]
        verdict = "meets" if got is not None and got >= goal else "misses"
        print(f"{name}: median reduction {got}% vs published {goal:.0f}% "
              f"(ratio {got / goal if got is not None else float('nan'):.2f}x of the claim; {verdict} the goal)")
    print(f"LEIR not shorter than TIR (CPU) in {len(summary['not_shorter']['leir_tir'])} states, "
          f"than CUDA in {len(summary['not_shorter']['leir_cuda'])}")


def _med(stats: dict) -> str:
    return "-" if stats["median"] is None else f"{stats['median']:.3f}"


def _red(stats: dict) -> str:
    return "-" if stats["reduction_percent"] is None else f"{stats['reduction_percent']:.1f}"


if __name__ == "__main__":
    raise SystemExit(main())
