"""The release's configs made of measurements and what the card says of them: `measured`,
`sft`, `preference`, `preference_chat` and the trajectories, from the `effects` of the machine that
timed them. Effects are computed within one machine, never across two. Where several machines timed
states of the release, `measured` holds one row per step and machine that timed it (`machine_id`);
each step is decided (`sft`, `preference`, the card's tables) by the machine that timed most states
among those that timed the step, and a preference pair compares two answers of one machine.

- `measured`: one row per released step of a program written for the build's target (the steps it
  times): its record (parent, depth, site, parameters, claim), its verification, its before and
  after time, the speedup with its interval and class, and for an `enabling` step the best chain
  through one of its verified follow-ups (`chain_*`) and whether it is a dead end (`dead_end`: no
  follow-up that was timed pays, or none verified). The released steps of programs written for a
  GPU are `gpu_steps`: the same columns, times and effects null (no GPU timed the build).
- `sft`: what the clock says is worth teaching, in the chat form: every single-step sample whose
  step is `faster` and whose chain of thought gives a reason (claim not `none`; never a dead end),
  every enabling step (not `slower` itself) whose chain is `faster` and above the step alone, and that
  chain as a two-step sample in the published multi-answer format (`kind = 'chain'`).
- `preference`: DPO pairs of two answers to one prompt: the chosen step `faster` than the unmodified
  program, the rejected one's interval wholly below the chosen one's; `preference_chat` the same
  pairs in TRL's conversational form (prompt, chosen, rejected as message lists).

Deterministic for the same `effects` and deterministic tables: rows sorted, no set or dict order.
"""
from __future__ import annotations

import json
import math
from collections import Counter, defaultdict
from dataclasses import dataclass

from flows.measure import ranked_machines, state_ids
from gpu_tasks.effect import EFFECTS
from strategies.cot import CLAIMS

# What the SFT config keeps, by the answer's own effect or, for an enabling step, its chain's.
SFT_KINDS = ("step", "chain")


@dataclass(frozen=True)
class ReleasedSteps:
    """The released steps and what the lake says of them: each step's after-state (`after_of`, every
    step), program (by id), verification status and split."""

    steps: list[dict]
    after_of: dict[str, str]
    programs: dict[str, dict]
    status: dict[str, str]
    split: dict[str, str]


def released_effect_rows(r: ReleasedSteps, effects: list[dict], follow_ups: list[dict], machine_id: str | None,
                         target: str) -> list[dict]:
    """The `measured` rows (see the module docstring). `effects`: the measuring machine's rows,
    `follow_ups`: the passing follow-ups of released steps."""
    released, after_of, programs, status, split = r.steps, r.after_of, r.programs, r.status, r.split
    step_effect = {e["step_id"]: e for e in effects if e["kind"] == "step"}
    chains: dict[str, list[tuple[dict, dict]]] = defaultdict(list)
    chain_effect = {e["step_id"]: e for e in effects if e["kind"] == "chain"}
    for f in sorted(follow_ups, key=lambda f: f["step_id"]):
        chains[f["parent_step_id"]].append((f, chain_effect.get(f["step_id"])))
    rows = []
    for s in sorted(released, key=lambda r: r["step_id"]):
        program = programs[s["program_id"]]
        before, after = state_ids(s, after_of)
        e = step_effect.get(s["step_id"]) or {}
        row = {"step_id": s["step_id"], "program_id": s["program_id"], "parent_step_id": s["parent_step_id"],
               "depth": s["depth"], "family": program["family"], "program_target": program.get("target") or target,
               "split": split.get(s["step_id"]), "strategy": s["strategy"], "level": s["level"], "site": s["site"],
               "params": s["params"], "claim": s.get("claim"), "enables": s.get("enables"),
               "before_state_id": before, "after_state_id": after, "before_leir": s["before_leir"],
               "after_leir": s["after_leir"], "verification": status.get(s["step_id"]), "exactness": s["exactness"],
               **{k: e.get(k) for k in ("before_us", "after_us", "speedup", "speedup_low", "speedup_high", "effect",
                                        "timing_unit", "paired", "rounds")},
               "machine_id": machine_id if e.get("effect") else None}
        row.update(_chain_columns(s, chains.get(s["step_id"], [])))
        rows.append(row)
    return rows


def _chain_columns(step: dict, chains: list[tuple[dict, dict | None]]) -> dict:
    """The best chain of an enabling step (a `faster` one first, then the highest speedup) and its
    dead-end verdict; all None for a step that claims no enabling."""
    out = dict.fromkeys(("chain_speedup", "chain_speedup_low", "chain_speedup_high", "chain_effect", "chain_step_id",
                         "chain_strategy", "chain_after_leir", "dead_end"))
    if step.get("claim") != "enabling":
        return out
    timed = [(f, e) for f, e in chains if e is not None and e.get("speedup") is not None]
    if timed:
        f, e = max(timed, key=lambda fe: (fe[1]["effect"] == "faster", fe[1]["speedup"], fe[0]["step_id"]))
        out.update({"chain_speedup": e["speedup"], "chain_speedup_low": e["speedup_low"],
                    "chain_speedup_high": e["speedup_high"], "chain_effect": e["effect"], "chain_step_id": f["step_id"],
                    "chain_strategy": f["strategy"], "chain_after_leir": f["after_leir"]})
    effects = [e["effect"] for _, e in timed]
    if "faster" in effects:
        out["dead_end"] = False
    elif not chains or (effects and "unresolved" not in effects and len(timed) == len(chains)):
        out["dead_end"] = True  # nothing it enables verified, or every follow-up was timed and none pays
    return out


