"""What a program must satisfy before it is lowered; each failure is a `LoweringError` that names the
nest and statement (1-based) and what is wrong, instead of a TVM check failing later without context."""
from __future__ import annotations

from leir.analysis import StmtSite, TensorInfo, index_range, tensor_table
from leir.ast import Access, Program, Select, Stmt, Var, accesses, children
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
            _check_access(acc, table[acc.tensor], describe_site(site, sites))
    return table


def _check_access(acc: Access, info: TensorInfo, where: str) -> None:
    if acc.dtype not in LOWERABLE_CODES:
        raise LoweringError(f"{where}: dtype {acc.dtype} of {acc.tensor} cannot be lowered; "
                            f"supported codes: {', '.join(LOWERABLE_CODES)}")
    if acc.dtype != info.dtype:
        known = "the signature says" if info.known else "its first access says"
        raise LoweringError(f"{where}: {acc.tensor} is accessed as {acc.dtype} but {known} {info.dtype}")
    if info.shape is None:
        raise LoweringError(f"{where}: cannot infer the shape of intermediate {acc.tensor}: {info.shape_problem}")
    if len(acc.indices) != len(info.shape):
        raise LoweringError(f"{where}: {acc.tensor} has {len(info.shape)} dimensions but is accessed with "
                            f"{len(acc.indices)} subscripts")


def check_site(site: StmtSite, where: str, table: dict[str, TensorInfo], signature: Signature) -> None:
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
    # Out-of-range accesses would write or read foreign memory (or crash the worker) silently.
    _check_bounds(site.stmt.lhs, site.bounds, table, where, "writes")
    for acc in _unguarded_reads(site.stmt):
        _check_bounds(acc, site.bounds, table, where, "reads")


def _walk(stmt: Stmt):
    stack = [stmt.lhs, stmt.rhs]
    while stack:
        node = stack.pop()
        yield node
        stack.extend(children(node))


def _unguarded_reads(stmt: Stmt):
    """Accesses that execute whenever the statement does: not inside a branch of `if_then_else`
    (padding reads legitimately fall outside the tensor there; the branch is never evaluated)."""
    stack = list(stmt.lhs.indices) + [stmt.rhs]
    while stack:
        node = stack.pop()
        if isinstance(node, Select):
            stack.append(node.cond)
            continue
        if isinstance(node, Access):
            yield node
        stack.extend(children(node))


def _check_bounds(acc: Access, bounds, table, where: str, verb: str) -> None:
    shape = table[acc.tensor].shape
    for d, ix in enumerate(acc.indices):
        r = index_range(ix, bounds)  # None for a gather: only known at run time
        if r is not None and (r[0] < 0 or r[1] >= shape[d]):
            raise LoweringError(f"{where}: {verb} {acc.tensor} out of bounds: subscript {d + 1} ranges over "
                                f"[{r[0]}, {r[1]}] but the dimension has size {shape[d]}")
