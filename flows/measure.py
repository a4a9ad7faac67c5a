"""The measure stage (issue 24): every program state the release refers to, timed once per machine.

The states are the originals of the released steps and the before and after state of every
released step (a state is its `program_id`: canonical LEIR plus signature, so a state that several
steps share is timed once). One timing job per original program measures all of that program's
states in one interleaved session (`gpu_tasks.state_timing`): builds on every core first, then,
holding the machine's timing lock, rounds over the states until each one's spread is small enough.
By default (`measure.unit: nest`) a state is timed as the sum of its top-level nests, each distinct
nest of the program compiled and timed once (`gpu_tasks.nest_timing`): at release scale the states
of a program share most of their nests, and compiling every whole state did not fit the build's budget.

Timings are measurements, not deterministic data: they live in the `timings` table, one row per
(state, target, machine), beside the deterministic tables and never read by the stages that write
those. A state that this machine has already timed is not timed again (`make run` after an edit
times only the new states; a killed run resumes), and each family's rows are written as soon as its
programs are done, in the shard `<machine id>-<family>`.

Read back, the table gives each released step's effect: the ratio of its before-state's and
after-state's times on one machine (`gpu_tasks.effect`: `faster` / `neutral` / `slower` against the
measured spread). The machine is the one that timed most of the release's states (ties: the smaller
fingerprint id), so that every figure of a release comes from one machine, which the card names.
Those effects go to the release's `measured` and `preference` configs, the card, and the cost
model's training set; no deterministic stage reads them.
"""
from __future__ import annotations

import json
import time
from collections import Counter as Tally
from dataclasses import dataclass, field
from pathlib import Path

from flows.prefect_env import configure

configure()

from prefect import flow  # noqa: E402

from flows.config import Params  # noqa: E402
from flows.keys import stable_id  # noqa: E402
from flows.storage import read_table, released_step_rows, write_shard  # noqa: E402
from flows.tasks import StageProgress, say  # noqa: E402

DEFAULTS = {"min_rounds": 3, "max_rounds": 9, "target_spread": 0.03, "min_repeat_ms": 4, "max_measure_s": 120.0,
            "timeout_s": 900.0, "unit": "nest"}


@dataclass
class StateGroup:
    """One original program and the states of its released steps (original first, then in the order
    the steps name them)."""

    program_id: str
    family: str
    signature: str
    states: dict[str, str] = field(default_factory=dict)  # state id -> LEIR


def measure_params(params: Params) -> dict:
    return {**DEFAULTS, **(params.raw.get("measure") or {}), **(params.profile.get("measure") or {})}


def state_groups(programs: list[dict], steps: list[dict], released: list[dict],
                 target: str | None = None) -> list[StateGroup]:
    """The groups of states to time, one per original program, in family order. `steps` is the whole
    steps table (a released step's before-state may be the result of an unreleased compute_inline
    step), `released` the released steps' rows. With `target`, only the programs written for it
    (issue 25: a GPU program's states are never timed on the CPU)."""
    after_of = {s["step_id"]: s["after_program_id"] for s in steps}
    by_program = {p["program_id"]: p for p in programs}
    groups: dict[str, StateGroup] = {}
    for s in sorted(released, key=lambda r: r["step_id"]):
        p = by_program[s["program_id"]]
        if not timed_on(p, target):
            continue
        g = groups.get(p["program_id"])
        if g is None:
            g = groups[p["program_id"]] = StateGroup(p["program_id"], p["family"], p["signature"])
            g.states[p["program_id"]] = p["leir"]
        g.states.setdefault(state_ids(s, after_of)[0], s["before_leir"])
        g.states.setdefault(s["after_program_id"], s["after_leir"])
    # Family by family (each family's programs by id): a family's timings are written when its last
    # program is done, so a run killed at any point keeps every family it finished. In program-id
    # order every family was still open until the last minutes (the release build, killed after 23
    # minutes and 5,901 timed states, had written none).
    return sorted(groups.values(), key=lambda g: (g.family, g.program_id))


def timed_on(program: dict, target: str | None) -> bool:
    """Whether the program's states are timed on `target` (any target when None): a program is timed
    on the target it is written for (no `target`: a lake made before programs had one, on any)."""
    return target is None or (program.get("target") or target) == target


def timing_row(group: StateGroup, state_id: str, leir: str, result, fingerprint: dict, run_id: str,
               target: str, sample_ms: int, unit: str) -> dict:
    return {"state_id": state_id, "target": target, "machine_id": fingerprint.get("id", "unknown"),
            "program_id": group.program_id, "family": group.family, "leir": leir, "status": result.status,
            "time_us": result.median_us, "spread": result.spread, "rounds": len(result.samples_us),
            "samples_us": list(result.samples_us), "min_repeat_ms": sample_ms,
            "machine": json.dumps(fingerprint, sort_keys=True), "run_id": run_id, "error": result.error or None,
            "unit": unit}


