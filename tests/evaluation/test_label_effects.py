"""Strategy labels by effect (issue 15): a correct answer in another spelling than our library's
passes `strategy_label_pass` when it shows the named strategy's structural effect; the exact match
stays its own field (`strategy_label_exact_pass`).

Hand-written alternatives per family (loops, graph, memory, the softmax family), first as structure
(`evaluation.effects`, no TVM), then end to end through the harness, which also requires the answer
to verify."""
from __future__ import annotations

import pytest

from evaluation.effects import EFFECTS, shows_effect
from evaluation.harness import EvalOptions, Prediction, evaluate
from leir.parse import parse_program
from leir.signature import Signature
from tests.gpu_tasks.conftest import MATMUL, MATMUL_SIG

STMT = "[D^{f32,g}_{tx,a}=D^{f32,g}_{tx,a}+A^{f32,g}_{tx,c}*C^{f32,g}_{c,a};];"
# loop_reorder: a 3-cycle of the loops (the library also moves one loop several places: its own spelling)
CYCLED = "L^{6}_{a=0}L^{64}_{c=0}B^{8}_{tx=0}" + STMT
# loop_split of c by 8, the index written inner-first (the library writes outer*factor+inner)
SPLIT = ("B^{8}_{tx=0}L^{6}_{a=0}L^{8}_{d=0}L^{8}_{c=0}"
         "[D^{f32,g}_{tx,a}=D^{f32,g}_{tx,a}+A^{f32,g}_{tx,c+d*8}*C^{f32,g}_{c+d*8,a};];")
# loop_tiling of (tx, a) by (4, 3): both tile loops outside both point loops
TILED = ("B^{2}_{tx=0}L^{2}_{f=0}L^{4}_{g=0}L^{3}_{h=0}L^{64}_{c=0}"
         "[D^{f32,g}_{g+tx*4,h+f*3}=D^{f32,g}_{g+tx*4,h+f*3}+A^{f32,g}_{g+tx*4,c}*C^{f32,g}_{c,h+f*3};];")
UNROLLED = "B^{8}_{tx=0}U^{6}_{a=0}L^{64}_{c=0}" + STMT

# graph: E = A*2 inlined into D = E+1, written 1+2*A
ELEMENTWISE_SIG = Signature.from_json({"tensors": [{"name": "A", "shape": [4, 4], "dtype": "float32", "role": "input"},
                                                   {"name": "D", "shape": [4, 4], "dtype": "float32", "role": "output"}]})
TWO_STEPS = ("B^{4}_{tx=0}L^{4}_{a=0}[E^{f32,g}_{tx,a}=A^{f32,g}_{tx,a}*2;];"
             "B^{4}_{tx=0}L^{4}_{a=0}[D^{f32,g}_{tx,a}=E^{f32,g}_{tx,a}+1;];")
INLINED = "B^{4}_{tx=0}L^{4}_{a=0}[D^{f32,g}_{tx,a}=1+2*A^{f32,g}_{tx,a};];"
# memory: E stored flat, column-major, its index written row-first
FLAT = ("B^{4}_{tx=0}L^{4}_{a=0}[E^{f32,g}_{tx+a*4}=A^{f32,g}_{tx,a}*2;];"
        "B^{4}_{tx=0}L^{4}_{a=0}[D^{f32,g}_{tx,a}=E^{f32,g}_{tx+a*4}+1;];")
LOCAL = ("B^{4}_{tx=0}L^{4}_{a=0}[E^{f32,l}_{tx,a}=A^{f32,g}_{tx,a}*2;];"
         "B^{4}_{tx=0}L^{4}_{a=0}[D^{f32,g}_{tx,a}=E^{f32,l}_{tx,a}+1;];")

# softmax over rows of a 4x8 matrix, as the translator writes it (max, sum of exp, normalise)
SOFTMAX_SIG = Signature.from_json({"tensors": [{"name": "A", "shape": [4, 8], "dtype": "float32", "role": "input"},
                                               {"name": "C", "shape": [4, 8], "dtype": "float32", "role": "output"}]})
