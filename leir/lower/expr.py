"""Typed translation of LEIR expressions into TIR expressions (docs/leir.md §3 notes, §4.5).

Typing rules (deterministic, and equal to PyTorch's wherever a program has one dtype):
- a statement computes in the dtype of its left-hand side (docs/leir.md §4.5, mixed precision): an access
  of another dtype is converted to it where it is read, so `E^{f32}=E^{f32}+A^{f16}*C^{f16}`
  multiplies in float32 (exactly: the product of two float16 values fits), and the store rounds
  once; a literal takes that dtype too, and a bare index is the loop counter converted to it;
- a condition computes in the dtype of what it compares, not the statement's: `A^{f32}>=D^{f32}`
  compares floats in an int64 statement (argmax), `A^{f16}<D^{f32}` compares in float32, and a bare
  bool access tests itself;
- where operands still differ (an integer statement's true division, a comparison of an int with a
  float) they are promoted: float beats int, the wider float wins (float16 with bfloat16 gives
  float32), the wider int wins (signed and unsigned of one width give the next signed width), bool
  loses to everything;
- `/` is true division (integers divide in the literal dtype when it is a float, else float32);
  `//` and `%` use floor semantics for integers and floats alike (PyTorch's `//` and `remainder`);
- `**` with an integer exponent up to 8 (or its negative) is repeated multiplication, `**0.5` is
  `sqrt` (what PyTorch does); any other exponent is `pow` in float;
- `exp log sqrt erf` compute in the operand's float type; float16 and bfloat16 compute in float32
  and round back (LLVM has no half-precision `erf`, and PyTorch does the same); integers use float32;
- `fast_exp`, `fast_log`, `fast_erf` (extensions, leir/ast.py) are `fast_exp_f32`, `fast_log_f32`,
  `fast_erf_f32`: polynomials in plain arithmetic, in float32 whatever the operand's type (rounded
  back to it), so that a vector loop stays vector code;
- a comparison of two pure index expressions (integers and loop indices only) compares integers;
  otherwise its literals and indices take the promoted dtype of the tensors it compares, so that
  `A_{i}==j` with an int64 `A` compares int64 even in a float16 statement;
- subscripts are int32 index arithmetic (int64 in a program with a tensor of more than 2^31-1
  elements); an access inside a subscript (a gather) is cast to that dtype.
"""
from __future__ import annotations

import math

import ml_dtypes
from tvm import tirx
from tvm.script.ir_builder import tirx as tb

from leir.analysis import MAX_POWER_BY_MULTIPLICATION, integral_exponent
from leir.ast import Access, And, BinOp, Call, Compare, Neg, Num, Or, Select, Var
from leir.dtypes import CODE_TO_TORCH
from leir.lower.check import LoweringError

INDEX_DTYPE = "int32"
INT32_MAX = 2**31 - 1


def index_dtype(shapes) -> str:
    """The dtype of loop variables and subscripts of a program whose tensors have `shapes`: int32, as
    TVM's own default, unless a tensor has more elements than int32 counts (its flattened offset
    `a*65536+b` would wrap)."""
    return "int64" if any(math.prod(s) > INT32_MAX for s in shapes) else INDEX_DTYPE


def index_shape(shape, dtype: str):
    """A buffer shape whose extents are of the subscripts' dtype."""
    return list(shape) if dtype == INDEX_DTYPE else [tirx.const(d, dtype) for d in shape]
_COMPARE = {"<": tirx.LT, "<=": tirx.LE, ">": tirx.GT, ">=": tirx.GE, "==": tirx.EQ, "!=": tirx.NE}
_MATH = {"exp": tirx.exp, "log": tirx.log, "sqrt": tirx.sqrt, "erf": tirx.erf}


# Cephes' expf: exp(x) = 2**n * exp(r) with n = round(x / ln 2), r = x - n*ln 2 in [-ln2/2, ln2/2]
# (ln 2 in two parts, so r is exact), exp(r) by a degree-7 polynomial; 2**n is built in the exponent
# bits. Relative error about 2e-7 over the whole float32 range, and every operation vectorises.
_EXP_HI, _EXP_LO = 88.72283935546875, -87.33654475055310   # exp is inf above / subnormal below
_LN2_HI, _LN2_LO = 0.693359375, -2.12194440e-4
_EXP_POLY = (1.9875691500e-4, 1.3981999507e-3, 8.3334519073e-3, 4.1665795894e-2, 1.6666665459e-1,
             5.0000001201e-1)