def preference_pairs(samples: list[dict], effects: list[dict], per_prompt: int = 4) -> list[dict]:
    """DPO pairs: two verified single-step answers to the same prompt, the chosen one `faster` than the
    unmodified program and its speedup interval wholly above the rejected one's (both against the same
    before-state). At most `per_prompt` pairs per prompt, the largest chosen/rejected speedup ratio
    first; deterministic for the same effects."""
    by_step = {e["step_id"]: e for e in effects}
    by_prompt: dict[str, list[tuple[dict, dict]]] = {}
    for s in samples:
        ids = json.loads(s["step_ids"])
        e = by_step.get(ids[0]) if len(ids) == 1 else None
        if e is not None and e.get("speedup_low") is not None:
            by_prompt.setdefault(s["prompt"], []).append((s, e))
    pairs = []
    for prompt in sorted(by_prompt):
        answers = sorted(by_prompt[prompt], key=lambda se: se[0]["sample_id"])
        found = [(fe["speedup"] / se["speedup"], fast, fe, slow, se) for fast, fe in answers if fe["effect"] == "faster"
                 for slow, se in answers if slow is not fast and fe["speedup_low"] > se["speedup_high"]
                 and fe.get("machine_id") == se.get("machine_id")]   # two answers timed on one machine
        found.sort(key=lambda f: (-f[0], f[1]["sample_id"], f[3]["sample_id"]))
        for ratio, fast, fe, slow, se in found[:per_prompt]:
            pairs.append({"prompt": prompt, "chosen": fast["answer"], "rejected": slow["answer"],
                          "split": fast["split"], "chosen_step_id": fe["step_id"], "rejected_step_id": se["step_id"],
                          "chosen_strategy": fe["strategy"], "rejected_strategy": se["strategy"],
                          "chosen_effect": fe["effect"], "rejected_effect": se["effect"],
                          "chosen_speedup": fe["speedup"], "chosen_speedup_low": fe["speedup_low"],
                          "rejected_speedup": se["speedup"], "rejected_speedup_high": se["speedup_high"],
                          "chosen_us": fe["after_us"], "rejected_us": se["after_us"], "margin": ratio,
                          "before_us": fe["before_us"]})
    return pairs


def preference_chat_rows(pairs: list[dict]) -> list[dict]:
    """The pairs in TRL's conversational preference form: `prompt` a list with the user message,
    `chosen` and `rejected` lists with the assistant message (the `chat` config's roles)."""
    return [{"prompt": [{"role": "user", "content": p["prompt"]}],
             "chosen": [{"role": "assistant", "content": p["chosen"]}],
             "rejected": [{"role": "assistant", "content": p["rejected"]}],
             "split": p["split"], "chosen_step_id": p["chosen_step_id"], "rejected_step_id": p["rejected_step_id"],
             "margin": p["margin"]} for p in pairs]


def sft_rows(samples: list[dict], measured: list[dict], chain_prompt, chain_answer) -> list[dict]:
    """The `sft` rows (see the module docstring). `chain_prompt(step row)` gives a chain sample's
    prompt, `chain_answer(step row, measured row)` its answer (the steps' CoTs and results)."""
    by_step = {m["step_id"]: m for m in measured}
    out = []
    for s in sorted(samples, key=lambda s: s["sample_id"]):
        ids = json.loads(s["step_ids"])
        m = by_step.get(ids[0]) if len(ids) == 1 else None
        if m is None:
            continue
        # an enabling step slower by itself is never taught, not even inside a chain that pays: slower
        # steps appear only as `rejected` in `preference`; nor a chain whose follow-up loses what the
        # step gained alone (a tiling at 4.8x, then an unrolling that brings it to 1.8x)
        pays = m["chain_effect"] == "faster" and m["claim"] == "enabling" and m["effect"] != "slower" \
            and chain_beats_step(m)
        # a dead end is never taught: its chain of thought justifies it by follow-ups that do not pay;
        # nor a step whose chain of thought claims nothing (`none`: "by itself it does not pay"), however
        # fast it measured: its answer gives no reason to make it, and from 1.2x on it contradicts the clock
        reasoned = m["claim"] != "none"
        if m["dead_end"] is not True and ((m["effect"] == "faster" and reasoned) or pays):
            out.append(_sft_row(s, (s["prompt"], s["answer"]), "step", m))
        if pays:  # the chain as a whole is faster, even where its first step alone is only neutral
            out.append(_sft_row(s, (chain_prompt(m), chain_answer(m)), "chain", m))
    return sorted(out, key=lambda r: r["sample_id"])


def chain_beats_step(m: dict) -> bool:
    """Whether the chain's speedup interval lies wholly above its first step's alone (the follow-up
    adds speed to what the step gives by itself)."""
    low, high = m.get("chain_speedup_low"), m.get("speedup_high")
    return low is not None and high is not None and low > high


