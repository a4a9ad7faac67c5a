"""A small reference interpreter of LEIR for the translator's tests (torch, float64, exact semantics
for the programs the translator emits; slow where loops must run one by one).

Per nest, the loops whose index appears alone (affinely) in one subscript of every left-hand side are
evaluated as whole vectors at once; the others run sequentially in loop order. That is valid for the
translator's programs (no statement reads an element another iteration of a vector loop writes).
Guarded reads (`if_then_else(0<=c-1<n, A_{c-1}, 0)`) are evaluated on clamped subscripts and then
discarded by the selection, like a real lowering's conditional load.
"""
from __future__ import annotations

import itertools

import numpy as np
import torch

from leir.analysis import affine_form, implicit_inits, statement_sites, tensor_table
from leir.ast import Access, And, BinOp, Call, Compare, Neg, Nest, Num, Or, Program, Select, Var
from leir.dtypes import torch_name
from leir.signature import Signature

_FNS = {"exp": torch.exp, "fast_exp": torch.exp, "log": torch.log, "fast_log": torch.log, "sqrt": torch.sqrt,
        "abs": torch.abs, "erf": torch.erf, "fast_erf": torch.erf}
_RELS = {"<": torch.lt, "<=": torch.le, ">": torch.gt, ">=": torch.ge, "==": torch.eq, "!=": torch.ne}


def _torch_dtype(code: str) -> torch.dtype:
    name = torch_name(code)
    if name in ("float32", "float16", "bfloat16", "float64"):
        return torch.float64  # evaluate every float in float64
    return getattr(torch, name)


def run_program(program: Program, signature: Signature, inputs: dict[str, np.ndarray]) -> np.ndarray:
    table = tensor_table(program, signature)
    store = {}
    for name, info in table.items():
        if name in inputs:
            store[name] = torch.as_tensor(np.asarray(inputs[name])).to(_torch_dtype(info.dtype))
        else:
            store[name] = torch.zeros(info.shape, dtype=_torch_dtype(info.dtype))
    inits = implicit_inits(program, signature)
    sites = iter(statement_sites(program))
    for nest in program.nests:
        _run_nest(nest, store, inits, sites)
    out = signature.outputs[0].name
    return store[out].numpy()


def _run_nest(nest: Nest, store, inits, sites) -> None:
    if any(isinstance(item, Nest) for item in nest.body):
        raise NotImplementedError("nested nests")
    stmts = list(nest.body)
    orders = [next(sites).order for _ in stmts]
    vector = [lp for lp in nest.loops if all(_alone_in_lhs(lp.var, s.lhs) for s in stmts)]
    serial = [lp for lp in nest.loops if lp not in vector]
    grid = {lp.var: torch.arange(lp.extent).reshape([-1 if i == k else 1 for i in range(len(vector))])
            for k, lp in enumerate(vector)}
    shape = tuple(lp.extent for lp in vector)
    for stmt, order in zip(stmts, orders, strict=True):
        if order in inits:
            store[stmt.lhs.tensor].fill_(inits[order])
    for values in itertools.product(*(range(lp.extent) for lp in serial)):
        env = dict(grid)
        env.update({lp.var: torch.tensor(v) for lp, v in zip(serial, values, strict=True)})
        for stmt in stmts:
            _assign(stmt, env, store, shape)


def _alone_in_lhs(var: str, lhs: Access) -> bool:
    hits = 0
    for ix in lhs.indices:
        form = affine_form(ix)
        names = _vars(ix)
        if var not in names:
            continue
        if form is None or set(form[0]) != {var}:
            return False
        hits += 1
    return hits == 1


def _vars(node) -> set[str]:
    from leir.ast import walk_expr

    return {n.name for n in walk_expr(node) if isinstance(n, Var)}


def _assign(stmt, env, store, shape) -> None:
    target = store[stmt.lhs.tensor]
    value = torch.as_tensor(_eval(stmt.rhs, env, store)).to(target.dtype)
    if not stmt.lhs.indices:
        target.copy_(value.reshape(()))
        return
    index = [torch.as_tensor(_eval(i, env, store)).long() for i in stmt.lhs.indices]
    index = torch.broadcast_tensors(*index, torch.zeros(shape, dtype=torch.long))[:-1]
    target[tuple(index)] = torch.broadcast_to(value, index[0].shape)


def _eval(node, env, store):
    match node:
        case Num(value=v):
            return torch.tensor(v, dtype=torch.float64 if isinstance(v, float) else torch.long)
        case Var(name=n):
            return env[n]
        case Access(tensor=t, indices=ix):
            data = store[t]
            if not ix:
                return data
            index = []
            for d, i in enumerate(ix):
                index.append(torch.clamp(torch.as_tensor(_eval(i, env, store)).long(), 0, data.shape[d] - 1))
            return data[tuple(torch.broadcast_tensors(*index))]
        case BinOp(op=op, lhs=a, rhs=b):
            return _binop(op, _eval(a, env, store), _eval(b, env, store))
        case Neg(operand=a):
            return -_eval(a, env, store)
        case Call(fn=f, args=args):
            vals = [torch.as_tensor(_eval(a, env, store)) for a in args]
            if f in ("max", "min"):
                a, b = torch.broadcast_tensors(*_promote(vals))
                return torch.maximum(a, b) if f == "max" else torch.minimum(a, b)
            return _FNS[f](vals[0].double())
        case Select(cond=c, then=t, otherwise=o):
            then, other = _promote([torch.as_tensor(_eval(t, env, store)), torch.as_tensor(_eval(o, env, store))])
            return torch.where(_cond(c, env, store), then, other)
    raise TypeError(f"cannot evaluate {node!r}")


def _promote(vals):
    if any(v.is_floating_point() for v in vals):
        return [v.double() for v in vals]
    return vals


def _binop(op, a, b):
    a, b = torch.as_tensor(a), torch.as_tensor(b)
    if op == "+":
        return a + b
    if op == "-":
        return a - b
    if op == "*":
        return a * b
    if op == "/":
        return a.double() / b.double()
    if op == "//":
        return torch.floor_divide(a, b)
    if op == "%":
        return torch.remainder(a, b)
    if op == "**":
        return torch.pow(a.double(), b.double())
    raise ValueError(op)


def _cond(c, env, store):
    match c:
        case Compare(operands=xs, ops=ops):
            vals = [torch.as_tensor(_eval(x, env, store)) for x in xs]
            result = None
            for op, a, b in zip(ops, vals, vals[1:], strict=False):
                r = _RELS[op](a, b)
                result = r if result is None else result & r
            return result
        case And(terms=ts):
            result = None
            for t in ts:
                r = _cond(t, env, store)
                result = r if result is None else result & r
            return result
        case Or(terms=ts):
            result = None
            for t in ts:
                r = _cond(t, env, store)
                result = r if result is None else result | r
            return result
    return torch.as_tensor(_eval(c, env, store)).bool()
