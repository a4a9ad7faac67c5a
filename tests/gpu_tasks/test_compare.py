"""The verdict: exact, close only when every criterion holds on every draw, mismatch, invalid."""
from __future__ import annotations

import numpy as np
import pytest

from gpu_tasks.compare import diff_arrays, judge
from gpu_tasks.tolerances import DEFAULT_TOLERANCES, Tolerance, tolerance_for, tolerance_table

RNG = np.random.default_rng(7)
DRAWS = [RNG.standard_normal((4, 5)) for _ in range(3)]


def outputs(arrays, name="C"):
    return [{name: a} for a in arrays]


def test_bitwise_equal_draws_are_exact():
    v = judge(outputs(DRAWS), outputs([a.copy() for a in DRAWS]), {"C": "f64"})
    assert v.status == "exact" and v.bitwise_equal and v.max_abs_err == 0.0 and v.draws == 3


def test_small_float_differences_are_close():
    actual = [(a.astype(np.float32) * np.float32(1 + 1e-6)) for a in DRAWS]
    expected = [a.astype(np.float32) for a in DRAWS]
    v = judge(outputs(expected), outputs(actual), {"C": "f32"})
    assert v.status == "close" and not v.bitwise_equal
    assert 0 < v.max_rel_err < 1e-5 and 0 < v.rel_l2_err < 1e-5


def test_one_bad_draw_is_a_mismatch():
    actual = [a.copy() for a in DRAWS]
    actual[2][1, 1] += 1.0
    v = judge(outputs(DRAWS), outputs(actual), {"C": "f64"})
    assert v.status == "mismatch" and "draw 2" in v.error and v.max_abs_err == pytest.approx(1.0)


@pytest.mark.parametrize("tol, failing", [
    (Tolerance(max_abs=1e-2, max_rel=1e-2, rel_l2=1e-4), "rel L2"),
    (Tolerance(max_abs=1e-3, max_rel=1e-2, rel_l2=1e-2), "max abs"),
    (Tolerance(max_abs=1e-2, max_rel=1e-3, rel_l2=1e-2), "max rel"),
])
def test_all_criteria_must_hold(tol, failing):
    # Off by 0.5% (0.005): each tolerance passes two of the three criteria and fails the third.
    d = diff_arrays(np.ones(10), np.ones(10) * 1.005, tol)
    assert not d.within_tolerance and d.reason.startswith(failing)
    assert diff_arrays(np.ones(10), np.ones(10) * 1.005, Tolerance(1e-2, 1e-2, 1e-2)).within_tolerance


def test_an_element_that_cancels_to_near_zero_is_judged_against_the_output_magnitude():
    expected = np.array([1e-7, 5.0, -5.0, 5.0])  # rms 4.33
    d = diff_arrays(expected, expected + np.array([1e-6, 0, 0, 0]), DEFAULT_TOLERANCES["f32"])
    assert d.within_tolerance and d.max_rel == pytest.approx(1e-6 / np.sqrt(np.mean(expected ** 2)))
    big = diff_arrays(expected, expected * 1.01, DEFAULT_TOLERANCES["f32"])
    assert big.max_rel == pytest.approx(0.01)


def test_nan_patterns_must_agree():
    e = np.array([1.0, np.nan, np.inf])
    assert diff_arrays(e, e.copy(), DEFAULT_TOLERANCES["f64"]).within_tolerance
    assert not diff_arrays(e, np.array([1.0, 2.0, np.inf]), DEFAULT_TOLERANCES["f64"]).within_tolerance
    assert not diff_arrays(e, np.array([1.0, np.nan, -np.inf]), DEFAULT_TOLERANCES["f64"]).within_tolerance


def test_integer_outputs_are_exact_or_mismatch():
    idx = [np.array([0, 3, 1]), np.array([2, 2, 4]), np.array([1, 0, 0])]
    assert judge(outputs(idx), outputs([i.copy() for i in idx]), {"C": "i64"}).status == "exact"
    off = [i.copy() for i in idx]
    off[1][0] = 3
    assert judge(outputs(idx), outputs(off), {"C": "i64"}).status == "mismatch"


def test_output_identical_on_every_draw_is_invalid():
    const = [np.full((4, 5), 3.0) for _ in range(3)]
    v = judge(outputs(const), outputs([c.copy() for c in const]), {"C": "f64"})
    assert v.status == "invalid" and "does not depend on the inputs" in v.error


@pytest.mark.parametrize("fill", [0.0, np.nan, np.inf])
def test_all_zero_or_non_finite_on_every_draw_is_invalid(fill):
    # The draws differ from each other, but none holds a finite non-zero element.
    draws = [np.where(a > 0, fill, 0.0) if fill else np.where(a > 0, 0.0, -0.0) for a in DRAWS]
    v = judge(outputs(draws), outputs([d.copy() for d in draws]), {"C": "f64"})
    assert v.status == "invalid"