def _sft_row(sample: dict, text: tuple[str, str], kind: str, m: dict) -> dict:
    """One `sft` row of `sample` with (prompt, answer) `text`, for the measured row `m`: a `step`
    (its own effect and speedup) or a `chain` (the step and its follow-up, the chain's figures)."""
    prompt, answer = text
    chain = kind == "chain"
    speed = "chain_" if chain else ""
    return {"messages": [{"role": "user", "content": prompt}, {"role": "assistant", "content": answer}],
            "sample_id": f"{sample['sample_id']}-chain" if chain else sample["sample_id"], "split": sample["split"],
            "kind": kind, "step_ids": json.dumps([m["step_id"], m["chain_step_id"]] if chain else [m["step_id"]]),
            "strategies": json.dumps([m["strategy"], m["chain_strategy"]] if chain else [m["strategy"]]),
            "claim": m["claim"], "effect": m[f"{speed}effect"], "speedup": m[f"{speed}speedup"],
            "speedup_low": m[f"{speed}speedup_low"], "speedup_high": m[f"{speed}speedup_high"],
            "step_effect": m["effect"], "chain_effect": m["chain_effect"]}


# --- read from the lake: the measuring machine's effects, the chains' texts, the trajectories --------

@dataclass(frozen=True)
class MeasuredRows:
    """A lake's `measured` rows: for each released step the row that decides (`deciding`: the row of
    the machine that timed most states among those that timed the step; a row without times where
    none did) and the rows of the other machines that timed it (`others`); the fingerprints of the
    machines by id, most states first (`machines`); the timing summary of the card (the first
    machine's); the chain samples' prompt and answer functions."""

    deciding: list[dict]
    others: list[dict]
    machines: dict
    timing: dict
    chain_prompt: object
    chain_answer: object

    @property
    def machine(self) -> dict | None:
        """The machine that timed most states (the card's protocol paragraph is its)."""
        return next(iter(self.machines.values()), None)


def measured_rows(lake, target: str) -> MeasuredRows:
    """The `measured` rows of `lake` for `target` (see MeasuredRows)."""
    from pathlib import Path

    from flows.lake_queries import released_step_rows
    from flows.measure import passing_follow_ups, timed_on
    from flows.storage import read_table

    lake = Path(lake)
    steps = read_table(lake, "steps").to_pylist()
    after_of = {s["step_id"]: s["after_program_id"] for s in steps}
    released = released_step_rows(lake)
    programs = {p["program_id"]: p for p in read_table(lake, "programs").to_pylist()}
    status = {v["step_id"]: v["status"] for v in read_table(lake, "verifications").to_pylist() if v["target"] == target}
    split = _split_of_steps(read_table(lake, "samples").select(["split", "step_ids"]).to_pylist())
    wanted = {x for s in released if timed_on(programs[s["program_id"]], target) for x in state_ids(s, after_of)}
    timings = [r for r in read_table(lake, "timings").to_pylist() if r["target"] == target]
    ranked = ranked_machines(timings, wanted)
    effects = [e for e in read_table(lake, "effects").to_pylist() if e["target"] == target]
    follow_ups = passing_follow_ups(lake, released)
    record = ReleasedSteps(released, after_of, programs, status, split)
    per_machine = [released_effect_rows(record, [e for e in effects if e["machine_id"] == m], follow_ups, m, target)
                   for m in ranked] or [released_effect_rows(record, [], follow_ups, None, target)]
    deciding, others = deciding_rows(per_machine)
    first = [r for r in timings if ranked and r["machine_id"] == ranked[0] and r["status"] == "ok"]
    cot = {s["step_id"]: s["cot"] for s in released} | {f["step_id"]: f["cot"] for f in follow_ups}
    fingerprints = machines_of(timings)
    return MeasuredRows(deciding, others, {m: fingerprints[m] for m in ranked},
                        timing_summary(first, [r for r in deciding if r["machine_id"] in (None, *ranked[:1])]),
                        _chain_prompt(programs), _chain_answer(cot))


def deciding_rows(per_machine: list[list[dict]]) -> tuple[list[dict], list[dict]]:
    """(for each step the row of the first machine that timed it, else the first machine's row
    without times; the rows of the other machines that timed it): `per_machine` holds one row per
    released step for each machine, in the same step order, machines most states first."""
    deciding, others = [], []
    for candidates in zip(*per_machine, strict=True):   # one row per machine, for the same step
        timed = [r for r in candidates if r["machine_id"] is not None]
        deciding.append(timed[0] if timed else candidates[0])
        others += timed[1:]
    return deciding, others


def machines_of(timings: list[dict]) -> dict[str, dict]:
    """Each machine's fingerprint (the first `ok` row's), by id."""
    out: dict[str, dict] = {}
    for r in timings:
        if r["status"] == "ok" and r["machine_id"] not in out:
            out[r["machine_id"]] = json.loads(r["machine"])
    return out


def _split_of_steps(samples: list[dict]) -> dict[str, str]:
    out: dict[str, str] = {}
    for row in samples:
        for step_id in json.loads(row["step_ids"]):
            out.setdefault(step_id, row["split"])
    return out


def _chain_prompt(programs: dict[str, dict]):
    from leir.parse import parse_program
    from leir.signature import Signature
    from strategies.cot import TASK_CHAIN, prompt

    def chain_prompt(m: dict) -> str:
        p = programs[m["program_id"]]
        return prompt(parse_program(m["before_leir"]), Signature.from_json(p["signature"]), m["program_target"],
                      TASK_CHAIN.format(k=2))

    return chain_prompt


