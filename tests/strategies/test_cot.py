"""Every strategy's chain of thought states what the published answers must: where the step applies
(the site), the parameters chosen, and the legality facts that were checked, for this program. One
case per strategy, on a small program where it applies; the first transformation's think text is
checked line by line for the site, the parameters and the facts named here. The reasoning before the
step: what the program costs now, the other legal steps of the state, why this one, and
the figures it changes, never a claim the target does not bear out."""
from __future__ import annotations

import pytest

from flows.reports import template, template_counts, thoughts
from strategies.cot import BENEFIT_WEIGHED, answer, combine_answers, reasoning, state_steps, think
from strategies.registry import ALL_NAMES, get, registered
from tests.strategies.strategy_cases import ctx, sig

S2 = sig(("A", [4, 8], "float64", "input"), ("C", [4, 8], "float64", "output"))
M_SIG = sig(("A", [4, 6], "float64", "input"), ("C", [6, 8], "float64", "input"), ("D", [4, 8], "float64", "output"))
MM = "B^{4}_{tx=0}L^{8}_{a=0}L^{6}_{c=0}[D^{f64,g}_{tx,a}=D^{f64,g}_{tx,a}+A^{f64,g}_{tx,c}*C^{f64,g}_{c,a};];"
EW = ("B^{4}_{tx=0}L^{8}_{a=0}[D^{f64,g}_{tx,a}=A^{f64,g}_{tx,a}-1;];"
      "B^{4}_{tx=0}L^{8}_{a=0}[C^{f64,g}_{tx,a}=D^{f64,g}_{tx,a}+exp(D^{f64,g}_{tx,a});];")
SOFT = ("B^{4}_{tx=0}L^{8}_{a=0}[D^{f64,g}_{tx}=max(D^{f64,g}_{tx},A^{f64,g}_{tx,a});];"
        "B^{4}_{tx=0}L^{8}_{a=0}[E^{f64,g}_{tx}=E^{f64,g}_{tx}+exp(A^{f64,g}_{tx,a}-D^{f64,g}_{tx});];"
        "B^{4}_{tx=0}L^{8}_{a=0}[C^{f64,g}_{tx,a}=exp(A^{f64,g}_{tx,a}-D^{f64,g}_{tx})/E^{f64,g}_{tx};];")
ONE = ("B^{4}_{tx=0}[L^{8}_{a=0}[D^{f64,g}_{tx,a}=exp(A^{f64,g}_{tx,a});];"
       "L^{8}_{a=0}[C^{f64,g}_{tx,a}=D^{f64,g}_{tx,a}*2;];];")
TWO = ("B^{4}_{tx=0}L^{8}_{a=0}[D^{f64,g}_{tx,a}=exp(A^{f64,g}_{tx,a});];"
       "B^{4}_{tx=0}L^{8}_{a=0}[C^{f64,g}_{tx,a}=D^{f64,g}_{tx,a}*2;];")
ALG = sig(("A", [4, 8], "float64", "input"), ("C", [4, 7], "float64", "input"), ("D", [4, 7], "float64", "output"))


def prog(rhs: str) -> str:
    """D_{tx,a} = rhs, with A, B, C standing for A_{tx,a}, A_{tx,a+1}, C_{tx,a} (as in test_algebra)."""
    rhs = "".join({"A": "A^{f64,g}_{tx,a}", "B": "A^{f64,g}_{tx,a+1}", "C": "C^{f64,g}_{tx,a}"}.get(ch, ch) for ch in rhs)
    return "B^{4}_{tx=0}L^{7}_{a=0}[D^{f64,g}_{tx,a}=" + rhs + ";];"


PROJ = ("B^{4}_{tx=0}L^{5}_{a=0}L^{6}_{c=0}[D^{f64,g}_{tx,a}=D^{f64,g}_{tx,a}+A^{f64,g}_{tx,c}*R^{f64,g}_{a,c};];"
        "B^{4}_{tx=0}L^{5}_{a=0}L^{6}_{c=0}[E^{f64,g}_{tx,a}=E^{f64,g}_{tx,a}+A^{f64,g}_{tx,c}*W^{f64,g}_{a,c};];"
        "B^{4}_{tx=0}L^{5}_{a=0}[C^{f64,g}_{tx,a}=D^{f64,g}_{tx,a}*E^{f64,g}_{tx,a};];")
