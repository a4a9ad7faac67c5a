"""A literal, slow reference interpreter of LEIR (docs/leir.md §4), used as the oracle of the lowering
tests, and tests that check the oracle itself against PyTorch.

It shares nothing with the lowering except `analysis.implicit_inits`/`tensor_table` (which say
*which* statements initialise and what shapes intermediates have): loops run one iteration at a time
in Python, and implicit initialisation is tracked per element ("holds the identity before its first
update"), the way the specification words it.
"""
from __future__ import annotations

import json
import math
from pathlib import Path

import numpy as np
import pytest

from leir import parse_program
from leir.analysis import implicit_inits, statement_sites, tensor_table
from leir.ast import Access, And, BinOp, Call, Compare, Neg, Nest, Num, Or, Select, Stmt, Var
from leir.dtypes import CODE_TO_TORCH, is_float
from leir.signature import Signature

DATA = Path(__file__).resolve().parents[2] / "data" / "programs.jsonl"
_REL = {"<": lambda a, b: a < b, "<=": lambda a, b: a <= b, ">": lambda a, b: a > b,
        ">=": lambda a, b: a >= b, "==": lambda a, b: a == b, "!=": lambda a, b: a != b}


def golden_rows() -> list[dict]:
    return [json.loads(line) for line in DATA.read_text().splitlines() if line.strip()]


def np_dtype(torch_name: str):
    if torch_name == "bfloat16":
        import ml_dtypes

        return ml_dtypes.bfloat16
    return np.dtype(torch_name)