def _chain_answer(cot: dict[str, str]):
    from strategies.cot import combine_answers

    def chain_answer(m: dict) -> str:
        return combine_answers([cot[m["step_id"]], cot[m["chain_step_id"]]], label="Step")

    return chain_answer


def timing_summary(timings: list[dict], measured: list[dict]) -> dict:
    """What the card says of how the release was timed: the protocol, the rounds, the units, the
    effects, and how nest sums agree with whole-state times on the states timed both ways."""
    import numpy as np

    from gpu_tasks.effect import EFFECTS

    if not timings:
        return {}
    rounds = [r["rounds"] for r in timings]
    protocol = json.loads(timings[0].get("protocol") or "{}")
    by_state: dict[str, dict[str, float]] = defaultdict(dict)
    for r in timings:
        by_state[r["state_id"]][r["unit"]] = r["time_us"]
    both = sorted(s for s, u in by_state.items() if "nest" in u and "state" in u)
    agreement = None
    if len(both) >= 3:
        nest = np.array([by_state[s]["nest"] for s in both])
        whole = np.array([by_state[s]["state"] for s in both])
        ratio = nest / whole
        agreement = {"states": len(both), "spearman": _spearman(nest, whole), "median_ratio": float(np.median(ratio)),
                     "p10_ratio": float(np.percentile(ratio, 10)), "p90_ratio": float(np.percentile(ratio, 90)),
                     "within_10pct": float(np.mean(np.abs(np.log(ratio)) < np.log(1.1)))}
    timed = [m for m in measured if m["effect"]]
    return {"protocol": protocol, "states": len(by_state), "rows": len(timings), "rounds_min": min(rounds),
            "rounds_median": float(np.median(rounds)), "rounds_max": max(rounds),
            "at_max_rounds": sum(r == protocol.get("max_rounds") for r in rounds),
            "units": {u: sum(r["unit"] == u for r in timings) for u in ("nest", "state")},
            "steps_by_unit": {u: sum(m["timing_unit"] == u for m in timed) for u in ("nest", "state")},
            "effects": {e: sum(m["effect"] == e for m in timed) for e in EFFECTS}, "agreement": agreement}


def _spearman(a, b) -> float:
    import numpy as np

    ra, rb = np.argsort(np.argsort(a)), np.argsort(np.argsort(b))
    return float(np.corrcoef(ra, rb)[0, 1])


def release_trajectories(lake, split_of_family: dict[str, str]) -> tuple[list[dict], dict]:
    """The search's best trajectories as multi-step records (root first): the states, and per step its
    strategy, site, parameters and exactness; per state its verification against the original, time
    and speedup over the root with an interval; each step's effect; the search's own figures and the
    machine; `format` says whether every state is in the published LEIR format (`published`) or which
    of the project's extensions it uses (`fast_exp`, `fast_log`, `fast_erf`: released in a config of
    its own). Only
    trajectories whose every state verified (`exact`, or `close` where a step of it reassociates) and
    was timed are released; the second value counts the others by reason."""
    from pathlib import Path

    from flows.storage import read_table
    from leir.analysis import extensions_used
    from leir.parse import parse_program

    lake = Path(lake)
    programs = {p["program_id"]: p for p in read_table(lake, "programs").select(
        ["program_id", "family", "workload", "leir", "dtype"]).to_pylist()}
    steps = {s["step_id"]: s for s in read_table(lake, "trajectory_steps").to_pylist()}
    out, left_out = [], defaultdict(int)
    for t in sorted(read_table(lake, "trajectories").to_pylist(), key=lambda t: t["trajectory_id"]):
        p = programs.get(t["program_id"])
        if p is None:
            continue
        chain = [steps[i] for i in json.loads(t["steps"]) if i in steps]
        verification = json.loads(t["verification"] or "[]")
        times = json.loads(t["times_us"] or "[]")
        reassociating = any(s["exactness"] == "reassociating" for s in chain)
        ok = {"exact", "close"} if reassociating else {"exact"}
        why = ("a state failed verification" if len(verification) != len(chain) or not set(verification) <= ok
               else "a state was not timed" if t["root_us"] is None or None in times or len(times) != len(chain)
               else None)
        used = sorted({x for s in chain for x in extensions_used(parse_program(s["after_leir"]))})
        if why is not None:
            left_out[why] += 1
            continue
        machine = json.loads(t["machine"]) if t.get("machine") else {}
        out.append({"trajectory_id": t["trajectory_id"], "program_id": t["program_id"], "family": p["family"],
                    "workload": p["workload"], "dtype": p["dtype"], "split": split_of_family.get(p["family"], "train"),
                    "driver": t["driver"], "policy": t["policy"], "seed": t["seed"],
                    "states": [p["leir"], *(s["after_leir"] for s in chain)],
                    "strategies": [s["strategy"] for s in chain], "sites": [s["site"] for s in chain],
                    "params": [s["params"] for s in chain], "exactness": [s["exactness"] for s in chain],
                    "verification": verification, "max_abs_err": json.loads(t["max_abs_err"] or "[]"),
                    "times_us": [t["root_us"], *times], "speedups": [1.0, *json.loads(t["speedups"])],
                    "speedups_low": [1.0, *json.loads(t["speedups_low"])],
                    "speedups_high": [1.0, *json.loads(t["speedups_high"])],
                    "step_effects": json.loads(t["step_effects"]), "best_speedup": t["best_speedup"],
                    "steps": len(chain), "search_states": t["search_states"], "search_speedup": t["search_speedup"],
                    "wall_s": t["wall_s"], "machine_id": machine.get("id"), "cpu": machine.get("cpu_model"),
                    "format": "+".join(used) or "published"})
    return out, dict(sorted(left_out.items()))


