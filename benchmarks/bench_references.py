"""The search stage's PyTorch references, first time and re-time, on catalogue modules in one session:
`python benchmarks/bench_references.py [--families N] [--modes default max-autotune]`.

The stage (flows.search.references) times PyTorch eager and `torch.compile` on every searched program in
a fresh process, then re-times them in a second fresh process and refuses a figure that moved. This
benchmark runs that path (flows.search.torch_references) three times on the same modules: the first
time, the re-time as it was (both thread counts, 0.5 s each: the baseline) and the re-time at the
thread count each figure kept (RECHECK_RUN_TIME). It prints each process's wall time, the ratio of the
two re-times, and how many figures each re-time would refuse (ratio to the first time above
TORCH_RECHECK_LIMIT): a shorter re-time that refused more would be no gain.

The modules: per workload family (catalogue order), its first workload's release-profile instance 0 in
float32, as the stage's `by_family` choice takes one float32 program per family (its choice is the
one with the most work, which needs the lake; this one does not). `--families 0`: all 38 families.
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
from gpu_tasks.torch_timing import COMPILE_MODES, kept_threads  # noqa: E402
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


def refused(first: dict, again: dict) -> int:
    """Figures the re-time `again` refuses (gone, or moved by more than the stage's limit); a figure
    refused for its own spread is not counted: no re-time changes that."""
    moved = ("refused: re-timed", "refused: no re-time")
    return sum(str(checked.get(f"{p}_check")).startswith(moved)
               for pid, row in first.items() if isinstance(row, dict)
               for checked in [search.checked_references(row, again.get(pid, "not timed"))]
               for p in search.TORCH_PREFIXES)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--families", type=int, default=8, help="this many families (0: all 38); default 8")
    ap.add_argument("--modes", nargs="*", default=list(COMPILE_MODES), help="torch.compile modes (none: eager only)")
    args = ap.parse_args()
    params = load_params(profile="release")
    rows = programs(params, args.families)
    modes = tuple(args.modes)
    print(f"{len(rows)} modules, eager + torch.compile {', '.join(modes) or '(none)'}", flush=True)
    def timed(label: str, kept=None) -> tuple[dict, float]:
        start = time.perf_counter()
        found = search.torch_references(rows, params, modes, kept)
        wall = time.perf_counter() - start
        print(f"  {label}: {wall:.1f} s", flush=True)
        return found, wall

    first, first_s = timed("first")
    before, before_s = timed("re-time, both thread counts (before)")
    now, now_s = timed("re-time, the kept thread count (now)", kept_threads(first))
    compile_s = sum(r.get(k) or 0 for r in first.values() if isinstance(r, dict)
                    for k in ("torch_compile_s", "torch_compile_max_autotune_s"))
    figures = sum(1 for r in first.values() if isinstance(r, dict) for p in search.TORCH_PREFIXES if r.get(f"{p}_us"))
    print(f"first time: {first_s:.1f} s, of which compiling {compile_s:.1f} s; {figures} figures")
    print(f"re-time: {before_s:.1f} s before, {now_s:.1f} s now: {before_s / now_s:.2f}x faster")
    print(f"figures refused by the re-time (moved above {search.TORCH_RECHECK_LIMIT}x or gone): "
          f"{refused(first, before)} before, {refused(first, now)} now")
    print("per figure: µs first / re-time before / re-time now (threads kept); compile s first / before / now")
    for pid, row in first.items():
        if not isinstance(row, dict):
            continue
        for p in search.TORCH_PREFIXES:
            if row.get(f"{p}_us"):
                figures = [r.get(pid, {}) if isinstance(r.get(pid), dict) else {} for r in (before, now)]
                again = " / ".join(f"{f.get(f'{p}_us') or float('nan'):.1f}" for f in figures)
                built = " / ".join(f"{f.get(f'{p}_s') or float('nan'):.2f}" for f in (row, *figures))
                print(f"  {pid:40s} {p:28s} {row[f'{p}_us']:.1f} / {again} ({row[f'{p}_threads']})"
                      + (f"; {built}" if p != "torch_eager" else ""))
    failed = {pid: r for pid, r in first.items() if isinstance(r, str)}
    for pid, why in sorted(failed.items()):
        print(f"  no reference: {pid}: {why}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
