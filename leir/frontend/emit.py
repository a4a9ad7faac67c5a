"""Emission of LEIR nests for the translator: tensor references, loop nests, broadcasting reads.

Every nest follows docs/leir.md §5: `B^{n0}_{tx=0}` over the first extent, then `L` loops named from the
index sequence (`a c d f ...`); a nest without extents is `B^{1}_{tx=0}`.

Mixed precision (docs/leir.md §4.5): in a float16 or bfloat16 program, an operator whose PyTorch CPU kernel
accumulates or computes in float32 (`ops` register it with `float32_kernel=True`) runs while the
emitter `widens`: its result and every half-precision temporary it makes are float32 intermediates in
local scope (`E^{f32,l}`), and the translator then rounds the result once into the operator's
half-precision tensor (`D^{f16,g}=E^{f32,l}`), as the kernel does.
"""
from __future__ import annotations

from collections.abc import Callable, Sequence
from contextlib import contextmanager
from dataclasses import dataclass

from leir.ast import Access, Loop, Nest, Num, Program, Stmt, Var, walk_expr
from leir.frontend.expr import X, ex
from leir.names import TensorNames, index_names


@dataclass(frozen=True, slots=True)
class Ref:
    """A tensor the program reads or writes. `lead` holds literal leading subscripts: the slot of a
    tuple result stacked on a leading index (docs/leir.md §5)."""

    name: str
    code: str
    shape: tuple[int, ...]
    lead: tuple[int, ...] = ()
    scope: str = "g"

    @property
    def rank(self) -> int:
        return len(self.shape)

    def at(self, *indices) -> X:
        ix = tuple(Num(i) for i in self.lead) + tuple(ex(i) for i in indices)
        return X(Access(self.name, self.code, self.scope, ix))

    def slot(self, k: int) -> Ref:
        """Element `k` of a stacked tuple tensor."""
        return Ref(self.name, self.code, self.shape[1:], self.lead + (k,), self.scope)

    def numel(self) -> int:
        n = 1
        for d in self.shape:
            n *= d
        return n


def broadcast_read(ref: Ref, out_vars: Sequence, out_shape: Sequence[int]) -> X:
    """Read `ref` at the position of an element of a result of shape `out_shape`, with PyTorch
    broadcasting (right-aligned; a size-1 dimension under a larger one reads index 0)."""
    offset = len(out_shape) - ref.rank
    if offset < 0:
        raise ValueError(f"cannot broadcast shape {list(ref.shape)} to {list(out_shape)}")
    ix = []
    for d, size in enumerate(ref.shape):
        out_size = out_shape[offset + d]
        if size == out_size:
            ix.append(out_vars[offset + d])
        elif size == 1:
            ix.append(Num(0))
        else:
            raise ValueError(f"cannot broadcast shape {list(ref.shape)} to {list(out_shape)}")
    return ref.at(*ix)


def operand(value, out_vars, out_shape):
    """A broadcast read of a tensor operand, or a literal for a Python number."""
    if isinstance(value, Ref):
        return broadcast_read(value, out_vars, out_shape)
    if isinstance(value, bool):
        return X(int(value))
    if isinstance(value, int | float):
        return X(value)
    raise TypeError(f"expected a tensor or a number, got {type(value).__name__}")


HALF_CODES = ("f16", "bf16")
ACCUMULATOR_CODE = "f32"


class Emitter:
    """Collects nests in program order and hands out fresh temporaries past the names in use."""

    def __init__(self, used_names: Sequence[str], cascades: Sequence[bool] | None = None):
        self.nests: list[Nest] = []
        self._temps = TensorNames(used_names)
        self._widening = False
        # the size-dependent choices of `accumulate_over`, one per sum that could go in two stages, in
        # emission order; `cascades` makes them instead (the choices of the same model at other sizes)
        self.cascades: list[bool] = []
        self._cascade_plan = tuple(cascades) if cascades is not None else None
        # float literals computed from sizes (attention's 1/sqrt(E)), which differ between two sizes
        self.size_constants: list[float] = []

    def cascade(self, by_size: bool) -> bool:
        """Whether the next sum that may go in two stages does: as planned, else `by_size`."""
        k = len(self.cascades)
        plan = self._cascade_plan
        self.cascades.append(plan[k] if plan is not None and k < len(plan) else by_size)
        return self.cascades[-1]

    def size_constant(self, value: float) -> float:
        """`value`, recorded as derived from sizes (a shrunk instance has another one in its place)."""
        self.size_constants.append(float(value))
        return value

    def temp(self, shape: Sequence[int], code: str, scope: str = "g") -> Ref:
        """A fresh temporary; a half-precision (or float32) one is a float32 local while the emitter
        `widens`."""
        if self._widening and code in (*HALF_CODES, ACCUMULATOR_CODE):
            return Ref(self._temps.fresh(), ACCUMULATOR_CODE, tuple(shape), scope="l")
        return Ref(self._temps.fresh(), code, tuple(shape), scope=scope)

    @contextmanager
    def widens(self, out: Ref):
        """Emit an operator that computes in float32 (module docstring): yields what it should write
        instead of `out` (`out` itself when `out` is not half precision) and, on leaving, rounds that
        once into `out`."""
        if out.code not in HALF_CODES:
            yield out
            return
        wide = Ref(self._temps.fresh(), ACCUMULATOR_CODE, out.shape, scope="l")
        self._widening, before = True, self._widening
        try:
            yield wide
        finally:
            self._widening = before
        copy_nest(self, out, lambda *v: wide.at(*v))

    def nest(self, extents: Sequence[int], body: Callable[..., Stmt | Sequence[Stmt]]) -> None:
        """One nest over `extents` (B first, then L); `body(*vars)` returns its statements."""
        loops, variables = nest_loops(extents)
        stmts = body(*variables)
        if isinstance(stmts, Stmt):
            stmts = (stmts,)
        self.nests.append(Nest(loops, tuple(stmts)))

    def program(self) -> Program:
        return Program(tuple(self.nests))