# --- figures of the card: effects per strategy, claims against effects, chains ---------------------

CONTRADICTION_SPEEDUP = 1.2  # a `none` claim contradicts a `faster` step measured at least this much faster


def contradicts(row: dict) -> bool:
    """Whether a measured step's claim contradicts its effect: `benefit` with `slower`, or `none` with
    `faster` by CONTRADICTION_SPEEDUP or more (an `enabling` claim promises nothing of the step itself)."""
    if row["claim"] == "benefit":
        return row["effect"] == "slower"
    return row["claim"] == "none" and row["effect"] == "faster" and (row["speedup"] or 0) >= CONTRADICTION_SPEEDUP


def effect_shares(rows: list[dict]) -> dict[str, dict]:
    """Per strategy: released steps, measured ones, each effect among those, the resolved ones and the
    claim/effect contradictions among them."""
    from gpu_tasks.effect import EFFECTS, RESOLVED

    out: dict[str, dict] = {}
    for r in rows:
        e = out.setdefault(r["strategy"], {"level": r["level"], "released": 0, "measured": 0, "resolved": 0,
                                           "contradictions": 0, **dict.fromkeys(EFFECTS, 0)})
        e["released"] += 1
        if r["effect"]:
            e["measured"] += 1
            e[r["effect"]] += 1
            e["resolved"] += r["effect"] in RESOLVED
            e["contradictions"] += r["effect"] in RESOLVED and contradicts(r)
    return dict(sorted(out.items()))


def chain_figures(rows: list[dict]) -> dict:
    """The enabling steps: how many, how many have a timed chain, how many pay, are dead ends, or
    unresolved."""
    enabling = [r for r in rows if r["claim"] == "enabling" and r["effect"]]
    return {"enabling": len(enabling), "with_chain": sum(r["chain_speedup"] is not None for r in enabling),
            "chain_faster": sum(r["chain_effect"] == "faster" for r in enabling),
            "taught": sum(r["chain_effect"] == "faster" and r["effect"] != "slower" and chain_beats_step(r)
                          for r in enabling),
            "dead_end": sum(r["dead_end"] is True for r in enabling),
            "undecided": sum(r["dead_end"] is None for r in enabling)}


# --- the card's sections on what was measured: configs and their use, protocol, effects, claims ------

PURPOSES = (
    ("default", "SFT or evaluation on every verified step: `prompt` and `answer` (the published "
                "`<think>...</think><answer>...</answer>` format), one or k options per prompt; deterministic, the "
                "same bytes on any machine, and blind to speed"),
    ("chat", "the same samples as `messages` (user, assistant) for chat SFT tools; deterministic"),
    ("measured", "analysis and process supervision: one row per released step of a CPU program with its record "
                 "(parent, depth, site, parameters, claim), verification, times, speedup with its interval and "
                 "class, and the best chain of an enabling step"),
    ("gpu_steps", "the records of the released steps of programs written for a GPU (CUDA): `measured`'s columns, "
                  "verified on the CPU, never timed (times, effects and chains null: no GPU timed this build)"),
    ("sft", "SFT chosen by measurement: steps that measured `faster` and whose chain of thought gives a reason "
            "(claim `benefit` or `enabling`), never a dead end; enabling steps (not `slower` themselves) whose "
            "chain measured `faster` and above the step alone; and those chains as two-step samples, in the chat "
            "form with their effect columns"),
    ("preference", "DPO (TRL's standard form: `prompt`, `chosen`, `rejected` strings): the chosen step is "
                   "`faster` than the unmodified program and its interval lies wholly above the rejected one's"),
    ("preference_chat", "the same pairs in TRL's conversational form (message lists), matching `chat`"),
    ("trajectories", "process supervision and search research: the search's best multi-step trajectories, "
                     "every state verified against the original and timed, each step with its site and "
                     "parameters so that it replays with `steptp apply`; the published LEIR format only"),
    ("trajectories_fast_exp", "the trajectories that use this project's fast-math extensions (`fast_exp`, "
                              "`fast_log`, `fast_erf`: vectorisable exp, log and erf), outside the published "
                              "format: the same columns"),
)


def configs_section(sizes: dict[str, dict[str, int]]) -> str:
    """What each config is for, with its rows per split (`sizes`: config -> split -> rows)."""
    lines = ["## Configs: what each is for", "", "| config | train | test | for |", "| --- | --- | --- | --- |"]
    for name, purpose in PURPOSES:
        if name in sizes:
            lines.append(f"| `{name}` | {sizes[name].get('train', 0)} | {sizes[name].get('test', 0)} | {purpose} |")
    return "\n".join([*lines, ""])


