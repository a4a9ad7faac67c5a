"""The measure stage: every program state the release refers to, timed once per
machine, and the effect of every released step from an interval.

The states are the originals of the released steps, the before and after state of every released
step, and the after-state of every verified follow-up of a released enabling step (`follow_ups`; a
state is its `program_id`: canonical LEIR plus signature, so a state that several steps share is
timed once). One timing job per original program measures all of that program's states in one
interleaved session (`gpu_tasks.state_timing`): builds on every core first, then, holding the
machine's timing lock, rounds over the states. The job is told the comparisons that matter (each
released step's before and after state, each follow-up's chain: the enabling step's before-state
against the follow-up's after-state) and goes on, from `min_rounds` up to `max_rounds`, until every
comparison's bootstrap interval is decided (`gpu_tasks.effect`).

A state is timed as the sum of its top-level nests (`measure.unit: nest`, each distinct nest of the
program compiled and timed once, `gpu_tasks.nest_timing`), and timed whole as well where a
comparison has a side under `measure.whole_below_us` per call or changes the number of nests with a
side under `measure.whole_changed_below_us`, and for a seeded sample of `measure.agreement_states`
states (the nest/whole agreement the card reports). Rows are per (state, target, machine, unit), with
the session and the protocol.

Timings are measurements, not deterministic data: they live in `timings` and `effects`, beside the
deterministic tables and never read by the stages that write those. A program whose states this
machine has all timed in one session on the same protocol is not timed again (`make run` after an
edit times the programs whose states changed; a killed run resumes), and each family's rows are
written as soon as its programs are done, in the shard `<machine id>-<family>`.

The `effects` table holds each released step's effect and each follow-up's chain effect on this
machine (`TimingIndex.compare`, below). The release decides each step on the machine that timed most
of the release's states among those that timed the step (ties: the smaller fingerprint id), so that
each step's figures come from one machine. On a Dask cluster each distinct fingerprint among the
workers is a machine, and each program is timed on one of them (`measure_on_cluster`).
"""
from __future__ import annotations

import json
import math
import os
import time
from collections import Counter
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path

from prefect import flow

from flows.cluster import on_cluster
from flows.config import Params
from flows.keys import rank, stable_id
from flows.lake_queries import released_step_rows
from flows.storage import read_table, write_shard
from flows.tasks import StageProgress, say
from gpu_tasks.effect import (  # pure arithmetic: no TVM
    DEFAULT_WHOLE_BELOW_US,
    DEFAULT_WHOLE_CHANGED_BELOW_US,
    compared_whole,
    step_effect,
)
from gpu_tasks.fingerprint import MACHINE_NAME_ENV, with_name  # TVM only inside machine_fingerprint

DEFAULTS = {"min_rounds": 5, "max_rounds": 15, "target_spread": 0.03, "min_repeat_ms": 4, "max_measure_s": 120.0,
            "timeout_s": 900.0, "unit": "nest", "whole_below_us": DEFAULT_WHOLE_BELOW_US,
            "whole_changed_below_us": DEFAULT_WHOLE_CHANGED_BELOW_US,
            "agreement_states": 200}
# The entries of the configuration that decide how a state is timed: rows timed otherwise are timed again.
PROTOCOL_KEYS = ("min_rounds", "max_rounds", "target_spread", "min_repeat_ms", "unit", "whole_below_us",
                 "whole_changed_below_us")


@dataclass
class StateGroup:
    """One original program, the states to time (original first, then in the order the steps name
    them) and the comparisons that decide the rounds, (before state id, after state id)."""

    program_id: str
    family: str
    signature: str
    states: dict[str, str] = field(default_factory=dict)  # state id -> LEIR
    pairs: dict[tuple[str, str], None] = field(default_factory=dict)  # ordered, each once
    whole: set[str] = field(default_factory=set)  # states timed whole as well (the agreement sample)


