"""KernelBench levels 1 and 2 on the CPU: the search against PyTorch eager and torch.compile, on a suite
the field reports on and nobody here wrote.

The problem files are not shipped: point the benchmark at a KernelBench checkout (the folder that
holds `KernelBench/level1`, or `level1` itself, or any folder of KernelBench-style files). For each
problem, in a process of its own (a hang, a crash or an exhausted memory is that problem's row):

1. **Size.** The largest instance whose naive program executes at most `--max-statements`
   statements (2^24: some tens of milliseconds of naive code). The instances tried, in order: the
   translator's shrinker (`steptp translate --max-elements E`: size constants halved until every
   input has at most E elements) with E = 2^10, 2^12, ... 2^24, then the file's own sizes.
   Statements are counted on the meta device first, so a file written for a GPU costs no memory. The
   row names the constants changed. A problem on which eager takes less than `--eager-floor-us`
   (50 µs) is reported but not compared: there PyTorch's fixed cost per call decides.
2. **References**, before anything of TVM exists in the process: PyTorch eager and `torch.compile`
   (`--compile-modes`, the default mode unless told) as `gpu_tasks/torch_timing.py` times them (one
   thread and every core, the faster kept; compiled before timing, checked against eager, compile time
   reported), in a process that keeps its freed memory as a caching allocator would (glibc tunables,
   `CACHING_MALLOC_ENV`: eager's large outputs are not mapped and faulted in afresh at every call).
3. **Naive correct**: the translated program verified against PyTorch (float64), as `steptp translate`
   and the generate stage verify an original: on each draw, each bound is the tolerance or twice
   PyTorch's own error in float32, whichever is larger (`verify.pytorch_error_factor`).
4. **Search** with `steptp search`'s defaults (`--driver`, greedy; the library policy ranked by the
   cost model, from the lake's offline model when there is one) and `--budget` states; every state is
   verified against the program and timed against it in one session (naive and best).
5. **Best correct**: the best state verified against PyTorch again, on fresh draws, with the same bounds.

A problem is *correct* when its best state passed step 5 and *fast_1 against X* when it is correct
and faster than X. The geometric means are over the correct problems. Rows go to `--out` as JSON
lines (a rerun with the same `--out` skips the problems already there: nothing is lost when a run is
stopped); the summary per level is printed and, with `--plot`, the speedups' distribution drawn.
`--summary ROWS` prints the summary (and plot) of a rows file without running anything.

Quick runs: `--problems 1-10,23` (problem numbers), `--every 5` (every fifth problem of each level).
"""
from __future__ import annotations

import argparse
import json
import math
import os
import re
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

MAX_STATEMENTS = 2**24    # naive statements at most: some tens of milliseconds of naive code
SHRINK_LADDER = tuple(2**k for k in range(24, 9, -2))   # --max-elements tried when the own size is too big
EAGER_FLOOR_US = 50.0     # an eager time below this is too small to compare with: the row says so
DEFAULT_PRIOR = ROOT / "lake" / "cost_model" / "model.json"


# --- the suite --------------------------------------------------------------------------------------

def problem_files(checkout: Path, levels: list[int]) -> list[tuple[str, Path]]:
    """(level label, file) of every problem, by level then problem number. A folder without `levelN`
    subfolders is one level of its own, labelled by its name."""
    found = []
    for level in levels:
        for base in (checkout / "KernelBench" / f"level{level}", checkout / f"level{level}"):
            if base.is_dir():
                found += [(str(level), f) for f in _numbered(base)]
                break
    if not found and checkout.is_dir():
        found = [(checkout.name, f) for f in _numbered(checkout)]
    return found


def _numbered(folder: Path) -> list[Path]:
    """The problem files of `folder` (named `<number>_...py`), by number."""
    return sorted((f for f in folder.glob("*.py") if problem_number(f) is not None),
                  key=lambda f: (problem_number(f), f.name))


def problem_number(path: Path) -> int | None:
    """KernelBench's problem number: the digits that start the file name (`23_Softmax.py` -> 23)."""
    m = re.match(r"(\d+)_", path.name)
    return int(m.group(1)) if m else None


