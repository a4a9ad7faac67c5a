"""Search drivers against TVM's MetaSchedule and PyTorch eager.

For each program (a PyTorch module translated to LEIR; the set by default: matmul 128^3 and
256^3, conv2d 1x64x56x56 -> 64 3x3, layernorm 64x768, softmax 64x512, one attention block) in each
`--forms` form (`B`: the published form the translator emits, a bound thread loop outermost, serial
on the CPU; `L`: the same program with every bound loop a serial `L` loop): the library policy ranked
by the cost model (the offline model learned from the lake, `--prior`, with the program's own
analysis; `--no-model`: the policy's own order) with each driver and `--budget` verified states per
search (speedup = naive time / best state time, both measured in the same session by our timing
protocol), then:

- MetaSchedule on the TensorIR (the reference): the TensorIR form of the original LEIR program tuned
  with `tune_tir` and `--trials` trials (`gpu_tasks/metaschedule.py`) once per program and per
  `--ms-seeds` seed (both forms lower to the same function on the CPU), checked against the program,
  and timed in one session per form and tuning with that form's naive program and its searches' best
  state (the same protocol); with several seeds the strongest tuning is the reference;
- PyTorch eager and `torch.compile` (`--compile-modes`: the default mode and max-autotune) on the
  module (`gpu_tasks/torch_timing.py`: torch.utils.benchmark with one thread and with every core, the
  faster kept; compiled with one compile thread, checked against eager, compile time reported), all
  timed first, before any worker process exists, in a process that keeps its freed memory as a
  caching allocator would (the benchmark restarts itself with `CACHING_MALLOC_ENV`);
- `--relax`: TVM's own path from the PyTorch module through Relax (second figure, slow).

Baselines named: MetaSchedule's tuned TensorIR (ratio MS / best > 1: the search beat it), PyTorch
eager (eager / best) and torch.compile (compile / best, the faster of its modes). The last lines are a
markdown table (the one in benchmarks/RESULTS.md). Slow: each MetaSchedule run takes one to a few minutes per
program on 2 cores, each search of 64 states 20-60 s (conv2d several minutes: its naive time is large).
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

import torch  # noqa: E402

from search.drivers import DriverConfig  # noqa: E402


class Matmul(torch.nn.Module):
    def forward(self, a, b):
        return a @ b


class Softmax(torch.nn.Module):
    def forward(self, x):
        return torch.softmax(x, dim=-1)


class LinearRelu(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.fc = torch.nn.Linear(128, 64)

    def forward(self, x):
        return torch.relu(self.fc(x))


class Attention(torch.nn.Module):
    """One attention block: softmax(Q K^T / sqrt(d)) V, one head."""

    def forward(self, q, k, v):
        return torch.softmax(q @ k.transpose(0, 1) / 8.0, dim=-1) @ v


def programs() -> dict[str, tuple[torch.nn.Module, list[torch.Tensor]]]:
    g = torch.Generator().manual_seed(0)
    torch.manual_seed(0)

    def randn(*shape):
        return torch.randn(*shape, generator=g)
    return {"matmul_128": (Matmul(), [randn(128, 128), randn(128, 128)]),
            "matmul_256": (Matmul(), [randn(256, 256), randn(256, 256)]),
            "conv2d_64x56": (torch.nn.Conv2d(64, 64, 3, padding=1, bias=False).eval(), [randn(1, 64, 56, 56)]),
            "layernorm_64x768": (torch.nn.LayerNorm(768).eval(), [randn(64, 768)]),
            "softmax_64x512": (Softmax(), [randn(64, 512)]),
            "attention_128x64": (Attention(), [randn(128, 64), randn(128, 64), randn(128, 64)]),
            "linear_relu_64x128x64": (LinearRelu().eval(), [randn(64, 128)])}


# nominal float multiply-adds of the compute-bound programs (conv2d: every output element's 64 x 3 x 3
# products, the padding's included): against the measured FMA peak (benchmarks/fma_peak.py)
MULTIPLY_ADDS = {"matmul_128": 128 ** 3, "matmul_256": 256 ** 3, "conv2d_64x56": 64 * 64 * 9 * 56 * 56,
                 "linear_relu_64x128x64": 64 * 128 * 64}

ISSUE_14 = ["matmul_128", "matmul_256", "conv2d_64x56", "layernorm_64x768", "softmax_64x512", "attention_128x64"]


def serial_form(program):
    """`program` with every bound (`B`) loop a serial `L` loop under a fresh index name (the L-form): a
    tree rewrite, the same computation."""
    from leir.ast import Loop, Nest, Program, Var, map_stmt
    from strategies.analysis.tree import fresh_indices

    names = fresh_indices(program)

    def visit(nest, mapping):
        loops = []
        for lp in nest.loops:
            if lp.kind == "B":
                mapping = {**mapping, lp.var: names.fresh()}
                lp = Loop("L", lp.extent, mapping[lp.var], lp.start)
            loops.append(lp)
        body = tuple(visit(i, mapping) if isinstance(i, Nest) else
                     map_stmt(i, lambda n: Var(mapping[n.name]) if isinstance(n, Var) and n.name in mapping else n)
                     for i in nest.body)
        return Nest(tuple(loops), body)
    return Program(tuple(visit(n, {}) for n in program.nests))


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--programs", nargs="*", default=ISSUE_14, help=f"some of {', '.join(programs())}")
    ap.add_argument("--drivers", nargs="*", default=["greedy", "beam", "mcts"])
    ap.add_argument("--budget", type=int, default=64, help="states verified per search")
    ap.add_argument("--depth", type=int, default=DriverConfig().depth,
                    help="longest trajectory in atomic steps (the command's default)")
    ap.add_argument("--trials", type=int, default=64, help="MetaSchedule trials per program (each path)")
    ap.add_argument("--ms-seeds", nargs="*", type=int, default=[0],
                    help="MetaSchedule tuned once per seed; the reference is the tuning that times fastest "
                         "against the search's best state (on layernorm 64x768 one tuning found 10 us, "
                         "another 18 us)")
    ap.add_argument("--compile-modes", nargs="*", default=["default", "max-autotune"],
                    help="torch.compile modes timed beside eager (none: eager only)")
    ap.add_argument("--no-model", action="store_true", help="the library policy's own order (no cost model)")
    ap.add_argument("--forms", nargs="*", default=["L", "B"], choices=["L", "B"],
                    help="program forms searched: L (serial loops), B (the published bound thread loop)")
    ap.add_argument("--prior", default=str(ROOT / "lake" / "cost_model" / "model.json"),
                    help="the offline cost model the ranking starts from (skipped when the file is missing)")
    ap.add_argument("--relax", action="store_true", help="also the Relax reference (slow)")
    ap.add_argument("--json", action="store_true")
    ap.add_argument("--out", default="", help="append each program's row as a JSON line to this file")
    ap.add_argument("--table", default="", help="only print the markdown table of the rows in this --out file")
    args = ap.parse_args()
    if args.table:
        print(table_from_rows(args.table, args.drivers))
        return 0
    from gpu_tasks.torch_timing import CACHING_MALLOC_ENV, allocator

    if allocator() == "glibc default":  # glibc reads it at start-up: this process starts again with it
        os.execve(sys.executable, [sys.executable, *sys.argv], {**os.environ, **CACHING_MALLOC_ENV})

    from fma_peak import measure_gmacs

    from gpu_tasks.metaschedule import time_against_tuned, tune_primfunc
    from gpu_tasks.threads import logical_cpus, tvm_threads_here
    from gpu_tasks.torch_timing import reference_rows
    from leir.frontend import translate
    from leir.lower import lower_to_primfunc
    from search.cost_model import PriorModel
    from search.runner import Pools

    prior = PriorModel.load(args.prior) if not args.no_model and Path(args.prior).exists() else None
    options = {"ranked": not args.no_model, "prior": prior, "per_strategy": 40, "per_site": 8}
    config = DriverConfig(depth=args.depth, branching=4, width=2, iterations=args.budget * 2)
    rows = []
    # the FMA peak first, in its own process on every core: the ceiling of the matmuls and conv2d
    peak = measure_gmacs(logical_cpus()) if any(n in MULTIPLY_ADDS for n in args.programs) else None
    if peak:
        print(f"float32 multiply-add peak (benchmarks/fma_peak.py, {logical_cpus()} threads): {peak:.1f} G/s",
              flush=True)
    # PyTorch eager next, before any worker process exists: timed after a search, with its pools
    # alive, conv2d's eager once took 12.8 ms against 1.6 ms alone (2026-12-02)
    catalogue = programs()
    eager = reference_rows({name: catalogue[name] for name in args.programs}, args.compile_modes)
    tvm_threads_here(logical_cpus())  # before any kernel runs here: MetaSchedule's runners inherit it
    with Pools() as pools:
        for name in args.programs:
            module, inputs = catalogue[name]
            tr = translate(module, inputs)
            forms = {"B": tr.program, "L": serial_form(tr.program)}
            searched = {}
            for form in args.forms:
                searched[form] = search_form(forms[form], tr.signature, args, config, pools, options)
            torch_row = eager[name]
            if isinstance(torch_row, str):
                raise SystemExit(f"bench_search: {name}: the PyTorch reference failed: {torch_row}")
            by_threads = torch_row["torch_eager_us_by_threads"]
            eager_all, eager_1t = by_threads[max(by_threads, key=int)], by_threads["1"]
            compiled = [torch_row[k] for k in ("torch_compile_us", "torch_compile_max_autotune_us") if torch_row.get(k)]
            t0 = time.perf_counter()
            tunings = [tune_primfunc(lower_to_primfunc(tr.program, tr.signature, "llvm", form="tensorir"),
                                     args.trials, seed) for seed in args.ms_seeds]
            tuning_s = (time.perf_counter() - t0) / len(tunings)
            for form, found in searched.items():
                best = found["best_leir"] if found["best_speedup"] > 1.0 else None
                sessions = [time_against_tuned(forms[form], tr.signature, tuned, best=best) for tuned in tunings]
                times = max(sessions, key=lambda t: (t.best_us or t.naive_us) / t.tuned_us)   # the strongest tuning
                best_now = times.best_us or times.naive_us
                row = {"program": name, "form": form, "budget": args.budget, "trials": args.trials,
                       "policy": "library+model" if options["ranked"] else "library",
                       "prior": bool(prior), **found, "torch_eager_all_us": eager_all, "torch_eager_1t_us": eager_1t,
                       **torch_row, "torch_compile_best_us": min(compiled, default=None),
                       "metaschedule_us": times.tuned_us,
                       "session_naive_us": times.naive_us, "session_best_us": times.best_us,
                       "session_spread": times.spread, "session_threads": times.threads,
                       "metaschedule_verification": times.verification, "metaschedule_tuning_s": round(tuning_s, 1),
                       "metaschedule_seeds": args.ms_seeds,
                       "metaschedule_over_best_search_per_seed": [t.tuned_us / (t.best_us or t.naive_us)
                                                                  for t in sessions],
                       "metaschedule_over_best_search": times.tuned_us / best_now,
                       "metaschedule_over_naive": times.tuned_us / times.naive_us,
                       "eager_over_best_search": torch_row["torch_eager_us"] / best_now,
                       "compile_over_best_search": min(compiled) / best_now if compiled else None,
                       **peak_shares(name, peak, best_now, times.tuned_us, found["best_search_us"])}
                if args.relax and form == args.forms[-1]:
                    from gpu_tasks.metaschedule_relax import metaschedule_times

                    relax = metaschedule_times(module, inputs, args.trials)
                    row.update(metaschedule_relax_us=relax["metaschedule_us"],
                               metaschedule_relax_vm_us=relax["metaschedule_vm_us"])
                rows.append(row)
                if args.out:
                    with open(args.out, "a") as f:
                        f.write(json.dumps(row, default=str) + "\n")
                if not args.json:
                    print_row(row, args.trials)
    if args.json:
        print(json.dumps(rows, indent=1, default=str))
    else:
        print(markdown_table(rows, args.drivers))
    return 0


def peak_shares(name: str, peak_gmacs: float | None, best_us: float, tuned_us: float,
                own_best_us: float | None) -> dict:
    """The share of the measured FMA peak that the search's best state (in MetaSchedule's session and in
    its own) and MetaSchedule's kernel reach, for the programs with a known multiply-add count."""
    macs = MULTIPLY_ADDS.get(name)
    if not macs or not peak_gmacs:
        return {}

    def share(us):
        return round(macs / (us * 1e3) / peak_gmacs, 3) if us else None
    return {"fma_peak_gmacs": peak_gmacs, "multiply_adds": macs, "best_peak_share": share(best_us),
            "own_best_peak_share": share(own_best_us), "metaschedule_peak_share": share(tuned_us)}


