"""The strategy survey on two example programs: counting, sampling, verification accounting, output."""
from __future__ import annotations

import json
from pathlib import Path

import pytest

from leir import Signature, parse_program
from strategies.base import Context
from strategies.survey import SurveyProgram, survey

DATA = Path(__file__).resolve().parents[1] / "data" / "programs.jsonl"


def two_programs() -> list[SurveyProgram]:
    rows = {r["name"]: r for r in map(json.loads, DATA.read_text().splitlines()) if r}
    return [SurveyProgram(n, Context(parse_program(rows[n]["leir"]), Signature.from_json(rows[n]["signature"])))
            for n in ("softmax", "linear_with_bias")]


class Stub:
    """A verifier that records what it was asked and answers `status` (or mismatch for one strategy)."""

    def __init__(self, bad: str = ""):
        self.bad, self.asked = bad, []

    def __call__(self, items):
        self.asked.extend(items)
        return [type("V", (), {"status": "mismatch" if t.strategy == self.bad else "exact", "error": "differs\nmore"})()
                for t, _ in items]


def test_survey_counts_sites_transformations_and_applications_per_strategy():
    stub = Stub(bad="loop_unrolling")
    s = survey(two_programs(), stub, ["loop_unrolling", "online_softmax", "operator_fission"], cap=1, per_site=1)
    rows = {r.strategy: r for r in s.rows}
    assert s.programs == ["softmax", "linear_with_bias"]
    unroll = rows["loop_unrolling"]
    assert unroll.programs_with_sites == 2 and unroll.sites >= unroll.programs_with_sites
    assert unroll.transformations == unroll.sites              # one variant per site
    assert unroll.applications == 2                            # cap 1 per program
    assert unroll.pass_rate == 0.0 and unroll.failures[0].startswith("softmax: mismatch: site") and "more" not in unroll.failures[0]
    soft = rows["online_softmax"]
    assert soft.programs_with_sites == 1 and soft.applications == 1 and soft.pass_rate == 1.0
    assert rows["operator_fission"].applications == 0 and rows["operator_fission"].pass_rate is None
    assert len(stub.asked) == sum(r.applications for r in s.rows)


def test_survey_is_deterministic_and_renders_a_table_and_json():
    def counts(result):  # everything but the enumeration time
        return [{k: v for k, v in r.items() if k != "seconds"} for r in result.to_json()["strategies"]]

    first = survey(two_programs(), Stub(), ["loop_split", "compute_inline"], cap=2)
    again = survey(two_programs(), Stub(), ["loop_split", "compute_inline"], cap=2)
    assert counts(first) == counts(again)
    table = again.table()
    assert table.splitlines()[0].startswith("| strategy |") and "| loop_split | operator | exact |" in table
    assert table.splitlines()[-1].startswith("| **total** |")
    json.dumps(first.to_json())


def test_survey_mathematical_strategies_also_see_one_inline_step():
    # exponential_split finds exp(a-1) only once D is inlined into C.
    chain = SurveyProgram("chain", Context(parse_program(
        "B^{4}_{tx=0}L^{8}_{a=0}[D^{f64,g}_{tx,a}=A^{f64,g}_{tx,a}-1;];"
        "B^{4}_{tx=0}L^{8}_{a=0}[C^{f64,g}_{tx,a}=exp(D^{f64,g}_{tx,a});];"),
        Signature.from_json({"tensors": [{"name": "A", "shape": [4, 8], "dtype": "float64", "role": "input"},
                                         {"name": "C", "shape": [4, 8], "dtype": "float64", "role": "output"}]})))
    s = survey([chain], Stub(), ["exponential_split"], cap=None, inline_cap=0)
    t = survey([chain], Stub(), ["exponential_split"], cap=None, inline_cap=2)
    assert s.rows[0].sites == 0 and t.rows[0].sites >= 1


def test_survey_with_the_real_verifier_on_two_programs():
    pytest.importorskip("tvm")
    from gpu_tasks.verify import pair_request, verify_pairs

    def verify(items):
        return verify_pairs([pair_request(t.before, t.after, sig) for t, sig in items])

    s = survey(two_programs(), verify, ["tensor_split_to_decouple_operators", "loop_reorder", "online_softmax"],
               cap=1)
    rows = {r.strategy: r for r in s.rows}
    assert rows["loop_reorder"].applications == 2 and rows["loop_reorder"].pass_rate == 1.0
    assert rows["online_softmax"].applications == 1 and rows["online_softmax"].passed == 1
    assert rows["tensor_split_to_decouple_operators"].sites == 0