def measure_params(params: Params) -> dict:
    return {**DEFAULTS, **(params.raw.get("measure") or {}), **(params.profile.get("measure") or {})}


def protocol_of(cfg: dict) -> str:
    """The timing protocol of a configuration, as stored with each row (with the effect rule's constants)."""
    from gpu_tasks.effect import LEVEL, NOISE_MARGIN
    from gpu_tasks.timing_session import TIGHT

    return json.dumps({**{k: cfg[k] for k in PROTOCOL_KEYS}, "noise_margin": NOISE_MARGIN, "level": LEVEL,
                       "tight": TIGHT, "statistic": "paired median of round ratios",
                       "sample": "fixed batch after a calibrating sample"}, sort_keys=True)


def state_groups(programs: list[dict], steps: list[dict], released: list[dict], target: str | None = None,
                 follow_ups: list[dict] | None = None) -> list[StateGroup]:
    """The groups of states to time, one per original program, in family order. `steps` is the whole
    steps table (a released step's before-state may be the result of an unreleased compute_inline
    step), `released` the released steps' rows, `follow_ups` the passing follow-ups of released
    steps. With `target`, only the programs written for it (a GPU program's states are
    never timed on the CPU)."""
    after_of = {s["step_id"]: s["after_program_id"] for s in steps}
    by_program = {p["program_id"]: p for p in programs}
    groups: dict[str, StateGroup] = {}
    before_of: dict[str, str] = {}
    for s in sorted(released, key=lambda r: r["step_id"]):
        p = by_program[s["program_id"]]
        if not timed_on(p, target):
            continue
        g = groups.get(p["program_id"])
        if g is None:
            g = groups[p["program_id"]] = StateGroup(p["program_id"], p["family"], p["signature"])
            g.states[p["program_id"]] = p["leir"]
        before, after = state_ids(s, after_of)
        g.states.setdefault(before, s["before_leir"])
        g.states.setdefault(after, s["after_leir"])
        g.pairs.setdefault((before, after))
        before_of[s["step_id"]] = before
    for f in sorted(follow_ups or [], key=lambda r: r["step_id"]):
        g = groups.get(f["program_id"])
        if g is None or f["parent_step_id"] not in before_of:
            continue
        g.states.setdefault(f["after_program_id"], f["after_leir"])
        g.pairs.setdefault((before_of[f["parent_step_id"]], f["after_program_id"]))
    # Family by family (each family's programs by id): a family's timings are written when its last
    # program is done, so a run killed at any point keeps every family it finished. In program-id
    # order every family was still open until the last minutes (the release build, killed after 23
    # minutes and 5,901 timed states, had written none).
    return sorted(groups.values(), key=lambda g: (g.family, g.program_id))


def choose_agreement_states(groups: list[StateGroup], count: int, seed: int) -> None:
    """Mark a seeded sample of `count` states (over all groups) to be timed whole as well."""
    ranked = sorted((rank(seed, "agreement", sid), k, sid) for k, g in enumerate(groups) for sid in g.states)
    for _, k, sid in ranked[:count]:
        groups[k].whole.add(sid)


def timed_on(program: dict, target: str | None) -> bool:
    """Whether the program's states are timed on `target` (any target when None): a program is timed
    on the target it is written for (no `target`: a lake made before programs had one, on any)."""
    return target is None or (program.get("target") or target) == target


def timing_row(group: StateGroup, state_id: str, result, nests: int | None, unit: str, session: dict) -> dict:
    return {"state_id": state_id, "target": session["target"],
            "machine_id": session["fingerprint"].get("id", "unknown"), "program_id": group.program_id,
            "family": group.family, "leir": group.states[state_id],
            "status": result.status, "time_us": result.median_us, "spread": result.spread,
            "rounds": len(result.samples_us), "samples_us": list(result.samples_us),
            "min_repeat_ms": session["sample_ms"], "machine": json.dumps(session["fingerprint"], sort_keys=True),
            "run_id": session["run_id"], "error": result.error or None, "unit": unit,
            "session_id": session["session_id"], "protocol": session["protocol"], "n_nests": nests}