MMP = sig(("A", [4, 6], "float64", "input"), ("R", [5, 6], "float64", "input"), ("W", [5, 6], "float64", "input"),
         ("C", [4, 5], "float64", "output"))
CHUNK = ("B^{3}_{tx=0}L^{8}_{a=0}[C^{f64,g}_{0,tx,a}=A^{f64,g}_{tx,a};];"
         "B^{3}_{tx=0}L^{8}_{a=0}[C^{f64,g}_{1,tx,a}=A^{f64,g}_{tx,a+8};];"
         "B^{3}_{tx=0}L^{8}_{a=0}[E^{f64,g}_{tx,a}=C^{f64,g}_{0,tx,a}*C^{f64,g}_{1,tx,a};];")
SPL = sig(("A", [3, 16], "float64", "input"), ("E", [3, 8], "float64", "output"))
ATT_SIG = sig(("A", [4, 3], "float64", "input"), ("C", [6, 3], "float64", "input"),
            ("D", [6, 5], "float64", "input"), ("I", [4, 5], "float64", "output"))
ATT = ("B^{4}_{tx=0}L^{6}_{a=0}L^{3}_{c=0}[E^{f64,g}_{tx,a}=E^{f64,g}_{tx,a}+A^{f64,g}_{tx,c}*C^{f64,g}_{a,c};];"
      "B^{4}_{tx=0}L^{6}_{a=0}[F^{f64,g}_{tx}=max(F^{f64,g}_{tx},E^{f64,g}_{tx,a});];"
      "B^{4}_{tx=0}L^{6}_{a=0}[G^{f64,g}_{tx}=G^{f64,g}_{tx}+exp(E^{f64,g}_{tx,a}-F^{f64,g}_{tx});];"
      "B^{4}_{tx=0}L^{6}_{a=0}[H^{f64,g}_{tx,a}=exp(E^{f64,g}_{tx,a}-F^{f64,g}_{tx})/G^{f64,g}_{tx};];"
      "B^{4}_{tx=0}L^{5}_{c=0}L^{6}_{a=0}[I^{f64,g}_{tx,c}=I^{f64,g}_{tx,c}+H^{f64,g}_{tx,a}*D^{f64,g}_{a,c};];")
ROW = sig(("A", [4, 8], "float64", "input"), ("C", [4], "float64", "input"), ("E", [4], "float64", "output"))

OPERATOR_FISSION = ("B^{4}_{tx=0}L^{8}_{a=0}[D^{f64,g}_{tx}=max(D^{f64,g}_{tx},A^{f64,g}_{tx,a});"
                    "C^{f64,g}_{tx,a}=A^{f64,g}_{tx,a};];")
FISSION_SIG = sig(("A", [4, 8], "float64", "input"), ("C", [4, 8], "float64", "output"), ("D", [4], "float64", "output"))
DEAD = ("B^{4}_{tx=0}L^{8}_{a=0}[D^{f64,g}_{tx,a}=A^{f64,g}_{tx,a}-1;];"
        "B^{4}_{tx=0}L^{8}_{a=0}[C^{f64,g}_{tx,a}=A^{f64,g}_{tx,a}-1+exp(A^{f64,g}_{tx,a}-1);];")
PRODUCT = ("B^{4}_{tx=0}L^{8}_{a=0}[D^{f64,g}_{tx,a}=A^{f64,g}_{tx,a};];"
           "B^{4}_{tx=0}L^{8}_{a=0}[E^{f64,g}_{tx,a}=exp(A^{f64,g}_{tx,a});];"
           "B^{4}_{tx=0}L^{8}_{a=0}[C^{f64,g}_{tx,a}=D^{f64,g}_{tx,a}*E^{f64,g}_{tx,a};];")
SHIFT = "B^{4}_{tx=0}L^{7}_{a=0}[C^{f64,g}_{tx,a}=A^{f64,g}_{tx,a+1}-A^{f64,g}_{tx,a};];"
SHIFT_SIG = sig(("A", [4, 8], "float64", "input"), ("C", [4, 7], "float64", "output"))
ROW_PRODUCT = "B^{4}_{tx=0}L^{8}_{a=0}[E^{f64,g}_{tx}=E^{f64,g}_{tx}+C^{f64,g}_{tx}*A^{f64,g}_{tx,a};];"
ROW_SUM = "B^{4}_{tx=0}L^{8}_{a=0}[E^{f64,g}_{tx}=E^{f64,g}_{tx}+(A^{f64,g}_{tx,a}*A^{f64,g}_{tx,a}+C^{f64,g}_{tx});];"
IDENTITY = ("the new expression equals the old one as an exact symbolic identity (sympy, rational arithmetic; "
            "literals back-substituted exactly) and agrees at random sample points")
