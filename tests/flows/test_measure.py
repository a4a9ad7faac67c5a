"""Which states the measure stage times and compares, and what the release derives from their samples:
effects from intervals, the unit a comparison is made in, chains of enabling steps,
the `sft` selection and preference pairs."""
from __future__ import annotations

import json

import pytest

from flows.measure import Timed, TimingIndex, choose_agreement_states, effect_rows, reusable, state_groups, state_ids
from flows.measured import ReleasedSteps, contradicts, preference_pairs, released_effect_rows, sft_rows


def step(step_id, program, before, after, after_id, parent=None, strategy="loop_split", claim="none", depth=0):
    return {"step_id": step_id, "program_id": program, "parent_step_id": parent, "before_leir": before,
            "after_leir": after, "after_program_id": after_id, "strategy": strategy, "claim": claim, "depth": depth,
            "level": "operator", "site": "{}", "params": "{}", "enables": "[]", "exactness": "exact",
            "cot": f"<think>{step_id}</think><answer>{{}}</answer>"}


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
    assert list(groups[0].pairs) == [("p1", "q1"), ("q0", "q3")]  # each comparison once
    assert groups[1].states == {"p2": "orig2", "q4": "c2"}
    after_of = {s["step_id"]: s["after_program_id"] for s in steps}
    assert state_ids(steps[3], after_of) == ("q0", "q3")


def test_a_follow_up_adds_its_after_state_and_its_chain_from_the_enabling_steps_before_state():
    programs = [{"program_id": "p1", "family": "gemm", "signature": "{}", "leir": "orig1"}]
    released = [step("s1", "p1", "orig1", "a1", "q1", claim="enabling")]
    follow = [{**step("f1", "p1", "a1", "b1", "r1", parent="s1", depth=1), "status": "exact"},
              {**step("f9", "p9", "x", "y", "r9", parent="s9", depth=1), "status": "exact"}]  # not of a released step
    [group] = state_groups(programs, released, released, follow_ups=follow)
    assert group.states == {"p1": "orig1", "q1": "a1", "r1": "b1"}
    assert list(group.pairs) == [("p1", "q1"), ("p1", "r1")]


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


def test_the_agreement_sample_is_seeded_and_spans_the_groups():
    programs = [{"program_id": f"p{i}", "family": "gemm", "signature": "{}", "leir": f"o{i}"} for i in range(4)]
    steps = [step(f"s{i}{k}", f"p{i}", f"o{i}", f"a{i}{k}", f"q{i}{k}") for i in range(4) for k in range(5)]
    picks = []
    for _ in range(2):
        groups = state_groups(programs, steps, steps)
        choose_agreement_states(groups, 7, seed=3)
        picks.append([sorted(g.whole) for g in groups])
    assert picks[0] == picks[1] and sum(len(w) for w in picks[0]) == 7
    assert all(set(w) <= set(g.states) for w, g in zip(picks[0], groups, strict=True))


# --- comparisons: the unit, the pairing, the interval --------------------------------------------

