"""Legality that knows the program's dtype (issue 18): what float16, float32 and float64 can hold, the
value ranges a rewrite is judged with, and the refusals they cause, each with its reason."""
from __future__ import annotations

import math
import re

import pytest
from strategy_cases import ctx, in_dtype, results, sig

from leir import parse_program
from leir.analysis import statement_sites
from leir.parse import parse_expr
from leir.printer import format_expr
from strategies.analysis.magnitudes import conditioning_problem, overflow_problem, sampled_peak
from strategies.analysis.numerics import (
    FORMATS,
    PRECISION,
    TOLERANCE,
    literal_problem,
    sum_drift_problem,
    unshifted_exp_problem,
)
from strategies.analysis.ranges import DATA, Interval, expr_range, tensor_ranges
from strategies.base import Illegal
from strategies.registry import get


def softmax(code: str, dtype: str, n: int = 8):
    """Row softmax of A (4xn) in the given dtype, as the translator writes it."""
    text = (f"B^{{4}}_{{tx=0}}L^{{{n}}}_{{a=0}}[D^{{{code},g}}_{{tx}}=max(D^{{{code},g}}_{{tx}},A^{{{code},g}}_{{tx,a}});];"
            f"B^{{4}}_{{tx=0}}L^{{{n}}}_{{a=0}}[E^{{{code},g}}_{{tx}}=E^{{{code},g}}_{{tx}}"
            f"+exp(A^{{{code},g}}_{{tx,a}}-D^{{{code},g}}_{{tx}});];"
            f"B^{{4}}_{{tx=0}}L^{{{n}}}_{{a=0}}[C^{{{code},g}}_{{tx,a}}=exp(A^{{{code},g}}_{{tx,a}}-D^{{{code},g}}_{{tx}})"
            f"/E^{{{code},g}}_{{tx}};];")
    return text, sig(("A", [4, n], dtype, "input"), ("C", [4, n], dtype, "output"))


def variance(code: str, dtype: str, n: int = 768):
    """The squared-deviation sum of a layer norm with the mean I/n inlined (what compute_inline makes)."""
    text = (f"B^{{4}}_{{tx=0}}L^{{{n}}}_{{a=0}}[I^{{{code},g}}_{{tx}}=I^{{{code},g}}_{{tx}}+A^{{{code},g}}_{{tx,a}};];"
            f"B^{{4}}_{{tx=0}}L^{{{n}}}_{{a=0}}[K^{{{code},g}}_{{tx}}=K^{{{code},g}}_{{tx}}"
            f"+(A^{{{code},g}}_{{tx,a}}-I^{{{code},g}}_{{tx}}/{n})**2;];")
    return text, sig(("A", [4, n], dtype, "input"), ("K", [4], dtype, "output"))


def test_formats_and_the_exp_headroom():
    assert FORMATS["f16"].max == 65504.0 and math.isclose(FORMATS["f16"].exp_limit, 11.09, abs_tol=0.01)
    assert unshifted_exp_problem("f32") is None and unshifted_exp_problem("f64") is None
    reason = unshifted_exp_problem("f16")
    assert "float16" in reason and "11.09" in reason


@pytest.mark.parametrize("name", ["partially_equivalent_then_correct", "exponential_split", "expand_powsimp"])
def test_the_max_shift_is_kept_in_float16(name):
    """On a float16 softmax these steps drop the max shift, and exp(x) overflows above 11 (the issue's
    NaN on the wide-range draw): refused there, offered in float32 and float64."""
    assert results(name, *softmax("f16", "float16")) == []
    assert results(name, *softmax("f32", "float32"))
    assert results(name, *softmax("f64", "float64"))


def test_the_refusal_says_why():
    c = ctx(*softmax("f16", "float16", n=4))  # a row short enough that the sum could be split
    s = get("partially_equivalent_then_correct")
    site = next(iter(s.sites(c)))
    params = next(iter(s.parameters(c, site)))
    with pytest.raises(Illegal, match="in float16 exp overflows above 11.09"):
        s.rewrite(c, site, params)


