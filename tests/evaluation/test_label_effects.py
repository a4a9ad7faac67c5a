"""Strategy labels by effect (issue 15): a correct answer in another spelling than our library's
passes `strategy_label_pass` when it shows the named strategy's structural effect; the exact match
stays its own field (`strategy_label_exact_pass`).

Hand-written alternatives per family (loops, graph, memory, the softmax family), first as structure
(each rule's `recognizes`, no TVM), then end to end through the harness, which also requires the answer
to verify."""
from __future__ import annotations

import pytest

from evaluation.harness import EvalOptions, Prediction, evaluate
from evaluation.label import shows_effect
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


def test_every_registered_strategy_states_its_sign_and_unknown_names_have_none():
    from strategies.base import Strategy
    from strategies.registry import ALL_NAMES, registered

    own = [s.name for s in registered() if type(s).recognizes is not Strategy.recognizes]
    assert own == list(ALL_NAMES)
    assert shows_effect("no_such_strategy", parse_program(MATMUL), parse_program(CYCLED), MATMUL_SIG) is None
    assert shows_effect("factorization", parse_program(MATMUL), parse_program(CYCLED), MATMUL_SIG) is False


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
        assert row.items[0].label.by == "sign"
    wrong_label = rows[3]
    assert not wrong_label.checks["strategy_label_pass"] and "nor does it show loop_tiling's effect" in wrong_label.error


def test_online_softmax_with_prefix_arrays_passes_and_a_wrong_rescaling_does_not():
    right, wrong, library = _score(SOFTMAX, SOFTMAX_SIG, [(ONLINE_PREFIX, "online_softmax"),
                                                          (ONLINE_WRONG, "online_softmax"),
                                                          (_library_online_softmax(), "online_softmax")])
    assert right.status in ("exact", "close") and right.checks["strategy_label_pass"]
    assert not right.checks["strategy_label_exact_pass"] and right.items[0].to_json()["label_by"] == "sign"
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


# --- the symbolic rewrites, the splits, the reorder and the stacked tensors -------------------------------
# Originals are the strategies' golden inputs (tests/strategies); each accepted answer is a correct
# alternative in another spelling than the library's (asserted below: no exact match), each refused one
# verifies but is another strategy's rewrite or no rewrite at all.

ALG_SIG = Signature.from_json({"tensors": [{"name": "A", "shape": [4, 8], "dtype": "float64", "role": "input"},
                                           {"name": "C", "shape": [4, 7], "dtype": "float64", "role": "input"},
                                           {"name": "D", "shape": [4, 7], "dtype": "float64", "role": "output"}]})


def alg(rhs: str) -> str:
    """D_{tx,a} = rhs, with A, B, C standing for A_{tx,a}, A_{tx,a+1}, C_{tx,a} (as tests/strategies/test_algebra)."""
    rhs = "".join({"A": "A^{f64,g}_{tx,a}", "B": "A^{f64,g}_{tx,a+1}", "C": "C^{f64,g}_{tx,a}"}.get(ch, ch) for ch in rhs)
    return "B^{4}_{tx=0}L^{7}_{a=0}[D^{f64,g}_{tx,a}=" + rhs + ";];"


def _sig(*tensors) -> Signature:
    return Signature.from_json({"tensors": [{"name": n, "shape": sh, "dtype": "float64", "role": r}
                                            for n, sh, r in tensors]})


# the softmax of tests/strategies/test_softmax (float64)
SM_SIG = _sig(("A", [4, 8], "input"), ("C", [4, 8], "output"))
SM_MAX = "B^{4}_{tx=0}L^{8}_{a=0}[D^{f64,g}_{tx}=max(D^{f64,g}_{tx},A^{f64,g}_{tx,a});];"
SM_SUM = "B^{4}_{tx=0}L^{8}_{a=0}[E^{f64,g}_{tx}=E^{f64,g}_{tx}+exp(A^{f64,g}_{tx,a}-D^{f64,g}_{tx});];"
SM_NORM = "B^{4}_{tx=0}L^{8}_{a=0}[C^{f64,g}_{tx,a}=exp(A^{f64,g}_{tx,a}-D^{f64,g}_{tx})/E^{f64,g}_{tx};];"
SM = SM_MAX + SM_SUM + SM_NORM
SM_EXP_SPLIT = SM_MAX + SM_SUM.replace("exp(A^{f64,g}_{tx,a}-D^{f64,g}_{tx})",
                                      "exp(A^{f64,g}_{tx,a})/exp(D^{f64,g}_{tx})") + SM_NORM