def parse_numbers(text: str) -> set[int]:
    """`1-10,23` -> {1, ..., 10, 23}."""
    out: set[int] = set()
    for part in filter(None, (p.strip() for p in text.split(","))):
        lo, _, hi = part.partition("-")
        if not lo.isdigit() or (hi and not hi.isdigit()):
            raise argparse.ArgumentTypeError(f"--problems: {part!r} is not a number or a range such as 1-10")
        out.update(range(int(lo), int(hi or lo) + 1))
    return out


def selected(files: list[tuple[str, Path]], numbers: set[int] | None, every: int) -> list[tuple[str, Path]]:
    """The problems a quick run takes: those numbered in `numbers`, then every `every`-th of each level."""
    picked = [(lv, f) for lv, f in files if numbers is None or problem_number(f) in numbers]
    out, seen = [], {}
    for lv, f in picked:
        seen[lv] = seen.get(lv, -1) + 1
        if seen[lv] % every == 0:
            out.append((lv, f))
    return out


# --- one problem, in its own process ----------------------------------------------------------------

def choose_size(path: Path, max_statements: int):
    """(problem, translation, the --max-elements used or None for the file's own sizes): the largest
    instance of the ladder (inputs shrunk to 2^10, 2^12, ... 2^24 elements, then the file's own sizes)
    whose naive program executes at most `max_statements` statements; the smallest rung when none
    does. Statements are counted on the meta device before anything is allocated.

    Why the largest and not the smallest on which eager reaches a floor (the first rule tried): on a
    problem of several operators, PyTorch's fixed cost per operator alone passes 50 µs, so that rule
    picked instances of 2x2x2 elements (a ConvTranspose3d chain timed 72 µs in eager, 9 µs naive)
    where the comparison measures dispatch, not computation."""
    from gpu_tasks.guard import iteration_count
    from leir.frontend import translate
    from leir.frontend.kernelbench import load_problem, read_constants, shrink_constants

    fitting, found, seen = None, False, set()
    for limit in (*reversed(SHRINK_LADDER), None):
        try:
            changed = {} if limit is None else shrink_constants(path, read_constants(path), set(), limit).changed
        except Exception:  # noqa: BLE001 - a file the shrinker cannot run: the real load says why
            changed = None
        key = None if changed is None else json.dumps(sorted(changed.items()), default=str)
        if key is not None and key in seen:
            continue
        seen.add(key)
        rung = None if changed == {} else limit   # a rung that shrinks nothing is the file's own size
        statements = _statements_on_meta(path, changed)
        if statements is None:   # not traceable on the meta device: the real instance is counted
            problem = load_problem(path, {}, rung, strict=False)
            statements = iteration_count(translate(problem.model, problem.inputs).program)
        if found and statements > max_statements:
            break   # every later rung is larger still
        fitting, found = rung, True
        if statements > max_statements or changed == {}:
            break   # the smallest rung is already too large, or this is the file's own size
    problem = load_problem(path, {}, fitting, strict=False)
    return problem, translate(problem.model, problem.inputs), fitting


def _statements_on_meta(path: Path, changed: dict | None) -> int | None:
    """Statement executions of the instance with `changed` constants, traced on the meta device (no
    storage: a 16384^2 output costs nothing); None when it cannot be traced there."""
    from gpu_tasks.guard import iteration_count
    from leir.frontend import translate
    from leir.frontend.kernelbench import load_problem_meta

    if changed is None:
        return None
    try:
        meta = load_problem_meta(path, changed)
        return iteration_count(translate(meta.model, meta.inputs).program)
    except Exception:  # noqa: BLE001 - Python that needs values: the real instance decides
        return None


