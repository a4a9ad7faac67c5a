"""Element-wise operators: activations, arithmetic with broadcasting, comparisons, selection, casts.

Each is one nest over the result; tanh-like activations that need `exp(u)` and `exp(-u)` compute
them into temporaries first (docs/leir.md §5 spells tanh `(exp(x)-exp(-x))/(exp(x)+exp(-x))`).
"""
from __future__ import annotations

import math

import torch

from leir.frontend.emit import Emitter, Ref, operand, store
from leir.frontend.expr import X, both, either, erf, exp, fabs, log, select, sqrt, vmax, vmin
from leir.frontend.registry import UnsupportedForm, op

SELU_ALPHA = 1.6732632423543772848170429916717
SELU_SCALE = 1.0507009873554804934193349852946
SQRT_2_OVER_PI = math.sqrt(2.0 / math.pi)


def pointwise(em: Emitter, out: Ref, fn, *operands) -> None:
    """`out = fn(*operands)` element by element, operands broadcast to the result."""
    def body(*v):
        return store(out, v, fn(*(operand(x, v, out.shape) for x in operands)))
    em.nest(out.shape, body)


# tanh(u) rounds to +-1 in every float dtype beyond these bounds; clamping there first keeps
# exp(u) finite (docs/leir.md §5's spelling would give inf/inf = NaN where PyTorch gives +-1).
TANH_SATURATION = {"f16": 9, "bf16": 20, "f32": 20, "f64": 20}


def pointwise_with_tanh(em: Emitter, out: Ref, inner, outer, *operands) -> None:
    """`out = outer(x..., tanh(inner(x...)))`: `exp(u)` and `exp(-u)` go to temporaries first."""
    pos, neg = em.temp(out.shape, out.code), em.temp(out.shape, out.code)
    bound = TANH_SATURATION.get(out.code, 20)

    def body(*v):
        xs = [operand(x, v, out.shape) for x in operands]
        u = vmin(vmax(inner(*xs), -bound), bound)
        ep, en = pos.at(*v), neg.at(*v)
        return [store(pos, v, exp(u)), store(neg, v, exp(-u)),
                store(out, v, outer(*xs, (ep - en) / (ep + en)))]
    em.nest(out.shape, body)


_HALF_TORCH = {"f16": "float16", "bf16": "bfloat16"}


def bound(value: float, code: str, op: str) -> float:
    """The literal that a `code` value `x` is compared with, so that `x op literal` in that dtype (a
    literal takes the dtype of what it is compared with, docs/leir.md §4.5) decides as PyTorch does: its
    float16 and bfloat16 kernels compare in float32, i.e. with `value` itself. A `value` the dtype
    cannot hold lies between two of its values lo < value < hi, and `x > value` is `x > lo`, `x <
    value` is `x < hi` (`threshold(x, 0.1, 20)` in bfloat16 would otherwise keep x = 0.10009765625,
    which is bfloat16's 0.1)."""
    if code not in _HALF_TORCH or not math.isfinite(value):
        return value
    dtype = getattr(torch, _HALF_TORCH[code])
    near = torch.tensor(value, dtype=dtype)
    if near.item() == value:
        return value
    toward = float("-inf") if op in (">", "<=") else float("inf")
    if (near.item() > value) == (op in (">", "<=")):  # the nearest value is on the wrong side
        near = torch.nextafter(near, torch.tensor(toward, dtype=dtype))
    return near.item()


def sigmoid_of(x):
    return 1 / (1 + exp(-x))


def softplus_of(x, beta=1.0, threshold=20.0):
    bx = x if beta == 1 else x * beta
    soft = log(1 + exp(bx)) if beta == 1 else log(1 + exp(bx)) / beta
    return select(bx.gt(threshold), x, soft)


_UNARY = {
    "relu": lambda x: vmax(x, 0),
    "relu6": lambda x: vmin(vmax(x, 0), 6),
    "sigmoid": sigmoid_of,
    "silu": lambda x: x / (1 + exp(-x)),
    "softsign": lambda x: x / (1 + fabs(x)),
    "selu": lambda x: SELU_SCALE * select(x.gt(0), x, SELU_ALPHA * (exp(x) - 1)),
    "hardswish": lambda x: x * vmin(vmax(x + 3, 0), 6) / 6,
    "hardsigmoid": lambda x: vmin(vmax(x + 3, 0), 6) / 6,
    "logsigmoid": lambda x: vmin(x, 0) - log(1 + exp(-fabs(x))),  # stable for large |x|
    "exp": exp, "log": log, "sqrt": sqrt, "abs": fabs, "erf": erf,
    "neg": lambda x: -x,
    "reciprocal": lambda x: 1 / x,
    "rsqrt": lambda x: 1 / sqrt(x),
    "square": lambda x: x * x,
    "log1p": lambda x: log(1 + x),
    "expm1": lambda x: exp(x) - 1,
    "log2": lambda x: log(x) / math.log(2.0),
    "log10": lambda x: log(x) / math.log(10.0),
    "exp2": lambda x: 2 ** x,
    "sign": lambda x: select(x.gt(0), 1, select(x.lt(0), -1, 0)),
    "positive": lambda x: x,
}