def group_job(group: StateGroup, wanted: list[str], cfg: dict, target: str):
    from gpu_tasks.pool import Job
    from gpu_tasks.state_timing import StateGroupRequest, time_states_job

    request = StateGroupRequest(tuple(group.states[s] for s in wanted), group.signature, target=target,
                                min_rounds=int(cfg["min_rounds"]), max_rounds=int(cfg["max_rounds"]),
                                target_spread=float(cfg["target_spread"]), min_repeat_ms=int(cfg["min_repeat_ms"]),
                                max_measure_s=float(cfg["max_measure_s"]),
                                llvm_opt_level=_opt_level(cfg), unit=str(cfg["unit"]))
    return Job(time_states_job, (request,), timeout_s=float(cfg["timeout_s"]))


def measure_groups(groups: list[StateGroup], existing: dict[str, dict], cfg: dict, target: str, lake: Path,
                   pool, fingerprint: dict, run_id: str) -> dict:
    """Time the states of `groups` not in `existing` (this machine's rows by state id), writing each
    family's shard when its last group is done. Returns counts."""
    from gpu_tasks.pool import JobFailure

    todo = [(g, [s for s in g.states if s not in existing]) for g in groups]
    todo = [(g, wanted) for g, wanted in todo if wanted]
    families = sorted({g.family for g in groups})
    rows_by_family = {f: [r for r in existing.values() if r["family"] == f] for f in families}
    left = {f: sum(1 for g, _ in todo if g.family == f) for f in families}
    for f in families:  # families with nothing to time keep (or get) their shard as it is
        if left[f] == 0 and rows_by_family[f]:
            write_shard(lake, "timings", f"{fingerprint['id']}-{f}", rows_by_family[f])
    progress = StageProgress("measure", total=len(todo), unit="states", items=sum(len(w) for _, w in todo))
    timed = failed = 0
    jobs = [group_job(g, wanted, cfg, target) for g, wanted in todo]
    with progress:
        for index, result in pool.imap(jobs):
            group, wanted = todo[index]
            if isinstance(result, JobFailure):
                from gpu_tasks.state_timing import StateTime

                states = [StateTime(result.kind, error=result.message)] * len(wanted)
                fp = fingerprint
            else:
                states, fp = list(result.states), result.fingerprint or fingerprint
            for sid, st in zip(wanted, states, strict=True):
                rows_by_family[group.family].append(timing_row(group, sid, group.states[sid], st, fp, run_id, target,
                                                               int(cfg["min_repeat_ms"]), str(cfg["unit"])))
                timed += st.ok
                failed += not st.ok
            left[group.family] -= 1
            if left[group.family] == 0:
                write_shard(lake, "timings", f"{fingerprint['id']}-{group.family}",
                            _one_per_state(rows_by_family[group.family]))
            progress.advance(len(wanted))
    return {"states_timed": timed, "states_failed": failed, "states_reused": len(existing)}


def _opt_level(cfg: dict) -> int | None:
    return None if cfg.get("llvm_opt_level") is None else int(cfg["llvm_opt_level"])


def _one_per_state(rows: list[dict]) -> list[dict]:
    """The table's key is (state, target, machine): a state two programs share keeps its first row."""
    out: dict[tuple, dict] = {}
    for r in rows:
        out.setdefault((r["state_id"], r["target"], r["machine_id"]), r)
    return list(out.values())