TWO_SYMBOLS = "one symbol per distinct access or loop index: A^{f64,g}_{tx,a}, C^{f64,g}_{tx,a}"
NEIGHBOURS = ("one symbol per distinct access or loop index: A^{f64,g}_{tx,a}, C^{f64,g}_{tx,a}, A^{f64,g}_{tx,a+1}; "
              "accesses of one tensor with different subscripts stay distinct (A^{f64,g}_{tx,a}, A^{f64,g}_{tx,a+1})")

# strategy: (program, signature, target, the site line, the parameters line (None: none), facts stated)
CASES = {
    "operator_fusion": (EW, S2, "llvm", "nest 1, tensor D", None, [
        "the nests share 2 loops (tx:4, a:8) with the same extents and kinds",
        "2 is the deepest fusion the dependences on D allow"]),
    "operator_fission": (OPERATOR_FISSION, FISSION_SIG, "llvm", "nest 1, loops tx, a", "at=1", [
        "the two parts access no common tensor that either writes"]),
    "compute_inline": (EW, S2, "llvm", "nest 1, statements 1, 2, tensor D", "into=all", [
        "D is written once per element by statement 1, as a pure function of its indices: A^{f64,g}_{tx,a}-1",
        "its operands are final before that nest runs, so recomputing it in statement 2 gives the same values, "
        "in the same dtype (f64)"]),
    "expression_splitting": (EW, S2, "llvm", "nest 2, statement 2, tensor C", None, [
        "the right operand exp(D^{f64,g}_{tx,a}) does not read C"]),
    "tensor_concat_to_fuse_operators": (PROJ, MMP, "llvm", "nest 1, loops tx, a, c, statements 1, 2, tensors D, E",
                                        "form=stacked_operands", [
        "nests 1, 2 run the same loops and each computes one intermediate (D, E) of shape [4, 5], written nowhere "
        "else; all of them read A",
        "Y is the concatenation of R, W on a new leading axis, copied before the stacked nest while they hold the "
        "values the parts read"]),
    "tensor_split_to_decouple_operators": (CHUNK, SPL, "llvm", "nest 1, statements 1, 2, tensor C", "parts=all", [
        "C is an intermediate whose every write and read names its part by a literal leading index, so each part "
        "can live in a tensor of its own: C[0] -> F, C[1] -> G"]),
    "common_subexpression_elimination": (SOFT, S2, "llvm", "nest 2, statements 2, 3", None, [
        "exp(A^{f64,g}_{tx,a}-D^{f64,g}_{tx}) occurs 2 times, in statements 2, 3",
        "its operands (A, D) are not written between its first and last use",
        "every use runs the loops tx, a over the same ranges, so F_{tx,a} holds the value each use needs"]),
    "dead_code_elimination": (DEAD, S2, "llvm", "nest 1, statement 1, tensor D", None, [
        "no statement that contributes to the output reads D"]),
    "expression_reorder": (PRODUCT, S2, "llvm", "nest 3, statement 3", None, [
        "'*' is commutative in floating point (IEEE 754 results do not depend on the operand order)"]),
    "loop_reorder": (MM, M_SIG, "llvm", "nest 1, loops tx, a, c", "move=tx, to=2", [
        "iterations of tx, a are independent (each writes its own elements and reads no element another iteration "
        "writes), so these loops can move freely",
        "c carries a dependence (reduction axis or repeated store); their relative order is unchanged, so every "
        "accumulator element is updated in the same order as before"]),
    "loop_tiling": (MM, M_SIG, "llvm", "nest 1, loops tx, a", "factors=[2, 4]", [
        "2 divides 4 and 4 divides 8"]),
    "loop_split": (MM, M_SIG, "llvm", "nest 1, loop tx", "factor=2", [
        "2 divides the extent 4 exactly, so d*2+tx enumerates 0..3 once each, in the original order"]),
    "loop_fusion": (SOFT, S2, "llvm", "nest 1, loops tx, a", "depth=1", [
        "the nests share 1 loop (tx:4) with the same extents and kinds"]),
    "loop_unrolling": (MM, M_SIG, "llvm", "nest 1, loop a", None, [
        "the extent 8 is a small constant (at most 16)",
        "the unrolled code holds 48 copies of the innermost body (at most 512), 8 counting enclosing unrolled loops"]),
    "loop_parallelization": (MM, M_SIG, "llvm", "nest 1, loop tx", None, [
        "every statement under d writes a distinct element per iteration of d (it is a spatial axis of D)",
        "no statement reads an element that another iteration of d writes"]),
    "loop_vectorization": (TWO, S2, "llvm", "nest 1, loop a", None, [
        "a is the innermost loop and a spatial axis of every statement below it",
        "the extent 8 is small (at most 64) and the target is the CPU"]),
    "loop_binding": (MM, M_SIG, "cuda", "nest 1, loop a", "axis=ty", [
        "ty is not yet bound in this nest; the block has 32 threads (at most 1024)",
        "the target is a GPU (CUDA)"]),
    "reduction_factorization": (MM, M_SIG, "cuda", "nest 1, loop c, statement 1, tensor D", "factor=2", [
        "D is reduced with '+' over c, which is not in its subscript",
        "2 divides the extent 6"]),
    "cache_read_write": (MM, M_SIG, "llvm", "nest 1, loops tx, a, c", "read=A, depth=1", [
        "A is not written in this nest, so the copy holds the values every read sees",
        "below tx the nest reads A only at A^{f64,g}_{tx,c}, which depends on the inner loops only through c"]),
    "layout_transformation": (TWO, S2, "llvm", "nest 1, tensor D", "order=[1, 0]", [
        "D is an intermediate, so its layout is free",
        "every access of D (all 2 of them) is permuted the same way, so each element keeps its value"]),
    "set_storage_scope": (ONE, S2, "cuda", "nest 1, tensor D", "scope=s", [
        "every access of D lies in one nest, so its value never crosses a kernel",
        "each block only touches its own elements of D"]),
    "set_storage_layout": (TWO, S2, "llvm", "nest 1, tensor D", "layout=row_major", [
        "the strides (8, 1) map each element to its own offset in 0..31, for every access"]),
    "precompute_indices": (SHIFT, SHIFT_SIG, "llvm", "nest 1, statement 1", None, [
        "a+1 depends only on the loop indices a, so a table over their ranges (7) holds every value the statement "
        "needs",
        "the table is i64, so every index value is represented exactly"]),
    "factorization": (prog("A*A+A*C"), ALG, "llvm", "nest 1, statement 1, tensor D", None, [
        TWO_SYMBOLS, IDENTITY, "no division is introduced"]),
    "expand_factorization": (prog("(A+C)*(B-C)"), ALG, "llvm", "nest 1, statement 1, tensor D", None, [
        NEIGHBOURS, IDENTITY]),
    "cancellation": (prog("(A*A-C*C)/(A+C)"), ALG, "llvm", "nest 1, statement 1, tensor D", None, [
        TWO_SYMBOLS, IDENTITY]),
    "expand_cancellation": (prog("(A+C)/(1+C*C)"), ALG, "llvm", "nest 1, statement 1, tensor D", None, [
        "every denominator of the result (C^{f64,g}_{tx,a}**2+1, C^{f64,g}_{tx,a}**2+1) already divides the "
        "original expression or is provably non-zero"]),
    "apart": (prog("(A*A+1)/(A*A+3)"), ALG, "llvm", "nest 1, statement 1, tensor D", "symbol=A^{f64,g}_{tx,a}", [
        "the expression is a rational function of A^{f64,g}_{tx,a}; the new denominators are factors of the old one"]),
    "together": (prog("A/C+C/A"), ALG, "llvm", "nest 1, statement 1, tensor D", None, [
        "every denominator of the result (A^{f64,g}_{tx,a}, C^{f64,g}_{tx,a}) already divides the original "
        "expression or is provably non-zero"]),
    "powsimp": (prog("exp(A)*exp(C)+A**2*A**3"), ALG, "llvm", "nest 1, statement 1, tensor D", None, [
        "powers are combined only where sympy proves the identity for real values (x**a*x**b = x**(a+b), "
        "exp(a)*exp(b) = exp(a+b)); sqrt(x)*sqrt(y) is not merged for values of unknown sign"]),
    "expand_powsimp": (prog("exp(A+C)"), ALG, "llvm", "nest 1, statement 1, tensor D", None, [
        TWO_SYMBOLS, IDENTITY]),
    "expand_log": (prog("log(exp(A)*(C*C+1))"), ALG, "llvm", "nest 1, statement 1, tensor D", None, [
        "every factor split out of a logarithm is provably positive (an exponential, a positive constant, or a sum "
        "of squares and positive constants): the sign of a tensor value is never assumed, so log(A*C) with A, C of "
        "unknown sign is left alone"]),
    "logsimp": (prog("log(A*A+1)+log(C*C+1)"), ALG, "llvm", "nest 1, statement 1, tensor D", None, [
        "combining only widens the domain: wherever the original is defined every logarithm's argument is "
        "positive, and there log(a)+log(b) = log(a*b) and n*log(a) = log(a**n)"]),
    "collect": (prog("A*C+A*B+C*B"), ALG, "llvm", "nest 1, statement 1, tensor D", "symbol=A^{f64,g}_{tx,a}", [
        NEIGHBOURS, IDENTITY]),
    "expand_collect": (prog("A*(C+B)+C"), ALG, "llvm", "nest 1, statement 1, tensor D", "symbol=A^{f64,g}_{tx,a}", [
        NEIGHBOURS, IDENTITY]),
    "partially_equivalent_then_correct": (SOFT, S2, "llvm", "nest 2, loop a, statement 2, tensor E",
                                          "offset=D^{f64,g}_{tx}", [
        "exp(y-D^{f64,g}_{tx}) = exp(y-y0)*exp(y0-D^{f64,g}_{tx}) with y0 = A^{f64,g}_{tx,0} (the element at a=0), "
        "so the partial sum with offset y0 times exp(y0-D^{f64,g}_{tx}) is the original sum",
        "D^{f64,g}_{tx} does not depend on a; the correction multiplies E after the sum is complete (an update of a "
        "written tensor, no new initialisation)"]),
    "normal_loop_max_to_prefix_max": (SOFT, S2, "llvm", "nest 1, loop a, statement 1, tensor D", None, [
        "D is a max-reduction over a (extent 8) with implicit initialisation; the scan starts from the explicit "
        "boundary -inf at a=0, so each prefix applies the same operations in the same order",
        "F is a fresh intermediate; a stays a serial loop (the scan carries a dependence)"]),
    "exponential_split": (SOFT, S2, "llvm", "nest 2, statement 2, tensor E", "exp=0, term=-D^{f64,g}_{tx}", [
        "exp(u+v) = exp(u)*exp(v) for real u, v; the split-off term -D^{f64,g}_{tx} does not depend on loop a"]),
    "multiplicative_split": (ROW_PRODUCT, ROW, "llvm", "nest 1, loop a, statement 1, tensor E", None, [
        "the factor C^{f64,g}_{tx} does not depend on the reduction loop a, so sum over a of f*g = f * (sum over a "
        "of g)"]),
    # (splitting off A**2 would leave the invariant C summed 8 times: refused; the split of C adds it once)
    "additive_split": (ROW_SUM, ROW, "llvm", "nest 1, loop a, statement 1, tensor E", "term=C^{f64,g}_{tx}", [
        "sum over a of (g+t) = sum of g + sum of t, t = C^{f64,g}_{tx}",
        "the second nest accumulates onto E after the first wrote it, so it gets no second "
        "initialisation", "t does not depend on a: its 8 equal terms are added once as 8*t"]),
    "normal_loop_summation_on_exp_to_prefix_summation_on_exp": (SOFT, S2, "llvm",
                                                                "nest 2, loop a, statement 2, tensor E", None, [
        "E is a +-reduction over a (extent 8) with implicit initialisation; the scan starts from the explicit "
        "boundary 0 at a=0, so each prefix applies the same operations in the same order"]),
    "online_softmax": (SOFT, S2, "llvm", "nest 1, loop a, statements 1, 2, tensors D, E", None, [
        "nest 1 is a max-reduction of x = A^{f64,g}_{tx,a} into D and nest 2 sums exp(x-D) into E over the same "
        "loops (checked as a symbolic identity, looking through copies)",
        "no nest in between reads or writes them or writes what x reads"]),
    "flashattention_wo_tiling": (ATT, ATT_SIG, "llvm", "nest 2, loop a, statements 2, 3, tensors F, G, H, I", None, [
        "nests 2-5 compute softmax over a into H (max F, sum G) and I = H·V; H is read by the product only, so it "
        "need not be stored",
        "no nest in between touches the tensors involved"]),
}
REASSOCIATING = "Floating-point operations are reordered, so results agree within rounding, not bit for bit."


