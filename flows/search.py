"""The search stage: the library policy's searches on a configured subset of the programs,
the `trajectories` table, the best trajectories as multi-step step records, and
reports/search.{json,png} with PyTorch eager and MetaSchedule reference times side by side.

- One task per workload family runs every configured driver on that family's selected programs: the
  profile's pinned programs (`programs: pinned`, shapes whose naive runtime matters), or the
  `programs_per_family` verified programs of each family with the most work (`by_family`), or both
  (`[pinned, by_family]`). Timings are measurements, so the task
  cache only helps a killed run resume; a fresh lake searches again.
- Trajectory steps (steps schema, parent_step_id/depth) are written to `lake/trajectory_steps/`, not
  into `lake/steps`: that folder is the transform stage's DVC output, and transform drops shards it
  did not write. The `trajectories` rows name those step ids.
- References: PyTorch eager and `torch.compile` (`torch_compile_modes`) on every searched program (the
  catalogue module, float32; `gpu_tasks/torch_timing.py`: one thread and every core, the faster kept,
  each in 3 windows, the fastest kept (eager figures take turns), with its runs and spread), timed
  first in a fresh process and again in up to TORCH_RECHECKS more at the end of the stage: the
  reference is the fastest figure, once a second process confirms it within TORCH_RECHECK_LIMIT; a
  figure whose spread is above TORCH_SPREAD_LIMIT or that no process confirms is refused (`*_check`),
  never compared or plotted; on the first `reference_programs`
  (in the profile's pinned order) MetaSchedule on the same function the search times: the TensorIR
  form of the original program tuned with `tune_tir` (`gpu_tasks/metaschedule.py`,
  `metaschedule_trials` trials; 0 skips it) and timed in one session with the naive program and the
  search's best state (`session_*`); with `metaschedule_relax`, also TVM's own path from the PyTorch
  module through Relax (`gpu_tasks/metaschedule_relax.py`, `metaschedule_relax_*`), as a second
  figure. 35-50 s and 35-130 s per program at 32 trials on 2 busy cores. Failures are reported with
  their reason, never hidden.
"""
from __future__ import annotations

import hashlib
import json
import statistics
import time
from pathlib import Path
from typing import TYPE_CHECKING

from prefect import flow
from prefect.task_runners import ThreadPoolTaskRunner

from flows.config import Params
from flows.keys import stable_id
from flows.storage import read_table
from flows.tasks import run_tasks, say, shard_task, stage_key, write_table
from flows.transform import PASSING, Origin, step_row

if TYPE_CHECKING:
    from leir.signature import Signature
    from search.drivers import SearchResult

DEFAULTS = {"drivers": ["chain", "greedy", "beam", "bfs", "dfs", "mcts"], "policy": "library", "programs": "by_family",
            "budget": 12,
            "wall_s": 300, "depth": 64, "branching": 4, "width": 2, "ucb_c": 1.4, "iterations": 24, "widen": 2,
            "time_macro_steps": False,
            "families": "all", "programs_per_family": 1, "seed": 0, "repeats": 5, "min_repeat_ms": 10,
            "reference_programs": 2, "metaschedule_trials": 32, "metaschedule_relax": True, "cost_model": True,
            "torch_compile_modes": ["default", "max-autotune"]}


def search_params(params: Params) -> dict:
    """params.yaml's `search` section, with the profile's own `search` entries on top."""
    return {**DEFAULTS, **(params.raw.get("search") or {}), **(params.profile.get("search") or {})}


