"""Which states the measure stage times, and what the release derives from their times (issue 24)."""
from __future__ import annotations

import json

from flows.measure import preference_pairs, state_groups, state_ids


def step(step_id, program, before, after, after_id, parent=None, strategy="loop_split"):
    return {"step_id": step_id, "program_id": program, "parent_step_id": parent, "before_leir": before,
            "after_leir": after, "after_program_id": after_id, "strategy": strategy}


def test_states_are_the_originals_and_each_released_steps_two_states_once():
    programs = [{"program_id": "p1", "family": "gemm", "signature": "{}", "leir": "orig1"},
                {"program_id": "p2", "family": "norm", "signature": "{}", "leir": "orig2"}]
    inline = step("s0", "p1", "orig1", "inlined", "q0", strategy="compute_inline")   # not released
    steps = [inline,
             step("s1", "p1", "orig1", "a1", "q1"),
             step("s2", "p1", "orig1", "a1", "q1", strategy="loop_tiling"),   # same result: one state
             step("s3", "p1", "inlined", "b1", "q3", parent="s0"),             # starts from s0's result
             step("s4", "p2", "orig2", "c2", "q4")]
    groups = state_groups(programs, steps, steps[1:])
    assert [g.program_id for g in groups] == ["p1", "p2"]
    assert groups[0].states == {"p1": "orig1", "q1": "a1", "q0": "inlined", "q3": "b1"}
    assert groups[1].states == {"p2": "orig2", "q4": "c2"}
    after_of = {s["step_id"]: s["after_program_id"] for s in steps}
    assert state_ids(steps[3], after_of) == ("q0", "q3")


def test_a_gpu_programs_states_are_not_timed_on_the_cpu():
    programs = [{"program_id": "p1", "family": "gemm", "signature": "{}", "leir": "orig1", "target": "cuda"},
                {"program_id": "p2", "family": "norm", "signature": "{}", "leir": "orig2", "target": "llvm"},
                {"program_id": "p3", "family": "norm", "signature": "{}", "leir": "orig3"}]  # an older lake
    steps = [step("s1", "p1", "orig1", "a1", "q1"), step("s2", "p2", "orig2", "b2", "q2"),
             step("s3", "p3", "orig3", "c3", "q3")]
    assert [g.program_id for g in state_groups(programs, steps, steps, "llvm")] == ["p2", "p3"]
    assert [g.program_id for g in state_groups(programs, steps, steps, "cuda")] == ["p1", "p3"]
    assert [g.program_id for g in state_groups(programs, steps, steps)] == ["p1", "p2", "p3"]


def test_groups_come_family_by_family_so_a_killed_run_keeps_each_finished_family():
    programs = [{"program_id": p, "family": f, "signature": "{}", "leir": f"orig-{p}"}
                for p, f in (("a1", "norm"), ("a2", "gemm"), ("a3", "norm"), ("a4", "conv"))]
    steps = [step(f"s{i}", p["program_id"], p["leir"], f"after-{i}", f"q{i}") for i, p in enumerate(programs)]
    groups = state_groups(programs, steps, steps)
    assert [(g.family, g.program_id) for g in groups] == [("conv", "a4"), ("gemm", "a2"), ("norm", "a1"),
                                                          ("norm", "a3")]


def effect(step_id, after_us, spread=0.01, strategy="loop_split"):
    return {"step_id": step_id, "after_us": after_us, "before_us": 100.0, "spread": spread, "strategy": strategy}


def sample(sample_id, prompt, step_ids, split="train"):
    return {"sample_id": sample_id, "prompt": prompt, "answer": f"answer of {step_ids}", "split": split,
            "step_ids": json.dumps(step_ids)}


def test_preference_pairs_choose_the_faster_answer_beyond_the_spread():
    samples = [sample("x1", "P", ["a"]), sample("x2", "P", ["b"]), sample("x3", "P", ["c"]),
               sample("x4", "Q", ["d"]), sample("x5", "Q", ["e"]),
               sample("x6", "P", ["a", "b"])]                      # multi-answer: never a pair member
    effects = [effect("a", 50.0), effect("b", 100.0), effect("c", 51.0), effect("d", 10.0, spread=0.2),
               effect("e", 12.0, spread=0.2)]
    pairs = preference_pairs(samples, effects, per_prompt=4)
    assert [(p["chosen_step_id"], p["rejected_step_id"]) for p in pairs] == [("a", "b"), ("c", "b")]
    assert all(p["prompt"] == "P" and p["margin"] > 1.9 for p in pairs)  # a vs c (2%) and d vs e (20% < 2x spread): no pair
    assert pairs[0]["chosen"] == "answer of ['a']" and pairs[0]["rejected"] == "answer of ['b']"
    assert len(preference_pairs(samples, effects, per_prompt=1)) == 1