def test_every_strategy_has_a_case():
    assert sorted(CASES) == sorted(ALL_NAMES)


@pytest.mark.parametrize("name", ALL_NAMES)
def test_the_chain_of_thought_states_the_site_parameters_and_legality_facts(name):
    text, signature, target, where, parameters, facts = CASES[name]
    strategy = get(name)
    t = next(strategy.transformations(ctx(text, signature, target)))
    lines = think(t, ctx(text, signature, target)).splitlines()
    k = next(i for i, line in enumerate(lines) if line.startswith("Strategy: "))
    assert lines[k].startswith(f"Strategy: {name} ({strategy.level} level). ") and lines[k].endswith(t.summary)
    assert lines[k + 1] == f"Where: {where}."
    assert t.site.describe() == where
    if parameters is None:
        assert not t.params and not any(line.startswith("Parameters:") for line in lines)
    else:
        assert lines[k + 2] == f"Parameters: {parameters}."
    checked = lines[lines.index("Legality checked:") + 1:]
    for fact in facts:
        assert f"- {fact}" in checked, fact
    assert [f"- {fact}" for fact in t.facts] == checked[:len(t.facts)]  # every fact checked is stated
    assert (REASSOCIATING in lines) == (t.exactness == "reassociating")
    assert answer(t).startswith(f"<think>{think(t)}</think><answer>")