def nest_loops(extents: Sequence[int]) -> tuple[tuple[Loop, ...], list[X]]:
    if not extents:
        return (Loop("B", 1, "tx"),), []
    names = index_names()
    loops = [Loop("B", int(extents[0]), "tx")]
    for n in extents[1:]:
        loops.append(Loop("L", int(n), next(names)))
    return tuple(loops), [X(Var(lp.var)) for lp in loops]


def store(ref: Ref, indices: Sequence, rhs) -> Stmt:
    lhs = ref.at(*indices).node
    return Stmt(lhs, ex(rhs))


def accumulate(ref: Ref, indices: Sequence, term, op: str = "+") -> Stmt:
    """`X=X+e` / `X=X-e` / `X=X*e` / `X=max(X,e)` / `X=min(X,e)` (implicit initialisation, §4.4)."""
    acc = ref.at(*indices)
    if op in ("max", "min"):
        from leir.frontend.expr import vmax, vmin

        rhs = (vmax if op == "max" else vmin)(acc, term)
    elif op == "+":
        rhs = acc + term
    elif op == "-":
        rhs = acc - term
    elif op == "*":
        rhs = acc * term
    else:
        raise ValueError(f"unknown accumulation {op!r}")
    return Stmt(acc.node, rhs.node)


# A sequential sum of more terms than this loses digits where the partial sum outgrows its terms
# (float32: 5e-4 of a 2^19-term sum of squares on the wide-range draw; PyTorch sums in a cascade and
# stays within 1e-6). Such a sum over two or more dimensions goes in two stages (`accumulate_over`).
CASCADE_TERMS = 2 ** 14
# A norm's statistics go in two stages from this many terms: their error is divided by the standard
# deviation, and one serial float32 chain made KernelBench level 2's group norms (52, 60, 61: 8,192
# terms and more) 20x less accurate than PyTorch's float32 (per-unit errors 1.4e-4 to 2.2e-4 against a
# 1e-4 bound); in two stages 1.1e-5 to 6.4e-5.
NORM_CASCADE_TERMS = 2 ** 10


def accumulate_over(em: Emitter, acc: Ref, shape: Sequence[int], index: Callable, term: Callable,
                    op: str = "+", cascade_terms: int = CASCADE_TERMS) -> None:
    """`acc[index(v)] op= term(v)` over `shape` (`accumulate`, implicit initialisation). A sum (`+`,
    `-`) of more than `cascade_terms` terms per element whose innermost dimension is reduced runs in two
    stages, as PyTorch's cascade does in spirit: partial sums over the innermost dimension into a
    temporary of the others, then the sum of those partials. The choice depends on the sizes; the
    emitter records it (`Emitter.cascades`) and can be told to make the choices of the model at its own
    sizes, so that a shrunk instance has the same program modulo sizes."""
    loops, _ = nest_loops(shape)
    innermost = loops[-1].var
    per_element = _numel(shape) // max(1, _numel(acc.shape))
    reads_innermost = any(isinstance(n, Var) and n.name == innermost
                          for i in index(nest_loops(shape)[1]) for n in walk_expr(ex(i)))
    # a sum over the innermost dimension alone would sum the same chain in its first stage
    staged = per_element > max(cascade_terms, int(shape[-1]))
    if op not in ("+", "-") or len(shape) < 2 or reads_innermost or not em.cascade(staged):
        em.nest(shape, lambda *v: accumulate(acc, index(v), term(v), op))
        return
    partial = em.temp(shape[:-1], acc.code, acc.scope)
    em.nest(shape, lambda *v: accumulate(partial, v[:-1], term(v)))
    em.nest(shape[:-1], lambda *v: accumulate(acc, index((*v, X(0))), partial.at(*v), op))


def _numel(shape) -> int:
    n = 1
    for d in shape:
        n *= int(d)
    return n


def copy_nest(em: Emitter, out: Ref, read: Callable[..., X]) -> None:
    """`out[i...] = read(i...)` over the whole of `out` (views, reshapes, casts)."""
    em.nest(out.shape, lambda *v: store(out, v, read(*v)))