# partially_equivalent_then_correct with the last element as the offset (the library takes the first),
# the correction written with the accumulator on the right
SM_PARTIAL_LAST = (SM_MAX + SM_SUM.replace("-D^{f64,g}_{tx})", "-A^{f64,g}_{tx,7})")
                   + "B^{4}_{tx=0}[E^{f64,g}_{tx}=exp(A^{f64,g}_{tx,7}-D^{f64,g}_{tx})*E^{f64,g}_{tx};];" + SM_NORM)
SM_RUNNING = ("B^{4}_{tx=0}L^{8}_{a=0}[F^{f64,g}_{tx}=if_then_else(a-1<0,-inf,D^{f64,g}_{tx});"
              "D^{f64,g}_{tx}=max(F^{f64,g}_{tx},A^{f64,g}_{tx,a});"
              "E^{f64,g}_{tx}=if_then_else(a-1<0,0,E^{f64,g}_{tx}*exp(F^{f64,g}_{tx}-D^{f64,g}_{tx}))"
              "+exp(A^{f64,g}_{tx,a}-D^{f64,g}_{tx});];") + SM_NORM
# multiplicative_split dividing by exp(D) once per row (the library multiplies by exp(-D))
SM_HOISTED_DIV = (SM_MAX + "B^{4}_{tx=0}L^{8}_{a=0}[F^{f64,g}_{tx}=F^{f64,g}_{tx}+exp(A^{f64,g}_{tx,a});];"
                  "B^{4}_{tx=0}[E^{f64,g}_{tx}=F^{f64,g}_{tx}/exp(D^{f64,g}_{tx});];" + SM_NORM)
# the same, but the store stays inside the reduction loop: correct, and the factor is still applied 8 times
SM_NOT_HOISTED = (SM_MAX + "B^{4}_{tx=0}L^{8}_{a=0}[F^{f64,g}_{tx}=F^{f64,g}_{tx}+exp(A^{f64,g}_{tx,a});];"
                  "B^{4}_{tx=0}L^{8}_{a=0}[E^{f64,g}_{tx}=F^{f64,g}_{tx}/exp(D^{f64,g}_{tx});];" + SM_NORM)

ADD_SIG = _sig(("A", [4, 8], "input"), ("C", [4], "input"), ("E", [4], "output"))
ADD = "B^{4}_{tx=0}L^{8}_{a=0}[E^{f64,g}_{tx}=E^{f64,g}_{tx}+(A^{f64,g}_{tx,a}*A^{f64,g}_{tx,a}+C^{f64,g}_{tx});];"
# additive_split with the invariant term's closed form first (the library puts it second)
ADD_CLOSED_FIRST = ("B^{4}_{tx=0}[E^{f64,g}_{tx}=E^{f64,g}_{tx}+C^{f64,g}_{tx}*8;];"
                    "B^{4}_{tx=0}L^{8}_{a=0}[E^{f64,g}_{tx}=E^{f64,g}_{tx}+A^{f64,g}_{tx,a}*A^{f64,g}_{tx,a};];")
ADD_REORDERED = "B^{4}_{tx=0}L^{8}_{a=0}[E^{f64,g}_{tx}=E^{f64,g}_{tx}+(C^{f64,g}_{tx}+A^{f64,g}_{tx,a}*A^{f64,g}_{tx,a});];"

# expression_reorder: both the independent nests and the operands of the product swapped in one answer
RE_SIG = _sig(("A", [4, 8], "input"), ("C", [4, 8], "output"))
RE = ("B^{4}_{tx=0}L^{8}_{a=0}[D^{f64,g}_{tx,a}=A^{f64,g}_{tx,a};];"
      "B^{4}_{tx=0}L^{8}_{a=0}[E^{f64,g}_{tx,a}=exp(A^{f64,g}_{tx,a});];"
      "B^{4}_{tx=0}L^{8}_{a=0}[C^{f64,g}_{tx,a}=D^{f64,g}_{tx,a}*E^{f64,g}_{tx,a}+A^{f64,g}_{tx,a};];")
RE_BOTH = ("B^{4}_{tx=0}L^{8}_{a=0}[E^{f64,g}_{tx,a}=exp(A^{f64,g}_{tx,a});];"
           "B^{4}_{tx=0}L^{8}_{a=0}[D^{f64,g}_{tx,a}=A^{f64,g}_{tx,a};];"
           "B^{4}_{tx=0}L^{8}_{a=0}[C^{f64,g}_{tx,a}=A^{f64,g}_{tx,a}+E^{f64,g}_{tx,a}*D^{f64,g}_{tx,a};];")