def row(state, unit, samples, n_nests=1, session="s", status="ok"):
    return {"state_id": state, "unit": unit, "status": status, "samples_us": list(samples),
            "time_us": sorted(samples)[len(samples) // 2], "n_nests": n_nests, "session_id": session,
            "protocol": json.dumps({"whole_below_us": 5.0})}


STEADY = [100.0, 101.0, 99.0, 100.5, 99.5, 100.2]


def test_a_comparison_uses_nest_sums_unless_the_nests_change_or_a_side_is_small():
    index = TimingIndex([row("a", "nest", STEADY), row("b", "nest", [50.0, 50.4, 49.6, 50.1, 49.9, 50.2]),
                         row("c", "nest", [40.0] * 6, n_nests=2), row("c", "state", [30.0, 30.1, 29.9, 30.0, 30.2, 29.8],
                                                                           n_nests=2),
                         row("a", "state", [90.0, 90.1, 89.9, 90.0, 90.2, 89.8]),
                         row("t", "nest", [2.0, 2.01, 1.99, 2.0, 2.0, 2.0]), row("u", "nest", [1.0] * 6)])
    assert index.unit_for("a", "b") == "nest"
    assert index.unit_for("a", "c") == "state"            # the step changes the number of nests
    assert index.unit_for("t", "u") == "state"            # a side under 5 µs per call
    fast = index.compare("a", "b", "k")
    assert fast.effect == "faster" and fast.unit == "nest" and fast.paired and fast.speedup == pytest.approx(2.0, rel=0.02)
    assert index.compare("a", "c", "k").speedup == pytest.approx(3.0, rel=0.02)  # whole states: 90 / 30
    assert index.compare("t", "u", "k").effect is None    # no whole-state rows: not measured


def test_a_change_in_the_number_of_nests_is_compared_whole_only_under_the_protocols_bound():
    bounded = json.dumps({"whole_below_us": 5.0, "whole_changed_below_us": 500.0})
    long_sides = [row("a", "nest", [900.0] * 6), row("f", "nest", [600.0, 601.0, 599.0, 600.0, 600.0, 600.0], n_nests=2)]
    short_sides = [row("b", "nest", [300.0] * 6), row("g", "nest", [200.0] * 6, n_nests=2)]
    index = TimingIndex([{**r, "protocol": bounded} for r in long_sides + short_sides])
    assert index.unit_for("a", "f") == "nest"    # both sides 500 µs or more: nest sums decide
    assert index.compare("a", "f", "k").speedup == pytest.approx(1.5, rel=0.01)
    assert index.unit_for("b", "g") == "state"   # a side under the bound: whole states
    older = TimingIndex(long_sides)              # rows of a protocol without the bound: every change whole
    assert older.unit_for("a", "f") == "state"


def test_sides_from_two_sessions_are_compared_unpaired_and_missing_rounds_leave_a_step_unresolved():
    index = TimingIndex([row("a", "nest", STEADY, session="s1"), row("b", "nest", [50.0] * 6, session="s2"),
                         row("c", "nest", [50.0, 50.0, 50.0], session="s1")])
    across = index.compare("a", "b", "k")
    assert not across.paired and across.effect == "faster"
    assert index.compare("a", "c", "k").effect == "unresolved"  # three rounds give no interval


def effect_row(step_id, effect, speedup, low, high, kind="step", parent=None, after="x", after_us=10.0):
    return {"step_id": step_id, "kind": kind, "parent_step_id": parent, "effect": effect, "speedup": speedup,
            "speedup_low": low, "speedup_high": high, "before_us": 100.0, "after_us": after_us, "timing_unit": "nest",
            "paired": True, "rounds": 5, "after_state_id": after}


PROGRAMS = {"p1": {"program_id": "p1", "family": "gemm", "target": "llvm", "signature": "{}"}}


def measured(released, effects, follow_ups=()):
    after_of = {s["step_id"]: s["after_program_id"] for s in released}
    steps = ReleasedSteps(released, after_of, PROGRAMS, {}, {})
    return {r["step_id"]: r for r in released_effect_rows(steps, effects, list(follow_ups), "m", "llvm")}


def test_an_enabling_step_keeps_its_best_chain_and_a_dead_end_says_so():
    released = [step("e1", "p1", "o", "a1", "q1", claim="enabling"), step("e2", "p1", "o", "a2", "q2", claim="enabling"),
                step("e3", "p1", "o", "a3", "q3", claim="enabling"), step("b1", "p1", "o", "a4", "q4", claim="benefit")]
    follow = [{**step(f, "p1", "a", "b", f"r{f}", parent=p), "status": "exact", "strategy": f"s-{f}"}
              for f, p in (("f1", "e1"), ("f2", "e1"), ("f3", "e2"))]
    effects = [effect_row("e1", "neutral", 1.0, 0.98, 1.02), effect_row("e2", "neutral", 1.0, 0.98, 1.02),
               effect_row("e3", "neutral", 1.0, 0.98, 1.02), effect_row("b1", "faster", 2.0, 1.9, 2.1),
               effect_row("f1", "neutral", 1.01, 0.99, 1.03, kind="chain", parent="e1"),
               effect_row("f2", "faster", 1.8, 1.7, 1.9, kind="chain", parent="e1"),
               effect_row("f3", "slower", 0.5, 0.45, 0.55, kind="chain", parent="e2")]
    rows = measured(released, effects, follow)
    assert rows["e1"]["chain_step_id"] == "f2" and rows["e1"]["chain_effect"] == "faster"
    assert rows["e1"]["chain_speedup"] == 1.8 and rows["e1"]["dead_end"] is False
    assert rows["e2"]["dead_end"] is True and rows["e2"]["chain_effect"] == "slower"   # its one chain loses
    assert rows["e3"]["dead_end"] is True and rows["e3"]["chain_speedup"] is None      # nothing it enables verified
    assert rows["b1"]["dead_end"] is None and rows["b1"]["chain_speedup"] is None      # claims no enabling


def sample(sample_id, prompt, step_ids, split="train"):
    return {"sample_id": sample_id, "prompt": prompt, "answer": f"answer of {step_ids}", "split": split,
            "step_ids": json.dumps(step_ids)}


def test_sft_holds_faster_steps_enabling_steps_whose_chain_pays_and_those_chains_never_a_slower_step():
    released = [step(k, "p1", "o", f"a{k}", f"q{k}", claim=c) for k, c in
                (("fast", "benefit"), ("slow", "benefit"), ("en", "enabling"), ("en_slow", "enabling"),
                 ("dead", "enabling"), ("flat", "none"), ("dead_fast", "enabling"), ("lucky", "none"), ("loses", "enabling"))]
    follow = [{**step(f"f-{p}", "p1", "a", "b", f"r{p}", parent=p), "status": "exact"}
              for p in ("en", "en_slow", "dead", "dead_fast", "loses")]
    effects = [effect_row("fast", "faster", 2.0, 1.8, 2.2), effect_row("slow", "slower", 0.5, 0.4, 0.6),
               effect_row("en", "neutral", 1.0, 0.98, 1.02), effect_row("en_slow", "slower", 0.8, 0.7, 0.9),
               effect_row("dead", "neutral", 1.0, 0.99, 1.01), effect_row("flat", "neutral", 1.0, 0.99, 1.01),
               effect_row("f-en", "faster", 3.0, 2.5, 3.5, kind="chain", parent="en"),
               effect_row("f-en_slow", "faster", 1.5, 1.3, 1.7, kind="chain", parent="en_slow"),
               effect_row("f-dead", "neutral", 1.0, 0.99, 1.01, kind="chain", parent="dead"),
               effect_row("dead_fast", "faster", 1.5, 1.4, 1.6),  # faster alone, yet justified by a dead end
               effect_row("lucky", "faster", 1.3, 1.2, 1.4),  # faster, but its chain of thought claims nothing
               effect_row("loses", "faster", 4.8, 4.5, 5.1),  # faster alone; its follow-up gives much of it back
               effect_row("f-loses", "faster", 1.8, 1.7, 1.9, kind="chain", parent="loses"),
               effect_row("f-dead_fast", "slower", 0.5, 0.4, 0.6, kind="chain", parent="dead_fast")]
    rows = list(measured(released, effects, follow).values())
    samples = [sample(f"x-{s['step_id']}", "P", [s["step_id"]]) for s in released]
    out = sft_rows(samples, rows, lambda m: f"chain prompt {m['step_id']}", lambda m: f"chain answer {m['step_id']}")
    kinds = sorted((r["kind"], json.loads(r["step_ids"])[0]) for r in out)
    # en_slow's chain pays, but its first step alone is slower: neither the step nor the chain is taught
    # loses is taught as a step (faster, a reason), not its chain: the chain pays less than the step alone
    assert kinds == [("chain", "en"), ("step", "en"), ("step", "fast"), ("step", "loses")]
    assert all(r["effect"] != "slower" for r in out) and "dead" not in str(out) and "lucky" not in str(out)
    chain = next(r for r in out if r["kind"] == "chain" and "en" == json.loads(r["step_ids"])[0])
    assert json.loads(chain["step_ids"]) == ["en", "f-en"] and chain["effect"] == "faster" and chain["speedup"] == 3.0
    assert chain["messages"] == [{"role": "user", "content": "chain prompt en"},
                                 {"role": "assistant", "content": "chain answer en"}]


def test_preference_pairs_choose_a_faster_answer_whose_interval_lies_above_the_rejected_one():
    samples = [sample("x1", "P", ["a"]), sample("x2", "P", ["b"]), sample("x3", "P", ["c"]),
               sample("x4", "Q", ["d"]), sample("x5", "Q", ["e"]), sample("x6", "P", ["a", "b"])]  # multi: never
    effects = [{**effect_row("a", "faster", 2.0, 1.8, 2.2), "strategy": "s"},
               {**effect_row("b", "neutral", 1.0, 0.97, 1.03), "strategy": "s"},
               {**effect_row("c", "faster", 1.9, 1.7, 2.1), "strategy": "s"},    # overlaps a: never a pair of the two
               {**effect_row("d", "neutral", 1.02, 0.99, 1.04), "strategy": "s"},  # Q has no faster answer
               {**effect_row("e", "slower", 0.5, 0.45, 0.55), "strategy": "s"}]
    pairs = preference_pairs(samples, effects, per_prompt=4)
    assert [(p["chosen_step_id"], p["rejected_step_id"]) for p in pairs] == [("a", "b"), ("c", "b")]
    for p in pairs:
        assert p["chosen_effect"] == "faster" and p["chosen_speedup_low"] > p["rejected_speedup_high"]
    assert pairs[0]["chosen"] == "answer of ['a']" and pairs[0]["rejected"] == "answer of ['b']"
    assert len(preference_pairs(samples, effects, per_prompt=1)) == 1
    # answers decided on two machines are never compared: b's effect timed elsewhere leaves a, c unpaired
    elsewhere = [{**e, "machine_id": "B" if e["step_id"] == "b" else "A"} for e in effects]
    assert preference_pairs(samples, elsewhere, per_prompt=4) == []


@pytest.mark.parametrize("claim, effect, speedup, expected", [
    ("benefit", "slower", 0.8, True), ("benefit", "neutral", 1.0, False), ("benefit", "faster", 2.0, False),
    ("none", "faster", 1.25, True), ("none", "faster", 1.1, False), ("none", "slower", 0.5, False),
    ("enabling", "slower", 0.5, False), ("enabling", "faster", 3.0, False),
])
def test_a_claim_contradicts_the_clock_only_by_the_issues_rule(claim, effect, speedup, expected):
    assert contradicts({"claim": claim, "effect": effect, "speedup": speedup}) is expected


def test_effect_rows_of_steps_and_chains_and_a_group_reused_only_whole_from_one_session():
    released = [step("s1", "p1", "o", "a1", "q1", claim="enabling")]
    follow = [{**step("f1", "p1", "a1", "b1", "r1", parent="s1"), "status": "exact"}]
    rows = [row("p1", "nest", STEADY), row("q1", "nest", [99.0, 100.0, 101.0, 100.0, 99.5, 100.5]),
            row("r1", "nest", [50.0, 50.5, 49.5, 50.0, 50.2, 49.8])]
    out = effect_rows(released, follow, {"s1": "q1"}, Timed(TimingIndex(rows), "m", "llvm", {"p1": "gemm"}))
    assert [(r["step_id"], r["kind"], r["effect"]) for r in out] == [("f1", "chain", "faster"), ("s1", "step", "neutral")]
    programs = [{"program_id": "p1", "family": "gemm", "signature": "{}", "leir": "o"}]
    [group] = state_groups(programs, released, released, follow_ups=follow)
    by_key = {(r["state_id"], r["unit"]): {**r, "status": "ok"} for r in rows}
    cfg = {"unit": "nest"}
    assert reusable(group, by_key, cfg) is not None
    by_key[("r1", "nest")] = {**by_key[("r1", "nest")], "session_id": "another"}
    assert reusable(group, by_key, cfg) is None   # a comparison is made within one session
    del by_key[("r1", "nest")]
    assert reusable(group, by_key, cfg) is None


def test_the_card_gives_the_rankers_figures_beside_the_regressors_and_each_held_out_family_weakest_first():
    from types import SimpleNamespace

    from flows.measured import _cost_model_paragraph

    family = {"states": 40, "spearman": 0.9, "top1_recall": 0.5, "top5_recall": 1.0}
    quality = {"spearman": 0.91, "test_states": 100, "spearman_within_program": 0.6, "programs_within": 12,
               "top1_recall": 0.5, "top5_recall": 0.83, "regressor": {"spearman_within_program": 0.29},
               "per_family": {"layout": {**family, "spearman_within_program": 0.75, "programs_within": 7},
                              "indexing": {**family, "spearman_within_program": 0.43, "programs_within": 5},
                              "tiny": {**family, "spearman_within_program": None, "programs_within": 0}}}
    text = _cost_model_paragraph(SimpleNamespace(cost_model="cost_model.json", cost_model_quality=quality))[0]
    assert "the ranker's median Spearman is 0.60 over 12 held-out programs (the regressor's 0.29)" in text
    assert "weakest first (within-program Spearman, programs): indexing 0.43 (5), layout 0.75 (7)." in text
    assert "tiny" not in text  # a family with no program of 3 states is not ranked


def test_each_step_is_decided_by_the_first_machine_that_timed_it_and_the_others_are_kept_beside():
    """A build spread over machines: the machine that timed most states decides the steps it timed;
    a step only another machine timed is decided by that machine; every other timed row is kept."""
    from flows.measured import deciding_rows, ranked_machines

    def row(step, machine):
        return {"step_id": step, "machine_id": machine}
    a = [row("s1", "A"), row("s2", "A"), row("s3", None), row("s4", None)]    # A did not time s3, s4
    b = [row("s1", "B"), row("s2", None), row("s3", "B"), row("s4", None)]    # nobody timed s4
    deciding, others = deciding_rows([a, b])
    assert [(r["step_id"], r["machine_id"]) for r in deciding] == [("s1", "A"), ("s2", "A"), ("s3", "B"), ("s4", None)]
    assert [(r["step_id"], r["machine_id"]) for r in others] == [("s1", "B")]
    assert deciding_rows([a]) == (a, [])                                      # one machine: its rows, as ever
    timings = [{"machine_id": m, "state_id": s, "status": "ok"} for m, s in
               [("B", "x"), ("B", "y"), ("A", "x"), ("A", "y"), ("A", "z"), ("C", "q"), ("B", "y")]]
    assert ranked_machines(timings, {"x", "y", "z"}) == ["A", "B"]            # C timed no wanted state
    assert ranked_machines(timings[:4], {"x", "y"}) == ["A", "B"]             # a tie: the smaller id