def run_one(path: Path, args) -> dict:
    """The row of one problem (never raises for the problem's own failures: they are the row's)."""
    from gpu_tasks.torch_timing import describe

    row: dict = {"problem": path.stem, "number": problem_number(path), "file": path.name}
    phase = "size"
    t0 = time.perf_counter()
    try:
        from gpu_tasks.guard import iteration_count

        problem, tr, limit = choose_size(path, args.max_statements)
        row.update(max_elements=limit, constants_changed={k: v for k, v in problem.shrunk.items()},
                   statements=iteration_count(tr.program),
                   inputs={t.name: list(t.shape) for t in tr.signature.tensors if t.role == "input"},
                   size_notes=problem.notes, size_s=round(time.perf_counter() - t0, 1))
        phase = "references"
        from gpu_tasks.torch_timing import reference_rows

        t1 = time.perf_counter()
        refs = reference_rows({"p": (problem.model, problem.inputs)}, args.compile_modes, args.min_run_time)["p"]
        if isinstance(refs, str):
            raise RuntimeError(f"PyTorch eager failed: {refs}")
        row.update(refs)
        compiled = [refs[k] for k in ("torch_compile_us", "torch_compile_max_autotune_us") if refs.get(k)]
        row["torch_compile_best_us"] = min(compiled, default=None)
        row["references_s"] = round(time.perf_counter() - t1, 1)
        row["eager_under_floor"] = refs["torch_eager_us"] < args.eager_floor_us
        phase = "naive verification"
        from flows.config import load_params, own_error_factor
        from gpu_tasks.verify import verify_against_reference

        # judged as the generate stage and `steptp translate` judge an original: the float64 reference,
        # bounds raised to twice PyTorch's own error in float32 where that is larger
        own = {"own_fn": tr.reference_in_dtype, "own_factor": own_error_factor(load_params())}
        naive = verify_against_reference(tr.program, tr.signature, tr.reference, draws=3, **own)
        row["naive_verification"], row["translated"] = naive.status, bool(naive.passed)
        if not naive.passed and reference_degenerate(naive):
            phase = "degenerate problem"   # the problem's own output, not the translation: still not correct
            from gpu_tasks.compare import DEGENERATE

            raise RuntimeError(f"PyTorch's {naive.error.removeprefix(DEGENERATE)}: no draw can tell a right "
                               "program from a wrong one")
        if not naive.passed:
            raise RuntimeError(f"the translation does not match PyTorch: {naive.status} {naive.error or ''}".strip())
        phase = "search"
        from search.cost_model import PriorModel
        from search.drivers import Budget
        from search.runner import run_search

        prior = PriorModel.load(args.prior) if args.prior and Path(args.prior).exists() else None
        t2 = time.perf_counter()
        r = run_search(tr.program, tr.signature, args.driver, "library", Budget(args.budget, args.wall), 0,
                       policy_options={"ranked": True, "prior": prior}, as_result=True)
        row.update(prior=prior is not None, driver=args.driver, budget=args.budget, states=r.states_verified,
                   strategies=r.strategies(), search_s=round(time.perf_counter() - t2, 1),
                   naive_us=r.best.root_us or r.root.root_us, speedup=r.best.speedup or 1.0,
                   best_leir=r.best.text)
        if not row["naive_us"]:
            raise RuntimeError("the naive program could not be timed")
        row["best_us"] = row["naive_us"] / row["speedup"]
        phase = "best verification"
        best = verify_against_reference(r.best.text, tr.signature, tr.reference, draws=3, seed=1, **own)
        row["best_verification"] = best.status
        row["correct"] = bool(best.passed)
        if not best.passed:
            row["error"] = f"best state does not match PyTorch: {best.status} {best.error or ''}".strip()
    except Exception as e:  # noqa: BLE001 - the problem's failure is its row
        row["error"] = f"{phase}: {describe(e)}"
        row["correct"] = False
    row["failed_at"] = phase if row.get("error") else None
    row["wall_s"] = round(time.perf_counter() - t0, 1)
    return ratios(row)


def reference_degenerate(verification) -> bool:
    """The verification refused PyTorch's own output as evidence (all zero, non-finite or constant on
    every draw: 80_Gemm_Max_Subtract_GELU subtracts a one-element mean from itself), not the program's."""
    from gpu_tasks.compare import DEGENERATE

    error = verification.error or ""
    return verification.status == "invalid" and error.startswith(DEGENERATE + "output ")