def measured_section(m) -> str:
    """The card's account of speed (see the module docstring); `m` is `flows.release.Measured`."""
    lines = ["## Measured effects", ""]
    gpu = len(m.gpu_steps)
    gpu_line = (f"{gpu} released steps belong to programs written for a GPU (CUDA): they were verified on the CPU "
                "(LEIR's semantics do not depend on the target)"
                + (f", {m.verified_on_cuda} of them on CUDA too" if m.verified_on_cuda else
                   " only (no GPU was present when they were verified)") + ", and never "
                "timed. Their records are the `gpu_steps` config (`measured`'s columns, times and effects null); "
                "`measured` and the configs made from it hold the steps of CPU programs only."
                + _gpu_only_sentence(m)) if gpu else ""
    if m.machine is None:
        return "\n".join([*lines, "No state was timed: the configs made of measurements are empty.",
                          *([gpu_line] if gpu_line else []), ""])
    lines += [_protocol_paragraph(m), "", *([gpu_line, ""] if gpu_line else []), _agreement_paragraph(m.timing), "",
              "Effects are measurements of this machine: another CPU may rank the same steps differently. The "
              "`default` and `chat` configs never depend on them (two rebuilds give the same bytes on any machine); "
              "`measured`, `sft`, `preference`, `preference_chat` and `trajectories` do.", ""]
    lines += _other_machines_paragraph(m)
    lines += _effect_tables(m)
    lines += _claims_paragraph(m.effects)
    lines += _chains_paragraph(m.effects)
    lines += _preference_paragraph(m)
    lines += _trajectory_paragraph(m)
    lines += _cost_model_paragraph(m)
    return "\n".join(lines)


def _other_machines_paragraph(m) -> list[str]:
    """Where several machines timed the release's states: the rows each holds in `measured`, and how
    many steps each decides."""
    if not m.other_effects:
        return []
    rows = Counter(r["machine_id"] for r in m.effects + m.other_effects if r["machine_id"])
    decides = Counter(r["machine_id"] for r in m.effects if r["machine_id"])
    def who(mid: str) -> str:
        fp = m.other_machines.get(mid, {})
        return fp.get("cpu_model", "unknown CPU") + (f", named `{fp['machine']}`" if fp.get("machine") else "")
    listed = "; ".join(f"`{mid}` ({who(mid)}): {n} rows, deciding {decides[mid]}"
                       for mid, n in sorted(rows.items(), key=lambda kv: (-decides[kv[0]], -kv[1], kv[0])))
    return ["Several machines timed states of this release, each its states in sessions of its own: a step's "
            "effect comes from one machine's timings only (never a state of one machine against a state of "
            "another). `measured` holds one row per step and machine that timed it (`machine_id`); the row "
            "that decides (what `sft` and `preference` are made of, and the tables below) is the one of the "
            f"machine that timed most states among those that timed the step. By machine: {listed}. Compare "
            "machines on the steps they share.", ""]


def _protocol_paragraph(m) -> str:
    t, machine = m.timing, m.machine
    p = t.get("protocol", {})
    margin = 100 * float(p.get("noise_margin", 0.05))
    return (f"Every state of a program written for the CPU that the release refers to (the originals, each "
            f"released step's before and after state, and the after-state of each verified follow-up of an enabling "
            f"step) was timed on one machine: **{machine.get('cpu_model')}**, {machine.get('tvm_threads')} TVM "
            "threads, TVM "
            f"{machine.get('tvm_version')}, target `{machine.get('target')}` (fingerprint `{machine.get('id')}`). "
            "One original program's states were measured in one session, interleaved (round r times every state "
            "once, the order reversed every other round), each sample a batch of back-to-back runs calibrated to "
            f"last {p.get('min_repeat_ms', '?')} ms. Rounds: at least {p.get('min_rounds', '?')}, "
            "then more while a step's interval is undecided and wider than "
            f"{100 * (float(p.get('tight', 1.025)) - 1):.1f}% (an interval already that tight that straddles a "
            "bound below stays `unresolved`: more rounds would not move it), at most "
            f"{p.get('max_rounds', '?')} or until the program's session ran out of time: every timed state "
            f"has {t.get('rounds_min')} to {t.get('rounds_max')} rounds (median {t.get('rounds_median'):g}; "
            f"{t.get('at_max_rounds', 0)} of {t.get('rows', 0)} rows reached the cap). **A step's effect comes from "
            f"an interval**: the {100 * float(p.get('level', 0.95)):.0f}% bootstrap interval of its speedup over "
            "the rounds (resampled by round where both states were timed in one session: the speedup is then the "
            "median of the rounds' before/after, so it may differ from `before_us / after_us`, each side's own "
            "median: compare steps by `speedup`). `faster` when the whole interval lies above "
            f"1 + {margin:.0f}%, `slower` when it lies below 1 / (1 + {margin:.0f}%), `neutral` when it lies within "
            "those bounds, `unresolved` otherwise (never `neutral` by default). **Per nest or whole**: a state's "
            "time is the sum of its top-level nests' times (each nest compiled once for all the states of its "
            "program and run on the values the nests before it computed); a step with a side under "
            f"{p.get('whole_below_us', 5):g} µs per call, or that changes the number of nests"
            f"{_changed_below(p)}, is compared on both states "
            f"timed whole, as one function: {t.get('steps_by_unit', {}).get('state', 0)} of the timed steps, the "
            f"other {t.get('steps_by_unit', {}).get('nest', 0)} on nest sums (`timing_unit` in `measured`).")


def _changed_below(protocol: dict) -> str:
    """The bound on a step that changes the number of nests (none before the protocol had one)."""
    bound = float(protocol.get("whole_changed_below_us", math.inf))
    return f" with a side under {bound:g} µs" if math.isfinite(bound) else ""