@pytest.mark.parametrize("name", ALL_NAMES)
def test_the_reasoning_comes_before_the_step_and_follows_the_target(name):
    text, signature, target, *_ = CASES[name]
    c = ctx(text, signature, target)
    t = next(get(name).transformations(c))
    lines = think(t, c).splitlines()
    device = "the GPU" if target == "cuda" else "the CPU"
    k = next(i for i, line in enumerate(lines) if line.startswith("Strategy: "))
    assert lines[0].startswith("Now: ") and lines[1].startswith(f"On {device}: ")
    assert lines[2].startswith("Reuse: ") and lines[k - 1].startswith(f"Why {name}: ")
    assert any(line.startswith(f"Expected change on {device}: ") for line in lines[k:])


def state(program: str, signature, target: str = "llvm"):
    """Every legal step of one state (as the transform stage enumerates them) and its StateSteps."""
    c = ctx(program, signature, target)
    found = []
    for s in registered():
        found.extend((t, c) for t in s.transformations(c, limit=4, per_site=2))
    return found, state_steps([(t, at.target) for t, at in found])


def test_each_cot_weighs_the_other_legal_steps_of_its_state():
    found, steps = state(MM, M_SIG)
    t, at = next((t, at) for t, at in found if t.strategy == "loop_parallelization")
    lines = think(t, at, steps).splitlines()
    options = next(line for line in lines if line.startswith("Options: "))
    others = [s.strategy for s, a in found if s is not t and a.target == "llvm"]
    assert options.startswith(f"Options: {len(others)} other legal steps here (")
    assert "loop_binding" not in options  # a GPU-only move is no option on a CPU program
    weighed = next(line for line in lines if line.startswith("By the figures: "))
    assert "loop_reorder takes the dependent-update chain out of the innermost loop" in weighed
    # 192 multiply-adds: starting the cores costs more than they share (the figures are weighed)
    why = lines[lines.index(weighed) + 1]
    assert why.startswith("Why loop_parallelization: on the CPU it raises the parallel extent; weighed, the "
                          "estimated cycles where it acts rise ") and why.endswith("so by itself it does not pay; it "
                          "changes the program's form, as the effect below says, for later steps to use.")
    assert reasoning(t, at, steps).claim == "none"
    assert "Expected change on the CPU: parallel extent 1 -> 4 cores." in lines