def group_job(group: StateGroup, cfg: dict, target: str):
    from gpu_tasks.pool import Job
    from gpu_tasks.state_timing import StateGroupRequest, time_states_job

    ids = list(group.states)
    position = {sid: i for i, sid in enumerate(ids)}
    request = StateGroupRequest(tuple(group.states[s] for s in ids), group.signature, target=target,
                                min_rounds=int(cfg["min_rounds"]), max_rounds=int(cfg["max_rounds"]),
                                target_spread=float(cfg["target_spread"]), min_repeat_ms=int(cfg["min_repeat_ms"]),
                                max_measure_s=float(cfg["max_measure_s"]),
                                llvm_opt_level=_opt_level(cfg), unit=str(cfg["unit"]),
                                pairs=tuple((position[b], position[a]) for b, a in group.pairs),
                                whole=tuple(sorted(position[s] for s in group.whole)),
                                whole_below_us=float(cfg["whole_below_us"]),
                                whole_changed_below_us=float(cfg["whole_changed_below_us"]))
    return Job(time_states_job, (request,), timeout_s=float(cfg["timeout_s"]))


def group_rows(group: StateGroup, result, cfg: dict, session: dict) -> list[dict]:
    """The timing rows of one group's job: a row per state in the configured unit, and a `state` row
    per state also timed whole."""
    from gpu_tasks.pool import JobFailure
    from gpu_tasks.timing_session import StateTime

    ids, unit = list(group.states), str(cfg["unit"])
    if isinstance(result, JobFailure):
        failed = StateTime(result.kind, error=result.message)
        return [timing_row(group, sid, failed, None, unit, session) for sid in ids]
    nests = list(result.nests) or [None] * len(ids)
    rows = [timing_row(group, sid, st, n, unit, session) for sid, st, n in zip(ids, result.states, nests, strict=True)]
    for sid, st, n in zip(ids, result.whole or [None] * len(ids), nests, strict=True):
        if st is not None and unit != "state":
            rows.append(timing_row(group, sid, st, n, "state", session))
    return rows


def reusable(group: StateGroup, rows: dict[tuple[str, str], dict], cfg: dict) -> list[dict] | None:
    """This machine's rows of `group` when they are all there from one session on the current
    protocol (every state in the configured unit, whole-state rows wherever the protocol asks for
    them), else None: the group is timed again, since a comparison is made within one session."""
    unit = str(cfg["unit"])
    base = [rows.get((sid, unit)) for sid in group.states]
    if any(r is None or r["status"] != "ok" for r in base) or len({r["session_id"] for r in base}) != 1:
        return None
    out = list(base)
    index = TimingIndex(rows.values())
    needed = set(group.whole) | {s for b, a in group.pairs if index.unit_for(b, a) == "state" for s in (b, a)}
    for sid in sorted(needed) if unit != "state" else ():
        whole = rows.get((sid, "state"))
        if whole is None or whole["status"] != "ok" or whole["session_id"] != base[0]["session_id"]:
            return None
        out.append(whole)
    return out


@dataclass(frozen=True)
class MeasureRun:
    """One run of the measure stage on this machine: the lake it writes, the target it times for,
    the stage's settings, the machine's fingerprint and the run's id."""

    lake: Path
    target: str
    cfg: dict
    fingerprint: dict
    run_id: str