def ratios(row: dict) -> dict:
    """The speedups of the best state over naive, eager and compile (> 1: the search is faster)."""
    best = row.get("best_us")
    for key, ref in (("over_eager", row.get("torch_eager_us")), ("over_compile", row.get("torch_compile_best_us"))):
        row[key] = ref / best if best and ref else None
    return row


def in_own_process(level: str, path: Path, args) -> dict:
    """`run_one` in a fresh Python process with a wall limit: its stdout's last line is the row."""
    command = [sys.executable, __file__, "--one", str(path), "--max-statements", str(args.max_statements),
               "--budget", str(args.budget), "--driver", args.driver, "--wall", str(args.wall),
               "--min-run-time", str(args.min_run_time),
               "--eager-floor-us", str(args.eager_floor_us), "--prior", args.prior or "",
               "--compile-modes", *args.compile_modes]
    from gpu_tasks.torch_timing import CACHING_MALLOC_ENV

    # freed blocks kept, as a caching allocator would: eager's large outputs are not faulted in afresh
    env = {**os.environ, "OPENBLAS_NUM_THREADS": "1", **CACHING_MALLOC_ENV}
    t0 = time.perf_counter()

    def limit_memory():  # an allocation past it fails in the problem's process, not the machine's OOM killer
        import resource

        cap = int(args.memory_gb * 2**30)
        resource.setrlimit(resource.RLIMIT_DATA, (cap, cap))
    try:
        done = subprocess.run(command, capture_output=True, text=True, timeout=args.timeout, env=env,
                              preexec_fn=limit_memory if args.memory_gb else None)
    except subprocess.TimeoutExpired:
        row = {"problem": path.stem, "number": problem_number(path), "file": path.name, "correct": False,
               "error": f"timeout: past {args.timeout:.0f} s", "failed_at": "timeout"}
    else:
        lines = [ln for ln in done.stdout.splitlines() if ln.startswith("{")]
        if done.returncode == 0 and lines:
            row = json.loads(lines[-1])
        else:
            tail = (done.stderr.strip().splitlines() or ["no output"])[-1][:300]
            cause = f"signal {-done.returncode}" if done.returncode < 0 else f"exit {done.returncode}"
            row = {"problem": path.stem, "number": problem_number(path), "file": path.name, "correct": False,
                   "error": f"{cause}: {tail}", "failed_at": "process"}
    row["level"] = level
    row["process_wall_s"] = round(time.perf_counter() - t0, 1)
    return row


# --- the summary ------------------------------------------------------------------------------------

def geomean(values: list[float]) -> float | None:
    values = [v for v in values if v and v > 0]
    return math.exp(sum(math.log(v) for v in values) / len(values)) if values else None


def summary(rows: list[dict]) -> dict[str, dict]:
    """Per level and over all: problems, correct, and against eager and compile `fast_1` (the share of
    the compared problems that are correct and faster; a failed problem counts, never as fast) and the
    geometric means over the correct ones. Compared: every problem but those whose eager stayed under
    the floor (reported, not compared: a flattering ratio against PyTorch's fixed cost per call)."""
    levels = sorted({r["level"] for r in rows}, key=lambda v: (not v.isdigit(), v)) + ["all"]
    out = {}
    for lv in levels:
        mine = [r for r in rows if lv == "all" or r["level"] == lv]
        compared = [r for r in mine if not r.get("eager_under_floor")]
        ok = [r for r in compared if r.get("correct")]
        n = len(compared)
        with_compile = [r for r in ok if r.get("over_compile")]
        out[lv] = {"problems": len(mine), "translated": sum(1 for r in mine if r.get("translated")),
                   "correct": sum(1 for r in mine if r.get("correct")),
                   "eager_under_floor": len(mine) - n, "compared": n,
                   "fast_1_eager": sum(1 for r in ok if (r.get("over_eager") or 0) > 1.0) / n if n else None,
                   "fast_1_compile": sum(1 for r in ok if (r.get("over_compile") or 0) > 1.0) / n if n else None,
                   "compiled": len(with_compile),
                   "geomean_over_naive": geomean([r.get("speedup") for r in mine if r.get("correct")]),
                   "geomean_over_eager": geomean([r.get("over_eager") for r in ok]),
                   "geomean_over_compile": geomean([r.get("over_compile") for r in with_compile]),
                   "failures": {r["problem"]: r.get("error") for r in mine if not r.get("correct")}}
    return out