SOFTMAX = ("B^{4}_{tx=0}L^{8}_{a=0}[D^{f32,g}_{tx}=max(D^{f32,g}_{tx},A^{f32,g}_{tx,a});];"
           "B^{4}_{tx=0}L^{8}_{a=0}[E^{f32,g}_{tx}=E^{f32,g}_{tx}+exp(A^{f32,g}_{tx,a}-D^{f32,g}_{tx});];"
           "B^{4}_{tx=0}L^{8}_{a=0}[C^{f32,g}_{tx,a}=exp(A^{f32,g}_{tx,a}-D^{f32,g}_{tx})/E^{f32,g}_{tx};];")
# the online softmax: prefix arrays of running maxima and rescaled sums, in one pass
ONLINE_PREFIX = ("B^{4}_{tx=0}L^{8}_{a=0}["
                 "F^{f32,g}_{tx,a}=max(if_then_else(a-1<0,-inf,F^{f32,g}_{tx,a-1}),A^{f32,g}_{tx,a});"
                 "G^{f32,g}_{tx,a}=if_then_else(a-1<0,0,G^{f32,g}_{tx,a-1}*exp(F^{f32,g}_{tx,a-1}-F^{f32,g}_{tx,a}))"
                 "+exp(A^{f32,g}_{tx,a}-F^{f32,g}_{tx,a});];"
                 "B^{4}_{tx=0}L^{8}_{a=0}[C^{f32,g}_{tx,a}=exp(A^{f32,g}_{tx,a}-F^{f32,g}_{tx,7})/G^{f32,g}_{tx,7};];")
# the same with a wrong rescaling (exp(new-old)): the same shape, a wrong program
ONLINE_WRONG = ONLINE_PREFIX.replace("exp(F^{f32,g}_{tx,a-1}-F^{f32,g}_{tx,a})", "exp(F^{f32,g}_{tx,a}-F^{f32,g}_{tx,a-1})")
PREFIX_MAX = ("B^{4}_{tx=0}L^{8}_{a=0}[F^{f32,g}_{tx,a}=max(if_then_else(a-1<0,-inf,F^{f32,g}_{tx,a-1}),"
              "A^{f32,g}_{tx,a});];" + SOFTMAX.split(";];", 1)[1].replace("D^{f32,g}_{tx}", "F^{f32,g}_{tx,7}"))

CASES = [  # (strategy, original, answer, signature, shows the effect)
    ("loop_reorder", MATMUL, CYCLED, MATMUL_SIG, True),
    ("loop_reorder", MATMUL, SPLIT, MATMUL_SIG, False),
    ("loop_split", MATMUL, SPLIT, MATMUL_SIG, True),
    ("loop_split", MATMUL, CYCLED, MATMUL_SIG, False),
    ("loop_tiling", MATMUL, TILED, MATMUL_SIG, True),
    ("loop_tiling", MATMUL, SPLIT, MATMUL_SIG, False),
    ("loop_unrolling", MATMUL, UNROLLED, MATMUL_SIG, True),
    ("loop_parallelization", MATMUL, UNROLLED, MATMUL_SIG, False),
    ("compute_inline", TWO_STEPS, INLINED, ELEMENTWISE_SIG, True),
    ("compute_inline", TWO_STEPS, LOCAL, ELEMENTWISE_SIG, False),
    ("operator_fusion", TWO_STEPS, "B^{4}_{tx=0}L^{4}_{a=0}[E^{f32,g}_{tx,a}=A^{f32,g}_{tx,a}*2;"
                                   "D^{f32,g}_{tx,a}=E^{f32,g}_{tx,a}+1;];", ELEMENTWISE_SIG, True),
    ("set_storage_layout", TWO_STEPS, FLAT, ELEMENTWISE_SIG, True),
    ("set_storage_scope", TWO_STEPS, LOCAL, ELEMENTWISE_SIG, True),
    ("set_storage_scope", TWO_STEPS, FLAT, ELEMENTWISE_SIG, False),
    ("online_softmax", SOFTMAX, ONLINE_PREFIX, SOFTMAX_SIG, True),
    ("online_softmax", SOFTMAX, PREFIX_MAX, SOFTMAX_SIG, False),
    ("normal_loop_max_to_prefix_max", SOFTMAX, PREFIX_MAX, SOFTMAX_SIG, True),
    ("normal_loop_max_to_prefix_max", SOFTMAX, SOFTMAX, SOFTMAX_SIG, False),
]


