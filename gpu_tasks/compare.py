"""Compare a candidate's outputs with the reference outputs, draw by draw, and judge the evidence.

Metrics (maxima over draws and outputs), over the elements finite on both sides:
- max absolute error |a-e|;
- max relative error |a-e| / max(|e|, rms(e)): an element that cancels to near zero is judged
  against the output's overall magnitude (its relative error would measure the cancellation in the
  reference, not a wrong program: with random inputs some element of a large output always lands
  near zero); elements where both are zero are left out;
- relative L2 error ||a-e|| / ||e||.
Non-finite elements must agree (NaN where NaN, the same infinity where infinity) for `close`.
"""
from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass

import numpy as np

from gpu_tasks.tolerances import EXACT, Tolerance, tolerance_for
from gpu_tasks.verification import Verification

Outputs = Mapping[str, np.ndarray]


@dataclass(frozen=True, slots=True)
class ArrayDiff:
    max_abs: float
    max_rel: float
    rel_l2: float
    bitwise_equal: bool
    within_tolerance: bool
    reason: str = ""  # why it is not within tolerance
    share: float = 0.0  # the largest value/bound over the criteria: how much of the tolerance is used
    scale: float = 1.0  # max(1, rms(expected)): `max_abs / scale` is what the max_abs bound judges


def diff_arrays(expected: np.ndarray, actual: np.ndarray, tol: Tolerance, bounds: Tolerance | None = None,
                own: np.ndarray | None = None) -> ArrayDiff:
    """The metrics of `actual` against `expected`; `share` measures them against `tol`, the verdict
    against `bounds` (default `tol`; an original's bounds may be raised by PyTorch's own error,
    `raised_bounds`). `own`: PyTorch's result in the program's dtype, whose infinities (a result beyond
    float16's range, or PyTorch's own overflow) the program may have too."""
    expected, actual = np.asarray(expected), np.asarray(actual)
    if expected.shape != actual.shape:
        reason = f"shape {list(actual.shape)} differs from the reference's {list(expected.shape)}"
        return ArrayDiff(np.inf, np.inf, np.inf, False, False, reason, np.inf)
    bitwise = _bitwise_equal(expected, actual)
    e, a = expected.astype(np.float64, copy=False), actual.astype(np.float64, copy=False)
    finite = np.isfinite(e) & np.isfinite(a)
    if finite.all():  # the same elements in the same order as the selection, without copying them
        ref, err = e.reshape(-1), np.abs(a.reshape(-1) - e.reshape(-1))
    else:
        ref = e[finite]
        err = np.abs(a[finite] - ref)
    max_abs = float(err.max()) if err.size else 0.0
    max_rel = _max_relative(err, ref)
    rel_l2 = _relative_l2(err, ref)
    scale = max(1.0, float(np.sqrt(np.mean(ref * ref))) if ref.size else 0.0)
    if bitwise:
        return ArrayDiff(max_abs, max_rel, rel_l2, True, True, scale=scale)
    reason = _tolerance_violation(e, a, finite, max_abs / scale, max_rel, rel_l2, bounds or tol, own)
    share = max(_share(max_abs / scale, tol.max_abs), _share(max_rel, tol.max_rel), _share(rel_l2, tol.rel_l2))
    return ArrayDiff(max_abs, max_rel, rel_l2, False, not reason, reason, share, scale)


def raised_bounds(tol: Tolerance, own: ArrayDiff, factor: float) -> Tolerance:
    """The bounds an original is judged by against the float64 reference on one draw: each criterion's
    tolerance, or `factor` times what PyTorch itself misses by in the program's dtype (`own`: its
    result in that dtype against the float64 one), whichever is larger. PyTorch in float16 or
    bfloat16 (float32, on ill-conditioned draws: attention over large logits) is itself outside the
    dtype's tolerance on some draws; a program that computes what PyTorch computes cannot do better.
    Exact comparisons (integers, bools) stay exact; a non-finite reference is not raised over."""
    if tol == EXACT or not all(np.isfinite((own.max_abs, own.max_rel, own.rel_l2))):
        return tol
    return Tolerance(max(tol.max_abs, factor * own.max_abs / own.scale), max(tol.max_rel, factor * own.max_rel),
                     max(tol.rel_l2, factor * own.rel_l2))


