"""Token efficiency of LEIR against TensorIR, plain TIR and CUDA.

Catalogue (default): translates every catalogue original at its default shapes
(`sample_instance(w, seed, 0)`, float32; workloads that do not translate are skipped and counted).
Published format (`--published`): the programs of tests/data/published_sample.jsonl (each line's
original and its transformed IR, signature read from the prompt), the golden examples of
tests/data/programs.jsonl, and the KernelBench-style files of tests/data/kernelbench translated at
their own sizes (each in a child process with a memory limit: a file that does not fit is skipped).
Counts the tokens of the canonical LEIR, the TVMScript of its TensorIR (block) form, of its plain
lowering (CPU and GPU target) and the CUDA source for sm_90 with the Qwen vocabulary, and prints the
median reductions overall and per family (per source set with --published) against the published 60%
(TensorIR) and 83% (CUDA).

    .venv/bin/python benchmarks/bench_tokens.py [--published] [--workers 1] [--families gemm,softmax]
        [--save rows.jsonl] [--load rows.jsonl] [--report-dir DIR]

`--save` keeps the counted rows; `--load` re-prints the figures from them without translating.
`--report-dir` also writes token_efficiency.{json,png,md} there (the report stage's files).
"""
from __future__ import annotations

import argparse
import json
import sys
import time
from dataclasses import replace
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


def catalogue_states(seed: int, families: set[str] | None, dtypes=("float32",)) -> tuple[list[State], list[str]]:
    """One state per catalogue workload and dtype that translates (default shapes; float32 unless
    `--dtype` says otherwise), and the skipped."""
    from leir.canon import program_id
    from leir.frontend import translate
    from workloads.registry import all_workloads
    from workloads.sampling import build, sample_instance

    states, skipped = {}, []
    for w in all_workloads():
        if families and w.family not in families:
            continue
        for dtype in dtypes:
            try:
                module, inputs = build(w, replace(sample_instance(w, seed, 0), dtype=dtype))
                tr = translate(module, inputs, dtype=dtype)
            except Exception as e:  # noqa: BLE001 - TranslationError, or a workload that cannot build
                why = str(e).strip().splitlines()[-1][:120] if str(e) else ""
                skipped.append(f"{w.name} ({dtype}): {type(e).__name__}: {why}")
                continue
            pid = program_id(tr.program, tr.signature)
            states.setdefault(pid, State(pid, w.family, "program", w.name, tr.text, tr.signature.dumps(),
                                         dtype=dtype))
    return [states[k] for k in sorted(states)], skipped


DATA = ROOT / "tests" / "data"
KERNELBENCH_MEMORY = 6 << 30  # bytes of address space per translation of a KernelBench file


def published_states() -> tuple[list[State], list[str]]:
    """Published-format programs, `family` naming their source set: `published_sample` (originals and
    transformed IRs of the chat lines), `examples` (golden programs), `kernelbench` (own sizes)."""
    from evaluation.published import chat_messages, program_from_prompt, signature_from_prompt
    from evaluation.response import parse_response
    from leir.canon import program_id
    from leir.parse import parse_program

    states, skipped = {}, []

    def add(family, name, program, signature):
        pid = program_id(program, signature)
        from leir.printer import format_program

        states.setdefault(pid, State(pid, family, "program", name, format_program(program), signature.dumps()))

    for n, line in enumerate((DATA / "published_sample.jsonl").read_text().splitlines(), start=1):
        prompt, answer = chat_messages(json.loads(line))
        text, program = program_from_prompt(prompt)
        signature = signature_from_prompt(prompt, program)
        add("published_sample", f"line{n}", program, signature)
        keys = ("applied_strategy", "applied_strategies")
        for item in parse_response(answer, bare_json=True, strategy_keys=keys).items:
            try:
                add("published_sample", f"line{n}/answer", parse_program(item.transformed_ir), signature)
            except Exception as e:  # noqa: BLE001 - a transformed IR that does not parse is skipped
                skipped.append(f"published_sample line {n} answer: {e}")
    from leir.signature import Signature

    for row in (json.loads(x) for x in (DATA / "programs.jsonl").read_text().splitlines() if x.strip()):
        add("examples", row["name"], parse_program(row["leir"]), Signature.from_json(row["signature"]))
    for path in sorted((DATA / "kernelbench").glob("*.py")):
        result = _translate_in_child(path)
        if "error" in result:
            skipped.append(f"{path.name}: {result['error']}")
            continue
        add("kernelbench", path.stem, parse_program(result["leir"]), Signature.from_json(result["signature"]))
    return [states[k] for k in sorted(states)], skipped