def print_summary(stats: dict[str, dict]) -> None:
    def pct(v):
        return "-" if v is None else f"{v:.0%}"

    def x(v):
        return "-" if v is None else f"{v:.2f}x"
    print("\n| level | problems | translated | correct | eager < 50 µs (not compared) | fast_1 vs eager "
          "| fast_1 vs compile | geomean over naive | geomean over eager | geomean over compile |")
    print("| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |")
    for lv, s in stats.items():
        print(f"| {lv} | {s['problems']} | {s['translated']} | {s['correct']} | {s['eager_under_floor']} "
              f"| {pct(s['fast_1_eager'])} | {pct(s['fast_1_compile'])} | {x(s['geomean_over_naive'])} "
              f"| {x(s['geomean_over_eager'])} | {x(s['geomean_over_compile'])} |")
    failures = stats["all"]["failures"]
    if failures:
        print(f"\nnot correct ({len(failures)}):")
        for name, why in failures.items():
            print(f"  {name}: {why}")


def plot(rows: list[dict], path: str) -> None:
    """Sorted speedups over eager and over compile (log scale) of each level's correct problems that
    are compared: those whose eager stayed under the floor (PyTorch's fixed cost per call decides
    there) are left out, as in the summary."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    levels = sorted({r["level"] for r in rows})
    fig, axes = plt.subplots(1, len(levels), figsize=(6 * len(levels), 4), squeeze=False)
    for ax, lv in zip(axes[0], levels, strict=True):
        for key, label in (("over_eager", "over PyTorch eager"), ("over_compile", "over torch.compile")):
            values = sorted(r[key] for r in rows if r["level"] == lv and r.get("correct") and r.get(key)
                            and not r.get("eager_under_floor"))
            if values:
                ax.plot(range(1, len(values) + 1), values, marker=".", label=f"{label} ({len(values)} problems)")
        ax.axhline(1.0, color="grey", lw=0.8)
        ax.set_yscale("log")
        ax.set_xlabel("problems, sorted")
        ax.set_ylabel("speedup of the search's best state")
        ax.set_title(f"KernelBench level {lv} (correct, eager at least the floor)")
        ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=120)


def read_rows(path: str) -> list[dict]:
    if not path or not Path(path).exists():
        return []
    with open(path) as f:
        return [json.loads(line) for line in f if line.strip()]


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("checkout", nargs="?", help="a KernelBench checkout (or a folder of KernelBench-style files)")
    ap.add_argument("--levels", nargs="*", type=int, default=[1, 2])
    ap.add_argument("--problems", type=parse_numbers, default=None, help="problem numbers, e.g. 1-10,23")
    ap.add_argument("--every", type=int, default=1, help="every N-th problem of each level (quick runs)")
    ap.add_argument("--budget", type=int, default=16, help="states verified per search (steptp search's default)")
    ap.add_argument("--driver", default="greedy", choices=["greedy", "beam", "mcts"],
                    help="search driver (steptp search's default)")
    ap.add_argument("--wall", type=float, default=300.0, help="wall seconds per search")
    ap.add_argument("--max-statements", type=int, default=MAX_STATEMENTS,
                    help="statement executions of the naive program at the size chosen")
    ap.add_argument("--eager-floor-us", type=float, default=EAGER_FLOOR_US,
                    help="a problem whose PyTorch eager takes less is reported but not compared (its fixed "
                         "cost per call decides)")
    ap.add_argument("--compile-modes", nargs="*", default=["default"],
                    help="torch.compile modes timed beside eager (default, max-autotune; none: eager only)")
    ap.add_argument("--min-run-time", type=float, default=0.5, help="seconds each PyTorch figure is timed")
    ap.add_argument("--prior", default=str(DEFAULT_PRIOR),
                    help="offline cost model the ranking starts from (skipped when the file is missing)")
    ap.add_argument("--timeout", type=float, default=900.0, help="wall seconds per problem's process")
    ap.add_argument("--memory-gb", type=float, default=8.0,
                    help="data memory each problem's process (and its workers) may allocate (0: no limit)")
    ap.add_argument("--out", default="", help="append each problem's row as a JSON line (a rerun skips those there)")
    ap.add_argument("--plot", default="", help="draw the speedups' distribution to this PNG")
    ap.add_argument("--summary", default="", help="only summarise (and --plot) the rows of this file")
    ap.add_argument("--one", default="", help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.every < 1 or args.budget < 1:
        ap.error("--every and --budget must be at least 1")
    if args.one:
        print(json.dumps(run_one(Path(args.one), args), default=str), flush=True)
        return 0
    if args.summary:
        rows = read_rows(args.summary)
        if not rows:
            ap.error(f"--summary: no rows in {args.summary}")
        print_summary(summary(rows))
        if args.plot:
            plot(rows, args.plot)
        return 0
    if not args.checkout or not Path(args.checkout).is_dir():
        ap.error("give a KernelBench checkout (a folder): the problem files are not shipped")
    files = selected(problem_files(Path(args.checkout), args.levels), args.problems, args.every)
    if not files:
        ap.error(f"no problem files under {args.checkout} for levels {args.levels}")
    rows = read_rows(args.out)
    done = {(r["level"], r["file"]) for r in rows}
    todo = [(lv, f) for lv, f in files if (lv, f.name) not in done]
    print(f"KernelBench: {len(files)} problems ({len(files) - len(todo)} already in {args.out or '-'}), budget "
          f"{args.budget} states, driver {args.driver}, at most {args.max_statements:,} naive statements; "
          f"CPU: {_cpu_name()}, {os.cpu_count()} logical cores", flush=True)
    t0 = time.perf_counter()
    for i, (lv, f) in enumerate(todo, start=1):
        row = in_own_process(lv, f, args)
        rows.append(row)
        if args.out:
            with open(args.out, "a") as fh:
                fh.write(json.dumps(row, default=str) + "\n")
        print(f"[{i}/{len(todo)}, {time.perf_counter() - t0:.0f} s] level {lv} {row['problem']}: " + _line(row),
              flush=True)
    rows = [r for r in rows if (r["level"], r["file"]) in {(lv, f.name) for lv, f in files}]
    print_summary(summary(rows))
    if args.plot:
        plot(rows, args.plot)
    return 0


def _line(row: dict) -> str:
    if row.get("error") and not row.get("best_us"):
        return f"FAILED ({row['error']})"

    def us(key):
        return f"{row[key]:.1f}" if row.get(key) else "-"
    ratio = f"; over eager {row['over_eager']:.2f}x" if row.get("over_eager") else ""
    ratio += f", over compile {row['over_compile']:.2f}x" if row.get("over_compile") else ""
    return (f"naive {us('naive_us')} µs, best {us('best_us')} µs ({row.get('speedup', 1):.1f}x, "
            f"{row.get('states')} states), eager {us('torch_eager_us')} µs, compile {us('torch_compile_best_us')} µs"
            f"{ratio}; {'correct' if row.get('correct') else 'NOT correct: ' + str(row.get('error'))} "
            f"({row.get('wall_s', 0):.0f} s)")


def _cpu_name() -> str:
    """The CPU's model name. Not gpu_tasks.fingerprint.cpu_model: that module imports TVM, and this
    process must hold no TVM threads while the problems' processes time."""
    try:
        with open("/proc/cpuinfo") as f:
            return next(line.split(":", 1)[1].strip() for line in f if line.startswith("model name"))
    except (OSError, StopIteration):
        return "unknown CPU"


if __name__ == "__main__":
    sys.exit(main())
