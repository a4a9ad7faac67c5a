"""What a program must satisfy before it is lowered; each failure is a `LoweringError` that names the
nest and statement (1-based) and what is wrong, instead of a TVM check failing later without context."""
from __future__ import annotations

from leir.analysis import (
    StmtSite,
    TensorInfo,
    site_depth_problem,
    subscript_overflow,
    tensor_table,
    unguarded_reads,
)
from leir.ast import Access, Num, Program, Stmt, Var, accesses, children
from leir.dtypes import LOWERABLE_CODES
from leir.errors import LeirError
from leir.printer import format_stmt
from leir.signature import Signature


class LoweringError(LeirError):
    """A program (with its signature) that cannot be lowered: the message names the nest and
    statement (1-based) and what is wrong."""


def describe_site(site: StmtSite, sites: list[StmtSite]) -> str:
    """`nest 2, statement 1 `D=...``: the statement's number counts the statements of its top-level
    nest (nested nests included) in program order."""
    k = 1 + sum(1 for s in sites if s.nest_index == site.nest_index and s.order < site.order)
    return f"nest {site.nest_index + 1}, statement {k} `{format_stmt(site.stmt)}`"


def describe_sites(sites: list[StmtSite]) -> dict[int, str]:
    """`describe_site` of every statement, by program order, in one pass."""
    out, counts = {}, {}
    for site in sites:
        k = counts[site.nest_index] = counts.get(site.nest_index, 0) + 1
        out[site.order] = f"nest {site.nest_index + 1}, statement {k} `{format_stmt(site.stmt)}`"
    return out


def checked_table(program: Program, signature: Signature, sites: list[StmtSite]) -> dict[str, TensorInfo]:
    """The tensor table, once every tensor has a lowerable dtype, one dtype, a shape and a rank that
    its accesses agree with."""
    for spec in signature.tensors:
        if spec.code not in LOWERABLE_CODES:
            raise LoweringError(f"signature tensor {spec.name}: dtype {spec.dtype} ({spec.code}) cannot be "
                                f"lowered; supported codes: {', '.join(LOWERABLE_CODES)}")
    table = tensor_table(program, signature)
    for site in sites:
        for acc in [*accesses(site.stmt.lhs), *accesses(site.stmt.rhs)]:
            problem = _access_problem(acc, table[acc.tensor])
            if problem:  # the statement is printed only for the message
                raise LoweringError(f"{describe_site(site, sites)}: {problem}")
    return table


def _access_problem(acc: Access, info: TensorInfo) -> str:
    if acc.dtype not in LOWERABLE_CODES:
        return (f"dtype {acc.dtype} of {acc.tensor} cannot be lowered; supported codes: "
                f"{', '.join(LOWERABLE_CODES)}")
    if acc.dtype != info.dtype:
        known = "the signature says" if info.known else "its first access says"
        return f"{acc.tensor} is accessed as {acc.dtype} but {known} {info.dtype}"
    if info.shape is None:
        return f"cannot infer the shape of intermediate {acc.tensor}: {info.shape_problem}"
    if len(acc.indices) != len(info.shape):
        return f"{acc.tensor} has {len(info.shape)} dimensions but is accessed with {len(acc.indices)} subscripts"
    return ""


def check_site(site: StmtSite, where: str, table: dict[str, TensorInfo], signature: Signature) -> None:
    depth_problem = site_depth_problem(site)
    if depth_problem:
        raise LoweringError(f"{where}: {depth_problem}")
    names = [lp.var for lp in site.loops]
    shadowed = sorted({n for n in names if names.count(n) > 1})
    if shadowed:
        raise LoweringError(f"{where}: loop index {shadowed[0]} is bound by two enclosing loops")
    bound = set(names)
    for node in _walk(site.stmt):
        if isinstance(node, Var) and node.name not in bound:
            raise LoweringError(f"{where}: index {node.name} is not bound by an enclosing loop")
    spec = signature.get(site.stmt.lhs.tensor)
    if spec is not None and spec.role == "input":
        raise LoweringError(f"{where}: writes the input tensor {spec.name} (inputs are read-only)")
    # Out-of-range accesses would write or read foreign memory (or crash the worker) silently; `leir
    # check` reports the same accesses (leir.validate: write-out-of-range, subscript-out-of-range).
    _check_bounds(site.stmt.lhs, site.bounds, table, where, "writes")
    for acc in unguarded_reads(site.stmt):
        _check_bounds(acc, site.bounds, table, where, "reads")
    for node in _walk(site.stmt):  # a constant subscript out of range is refused anywhere, in a branch too
        if isinstance(node, Access) and node.tensor in table:
            shape = table[node.tensor].shape
            for d, ix in enumerate(node.indices):
                if isinstance(ix, Num) and shape is not None and d < len(shape) and not 0 <= ix.value < shape[d]:
                    raise LoweringError(f"{where}: reads {node.tensor} out of bounds: subscript {d + 1} is "
                                        f"{ix.value} but the dimension has size {shape[d]}")


def _walk(stmt: Stmt):
    stack = [stmt.lhs, stmt.rhs]
    while stack:
        node = stack.pop()
        yield node
        stack.extend(children(node))


def _check_bounds(acc: Access, bounds, table, where: str, verb: str) -> None:
    shape = table[acc.tensor].shape
    found = subscript_overflow(acc, bounds, shape)
    if found is not None:
        d, (lo, hi) = found
        raise LoweringError(f"{where}: {verb} {acc.tensor} out of bounds: subscript {d + 1} ranges over "
                            f"[{lo}, {hi}] but the dimension has size {shape[d]}")