def fast_exp_f32(x):
    """exp of a float32 TIR expression without a call to `expf` (see `_EXP_POLY`). The operand, the
    exponent `n` and the remainder `r` are bound once (`Let`): written out, each would be copied into
    the tree some twenty times, so that a nested `fast_exp` (mish: `exp(log(1+exp(x)))`) held
    hundreds of copies of its operand and took LLVM 6 s to compile."""
    def c(v):
        return tirx.const(v, "float32")
    xv, nv, rv = tirx.Var("fe_x", "float32"), tirx.Var("fe_n", "float32"), tirx.Var("fe_r", "float32")
    xc = tirx.max(tirx.min(xv, c(_EXP_HI)), c(_EXP_LO))
    n = tirx.floor(xc * c(1.44269504088896341) + c(0.5))
    r = xc - nv * c(_LN2_HI) - nv * c(_LN2_LO)
    p = c(_EXP_POLY[0])
    for coeff in _EXP_POLY[1:]:
        p = p * rv + c(coeff)
    y = p * rv * rv + rv + c(1.0)
    # 2**n in the exponent bits; n = 128 (just below the overflow bound) as 2**127 * 2
    bits = tirx.Cast("int32", tirx.min(nv, c(127.0))) + tirx.const(127, "int32")
    scale = tirx.reinterpret("float32", tirx.shift_left(bits, tirx.const(23, "int32")))
    y = tirx.Select(nv > c(127.0), y * c(2.0), y)
    small = tirx.Select(xv < c(_EXP_LO), c(0.0), scale * y)      # exp underflows to (almost) 0
    body = tirx.Select(xv > c(_EXP_HI), c(math.inf), small)
    return tirx.Let(xv, x, tirx.Let(nv, n, tirx.Let(rv, r, body)))


# Cephes' logf: x = m * 2**e with m in [sqrt(1/2), sqrt(2)) (the bits of x; a subnormal x scaled by
# 2**23 first), log(x) = e*ln2 + log1p(m-1) by a degree-8 polynomial. Within one float32 ulp of the
# correctly rounded log over the whole range (0.77 ulp measured on 300,000 draws).
_FLT_MIN = 1.17549435e-38
_LOG_POLY = (7.0376836292e-2, -1.1514610310e-1, 1.1676998740e-1, -1.2420140846e-1, 1.4249322787e-1,
             -1.6668057665e-1, 2.0000714765e-1, -2.4999993993e-1, 3.3333331174e-1)


def fast_log_f32(x):
    """log of a float32 TIR expression without a call to `logf` (see `_LOG_POLY`): log(0) = -inf,
    log of a negative number or NaN is NaN, log(inf) = inf. Operands bound once (`Let`)."""
    def c(v):
        return tirx.const(v, "float32")

    def i(v):
        return tirx.const(v, "int32")
    xv, ev, mv = tirx.Var("fl_x", "float32"), tirx.Var("fl_e", "float32"), tirx.Var("fl_m", "float32")
    tiny = xv < c(_FLT_MIN)
    bits = tirx.reinterpret("int32", tirx.Select(tiny, xv * c(8388608.0), xv))
    exponent = tirx.Cast("float32", tirx.bitwise_and(tirx.shift_right(bits, i(23)), i(255)) - i(126))
    exponent = exponent - tirx.Select(tiny, c(23.0), c(0.0))
    mantissa = tirx.reinterpret("float32", tirx.bitwise_or(tirx.bitwise_and(bits, i(-2139095041)), i(0x3F000000)))
    low = mantissa < c(0.707106781186547524)
    e = tirx.Select(low, exponent - c(1.0), exponent)
    m = tirx.Select(low, mantissa + mantissa - c(1.0), mantissa - c(1.0))
    z = mv * mv
    y = c(_LOG_POLY[0])
    for coeff in _LOG_POLY[1:]:
        y = y * mv + c(coeff)
    y = y * mv * z + ev * c(_LN2_LO) - c(0.5) * z
    r = mv + y + ev * c(_LN2_HI)
    r = tirx.Select(xv > c(3.4028234663852886e38), c(math.inf), r)
    r = tirx.Select(xv == c(0.0), c(-math.inf), tirx.Select(tirx.Or(tirx.isnan(xv), xv < c(0.0)), c(math.nan), r))
    return tirx.Let(xv, x, tirx.Let(ev, e, tirx.Let(mv, m, r)))