BIG_MM = "B^{256}_{tx=0}L^{256}_{a=0}L^{256}_{c=0}[D^{f32,g}_{tx,a}=D^{f32,g}_{tx,a}+A^{f32,g}_{tx,c}*C^{f32,g}_{c,a};];"
BIG_SIG = sig(("A", [256, 256], "float32", "input"), ("C", [256, 256], "float32", "input"),
              ("D", [256, 256], "float32", "output"))


def test_a_step_whose_weighed_figures_pay_claims_its_benefit_against_the_other_options():
    found, steps = state(BIG_MM, BIG_SIG)
    t, at = next((t, at) for t, at in found if t.strategy == "loop_parallelization" and t.site.nest == 0
                 and t.site.loops == ("tx",))
    why = reasoning(t, at, steps)
    assert why.claim == "benefit" and why.mine.weighed > 1.5
    line = next(x for x in think(t, at, steps).splitlines() if x.startswith("Why "))
    assert line.startswith("Why loop_parallelization: on the CPU it raises the parallel extent; weighed, the "
                           "estimated cycles where it acts fall ")
    assert line.endswith("no other kind of step here improves that figure.")


def test_a_reorder_that_trades_the_chain_for_strided_accesses_claims_no_benefit_when_the_strides_weigh_more():
    # tx innermost: the reduction leaves the innermost loop, but A and D are walked 1 KiB apart
    c = ctx(BIG_MM, BIG_SIG)
    t = next(t for t in get("loop_reorder").transformations(c, limit=50) if t.after.nests[0].loops[-1].var == "tx")
    why = reasoning(t, c)
    assert "chain" in why.mine.gains and "stride" in why.mine.losses
    assert why.claim != "benefit" and why.mine.weighed < BENEFIT_WEIGHED