def measure_groups(groups: list[StateGroup], existing: dict[tuple[str, str], dict], run: MeasureRun,
                   pool) -> tuple[dict, dict[str, list[dict]]]:
    """Time the groups whose rows `existing` (this machine's rows on this protocol, by (state, unit))
    cannot be reused, writing each family's shard when its last group is done. Returns counts and
    the rows by family."""
    cfg, target, lake, fingerprint, run_id = run.cfg, run.target, run.lake, run.fingerprint, run.run_id
    families = sorted({g.family for g in groups})
    rows_by_family: dict[str, list[dict]] = {f: [] for f in families}
    todo = []
    for g in groups:
        kept = reusable(g, existing, cfg)
        if kept is None:
            todo.append(g)
        else:
            rows_by_family[g.family].extend(kept)
    left = Counter(g.family for g in todo)
    for f in families:  # families with nothing to time keep (or get) their shard as it is
        if left[f] == 0:
            write_shard(lake, "timings", f"{fingerprint['id']}-{f}", _one_per_key(rows_by_family[f]))
    progress = StageProgress("measure", total=len(todo), unit="states", items=sum(len(g.states) for g in todo))
    timed = failed = 0
    with progress:
        for index, result in pool.imap([group_job(g, cfg, target) for g in todo]):
            group = todo[index]
            session = timing_session(result, fingerprint, run_id, group, cfg, target)
            rows = group_rows(group, result, cfg, session)
            rows_by_family[group.family].extend(rows)
            ok = sum(r["status"] == "ok" for r in rows if r["unit"] == cfg["unit"])
            timed, failed = timed + ok, failed + len(group.states) - ok
            left[group.family] -= 1
            if left[group.family] == 0:
                write_shard(lake, "timings", f"{fingerprint['id']}-{group.family}",
                            _one_per_key(rows_by_family[group.family]))
            progress.advance(len(group.states))
    reused = sum(len(g.states) for g in groups) - sum(len(g.states) for g in todo)
    return {"states_timed": timed, "states_failed": failed, "states_reused": reused}, rows_by_family


def timing_session(result, machine: dict, run_id: str, group: StateGroup, cfg: dict, target: str) -> dict:
    """What the rows of one group's timing session share: the machine (the fingerprint the session
    reports, named as `machine` is), the run, the protocol, the session's id."""
    fp = with_name(getattr(result, "fingerprint", None) or machine, machine.get("machine"))
    return {"target": target, "fingerprint": fp, "run_id": run_id, "protocol": protocol_of(cfg),
            "sample_ms": int(cfg["min_repeat_ms"]), "session_id": stable_id("timing-session", run_id, group.program_id)}


def _opt_level(cfg: dict) -> int | None:
    return None if cfg.get("llvm_opt_level") is None else int(cfg["llvm_opt_level"])


def _one_per_key(rows: list[dict]) -> list[dict]:
    """The table's key is (state, target, machine, unit): a state two programs share keeps its first row."""
    out: dict[tuple, dict] = {}
    for r in rows:
        out.setdefault((r["state_id"], r["target"], r["machine_id"], r["unit"]), r)
    return list(out.values())


def write_effects(run: MeasureRun, rows_by_family: dict[str, list[dict]], released: list[dict],
                  follow_ups: list[dict], tables: tuple[list[dict], list[dict]]) -> int:
    """This machine's `effects` rows, one shard per family (`<machine id>-<family>`); `tables`: the
    lake's (steps, programs) rows."""
    steps, programs = tables
    lake, machine_id, target = run.lake, run.fingerprint["id"], run.target
    after_of = {s["step_id"]: s["after_program_id"] for s in steps}
    family_of = {p["program_id"]: p["family"] for p in programs}
    by_program = {p["program_id"]: p for p in programs}
    mine = [s for s in released if timed_on(by_program[s["program_id"]], target)]
    n = 0
    for family, rows in sorted(rows_by_family.items()):
        index = TimingIndex(rows)
        steps_here = [s for s in mine if family_of[s["program_id"]] == family]
        ids = {s["step_id"] for s in steps_here}
        effects = effect_rows(steps_here, [f for f in follow_ups if f["parent_step_id"] in ids], after_of,
                              Timed(index, machine_id, target, family_of))
        write_shard(lake, "effects", f"{machine_id}-{family}", effects)
        n += len(effects)
    return n