# A rational approximation of erf on [-4, 4] (odd numerator of degree 13, even denominator of degree
# 8, in x**2), erf = +-1 beyond within float32 rounding. At most 6.3 float32 ulp from erf (3.7e-7
# absolute, measured on 300,000 draws), and every operation vectorises.
_ERF_NUM = (-2.72614225801306e-10, 2.77068142495902e-08, -2.10102402082508e-06, -5.69250639462346e-05,
            -7.34990630326855e-04, -2.95459980854025e-03, -1.60960333262415e-02)
_ERF_DEN = (-1.45660718464996e-05, -2.13374055278905e-04, -1.68282697438203e-03, -7.37332916720468e-03,
            -1.42647390514189e-02)


def fast_erf_f32(x):
    """erf of a float32 TIR expression without a call to `erff` (see `_ERF_NUM`); NaN stays NaN."""
    def c(v):
        return tirx.const(v, "float32")
    xv, sv = tirx.Var("fr_x", "float32"), tirx.Var("fr_s", "float32")
    p, q = c(_ERF_NUM[0]), c(_ERF_DEN[0])
    for coeff in _ERF_NUM[1:]:
        p = p * sv + c(coeff)
    for coeff in _ERF_DEN[1:]:
        q = q * sv + c(coeff)
    clamped = tirx.max(tirx.min(xv, c(4.0)), c(-4.0))
    inner = tirx.Let(sv, clamped * clamped, tirx.Select(tirx.isnan(xv), xv, clamped * p / q))
    return tirx.Let(xv, x, inner)


# The extensions' TIR: each computes in float32 whatever the operand's type, rounded back to it.
_FAST = {"fast_exp": fast_exp_f32, "fast_log": fast_log_f32, "fast_erf": fast_erf_f32}
FAST_FORM_VARS = ("fe_", "fl_", "fr_")  # the prefixes of the variables their Lets bind


def tvm_dtype(code: str) -> str:
    """LEIR dtype code -> TVM dtype name (the PyTorch names are TVM's names)."""
    return CODE_TO_TORCH[code]


def storage_dtype(code: str) -> str:
    """The dtype of an intermediate's buffer: its own, except that a bfloat16 intermediate is held in
    float32, bfloat16 values exactly (TVM 0.27 does the same to every bfloat16 buffer it allocates, and
    its legalizer would otherwise rewrite the buffer under our bit-level reads; see BF16_WORK)."""
    dtype = tvm_dtype(code)
    return BF16_WORK if dtype == "bfloat16" else dtype


def dtype_of(expr) -> str:
    return str(expr.ty.dtype)


def is_float(dtype: str) -> bool:
    return dtype.startswith("float") or dtype == "bfloat16"


def _bits(dtype: str) -> int:
    return 8 if dtype == "bool" else int(dtype.lstrip("abcdefghijklmnopqrstuvwxyz"))


def promote(a: str, b: str) -> str:
    if a == b:
        return a
    if "bool" in (a, b):
        return b if a == "bool" else a
    if is_float(a) != is_float(b):
        return a if is_float(a) else b
    if is_float(a):
        if {a, b} == {"float16", "bfloat16"}:
            return "float32"
        return a if _bits(a) >= _bits(b) else b
    if a.startswith("uint") == b.startswith("uint"):
        return a if _bits(a) >= _bits(b) else b
    unsigned, signed = (a, b) if a.startswith("uint") else (b, a)
    if _bits(signed) > _bits(unsigned):
        return signed
    return f"int{min(64, 2 * _bits(unsigned))}"


