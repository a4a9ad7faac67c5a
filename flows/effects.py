"""Measured effects of released steps (issue 24), derived from the `timings` table.

A step's effect is the ratio of its before-state's and after-state's times on one machine
(`gpu_tasks.effect`: `faster` / `neutral` / `slower` against the measured spread). The machine is
the one that timed most of the release's states (ties: the smaller fingerprint id), so that every
figure of a release comes from one machine, which the card names.

Nothing here is read by the deterministic stages: the effects go to the release's `measured` and
`preference` configs, the card, and the cost model's training set.
"""
from __future__ import annotations

import json
from collections import Counter as Tally
from pathlib import Path

from flows.storage import read_table, released_step_rows


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
    family = {p["program_id"]: p["family"] for p in read_table(lake, "programs").select(
        ["program_id", "family"]).to_pylist()}
    split = _split_of_steps(lake)
    ids = {s["step_id"]: state_ids(s, after_of) for s in released}
    wanted = {x for pair in ids.values() for x in pair}
    timings = read_table(lake, "timings").to_pylist()
    machine_id = measuring_machine(timings, wanted, target)
    times = {r["state_id"]: r for r in timings if r["machine_id"] == machine_id and r["target"] == target
             and r["status"] == "ok"}
    machine = json.loads(next(iter(times.values()))["machine"]) if times else None
    rows = []
    for s in sorted(released, key=lambda r: r["step_id"]):
        before_id, after_id = ids[s["step_id"]]
        b, a = times.get(before_id), times.get(after_id)
        effect = step_effect(b and b["time_us"], a and a["time_us"], b and b["spread"], a and a["spread"])
        rows.append({"step_id": s["step_id"], "program_id": s["program_id"], "family": family[s["program_id"]],
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