def _share(value: float, bound: float) -> float:
    if value == 0:
        return 0.0
    return value / bound if bound > 0 else np.inf


def _bitwise_equal(expected: np.ndarray, actual: np.ndarray) -> bool:
    if expected.dtype == actual.dtype:
        return expected.tobytes() == actual.tobytes()
    # A reference in float64 against a lower-precision program: equal values, NaN where NaN.
    return bool(np.array_equal(expected.astype(np.float64), actual.astype(np.float64), equal_nan=True))


def _max_relative(err: np.ndarray, ref: np.ndarray) -> float:
    rms = float(np.sqrt(np.mean(ref * ref))) if ref.size else 0.0
    scale = np.maximum(np.abs(ref), rms)
    counted = scale > 0
    if counted.all():
        return float((err / scale).max()) if scale.size else 0.0
    return float((err[counted] / scale[counted]).max()) if counted.any() else 0.0


def _relative_l2(err: np.ndarray, ref: np.ndarray) -> float:
    num = float(np.sqrt(np.sum(err * err)))
    den = float(np.sqrt(np.sum(ref * ref)))
    if den == 0.0:
        return 0.0 if num == 0.0 else np.inf
    return num / den


def _tolerance_violation(e, a, finite, max_abs, max_rel, rel_l2, tol: Tolerance, own=None) -> str:
    """The first criterion that fails, or "" when all hold (all criteria, never one of several)."""
    if tol == EXACT:
        return "integer or bool values differ"
    if own is not None:  # where PyTorch in the program's dtype is non-finite, the program may be too
        o = np.asarray(own, dtype=np.float64)
        if o.shape == e.shape:
            like_own = ~np.isfinite(o) & np.isfinite(e) & ((a == o) | (np.isnan(a) & np.isnan(o)))
            e = np.where(like_own, a, e)
            finite = np.isfinite(e) & np.isfinite(a)
    if not np.array_equal(np.isnan(e), np.isnan(a)):
        return "NaN where the reference is not (or the reverse)"
    inf = ~finite & ~np.isnan(e)
    if not np.array_equal(e[inf], a[inf]):
        return "infinities differ from the reference's"
    # `max_abs` arrives divided by the output's scale max(1, rms): an absolute bound for outputs of
    # order one, and one that grows with the magnitude of large outputs (a float32 sum in the
    # thousands is off by ~1e-3 after any reassociation; that is rounding, not a wrong program).
    for name, value, bound in (("max abs (per unit of output scale)", max_abs, tol.max_abs),
                               ("max rel", max_rel, tol.max_rel),
                               ("rel L2", rel_l2, tol.rel_l2)):
        if value > bound:
            return f"{name} error {value:.3g} above {bound:g}"
    return ""


# A float output of at least MIN_ELEMENTS_FOR_SHARE elements must change between draws in at least this
# share of them. A float32 conv2d -> min -> tanh -> tanh saturated in all but one of its 196 elements;
# an `apart` rewrite then made that one constant too (release-shape survey).
MIN_VARYING_SHARE = 0.01
# The error of a verification refused for its evidence; then "output ..." when the reference's output is
# degenerate, "the program's output ..." when the program's is
DEGENERATE = "degenerate evidence: "
MIN_ELEMENTS_FOR_SHARE = 100


def degenerate_reason(name: str, draws: Sequence[np.ndarray]) -> str:
    """Why the reference outputs of `name` over the draws are no evidence ("" when they are)."""
    if all(not _informative(np.asarray(d)) for d in draws):
        return f"output {name} is all zero or non-finite on every draw"
    if len(draws) >= 2 and all(_same_bits(draws[0], d) for d in draws[1:]):
        return f"output {name} is identical on every draw: it does not depend on the inputs"
    varying = _varying_share(draws)
    if varying is not None and varying < MIN_VARYING_SHARE:
        return (f"output {name} is identical on every draw in {100 * (1 - varying):.1f}% of its elements: it "
                "barely depends on the inputs (a saturated float program), so a rewrite that rounds differently "
                "can make it constant")
    return ""