def select_programs(programs: list[dict], cfg: dict) -> dict[str, list[dict]]:
    """Verified programs by family: the pinned ones in float32 (`programs: pinned`, the profile's
    programs whose runtime matters), or `programs_per_family` of each family among the `families`
    (`by_family`: float32 first where the family has one, the most work first (the `work` column), then
    by program_id), or both (a list `[pinned, by_family]`: the pinned ones, then the others)."""
    kinds = cfg["programs"] if isinstance(cfg["programs"], list) else [cfg["programs"]]
    if not kinds or any(k not in ("pinned", "by_family") for k in kinds):
        raise ValueError(f"search.programs must be `pinned`, `by_family` or a list of both, got {cfg['programs']!r}")
    out: dict[str, list[dict]] = {}
    verified = [p for p in sorted(programs, key=lambda p: p["program_id"]) if p["verification_status"] in PASSING]
    chosen: set[str] = set()
    if "pinned" in kinds:
        for p in verified:
            if p.get("shape_source") == "pinned" and p["dtype"] == "float32":
                out.setdefault(p["family"], []).append(p)
                chosen.add(p["program_id"])
    if "by_family" in kinds:
        per_family: dict[str, int] = {}
        for p in sorted(verified, key=lambda p: (p["dtype"] != "float32", -(p.get("work") or 0), p["program_id"])):
            if p["program_id"] in chosen or (cfg["families"] != "all" and p["family"] not in cfg["families"]):
                continue
            if p.get("shape_source") == "pinned" and "pinned" in kinds:
                continue
            if per_family.get(p["family"], 0) < int(cfg["programs_per_family"]):
                per_family[p["family"]] = per_family.get(p["family"], 0) + 1
                out.setdefault(p["family"], []).append(p)
    return dict(sorted(out.items()))


def search_programs(programs: list[dict], cfg: dict, target: str, prior_path: str | None = None,
                    checks: dict | None = None) -> dict:
    """Every driver on every program: trajectories rows, step rows, per-search summaries. `prior_path`:
    the offline cost model the searches start from (the cost_model stage's output), if any; `checks`
    (`grounding_settings`): the verify stage's protocol the searches verify with (and, with
    `extensions`, the LEIR extensions their states may use; all by default: a trajectory that uses one
    is released apart, flows.measured_configs), and the measure stage's rounds each program's
    trajectories are timed with."""
    from leir.signature import Signature
    from search.cost_model import PriorModel
    from search.drivers import Budget, DriverConfig
    from search.grounding import Grounding, ground
    from search.runner import Pools, SearchSettings, run_search

    prior = PriorModel.load(prior_path) if prior_path else None
    checks = checks or {}
    grounding = Grounding(**checks.get("grounding", {}))
    extensions = tuple(checks["extensions"]) if "extensions" in checks else None
    config = DriverConfig(int(cfg["depth"]), int(cfg["branching"]), int(cfg["width"]), float(cfg["ucb_c"]),
                          int(cfg["iterations"]), int(cfg["widen"]), bool(cfg["time_macro_steps"]))
    settings = SearchSettings(target=target, repeats=int(cfg["repeats"]), min_repeat_ms=int(cfg["min_repeat_ms"]),
                              draws=grounding.draws, verify_seed=grounding.seed, tolerances=grounding.tolerances)
    trajectories, steps, runs = [], {}, []
    with Pools() as pools:
        for p in programs:
            sig = Signature.from_json(p["signature"])
            results = []
            for driver in cfg["drivers"]:
                budget = Budget(int(cfg["budget"]), float(cfg["wall_s"]))
                results.append(run_search(p["leir"], sig, driver, cfg["policy"], budget, int(cfg["seed"]),
                                          config=config, settings=settings, pools=pools, as_result=True,
                                          policy_options={"ranked": bool(cfg["cost_model"]), "prior": prior},
                                          extensions=extensions))
            grounded = ground(p["leir"], p["signature"], [[n.text for n in r.trajectory] for r in results], grounding,
                              pools)
            for driver, result in zip(cfg["drivers"], results, strict=True):
                rows, row = trajectory_rows(result, p["program_id"], sig, pools.fingerprint(), grounded)
                trajectories.append(row)
                steps.update((r["step_id"], r) for r in rows)
                runs.append({"program_id": p["program_id"], "workload": p["workload"], "driver": driver,
                             "best_speedup": result.best.speedup, "strategies": result.strategies(),
                             "states_verified": result.states_verified, "wall_s": round(result.wall_s, 3),
                             "root_us": result.best.root_us, "grounded_speedup": row["best_speedup"]})
    return {"trajectories": trajectories, "steps": [steps[k] for k in sorted(steps)], "runs": runs}


def grounding_settings(params: Params) -> dict:
    """What the search stage checks its trajectories with (`search_programs`' `checks`)."""
    from flows.measure import measure_params

    m = measure_params(params)
    timing = {"min_rounds": int(m["min_rounds"]), "max_rounds": int(m["max_rounds"]),
              "target_spread": float(m["target_spread"]), "min_repeat_ms": int(m["min_repeat_ms"]),
              "max_measure_s": float(m["max_measure_s"])}
    v = params.verify
    return {"grounding": {"draws": int(v["draws"]), "seed": params.seed, "tolerances": v["tolerance"],
                          "target": v["target"], "timing": timing, "timeout_s": float(m["timeout_s"])}}


