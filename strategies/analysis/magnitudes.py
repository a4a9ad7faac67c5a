"""The largest values an expression computes, sampled: every tensor it reads takes values across its
interval (`ranges.tensor_ranges`), endpoints included, and every operation is evaluated in float64 on
those samples. Intervals alone are too coarse to compare an expression with its rewrite
((D-E)/(D+E) with D, E in [0, 8103] gets the interval +-3e7, though it stays in [-1, 1]); samples
see what each form really computes, and an expression and its rewrite see the same samples.

`overflow_problem` uses them: a rewrite may not compute a value beyond the dtype's largest one where
the original stays within it, nor write a literal the dtype cannot hold.
"""
from __future__ import annotations

import hashlib

import numpy as np

from leir.analysis import loop_bounds
from leir.ast import Access, And, BinOp, Call, Compare, Neg, Num, Or, Program, Select, Var, walk_expr
from leir.printer import format_expr
from leir.signature import Signature
from strategies.analysis.numerics import DATA_MAGNITUDE, FORMATS, literal_problem
from strategies.analysis.ranges import Interval, tensor_ranges

SAMPLES = 512


class _Unknown(Exception):
    """A value the sampling cannot stand for (an unknown range, an integer gather)."""


def _leaf_samples(text: str, r: Interval) -> np.ndarray:
    """Samples across [lo, hi], the same for the same leaf in every expression: the endpoints, values
    spread evenly, and magnitudes spread over six decades (small divisors matter as much as large
    values)."""
    if not r.known:
        raise _Unknown(text)
    rng = np.random.default_rng(int.from_bytes(hashlib.sha256(text.encode()).digest()[:8], "little"))
    lo, hi = r.lo, r.hi
    even = rng.uniform(lo, hi, SAMPLES // 2)
    top = max(abs(lo), abs(hi))
    spread = np.clip(np.sign(rng.uniform(-1, 1, SAMPLES // 2 - 2)) * top * 10.0 ** rng.uniform(-6, 0, SAMPLES // 2 - 2),
                     lo, hi)
    return np.concatenate([[lo, hi], even, spread])


def _evaluate(expr, leaves, peaks: list, bounds, dtype=np.float64) -> np.ndarray:
    """Values of `expr` on the samples, every operation rounded to `dtype` (numpy computes float16
    operations in float32 and rounds each result); the largest finite magnitude of every operation it
    computes (not of the leaves it reads) is appended to `peaks`."""
    match expr:
        case Num(value=v):
            return np.full(SAMPLES, float(v), dtype=dtype)
        case Var(name=n):
            lo, hi = bounds.get(n, (0, 0))
            return _leaf_samples(n, Interval(float(lo), float(hi))).astype(dtype)
        case Access():
            return leaves(expr).astype(dtype)
    with np.errstate(all="ignore"):
        out = np.asarray(_operation(expr, leaves, peaks, bounds, dtype)).astype(dtype)
    finite = np.abs(out[np.isfinite(out)]).astype(np.float64)
    peaks.append((expr, float(finite.max()) if finite.size else 0.0))
    return out


def _operation(expr, leaves, peaks, bounds, dtype) -> np.ndarray:
    def ev(e):
        return _evaluate(e, leaves, peaks, bounds, dtype)

    match expr:
        case Neg(operand=a):
            return -ev(a)
        case BinOp(op="+", lhs=a, rhs=b):
            return ev(a) + ev(b)
        case BinOp(op="-", lhs=a, rhs=b):
            return ev(a) - ev(b)
        case BinOp(op="*", lhs=a, rhs=b):
            return ev(a) * ev(b)
        case BinOp(op="/", lhs=a, rhs=b):
            return ev(a) / ev(b)
        case BinOp(op="**", lhs=a, rhs=b):
            return np.power(ev(a), ev(b))
        case Call(fn=f, args=(a,)) if f in _UNARY:
            return _UNARY[f](ev(a))
        case Call(fn="max", args=(a, b)):
            return np.maximum(ev(a), ev(b))
        case Call(fn="min", args=(a, b)):
            return np.minimum(ev(a), ev(b))
        case Select(cond=c, then=t, otherwise=o):
            return np.where(_condition(c, ev), ev(t), ev(o))
    raise _Unknown(format_expr(expr))


def _condition(c, ev) -> np.ndarray:
    match c:
        case Compare(operands=xs, ops=ops):
            vals = [ev(x) for x in xs]
            out = np.ones(SAMPLES, dtype=bool)
            for (a, b), op in zip(zip(vals, vals[1:], strict=False), ops, strict=True):
                out &= {"<": np.less, "<=": np.less_equal, ">": np.greater, ">=": np.greater_equal,
                        "==": np.equal, "!=": np.not_equal}[op](a, b)
            return out
        case And(terms=ts):
            return np.logical_and.reduce([_condition(t, ev) for t in ts])
        case Or(terms=ts):
            return np.logical_or.reduce([_condition(t, ev) for t in ts])
    return ev(c) != 0


def _erf(x):
    from math import erf

    return np.vectorize(erf, otypes=[float])(x)


_UNARY = {"exp": np.exp, "fast_exp": np.exp, "log": np.log, "fast_log": np.log, "sqrt": np.sqrt, "abs": np.abs,
          "erf": _erf, "fast_erf": _erf}


def _leaves(ranges: dict[str, Interval]):
    """Samples per access, by its text (the same access reads the same values everywhere)."""
    cache: dict = {}

    def leaves(acc: Access) -> np.ndarray:
        key = format_expr(acc)
        if key not in cache:
            if any(isinstance(n, Access) for ix in acc.indices for n in walk_expr(ix)):
                raise _Unknown(key)  # a gather
            cache[key] = _leaf_samples(key, ranges.get(acc.tensor, Interval(-np.inf, np.inf)))
        return cache[key]
    return leaves


def sampled_peak(expr, ranges: dict[str, Interval], bounds) -> tuple[float, object] | None:
    """(largest magnitude any operation of `expr` computes on the samples, that operation), or None
    when a value it reads has no known range."""
    peaks: list = []
    try:
        _evaluate(expr, _leaves(ranges), peaks, bounds)
    except _Unknown:
        return None
    if not peaks:
        return 0.0, expr
    node, value = max(peaks, key=lambda p: p[1])
    return value, node


def overflow_problem(program: Program, signature: Signature, loops, old, new, code: str) -> str | None:
    """Why replacing expression `old` by `new` (in a statement under `loops`) may overflow the dtype
    `code`, or None: a new literal the dtype cannot hold, or an operation of `new` that exceeds the
    dtype's largest value where `old` stays within it (or exceeds it by far less)."""
    fmt = FORMATS.get(code)
    if fmt is None:
        return None
    known = {float(n.value) for n in walk_expr(old) if isinstance(n, Num)}
    for n in walk_expr(new):
        if isinstance(n, Num) and float(n.value) not in known:
            problem = literal_problem(float(n.value), code)
            if problem:
                return problem
    ranges = tensor_ranges(program, signature)
    bounds = loop_bounds(loops)
    before, after = sampled_peak(old, ranges, bounds), sampled_peak(new, ranges, bounds)
    if before is None or after is None:
        return None
    (old_peak, _), (new_peak, node) = before, after
    if new_peak <= fmt.max or new_peak <= (old_peak if old_peak <= fmt.max else 2 * old_peak):
        return None
    return (f"{format_expr(node)} reaches {new_peak:.3g} for inputs up to {DATA_MAGNITUDE:g} in magnitude, beyond "
            f"{fmt.name}'s largest value {fmt.max:g} (the original expression stays within {old_peak:.3g})")


NUMPY_TYPES = {"f16": np.float16, "f32": np.float32}
CONDITIONING_QUANTILE = 90   # most sampled values, not the worst one near a zero of the result
CONDITIONING_FACTOR = 4      # the rewrite must round at least this much worse than the original


def _percentile_error(values: np.ndarray, reference: np.ndarray) -> float | None:
    """The CONDITIONING_QUANTILE-th percentile of |values - reference| / |reference| (non-finite
    values count as infinitely wrong; samples where the reference is 0 or not finite are left out)."""
    scale = np.abs(reference)
    keep = np.isfinite(reference) & (scale > 0)
    if not keep.any():
        return None
    with np.errstate(all="ignore"):
        err = np.abs(values.astype(np.float64)[keep] - reference[keep]) / scale[keep]
        return float(np.percentile(np.where(np.isfinite(err), err, np.inf), CONDITIONING_QUANTILE))


def conditioning_problem(program: Program, signature: Signature, loops, old, new, code: str) -> str | None:
    """Why `new` loses the conditioning of `old` in the dtype, or None: evaluated in the dtype on the
    samples, most values of `new` are off by more than the dtype's precision, and several times more
    than `old` is (expanding (A-G)**2 into A**2-2*A*G+G**2 cancels where A is close to G; a fractional
    power rounds to 1 before its log). float64 rewrites are not judged (nothing wider to compare with)."""
    fmt = FORMATS.get(code)
    if fmt is None or code not in NUMPY_TYPES:
        return None
    bounds = loop_bounds(loops)
    rounded, dtype = _leaves(tensor_ranges(program, signature)), NUMPY_TYPES[code]

    def in_dtype(acc):  # the values a program of this dtype reads
        return rounded(acc).astype(dtype)

    try:
        reference = _evaluate(old, lambda acc: in_dtype(acc).astype(np.float64), [], bounds)
        before = _percentile_error(_evaluate(old, in_dtype, [], bounds, dtype), reference)
        after = _percentile_error(_evaluate(new, in_dtype, [], bounds, dtype), reference)
    except _Unknown:
        return None
    if before is None or after is None or after <= fmt.precision or after <= CONDITIONING_FACTOR * before:
        return None
    return (f"evaluated in {fmt.name}, {CONDITIONING_QUANTILE}% of sampled values of the rewritten expression are off "
            f"by up to {after:.2g} of the exact value (the original: {before:.2g}), beyond the {fmt.precision:g} a "
            f"{fmt.name} result is held to: the new form cancels or rounds away digits the original keeps")