def search_form(program, signature, args, config, pools, options) -> dict:
    """Every driver's search on one form of a program: per driver its best state's time in its own
    session, speedup, states, trajectory and wall and CPU time (this process and its workers)."""
    import resource

    from search.drivers import Budget
    from search.runner import run_search

    out = {"drivers": {}}
    best_leir, best_speedup = None, 0.0
    for driver in args.drivers:
        t0, c0 = time.perf_counter(), _cpu_s(resource)
        r = run_search(program, signature, driver, "library", Budget(args.budget, 3600.0), 0,
                       config=config, pools=pools, as_result=True, policy_options=dict(options))
        out["drivers"][driver] = {"speedup": round(r.best.speedup, 3), "naive_us": r.best.root_us,
                                  "best_us": r.best.root_us / r.best.speedup if r.best.root_us else None,
                                  "states": r.states_verified, "strategies": r.strategies(),
                                  "wall_s": round(time.perf_counter() - t0, 1),
                                  "cpu_s": round(_cpu_s(resource) - c0, 1)}
        if r.best.speedup > best_speedup:
            best_leir, best_speedup = r.best.text, r.best.speedup
    timed = [d for d in out["drivers"].values() if d["naive_us"]]
    out["naive_us"] = statistics.median(d["naive_us"] for d in timed) if timed else None
    out["best_search_us"] = min(d["best_us"] for d in timed) if timed else None
    out["best_leir"], out["best_speedup"] = best_leir, best_speedup
    return out