def trajectory_rows(result: SearchResult, program_id: str, signature: Signature, machine: dict | None = None,
                    grounded: dict | None = None) -> tuple[list[dict], dict]:
    """The best trajectory as multi-step `steps` rows (parent_step_id, depth) and its `trajectories`
    row: each state's verification against the original, its time and speedup over the root with an
    interval and each step's effect, as the grounding after the search measured them (`grounded`,
    `search.grounding.ground`); the search's own best speedup and states; the machine."""
    from search.grounding import trajectory_figures

    steps, parent = [], None
    for depth, node in enumerate(result.trajectory):
        row = step_row(node.action.transformation, Origin(program_id, parent, depth), signature)
        steps.append(row)
        parent = row["step_id"]
    step_ids = [s["step_id"] for s in steps]
    trajectory_id = stable_id("trajectory", program_id, result.driver, result.policy, result.seed, step_ids)
    row = {"trajectory_id": trajectory_id, "program_id": program_id, "driver": result.driver,
           "policy": result.policy, "seed": result.seed, "steps": json.dumps(step_ids),
           "search_speedup": float(result.best.speedup), "search_states": result.states_verified,
           "wall_s": round(result.wall_s, 3), "machine": json.dumps(machine, sort_keys=True) if machine else None}
    if grounded is not None:
        row.update(trajectory_figures(result.root.text, [n.text for n in result.trajectory], grounded,
                                      trajectory_id))
    else:  # the search's own figures (a caller that does not ground)
        row.update({"speedups": json.dumps([n.speedup for n in result.trajectory]),
                    "times_us": json.dumps([n.state_us for n in result.trajectory]), "best_speedup":
                    float(result.best.speedup), "root_us": result.best.root_us if result.trajectory else
                    result.root.root_us})
    return steps, row


@shard_task
def search_task(key: str, programs: list[dict], cfg: dict, target: str, prior_path: str | None = None,
                checks: dict | None = None) -> dict:
    return search_programs(programs, cfg, target, prior_path, checks)


def prior_model_path(lake: Path) -> Path | None:
    """The cost_model stage's model in `lake`, when there is one."""
    from flows.cost_model import MODEL_PATH

    path = Path(lake) / MODEL_PATH
    return path if path.exists() else None


# --- references: PyTorch eager and MetaSchedule ---------------------------------------------------

def _catalogue_module(p: dict, params: Params):
    """The PyTorch module and inputs a program was translated from (for the references)."""
    from dataclasses import replace

    from flows.generate import instances_of
    from workloads.registry import get_workload
    from workloads.sampling import build

    w = get_workload(p["workload"])
    shape = json.loads(p["shape_params"])
    pinned = p["shape_params"] if p.get("shape_source") == "pinned" else None
    for inst in instances_of(w, params, pinned):
        if inst.params == shape:
            return build(w, replace(inst, dtype=p["dtype"]))
    raise LookupError(f"no catalogue instance of {p['workload']} with {shape}")


def torch_references(programs: list[dict], params: Params, modes,
                     kept: dict[str, dict[str, int]] | None = None) -> dict[str, dict | str]:
    """{program_id: the PyTorch reference columns (gpu_tasks.torch_timing.reference_times: eager, then
    `torch.compile` in each of `modes`), or why there are none}, timed in a fresh process (spawned, one
    for all the programs) so that nothing the stage's process did before (searches, worker pools,
    tuning, the stages before it in one `steptp run`) is in the figure. In the release build's process,
    eager took 192 µs on the matmul 128^3 that `make run`'s process timed at 35 µs. `kept`: a re-time
    of those figures at the thread counts they kept (gpu_tasks.torch_timing.reference_rows)."""
    import multiprocessing
    from concurrent.futures import ProcessPoolExecutor

    from gpu_tasks.torch_timing import caching_malloc

    if not programs:
        return {}
    try:
        # the process keeps its freed blocks, as a caching allocator would (gpu_tasks/torch_timing.py)
        with caching_malloc(), ProcessPoolExecutor(max_workers=1,
                                                   mp_context=multiprocessing.get_context("spawn")) as pool:
            return pool.submit(_torch_times, programs, params, tuple(modes), kept).result()
    except Exception as e:  # the process itself failed (killed, out of memory): every row says so
        return {p["program_id"]: f"timing process: {_describe(e)}" for p in programs}