def interpret(program, signature: Signature, inputs: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    """Outputs of `program` on `inputs` (outputs start as zeros, like `run_numpy`)."""
    if isinstance(program, str):
        program = parse_program(program)
    table = tensor_table(program, signature)
    arrays = {}
    for name, info in table.items():
        dtype = np_dtype(CODE_TO_TORCH[info.dtype])
        arrays[name] = (np.array(inputs[name], dtype=dtype) if info.role == "input"
                        else np.zeros(info.shape, dtype))
    inits = implicit_inits(program, signature)
    order = {(s.nest_index, s.path): s.order for s in statement_sites(program)}
    state = _State(arrays, inits, order)
    for top, nest in enumerate(program.nests):
        state.run_nest(nest, {}, (top, ()))
    return {t.name: arrays[t.name] for t in signature.outputs}


class _State:
    def __init__(self, arrays, inits, order):
        self.arrays, self.inits, self.order = arrays, inits, order
        self.touched: dict[int, set] = {k: set() for k in inits}

    def run_nest(self, nest: Nest, env: dict, where: tuple, depth: int = 0):
        top, path = where
        if depth == len(nest.loops):
            for j, item in enumerate(nest.body):
                if isinstance(item, Stmt):
                    self.run_stmt(item, env, self.order[(top, path + (j,))])
                else:
                    self.run_nest(item, env, (top, path + (j,)))
            return
        lp = nest.loops[depth]
        for v in range(lp.start, lp.start + lp.extent):
            self.run_nest(nest, {**env, lp.var: v}, where, depth + 1)

    def run_stmt(self, stmt: Stmt, env: dict, k: int):
        arr = self.arrays[stmt.lhs.tensor]
        idx = tuple(self.index(i, env) for i in stmt.lhs.indices)
        if k in self.inits and idx not in self.touched[k]:
            self.touched[k].add(idx)
            arr[idx] = _identity(self.inits[k], arr.dtype)
        lhs_float = is_float(stmt.lhs.dtype)
        value = self.value(stmt.rhs, env, lhs_float)
        arr[idx] = (value != 0) if arr.dtype.kind == "b" else value

    def index(self, e, env) -> int:
        return int(self.value(e, env, False))

    def value(self, e, env, as_float: bool):
        match e:
            case Num(value=v):
                return float(v) if as_float else v
            case Var(name=n):
                return float(env[n]) if as_float else env[n]
            case Access(tensor=t, indices=ix):
                x = self.arrays[t][tuple(self.index(i, env) for i in ix)]
                return x.item() if hasattr(x, "item") else x
            case Neg(operand=a):
                return -self.value(a, env, as_float)
            case BinOp(op=op, lhs=a, rhs=b):
                return _arith(op, self.value(a, env, as_float), self.value(b, env, as_float))
            case Call(fn=fn, args=args):
                xs = [self.value(a, env, as_float) for a in args]
                return _call(fn, xs)
            case Select(cond=c, then=t, otherwise=o):
                return self.value(t if self.cond(c, env) else o, env, as_float)
        raise TypeError(e)

    def cond(self, c, env) -> bool:
        match c:
            case Compare(operands=xs, ops=ops):
                vals = [self.value(x, env, False) for x in xs]
                return all(_REL[op](vals[i], vals[i + 1]) for i, op in enumerate(ops))
            case And(terms=ts):
                return all(self.cond(t, env) for t in ts)
            case Or(terms=ts):
                return any(self.cond(t, env) for t in ts)
        return bool(self.value(c, env, False))


def _identity(value, dtype):
    if dtype.kind == "b":
        return value > 0 if math.isinf(value) else bool(value)
    if np.issubdtype(dtype, np.integer) and math.isinf(value):
        info = np.iinfo(dtype)
        return info.min if value < 0 else info.max
    return value


def _arith(op, a, b):
    if op == "+":
        return a + b
    if op == "-":
        return a - b
    if op == "*":
        return a * b
    if op == "/":
        return a / b
    if op == "//":
        return a // b if not isinstance(a, float) and not isinstance(b, float) else math.floor(a / b)
    if op == "%":
        return a % b if not isinstance(a, float) and not isinstance(b, float) else a - math.floor(a / b) * b
    if op == "**":
        return a ** b
    raise ValueError(op)


def _call(fn, xs):
    x = xs[0]
    if fn in ("max", "min"):
        return max(xs) if fn == "max" else min(xs)
    if fn == "abs":
        return abs(x)
    if fn == "exp":
        return math.exp(x) if x < 700 else math.inf
    if fn == "log":
        return math.log(x) if x > 0 else (-math.inf if x == 0 else math.nan)
    if fn == "sqrt":
        return math.sqrt(x) if x >= 0 else math.nan
    if fn == "erf":
        return math.erf(x)
    raise ValueError(fn)


def random_inputs(signature: Signature, seed: int, int_high: int = 4) -> dict[str, np.ndarray]:
    """Standard normal floats; integers in [0, int_high) (class indices); random bools."""
    rng = np.random.default_rng(seed)
    out = {}
    for t in signature.inputs:
        if t.dtype == "bool":
            out[t.name] = rng.random(t.shape) < 0.5
        elif t.dtype.startswith(("int", "uint")):
            out[t.name] = rng.integers(0, int_high, size=t.shape).astype(t.dtype)
        else:
            out[t.name] = rng.standard_normal(t.shape).astype(np_dtype(t.dtype))
    return out


# --- the oracle agrees with PyTorch on the golden programs ------------------------------------------

@pytest.mark.parametrize("row", golden_rows(), ids=lambda r: r["name"])
def test_oracle_matches_torch(row):
    import torch

    sig = Signature.from_json(row["signature"])
    inputs = random_inputs(sig, 0)
    got = interpret(row["leir"], sig, inputs)[sig.outputs[0].name]
    env = {"torch": torch, **{k: torch.from_numpy(np.asarray(v)) for k, v in inputs.items()}}
    ref = eval(row["torch"], env).numpy()
    np.testing.assert_allclose(got, ref, rtol=1e-9, atol=1e-9)


def test_oracle_initialises_each_element_before_its_first_update():
    # reduction loop outermost: a per-loop T.init() would reset C at every k
    sig = Signature.from_json({"tensors": [
        {"name": "A", "shape": [2, 3], "dtype": "float64", "role": "input"},
        {"name": "C", "shape": [2], "dtype": "float64", "role": "output"}]})
    prog = "L^{3}_{c=0}L^{2}_{a=0}[C^{f64,g}_{a}=C^{f64,g}_{a}+A^{f64,g}_{a,c};];"
    a = np.arange(6.0).reshape(2, 3)
    np.testing.assert_array_equal(interpret(prog, sig, {"A": a})["C"], a.sum(1))
