"""Turns a lowering plan (`leir.lower.planner.Plan`) into a TVM PrimFunc with TVMScript's IR builder.

This is the plain form: loops and buffer stores, no schedulable blocks, every intermediate allocated
where the plan says (`tensorir` emits the block form from the same plan). The IR builder is used
instead of printing and parsing TVMScript: it is about 100x faster (0.5 ms against 50 ms for a small
program) and produces the same function.
"""
from __future__ import annotations

import keyword

from tvm import tirx
from tvm.script.ir_builder import IRBuilder
from tvm.script.ir_builder import tirx as T

from leir.analysis import expression_depth
from leir.lower.expr import (
    INDEX_DTYPE,
    ExprLowering,
    fast_cells,
    identity_value,
    index_dtype,
    index_shape,
    storage_dtype,
    stored,
    tvm_dtype,
)
from leir.lower.ieee import emit_faithful
from leir.lower.planner import Plan, PLoop, PStore
from leir.signature import Signature

_LOOP_FRAMES = {"serial": T.serial, "parallel": T.parallel, "vectorized": T.vectorized, "unroll": T.unroll}


def plan_index_dtype(plan: Plan) -> str:
    """int32 subscripts and loop variables, int64 where a tensor of the plan needs them."""
    return index_dtype(info.shape for info in plan.tensors.values())


def emit_primfunc(plan: Plan, signature: Signature):
    ix = plan_index_dtype(plan)
    with IRBuilder() as ib:
        with T.prim_func():
            T.func_name("main")
            T.func_attr({"tirx.noalias": True})
            buffers = {}
            for spec in signature.tensors:  # argument order = signature order
                buffers[spec.name] = T.arg(spec.name, T.buffer(index_shape(spec.shape, ix), spec.dtype))
            for name in plan.top_allocs:
                buffers[name] = _alloc(plan, name, ix)
            for item in plan.items:
                _emit(item, plan, buffers, {}, ix)
    return ib.get()


def _alloc(plan: Plan, name: str, ix: str):
    info = plan.tensors[name]
    buf = T.alloc_buffer(index_shape(info.shape, ix), storage_dtype(info.dtype), scope=plan.scopes[name])
    IRBuilder.name(name, buf)
    return buf


def _emit(item, plan: Plan, buffers: dict, env: dict, ix: str, cells=None) -> None:
    """`item` in the current frame. `cells`: where its stores keep a fast call's operand
    (`ExprLowering.cell`): None outside vector loops (a cell of one element in the store's frame),
    else the `_LaneCells` of the enclosing vector loop."""
    if isinstance(item, PStore):
        _emit_store(item, buffers, env, ix, cells)
        return
    lanes = None
    if item.kind == "vectorized":
        # TVM's vectorizer reads a buffer allocated inside a vector loop as one element for every lane
        # (each lane got the last lane's value): the loop's cells are allocated before it, one element
        # per lane; a vector loop inside another gets none (its operands stay expressions)
        count = _cells_needed(item) if cells is None else 0
        lanes = [_local_cell((item.extent,), "float32") for _ in range(count)]
    with loop_frame(item, ix) as var:
        IRBuilder.name(python_name(item.var), var)
        inner_env = {**env, item.var: var}
        inner_buffers = buffers
        if item.allocs:
            inner_buffers = {**buffers, **{n: _alloc(plan, n, ix) for n in item.allocs}}
        if lanes is not None:
            cells = _LaneCells(lanes, var - tirx.const(item.start, ix) if item.start else var)
        for b in item.body:
            _emit(b, plan, inner_buffers, inner_env, ix, cells)


class _LaneCells:
    """The cells of one vector loop, given out in order to each of its stores (`ExprLowering.cell`)."""

    def __init__(self, buffers: list, lane):
        self.buffers, self.lane = buffers, lane

    def for_store(self):
        given = iter(self.buffers)

        def cell(dtype: str):
            buf = next(given, None)
            return None if buf is None or str(buf.dtype) != dtype else (buf, [self.lane])
        return cell


def _cells_needed(loop: PLoop) -> int:
    """The most cells one store inside `loop` uses (`leir.lower.expr.fast_cells`)."""
    most, stack = 0, list(loop.body)
    while stack:
        item = stack.pop()
        if isinstance(item, PStore):
            if item.identity is None:
                most = max(most, fast_cells(item.rhs))
        else:
            stack.extend(item.body)
    return most


def loop_frame(loop: PLoop, ix: str = INDEX_DTYPE):
    """The loop's frame; its variable is of the subscripts' dtype `ix`."""
    start, stop = loop.start, loop.start + loop.extent
    if ix != INDEX_DTYPE:
        start, stop = tirx.const(start, ix), tirx.const(stop, ix)
    if loop.kind == "thread":
        return T.thread_binding(start, stop, thread=loop.thread)
    return _LOOP_FRAMES[loop.kind](start, stop)


def _emit_store(store: PStore, buffers: dict, env: dict, ix: str, cells=None) -> None:
    buf = buffers[store.lhs.tensor]
    lower = ExprLowering(buffers, env, tvm_dtype(store.lhs.dtype), store.where, ix,
                         cell=_one_cell if cells is None else cells.for_store())
    if store.identity is not None:
        value = identity_value(store.identity, str(buf.dtype))
    else:
        value = emit_faithful(lower.value(store.rhs), _local_cell, expression_depth(store.rhs))
    indices = [lower.index(i) for i in store.lhs.indices]
    T.buffer_store(buf, stored(value, str(buf.dtype)), indices)


def _local_cell(shape, dtype: str):
    return T.alloc_buffer(shape, dtype, scope="local")


def _one_cell(dtype: str):
    """A one-element local buffer in the current frame and its subscript (`ExprLowering.cell`)."""
    return _local_cell((1,), dtype), [0]


def python_name(name: str) -> str:
    """LEIR index names are valid identifiers except for a few keywords (`as`, `if`, `in`, `or`...)."""
    return name + "_" if keyword.iskeyword(name) else name


def emit_unit_primfunc(plan: Plan, signature: Signature, items: tuple, args: tuple[str, ...],
                       local: tuple[str, ...], name: str):
    """A function of some of the plan's top-level `items` alone (a timing unit, `leir.lower.units`):
    its arguments are the tensors named in `args` (known tensors and the intermediates it shares with
    other units, as global buffers), and it allocates the intermediates in `local` itself, as the
    whole program's function does."""
    ix = plan_index_dtype(plan)
    with IRBuilder() as ib:
        with T.prim_func():
            T.func_name(name)
            T.func_attr({"tirx.noalias": True})
            buffers = {}
            for arg in args:
                spec = signature.get(arg)
                if spec is not None:
                    buffers[arg] = T.arg(arg, T.buffer(index_shape(spec.shape, ix), spec.dtype))
                else:
                    info = plan.tensors[arg]
                    buffers[arg] = T.arg(arg, T.buffer(index_shape(info.shape, ix), storage_dtype(info.dtype)))
            for tensor in local:
                buffers[tensor] = _alloc(plan, tensor, ix)
            for item in items:
                _emit(item, plan, buffers, {}, ix)
    return ib.get()