def _agreement_paragraph(t: dict) -> str:
    a = t.get("agreement")
    if not a:
        return "No state was timed both per nest and whole."
    return (f"Per nest against whole, on the {a['states']} states timed both ways in the same sessions (a seeded "
            f"sample, and the states of the steps compared whole): Spearman {a['spearman']:.3f} between the two "
            f"times, nest sum / whole median {a['median_ratio']:.3f} (10th-90th percentile {a['p10_ratio']:.3f}-"
            f"{a['p90_ratio']:.3f}), {100 * a['within_10pct']:.0f}% within 10%.")


def _gpu_only_sentence(m) -> str:
    """The strategies whose released steps all belong to GPU programs: none of them was timed."""
    on_cpu = Counter(r["strategy"] for r in m.effects)
    only = sorted(Counter(r["strategy"] for r in m.gpu_steps).items())
    only = [(k, n) for k, n in only if not on_cpu.get(k)]
    if not only:
        return ""
    return (" Strategies released only in GPU programs, so with no measured effect: "
            + ", ".join(f"{k} ({n} steps)" for k, n in only) + ".")


def _effect_tables(m) -> list[str]:
    shares = effect_shares(m.effects)
    by_level: dict[str, Counter] = {}
    for e in shares.values():
        agg = by_level.setdefault(e["level"], Counter())
        for k in ("measured", "faster", "neutral", "slower", "unresolved"):
            agg[k] += e[k]
    measured = sum(1 for e in m.effects if e["effect"])
    counts = m.timing.get("effects") or {}
    lines = [f"{measured} of {len(m.effects)} released steps of CPU programs have a measured effect: "
             + ", ".join(f"{n} {k}" for k, n in counts.items()) + ".", "",
             "| level | timed steps | faster | neutral | slower | unresolved |",
             "| --- | --- | --- | --- | --- | --- |"]
    lines += [f"| {lv} | {a['measured']} | {_pct(a['faster'], a['measured'])} | {_pct(a['neutral'], a['measured'])} | "
              f"{_pct(a['slower'], a['measured'])} | {_pct(a['unresolved'], a['measured'])} |"
              for lv, a in sorted(by_level.items())]
    chosen = Counter(p["chosen_strategy"] for p in m.preference)
    rejected = Counter(p["rejected_strategy"] for p in m.preference)
    lines += ["", "| strategy | released (CPU programs) | timed | faster | neutral | slower | unresolved | "
              "claim/effect contradictions | preference pairs (chosen / rejected) |",
              "| --- | --- | --- | --- | --- | --- | --- | --- | --- |"]
    lines += [f"| {k} | {e['released']} | {e['measured']} | {e['faster']} | {e['neutral']} | {e['slower']} | "
              f"{e['unresolved']} | {e['contradictions']} of {e['resolved']} | {chosen.get(k, 0)} / "
              f"{rejected.get(k, 0)} |" for k, e in shares.items()]
    return [*lines, ""]


def _claims_paragraph(rows: list[dict]) -> list[str]:
    shares = effect_shares(rows)
    resolved = sum(e["resolved"] for e in shares.values())
    bad = sum(e["contradictions"] for e in shares.values())
    claims = Counter(r["claim"] for r in rows if r["effect"])
    per_claim = {c: Counter(r["effect"] for r in rows if r["effect"] and r["claim"] == c) for c in CLAIMS}
    shares_text = "; ".join(
        f"`{c}` steps measured " + ", ".join(f"{_pct(per_claim[c][k], claims.get(c, 0))} {k}" for k in EFFECTS)
        for c in CLAIMS if claims.get(c))
    faster_none = per_claim["none"]["faster"]
    return [f"**Claims against effects.** Each chain of thought claims a `benefit` (a figure of the static "
            f"analysis improves on the target and a static estimate of the cycles where the step acts is "
            f"at least 1.1x lower), `enabling` (nothing pays by itself; it names the steps it makes legal "
            f"next) or `none` (column `claim`; {claims.get('benefit', 0)}, {claims.get('enabling', 0)} and "
            f"{claims.get('none', 0)} of the timed steps). A claim contradicts the clock when a `benefit` step "
            f"measured `slower`, or a `none` step `faster` by 1.2x or more: {bad} of the {resolved} resolved timed "
            f"steps ({_pct1(bad, resolved)}; per strategy in the table above). A claim is what the static analysis "
            f"expects, not a prediction of the clock: {shares_text}. `sft` leaves out the {faster_none} `faster` steps "
            "whose chain of thought claims `none` (their answer gives no reason to make them). The chains of thought "
            "never cite a timing: a model cannot measure at inference.", ""]


def _chains_paragraph(rows: list[dict]) -> list[str]:
    c = chain_figures(rows)
    if not c["enabling"]:
        return ["No timed step claims to enable another.", ""]
    return [f"**Chains.** Of the {c['enabling']} timed enabling steps, {c['with_chain']} have a timed chain (the "
            "step followed by one of the steps it names, made on its after-state, verified against the original "
            "and timed in the same session; `chain_speedup` is the best such speedup over the step's before-state "
            f"and `chain_step_id` the follow-up that achieved it): {c['chain_faster']} pay (`chain_effect` "
            f"`faster`), {c['dead_end']} are dead ends (`dead_end`: no follow-up pays, every one resolved, or none "
            f"verified), {c['undecided']} undecided. Of the chains that pay, the {c['taught']} whose first step is not "
            "`slower` by itself and whose interval lies wholly above that step's own (the follow-up adds speed "
            "to what the step gives alone) are in `sft` as samples of the published multi-answer format, each "
            "answer applied to the one before (`kind = 'chain'`).", ""]


