"""The GX release gate passes a sound release and refuses each kind of corruption with a readable reason."""
from __future__ import annotations

import json

import pandas as pd
import pytest

from expectations.release_gate import check_release
from flows.config import load_params
from strategies.cot import answer


def release(n=6):
    """A small consistent release: steps of three strategies over three families, one sample per step."""
    from leir import Signature, parse_program
    from strategies.base import Context
    from strategies.registry import get

    sig = Signature.from_json({"tensors": [{"name": "A", "shape": [4, 6], "dtype": "float64", "role": "input"},
                                           {"name": "C", "shape": [6, 5], "dtype": "float64", "role": "input"},
                                           {"name": "D", "shape": [4, 5], "dtype": "float64", "role": "output"}]})
    text = "B^{4}_{tx=0}L^{5}_{a=0}L^{6}_{c=0}[D^{f64,g}_{tx,a}=D^{f64,g}_{tx,a}+A^{f64,g}_{tx,c}*C^{f64,g}_{c,a};];"
    t = next(get("loop_parallelization").transformations(Context(parse_program(text), sig)))
    strategies = ["loop_parallelization", "loop_split", "compute_inline"]
    steps, samples = [], []
    for i in range(n):
        s = strategies[i % 3]
        steps.append({"step_id": f"s{i}", "program_id": f"p{i}", "strategy": s,
                      "level": "graph" if s == "compute_inline" else "operator", "before_leir": text,
                      "after_leir": t.after_text,
                      "exactness": "exact", "status": "exact", "family": f"fam{i % 3}"})
        samples.append({"sample_id": f"x{i}", "split": "test" if i % 3 == 0 else "train", "prompt": "p",
                        "answer": answer(t).replace("loop_parallelization", s), "step_ids": json.dumps([f"s{i}"]),
                        "strategies": json.dumps([s]), "prompt_tokens": 1, "answer_tokens": 1,
                        "structural_overlap": (i % 2 == 0) if i % 3 == 0 else None})
    return pd.DataFrame(samples), pd.DataFrame(steps), strategies


@pytest.fixture(scope="module")
def params():
    return load_params(overrides={"filter": {"max_strategy_share": 0.5}})


def test_a_sound_release_passes(params):
    samples, steps, producible = release()
    report = check_release(samples, steps, producible, params)
    assert report.success, report.text()
    assert report.checked >= 15


def corrupt(kind):
    samples, steps, producible = release()
    if kind == "null id":
        samples.loc[2, "sample_id"] = None
    elif kind == "unknown strategy":
        steps.loc[1, "strategy"] = "loop_magic"
    elif kind == "duplicated key":
        steps.loc[1, "step_id"] = "s0"
    elif kind == "unverified step":
        steps.loc[4, "status"] = "mismatch"
    elif kind == "skewed distribution":
        steps["strategy"] = "loop_split"
    elif kind == "family in two splits":
        samples.loc[3, "split"] = "train" if samples.loc[3, "split"] == "test" else "test"
    elif kind == "answer does not match the step":
        samples.loc[1, "answer"] = samples.loc[1, "answer"].replace("P^{", "L^{")  # the parallel loop undone
    elif kind == "answer does not parse":
        samples.loc[1, "answer"] = "no think block"
    elif kind == "a loop of one iteration scheduled":
        steps.loc[2, "after_leir"] = ("B^{4}_{tx=0}L^{5}_{a=0}L^{6}_{c=0}P^{1}_{d=0}"
                                      "[D^{f64,g}_{tx,a}=D^{f64,g}_{tx,a}+A^{f64,g}_{tx,c+d}*C^{f64,g}_{c,a};];")
    elif kind == "a producible strategy is missing":
        producible = producible + ["loop_tiling"]
    return samples, steps, producible


@pytest.mark.parametrize("kind, needle", [
    ("null id", "samples.sample_id: expect_column_values_to_not_be_null"),
    ("unknown strategy", "steps.strategy: expect_column_values_to_be_in_set failed (1 unexpected value(s), e.g. ['loop_magic'])"),
    ("duplicated key", "steps.step_id: expect_column_values_to_be_unique"),
    ("unverified step", "steps.status: expect_column_values_to_be_in_set"),
    ("skewed distribution", "strategy_shares.share: expect_column_values_to_be_between"),
    ("family in two splits", "family_splits.n_splits"),
    ("answer does not match the step", "samples.ir_matches_step"),
    ("a loop of one iteration scheduled", "steps.unit_loop_scheduled: expect_column_values_to_be_in_set failed (1 unexpected"),
    ("answer does not parse", "samples.answer_parses"),
    ("a producible strategy is missing", "missing_strategies: expect_table_row_count_to_equal failed (observed 1)"),
])
def test_each_corruption_stops_the_release(params, kind, needle):
    report = check_release(*corrupt(kind), params)
    assert not report.success
    assert any(needle in f for f in report.failures), report.text()


def test_a_copied_unit_binding_is_not_a_scheduled_unit_loop():
    """A reduction split's combining nest keeps the original's `B^{1}_{tx=0}`: nothing new is
    scheduled. Marking a loop of one iteration is still refused."""
    from expectations.release_gate import adds_unit_scheduled_loop

    before = "B^{1}_{tx=0}L^{8}_{a=0}[D^{f32,g}_{tx}=D^{f32,g}_{tx}+A^{f32,g}_{tx,a};];"
    split = ("B^{1}_{tx=0}L^{2}_{c=0}L^{4}_{a=0}[E^{f32,g}_{tx,a}=E^{f32,g}_{tx,a}+A^{f32,g}_{tx,c*4+a};];"
             "B^{1}_{tx=0}L^{4}_{a=0}[D^{f32,g}_{tx}=D^{f32,g}_{tx}+E^{f32,g}_{tx,a};];")
    assert not adds_unit_scheduled_loop(before, split)
    assert adds_unit_scheduled_loop(before, "B^{1}_{tx=0}L^{8}_{a=0}U^{1}_{c=0}"
                                            "[D^{f32,g}_{tx}=D^{f32,g}_{tx}+A^{f32,g}_{tx,a+c};];")