@flow(name="measure")
def measure_flow(raw: dict, profile: str, lake: str, reports: str) -> dict:
    from gpu_tasks.state_timing import session_fingerprint
    from gpu_tasks.timing import timing_pool

    params, lake = Params(raw, profile), Path(lake)
    cfg = measure_params(params)
    target = params.verify["target"]
    programs = read_table(lake, "programs").to_pylist()
    steps = read_table(lake, "steps").to_pylist()
    groups = state_groups(programs, steps, released_step_rows(lake), target)
    start = time.perf_counter()
    with timing_pool(timeout_s=float(cfg["timeout_s"])) as pool:
        fingerprint = pool.broadcast(session_fingerprint, target)[0]
        if not isinstance(fingerprint, dict):  # the worker failed before timing anything: say why
            raise RuntimeError(f"measure: the timing worker could not start: {fingerprint}")
        run_id = stable_id("timing-run", fingerprint, time.time_ns(), length=12)
        # a state this machine timed with the same method is not timed again (one release, one method)
        existing = {r["state_id"]: r for r in read_table(lake, "timings").to_pylist()
                    if r["machine_id"] == fingerprint["id"] and r["target"] == target and r["status"] == "ok"
                    and r["unit"] == str(cfg["unit"])}
        wanted = {s for g in groups for s in g.states}
        existing = {k: v for k, v in existing.items() if k in wanted}
        counts = measure_groups(groups, existing, cfg, target, lake, pool, fingerprint, run_id)
    seconds = time.perf_counter() - start
    n_states = sum(len(g.states) for g in groups)
    rate = counts["states_timed"] / seconds if seconds > 0 and counts["states_timed"] else 0.0
    say(f"measure: {n_states} states of {len(groups)} programs on {fingerprint['cpu_model']} "
        f"({counts['states_timed']} timed, {counts['states_reused']} reused, {counts['states_failed']} failed; "
        f"{rate:.1f} states/s)")
    return {"stage": "measure", "programs": len(groups), "states": n_states, **counts,
            "states_per_s": round(rate, 2), "machine_id": fingerprint["id"], "cpu": fingerprint["cpu_model"]}


# --- the timings read back: per-step effects, preference pairs, trajectories -----------------------------

def state_ids(step: dict, after_of: dict[str, str]) -> tuple[str, str]:
    """(before-state id, after-state id) of a step: its original or its parent's result, and its result."""
    parent = step.get("parent_step_id")
    return (step["program_id"] if parent is None else after_of[parent]), step["after_program_id"]


def measuring_machine(timings: list[dict], wanted: set[str], target: str) -> str | None:
    """The machine id with the most `ok` rows among the `wanted` states (ties: the smaller id)."""
    counts = Tally(r["machine_id"] for r in timings
                   if r["status"] == "ok" and r["target"] == target and r["state_id"] in wanted)
    if not counts:
        return None
    return sorted(counts.items(), key=lambda kv: (-kv[1], kv[0]))[0][0]


def released_effects(lake: Path, target: str) -> tuple[list[dict], dict | None]:
    """One row per released step: ids, strategy, level, the LEIR before and after, its verification,
    split, the two states' times on the measuring machine, speedup, spread and effect (None where a
    state was not measured); and that machine's fingerprint (None when nothing was measured)."""
    from gpu_tasks.effect import step_effect

    steps = read_table(lake, "steps").select(["step_id", "after_program_id"]).to_pylist()
    after_of = {s["step_id"]: s["after_program_id"] for s in steps}
    released = released_step_rows(lake)
    status = {v["step_id"]: v["status"] for v in read_table(lake, "verifications").to_pylist()
              if v["target"] == target}
    programs = {p["program_id"]: p for p in read_table(lake, "programs").select(
        ["program_id", "family", "target"]).to_pylist()}
    split = _split_of_steps(lake)
    ids = {s["step_id"]: state_ids(s, after_of) for s in released}
    wanted = {x for pair in ids.values() for x in pair}
    timings = read_table(lake, "timings").to_pylist()
    machine_id = measuring_machine(timings, wanted, target)
    times = {r["state_id"]: r for r in timings if r["machine_id"] == machine_id and r["target"] == target
             and r["status"] == "ok"}
    machine = json.loads(next(iter(times.values()))["machine"]) if times else None
    if machine is not None:  # how the release's times were taken (`nest` or `state`, measure.unit)
        machine["timing_units"] = sorted({r["unit"] or "unrecorded" for r in times.values()})
    rows = []
    for s in sorted(released, key=lambda r: r["step_id"]):
        before_id, after_id = ids[s["step_id"]]
        program = programs[s["program_id"]]
        # a GPU program's effect stays unmeasured until it is timed on a GPU (never its CPU times)
        b, a = (times.get(before_id), times.get(after_id)) if timed_on(program, target) else (None, None)
        effect = step_effect(b and b["time_us"], a and a["time_us"], b and b["spread"], a and a["spread"])
        rows.append({"step_id": s["step_id"], "program_id": s["program_id"], "family": program["family"],
                     "program_target": program["target"] or target,
                     "split": split.get(s["step_id"]), "strategy": s["strategy"], "level": s["level"],
                     "before_state_id": before_id, "after_state_id": after_id,
                     "before_leir": s["before_leir"], "after_leir": s["after_leir"],
                     "verification": status.get(s["step_id"]), "exactness": s["exactness"],
                     "before_us": b and b["time_us"], "after_us": a and a["time_us"], **effect,
                     "machine_id": machine_id if (b and a) else None})
    return rows, machine