def cast(expr, dtype: str):
    if dtype_of(expr) == dtype:
        return expr
    if dtype == "bool":  # PyTorch's conversion to bool: nonzero
        return tirx.NE(expr, tirx.const(0, dtype_of(expr)))
    if dtype_of(expr) == "bfloat16":  # exact, through its bits (see BF16_WORK)
        wide = tirx.shift_left(tirx.Cast("uint32", tirx.reinterpret("uint16", expr)), tirx.const(16, "uint32"))
        return cast(tirx.reinterpret("float32", wide), dtype)
    return tirx.Cast(dtype, expr)


# bfloat16 (docs/leir.md §4.5: a statement computes in its dtype). TVM 0.27's BF16ComputeLegalize computes a
# whole bfloat16 expression in float32 and rounds once, at its store: it folds away a
# `Cast("bfloat16", x)` that feeds more bfloat16 arithmetic, keeps a bfloat16 literal's unrounded value,
# and leaves a bfloat16 load inside a `Let` value unconverted (its raw bits read as a number). So a
# bfloat16 statement is lowered in float32 (`BF16_WORK`) with every conversion to bfloat16 and every
# operation rounded explicitly (`ExprLowering.settle`), bfloat16 values are read and stored through
# their bits (`cast`, `stored`), and the program rounds where LEIR says, on the CPU as with CUDA's
# native bfloat16.
BF16_WORK = "float32"


def round_to_bfloat16(x):
    """A float32 value -> the nearest bfloat16 value (ties to even), as float32, in integer operations
    that no pass folds away (TVM's own formula; the quiet NaNs arithmetic makes stay NaN, as there).
    `x` is bound once (a Let), so that nested roundings do not copy it."""
    def u32(v):
        return tirx.const(v, "uint32")
    v = tirx.Var("x", "float32")
    bits = tirx.reinterpret("uint32", v)
    odd = tirx.bitwise_and(tirx.shift_right(bits, u32(16)), u32(1))
    rounded = tirx.reinterpret("float32", tirx.bitwise_and(bits + u32(0x7FFF) + odd, u32(0xFFFF0000)))
    return tirx.Let(v, x, rounded)


def stored(value, dtype: str):
    """The value a statement stores into a `dtype` buffer. A bfloat16 statement's value is a float32
    that bfloat16 holds exactly (every step was rounded): its upper half is the bfloat16, taken as
    bits, since TVM's own conversion would copy the whole expression twice (round to nearest even)."""
    if dtype != "bfloat16" or dtype_of(value) != BF16_WORK:
        return cast(value, dtype)
    bits = tirx.shift_right(tirx.reinterpret("uint32", value), tirx.const(16, "uint32"))
    return tirx.reinterpret("bfloat16", tirx.Cast("uint16", bits))


def bfloat16_value(value: float) -> float:
    return float(ml_dtypes.bfloat16(float(value)))


def literal(value: int | float, dtype: str):
    """A literal in `dtype`; one that dtype cannot hold (0.5 or inf in an int statement, 300 in
    uint8) stays float64 or int64 and is converted where it is stored."""
    if dtype == "bfloat16":  # TVM keeps a bfloat16 literal's unrounded value (see BF16_WORK)
        return tirx.const(bfloat16_value(value), dtype)
    if is_float(dtype):
        return tirx.const(float(value), dtype)
    if math.isinf(value) or value != int(value):
        return tirx.const(float(value), "float64")
    if dtype == "bool":
        return tirx.const(bool(value), "bool") if value in (0, 1) else tirx.const(int(value), "int64")
    lo, hi = _int_range(dtype)
    return tirx.const(int(value), dtype if lo <= value <= hi else "int64")


def _int_range(dtype: str) -> tuple[int, int]:
    bits = _bits(dtype)
    return (0, 2 ** bits - 1) if dtype.startswith("uint") else (-(2 ** (bits - 1)), 2 ** (bits - 1) - 1)


def identity_value(value: int | float, dtype: str):
    """The initial value of a reduction (§4.4) in `dtype`: -inf/+inf become the extreme values of
    an integer type and False/True for bool."""
    if dtype == "bool":
        return tirx.const(value > 0 if math.isinf(value) else bool(value), "bool")
    if is_float(dtype) or not math.isinf(value):
        return literal(value, dtype)
    return tirx.min_value(dtype) if value < 0 else tirx.max_value(dtype)


