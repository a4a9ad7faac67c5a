"""What a floating-point dtype can hold, for legality that knows the program's dtype.

An identity that holds over the reals can still be a wrong step in the program's dtype: exp without
its max shift overflows in float16 at arguments above 11, an algebraic form that scales its terms
by a reduction length overflows float16's largest value (65504), and a reassociated float16 sum of
more than a few terms drifts beyond the three digits float16 carries. The rules here say why, so a
strategy refuses with the reason (or keeps the guard) instead of proposing a step that fails.

The one assumption about data: values a program reads are of magnitude up to `DATA_MAGNITUDE`
(normalised activations, logits and weights of real models; the verifier's wide-range draw reaches
10 as well). Everything else follows from the dtype's format.
"""
from __future__ import annotations

import math
from dataclasses import dataclass

DATA_MAGNITUDE = 10.0


@dataclass(frozen=True)
class FloatFormat:
    code: str                 # LEIR dtype code
    name: str
    max: float                # largest finite value
    tiny: float               # smallest positive value (subnormal): anything smaller rounds to 0
    unit_roundoff: float      # half the distance from 1 to the next value: 2**-precision
    precision: float          # relative agreement a result in this dtype is held to (see PRECISION)

    @property
    def exp_limit(self) -> float:
        """exp(x) is infinite above this argument."""
        return math.log(self.max)


# The `close` tolerance of the verification protocol (params.yaml verify.tolerance: max_abs per unit
# of output scale, rel_l2), which a test keeps in step with gpu_tasks.tolerances. A rewrite whose
# rounding alone moves results further is no step in that dtype. The relative agreement it must keep
# is the rel_l2 bound, or an eighth of the max_abs bound where that binds first: the largest of an
# output's thousands of elements sits about four standard deviations out, and a normalisation by a
# statistic of the same sum doubles it again (float16: 1e-2 / 8; the survey found a float16 layer
# norm whose 16-term variance, reassociated, moved the output by 0.0108).
TOLERANCE = {"f16": (1e-2, 1e-2), "bf16": (5e-2, 5e-2), "f32": (1e-4, 1e-5), "f64": (1e-9, 1e-9)}
PRECISION = {code: min(rel_l2, max_abs / 8) for code, (max_abs, rel_l2) in TOLERANCE.items()}

FORMATS: dict[str, FloatFormat] = {
    "f16": FloatFormat("f16", "float16", 65504.0, 2.0 ** -24, 2.0 ** -11, PRECISION["f16"]),
    "bf16": FloatFormat("bf16", "bfloat16", 3.3895313892515355e38, 2.0 ** -133, 2.0 ** -8, PRECISION["bf16"]),
    "f32": FloatFormat("f32", "float32", 3.4028234663852886e38, 2.0 ** -149, 2.0 ** -24, PRECISION["f32"]),
    "f64": FloatFormat("f64", "float64", 1.7976931348623157e308, 5e-324, 2.0 ** -53, PRECISION["f64"]),
}


def float_format(code: str) -> FloatFormat | None:
    return FORMATS.get(code)


def unshifted_exp_problem(code: str) -> str | None:
    """Why exp of a value that has lost its max shift may overflow in this dtype, or None. Two values
    of magnitude up to DATA_MAGNITUDE differ by up to twice that, so exp of such a difference (or of
    a raw value) needs that much headroom: float16's exp overflows above 11.09, so there the max shift
    is the only thing that keeps a softmax finite."""
    fmt = float_format(code)
    if fmt is None or fmt.exp_limit >= 2 * DATA_MAGNITUDE:
        return None
    return (f"in {fmt.name} exp overflows above {fmt.exp_limit:.2f}, and values of magnitude up to "
            f"{DATA_MAGNITUDE:g} differ by up to {2 * DATA_MAGNITUDE:g}: without the max shift exp can be "
            "infinite where the original is finite")


def sum_drift_problem(n: int, code: str, tensor: str, held_to: str | None = None) -> str | None:
    """Why reassociating an accumulation of `n` terms per element (or rounding each term differently)
    changes the result beyond what it is held to, or None. Each of the n additions rounds to about u
    of the running sum (u: the accumulator's dtype `code`), and a different order or different terms
    round differently: the results drift apart by about sqrt(n)*u of the sum (a random walk of n
    rounding errors). The bound is what the program's result is verified to: the accumulator's dtype,
    or the looser dtype of the outputs (`held_to`; a float32 accumulator of a float16
    program is held to float16's tolerance, so it may reorder some 4e8 terms, not 27,000)."""
    fmt = float_format(code)
    if fmt is None or n <= 1:
        return None
    result = float_format(held_to) if held_to else None
    precision = max(fmt.precision, result.precision if result else 0.0)
    drift = math.sqrt(n) * fmt.unit_roundoff
    if drift <= precision:
        return None
    held = f"a {result.name} result" if result and result.precision > fmt.precision else f"a {fmt.name} result"
    return (f"{n} terms accumulate into each element of {tensor}: in {fmt.name} (unit roundoff "
            f"{fmt.unit_roundoff:.2g}) reassociating them moves the sum by about sqrt(n)*u = {drift:.2g} of its size, "
            f"beyond the {precision:g} {held} is held to")


MANTISSA_BITS = {"f16": 11, "bf16": 8, "f32": 24, "f64": 53}


def exact_product_bits(bits: list[int], code: str) -> bool:
    """Whether a product of factors with these significand widths is exact in dtype `code` (the
    widths add up: two float16 values multiply exactly in float32, two float32 values in float64)."""
    return code in MANTISSA_BITS and sum(bits) <= MANTISSA_BITS[code]


def literal_problem(value: float, code: str) -> str | None:
    """Why a new literal cannot be written in this dtype (it would be infinite or round to 0), or None."""
    fmt = float_format(code)
    if fmt is None or value == 0 or not math.isfinite(value):
        return None
    if abs(value) > fmt.max:
        return f"the literal {value:g} is beyond {fmt.name}'s largest value {fmt.max:g}"
    if abs(value) < fmt.tiny:
        return f"the literal {value:g} rounds to 0 in {fmt.name} (smallest value {fmt.tiny:.3g})"
    return None


# A reordered program rounds differently from the original, and its outputs move by a multiple of
# what rounding alone does to the original: in the release-scale build the reassociated
# variants of transformer_prenorm (float32) moved 1.1-3.3 tolerances from the original, whose own
# rounding against the float64 reference used 0.42 of it; distillation_kl_loss 1.33 against 0.24:
# factors of 2.6 to 5.5. So where the original's rounding already uses more than this share of the
# dtype's tolerance, no reassociating step can be shown `close`, and none is proposed.
ROUNDING_SHARE_LIMIT = 0.2


def rounding_problem(share: float | None, code: str | None = None) -> str | None:
    """Why a reassociating step cannot be verified on a program whose own rounding in its dtype
    moves its outputs by `share` of the tolerance (measured against the float64 reference), or None
    (also when it was not measured)."""
    if share is None or share <= ROUNDING_SHARE_LIMIT:
        return None
    where = f" in {FORMATS[code].name}" if code in FORMATS else ""
    return (f"rounding alone{where} moves this program's outputs by {share:.2f} of the tolerance against its "
            f"float64 reference (more than {ROUNDING_SHARE_LIMIT:g}): a reordered program rounds differently "
            "and moves several times as far, beyond what `close` allows")
