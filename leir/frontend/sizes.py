"""Programs of one model at two sizes: the program emitted at the model's own sizes is vouched for
by verifying the same program at a shrunk instance, which holds when the two differ only in sizes.

`skeleton(program)` is the program with every integer literal (loop extents, subscript offsets and
bounds, flattened strides) replaced by 0, and integer arithmetic on an index (`g*8+c`, `a//4`, `c-1`)
reduced to the index: the emitter leaves out a stride or offset that a size made trivial (`g*1+c` is
written `g+c`). Two translations of one model have the same skeleton when shrinking changed nothing
but sizes (not, e.g., a dimension shrunk to 1 and then broadcast, which reads element 0 instead of
following an index, or a pooling window that no longer fits). Float literals the translator computed
from sizes (`Translation.size_constants`, attention's 1/sqrt(E)) are replaced by 0 too, when named.
"""
from __future__ import annotations

from collections.abc import Sequence
from dataclasses import fields, is_dataclass, replace

from leir.ast import BinOp, Loop, Num, Program

INDEX_ARITHMETIC = ("+", "-", "*", "//", "%")


def skeleton(program: Program, size_constants: Sequence[float] = ()) -> Program:
    return _strip(program, frozenset(size_constants))


def same_structure(a: Program, b: Program, size_constants: Sequence[float] = ()) -> bool:
    """Whether `a` and `b` differ only in sizes; `size_constants`: the float literals of either that
    were computed from sizes."""
    return skeleton(a, size_constants) == skeleton(b, size_constants)


def _strip(node, sized: frozenset = frozenset()):
    if isinstance(node, BinOp) and node.op in INDEX_ARITHMETIC:
        if _is_int(node.rhs):
            return _strip(node.lhs, sized)
        if _is_int(node.lhs) and node.op in ("+", "*"):
            return _strip(node.rhs, sized)
    if isinstance(node, Num):
        return Num(0) if isinstance(node.value, int) or node.value in sized else node
    if isinstance(node, Loop):
        return replace(node, extent=0)
    if isinstance(node, tuple):
        return tuple(_strip(x, sized) for x in node)
    if is_dataclass(node):
        return replace(node, **{f.name: _strip(getattr(node, f.name), sized) for f in fields(node)})
    return node


def _is_int(node) -> bool:
    return isinstance(node, Num) and isinstance(node.value, int)