def passing_follow_ups(lake: Path, released: list[dict]) -> list[dict]:
    """The follow-ups of released steps whose verification passes for their chain."""
    from flows.follow_ups import passing

    exactness = {s["step_id"]: s["exactness"] for s in released}
    return [f for f in read_table(lake, "follow_ups").to_pylist()
            if f["parent_step_id"] in exactness and passing(f, exactness[f["parent_step_id"]])]


@flow(name="measure")
def measure_flow(raw: dict, profile: str, lake: str, reports: str) -> dict:
    params, lake = Params(raw, profile), Path(lake)
    cfg = measure_params(params)
    target = params.verify["target"]
    programs = read_table(lake, "programs").to_pylist()
    steps = read_table(lake, "steps").to_pylist()
    released = released_step_rows(lake)
    follow_ups = passing_follow_ups(lake, released)
    groups = state_groups(programs, steps, released, target, follow_ups)
    choose_agreement_states(groups, int(cfg["agreement_states"]), params.seed)
    start = time.perf_counter()
    timings = [r for r in read_table(lake, "timings").to_pylist()
               if r["target"] == target and r["protocol"] == protocol_of(cfg)]
    if on_cluster():
        counts, runs = measure_on_cluster(groups, timings, lake, cfg, target)
    else:
        counts, runs = measure_here(groups, timings, lake, cfg, target)
    effects = sum(write_effects(run, rows, released, follow_ups, (steps, programs)) for run, rows in runs)
    seconds = time.perf_counter() - start
    n_states = sum(len(g.states) for g in groups)
    rate = counts["states_timed"] / seconds if seconds > 0 and counts["states_timed"] else 0.0
    machines = [run.fingerprint for run, _ in runs]
    cpus = ", ".join(sorted({m["cpu_model"] for m in machines}))
    say(f"measure: {n_states} states of {len(groups)} programs on {cpus} "
        f"({counts['states_timed']} timed, {counts['states_reused']} reused, {counts['states_failed']} failed; "
        f"{rate:.1f} states/s{f'; {len(machines)} machines' if len(machines) > 1 else ''}); {effects} effects")
    return {"stage": "measure", "programs": len(groups), "states": n_states, **counts, "effects": effects,
            "states_per_s": round(rate, 2), "machine_id": ",".join(m["id"] for m in machines), "cpu": cpus}


def this_machine(pool, target: str) -> dict:
    """The fingerprint of the machine `pool`'s worker times on, named by this process's
    STEPTP_MACHINE (whatever its workers' environment was)."""
    from gpu_tasks.state_timing import session_fingerprint

    fingerprint = pool.broadcast(session_fingerprint, target)[0]
    if not isinstance(fingerprint, dict):  # the worker failed before timing anything: say why
        raise RuntimeError(f"measure: the timing worker could not start: {fingerprint}")
    return with_name(fingerprint, os.environ.get(MACHINE_NAME_ENV))


def rows_of(timings: list[dict], machine_id: str) -> dict[tuple[str, str], dict]:
    """One machine's timing rows by (state, unit)."""
    return {(r["state_id"], r["unit"]): r for r in timings if r["machine_id"] == machine_id}


def measure_here(groups: list[StateGroup], timings: list[dict], lake: Path, cfg: dict, target: str):
    """Time on this machine (the local runner): counts, and [(run, rows by family)]."""
    from gpu_tasks.timing import timing_pool

    with timing_pool(timeout_s=float(cfg["timeout_s"])) as pool:
        fingerprint = this_machine(pool, target)
        run_id = stable_id("timing-run", fingerprint, time.time_ns(), length=12)
        run = MeasureRun(lake, target, cfg, fingerprint, run_id)
        counts, rows_by_family = measure_groups(groups, rows_of(timings, fingerprint["id"]), run, pool)
    return counts, [(run, rows_by_family)]