def _preference_paragraph(m) -> list[str]:
    prompts = len({p["prompt"] for p in m.preference})
    rejected = Counter(p["rejected_effect"] for p in m.preference)
    return [f"`preference`: {len(m.preference)} pairs from {prompts} prompts (at most {m.preference_per_prompt} "
            "per prompt, `release.preference_pairs_per_prompt`, the largest speedup ratio first). Every chosen "
            "answer is `faster` than the unmodified program and its speedup interval lies wholly above the "
            "rejected answer's (both against the same before-state); rejected answers are "
            + ", ".join(f"{n} {k}" for k, n in sorted(rejected.items())) + ". Compare the two answers by their "
            "speedups (`margin` is their ratio): `chosen_us` and `rejected_us` are each in its own step's timing "
            "unit (the state timed whole, or the sum of its nests' times, as `measured`'s `timing_unit` says), so two "
            "of them need not be comparable. `preference_chat` holds the same pairs in TRL's conversational form.",
            ""]


def _trajectory_paragraph(m) -> list[str]:
    left = m.trajectories_left_out
    steps = sum(t["steps"] for t in m.trajectories)
    published = sum(t["format"] == "published" for t in m.trajectories)
    kept = (f"`trajectories`: {published} multi-step records of the search in the published LEIR format, "
            f"`trajectories_fast_exp`: {len(m.trajectories) - published} that use a fast-math extension "
            f"({steps} steps in all). After the "
            "search, every state was verified against the original on the verify stage's protocol (columns "
            "`verification`, `max_abs_err`) and all states of one program's trajectories were timed whole in "
            "one session on the protocol above (`times_us`, `speedups` over the root with `speedups_low` and "
            "`speedups_high`, each step's `step_effects`); `search_speedup` is the search's own figure. Each step "
            "has its strategy, `sites` and `params`: `steptp apply STRATEGY STATE --site SITE --params PARAMS` "
            "replays it byte for byte.")
    below = sum(t["speedups"][-1] < t["best_speedup"] for t in m.trajectories if t["speedups"])
    slower = sum(e == "slower" for t in m.trajectories for e in t["step_effects"])
    if below or slower:
        kept += (f" A trajectory is the search's path to the best state it measured; timed again, {below} of them end "
                 f"below one of their own earlier states and {slower} of their steps measured `slower` (column "
                 "`step_effects`): for process supervision, label steps by `step_effects`, not by their place on "
                 "the path.")
    if left:
        kept += " Not released: " + ", ".join(f"{n} trajectories ({why})" for why, n in left.items()) + "."
    return [kept, ""]


def _cost_model_paragraph(m) -> list[str]:
    if m.cost_model is None:
        return []
    q = m.cost_model_quality or {}
    reg = q.get("regressor") or {}
    return ["`cost_model.json`: the offline cost model of this machine (`search.cost_model.PriorModel.load`), "
            "trained on every timed state: a regressor of a state's log2 µs from LEIR-tree features, and a ranker "
            "(XGBoost `rank:pairwise` over the states of each program beside their original, from the tree "
            "features and the parts of the static estimate) that `steptp search` starts from. On families it "
            f"never saw (trained on the train split's families): the regressor's Spearman {_num(q.get('spearman'))} "
            f"between predicted and measured times over {q.get('test_states', 0)} held-out states (across "
            f"programs, where size decides most of it); within one program the ranker's median Spearman is "
            f"{_num(q.get('spearman_within_program'))} over {q.get('programs_within', 0)} held-out programs (the "
            f"regressor's {_num(reg.get('spearman_within_program'))}), and a program's fastest measured state is "
            f"the ranker's first in {_num(q.get('top1_recall'))} of them and among its first five in "
            f"{_num(q.get('top5_recall'))}." + _family_sentence(q.get("per_family"))
            + _static_sentence(q.get("static_estimate")), ""]


def _family_sentence(per_family: dict | None) -> str:
    """The ranker's within-program Spearman per held-out family, weakest first: the aggregate hides them."""
    rows = sorted(((f, v) for f, v in (per_family or {}).items() if v.get("spearman_within_program") is not None),
                  key=lambda fv: (fv[1]["spearman_within_program"], fv[0]))
    if not rows:
        return ""
    return (" Per held-out family, weakest first (within-program Spearman, programs): "
            + ", ".join(f"{f} {_num(v['spearman_within_program'])} ({v.get('programs_within', 0)})" for f, v in rows)
            + ".")


def _static_sentence(q: dict | None) -> str:
    if not q:
        return ""
    return (" Without any training, the static estimate the chains of thought reason from "
            "(`strategies.analysis.cost.estimated_cycles`) ranks the same held-out states with Spearman "
            f"{_num(q.get('spearman'))} over all, {_num(q.get('spearman_within_program'))} within one program, "
            f"top-1 {_num(q.get('top1_recall'))} and top-5 {_num(q.get('top5_recall'))}: the baseline a learned "
            "ranking has to beat.")


def _pct(n: int, total: int) -> str:
    return f"{100 * n / total:.0f}%" if total else "-"


def _pct1(n: int, total: int) -> str:
    return f"{100 * n / total:.1f}%" if total else "-"


def _num(x) -> str:
    return "n/a" if x is None else f"{x:.2f}"