def _torch_times(programs: list[dict], params: Params, modes: tuple[str, ...],
                 kept: dict[str, dict[str, int]] | None = None) -> dict[str, dict | str]:
    from gpu_tasks.torch_timing import reference_rows

    out: dict[str, dict | str] = {}
    built = {}
    for p in programs:
        try:
            built[p["program_id"]] = _catalogue_module(p, params)
        except Exception as e:  # reported, never hidden
            out[p["program_id"]] = _describe(e)
    return {**out, **reference_rows(built, modes, kept=kept)}


# A PyTorch reference is refused (kept in the row with the reason, never plotted or compared) when its
# interquartile range exceeds this share of its median (not a measurement), or when no second fresh
# process comes within this factor of the fastest figure (a starved thread pool: hundreds of times
# off). On a noisy 2-core VM the blocks of a well-behaved 35 µs layernorm spread by 0.2-0.5 while its
# medians in two processes agreed within 10%.
TORCH_SPREAD_LIMIT = 0.5
TORCH_RECHECK_LIMIT = 1.3
# Re-times in fresh processes at the end of the stage, each of the figures not confirmed yet. One was
# not enough on a VM whose CPU runs at two speeds for seconds at a time: a default build's 10 s re-time
# fell in the slow one and refused 8 of 12 figures (1.34-1.71x) that the build before confirmed.
TORCH_RECHECKS = 3
TORCH_PREFIXES = ("torch_eager", "torch_compile", "torch_compile_max_autotune")


def fastest_confirmed(figures: list[float]) -> float | None:
    """The fastest of `figures` (one per process) when another is within TORCH_RECHECK_LIMIT of it,
    else None: a reference is the fastest PyTorch ran, reproduced; never a slower figure that happened
    to agree with a third (that would hand the search a handicapped baseline)."""
    fastest, *others = sorted(figures)
    return fastest if others and others[0] / fastest <= TORCH_RECHECK_LIMIT else None


def checked_references(first: dict, retimes: list[dict | str]) -> dict:
    """`first`'s columns with, per reference, the re-times (`*_recheck_us`, in the order they ran), the
    first time (`*_first_us`), the reference (`*_us`: the fastest figure of all the processes, when
    another confirms it within TORCH_RECHECK_LIMIT: fastest_confirmed) and the verdict (`*_check`:
    `ok`, or `refused: ...` with the figures that failed; a refused figure keeps its first time).
    `retimes`: each re-time process's columns, or why it has none."""
    row = dict(first)
    for prefix in TORCH_PREFIXES:
        us = first.get(f"{prefix}_us")
        if us is None:
            continue
        redone = [r[f"{prefix}_us"] for r in retimes if isinstance(r, dict) and r.get(f"{prefix}_us")]
        row[f"{prefix}_first_us"], row[f"{prefix}_recheck_us"] = us, redone
        spread = first.get(f"{prefix}_spread") or 0.0
        confirmed = fastest_confirmed([us, *redone])
        if spread > TORCH_SPREAD_LIMIT:
            row[f"{prefix}_check"] = f"refused: spread {spread:.2f} above {TORCH_SPREAD_LIMIT}"
        elif not redone:
            why = next((r for r in reversed(retimes) if isinstance(r, str)), "it failed")
            row[f"{prefix}_check"] = f"refused: no re-time ({why})"
        elif confirmed is None:
            row[f"{prefix}_check"] = (f"refused: re-timed {', '.join(f'{r:.1f}' for r in redone)} µs in "
                                      f"{len(redone)} fresh process{'es' if len(redone) > 1 else ''} against "
                                      f"{us:.1f} µs (none within {TORCH_RECHECK_LIMIT}x of the fastest)")
        else:
            row[f"{prefix}_us"], row[f"{prefix}_check"] = confirmed, "ok"
    return row


