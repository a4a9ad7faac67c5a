"""The search stage's PyTorch references, first time and re-time, in one session:
`python benchmarks/bench_references.py [--families N] [--lake PATH] [--modes default max-autotune]
[--full-re-time]`.

The stage (flows.search.references) times PyTorch eager and `torch.compile` on every searched program in
a fresh process, then re-times them in up to TORCH_RECHECKS more fresh processes at the thread count
each figure kept (RECHECK_RUN_TIME), each process only the figures not confirmed yet, and refuses a
figure no second process confirms within TORCH_RECHECK_LIMIT (flows.search.recheck). This benchmark
runs that path on the same modules: the first time and the re-times, and with `--full-re-time` one
more process that times everything again as the first did (both thread counts, 0.5 s each: the
re-time before it was shortened). It prints each process's wall time, how many figures one re-time
would refuse (the stage before TORCH_RECHECKS) and how many the stage refuses, and each figure's
window medians (the fastest is kept; eager figures take turns window by window): on a shared VM they
show the host's speeds.

The modules: per workload family (catalogue order), its first workload's release-profile instance 0 in
float32, as the stage's `by_family` choice takes one float32 program per family (its choice is the
one with the most work, which needs the lake; this one does not). `--families 0`: all 38 families.
`--lake PATH`: the programs the search stage of the build with that lake chooses, in its order (the
release profile's: 42 programs).
"""
from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from flows import search  # noqa: E402
from flows.config import load_params  # noqa: E402
from gpu_tasks.torch_timing import COMPILE_MODES  # noqa: E402
from workloads.registry import all_workloads  # noqa: E402
from workloads.sampling import sample_instance  # noqa: E402


def programs(params, families: int) -> list[dict]:
    """One program row per family (the fields flows.search.torch_references reads)."""
    seen, out = set(), []
    for w in all_workloads():
        if w.family in seen or "float32" not in w.dtypes:
            continue
        seen.add(w.family)
        inst = sample_instance(w, params.seed, 0, params.profile["workload_profile"])
        out.append({"program_id": f"{w.family}/{w.name}", "workload": w.name, "dtype": "float32",
                    "shape_params": json.dumps(inst.params), "shape_source": inst.shape_source})
    return out[:families] if families else out


def lake_programs(params, lake: str, families: int) -> list[dict]:
    """The programs the search stage chooses in `lake`, in the order it times them."""
    from flows.storage import read_table

    chosen = search.select_programs(read_table(Path(lake), "programs").to_pylist(), search.search_params(params))
    rows = sorted((p for f in sorted(chosen) for p in chosen[f]), key=lambda p: search._pin_order(p, params))
    return rows[:families] if families else rows


def refused(first: dict, retimes: dict[str, list]) -> int:
    """Figures the re-times refuse (gone, or not confirmed within the stage's limit); a figure refused
    for its own spread is not counted: no re-time changes that."""
    moved = ("refused: re-timed", "refused: no re-time")
    return sum(str(checked.get(f"{p}_check")).startswith(moved)
               for pid, row in first.items() if isinstance(row, dict)
               for checked in [search.checked_references(row, retimes.get(pid) or ["not timed"])]
               for p in search.TORCH_PREFIXES)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--families", type=int, default=8,
                    help="this many families, or of --lake's programs (0: all); default 8")
    ap.add_argument("--lake", help="a built lake: time the programs its search stage chooses")
    ap.add_argument("--full-re-time", action="store_true",
                    help="one more process that times everything as the first did (the baseline)")
    ap.add_argument("--modes", nargs="*", default=list(COMPILE_MODES), help="torch.compile modes (none: eager only)")
    args = ap.parse_args()
    params = load_params(profile="release")
    rows = lake_programs(params, args.lake, args.families) if args.lake else programs(params, args.families)
    modes = tuple(args.modes)
    print(f"{len(rows)} modules, eager + torch.compile {', '.join(modes) or '(none)'}", flush=True)
    def timed(label: str) -> tuple[dict, float]:
        start = time.perf_counter()
        found = search.torch_references(rows, params, modes)
        wall = time.perf_counter() - start
        print(f"  {label}: {wall:.1f} s", flush=True)
        return found, wall

    first, first_s = timed("first")
    timed_rows = [r for r in rows if isinstance(first.get(r["program_id"]), dict)]
    start = time.perf_counter()
    retimes = search.recheck(timed_rows, first, params, modes)
    now_s = time.perf_counter() - start
    processes = max(map(len, retimes.values()), default=0)
    print(f"  re-times, the kept thread count (the stage's): {now_s:.1f} s in {processes} processes", flush=True)
    full, full_s = timed("re-time, both thread counts (--full-re-time)") if args.full_re_time else ({}, 0.0)
    compile_s = sum(r.get(k) or 0 for r in first.values() if isinstance(r, dict)
                    for k in ("torch_compile_s", "torch_compile_max_autotune_s"))
    figures = sum(1 for r in first.values() if isinstance(r, dict) for p in search.TORCH_PREFIXES if r.get(f"{p}_us"))
    print(f"first time: {first_s:.1f} s, of which compiling {compile_s:.1f} s; {figures} figures")
    print(f"re-times: {now_s:.1f} s" + (f"; the full re-time {full_s:.1f} s" if full else ""))
    print(f"figures refused (no two processes within {search.TORCH_RECHECK_LIMIT}x, or gone): by the first re-time "
          f"alone {refused(first, {pid: r[:1] for pid, r in retimes.items()})}, by the stage's "
          f"{search.TORCH_RECHECKS} {refused(first, retimes)}"
          + (f"; by the full re-time {refused(first, {pid: [r] for pid, r in full.items()})}" if full else ""))
    print("per figure: µs first / re-times [| full re-time] (threads kept) -> the reference or refused; "
          "compile s first / re-times")
    for pid, row in first.items():
        if not isinstance(row, dict):
            continue
        checked = search.checked_references(row, retimes.get(pid) or ["not timed"])
        for p in search.TORCH_PREFIXES:
            if row.get(f"{p}_us"):
                again = [r for r in retimes.get(pid, []) if isinstance(r, dict) and r.get(f"{p}_us")]
                extra = [full[pid]] if isinstance(full.get(pid), dict) else []
                figs = " / ".join(f"{f[f'{p}_us']:.1f}" for f in (row, *again))
                figs += "".join(f" | {f.get(f'{p}_us') or float('nan'):.1f}" for f in extra)
                verdict = f"{checked[f'{p}_us']:.1f}" if checked.get(f"{p}_check") == "ok" else "refused"
                built = " / ".join(f"{f.get(f'{p}_s') or float('nan'):.2f}" for f in (row, *again))
                print(f"  {pid:40s} {p:28s} {figs} ({row[f'{p}_threads']}) -> {verdict}"
                      + (f"; {built}" if p != "torch_eager" else ""))
                print(" " * 44 + "windows: " + " / ".join(
                    " ".join(f"{w:.1f}" for w in f.get(f"{p}_us_by_window") or []) for f in (row, *again, *extra)))
    failed = {pid: r for pid, r in first.items() if isinstance(r, str)}
    for pid, why in sorted(failed.items()):
        print(f"  no reference: {pid}: {why}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