def _cpu_s(resource) -> float:
    """CPU seconds of this process so far (the pools' workers are long-lived: their time is not in it)."""
    me = resource.getrusage(resource.RUSAGE_SELF)
    return me.ru_utime + me.ru_stime


def markdown_table(rows: list[dict], drivers: list[str]) -> str:
    """The table of benchmarks/RESULTS.md: per driver the best state's time in its own session (speedup), then the
    same-session times (best state, MetaSchedule), PyTorch eager on one thread and on every core, and
    the ratios (> 1: the search is faster)."""
    head = ("| program | form | naive µs | " + " | ".join(f"{d} µs" for d in drivers)
            + " | MetaSchedule-64 µs | search best, same session µs | PyTorch eager µs (1 thread / all cores)"
            " | torch.compile µs (default / max-autotune) | MS / best | eager / best | compile / best"
            " | share of FMA peak: best, own session / MS |")
    lines = [head, "|" + " --- |" * (head.count("|") - 1)]
    for r in rows:
        per = " | ".join(f"{r['drivers'][d]['best_us']:.1f} ({r['drivers'][d]['speedup']:.0f}x)"
                         if r["drivers"].get(d, {}).get("best_us") else "-" for d in drivers)
        own = min((v["best_us"] for v in r["drivers"].values() if v.get("best_us")), default=None)
        best = r["session_best_us"] or r["session_naive_us"]
        eager = r["torch_eager_us"]
        lines.append(f"| {r['program']} | {r.get('form', 'B')} | {r['session_naive_us']:.0f} | {per} "
                     f"| {r['metaschedule_us']:.1f} "
                     f"| {best:.1f} | {r['torch_eager_1t_us']:.1f} / {r['torch_eager_all_us']:.1f} "
                     f"| {_us(r.get('torch_compile_us'))} / {_us(r.get('torch_compile_max_autotune_us'))} "
                     f"| {r['metaschedule_over_best_search']:.2f} | {eager / best:.2f}"
                     + (f" (own session {eager / own:.2f})" if own else "")
                     + (f" | {r['torch_compile_best_us'] / best:.2f} |" if r.get("torch_compile_best_us") else " | - |")
                     + (f" {r['best_peak_share']:.0%}, {r['own_best_peak_share']:.0%}"
                        f" / {r['metaschedule_peak_share']:.0%} |" if r.get("fma_peak_gmacs") else " - |"))
    return "\n".join(lines)