def test_tensor_ranges_follow_the_program():
    text, signature = variance("f32", "float32", n=8)
    program = parse_program(text)
    ranges = tensor_ranges(program, signature)
    assert ranges["A"] == DATA
    assert ranges["I"] == Interval(-80.0, 80.0)           # a sum of 8 terms in [-10, 10]
    assert ranges["K"] == Interval(0.0, 8 * 20.0 ** 2)    # 8 squares of |A - I/8| <= 20
    softmax_program = parse_program(softmax("f32", "float32")[0])
    r = tensor_ranges(softmax_program, softmax("f32", "float32")[1])
    # the sum of 8 exponentials of differences in [-20, 20]
    assert r["D"] == DATA and math.isclose(r["E"].lo, 8 * math.exp(-20)) and math.isclose(r["E"].hi, 8 * math.exp(20))


def test_expression_range_tracks_the_largest_intermediate():
    text, signature = variance("f16", "float16")
    program = parse_program(text)
    site = statement_sites(program)[1]
    ranges = tensor_ranges(program, signature)
    element = site.stmt.rhs.rhs
    value, peak = expr_range(element, ranges, site.bounds)
    assert value == Interval(0.0, 400.0) and peak == 400.0


def test_an_algebraic_form_that_overflows_float16_is_refused():
    """factorization pulls the 1/n out of the layer norm's squared deviation: (n*A-I)**2/n**2. For
    n = 128 it reaches 6.6e6, beyond float16's 65504, where (A-I/128)**2 stays within 400; for n = 768
    even the literal 589824 cannot be written in float16. Both refused; float32 keeps the step."""
    for n in (128, 768):
        text, signature = variance("f16", "float16", n)
        assert results("factorization", text, signature) == []
        assert results("together", text, signature) == []
        text32, signature32 = variance("f32", "float32", n)
        assert results("factorization", text32, signature32)
    text, signature = variance("f16", "float16", 128)
    program = parse_program(text)
    site = statement_sites(program)[1]
    old = site.stmt.rhs.rhs
    assert format_expr(old) == "(A^{f16,g}_{tx,a}-I^{f16,g}_{tx}/128)**2"
    new = parse_expr("(128*A^{f16,g}_{tx,a}-I^{f16,g}_{tx})**2/16384")
    reason = overflow_problem(program, signature, site.loops, old, new, "f16")
    reached = float(re.search(r"reaches (\S+) for inputs", reason).group(1))
    assert 65504 < reached <= 2560 ** 2 and "beyond float16's largest value 65504" in reason
    assert float(re.search(r"stays within (\S+)\)", reason).group(1)) <= 400
    assert overflow_problem(program, signature, site.loops, old, new, "f32") is None


def test_a_new_literal_must_fit_the_dtype():
    assert literal_problem(589824.0, "f16") == "the literal 589824 is beyond float16's largest value 65504"
    assert "rounds to 0 in float16" in literal_problem(1e-8, "f16")
    assert literal_problem(589824.0, "f32") is None and literal_problem(1e-8, "f32") is None


def test_reassociating_a_long_sum_drifts_beyond_the_dtype():
    """sqrt(n)*u: float16 (u = 2**-11, its largest errors held to 1e-2) can reassociate at most ~6
    terms (the survey: matmuls of 33 terms off by 0.015 after rfactor, a layer norm's 16-term variance
    by 0.0108); float32 (u = 2**-24, 1e-5) up to ~27,800 terms; float64 practically always."""
    assert sum_drift_problem(6, "f16", "S") is None
    reason = sum_drift_problem(16, "f16", "S")
    assert "16 terms accumulate into each element of S" in reason and "0.002" in reason
    assert sum_drift_problem(16384, "f32", "S") is None and sum_drift_problem(65536, "f32", "S")
    assert sum_drift_problem(10 ** 12, "f64", "S") is None


def test_precision_is_the_verifiers_tolerance():
    """The limits the rules use follow the `close` tolerance the verifier applies."""
    from gpu_tasks.tolerances import DEFAULT_TOLERANCES

    for code, (max_abs, rel_l2) in TOLERANCE.items():
        assert (DEFAULT_TOLERANCES[code].max_abs, DEFAULT_TOLERANCES[code].rel_l2) == (max_abs, rel_l2), code
    assert PRECISION["f16"] == 1.25e-3 and PRECISION["f32"] == 1e-5 and PRECISION["f64"] == 1.25e-10