# --- the measure stage on a Dask cluster ------------------------------------------------------------
# Each worker is a machine (its fingerprint, named by STEPTP_MACHINE in its environment). A program
# whose states one of the cluster's machines has all timed on this protocol is not timed again; the
# others go out one task per program, to whichever worker is free, and each program's states are
# timed in one session on that worker's machine. So each step's before and after are timed on one
# machine, and its effect computed within it; the release decides each step on a machine that timed
# it. The flow writes every machine's `timings` and `effects` shards as on one machine.

_TIMING_POOL = None
_MACHINE: dict[str, dict] = {}  # this worker's machine, by target (asked once per process)


def worker_timing_pool(timeout_s: float):
    """This process's timing pool, kept between tasks (a cluster worker times many programs)."""
    global _TIMING_POOL
    import atexit

    from gpu_tasks.timing import timing_pool

    if _TIMING_POOL is None or _TIMING_POOL.timeout_s != timeout_s:
        if _TIMING_POOL is not None:
            _TIMING_POOL.close()
        _TIMING_POOL = timing_pool(timeout_s=timeout_s)
        atexit.register(_TIMING_POOL.close)
    return _TIMING_POOL


def worker_machine(target: str, timeout_s: float) -> dict:
    """The fingerprint of the machine this worker times on (its timing pool started; asked once)."""
    if target not in _MACHINE:
        _MACHINE[target] = this_machine(worker_timing_pool(timeout_s), target)
    return _MACHINE[target]


def measure_group(group: StateGroup, cfg: dict, target: str, run_id: str) -> dict:
    """One program's states timed in one session on this worker's machine: its fingerprint and rows
    (a Dask task; timings are measurements, never a cached result)."""
    machine = worker_machine(target, float(cfg["timeout_s"]))
    [(_, result)] = list(worker_timing_pool(float(cfg["timeout_s"])).imap([group_job(group, cfg, target)]))
    session = timing_session(result, machine, run_id, group, cfg, target)
    return {"machine": session["fingerprint"], "rows": group_rows(group, result, cfg, session)}


def measure_on_cluster(groups: list[StateGroup], timings: list[dict], lake: Path, cfg: dict, target: str):
    """Time on the flow's Dask cluster: counts, and [(run, rows by family)] for each of its machines.
    Workers with one fingerprint are one machine: its programs go to one of them only, so that no
    build of one runs beside the other's timing (the timing lock covers the rounds, not the builds)."""
    from flows.cluster import flow_client, on_every_worker

    found = on_every_worker(worker_machine, target, float(cfg["timeout_s"]))
    bad = {name: fp for name, (_, fp) in found.items() if not isinstance(fp, dict)}
    if bad:
        raise RuntimeError(f"measure: the timing worker of cluster worker(s) {', '.join(bad)} could not start: "
                           f"{next(iter(bad.values()))}")
    machines: dict[str, dict] = {}
    timers: list[str] = []  # one worker's address per machine
    for address, fp in found.values():
        if fp["id"] not in machines:
            machines[fp["id"]] = fp
            timers.append(address)
    run_id = stable_id("timing-run", sorted(machines), time.time_ns(), length=12)
    families = sorted({g.family for g in groups})
    rows: dict[str, dict[str, list[dict]]] = {}

    def kept_rows(machine_id: str) -> tuple[dict[str, list[dict]], set[str]]:
        """The machine's rows of the groups it has all timed on the protocol, by family, and those
        groups' programs."""
        existing, out, done = rows_of(timings, machine_id), {f: [] for f in families}, set()
        for g in groups:
            kept = reusable(g, existing, cfg)
            if kept is not None:
                out[g.family].extend(kept)
                done.add(g.program_id)
        return out, done

    timed_somewhere: set[str] = set()
    for m in sorted(machines):
        rows[m], done = kept_rows(m)
        timed_somewhere |= done
    todo = [g for g in groups if g.program_id not in timed_somewhere]
    left = Counter(g.family for g in todo)

    def write_family(family: str) -> None:
        for m in sorted(rows):
            write_shard(lake, "timings", f"{m}-{family}", _one_per_key(rows[m][family]))

    for f in families:
        if left[f] == 0:
            write_family(f)
    timed = failed = 0
    client = flow_client()
    futures = [client.submit(measure_group, g, cfg, target, run_id, workers=timers, allow_other_workers=True,
                             pure=False) for g in todo]
    with StageProgress("measure", total=len(todo), unit="states", items=sum(len(g.states) for g in todo)) as progress:
        for group, future in zip(todo, futures, strict=True):
            out = future.result()
            m = out["machine"]["id"]
            if m not in rows:  # a worker that took over from one that left: its earlier rows kept
                machines[m] = out["machine"]
                rows[m], _ = kept_rows(m)
            rows[m][group.family].extend(out["rows"])
            ok = sum(r["status"] == "ok" for r in out["rows"] if r["unit"] == cfg["unit"])
            timed, failed = timed + ok, failed + len(group.states) - ok
            left[group.family] -= 1
            if left[group.family] == 0:
                write_family(group.family)
            progress.advance(len(group.states))
    reused = sum(len(g.states) for g in groups) - sum(len(g.states) for g in todo)
    runs = [(MeasureRun(lake, target, cfg, machines[m], run_id), rows[m]) for m in sorted(machines)]
    return {"states_timed": timed, "states_failed": failed, "states_reused": reused}, runs