def _pure_index(e) -> bool:
    """Integers and loop indices only (no tensor data, no float literal)."""
    stack = [e]
    while stack:
        match stack.pop():
            case Num(value=v):
                if not isinstance(v, int):
                    return False
            case Var():
                pass
            case Neg(operand=a):
                stack.append(a)
            case BinOp(op="+" | "-" | "*" | "//" | "%", lhs=a, rhs=b):
                stack += (a, b)
            case _:
                return False
    return True


def _data_dtype(e, buffers) -> str | None:
    """Promoted dtype of the tensor values an expression reads (not counting gathers in subscripts)."""
    out = None
    stack = [e]
    while stack:
        node = stack.pop()
        if isinstance(node, Access):
            dt = tvm_dtype(node.dtype)  # the tensor's own dtype (a bfloat16 buffer may be float32)
            out = dt if out is None else promote(out, dt)
            continue
        stack.extend(_value_children(node))
    return out


def _children(node) -> tuple:
    """Every operand of an expression or condition node, subscripts included."""
    match node:
        case Access(indices=ix):
            return ix
        case Select(cond=c, then=t, otherwise=o):
            return (c, t, o)
        case Compare(operands=xs):
            return xs
        case And(terms=ts) | Or(terms=ts):
            return ts
    return _value_children(node)


def _holds_fast_call(e) -> bool:
    """Whether `e` calls a fast extension (`fast_exp`, `fast_log`, `fast_erf`) anywhere."""
    stack = [e]
    while stack:
        node = stack.pop()
        if isinstance(node, Call) and node.fn in _FAST:
            return True
        stack.extend(_children(node))
    return False


def hoisted_fast_call(node: Call, guarded: set[int]) -> bool:
    """Whether the lowering stores the operand of `node` in a cell (`ExprLowering._fast_operand`): a
    fast call, outside the branches of a select (`guarded`), whose operand calls a fast extension."""
    return node.fn in _FAST and id(node) not in guarded and any(_holds_fast_call(a) for a in node.args)


def fast_cells(e) -> int:
    """How many cells the lowering of the value `e` stores operands in (`hoisted_fast_call`)."""
    if not _holds_fast_call(e):
        return 0
    guarded = guarded_calls(e)
    count, stack = 0, [e]
    while stack:
        node = stack.pop()
        count += isinstance(node, Call) and hoisted_fast_call(node, guarded)
        stack.extend(_children(node))
    return count


def guarded_calls(e) -> set[int]:
    """The ids of the calls of `e` inside a branch of a select (which runs only when it is chosen)."""
    out: set[int] = set()
    stack = [(e, False)]
    while stack:
        node, guarded = stack.pop()
        if isinstance(node, Call) and guarded:
            out.add(id(node))
        if isinstance(node, Select):
            stack += [(node.cond, guarded), (node.then, True), (node.otherwise, True)]
        else:
            stack += [(c, guarded) for c in _children(node)]
    return out


def _value_children(node) -> tuple:
    match node:
        case BinOp(lhs=a, rhs=b):
            return (a, b)
        case Neg(operand=a):
            return (a,)
        case Call(args=args):
            return args
        case Select(then=t, otherwise=o):
            return (t, o)
    return ()



class _Then:
    """A marker on `ExprLowering`'s work stack: apply `combine` to the last `arity` results."""

    __slots__ = ("combine", "arity")

    def __init__(self, combine, arity: int):
        self.combine, self.arity = combine, arity


