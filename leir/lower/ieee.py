"""Float arithmetic as IEEE 754 computes it, not as TVM's simplifier rewrites it.

TVM's simplifier treats float arithmetic as real arithmetic: it folds `x*0` to 0 (NaN for an infinite
or NaN `x`), `x-x` to 0, `(x+c)-c` and `(x+y)-y` to `x` (rounding lost), at construction and again in
the compile pipeline; LLVM, without fast-math, computes each as written. A statement whose value the
simplifier would change is emitted with each of its loads and float literals bound to a variable of
its own (a TIR `Bind` before the store; a literal through a one-element local buffer): the simplifier
does not look through a variable bound to a load, two bindings of one load are two variables it
cannot cancel, and LLVM still loads once, keeps the literal a constant and computes the operations as
the program writes them. Every other statement is emitted as before.
"""
from __future__ import annotations

import numpy as np
from tvm import tirx
from tvm.ir import StringImm
from tvm.ir.expr import Call, TensorLoad
from tvm.ir.prim.expr import FloatImm, IntImm
from tvm.sym import Analyzer

from leir.lower.expr import FAST_FORM_VARS, dtype_of, is_float

_BINARY = tuple(getattr(tirx, name) for name in (
    "Add", "Sub", "Mul", "Div", "Mod", "FloorDiv", "FloorMod", "Min", "Max", "EQ", "NE", "LT", "LE", "GT",
    "GE", "And", "Or", "LShift", "RShift", "BitwiseAnd", "BitwiseOr", "BitwiseXor") if hasattr(tirx, name))
_GUARDED = "prim.if_then_else"  # its branches run only when chosen: their loads stay inside them


def _rebuild(expr, leaf, binary=None, branch=None, inline=None):
    """`expr` with each load and float literal replaced by `leaf(node)`, the rest rebuilt as it is
    (operands left to right); a binary node from its rebuilt operands by `binary(node, a, b)`, and a
    branch of `if_then_else` by `branch(expr)`, when given. Every node the lowering emits is rebuilt
    (the Let of a bfloat16 rounding or of `fast_exp`, the shifts of a bfloat16 load); anything else
    raises TypeError rather than leave its loads out unnoticed."""
    def again(e):
        return _rebuild(e, leaf, binary, branch, inline)

    if isinstance(expr, TensorLoad | FloatImm):
        return leaf(expr)
    if isinstance(expr, _BINARY):
        a, b = again(expr.a), again(expr.b)
        return binary(expr, a, b) if binary else type(expr)(a, b)
    if isinstance(expr, tirx.Not):
        return tirx.Not(again(expr.a))
    if isinstance(expr, tirx.Cast):
        return tirx.Cast(dtype_of(expr), again(expr.value))
    if isinstance(expr, tirx.Select):
        return tirx.Select(again(expr.condition), again(expr.true_value), again(expr.false_value))
    if isinstance(expr, tirx.Let):
        if inline is not None:  # substituted, as the simplifier does with a Let
            inline.append((expr.var, again(expr.value)))
            return again(expr.body)
        return tirx.Let(expr.var, again(expr.value), again(expr.body))
    if inline is not None and isinstance(expr, tirx.Var):
        return next((value for var, value in reversed(inline) if var.same_as(expr)), expr)
    if isinstance(expr, Call):
        guarded = branch is not None and getattr(expr.op, "name", "") == _GUARDED
        args = [branch(a) if guarded and i > 0 else again(a) for i, a in enumerate(expr.args)]
        return Call(expr.op, args, expr.attrs, expr.ty_args, None, expr.ty)
    if isinstance(expr, tirx.Var | IntImm | StringImm):
        return expr  # loop and Let variables, integer literals, a call's name
    raise TypeError(f"leir.lower.ieee: no rule for {type(expr).__name__}")


def simplifier_rewrites(value) -> bool:
    """Whether TVM's simplifier changes `value` beyond its subscripts: each distinct load stands for a
    variable (so `A[a]-A[a]` is seen as `x-x`), literals stay as they are."""
    names: dict[str, tirx.Var] = {}

    def load_var(node):
        if isinstance(node, FloatImm):
            return node
        key = str(node)
        return names.setdefault(key, tirx.Var(f"v{len(names)}", dtype_of(node)))

    skeleton = _without_identities(_rebuild(value, load_var, inline=[]))
    return _operations(Analyzer().simplify(skeleton)) != _operations(skeleton)


_NUMPY = {"float16": np.float16, "float32": np.float32, "float64": np.float64}
_FOLD = {"Add": np.add, "Sub": np.subtract, "Mul": np.multiply, "Div": np.divide}


def _without_identities(expr):
    """`expr` without float `x+0`, `0+x`, `x-0`, `x*1`, `1*x`, `x/1`, and with an operation of two
    literals computed: folding those is exact (up to the sign of a zero, which compares equal), so they
    do not call for bindings (a reduction's `0+C`, a mean's `1/97`)."""
    return _rebuild(expr, lambda leaf: leaf, _drop_identity)


def _drop_identity(node, a, b):
    def literal(n, v):
        return isinstance(n, FloatImm) and float(n.value) == v

    if not (isinstance(node, tirx.Add | tirx.Sub | tirx.Mul | tirx.Div) and is_float(dtype_of(node))):
        return type(node)(a, b)
    if isinstance(node, tirx.Add) and (literal(a, 0.0) or literal(b, 0.0)):
        return b if literal(a, 0.0) else a
    if isinstance(node, tirx.Sub) and literal(b, 0.0):
        return a
    if isinstance(node, tirx.Mul) and (literal(a, 1.0) or literal(b, 1.0)):
        return b if literal(a, 1.0) else a
    if isinstance(node, tirx.Div) and literal(b, 1.0):
        return a
    if isinstance(a, FloatImm) and isinstance(b, FloatImm) and dtype_of(node) in _NUMPY:
        # two literals: folding computes the one IEEE operation the program asks for
        kind = _NUMPY[dtype_of(node)]
        with np.errstate(all="ignore"):
            folded = _FOLD[type(node).__name__](kind(a.value), kind(b.value))
        return tirx.const(float(folded), dtype_of(node))
    return type(node)(a, b)