RE_INLINED = ("B^{4}_{tx=0}L^{8}_{a=0}[E^{f64,g}_{tx,a}=exp(A^{f64,g}_{tx,a});];"
              "B^{4}_{tx=0}L^{8}_{a=0}[C^{f64,g}_{tx,a}=A^{f64,g}_{tx,a}*E^{f64,g}_{tx,a}+A^{f64,g}_{tx,a};];")

# stacked tensors (tests/strategies/test_graph_tensors): two elementwise operators of one input
EW = ("B^{4}_{tx=0}L^{8}_{a=0}[D^{f64,g}_{tx,a}=exp(A^{f64,g}_{tx,a});];"
      "B^{4}_{tx=0}L^{8}_{a=0}[E^{f64,g}_{tx,a}=A^{f64,g}_{tx,a}*A^{f64,g}_{tx,a};];"
      "B^{4}_{tx=0}L^{8}_{a=0}[C^{f64,g}_{tx,a}=D^{f64,g}_{tx,a}-E^{f64,g}_{tx,a};];")
# stacked on a trailing axis, parts in the other order (the library stacks on a leading axis, in order)
EW_TRAILING = ("B^{4}_{tx=0}L^{8}_{a=0}[F^{f64,g}_{tx,a,1}=exp(A^{f64,g}_{tx,a});"
               "F^{f64,g}_{tx,a,0}=A^{f64,g}_{tx,a}*A^{f64,g}_{tx,a};];"
               "B^{4}_{tx=0}L^{8}_{a=0}[C^{f64,g}_{tx,a}=F^{f64,g}_{tx,a,1}-F^{f64,g}_{tx,a,0};];")
EW_FUSED = ("B^{4}_{tx=0}L^{8}_{a=0}[D^{f64,g}_{tx,a}=exp(A^{f64,g}_{tx,a});"
            "E^{f64,g}_{tx,a}=A^{f64,g}_{tx,a}*A^{f64,g}_{tx,a};];"
            "B^{4}_{tx=0}L^{8}_{a=0}[C^{f64,g}_{tx,a}=D^{f64,g}_{tx,a}-E^{f64,g}_{tx,a};];")
SPL_SIG = _sig(("A", [3, 16], "input"), ("E", [3, 8], "output"))
CHUNK = ("B^{3}_{tx=0}L^{8}_{a=0}[C^{f64,g}_{0,tx,a}=A^{f64,g}_{tx,a};];"
         "B^{3}_{tx=0}L^{8}_{a=0}[C^{f64,g}_{1,tx,a}=A^{f64,g}_{tx,a+8};];"
         "B^{3}_{tx=0}L^{8}_{a=0}[E^{f64,g}_{tx,a}=C^{f64,g}_{0,tx,a}*C^{f64,g}_{1,tx,a};];")
# split into one tensor per part, both parts computed in one nest (the library keeps their nests)
CHUNK_SPLIT_ONE_NEST = ("B^{3}_{tx=0}L^{8}_{a=0}[F^{f64,g}_{tx,a}=A^{f64,g}_{tx,a};G^{f64,g}_{tx,a}=A^{f64,g}_{tx,a+8};];"
                        "B^{3}_{tx=0}L^{8}_{a=0}[E^{f64,g}_{tx,a}=F^{f64,g}_{tx,a}*G^{f64,g}_{tx,a};];")
CHUNK_FUSED = ("B^{3}_{tx=0}L^{8}_{a=0}[C^{f64,g}_{0,tx,a}=A^{f64,g}_{tx,a};C^{f64,g}_{1,tx,a}=A^{f64,g}_{tx,a+8};];"
               "B^{3}_{tx=0}L^{8}_{a=0}[E^{f64,g}_{tx,a}=C^{f64,g}_{0,tx,a}*C^{f64,g}_{1,tx,a};];")

# The strategies whose predicates came with issue 15's symbolic work (expression_effect and the
# splits, reorder and stacked-tensor predicates).
SYMBOLIC = ("factorization", "expand_factorization", "collect", "expand_collect", "cancellation",
            "expand_cancellation", "apart", "together", "powsimp", "expand_powsimp", "additive_split",
            "multiplicative_split", "partially_equivalent_then_correct", "expression_reorder",
            "tensor_concat_to_fuse_operators", "tensor_split_to_decouple_operators")
