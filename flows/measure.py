"""The measure stage (issue 24): every program state the release refers to, timed once per machine.

The states are the originals of the released steps and the before and after state of every
released step (a state is its `program_id`: canonical LEIR plus signature, so a state that several
steps share is timed once). One timing job per original program measures all of that program's
states in one interleaved session (`gpu_tasks.state_timing`): builds on every core first, then,
holding the machine's timing lock, rounds over the states until each one's spread is small enough.

Timings are measurements, not deterministic data: they live in the `timings` table, one row per
(state, target, machine), beside the deterministic tables and never read by the stages that write
those. A state that this machine has already timed is not timed again (`make run` after an edit
times only the new states; a killed run resumes), and each family's rows are written as soon as its
programs are done, in the shard `<machine id>-<family>`. Per-step effects are derived from the
table by `flows.effects`.
"""
from __future__ import annotations

import json
import time
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
            "timeout_s": 900.0}


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


def state_groups(programs: list[dict], steps: list[dict], released: list[dict]) -> list[StateGroup]:
    """The groups of states to time, by program_id. `steps` is the whole steps table (a released
    step's before-state may be the result of an unreleased compute_inline step), `released` the
    released steps' rows."""
    after_of = {s["step_id"]: s["after_program_id"] for s in steps}
    by_program = {p["program_id"]: p for p in programs}
    groups: dict[str, StateGroup] = {}
    for s in sorted(released, key=lambda r: r["step_id"]):
        p = by_program[s["program_id"]]
        g = groups.get(p["program_id"])
        if g is None:
            g = groups[p["program_id"]] = StateGroup(p["program_id"], p["family"], p["signature"])
            g.states[p["program_id"]] = p["leir"]
        g.states.setdefault(before_state(s, after_of), s["before_leir"])
        g.states.setdefault(s["after_program_id"], s["after_leir"])
    return [groups[k] for k in sorted(groups)]


def before_state(step: dict, after_of: dict[str, str]) -> str:
    """The id of a step's before-state: its original, or the result of its parent step."""
    parent = step.get("parent_step_id")
    return step["program_id"] if parent is None else after_of[parent]


def timing_row(group: StateGroup, state_id: str, leir: str, result, fingerprint: dict, run_id: str,
               target: str, sample_ms: int) -> dict:
    return {"state_id": state_id, "target": target, "machine_id": fingerprint.get("id", "unknown"),
            "program_id": group.program_id, "family": group.family, "leir": leir, "status": result.status,
            "time_us": result.median_us, "spread": result.spread, "rounds": len(result.samples_us),
            "samples_us": list(result.samples_us), "min_repeat_ms": sample_ms,
            "machine": json.dumps(fingerprint, sort_keys=True), "run_id": run_id, "error": result.error or None}


def group_job(group: StateGroup, wanted: list[str], cfg: dict, target: str):
    from gpu_tasks.pool import Job
    from gpu_tasks.state_timing import StateGroupRequest, time_states_job

    request = StateGroupRequest(tuple(group.states[s] for s in wanted), group.signature, target=target,
                                min_rounds=int(cfg["min_rounds"]), max_rounds=int(cfg["max_rounds"]),
                                target_spread=float(cfg["target_spread"]), min_repeat_ms=int(cfg["min_repeat_ms"]),
                                max_measure_s=float(cfg["max_measure_s"]),
                                llvm_opt_level=_opt_level(cfg))
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
                                                               int(cfg["min_repeat_ms"])))
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
    groups = state_groups(programs, steps, released_step_rows(lake))
    start = time.perf_counter()
    with timing_pool(timeout_s=float(cfg["timeout_s"])) as pool:
        fingerprint = pool.broadcast(session_fingerprint, target)[0]
        run_id = stable_id("timing-run", fingerprint, time.time_ns(), length=12)
        existing = {r["state_id"]: r for r in read_table(lake, "timings").to_pylist()
                    if r["machine_id"] == fingerprint["id"] and r["target"] == target and r["status"] == "ok"}
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
