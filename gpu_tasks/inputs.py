"""Seeded input draws from a signature (docs/cli.md, `steptp verify`).

Float inputs: draw 0 standard normal, draw 1 uniform in [-1, 1], draw 2 wide-range (random sign,
magnitude log-uniform in [1e-2, 1e1]); later draws cycle through the kinds with fresh numbers.
Inputs a program passes to `log` (or its fast form), `sqrt` or divides by are drawn positive. Integer inputs used inside
another tensor's subscript are drawn within the range that keeps the subscript inside that dimension
(class indices, gathers); other integers from a small range; bools are fair coin masks.

Every number comes from a `numpy.random.Generator` seeded by sha256 of (signature, tensor, draw,
seed): never the global RNG, never `hash()`. The same draws feed both sides of a comparison.
"""
from __future__ import annotations

import hashlib
from collections.abc import Iterable, Sequence
from dataclasses import dataclass

import ml_dtypes
import numpy as np

from leir.analysis import index_range, statement_sites, tensor_table
from leir.ast import FAST_OF, Access, BinOp, Call, Program, accesses, walk_expr
from leir.dtypes import is_float
from leir.signature import Signature, TensorSpec

DRAW_KINDS = ("normal", "uniform", "wide")
SMALL_SIGNED = (-8, 8)     # inclusive range of integers used as values
SMALL_POSITIVE = (1, 8)    # ... used as divisors
WIDE_LOG10 = (-2.0, 1.0)   # magnitudes of the wide-range draw: 1e-2 .. 1e1
POSITIVE_ARGUMENT_FNS = ("log", FAST_OF["log"], "sqrt")  # functions whose operand is drawn positive

_NUMPY_DTYPES = {"bfloat16": np.dtype(ml_dtypes.bfloat16)}


def numpy_dtype(torch_name: str) -> np.dtype:
    return _NUMPY_DTYPES.get(torch_name) or np.dtype(torch_name)


@dataclass(frozen=True, slots=True)
class InputPlan:
    """How one input is drawn: `kind` float, int or bool; `low`/`high` inclusive for ints."""

    kind: str
    positive: bool = False
    low: int = 0
    high: int = 0


@dataclass(frozen=True, slots=True)
class InputFacts:
    """What one program says about its inputs: which must be positive, which index other tensors
    (with the value range that keeps those subscripts in bounds)."""

    positive: frozenset[str]
    index_ranges: dict[str, tuple[int, int]]


def input_facts(program: Program, signature: Signature) -> InputFacts:
    return InputFacts(frozenset(_positive_inputs(program)), _index_ranges(program, signature))


def plan_inputs(signature: Signature, programs: Iterable[Program]) -> dict[str, InputPlan]:
    """One plan per input, valid for every program given (ranges are intersected)."""
    return plan_from_facts(signature, [input_facts(p, signature) for p in programs])


def plan_from_facts(signature: Signature, facts: Sequence[InputFacts]) -> dict[str, InputPlan]:
    positive = frozenset().union(*(f.positive for f in facts))
    index_ranges = _intersect([f.index_ranges for f in facts])
    return {spec.name: _plan(spec, spec.name in positive, index_ranges.get(spec.name))
            for spec in signature.inputs}


def _plan(spec: TensorSpec, positive: bool, index_range_: tuple[int, int] | None) -> InputPlan:
    if spec.dtype == "bool":
        return InputPlan("bool")
    if is_float(spec.code):
        return InputPlan("float", positive=positive)
    if index_range_ is not None:
        return InputPlan("int", low=index_range_[0], high=index_range_[1])
    low, high = SMALL_POSITIVE if positive else SMALL_SIGNED
    info = np.iinfo(numpy_dtype(spec.dtype))
    return InputPlan("int", low=max(low, int(info.min)), high=min(high, int(info.max)))


def draw_inputs(signature: Signature, plans: dict[str, InputPlan], draw: int, seed: int = 0
                ) -> dict[str, np.ndarray]:
    """Draw number `draw` of every input, in the inputs' own dtypes."""
    sig_json = signature.dumps()
    return {spec.name: _draw_one(spec, plans[spec.name], draw, _rng(sig_json, spec.name, draw, seed))
            for spec in signature.inputs}


def make_draws(signature: Signature, programs: Sequence[Program], draws: int, seed: int = 0
               ) -> list[dict[str, np.ndarray]]:
    return draws_from_plans(signature, plan_inputs(signature, programs), draws, seed)