SYMBOLIC_CASES = [  # (strategy, original, answer, signature, shows the effect)
    ("factorization", alg("A*A+A*C"), alg("(C+A)*A"), ALG_SIG, True),
    ("factorization", alg("A*A-C*C"), alg("(A-C)*(C+A)"), ALG_SIG, True),
    ("factorization", alg("A*C+A*B+C*B"), alg("B*C+A*(B+C)"), ALG_SIG, False),   # collect's rewrite
    ("factorization", alg("(A+C)*(B-C)"), alg("A*B-A*C+C*B-C*C"), ALG_SIG, False),  # multiplied out
    ("expand_factorization", alg("(A+C)*(B-C)"), alg("A*B-A*C+C*B-C*C"), ALG_SIG, True),
    ("expand_factorization", alg("A*A+A*C"), alg("A*(A+C)"), ALG_SIG, False),
    ("collect", alg("A*C+A*B+C*B"), alg("(C+B)*A+C*B"), ALG_SIG, True),
    ("collect", alg("A*A+A*C"), alg("A*(A+C)"), ALG_SIG, False),  # A*A and A*C: other powers of A, a factorization
    ("expand_collect", alg("A*(C+B)+C"), alg("C+A*C+A*B"), ALG_SIG, True),
    ("expand_collect", alg("(A+C)*(B-C)"), alg("A*B-A*C+C*B-C*C"), ALG_SIG, False),  # no single access distributed
    ("cancellation", alg("(A*A-C*C)/(A+C)"), alg("-C+A"), ALG_SIG, True),
    ("cancellation", alg("A/C+C/A"), alg("(C*C+A*A)/(C*A)"), ALG_SIG, True),  # one fraction, as sympy.cancel
    ("cancellation", alg("(A+C)/(1+C*C)"), alg("C/(1+C*C)+A/(C*C+1)"), ALG_SIG, False),  # expand_cancellation's
    ("cancellation", alg("(A*A-C*C)/(A+C)"), alg("(A*A-C*C)/(C+A)"), ALG_SIG, False),  # operands swapped only
    ("expand_cancellation", alg("(A+C)/(1+C*C)"), alg("C/(1+C*C)+A/(C*C+1)"), ALG_SIG, True),
    ("expand_cancellation", alg("(A*A+1)/(A*A+3)"), alg("1-2/(3+A*A)"), ALG_SIG, False),  # apart's rewrite
    ("apart", alg("(A*A+1)/(A*A+3)"), alg("1-2/(3+A*A)"), ALG_SIG, True),
    ("apart", alg("A/(A+C)"), alg("-C/(C+A)+1"), ALG_SIG, True),
    ("apart", alg("(A+C)/(1+C*C)"), alg("C/(1+C*C)+A/(C*C+1)"), ALG_SIG, False),  # expand_cancellation's
    ("together", alg("A/C+C/A"), alg("(C*C+A*A)/(C*A)"), ALG_SIG, True),
    ("together", alg("(A+C)/(1+C*C)"), alg("C/(1+C*C)+A/(C*C+1)"), ALG_SIG, False),
    ("powsimp", alg("exp(A)*exp(C)+A**2*A**3"), alg("exp(C+A)+A**5"), ALG_SIG, True),
    ("powsimp", alg("exp(A+C)"), alg("exp(A)*exp(C)"), ALG_SIG, False),
    ("expand_powsimp", alg("exp(A+C)"), alg("exp(C)*exp(A)"), ALG_SIG, True),
    ("expand_powsimp", alg("exp(A)*exp(C)+A"), alg("exp(A+C)+A"), ALG_SIG, False),
    ("additive_split", ADD, ADD_CLOSED_FIRST, ADD_SIG, True),
    ("additive_split", ADD, ADD_REORDERED, ADD_SIG, False),
    ("multiplicative_split", SM_EXP_SPLIT, SM_HOISTED_DIV, SM_SIG, True),
    ("multiplicative_split", SM_EXP_SPLIT, SM_NOT_HOISTED, SM_SIG, False),
    ("partially_equivalent_then_correct", SM, SM_PARTIAL_LAST, SM_SIG, True),
    ("partially_equivalent_then_correct", SM, SM_RUNNING, SM_SIG, False),  # online softmax's rewrite
    ("partially_equivalent_then_correct", SM, SM_EXP_SPLIT, SM_SIG, False),  # exponential_split's
    ("expression_reorder", RE, RE_BOTH, RE_SIG, True),
    ("expression_reorder", RE, RE_INLINED, RE_SIG, False),  # compute_inline's rewrite
    ("expression_reorder", MATMUL, CYCLED, MATMUL_SIG, False),  # loop_reorder's
    ("tensor_concat_to_fuse_operators", EW, EW_TRAILING, RE_SIG, True),
    ("tensor_concat_to_fuse_operators", EW, EW_FUSED, RE_SIG, False),  # operator_fusion's rewrite
    ("tensor_split_to_decouple_operators", CHUNK, CHUNK_SPLIT_ONE_NEST, SPL_SIG, True),
    ("tensor_split_to_decouple_operators", CHUNK, CHUNK_FUSED, SPL_SIG, False),  # loop fusion
    ("tensor_split_to_decouple_operators", EW, EW_TRAILING, RE_SIG, False),  # the concat
]