class ExprLowering:
    """Translates the expressions of one statement; `env` maps loop indices to TIR variables.

    Expressions are lowered with an explicit work stack, not recursion, so that a sum of 10,000 terms
    or a nesting 10,000 deep lowers like any other. Each node is planned by `_plan_index`,
    `_plan_value` or `_plan_cond` as a TIR expression (a leaf), or as the tasks of its operands
    (`("index", e)`, `("value", e, lit)`, `("cond", c)`, lowered left to right) and a function that
    combines their results."""

    def __init__(self, buffers: dict, env: dict, lhs_dtype: str, where: str, index_dtype: str = INDEX_DTYPE,
                 cell=None):
        self.buffers, self.env, self.lhs_dtype, self.where = buffers, env, lhs_dtype, where
        self.index_dtype = index_dtype
        # `cell(dtype)` gives a local buffer and the subscripts of this iteration's element in it (one
        # per lane of an enclosing vector loop), or None: with it, the operand of a fast call that
        # holds another fast call is stored in a cell and read back (`_fast_operand`); without it
        # (the block form), everything stays one expression
        self.cell = cell
        self._value, self._guarded = None, None  # the value being lowered, and its calls in select branches

    def fail(self, what: str):
        raise LoweringError(f"{self.where}: {what}")

    # --- entry points ------------------------------------------------------------------------------

    def index(self, e):
        self._value, self._guarded = e, None
        return self._lower(("index", e))

    def value(self, e, lit: str | None = None):
        self._value, self._guarded = e, None
        return self._lower(("value", e, lit or self.lhs_dtype))

    def cond(self, c):
        self._value, self._guarded = c, None
        return self._lower(("cond", c))

    def load(self, acc: Access):
        self._value, self._guarded = acc, None
        return self._lower(("load", acc))

    def var(self, name: str):
        if name not in self.env:
            self.fail(f"index {name} is not bound by an enclosing loop")
        return self.env[name]

    def _lower(self, task):
        results: list = []
        stack: list = [task]
        planners = {"index": self._plan_index, "value": self._plan_value, "cond": self._plan_cond,
                    "load": self._plan_load}
        while stack:
            task = stack.pop()
            if task.__class__ is _Then:
                k = task.arity
                args = results[len(results) - k:]
                del results[len(results) - k:]
                results.append(task.combine(*args))
                continue
            planned = planners[task[0]](*task[1:])
            if planned.__class__ is not tuple:
                results.append(planned)
                continue
            tasks, combine = planned
            stack.append(_Then(combine, len(tasks)))
            stack.extend(reversed(tasks))
        return results[0]

    # --- subscripts --------------------------------------------------------------------------------

    def _plan_index(self, e):
        match e:
            case Num(value=v) if isinstance(v, int):
                return tirx.const(v, self.index_dtype)
            case Var(name=n):
                return self.var(n)
            case Access():  # a gather: the element is an index
                return self._plan_load(e, lambda x: cast(x, self.index_dtype))
            case Neg(operand=a):
                return [("index", a)], lambda x: tirx.const(0, self.index_dtype) - x
            case BinOp(op="+" | "-" | "*" | "//" | "%" as op, lhs=a, rhs=b):
                return [("index", a), ("index", b)], _INDEX_OPS[op]
        self.fail(f"not an integer index expression: {_text(e)}")

    def _plan_load(self, acc: Access, then=None):
        buf = self.buffers[acc.tensor]

        def combine(*indices):
            x = tirx.BufferLoad(buf, list(indices))
            return then(x) if then is not None else x

        if not acc.indices:
            return combine()
        return [("index", i) for i in acc.indices], combine

    # --- values ------------------------------------------------------------------------------------

    def _plan_value(self, e, lit: str):
        match e:
            case Num(value=v):
                return self.literal(v, lit)
            case Var(name=n):
                return self.convert(self.var(n), lit)
            case Access():
                return self._plan_load(e, lambda x: self.convert(x, lit, tvm_dtype(e.dtype)))
            case Neg(operand=Num(value=v)):
                return self.literal(-v, lit)
            case Neg(operand=a):
                return [("value", a, lit)], _negate
            case BinOp(op="**", lhs=a, rhs=b):
                return self._plan_power(a, b, lit)
            case BinOp(op=op, lhs=a, rhs=b):
                return [("value", a, lit), ("value", b, lit)], lambda x, y: self._binop(op, x, y, lit)
            case Call(fn=fn, args=args):
                return [("value", a, lit) for a in args], lambda *xs: self._call(fn, list(xs), lit, e)
            case Select(cond=c, then=t, otherwise=o):
                return [("value", t, lit), ("value", o, lit), ("cond", c)], _select
        self.fail(f"not a value expression: {_text(e)}")

    def literal(self, value, lit: str):
        if lit == "bfloat16":
            return tirx.const(bfloat16_value(value), BF16_WORK)
        return literal(value, lit)

    def convert(self, x, lit: str, source: str | None = None):
        """A value read (of dtype `source`, if not its own) in a statement that computes in `lit`
        (bfloat16: in BF16_WORK, rounded unless it is a bfloat16 value already)."""
        if lit != "bfloat16":
            return cast(x, lit)
        wide = cast(x, BF16_WORK)
        return wide if (source or dtype_of(x)) == "bfloat16" else round_to_bfloat16(wide)

    def settle(self, result, lit: str):
        """The result of one operation of a statement that computes in `lit`: rounded to bfloat16
        explicitly (BF16_WORK); any other dtype rounds by itself."""
        return round_to_bfloat16(result) if lit == "bfloat16" and dtype_of(result) == BF16_WORK else result

    def _call(self, fn: str, args: list, lit: str, node: Call | None = None):
        out = self.call(fn, args, node)
        return out if fn in ("abs", "max", "min") else self.settle(out, lit)

    def _fast_operand(self, x, node: Call | None):
        """The float32 operand `x` of the fast call `node`. TVM's code generator simplifies each bound
        value of a function with every earlier binding substituted, so a fast form whose operand holds
        another fast form (each binds its operand and intermediates with `Let`) grew the work
        exponentially with the nesting: mish's `fast_exp(fast_log(1+fast_exp(x)))` took 1.5 s to
        build and four levels more than 20 s. Such an operand is stored in a one-element local buffer
        of the current frame and read back: the generator does not look through a load, the value is
        the same float32, and LLVM keeps it in a register (a vector loop's lanes each have their
        element: a single element would be one lane's value for all). Not for a call in a branch of a
        select (only the chosen branch runs: a store before the select would run both)."""
        if self.cell is None or node is None:
            return x
        if self._guarded is None:
            self._guarded = guarded_calls(self._value)
        if not hoisted_fast_call(node, self._guarded):
            return x
        given = self.cell("float32")
        if given is None:
            return x
        cell, indices = given
        tb.buffer_store(cell, x, indices)
        return tirx.BufferLoad(cell, indices)

    def _binop(self, op: str, x, y, lit: str):
        dt = promote(dtype_of(x), dtype_of(y))
        if op == "/" and not is_float(dt):
            dt = lit if is_float(lit) else "float32"
        if dt == "bool":
            dt = "int32"  # arithmetic on booleans counts in integers
        x, y = cast(x, dt), cast(y, dt)
        if op in _FLOAT_NODES and is_float(dt):  # the node itself: the operators fold `x*0` to 0 (leir.lower.ieee)
            return self.settle(_FLOAT_NODES[op](x, y), lit)
        if op == "+":
            return self.settle(x + y, lit)
        if op == "-":
            return self.settle(x - y, lit)
        if op == "*":
            return self.settle(x * y, lit)
        if op == "/":
            return self.settle(tirx.Div(x, y), lit)
        if not is_float(dt):
            return tirx.floordiv(x, y) if op == "//" else tirx.floormod(x, y)
        return self.settle(self.float_floor_op(op, x, y, dt), lit)

    def float_floor_op(self, op: str, x, y, dt: str):
        """`//` is floor(x/y) and `%` is x - floor(x/y)*y (PyTorch's remainder) for floats."""
        wide = "float32" if _bits(dt) < 32 else dt
        xw, yw = cast(x, wide), cast(y, wide)
        q = tirx.floor(tirx.Div(xw, yw))
        return cast(q if op == "//" else xw - q * yw, dt)

    def _plan_power(self, base, exponent, lit: str):
        n = integral_exponent(exponent)
        if n is not None and abs(n) <= MAX_POWER_BY_MULTIPLICATION:
            return [("value", base, lit)], lambda x: self._power_by_multiplication(x, n, lit)
        sqrt = exponent == Num(0.5)
        return [("value", base, lit), ("value", exponent, lit)], lambda x, y: self._pow(x, y, sqrt, lit)

    def _power_by_multiplication(self, x, n: int, lit: str):
        if dtype_of(x) == "bool":
            x = cast(x, "int32")
        if n == 0:
            return tirx.const(1, dtype_of(x))
        prod = x
        for _ in range(abs(n) - 1):
            prod = self.settle(prod * x, lit)
        if n > 0:
            return prod
        dt = dtype_of(x) if is_float(dtype_of(x)) else "float32"
        return self.settle(tirx.Div(tirx.const(1.0, dt), cast(prod, dt)), lit)

    def _pow(self, x, y, sqrt: bool, lit: str):
        if sqrt:
            return self.settle(self.call("sqrt", [x]), lit)
        dt = promote(dtype_of(x), dtype_of(y))
        work = _math_dtype(dt)
        out = tirx.pow(cast(x, work), cast(y, work))
        return self.settle(cast(out, dt), lit) if is_float(dt) else out

    def call(self, fn: str, args: list, node: Call | None = None):
        if fn in _MATH:
            x = args[0]
            work = _math_dtype(dtype_of(x))
            out = _MATH[fn](cast(x, work))
            return cast(out, dtype_of(x)) if is_float(dtype_of(x)) else out
        if fn in _FAST:
            x = args[0]
            out = _FAST[fn](self._fast_operand(cast(x, "float32"), node))
            return cast(out, dtype_of(x)) if is_float(dtype_of(x)) else out
        if fn == "abs":
            x = args[0]
            if dtype_of(x) == "bool" or dtype_of(x).startswith("uint"):
                return x
            return tirx.abs(x)
        if fn in ("max", "min"):
            dt = promote(dtype_of(args[0]), dtype_of(args[1]))
            dt = "int32" if dt == "bool" else dt
            x, y = cast(args[0], dt), cast(args[1], dt)
            return tirx.max(x, y) if fn == "max" else tirx.min(x, y)
        self.fail(f"unknown function {fn}")

    # --- conditions --------------------------------------------------------------------------------

    def _plan_cond(self, c):
        match c:
            case Compare(operands=xs, ops=ops):
                tasks, combines = [], []
                for i, op in enumerate(ops):
                    pair, combine = self._plan_compare(xs[i], op, xs[i + 1])
                    tasks += pair
                    combines.append(combine)

                def conjunction(*lowered):
                    return _fold(tirx.And, [f(lowered[2 * i], lowered[2 * i + 1]) for i, f in enumerate(combines)])

                return tasks, conjunction
            case And(terms=ts):
                return [("cond", t) for t in ts], lambda *xs: _fold(tirx.And, list(xs))
            case Or(terms=ts):
                return [("cond", t) for t in ts], lambda *xs: _fold(tirx.Or, list(xs))
        # a bool access, or any value tested for nonzero in its own dtype
        return [("value", c, _data_dtype(c, self.buffers) or self.lhs_dtype)], lambda x: cast(x, "bool")

    def _plan_compare(self, a, op: str, b):
        """The two operand tasks of one comparison and how to compare their results."""
        if _pure_index(a) and _pure_index(b):
            return [("index", a), ("index", b)], _COMPARE[op]
        kinds = [d for d in (_data_dtype(a, self.buffers), _data_dtype(b, self.buffers)) if d]
        lit = kinds[0] if len(kinds) == 1 else promote(*kinds) if kinds else self.lhs_dtype

        def compare(x, y):
            dt = promote(dtype_of(x), dtype_of(y))
            return _COMPARE[op](cast(x, dt), cast(y, dt))

        return [("value", a, lit), ("value", b, lit)], compare


_FLOAT_NODES = {"+": tirx.Add, "-": tirx.Sub, "*": tirx.Mul}
_INDEX_OPS = {"+": lambda x, y: x + y, "-": lambda x, y: x - y, "*": lambda x, y: x * y,
              "//": tirx.floordiv, "%": tirx.floormod}


def _negate(x):
    x = cast(x, "int32") if dtype_of(x) == "bool" else x
    return tirx.const(0, dtype_of(x)) - x


def _select(a, b, c):
    dt = promote(dtype_of(a), dtype_of(b))
    return tirx.if_then_else(c, cast(a, dt), cast(b, dt))


def _text(e) -> str:
    """An expression for a message (LEIR text where it has one; repr would recurse on a deep tree)."""
    from leir.printer import UnprintableError, format_expr

    try:
        return format_expr(e)
    except UnprintableError:
        return type(e).__name__


def _math_dtype(dtype: str) -> str:
    if dtype in ("float64", "float32"):
        return dtype
    return "float32"


def _fold(op, parts):
    out = parts[0]
    for p in parts[1:]:
        out = op(out, p)
    return out