@pytest.mark.parametrize(("strategy", "original", "answer", "signature", "expected"), CASES,
                         ids=[f"{c[0]}-{'yes' if c[4] else 'no'}-{i}" for i, c in enumerate(CASES)])
def test_effect_predicates(strategy, original, answer, signature, expected):
    assert shows_effect(strategy, parse_program(original), parse_program(answer), signature) is expected


def test_strategies_without_a_structural_effect_say_so():
    from strategies.registry import ALL_NAMES

    assert set(EFFECTS) < set(ALL_NAMES) and "online_softmax" in EFFECTS
    assert shows_effect("factorization", parse_program(MATMUL), parse_program(CYCLED), MATMUL_SIG) is None


def _score(original: str, signature: Signature, answers: list[tuple[str, str]]):
    import json

    predictions = [Prediction(k, signature.to_json(), original, "<think>t</think><answer>" + json.dumps(
        {"transformed_IR": ir, "applied_strategy": strategy}) + "</answer>") for k, (ir, strategy) in enumerate(answers)]
    return evaluate(predictions, EvalOptions(time=False))


def test_harness_accepts_other_spellings_by_effect_and_keeps_the_exact_check_apart():
    # two swaps at once on the tiled nest (tx<->f, g<->h): no single library step spells it this way
    double = ("L^{2}_{f=0}B^{2}_{tx=0}L^{3}_{h=0}L^{4}_{g=0}L^{64}_{c=0}"
              "[D^{f32,g}_{g+tx*4,h+f*3}=D^{f32,g}_{g+tx*4,h+f*3}+A^{f32,g}_{g+tx*4,c}*C^{f32,g}_{c,h+f*3};];")
    rows = (_score(TILED, MATMUL_SIG, [(double, "loop_reorder")])
            + _score(MATMUL, MATMUL_SIG, [(SPLIT, "loop_split"), (TILED, "loop_tiling"), (CYCLED, "loop_tiling")]))
    [cycled] = _score(MATMUL, MATMUL_SIG, [(CYCLED, "loop_reorder")])
    assert cycled.checks["strategy_label_exact_pass"]           # one library move (tx innermost)
    for row in rows[:3]:
        assert row.status == "exact", row
        assert row.checks["strategy_label_pass"] and not row.checks["strategy_label_exact_pass"], row
        assert row.items[0].label.by == "effect"
    wrong_label = rows[3]
    assert not wrong_label.checks["strategy_label_pass"] and "nor does it show loop_tiling's effect" in wrong_label.error


def test_online_softmax_with_prefix_arrays_passes_and_a_wrong_rescaling_does_not():
    right, wrong, library = _score(SOFTMAX, SOFTMAX_SIG, [(ONLINE_PREFIX, "online_softmax"),
                                                          (ONLINE_WRONG, "online_softmax"),
                                                          (_library_online_softmax(), "online_softmax")])
    assert right.status in ("exact", "close") and right.checks["strategy_label_pass"]
    assert not right.checks["strategy_label_exact_pass"] and right.items[0].to_json()["label_by"] == "effect"
    assert wrong.status == "mismatch" and not wrong.checks["strategy_label_pass"]  # the effect alone is not enough
    assert library.checks["strategy_label_pass"] and library.checks["strategy_label_exact_pass"]


def test_graph_and_memory_alternatives_pass_by_effect():
    inline, flat = _score(TWO_STEPS, ELEMENTWISE_SIG, [(INLINED, "compute_inline"), (FLAT, "set_storage_layout")])
    for row in (inline, flat):
        assert row.status == "exact" and row.checks["strategy_label_pass"], row
        assert not row.checks["strategy_label_exact_pass"]


def _library_online_softmax() -> str:
    from strategies.base import Context
    from strategies.registry import get

    return next(get("online_softmax").transformations(Context(parse_program(SOFTMAX), SOFTMAX_SIG))).after_text