@pytest.mark.parametrize(("strategy", "original", "answer", "signature", "expected"), SYMBOLIC_CASES,
                         ids=[f"{c[0]}-{'yes' if c[4] else 'no'}-{i}" for i, c in enumerate(SYMBOLIC_CASES)])
def test_symbolic_effect_predicates(strategy, original, answer, signature, expected):
    assert shows_effect(strategy, parse_program(original), parse_program(answer), signature) is expected


def test_every_new_predicate_has_an_accepted_and_a_refused_case():
    """Each strategy that gained a predicate with issue 15's symbolic work has both kinds of case."""
    covered = {(c[0], c[4]) for c in SYMBOLIC_CASES}
    assert {s for s in SYMBOLIC if (s, True) in covered and (s, False) in covered} == set(SYMBOLIC)


@pytest.mark.parametrize("case", [c for c in SYMBOLIC_CASES if c[4]], ids=lambda c: c[0])
def test_accepted_alternatives_are_not_the_library_output(case):
    """The accepted answers are other spellings: none is one of the library's transformations (up to
    renaming), so only the effect check can pass them."""
    import json

    from evaluation.label import strategy_results
    from leir.canon import alpha_hash

    strategy, original, answer, signature, _ = case
    hashes, complete = strategy_results(original, json.dumps(signature.to_json()), "llvm", strategy, 500, 60.0)
    assert complete and hashes, strategy  # the strategy applies to the original
    assert alpha_hash(parse_program(answer), signature) not in hashes


@pytest.mark.parametrize("case", sorted({(c[0], c[1]) for c in SYMBOLIC_CASES}), ids=lambda c: c[0])
def test_the_library_transformations_show_their_effect(case):
    """Every transformation our library makes of these originals shows its strategy's effect: the
    predicates describe what the strategies do, not a narrower spelling."""
    from strategies.base import Context
    from strategies.registry import get

    strategy, original = case
    signature = next(c[3] for c in SYMBOLIC_CASES if (c[0], c[1]) == case)
    program = parse_program(original)
    for t in get(strategy).transformations(Context(program, signature)):
        assert shows_effect(strategy, program, t.after, signature), t.after_text


def test_a_huge_expression_is_not_looked_at():
    from strategies.analysis.algebra import MAX_OPS

    ones = "*1" * MAX_OPS  # sympy drops them, the size guard counts them
    original, answer = parse_program(alg("(A*A+A*C)" + ones)), parse_program(alg("A*(A+C)" + ones))
    assert shows_effect("factorization", original, answer, ALG_SIG) is False
    assert shows_effect("factorization", parse_program(alg("A*A+A*C")), parse_program(alg("A*(A+C)")), ALG_SIG)


def test_harness_accepts_symbolic_alternatives_by_effect():
    factored = alg("(A-C)*(C+A)")
    right, misnamed = _score(alg("A*A-C*C"), ALG_SIG, [(factored, "factorization"), (factored, "apart")])
    assert right.status in ("exact", "close") and right.checks["strategy_label_pass"], right
    assert not right.checks["strategy_label_exact_pass"] and right.items[0].label.by == "sign"
    assert not misnamed.checks["strategy_label_pass"] and "nor does it show apart's effect" in misnamed.error
    # partial fractions with the wrong sign: the effect's shape, a wrong program
    original, wrong_sign = alg("(A*A+1)/(A*A+3)"), alg("1+2/(3+A*A)")
    assert shows_effect("apart", parse_program(original), parse_program(wrong_sign), ALG_SIG)
    (wrong,) = _score(original, ALG_SIG, [(wrong_sign, "apart")])
    assert wrong.status == "mismatch" and not wrong.checks["strategy_label_pass"]  # the effect alone is not enough