def test_scalar_output_that_changes_with_inputs_is_fine():
    scalars = [np.array(a.sum()) for a in DRAWS]
    assert judge(outputs(scalars), outputs([s.copy() for s in scalars]), {"C": "f64"}).status == "exact"


def test_a_mismatch_is_reported_even_when_the_reference_is_degenerate():
    const = [np.zeros((2, 2)) for _ in range(3)]
    v = judge(outputs(const), outputs([c + 1 for c in const]), {"C": "f64"})
    assert v.status == "mismatch"


def test_a_program_constant_within_tolerance_of_a_varying_reference_is_invalid():
    # float16 saturation: the reference varies in its last bits, the program's output never changes
    ref = [0.9999 + 1e-7 * a for a in DRAWS]
    prog = [np.full(a.shape, 0.9999, dtype=np.float16) for a in DRAWS]
    v = judge(outputs(ref), outputs(prog), {"C": "f16"})
    assert v.status == "invalid" and "the program's output C is identical on every draw" in v.error
    assert judge(outputs(ref), outputs([r.astype(np.float16) for r in ref]),
                 {"C": "f16"}).status == "invalid"  # the reference rounded to float16: constant too
    varying = [a.astype(np.float16) for a in DRAWS]
    assert judge(outputs(DRAWS), outputs(varying), {"C": "f16"}).status == "close"


def test_lower_precision_program_against_float64_reference():
    ref = DRAWS
    prog = [a.astype(np.float32) for a in DRAWS]
    v = judge(outputs(ref), outputs(prog), {"C": "f32"})
    assert v.status == "close" and v.max_rel_err < 1e-6


def test_tolerance_table_is_configurable():
    table = tolerance_table({"float32": {"max_abs": 1.0, "max_rel": 0.5, "rel_l2": 0.5}})
    assert table["f32"] == Tolerance(1.0, 0.5, 0.5) and table["f64"] == DEFAULT_TOLERANCES["f64"]
    assert tolerance_for("i32", table) == Tolerance(0, 0, 0)
    loose = [a * 1.2 for a in DRAWS]
    f32 = [a.astype(np.float32) for a in DRAWS]
    assert judge(outputs(f32), outputs([x.astype(np.float32) for x in loose]), {"C": "f32"}).status == "mismatch"
    assert judge(outputs(f32), outputs([x.astype(np.float32) for x in loose]), {"C": "f32"},
                 table).status == "close"


def test_json_form_has_no_nan():
    v = judge(outputs([np.array([0.0, 1.0])] * 1), outputs([np.array([1.0, 1.0])]), {"C": "f64"})
    assert v.status == "mismatch" and v.to_json()["max_abs_err"] == 1.0


def test_the_absolute_bound_scales_with_large_outputs():
    """A float32 sum in the thousands off by 1e-3 is rounding (close); the same error on outputs of
    order one is not (mismatch)."""
    import numpy as np

    from gpu_tasks.compare import diff_arrays
    from gpu_tasks.tolerances import DEFAULT_TOLERANCES

    tol = DEFAULT_TOLERANCES["f32"]
    big = np.linspace(1000, 3000, 64)
    assert diff_arrays(big, big + 1e-3, tol).within_tolerance
    small = np.linspace(-1, 1, 64)
    assert not diff_arrays(small, small + 1e-3, tol).within_tolerance


def test_tolerance_share_says_how_much_of_the_tolerance_the_differences_use():
    tol = DEFAULT_TOLERANCES["f64"]
    assert judge(outputs(DRAWS), outputs([a.copy() for a in DRAWS]), {"C": "f64"}).tolerance_share == 0.0
    # outputs of magnitude c (rms c, so max abs per unit of output scale = rel L2 = the relative
    # change): a change of a quarter of the bound uses a quarter of the tolerance
    assert tol.max_abs == tol.rel_l2
    signs = np.sign(DRAWS[0])
    expected = [c * signs for c in (2.0, 3.0, 4.0)]
    v = judge(outputs(expected), outputs([a * (1 + tol.rel_l2 / 4) for a in expected]), {"C": "f64"})
    assert v.status == "close" and v.tolerance_share == pytest.approx(0.25, rel=1e-3)
    v = judge(outputs(expected), outputs([a * (1 + 3 * tol.rel_l2) for a in expected]), {"C": "f64"})
    assert v.status == "mismatch" and v.tolerance_share == pytest.approx(3, rel=1e-3)
    assert v.to_json()["tolerance_share"] == pytest.approx(3, rel=1e-3)