# In float16, exp overflows above 11: 1/(1+exp(-x)) is 0 below -11 where PyTorch's sigmoid (computed
# in float32, rounded once) is a subnormal, and log(1+exp(x)) is inf where softplus is x. These run in
# float32 in half-precision programs, as PyTorch's kernels do (registry.FLOAT32_KERNELS).
_FLOAT32_UNARY = ("sigmoid",)


def _unary(name, fn):
    @op(name, float32_kernel=name in _FLOAT32_UNARY)
    def handler(em, out, x, *_, **__):
        pointwise(em, out, fn, x)
    return handler


for _name, _fn in _UNARY.items():
    _unary(_name, _fn)


@op("tanh")
def tanh(em, out, x):
    pointwise_with_tanh(em, out, lambda x: x, lambda x, t: t, x)


@op("tanhshrink")
def tanhshrink(em, out, x):
    pointwise_with_tanh(em, out, lambda x: x, lambda x, t: x - t, x)


@op("mish")
def mish(em, out, x):
    pointwise_with_tanh(em, out, lambda x: log(1 + exp(x)), lambda x, t: x * t, x)


@op("gelu")
def gelu(em, out, x, approximate="none"):
    if approximate == "none":
        pointwise(em, out, lambda x: x * 0.5 * (1 + erf(x / sqrt(2))), x)
    elif approximate == "tanh":
        pointwise_with_tanh(em, out, lambda x: SQRT_2_OVER_PI * (x + 0.044715 * x ** 3),
                            lambda x, t: 0.5 * x * (1 + t), x)
    else:
        raise UnsupportedForm(f"approximate={approximate!r}")


@op("leaky_relu")
def leaky_relu(em, out, x, negative_slope=0.01):
    pointwise(em, out, lambda x: select(x.gt(0), x, x * negative_slope), x)


@op("elu")
def elu(em, out, x, alpha=1.0):
    pointwise(em, out, lambda x: select(x.gt(0), x, alpha * (exp(x) - 1)), x)


@op("celu")
def celu(em, out, x, alpha=1.0):
    pointwise(em, out, lambda x: vmax(x, 0) + vmin(alpha * (exp(x / alpha) - 1), 0), x)


@op("softplus", float32_kernel=True)
def softplus(em, out, x, beta=1.0, threshold=20.0):
    pointwise(em, out, lambda x: softplus_of(x, beta, threshold), x)


@op("hardtanh")
def hardtanh(em, out, x, min_val=-1.0, max_val=1.0):
    pointwise(em, out, lambda x: vmin(vmax(x, min_val), max_val), x)


@op("hardshrink")
def hardshrink(em, out, x, lambd=0.5):
    hi, lo = bound(lambd, x.code, ">"), bound(-lambd, x.code, "<")
    pointwise(em, out, lambda x: select(either(x.gt(hi), x.lt(lo)), x, 0), x)


@op("softshrink")
def softshrink(em, out, x, lambd=0.5):
    hi, lo = bound(lambd, x.code, ">"), bound(-lambd, x.code, "<")
    pointwise(em, out, lambda x: select(x.gt(hi), x - lambd, select(x.lt(lo), x + lambd, 0)), x)


@op("threshold")
def threshold(em, out, x, threshold, value):
    limit = bound(threshold, x.code, ">")
    pointwise(em, out, lambda x: select(x.gt(limit), x, value), x)


@op("prelu")
def prelu(em, out, x, weight):
    # The weight has one value per channel (dimension 1) or a single value.
    def body(*v):
        xv = x.at(*v)
        w = weight.at(v[1] if weight.shape[0] > 1 else 0)
        return store(out, v, select(xv.gt(0), xv, w * xv))
    em.nest(out.shape, body)


# --- binary arithmetic -------------------------------------------------------------------------------

def _scaled(b, alpha):
    return b if alpha == 1 else b * alpha


@op("add")
def add(em, out, a, b, alpha=1):
    pointwise(em, out, lambda a, b: a + _scaled(b, alpha), a, b)


@op("sub")
def sub(em, out, a, b, alpha=1):
    pointwise(em, out, lambda a, b: a - _scaled(b, alpha), a, b)


@op("rsub")
def rsub(em, out, a, b, alpha=1):
    pointwise(em, out, lambda a, b: b - _scaled(a, alpha), a, b)


@op("mul")
def mul(em, out, a, b):
    pointwise(em, out, lambda a, b: a * b, a, b)