def ranked_machines(timings: list[dict], wanted: set[str]) -> list[str]:
    """The machines that timed some of the `wanted` states, most states first (ties: the smaller id)."""
    counts = Counter(m for m, _ in {(r["machine_id"], r["state_id"]) for r in timings
                                  if r["status"] == "ok" and r["state_id"] in wanted})
    return [m for m, _ in sorted(counts.items(), key=lambda kv: (-kv[1], kv[0]))]



def measuring_machine(timings: list[dict], wanted: set[str], target: str) -> str | None:
    """The machine id with the most timed states among the `wanted` states (ties: the smaller id)."""
    ranked = ranked_machines([r for r in timings if r["target"] == target], wanted)
    return ranked[0] if ranked else None


# --- comparisons of two timed states: the unit, the pairing, the interval ---------------
# A comparison of a before-state and an after-state (`TimingIndex.compare`) picks the timing unit the
# protocol asks for: the states' whole-state times (`unit = 'state'`) where either side runs under the
# protocol's `whole_below_us` per call, or the comparison changes the number of top-level nests and a
# side runs under its `whole_changed_below_us`; their nest sums (`unit = 'nest'`) otherwise. Both sides
# from one session are compared round by round (`paired`); from two sessions, each on its own. The
# class comes from the interval (`gpu_tasks.effect`): `faster`, `neutral`, `slower` or `unresolved`.

TIMING_UNITS = ("nest", "state")


@dataclass(frozen=True)
class Comparison:
    """before/after of two states on one machine: their medians, the speedup with its interval and
    class, the unit compared, whether paired by round, and the fewer rounds of the two."""

    before_us: float | None
    after_us: float | None
    speedup: float | None
    speedup_low: float | None
    speedup_high: float | None
    effect: str | None
    unit: str | None
    paired: bool
    rounds: int | None

    def to_json(self) -> dict:
        return {"before_us": self.before_us, "after_us": self.after_us, "speedup": self.speedup,
                "speedup_low": self.speedup_low, "speedup_high": self.speedup_high, "effect": self.effect,
                "timing_unit": self.unit, "paired": self.paired, "rounds": self.rounds}


UNMEASURED = Comparison(None, None, None, None, None, None, None, False, None)


def protocol_value(row: dict, key: str, default):
    """A field of the row's timing protocol (the measure stage's JSON `protocol` column)."""
    try:
        return json.loads(row.get("protocol") or "{}").get(key, default)
    except ValueError:
        return default