def _split_of_steps(lake: Path) -> dict[str, str]:
    out: dict[str, str] = {}
    for row in read_table(lake, "samples").select(["split", "step_ids"]).to_pylist():
        for step_id in json.loads(row["step_ids"]):
            out.setdefault(step_id, row["split"])
    return out


def effect_shares(rows: list[dict]) -> dict[str, dict]:
    """Per strategy: released steps, measured ones, and the share of each effect among those."""
    out: dict[str, dict] = {}
    for r in rows:
        e = out.setdefault(r["strategy"], {"level": r["level"], "released": 0, "measured": 0,
                                           "faster": 0, "neutral": 0, "slower": 0})
        e["released"] += 1
        if r["effect"]:
            e["measured"] += 1
            e[r["effect"]] += 1
    return dict(sorted(out.items()))


def preference_pairs(samples: list[dict], effects: list[dict], per_prompt: int = 4) -> list[dict]:
    """DPO pairs: two verified answers to the same prompt (single-answer samples) whose after-states'
    times differ beyond their spread, the faster one `chosen`. At most `per_prompt` pairs per prompt,
    the widest margins first; deterministic for the same timings."""
    from gpu_tasks.effect import effect_class

    by_step = {e["step_id"]: e for e in effects}
    by_prompt: dict[str, list[tuple[dict, dict]]] = {}
    for s in samples:
        ids = json.loads(s["step_ids"])
        e = by_step.get(ids[0]) if len(ids) == 1 else None
        if e is not None and e["after_us"]:
            by_prompt.setdefault(s["prompt"], []).append((s, e))
    pairs = []
    for prompt in sorted(by_prompt):
        answers = sorted(by_prompt[prompt], key=lambda se: (se[1]["after_us"], se[0]["sample_id"]))
        found = []
        for i, (fast, fe) in enumerate(answers):
            for slow, se in answers[i + 1:]:
                ratio = se["after_us"] / fe["after_us"]
                spread = max(fe["spread"] or 0.0, se["spread"] or 0.0)
                if effect_class(ratio, spread) == "faster":
                    found.append((ratio, fast, fe, slow, se))
        found.sort(key=lambda f: (-f[0], f[1]["sample_id"], f[3]["sample_id"]))
        for ratio, fast, fe, slow, se in found[:per_prompt]:
            pairs.append({"prompt": prompt, "chosen": fast["answer"], "rejected": slow["answer"],
                          "split": fast["split"], "chosen_step_id": fe["step_id"], "rejected_step_id": se["step_id"],
                          "chosen_strategy": fe["strategy"], "rejected_strategy": se["strategy"],
                          "chosen_us": fe["after_us"], "rejected_us": se["after_us"], "margin": ratio,
                          "before_us": fe["before_us"]})
    return pairs


def release_trajectories(lake: Path, split_of_family: dict[str, str]) -> list[dict]:
    """The search's best trajectories as multi-step records: the states (root first), the strategies
    and parameters between them, each state's time and speedup over the root as the search measured
    them, the driver and the machine."""
    programs = {p["program_id"]: p for p in read_table(lake, "programs").select(
        ["program_id", "family", "workload", "leir", "dtype"]).to_pylist()}
    steps = {s["step_id"]: s for s in read_table(lake, "trajectory_steps").to_pylist()}
    out = []
    for t in sorted(read_table(lake, "trajectories").to_pylist(), key=lambda t: t["trajectory_id"]):
        p = programs.get(t["program_id"])
        if p is None:
            continue
        chain = [steps[i] for i in json.loads(t["steps"]) if i in steps]
        machine = json.loads(t["machine"]) if t.get("machine") else {}
        times = json.loads(t["times_us"]) if t.get("times_us") else [None] * len(chain)
        out.append({"trajectory_id": t["trajectory_id"], "program_id": t["program_id"], "family": p["family"],
                    "workload": p["workload"], "dtype": p["dtype"], "split": split_of_family.get(p["family"], "train"),
                    "driver": t["driver"], "policy": t["policy"], "seed": t["seed"],
                    "states": [p["leir"], *(s["after_leir"] for s in chain)],
                    "strategies": [s["strategy"] for s in chain], "params": [s["params"] for s in chain],
                    "times_us": [t.get("root_us"), *times],
                    "speedups": [1.0, *json.loads(t["speedups"])], "best_speedup": t["best_speedup"],
                    "steps": len(chain), "states_verified": t["states_verified"], "wall_s": t["wall_s"],
                    "machine_id": machine.get("id"), "cpu": machine.get("cpu_model")})
    return out