_MIRRORED = {"GT": "LT", "GE": "LE"}


def _operations(expr) -> list[str]:
    """The multiset of `expr`'s nodes (kind, dtype, literal value), sorted: what a fold changes (it
    drops an operation or a leaf, or merges literals), not what a canonical reordering does
    (`x > 0` printed as `0 < x`, operands swapped)."""
    out, stack = [], [expr]
    while stack:
        n = stack.pop()
        kind = type(n).__name__
        if isinstance(n, FloatImm):
            out.append(f"{dtype_of(n)}:{float(n.value)!r}")
            continue
        if isinstance(n, tirx.Var):
            out.append(f"var:{n.name}")
            continue
        if is_float(dtype_of(n)) or isinstance(n, Call | tirx.EQ | tirx.NE | tirx.LT | tirx.LE | tirx.GT | tirx.GE):
            # integer and boolean arithmetic folds exactly (`a-1 < 0` is `a < 1`); float operations,
            # calls and comparisons are what IEEE computes
            out.append(f"{_MIRRORED.get(kind, kind)}:{dtype_of(n)}" + (f":{n.op.name}" if isinstance(n, Call) else ""))
        stack += _operands(n)
    return sorted(out)


def _operands(n) -> list:
    """The operands of an arithmetic, comparison, cast, select or call node (none for a leaf or a Let)."""
    if isinstance(n, _BINARY):
        return [n.a, n.b]
    if isinstance(n, tirx.Not):
        return [n.a]
    if isinstance(n, tirx.Cast):
        return [n.value]
    if isinstance(n, tirx.Select):
        return [n.condition, n.true_value, n.false_value]
    if isinstance(n, Call):
        return list(n.args)
    return []


def bind_leaves(value) -> tuple[list[tuple[tirx.Var, object]], object]:
    """(bindings, value): each load and float literal of `value`, left to right, bound to a variable
    of its own, and `value` over those variables."""
    bindings: list[tuple[tirx.Var, object]] = []
    count = iter(range(1 << 62))

    def binder(scope):
        def bind(node):
            # literals (and loads outside any guarded branch) are bound before the statement; a
            # bfloat16 element by its bits (TVM stores bfloat16 as uint16, and a bfloat16 variable
            # would not be converted with its buffer)
            bits = dtype_of(node) == "bfloat16"
            var = tirx.Var(f"ieee{next(count)}", "uint16" if bits else dtype_of(node))
            bound = tirx.reinterpret("uint16", node) if bits else node
            (bindings if isinstance(node, FloatImm) or scope is None else scope).append((var, bound))
            return tirx.reinterpret("bfloat16", var) if bits else var
        return bind

    def branch(expr):  # a guarded branch's loads are bound inside it: never read when not chosen
        local: list[tuple[tirx.Var, object]] = []
        rebuilt = _rebuild(expr, binder(local), branch=branch)
        for var, leaf in reversed(local):
            rebuilt = tirx.Let(var, leaf, rebuilt)
        return rebuilt

    return bindings, _rebuild(value, binder(None), branch=branch)


# Deeper statements are emitted as they are: the check and the bindings recurse over the expression
# (the 10,000-deep sums that lowering accepts), and so does TVM's simplifier.
CHECKED_DEPTH = 100


def _has_fast_form(value) -> bool:
    """Whether `value` holds an extension's polynomial (`fast_exp`, `fast_log`, `fast_erf`): those are
    emitted as they are, like deep statements. They are close to their functions by design, not
    bitwise, and the check below substitutes every Let: nested fast forms (mish's
    `fast_exp(fast_log(1+fast_exp(x)))`) grew the checked tree exponentially (209 s to lower one
    statement)."""
    stack = [value]
    while stack:
        n = stack.pop()
        if isinstance(n, tirx.Let):
            if n.var.name.startswith(FAST_FORM_VARS):
                return True
            stack += [n.value, n.body]
        else:
            stack += _operands(n)
    return False


def emit_faithful(value, alloc, depth: int):
    """`value` as the statement's store should use it: where the simplifier would rewrite it, over its
    leaves bound to variables of their own (Let expressions around it). A literal is bound to a load of
    a one-element local buffer holding it, stored here (`alloc(shape, dtype)` allocates one in the
    current frame): a bound constant, or any pure value, is substituted back and folded, a load is
    not; LLVM turns the buffer back into the constant."""
    if depth > CHECKED_DEPTH or _has_fast_form(value):
        return value
    try:
        if not simplifier_rewrites(value):
            return value
        bindings, protected = bind_leaves(value)
    except (RecursionError, TypeError):  # deeper than the stack allows here, or a node without a rule
        return value
    from tvm.script.ir_builder import IRBuilder
    from tvm.script.ir_builder import tirx as T

    value = protected
    loads = []
    for i, (var, leaf) in enumerate(bindings):
        if isinstance(leaf, FloatImm):
            cell = alloc((1,), dtype_of(leaf))
            IRBuilder.name(f"literal{i}", cell)
            T.buffer_store(cell, leaf, [0])
            leaf = cell[0]
        loads.append((var, leaf))
    for var, leaf in reversed(loads):
        value = tirx.Let(var, leaf, value)
    return value