class TimingIndex:
    """The `ok` timing rows of one machine and target, by state and unit."""

    def __init__(self, rows: Iterable[dict]):
        self.rows: dict[tuple[str, str], dict] = {}
        for r in rows:
            if r["status"] == "ok":
                self.rows.setdefault((r["state_id"], r["unit"] or "nest"), r)

    def get(self, state_id: str, unit: str) -> dict | None:
        return self.rows.get((state_id, unit))

    def has(self, state_id: str) -> bool:
        return any((state_id, u) in self.rows for u in TIMING_UNITS)

    def unit_for(self, before: str, after: str) -> str | None:
        """The unit a comparison of the two states is made in (see the module docstring); None when
        either side has no time."""
        nb, na = self.get(before, "nest"), self.get(after, "nest")
        if nb is None or na is None:  # a lake timed whole (`measure.unit: state`)
            return "state" if self.get(before, "state") and self.get(after, "state") else None
        whole = compared_whole((nb.get("n_nests"), na.get("n_nests")), (nb["time_us"], na["time_us"]),
                               float(protocol_value(nb, "whole_below_us", DEFAULT_WHOLE_BELOW_US)),
                               # rows timed before the protocol had this entry: every change of nests whole
                               float(protocol_value(nb, "whole_changed_below_us", math.inf)))
        return "state" if whole else "nest"

    def compare(self, before: str, after: str, key: str) -> Comparison:
        """The comparison of state `before` with state `after` (`key`: the identity the bootstrap is
        seeded by, a step id)."""
        unit = self.unit_for(before, after)
        b, a = (self.get(before, unit), self.get(after, unit)) if unit else (None, None)
        if b is None or a is None:
            return UNMEASURED
        paired = bool(b.get("session_id")) and b.get("session_id") == a.get("session_id")
        e = step_effect(b["samples_us"], a["samples_us"], key, paired=paired)
        return Comparison(b["time_us"], a["time_us"], e["speedup"], e["speedup_low"], e["speedup_high"], e["effect"],
                          unit, paired, min(len(b["samples_us"]), len(a["samples_us"])))


def state_ids(step: dict, after_of: dict[str, str]) -> tuple[str, str]:
    """(before-state id, after-state id) of a step: its original or its parent's result, and its result."""
    parent = step.get("parent_step_id")
    return (step["program_id"] if parent is None else after_of[parent]), step["after_program_id"]


@dataclass(frozen=True)
class Timed:
    """One machine's timings of one target (`index`), and each program's family: what an `effects`
    row compares and is stamped with."""

    index: TimingIndex
    machine_id: str
    target: str
    family_of: dict[str, str]


def effect_rows(released: list[dict], follow_ups: list[dict], after_of: dict[str, str], timed: Timed) -> list[dict]:
    """The `effects` rows of one machine: one per released step (`kind = 'step'`: its before-state
    against its after-state) and one per passing follow-up of a released step (`kind = 'chain'`: the
    enabling step's before-state against the follow-up's after-state)."""
    before_of = {s["step_id"]: state_ids(s, after_of)[0] for s in released}
    out = [_effect_row("step", s, state_ids(s, after_of), timed) for s in released]
    for f in follow_ups:
        before = before_of.get(f["parent_step_id"])
        if before is not None:
            out.append(_effect_row("chain", f, (before, f["after_program_id"]), timed))
    return sorted(out, key=lambda r: r["step_id"])


def _effect_row(kind: str, step: dict, states: tuple[str, str], timed: Timed) -> dict:
    before, after = states
    c = timed.index.compare(before, after, step["step_id"])
    return {"step_id": step["step_id"], "target": timed.target, "machine_id": timed.machine_id, "kind": kind,
            "program_id": step["program_id"], "family": timed.family_of.get(step["program_id"]),
            "strategy": step["strategy"], "parent_step_id": step.get("parent_step_id") if kind == "chain" else None,
            "before_state_id": before, "after_state_id": after, **c.to_json()}
