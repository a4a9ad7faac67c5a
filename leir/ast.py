"""LEIR syntax tree: one frozen dataclass per node (docs/leir.md §3).

Nodes compare and hash structurally. Value expressions and index expressions share node types; the
parser only lets integer forms into subscripts. Conditions (`Compare`, `And`, `Or`) appear only as the
first argument of `if_then_else`.

Nothing here recurses on the depth of a tree: a sum of 10,000 terms is a BinOp chain
10,000 deep, and equality, hashing, `walk_expr` and `map_expr` walk it with an explicit stack.
Equality and hashing mean what the dataclass versions meant (field by field; `Num(1) == Num(1.0)`).
"""
from __future__ import annotations

import math
from collections.abc import Iterator
from dataclasses import dataclass, field

LOOP_KINDS = ("L", "P", "V", "U", "B")
LOOP_KIND_NAMES = {"L": "serial", "P": "parallel", "V": "vectorized", "U": "unrolled", "B": "bound"}
SCOPES = ("g", "s", "l")
ARITH_OPS = ("+", "-", "*", "/", "//", "%", "**")
REL_OPS = ("<", "<=", ">", ">=", "==", "!=")
# `fast_exp`, `fast_log` and `fast_erf` are *extensions* of this project, not part of the published
# Step-TP format: exp, log and erf computed by polynomials in plain arithmetic (leir/lower/expr.py)
# that LLVM vectorises, where each is a scalar libm call per element. They equal the functions only
# within float32 rounding (a few ulp), never bitwise: a step that introduces one is `reassociating`
# (verified `close`), and data in the published format never contains them.
UNARY_FNS = ("exp", "log", "sqrt", "abs", "erf", "fast_exp", "fast_log", "fast_erf")
EXTENSION_FNS = ("fast_exp", "fast_log", "fast_erf")
FAST_OF = {"exp": "fast_exp", "log": "fast_log", "erf": "fast_erf"}  # the extension of each function
BINARY_FNS = ("max", "min")


class _Node:
    """Base of the tree's nodes: a slot that caches the structural hash (computed once per node; not a
    dataclass field, so neither compared, pickled, copied nor printed)."""

    __slots__ = ("_hash_value",)


@dataclass(frozen=True, slots=True, eq=False)
class Num(_Node):
    """A non-negative literal: int, float or inf (negative values are `Neg(Num(...))`)."""

    value: int | float

    def __post_init__(self):
        v = self.value
        if isinstance(v, bool) or not isinstance(v, int | float):
            raise TypeError(f"Num needs an int or float, got {type(v).__name__}")
        if isinstance(v, float) and math.isnan(v):
            raise ValueError("Num cannot be NaN")
        if v < 0:
            raise ValueError("Num is non-negative; write Neg(Num(x)) for a negative literal")


@dataclass(frozen=True, slots=True, eq=False)
class Var(_Node):
    """A loop index or binding name used as a value (the counter, converted to the LHS dtype)."""

    name: str


@dataclass(frozen=True, slots=True, eq=False)
class Access(_Node):
    """`T^{dtype,scope}_{i,j,...}`; an empty subscript is a 0-d tensor."""

    tensor: str
    dtype: str
    scope: str
    indices: tuple[Expr, ...] = ()


@dataclass(frozen=True, slots=True, eq=False)
class BinOp(_Node):
    op: str
    lhs: Expr
    rhs: Expr


@dataclass(frozen=True, slots=True, eq=False)
class Neg(_Node):
    operand: Expr


@dataclass(frozen=True, slots=True, eq=False)
class Call(_Node):
    """`exp/log/sqrt/abs/erf/fast_exp(x)`, `max/min(x, y)` (`fast_exp`: an extension, see UNARY_FNS)."""

    fn: str
    args: tuple[Expr, ...]


@dataclass(frozen=True, slots=True, eq=False)
class Compare(_Node):
    """A comparison chain `e0 op0 e1 op1 e2 ...` (Python meaning)."""

    operands: tuple[Expr, ...]
    ops: tuple[str, ...]