def recheck(timed: list[dict], first: dict[str, dict], params: Params, modes) -> dict[str, list[dict | str]]:
    """{program_id: its re-times}: the PyTorch figures of `timed` (first: their first times) again in
    up to TORCH_RECHECKS fresh processes, each at the thread count it kept, each process timing only
    the figures no process has confirmed yet (checked_references)."""
    from gpu_tasks.torch_timing import kept_threads

    retimes: dict[str, list[dict | str]] = {p["program_id"]: [] for p in timed}
    pending = kept_threads({p["program_id"]: first[p["program_id"]] for p in timed})
    start = time.perf_counter()
    for attempt in range(TORCH_RECHECKS):
        pending = {pid: threads for pid, threads in pending.items() if threads}
        if not pending:
            break
        figures = sum(map(len, pending.values()))
        say(f"search: {figures} PyTorch figures of {len(pending)} programs again, in fresh process "
            f"{attempt + 1} of at most {TORCH_RECHECKS}")
        again = torch_references([p for p in timed if p["program_id"] in pending], params, modes, pending)
        for pid in pending:
            retimes[pid].append(again.get(pid, "not timed"))
        checked = {pid: checked_references(first[pid], retimes[pid]) for pid in pending}
        pending = {pid: {prefix: t for prefix, t in threads.items()
                         if str(checked[pid].get(f"{prefix}_check")).startswith("refused: re-timed")}
                   for pid, threads in pending.items()}
    if timed:
        left = sum(map(len, pending.values()))
        say(f"search: PyTorch re-times: {time.perf_counter() - start:.1f} s in {max(map(len, retimes.values()))} "
            f"processes; {left} figure{'s' if left != 1 else ''} not confirmed")
    return retimes


def _pin_order(p: dict, params: Params) -> int:
    """Where a program stands in the profile's pinned list (references follow that order)."""
    for i, pin in enumerate(params.profile.get("pinned") or []):
        if pin["workload"] == p["workload"] and json.loads(p["shape_params"]) == pin["params"]:
            return i
    return len(params.profile.get("pinned") or [])


def best_states(results: dict) -> dict[str, str]:
    """{program_id: LEIR of the best state any driver reached}: a trajectory ends at its best state
    (its last step's after-state; the original when it has no step)."""
    best: dict[str, tuple[float, str]] = {}
    for r in results.values():
        after = {s["step_id"]: s["after_leir"] for s in r["steps"]}
        for t in sorted(r["trajectories"], key=lambda t: t["trajectory_id"]):
            ids = json.loads(t["steps"])
            if ids and t["best_speedup"] > best.get(t["program_id"], (0.0, ""))[0]:
                best[t["program_id"]] = (t["best_speedup"], after[ids[-1]])
    return {pid: leir for pid, (_, leir) in best.items()}


REFERENCE_KEYS = (*(f"{p}_{k}" for p in TORCH_PREFIXES for k in ("us", "threads", "runs", "number", "spread",
                                                                   "us_by_threads", "us_by_window", "faults_per_call",
                                                                   "first_us", "recheck_us", "check")),
                  "torch_compile_s", "torch_compile_max_autotune_s", "torch_process_threads", "torch_allocator",
                  "torch_errors",
                  "metaschedule_us", "session_naive_us", "session_best_us", "session_spread",
                  "session_threads",
                  "metaschedule_verification", "metaschedule_tuning_s", "metaschedule_relax_us",
                  "metaschedule_relax_vm_us", "metaschedule_relax_s")