def _translate_in_child(path: Path) -> dict:
    """{"leir", "signature"} of a KernelBench file at its own sizes, or {"error"}: translation runs
    the model, and at their own sizes some need tens of GB (MinGPT attention), so it runs in a
    child process whose address space is limited."""
    import multiprocessing

    ctx = multiprocessing.get_context("spawn")  # a fork of this process (TVM and torch threads) can hang
    with ctx.Pool(1) as pool:
        return pool.apply(_translate_file, (str(path),))


def _translate_file(path: str) -> dict:
    import resource

    resource.setrlimit(resource.RLIMIT_AS, (KERNELBENCH_MEMORY, KERNELBENCH_MEMORY))
    from leir.frontend import translate
    from leir.frontend.kernelbench import load_problem

    try:
        problem = load_problem(path)
        t = translate(problem.model, problem.inputs, None)
    except Exception as e:  # noqa: BLE001 - unsupported operators, or out of memory
        return {"error": f"{type(e).__name__}: {str(e).strip().splitlines()[0][:120] if str(e).strip() else ''}"}
    return {"leir": t.text, "signature": t.signature.dumps()}


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--published", action="store_true", help="published-format programs instead of the catalogue")
    ap.add_argument("--workers", type=int, default=1)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--families", default="")
    ap.add_argument("--dtype", action="append", help="catalogue programs in this dtype (repeatable; float32)")
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
        states, skipped = published_states() if args.published else \
            catalogue_states(args.seed, families or None, tuple(args.dtype or ["float32"]))
        t1 = time.perf_counter()
        rows = token_rows(states, workers=args.workers)
        t2 = time.perf_counter()
        print(f"translated {len(states)} {'programs' if args.published else 'workloads'} in {t1 - t0:.0f} s "
              f"({len(skipped)} skipped); counted in {t2 - t1:.0f} s with {args.workers} worker(s)")
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
    print(f"{'family':24} {'n':>4} {'LEIR/TensorIR':>13} {'red.%':>6} {'LEIR/TIR':>9} {'red.%':>6} {'LEIR/TIRgpu':>11} "
          f"{'LEIR/CUDA':>10} {'red.%':>6} {'LEIR/CUDAk':>10}")
    dtypes = summary.get("dtypes", {})
    by_dtype = [(f"dtype {d}", s) for d, s in dtypes.items()] if len(dtypes) > 1 else []
    for name, s in [("OVERALL", overall), *by_dtype, *summary["families"].items()]:
        r = s["ratios"]
        print(f"{name:24} {s['states']:>4} {_med(r['leir_tensorir']):>13} {_red(r['leir_tensorir']):>6} "
              f"{_med(r['leir_tir']):>9} {_red(r['leir_tir']):>6} {_med(r['leir_tir_gpu']):>11} "
              f"{_med(r['leir_cuda']):>10} {_red(r['leir_cuda']):>6} {_med(r['leir_cuda_kernels']):>10}")
    for name, goal in PUBLISHED_REDUCTION.items():
        got = overall["ratios"][name]["reduction_percent"]
        verdict = "meets" if got is not None and got >= goal else "misses"
        print(f"{name}: median reduction {got}% vs published {goal:.0f}% "
              f"(ratio {got / goal if got is not None else float('nan'):.2f}x of the claim; {verdict} the goal)")
    print(f"leir_tir (plain TVMScript, no published figure): median reduction "
          f"{overall['ratios']['leir_tir']['reduction_percent']}%")
    print("LEIR not shorter than " + ", ".join(f"{label} in {len(summary['not_shorter'][k])} states" for k, label in (
        ("leir_tensorir", "TensorIR"), ("leir_tir", "plain TIR (CPU)"), ("leir_cuda", "CUDA"))))


def _med(stats: dict) -> str:
    return "-" if stats["median"] is None else f"{stats['median']:.3f}"


def _red(stats: dict) -> str:
    return "-" if stats["reduction_percent"] is None else f"{stats['reduction_percent']:.1f}"


if __name__ == "__main__":
    raise SystemExit(main())