@dataclass(frozen=True, slots=True, eq=False)
class And(_Node):
    terms: tuple[Cond, ...]


@dataclass(frozen=True, slots=True, eq=False)
class Or(_Node):
    terms: tuple[Cond, ...]


@dataclass(frozen=True, slots=True, eq=False)
class Select(_Node):
    """`if_then_else(cond, then, otherwise)`."""

    cond: Cond
    then: Expr
    otherwise: Expr


Expr = Num | Var | Access | BinOp | Neg | Call | Select
Cond = Compare | And | Or | Expr


@dataclass(frozen=True, slots=True, eq=False)
class Loop(_Node):
    kind: str
    extent: int
    var: str
    start: int = 0

    @property
    def is_bound(self) -> bool:
        return self.kind == "B"


@dataclass(frozen=True, slots=True, eq=False)
class Stmt(_Node):
    lhs: Access
    rhs: Expr


@dataclass(frozen=True, slots=True, eq=False)
class Nest(_Node):
    """A perfect loop nest: `loops[0]` is outermost; the body holds statements and nested nests."""

    loops: tuple[Loop, ...]
    body: tuple[Stmt | Nest, ...]


@dataclass(frozen=True, slots=True, eq=False)
class Program(_Node):
    nests: tuple[Nest, ...] = field(default_factory=tuple)


Node = Expr | Compare | And | Or | Loop | Stmt | Nest | Program

# Each node class's fields in declaration order (what the dataclass `__eq__`/`__hash__` compared).
_FIELDS: dict[type, tuple[str, ...]] = {
    cls: tuple(cls.__dataclass_fields__) for cls in (Num, Var, Access, BinOp, Neg, Call, Compare, And, Or,
                                                     Select, Loop, Stmt, Nest, Program)}


def _equal(a, b) -> bool:
    """Structural equality of two trees (nodes, tuples of nodes, plain values) with an explicit stack."""
    stack = [(a, b)]
    pop, push, fields_of = stack.pop, stack.append, _FIELDS
    while stack:
        x, y = pop()
        if x is y:
            continue
        cls = x.__class__
        fields = fields_of.get(cls)
        if fields is not None:
            if y.__class__ is not cls:
                return False
            hx, hy = getattr(x, "_hash_value", None), getattr(y, "_hash_value", None)
            if hx is not None and hy is not None and hx != hy:
                return False
            for name in fields:
                push((getattr(x, name), getattr(y, name)))
        elif cls is tuple:
            if y.__class__ is not tuple or len(x) != len(y):
                return False
            stack.extend(zip(x, y, strict=True))
        elif y.__class__ in fields_of or y.__class__ is tuple or x != y:
            return False
    return True


def _hash(root) -> int:
    """Structural hash, consistent with `_equal` (plain values hash as themselves, so that `Num(1)` and
    `Num(1.0)` hash alike): post-order with an explicit stack, caching every node's hash on it."""
    stack = [root]
    fields_of, cached, setattr_ = _FIELDS, _cached_hash, object.__setattr__
    while stack:
        node = stack[-1]
        if cached(node, None) is not None:
            stack.pop()
            continue
        parts = [getattr(node, name) for name in fields_of[node.__class__]]
        pending = [c for part in parts for c in (part if part.__class__ is tuple else (part,))
                   if c.__class__ in fields_of and cached(c, None) is None]
        if pending:
            stack.extend(pending)
            continue
        stack.pop()
        key = tuple(tuple(_leaf_or_node_hash(c) for c in part) if part.__class__ is tuple else _leaf_or_node_hash(part)
                    for part in parts)
        setattr_(node, "_hash_value", hash((node.__class__.__name__, key)))
    return root._hash_value


def _cached_hash(node, default):
    return getattr(node, "_hash_value", default)


def _leaf_or_node_hash(value) -> int:
    return value._hash_value if value.__class__ in _FIELDS else hash(value)


def _node_eq(self, other):
    if other.__class__ is not self.__class__:
        return NotImplemented
    return _equal(self, other)


def _node_hash(self):
    try:
        return self._hash_value
    except AttributeError:
        return _hash(self)