def test_the_cost_now_follows_the_program():
    mm = think(next(get("loop_split").transformations(ctx(MM, M_SIG))), ctx(MM, M_SIG)).splitlines()
    assert mm[0] == ("Now: nest 1 runs tx(4 bound) a(8) c(6); its statement accumulates into D over c: 192 "
                     "executions of 2 operations, each loading 24 bytes and storing 8.")
    assert "the innermost loop c carries the reduction" in mm[1] and "tx is a GPU binding, serial on a CPU" in mm[1]
    assert mm[2] == ("Reuse: each element of A is read 8 times (across a), 104 bytes apart; each element of C is "
                     "read 4 times (across tx), 496 bytes apart.")
    ew = think(next(get("loop_split").transformations(ctx(TWO, S2))), ctx(TWO, S2)).splitlines()
    assert "writes each element of D once" in ew[0] and "carries the reduction" not in ew[1]
    assert ew[2] == "Reuse: no element is read twice by this statement."


def test_a_step_that_improves_no_figure_says_what_it_enables():
    big = "B^{4}_{tx=0}L^{128}_{a=0}[C^{f64,g}_{tx,a}=exp(A^{f64,g}_{tx,a});];"
    signature = sig(("A", [4, 128], "float64", "input"), ("C", [4, 128], "float64", "output"))
    c = ctx(big, signature)
    t = next(t for t in get("loop_split").transformations(c) if t.params == {"factor": 16})
    why = next(line for line in think(t, c).splitlines() if line.startswith("Why "))
    # the inner 16 iterations can be unrolled (at most 16), the 128 could not
    assert why == ("Why loop_split: by itself it improves none of these figures on the CPU; it makes loop_unrolling "
                   "legal at the nest 1 next.")


def test_no_parallel_claim_for_partials_in_serial_loops():
    """reduction_factorization's partials stay in serial loops (on a GPU, inside each thread): no CoT says
    they run in parallel; the figures show the chain broken and the parallel extent unchanged."""
    c = ctx(MM, M_SIG, "cuda")
    for t in get("reduction_factorization").transformations(c):
        text = think(t, c)
        assert not any(claim in text.lower() for claim in PARALLEL_CLAIMS), text
        assert "parallel extent" not in next(line for line in text.splitlines() if line.startswith("Expected change"))


def test_no_memory_benefit_claimed_for_a_scope_on_the_cpu():
    for program, signature, name in ((ONE, S2, "set_storage_scope"), (MM, M_SIG, "cache_read_write")):
        c = ctx(program, signature)
        ts = [t for t in get(name).transformations(c) if name != "cache_read_write" or "read" in t.params]
        assert ts
        for t in ts:
            text = think(t, c)
            assert not any(claim in text.lower() for claim in MEMORY_CLAIMS), text
            assert "no memory benefit" in t.summary, t.summary
    gpu = ctx(ONE, S2, "cuda")
    assert any("on chip" in t.summary for t in get("set_storage_scope").transformations(gpu))