def references(programs: list[dict], params: Params, cfg: dict, best: dict[str, str] | None = None) -> list[dict]:
    """PyTorch eager on every searched program; MetaSchedule's figures on the first `reference_programs`.
    `best` maps a program to the LEIR of the search's best state, timed in MetaSchedule's session. A
    part that fails leaves its figures null and says why in `error` (`part: Type: message; ...`)."""
    out = []
    trials = int(cfg["metaschedule_trials"])
    modes = tuple(cfg["torch_compile_modes"] or ())
    say(f"search: PyTorch references of {len(programs)} programs (eager"
        + "".join(f", torch.compile {m}" for m in modes) + ") in a fresh process")
    torch_refs = torch_references(programs, params, modes)  # first, and in a process of its own
    for i, p in enumerate(programs):
        row = {"program_id": p["program_id"], "workload": p["workload"], **dict.fromkeys(REFERENCE_KEYS),
               "metaschedule_trials": trials, "error": None}
        errors = []
        found = torch_refs[p["program_id"]]  # the reference columns, or why there are none
        if isinstance(found, dict):
            row.update(found)
            if found.get("torch_errors"):
                errors.append(f"torch.compile: {found['torch_errors']}")
        else:
            errors.append(f"eager: {found}")
        tuned = trials > 0 and i < int(cfg["reference_programs"])
        module = None
        if tuned and cfg["metaschedule_relax"]:
            try:
                module, inputs = _catalogue_module(p, params)
            except Exception as e:
                errors.append(f"relax: {_describe(e)}")
        if tuned:
            try:
                from gpu_tasks.metaschedule import tensorir_reference

                say(f"search: MetaSchedule reference for {p['workload']} (TensorIR, {trials} trials)")
                row.update(tensorir_reference(p["leir"], p["signature"], trials, best=(best or {}).get(p["program_id"]),
                                              repeats=int(cfg["repeats"]), min_repeat_ms=int(cfg["min_repeat_ms"])))
            except Exception as e:
                errors.append(f"tensorir: {_describe(e)}")
        if tuned and cfg["metaschedule_relax"] and module is not None:
            try:
                row.update(_relax_figures(module, inputs, trials, p["workload"]))
            except Exception as e:
                errors.append(f"relax: {_describe(e)}")
        row["error"] = "; ".join(errors) or None
        out.append(row)
    # the same references again in fresh processes, after the tuning, each at the thread count it kept:
    # a figure no second process confirms is refused (a starved thread pool, a neighbour), never plotted
    timed = [p for p in programs if isinstance(torch_refs[p["program_id"]], dict)]
    retimes = recheck(timed, {p["program_id"]: torch_refs[p["program_id"]] for p in timed}, params, modes)
    return [checked_references(row, retimes[row["program_id"]]) if row["program_id"] in retimes else row
            for row in out]


def _relax_figures(module, inputs, trials: int, workload: str) -> dict:
    from gpu_tasks.metaschedule_relax import metaschedule_times

    say(f"search: MetaSchedule reference for {workload} (Relax, {trials} trials)")
    start = time.perf_counter()
    relax = metaschedule_times(module, inputs, trials)
    return {"metaschedule_relax_us": relax["metaschedule_us"], "metaschedule_relax_vm_us": relax["metaschedule_vm_us"],
            "metaschedule_relax_s": round(time.perf_counter() - start, 1)}


def _describe(e: Exception) -> str:
    from gpu_tasks.torch_timing import describe

    return describe(e)


# --- report -----------------------------------------------------------------------------------------

def build_search_report(runs: list[dict], refs: list[dict], out: Path) -> dict:
    by_driver: dict[str, list[dict]] = {}
    for r in runs:
        by_driver.setdefault(r["driver"], []).append(r)
    drivers = {}
    for d, rs in by_driver.items():
        sp = [r["best_speedup"] for r in rs]
        drivers[d] = {"searches": len(rs), "mean_speedup": round(statistics.mean(sp), 4),
                      "median_speedup": round(statistics.median(sp), 4), "max_speedup": round(max(sp), 4),
                      "states_verified": sum(r["states_verified"] for r in rs),
                      "wall_s": round(sum(r["wall_s"] for r in rs), 2)}
    best_us = {}
    for r in runs:
        if r["root_us"]:
            us = r["root_us"] / r["best_speedup"]
            best_us[r["program_id"]] = min(best_us.get(r["program_id"], us), us)
    root_us = {r["program_id"]: r["root_us"] for r in runs if r["root_us"]}
    for ref in refs:
        pid = ref["program_id"]
        ref["naive_us"], ref["best_search_us"] = root_us.get(pid), best_us.get(pid)
        # > 1: the search's best state is faster than MetaSchedule's tuned TensorIR of the same program,
        # both timed in MetaSchedule's session (the search's own best time is from another session)
        best_now = ref.get("session_best_us") or ref.get("session_naive_us")
        if ref.get("metaschedule_us") and best_now:
            ref["search_speedup_over_metaschedule"] = round(ref["metaschedule_us"] / best_now, 4)
        if ref.get("metaschedule_us") and ref.get("session_naive_us"):
            ref["metaschedule_speedup_over_naive"] = round(ref["session_naive_us"] / ref["metaschedule_us"], 4)
        # > 1: the search's best state is faster than PyTorch (eager, compiled), checked references only;
        # the best state's time from MetaSchedule's session where there is one, else the search's own
        best_any = best_now or ref["best_search_us"]
        for prefix, name in zip(TORCH_PREFIXES, ("eager", "compile", "compile_max_autotune"), strict=True):
            if best_any and ref.get(f"{prefix}_check") == "ok":
                ref[f"search_speedup_over_{name}"] = round(ref[f"{prefix}_us"] / best_any, 4)
    report = {"drivers": drivers, "trajectories": [
        {k: r[k] for k in ("program_id", "workload", "driver", "best_speedup", "strategies", "states_verified")}
        for r in runs], "references": refs}
    out.mkdir(parents=True, exist_ok=True)
    (out / "search.json").write_text(json.dumps(report, indent=1, sort_keys=True) + "\n")
    _plot(drivers, refs, out / "search.png")
    return {d: v["median_speedup"] for d, v in drivers.items()}