@op("div")
def div(em, out, a, b, rounding_mode=None):
    if rounding_mode is None:
        pointwise(em, out, lambda a, b: a / b, a, b)
    elif rounding_mode == "floor":
        pointwise(em, out, lambda a, b: a // b, a, b)
    else:
        raise UnsupportedForm(f"rounding_mode={rounding_mode!r}")


@op("floor_divide")
def floor_divide(em, out, a, b):
    pointwise(em, out, lambda a, b: a // b, a, b)


@op("remainder")
def remainder(em, out, a, b):
    pointwise(em, out, lambda a, b: a % b, a, b)


@op("pow")
def power(em, out, a, b):
    pointwise(em, out, lambda a, b: a ** b, a, b)


@op("maximum", "fmax")
def maximum(em, out, a, b):
    pointwise(em, out, vmax, a, b)


@op("minimum", "fmin")
def minimum(em, out, a, b):
    pointwise(em, out, vmin, a, b)


@op("addcmul")
def addcmul(em, out, x, t1, t2, value=1):
    pointwise(em, out, lambda x, a, b: x + _scaled(a * b, value), x, t1, t2)


@op("addcdiv")
def addcdiv(em, out, x, t1, t2, value=1):
    pointwise(em, out, lambda x, a, b: x + _scaled(a / b, value), x, t1, t2)


@op("lerp")
def lerp(em, out, start, end, weight):
    pointwise(em, out, lambda s, e, w: s + w * (e - s), start, end, weight)


@op("hypot")
def hypot(em, out, a, b):
    pointwise(em, out, lambda a, b: sqrt(a * a + b * b), a, b)


@op("xlogy")
def xlogy(em, out, a, b):
    pointwise(em, out, lambda a, b: select(a.eq(0), 0, a * log(b)), a, b)


# --- comparisons, logic, selection ---------------------------------------------------------------------

_COMPARE = {"eq": "eq", "ne": "ne", "lt": "lt", "le": "le", "gt": "gt", "ge": "ge"}


def _comparison(name, method):
    @op(name)
    def handler(em, out, a, b):
        pointwise(em, out, lambda a, b: select(getattr(a, method)(b), 1, 0), a, b)
    return handler


for _name, _method in _COMPARE.items():
    _comparison(_name, _method)


@op("logical_and")
def logical_and(em, out, a, b):
    pointwise(em, out, lambda a, b: select(both(_truth(a), _truth(b)), 1, 0), a, b)


@op("logical_or")
def logical_or(em, out, a, b):
    pointwise(em, out, lambda a, b: select(either(_truth(a), _truth(b)), 1, 0), a, b)


@op("logical_not")
def logical_not(em, out, a):
    pointwise(em, out, lambda a: select(_truth(a), 0, 1), a)


def _truth(x: X):
    return x.node if _is_bool(x) else x.ne(0)


def _is_bool(x: X) -> bool:
    return getattr(x.node, "dtype", None) == "bool"


@op("where")
def where(em, out, condition, a=None, b=None):
    if a is None:
        raise UnsupportedForm("where(condition) with one argument (data-dependent shape)")
    pointwise(em, out, lambda c, a, b: select(_truth(c), a, b), condition, a, b)


@op("masked_fill")
def masked_fill(em, out, x, mask, value):
    pointwise(em, out, lambda x, m, v: select(_truth(m), v, x), x, mask, value)


@op("clamp")
def clamp(em, out, x, min=None, max=None):  # noqa: A002 - PyTorch's parameter names
    def fn(x, lo, hi):
        y = x if lo is None else vmax(x, lo)
        return y if hi is None else vmin(y, hi)
    lo = min if min is not None else 0
    hi = max if max is not None else 0
    pointwise(em, out, lambda x, a, b: fn(x, a if min is not None else None, b if max is not None else None),
              x, lo, hi)


@op("clamp_min")
def clamp_min(em, out, x, min):  # noqa: A002
    pointwise(em, out, vmax, x, min)


@op("clamp_max")
def clamp_max(em, out, x, max):  # noqa: A002
    pointwise(em, out, vmin, x, max)


@op("nan_to_num")
def nan_to_num(em, out, x, nan=0.0, posinf=None, neginf=None):
    pointwise(em, out, lambda x: x, x)


# --- copies: identity-like operators and casts -------------------------------------------------------

@op("clone", "contiguous", "detach", "to", "type", "float", "double", "half", "bfloat16", "long", "int",
    "bool", "type_as", "alias", "cpu", "cuda")
def copy_like(em, out, x, *_, **__):
    pointwise(em, out, lambda x: x, x)


@op("dropout", "feature_alpha_dropout", "alpha_dropout", "dropout1d", "dropout2d", "dropout3d")
def dropout(em, out, x, p=0.5, training=True, *_, **__):
    if training and p > 0:
        raise UnsupportedForm("random dropout in training mode (use p=0 or eval())")
    pointwise(em, out, lambda x: x, x)


@op("glu")
def glu(em, out, x, dim=-1):
    d = dim % x.rank
    half = x.shape[d] // 2

    def body(*v):
        second = list(v)
        second[d] = v[d] + half
        return store(out, v, x.at(*v) * sigmoid_of(x.at(*second)))
    em.nest(out.shape, body)