# What a CoT may not say where the figures do not bear it out (also checked over a built lake, tests/flows).
PARALLEL_CLAIMS = ("run in parallel", "runs in parallel", "on separate cores", "at once")
MEMORY_CLAIMS = ("fast memory", "on chip", "on-chip", "cuts the bytes moved")


def test_templates_abstract_numbers_and_names_but_keep_the_reasoning():
    a = think(next(get("loop_split").transformations(ctx(MM, M_SIG))))
    other = MM.replace("{8}", "{16}").replace("D^", "E^").replace("{6}", "{12}")
    b_sig = sig(("A", [4, 12], "float64", "input"), ("C", [12, 16], "float64", "input"),
                ("E", [4, 16], "float64", "output"))
    b = think(next(get("loop_split").transformations(ctx(other, b_sig))))
    assert a != b and template(a) == template(b)
    assert "<name>" in template(a) and not any(ch.isdigit() for ch in template(a))
    ew = think(next(get("loop_split").transformations(ctx(TWO, S2))))
    assert template(ew) != template(a)  # an element-wise nest is reasoned about differently
    counts = template_counts([("loop_split", a), ("loop_split", b), ("loop_split", ew)])
    assert counts == {"loop_split": {"cots": 3, "templates": 2}}


def test_thoughts_splits_a_multi_answer_sample_by_option():
    ts = [next(get(n).transformations(ctx(MM, M_SIG))) for n in ("loop_split", "loop_reorder")]
    combined = combine_answers([answer(t) for t in ts])
    assert [(s, x) for s, x in thoughts(combined, ["loop_split", "loop_reorder"])] == [
        ("loop_split", think(ts[0])), ("loop_reorder", think(ts[1]))]
    assert thoughts(answer(ts[0]), ["loop_split"]) == [("loop_split", think(ts[0]))]


def test_tiling_claims_cache_reuse_only_where_a_tensor_is_read_again():
    mm = next(get("loop_tiling").transformations(ctx(MM, M_SIG)))
    assert "A, C are read again across tx or a, and the data one tile touches stays in cache" in mm.summary
    ew = next(get("loop_tiling").transformations(ctx(TWO, S2)))
    assert "no tensor here is read again across tx or a, so the tiles bring no reuse by themselves" in ew.summary
    assert "stays in cache" not in ew.summary


def test_a_saving_is_promised_only_where_the_operation_count_drops():
    costs_more = next(get("together").transformations(ctx(prog("A/C+C/A"), ALG)))
    assert costs_more.summary.startswith("Here the rewritten form is not cheaper. The expression of D goes from "
                                        "3 operations to 5")
    saves = next(get("cancellation").transformations(ctx(prog("(A*A-C*C)/(A+C)"), ALG)))
    assert saves.summary.startswith("Cancelling common factors of numerator and denominator removes work")


def test_what_a_step_enables_is_asked_of_its_state_once_and_answered_as_on_a_fresh_state():
    """`enabled_next` keeps the legality of its before-state's nests in the state's context (every
    step of a state asks it again): each step's answer, on one shared context, is the answer of the
    definition asked on fresh contexts."""
    from strategies.analysis.tree import changed_nests
    from strategies.cot import enabled_next

    def legal(strategy, c, nests):
        return any(strategy.apply(c, site, p) is not None
                   for site in strategy.sites(c) if site.nest in nests for p in strategy.parameters(c, site))

    def defined(t, c):
        b_range, a_range = changed_nests(t.before, t.after)
        return [n for n in get(t.strategy).enables
                if legal(get(n), c.with_program(t.after), a_range) and not legal(get(n), c.with_program(t.before), b_range)]

    asked, enabling = 0, 0
    for program, signature in ((MM, M_SIG), (SOFT, S2), (TWO, S2), (PROJ, MMP)):
        found, _ = state(program, signature)
        shared = found[0][1]
        for t, at in found:
            assert at is shared
            got = enabled_next(t, shared)
            assert got == defined(t, shared), t.strategy
            asked += 1
            enabling += bool(got)
        assert any(key[0] == "legal at nest" for key in shared.memo)
    assert asked >= 40 and enabling >= 5, (asked, enabling)