def test_long_float16_sums_keep_their_order():
    row = ("B^{4}_{tx=0}L^{1024}_{a=0}[S^{f16,g}_{tx}=S^{f16,g}_{tx}+A^{f16,g}_{tx,a}*A^{f16,g}_{tx,a};];")
    s16 = sig(("A", [4, 1024], "float16", "input"), ("S", [4], "float16", "output"))
    # (on a GPU target: on the CPU rfactor into global partials inside serial loops is refused anyway)
    assert results("reduction_factorization", row, s16, "cuda") == []
    assert results("reduction_factorization", in_dtype(row, "f32"), sig(("A", [4, 1024], "float32", "input"),
                                                         ("S", [4], "float32", "output")), "cuda")
    short = "B^{4}_{tx=0}L^{6}_{a=0}[S^{f16,g}_{tx}=S^{f16,g}_{tx}+A^{f16,g}_{tx,a}*A^{f16,g}_{tx,a};];"
    assert results("reduction_factorization", short, sig(("A", [4, 6], "float16", "input"),
                                                         ("S", [4], "float16", "output")), "cuda")


GELU_TANH = ("B^{4}_{tx=0}L^{8}_{a=0}["
             "D^{f16,g}_{tx,a}=exp(min(max(0.7978845608028654*(A^{f16,g}_{tx,a}+0.044715*A^{f16,g}_{tx,a}**3),-9),9));"
             "E^{f16,g}_{tx,a}=exp(-min(max(0.7978845608028654*(A^{f16,g}_{tx,a}+0.044715*A^{f16,g}_{tx,a}**3),-9),9));"
             "C^{f16,g}_{tx,a}=0.5*A^{f16,g}_{tx,a}*(1+(D^{f16,g}_{tx,a}-E^{f16,g}_{tx,a})"
             "/(D^{f16,g}_{tx,a}+E^{f16,g}_{tx,a}));];")


def test_samples_see_what_intervals_cannot():
    """tanh written as (D-E)/(D+E) with D = exp(u), E = exp(-u) (the translator's float16 gelu): the
    interval of the quotient is +-3e7 (D and E vary independently), its samples stay within 1."""
    program = parse_program(GELU_TANH)
    s16 = sig(("A", [4, 8], "float16", "input"), ("C", [4, 8], "float16", "output"))
    site = statement_sites(program)[2]
    ranges = tensor_ranges(program, s16)
    quotient = site.stmt.rhs.rhs.rhs
    assert expr_range(quotient, ranges, site.bounds)[0].magnitude > 1e7
    peak, _ = sampled_peak(quotient, ranges, site.bounds)
    assert peak <= 2 * 8103.1  # the largest operation it computes is D+E; the quotient is within [-1, 1]


def test_distributing_over_tanh_overflows_float16():
    """expand_collect on the float16 gelu: A*(D-E)/(2*(D+E)) computes A*(D-E), up to 81030 > 65504
    (the survey found inf where the original is finite); refused there, kept in float32."""
    s16 = sig(("A", [4, 8], "float16", "input"), ("C", [4, 8], "float16", "output"))
    s32 = sig(("A", [4, 8], "float32", "input"), ("C", [4, 8], "float32", "output"))
    distributed = [t for t in results("expand_collect", GELU_TANH, s16) if "C^{f16,g}_{tx,a}=A^{f16,g}" in t]
    assert distributed == []
    assert [t for t in results("expand_collect", in_dtype(GELU_TANH, "f32"), s32)
            if "C^{f32,g}_{tx,a}=A^{f32,g}" in t]


def _batch_variance(code: str, dtype: str) -> tuple[str, object]:
    """A batch norm's statistics over a batch of 2: the mean G, then the squared deviations H."""
    text = (f"B^{{2}}_{{tx=0}}L^{{32}}_{{a=0}}[F^{{{code},g}}_{{a}}=F^{{{code},g}}_{{a}}+A^{{{code},g}}_{{tx,a}};];"
            f"B^{{32}}_{{tx=0}}[G^{{{code},g}}_{{tx}}=F^{{{code},g}}_{{tx}}/2;];"
            f"B^{{2}}_{{tx=0}}L^{{32}}_{{a=0}}[H^{{{code},g}}_{{a}}=H^{{{code},g}}_{{a}}"
            f"+(A^{{{code},g}}_{{tx,a}}-G^{{{code},g}}_{{a}})**2;];")
    return text, sig(("A", [2, 32], dtype, "input"), ("H", [32], dtype, "output"))