def draws_from_plans(signature: Signature, plans: dict[str, InputPlan], draws: int, seed: int = 0
                     ) -> list[dict[str, np.ndarray]]:
    return [draw_inputs(signature, plans, d, seed) for d in range(draws)]


def _rng(signature_json: str, name: str, draw: int, seed: int) -> np.random.Generator:
    key = f"steptp-inputs|{signature_json}|{name}|{draw}|{seed}".encode()
    return np.random.default_rng(int.from_bytes(hashlib.sha256(key).digest()[:16], "little"))


def _draw_one(spec: TensorSpec, plan: InputPlan, draw: int, rng: np.random.Generator) -> np.ndarray:
    shape, dtype = spec.shape, numpy_dtype(spec.dtype)
    if plan.kind == "bool":
        return rng.random(shape) < 0.5
    if plan.kind == "int":
        return rng.integers(plan.low, plan.high, size=shape, endpoint=True).astype(dtype)
    values = _float_values(DRAW_KINDS[draw % len(DRAW_KINDS)], shape, rng)
    if plan.positive:
        values = np.abs(values) + 1e-3  # log, sqrt and divisors need positive inputs
    return np.asarray(values).astype(dtype)


def _float_values(kind: str, shape: tuple[int, ...], rng: np.random.Generator) -> np.ndarray:
    if kind == "normal":
        return rng.standard_normal(shape)
    if kind == "uniform":
        return rng.uniform(-1.0, 1.0, shape)
    magnitude = 10.0 ** rng.uniform(*WIDE_LOG10, shape)
    return np.where(rng.random(shape) < 0.5, -magnitude, magnitude)


# --- what the programs say about their inputs -------------------------------------------------------

def _positive_inputs(program: Program) -> set[str]:
    """Tensors read directly as the argument of log/fast_log/sqrt or as a divisor."""
    out = set()
    for site in statement_sites(program):
        for node in walk_expr(site.stmt.rhs):
            if isinstance(node, Call) and node.fn in POSITIVE_ARGUMENT_FNS and isinstance(node.args[0], Access):
                out.add(node.args[0].tensor)
            if isinstance(node, BinOp) and node.op in ("/", "//", "%") and isinstance(node.rhs, Access):
                out.add(node.rhs.tensor)
    return out


def _index_ranges(program: Program, signature: Signature) -> dict[str, tuple[int, int]]:
    """For each tensor read inside a subscript, the inclusive value range that keeps every such
    subscript within its dimension (intersected over all uses)."""
    shapes = {name: info.shape for name, info in tensor_table(program, signature).items()}
    found: list[dict[str, tuple[int, int]]] = []
    for site in statement_sites(program):
        for acc in (*accesses(site.stmt.lhs), *accesses(site.stmt.rhs)):
            shape = shapes.get(acc.tensor)
            if not shape or len(shape) != len(acc.indices):
                continue
            for extent, ix in zip(shape, acc.indices, strict=True):
                found.append(_gather_range(ix, extent, site.bounds))
    return _intersect(found)


def _gather_range(ix, extent: int, bounds) -> dict[str, tuple[int, int]]:
    """`G[X]`, `G[X+e]`, `G[e+X]`, `G[X-e]`, `G[e-X]` keep X so that the subscript stays in
    [0, extent) for every value of `e` over the loop box."""
    last = extent - 1
    if isinstance(ix, Access):
        return {ix.tensor: (0, last)}
    if isinstance(ix, BinOp) and ix.op in ("+", "-"):
        gather_first = isinstance(ix.lhs, Access)
        gather, other = (ix.lhs, ix.rhs) if gather_first else (ix.rhs, ix.lhs)
        r = index_range(other, bounds) if isinstance(gather, Access) else None
        if r is not None:
            if ix.op == "+":
                return {gather.tensor: (-r[0], last - r[1])}
            if gather_first:
                return {gather.tensor: (r[1], last + r[0])}
            return {gather.tensor: (r[1] - last, r[0])}
    # Any other form: keep gathers within the dimension, the best guess without solving for X.
    return {a.tensor: (0, last) for a in accesses(ix)}


def _intersect(ranges: Iterable[dict[str, tuple[int, int]]]) -> dict[str, tuple[int, int]]:
    out: dict[str, tuple[int, int]] = {}
    for found in ranges:
        for name, (lo, hi) in found.items():
            if name in out:
                lo, hi = max(lo, out[name][0]), min(hi, out[name][1])
            out[name] = (lo, hi) if lo <= hi else out.get(name, (lo, lo))
    return out