def _varying_share(draws: Sequence[np.ndarray]) -> float | None:
    """The share of elements of a float output that differ between draws (None: not judged)."""
    arrays = [np.asarray(d) for d in draws]
    if len(arrays) < 2 or arrays[0].size < MIN_ELEMENTS_FOR_SHARE or not np.issubdtype(arrays[0].dtype, np.floating):
        return None
    if any(a.shape != arrays[0].shape for a in arrays):
        return None
    first = arrays[0]
    differs = np.zeros(first.shape, dtype=bool)
    for a in arrays[1:]:
        differs |= ~((a == first) | (np.isnan(a) & np.isnan(first)))
    return float(differs.mean())


def _informative(a: np.ndarray) -> bool:
    if a.dtype == np.bool_ or np.issubdtype(a.dtype, np.integer):
        return bool(a.any())
    f = a.astype(np.float64)
    return bool(np.any(np.isfinite(f) & (f != 0)))


def _same_bits(a: np.ndarray, b: np.ndarray) -> bool:
    a, b = np.asarray(a), np.asarray(b)
    return a.shape == b.shape and a.dtype == b.dtype and a.tobytes() == b.tobytes()


def judge(expected: Sequence[Outputs], actual: Sequence[Outputs], output_codes: Mapping[str, str],
          tolerances: Mapping[str, Tolerance] | None = None, own: Sequence[Outputs] | None = None,
          own_factor: float = 2.0) -> Verification:
    """The verdict over all draws: `mismatch` as soon as one output of one draw is outside its
    tolerance; otherwise `invalid` when the evidence is degenerate on either side (the reference's or
    the program's outputs); otherwise `exact` when
    every output of every draw is bitwise equal, else `close`. With `own` (PyTorch's outputs in the
    program's dtype, for an original against the float64 reference), each draw's bounds are
    `raised_bounds` by `own_factor`; the tolerance share stays measured against the tolerance."""
    diffs, first_reason = [], ""
    for draw, (exp, act) in enumerate(zip(expected, actual, strict=True)):
        for name, code in output_codes.items():
            tol = tolerance_for(code, tolerances)
            mine = own[draw][name] if own else None
            bounds = raised_bounds(tol, diff_arrays(exp[name], mine, tol), own_factor) if own else tol
            d = diff_arrays(exp[name], act[name], tol, bounds, mine)
            diffs.append(d)
            if not d.within_tolerance and not first_reason:
                raised = "" if bounds == tol else f" (bounds raised to {own_factor:g}x PyTorch's own error)"
                first_reason = f"draw {draw}, output {name}: {d.reason}{raised}"
    metrics = dict(
        max_abs_err=max((d.max_abs for d in diffs), default=0.0),
        max_rel_err=max((d.max_rel for d in diffs), default=0.0),
        rel_l2_err=max((d.rel_l2 for d in diffs), default=0.0),
        draws=len(expected),
        bitwise_equal=all(d.bitwise_equal for d in diffs),
        tolerance_share=max((d.share for d in diffs), default=0.0),
    )
    if first_reason:
        return Verification("mismatch", error=first_reason, **metrics)
    for name in output_codes:
        # Either side: a program whose output is constant in its dtype (a float16 tanh that saturates)
        # can sit within tolerance of a reference that varies, and then proves nothing about a rewrite.
        for side, outs in (("", expected), ("the program's ", actual)):
            reason = degenerate_reason(name, [o[name] for o in outs])
            if reason:
                return Verification("invalid", error=f"{DEGENERATE}{side}{reason}", **metrics)
    return Verification("exact" if metrics["bitwise_equal"] else "close", **metrics)
