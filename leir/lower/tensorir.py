"""The TensorIR (block) form: a lowering plan emitted as the TIR that `tvm.s_tir.Schedule`,
MetaSchedule and TVM users work with (`@T.prim_func(s_tir=True)`).

The same loops as the plain form (`emit`), with their lowered kinds (parallel, vectorized, unrolled,
thread-bound on CUDA), and around each statement a block (`T.sblock`) whose iterators are bound to
the enclosing LEIR loops with the kinds `blocks.plan_blocks` decided (`T.axis.remap("SSR", ...)`,
`T.axis.scan` where values flow between iterations, `T.axis.opaque` to keep an allocation
out of a vectorized loop); reads and writes are the regions TVM derives
from the block body; implicit initialisation is `T.init()` where that is exact, else an explicit
`X_init` block where the plain form fills; intermediates are allocated once in the root block
(`T.sblock_alloc_buffer`) with their scopes. Literals, casts and typing are the plain form's
(`expr.ExprLowering`), so that both forms compute the same values.
"""
from __future__ import annotations

from tvm import ir, tirx
from tvm.script.ir_builder import IRBuilder
from tvm.script.ir_builder import tirx as T

from leir.analysis import expression_depth
from leir.lower.blocks import OPAQUE, REDUCTION, SCAN, SPATIAL, BlockPlan
from leir.lower.emit import loop_frame, plan_index_dtype, python_name
from leir.lower.expr import ExprLowering, identity_value, index_shape, storage_dtype, stored, tvm_dtype
from leir.lower.ieee import emit_faithful
from leir.lower.planner import Plan, PLoop, PStore
from leir.signature import Signature

_AXES = {SPATIAL: T.axis.spatial, REDUCTION: T.axis.reduce, SCAN: T.axis.scan, OPAQUE: T.axis.opaque}


def emit_tensorir(plan: Plan, blocks: BlockPlan, signature: Signature):
    ix = plan_index_dtype(plan)
    with IRBuilder() as ib:
        with T.prim_func(s_tir=True):
            T.func_name("main")
            T.func_attr({"tirx.noalias": True})
            buffers = {}
            for spec in signature.tensors:  # argument order = signature order
                buffers[spec.name] = T.arg(spec.name, T.buffer(index_shape(spec.shape, ix), spec.dtype))
            with T.sblock("root"):
                for name, info in plan.tensors.items():
                    if not info.known:
                        buf = T.sblock_alloc_buffer(index_shape(info.shape, ix), storage_dtype(info.dtype),
                                                    scope=plan.scopes[name])
                        IRBuilder.name(name, buf)
                        buffers[name] = buf
                for item in plan.items:
                    _emit(item, blocks, buffers, {}, ix)
    return ib.get()


def _emit(item, blocks: BlockPlan, buffers: dict, loops: dict, ix: str) -> None:
    if isinstance(item, PStore):
        if not (item.is_fill and item.order in blocks.init_orders):
            _emit_block(item, blocks, buffers, loops, ix)
        return
    with loop_frame(item, ix) as var:
        IRBuilder.name(python_name(item.var), var)
        inner = loops if item.wrapper else {**loops, item.var: (item, var)}
        for b in item.body:
            _emit(b, blocks, buffers, inner, ix)


def _local_cell(shape, dtype: str):
    return T.sblock_alloc_buffer(shape, dtype, scope="local")


def _emit_block(store: PStore, blocks: BlockPlan, buffers: dict, loops: dict[str, tuple[PLoop, object]],
                ix: str) -> None:
    spec = blocks.spec(store)
    with T.sblock(spec.name):
        env = {}
        for name, kind in zip(spec.iters, spec.kinds, strict=True):
            loop, var = loops[name]
            start, stop = tirx.const(loop.start, ix), tirx.const(loop.start + loop.extent, ix)
            dom = stop if loop.start == 0 else ir.Range(start, stop)
            env[name] = _AXES[kind](dom, var)
            IRBuilder.name("v_" + python_name(name), env[name])
        buf = buffers[store.lhs.tensor]
        dtype = str(buf.dtype)  # storage (a bfloat16 intermediate is held in float32; expr.storage_dtype)
        lower = ExprLowering(buffers, env, tvm_dtype(store.lhs.dtype), store.where, ix)
        indices = [lower.index(i) for i in store.lhs.indices]
        if spec.init is not None:
            with T.init():
                T.buffer_store(buf, identity_value(spec.init, dtype), indices)
        if store.is_fill:
            value = identity_value(store.identity, dtype)
        else:
            value = emit_faithful(lower.value(store.rhs), _local_cell, expression_depth(store.rhs))
        T.buffer_store(buf, stored(value, dtype), indices)