def test_an_output_that_varies_in_almost_no_element_is_no_evidence():
    """A saturated float program (conv2d -> min -> tanh -> tanh in float32: 195 of 196 elements the
    same on every draw) proves nothing about a rewrite; one that varies in 2% of them does."""
    base = np.full((14, 14), 0.7615942, dtype=np.float32)
    saturated = [base.copy() for _ in range(3)]
    for k, d in enumerate(saturated):
        d[0, 0] = 0.5 + k
    v = judge(outputs(saturated), outputs([d.copy() for d in saturated]), {"C": "f32"})
    assert v.status == "invalid" and "barely depends on the inputs" in v.error
    enough = [d.copy() for d in saturated]
    for k, d in enumerate(enough):
        d[1, :4] = k
    assert judge(outputs(enough), outputs([d.copy() for d in enough]), {"C": "f32"}).status == "exact"


# --- originals against PyTorch: the bounds PyTorch's own error in the program's dtype sets ------------

def _off(arrays, rel):
    """`arrays` moved by a relative `rel` (an error of that size on every element)."""
    return [a * (1 + rel) for a in arrays]


def test_an_original_may_miss_the_reference_by_twice_what_pytorch_misses_it_by():
    """float16 rel L2 tolerance 1e-2: PyTorch's own result off by 3e-2 on every draw (an ill-conditioned
    input) lets a program off by up to 6e-2 through, not one off by 8e-2; the share stays measured
    against the tolerance itself."""
    own = outputs(_off(DRAWS, 3e-2))
    close = judge(outputs(DRAWS), outputs(_off(DRAWS, 5e-2)), {"C": "f16"}, own=own)
    assert close.status == "close" and close.tolerance_share > 1
    far = judge(outputs(DRAWS), outputs(_off(DRAWS, 8e-2)), {"C": "f16"}, own=own)
    assert far.status == "mismatch" and "PyTorch's own error" in far.error
    without = judge(outputs(DRAWS), outputs(_off(DRAWS, 5e-2)), {"C": "f16"})
    assert without.status == "mismatch"


def test_where_pytorch_is_within_tolerance_the_bounds_stay_the_tolerance():
    own = outputs(_off(DRAWS, 1e-4))
    v = judge(outputs(DRAWS), outputs(_off(DRAWS, 2e-2)), {"C": "f16"}, own=own)
    assert v.status == "mismatch" and "PyTorch" not in v.error


def test_an_integer_output_stays_exact_whatever_pytorch_does():
    ints = [np.arange(20).reshape(4, 5) for _ in range(3)]
    own = outputs([i + 1 for i in ints])
    assert judge(outputs(ints), outputs([i + 1 for i in ints]), {"C": "i64"}, own=own).status == "mismatch"


def test_infinities_where_pytorch_in_the_dtype_overflows_too():
    """A result beyond float16's range is inf in PyTorch's float16 run; the program may have the same
    inf (same place, same sign), not another one."""
    expected = [a * 1.0 for a in DRAWS]
    expected[0][0, 0] = 1e6
    own = [a.copy() for a in expected]
    own[0][0, 0] = np.inf
    program = [a.copy() for a in own]
    assert judge(outputs(expected), outputs(program), {"C": "f16"}).status == "mismatch"
    assert judge(outputs(expected), outputs(program), {"C": "f16"}, own=outputs(own)).status == "close"
    program[0][0, 1] = np.inf
    assert judge(outputs(expected), outputs(program), {"C": "f16"}, own=outputs(own)).status == "mismatch"


def test_a_finite_result_where_pytorch_in_the_dtype_overflows_is_fine():
    """PyTorch's float16 loss overflows its half-precision sum; the program accumulates in float32."""
    own = [a.copy() for a in DRAWS]
    own[1][2, 2] = -np.inf
    assert judge(outputs(DRAWS), outputs([a.copy() for a in DRAWS]), {"C": "f16"}, own=outputs(own)).status == "exact"


@pytest.mark.parametrize("dtype", [np.float32, np.float64, np.float16])
def test_all_finite_outputs_get_the_metrics_of_the_masked_path_bit_for_bit(dtype):
    """When every element is finite on both sides, diff_arrays reads the arrays whole instead of
    selecting the finite elements: the same elements in the same order, so the same floats as the
    selection gives (here forced by one NaN that both sides share)."""
    rng = np.random.default_rng(7)
    expected = rng.standard_normal((64, 48)).astype(dtype)
    expected[3, 5] = 0
    actual = (expected * (1 + 1e-4 * rng.standard_normal(expected.shape))).astype(dtype)
    tol = tolerance_for(np.dtype(dtype).name[0] + str(np.dtype(dtype).itemsize * 8), None)
    whole = diff_arrays(expected, actual, tol)
    masked = diff_arrays(np.append(expected.ravel(), np.nan), np.append(actual.ravel(), np.nan), tol)
    assert (whole.max_abs, whole.max_rel, whole.rel_l2, whole.scale, whole.share, whole.within_tolerance) == (
        masked.max_abs, masked.max_rel, masked.rel_l2, masked.scale, masked.share, masked.within_tolerance)
    assert whole.max_rel > 0 and not whole.bitwise_equal
