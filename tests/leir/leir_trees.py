"""Hypothesis strategies for random LEIR trees that the grammar can express."""
from __future__ import annotations

import math

from hypothesis import strategies as st

from leir.ast import Access, And, BinOp, Call, Compare, Loop, Neg, Nest, Num, Or, Program, Select, Stmt, Var
from leir.dtypes import DTYPE_CODES
from leir.names import BIND_PREFIXES, KEYWORDS, index_name, tensor_name

tensor_names = st.integers(0, 60).map(tensor_name)
index_names = st.integers(0, 500).map(index_name).filter(lambda n: n not in KEYWORDS)
bind_names = st.tuples(st.sampled_from(BIND_PREFIXES), st.sampled_from(["", "a", "c", "ac"])).map("".join)
var_names = st.one_of(index_names, bind_names)
types = st.tuples(st.sampled_from(DTYPE_CODES), st.sampled_from(["g", "s", "l"]))

int_literals = st.integers(0, 10**6).map(Num)
float_literals = st.one_of(
    st.floats(min_value=0, allow_nan=False, allow_infinity=True),
    st.sampled_from([0.5, 1e-05, 2.5e10, 1.0, 1e16, 5e-324]),
).map(Num)


def _access(index_expr):
    return st.builds(lambda name, ty, ix: Access(name, ty[0], ty[1], tuple(ix)),
                     tensor_names, types, st.lists(index_expr, max_size=3))


index_exprs = st.recursive(
    st.one_of(int_literals, var_names.map(Var)),
    lambda inner: st.one_of(
        st.builds(BinOp, st.sampled_from(["+", "-", "*", "//", "%"]), inner, inner),
        st.builds(Neg, inner),
        _access(inner),
    ),
    max_leaves=6,
)
accesses = _access(index_exprs)

exprs = st.recursive(
    st.one_of(int_literals, float_literals, var_names.map(Var), accesses),
    lambda inner: st.one_of(
        st.builds(BinOp, st.sampled_from(["+", "-", "*", "/", "//", "%", "**"]), inner, inner),
        st.builds(Neg, inner),
        st.builds(lambda f, a: Call(f, (a,)), st.sampled_from(["exp", "log", "sqrt", "abs", "erf"]), inner),
        st.builds(lambda f, a, b: Call(f, (a, b)), st.sampled_from(["max", "min"]), inner, inner),
        st.builds(Select, st.deferred(lambda: conds(inner)), inner, inner),
    ),
    max_leaves=10,
)


def conds(expr):
    compare = st.integers(1, 3).flatmap(lambda n: st.builds(
        lambda xs, ops: Compare(tuple(xs), tuple(ops)),
        st.lists(expr, min_size=n + 1, max_size=n + 1),
        st.lists(st.sampled_from(["<", "<=", ">", ">=", "==", "!="]), min_size=n, max_size=n)))
    atom = st.one_of(compare, expr)
    conj = st.one_of(atom, st.lists(atom, min_size=2, max_size=3).map(lambda ts: And(tuple(ts))))
    return st.one_of(conj, st.lists(conj, min_size=2, max_size=3).map(
        lambda ts: Or(tuple(t for x in ts for t in (x.terms if isinstance(x, Or) else (x,))))))


loops = st.builds(Loop, st.sampled_from(["L", "P", "V", "U", "B"]), st.integers(0, 4096), var_names,
                  st.integers(0, 3))
stmts = st.builds(Stmt, accesses, exprs)
nests = st.recursive(
    st.builds(lambda ls, body: Nest(tuple(ls), tuple(body)), st.lists(loops, min_size=1, max_size=3),
              st.lists(stmts, min_size=1, max_size=3)),
    lambda inner: st.builds(lambda ls, body: Nest(tuple(ls), tuple(body)),
                            st.lists(loops, min_size=1, max_size=2),
                            st.lists(st.one_of(stmts, inner), min_size=1, max_size=3)),
    max_leaves=4,
)
programs = st.lists(nests, min_size=1, max_size=3).map(lambda ns: Program(tuple(ns)))

__all__ = ["programs", "exprs", "index_exprs", "math"]