def test_expanding_a_squared_deviation_loses_float16_digits():
    """(A-G)**2 -> A**2+G**2-2*A*G cancels where A is close to its mean: in float16 the survey found
    a batch norm off by 0.0106 after it; refused there, kept in float32."""
    def expanded(code, dtype):
        return [t for t in results("expand_factorization", *_batch_variance(code, dtype)) if "**2+" in t]

    assert expanded("f16", "float16") == [] and expanded("f32", "float32")
    text, signature = _batch_variance("f16", "float16")
    program = parse_program(text)
    site = statement_sites(program)[2]
    old = site.stmt.rhs.rhs
    assert format_expr(old) == "(A^{f16,g}_{tx,a}-G^{f16,g}_{a})**2"
    new = parse_expr("A^{f16,g}_{tx,a}**2+G^{f16,g}_{a}**2-2*A^{f16,g}_{tx,a}*G^{f16,g}_{a}")
    reason = conditioning_problem(program, signature, site.loops, old, new, "f16")
    assert reason.startswith("evaluated in float16, 90% of sampled values of the rewritten expression")
    assert conditioning_problem(program, signature, site.loops, old, new, "f32") is None


def test_a_log_of_a_root_close_to_one_loses_float16_digits():
    """logsimp folds log(G)/256 into log(G**0.00390625): the root rounds to 1+k*2**-10 in float16
    before its log (the survey: nll_loss off by 0.0134)."""
    text = ("B^{4}_{tx=0}L^{8}_{a=0}[G^{f16,g}_{tx}=G^{f16,g}_{tx}+exp(A^{f16,g}_{tx,a});];"
            "B^{4}_{tx=0}[C^{f16,g}_{tx}=log(G^{f16,g}_{tx})/256;];")
    signature = sig(("A", [4, 8], "float16", "input"), ("C", [4], "float16", "output"))
    program = parse_program(text)
    site = statement_sites(program)[1]
    assert format_expr(site.stmt.rhs) == "log(G^{f16,g}_{tx})/256"
    new = parse_expr("log(G^{f16,g}_{tx}**0.00390625)")
    assert conditioning_problem(program, signature, site.loops, site.stmt.rhs, new, "f16")
    assert conditioning_problem(program, signature, site.loops, site.stmt.rhs, new, "f32") is None
    assert results("logsimp", text, signature) == []
    assert results("logsimp", in_dtype(text, "f32"), sig(("A", [4, 8], "float32", "input"),
                                                               ("C", [4], "float32", "output")))


# --- the program's own rounding decides whether a reordering can be verified ----------------------------

ROW_SUMS = ("B^{4}_{tx=0}L^{64}_{a=0}[C^{f32,g}_{tx}=C^{f32,g}_{tx}+A^{f32,g}_{tx,a};];")


def test_reassociating_steps_are_refused_where_rounding_alone_uses_the_tolerance():
    from dataclasses import replace

    from strategy_cases import sig

    from leir import parse_program
    from strategies.analysis.numerics import ROUNDING_SHARE_LIMIT
    from strategies.base import Context
    from strategies.registry import get

    s = sig(("A", [4, 64], "float32", "input"), ("C", [4], "float32", "output"))
    healthy = Context(parse_program(ROW_SUMS), s, "cuda", rounding_share=0.01)
    touchy = replace(healthy, rounding_share=2 * ROUNDING_SHARE_LIMIT)
    reassociating = [t for t in get("reduction_factorization").transformations(healthy)]
    assert reassociating and all(t.exactness == "reassociating" for t in reassociating)
    assert list(get("reduction_factorization").transformations(touchy)) == []
    assert "rounding alone in float32" in touchy.reassociation_problem
    # partial sums of a vectorised reduction reorder it too; exact steps are still proposed
    vec = get("loop_vectorization")
    on_cpu = replace(healthy, target="llvm")
    assert any(t.params.get("partials") for t in vec.transformations(on_cpu))
    assert not any(t.params.get("partials") for t in vec.transformations(replace(touchy, target="llvm")))
    assert list(get("loop_split").transformations(touchy)) == list(get("loop_split").transformations(healthy))
    # the measurement goes with later states of the program
    assert touchy.with_program(touchy.program).reassociation_problem
    # not measured: nothing is refused on its account
    assert Context(parse_program(ROW_SUMS), s).reassociation_problem is None