for _cls in _FIELDS:
    _cls.__eq__ = _node_eq
    _cls.__hash__ = _node_hash


def children(node) -> tuple:
    """The direct sub-expressions of an expression or condition node, in source order."""
    get = _CHILDREN.get(node.__class__)
    return get(node) if get is not None else ()


_CHILDREN = {
    Access: lambda n: n.indices,
    BinOp: lambda n: (n.lhs, n.rhs),
    Neg: lambda n: (n.operand,),
    Call: lambda n: n.args,
    Select: lambda n: (n.cond, n.then, n.otherwise),
    Compare: lambda n: n.operands,
    And: lambda n: n.terms,
    Or: lambda n: n.terms,
}


def walk_expr(node) -> Iterator:
    """Pre-order walk over an expression or condition, subscripts included."""
    stack = [node]
    while stack:
        n = stack.pop()
        yield n
        stack.extend(reversed(children(n)))


def accesses(node) -> Iterator[Access]:
    """Every access in an expression, in source order, including gathers inside subscripts."""
    for n in walk_expr(node):
        if isinstance(n, Access):
            yield n


def map_expr(node, fn, subscripts: bool = True):
    """Bottom-up rebuild: `fn` is applied to each node after its children were mapped (post-order,
    children left to right), with an explicit stack. Without `subscripts` an access is a leaf: `fn`
    sees it, but not the expressions inside its subscripts."""
    return _rebuild_walk(node, None, fn, subscripts)


def replace_expr(node, fn, subscripts: bool = True):
    """Top-down rebuild: where `fn(n)` returns a node, it replaces `n` whole (its inside is not
    visited); where it returns None, `n`'s children are visited, in source order."""
    return _rebuild_walk(node, fn, None, subscripts)


def _rebuild_walk(node, before, after, subscripts: bool):
    """The one explicit-stack rebuild behind `map_expr` (`after` applied to each rebuilt node) and
    `replace_expr` (`before` may replace a node whole before its children are visited)."""
    get_children = _CHILDREN.get
    results: list = []
    stack: list = [node]
    while stack:
        n = stack.pop()
        if n.__class__ is _Rebuild:
            k = n.arity
            kids = results[len(results) - k:]
            del results[len(results) - k:]
            rebuilt = n.rebuild(n.node, kids)
            results.append(after(rebuilt) if after is not None else rebuilt)
            continue
        if before is not None:
            new = before(n)
            if new is not None:
                results.append(new)
                continue
        get = get_children(n.__class__)
        kids = get(n) if get is not None and (subscripts or n.__class__ is not Access) else ()
        if not kids:
            results.append(after(n) if after is not None else n)
            continue
        stack.append(_Rebuild(n, len(kids), _REBUILD[n.__class__]))
        stack.extend(reversed(kids))
    return results[0]


class _Rebuild:
    """A marker on `map_expr`'s stack: rebuild `node` from the last `arity` results."""

    __slots__ = ("node", "arity", "rebuild")

    def __init__(self, node, arity: int, rebuild):
        self.node, self.arity, self.rebuild = node, arity, rebuild


# `node` with its children (in `children` order) replaced by `kids`.
_REBUILD = {
    Access: lambda n, k: Access(n.tensor, n.dtype, n.scope, tuple(k)),
    BinOp: lambda n, k: BinOp(n.op, k[0], k[1]),
    Neg: lambda n, k: Neg(k[0]),
    Call: lambda n, k: Call(n.fn, tuple(k)),
    Select: lambda n, k: Select(k[0], k[1], k[2]),
    Compare: lambda n, k: Compare(tuple(k), n.ops),
    And: lambda n, k: And(tuple(k)),
    Or: lambda n, k: Or(tuple(k)),
}


def map_stmt(stmt: Stmt, fn) -> Stmt:
    lhs = map_expr(stmt.lhs, fn)
    if not isinstance(lhs, Access):
        raise TypeError("a statement's left-hand side must stay an access")
    return Stmt(lhs, map_expr(stmt.rhs, fn))