def _plot(drivers: dict, refs: list[dict], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (a, b) = plt.subplots(1, 2, figsize=(11, 4))
    names = list(drivers)
    for i, key in enumerate(("mean_speedup", "median_speedup", "max_speedup")):
        a.bar([x + 0.27 * i for x in range(len(names))], [drivers[n][key] for n in names], 0.27, label=key)
    a.set_xticks([x + 0.27 for x in range(len(names))], names)
    a.set_ylabel("speedup over the naive original")
    a.legend()
    labels = [r["workload"] for r in refs]
    keys = ("session_naive_us", "session_best_us", "metaschedule_us", "metaschedule_relax_us", *TORCH_PREFIXES)
    names = ("naive (session)", "search best (session)", "MetaSchedule, TensorIR", "MetaSchedule, Relax kernels",
             "PyTorch eager", "torch.compile", "torch.compile max-autotune")
    width = 0.8 / len(keys)
    timed = False
    for i, (key, name) in enumerate(zip(keys, names, strict=True)):
        bars = [_plotted(r, key) for r in refs]
        timed = timed or any(v > 0 for v in bars)
        b.bar([x + width * i for x in range(len(refs))], bars, width, label=name)
    b.set_xticks([x + 0.4 - width / 2 for x in range(len(refs))], labels)
    if timed:
        b.set_yscale("log")
    else:  # every reference refused (a noisy machine) or absent: say so, not an empty log axis
        b.text(0.5, 0.5, "no reference timed", ha="center", va="center", transform=b.transAxes)
    b.set_ylabel("µs per run")
    b.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=100, metadata={"Software": None})
    plt.close(fig)


def _plotted(ref: dict, key: str) -> float:
    """The bar of a reference: its µs, or nothing for a PyTorch figure its check refused."""
    if key in TORCH_PREFIXES:
        return ref.get(f"{key}_us") or 0 if ref.get(f"{key}_check") == "ok" else 0
    return ref.get(key) or 0


@flow(name="search", task_runner=ThreadPoolTaskRunner(max_workers=1))
def search_flow(raw: dict, profile: str, lake: str, reports: str) -> dict:
    params, lake = Params(raw, profile), Path(lake)
    cfg = search_params(params)
    families = select_programs(read_table(lake, "programs").to_pylist(), cfg)
    target = params.verify["target"]
    prior = prior_model_path(lake)
    prior_hash = hashlib.sha256(prior.read_bytes()).hexdigest() if prior else None
    checks = grounding_settings(params)
    calls = [(f, search_task, (stage_key("search", params, lake, rows, cfg, prior_hash, checks), rows, cfg, target,
                               str(prior) if prior else None, checks))
             for f, rows in families.items()]
    results = run_tasks("search: drivers x programs", calls)
    n = write_table(lake, "trajectories", {f: r["trajectories"] for f, r in results.items()})
    write_table(lake, "trajectory_steps", {f: r["steps"] for f, r in results.items()})
    runs = [run for f in sorted(results) for run in results[f]["runs"]]
    chosen = sorted((p for f in sorted(families) for p in families[f]), key=lambda p: _pin_order(p, params))
    n_refs = min(len(chosen), int(cfg["reference_programs"]))
    say(f"search: {len(runs)} searches; MetaSchedule references on {n_refs} programs")
    medians = build_search_report(runs, references(chosen, params, cfg, best_states(results)), Path(reports))
    return {"stage": "search", "shards": len(calls), "rows": n, "median_speedup": medians}

