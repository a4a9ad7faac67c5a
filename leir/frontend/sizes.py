"""Programs of one model at two sizes: the program emitted at the model's own sizes is vouched for
by verifying the same program at a shrunk instance, which holds when the two differ only in sizes.

`skeleton(program)` is the program with every integer literal (loop extents, subscript offsets and
bounds, flattened strides) replaced by 0, and integer arithmetic on an index (`g*8+c`, `a//4`, `c-1`)
reduced to the index: the emitter leaves out a stride or offset that a size made trivial (`g*1+c` is
written `g+c`). Two translations of one model have the same skeleton when shrinking changed nothing
but sizes (not, e.g., a dimension shrunk to 1 and then broadcast, which reads element 0 instead of
following an index, or a pooling window that no longer fits).
"""
from __future__ import annotations

from dataclasses import fields, is_dataclass, replace

from leir.ast import BinOp, Loop, Num, Program

INDEX_ARITHMETIC = ("+", "-", "*", "//", "%")


def skeleton(program: Program) -> Program:
    return _strip(program)


def same_structure(a: Program, b: Program) -> bool:
    return skeleton(a) == skeleton(b)


def _strip(node):
    if isinstance(node, BinOp) and node.op in INDEX_ARITHMETIC:
        if _is_int(node.rhs):
            return _strip(node.lhs)
        if _is_int(node.lhs) and node.op in ("+", "*"):
            return _strip(node.rhs)
    if isinstance(node, Num):
        return Num(0) if isinstance(node.value, int) else node
    if isinstance(node, Loop):
        return replace(node, extent=0)
    if isinstance(node, tuple):
        return tuple(_strip(x) for x in node)
    if is_dataclass(node):
        return replace(node, **{f.name: _strip(getattr(node, f.name)) for f in fields(node)})
    return node


def _is_int(node) -> bool:
    return isinstance(node, Num) and isinstance(node.value, int)