def _us(value) -> str:
    return f"{value:.1f}" if value else "-"


def table_from_rows(path: str, drivers: list[str]) -> str:
    """The markdown table of rows a run appended with --out (one JSON line per program)."""
    with open(path) as f:
        return markdown_table([json.loads(line) for line in f if line.strip()], drivers)


def print_row(row: dict, trials: int) -> None:
    speedups = ", ".join(f"{d} {v['speedup']:.2f}x" for d, v in row["drivers"].items())
    print(f"{row['program']} ({row.get('form', 'B')}-form): search speedup over naive ({row['policy']}, "
          f"{row['budget']} states each): {speedups}; "
          f"best {row['best_search_us']:.1f} us; PyTorch eager {row['torch_eager_us']:.1f} us; torch.compile "
          f"{_us(row.get('torch_compile_us'))} us (default, {row.get('torch_compile_s') or 0:.0f} s to compile) / "
          f"{_us(row.get('torch_compile_max_autotune_us'))} us (max-autotune, "
          f"{row.get('torch_compile_max_autotune_s') or 0:.0f} s)"
          + (f"; {row['torch_errors']}" if row.get("torch_errors") else ""), flush=True)
    for d, v in row["drivers"].items():
        print(f"  {d}: {' -> '.join(v['strategies'])} ({v['states']} states, {v['wall_s']:.0f} s)", flush=True)
    best = row["session_best_us"] if row["session_best_us"] is not None else row["session_naive_us"]
    print(f"  MetaSchedule on the TensorIR ({trials} trials, {row['metaschedule_tuning_s']:.0f} s tuning): "
          f"{row['metaschedule_us']:.1f} us; same session: naive "
          f"{row['session_naive_us']:.1f} us, search best {best:.1f} us (spread {row['session_spread']:.2f}); "
          f"ratio MetaSchedule/best search {row['metaschedule_over_best_search']:.3f} "
          f"(naive: {row['metaschedule_over_naive']:.4f})", flush=True)
    if row.get("fma_peak_gmacs"):
        print(f"  share of the FMA peak ({row['fma_peak_gmacs']:.0f} G multiply-adds/s): search best "
              f"{row['best_peak_share']:.0%} in MetaSchedule's session, {row['own_best_peak_share']:.0%} in its own; "
              f"MetaSchedule {row['metaschedule_peak_share']:.0%}", flush=True)
    per_seed = row.get("metaschedule_over_best_search_per_seed", [])
    if len(per_seed) > 1:
        print(f"  MetaSchedule seeds {row['metaschedule_seeds']}: ratio per tuning "
              f"{', '.join(f'{r:.3f}' for r in per_seed)} (the lowest is the reference)", flush=True)
    if "metaschedule_relax_us" in row:
        print(f"  MetaSchedule through Relax ({trials} trials): "
              f"{row['metaschedule_relax_us']:.1f} us per kernel sum, {row['metaschedule_relax_vm_us']:.1f} us "
              f"via VM; Relax/TensorIR {row['metaschedule_relax_us'] / row['metaschedule_us']:.2f}", flush=True)


if __name__ == "__main__":
    sys.exit(main())
