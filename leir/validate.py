"""Validation with precise messages (docs/leir.md §7): every problem names its nest and statement.

`validate(program, signature)` returns the problems in program order (empty list = valid). Codes:
`loop-extent`, `bind-name`, `loop-shadow`, `index-out-of-scope`, `type-conflict`, `scope-on-known`,
`rank-mismatch`, `write-to-input`, `undefined-tensor`, `subscript-out-of-range`, `write-out-of-range`,
`shape-unknown`, `uninitialised-read`, `output-not-written`, `too-deep` (beyond what lowering handles:
`leir.analysis.MAX_LOOP_DEPTH` enclosing loops, `MAX_EXPRESSION_DEPTH` levels of an expression).

Subscripts are checked as lowering checks them (`leir.analysis.subscript_overflow` over the loop
ranges: exact for affine subscripts, interval arithmetic otherwise), for the write and for every read
outside an `if_then_else` branch, so that a program `leir check` accepts is not refused by lowering
for an access out of bounds.
"""
from __future__ import annotations

from dataclasses import dataclass

from leir.analysis import (
    StmtSite,
    implicit_inits,
    is_update,
    site_depth_problem,
    statement_sites,
    subscript_overflow,
    tensor_table,
    unguarded_reads,
)
from leir.ast import Access, Nest, Num, Program, Select, Var, accesses, children, walk_expr
from leir.names import is_bind_name
from leir.printer import format_expr
from leir.signature import Signature


@dataclass(frozen=True, slots=True)
class Problem:
    code: str
    message: str
    nest: int | None = None       # 1-based top-level nest
    statement: int | None = None  # 1-based statement in program order

    def to_json(self) -> dict:
        return {"code": self.code, "message": self.message, "nest": self.nest, "statement": self.statement}

    def __str__(self) -> str:
        where = []
        if self.nest is not None:
            where.append(f"nest {self.nest}")
        if self.statement is not None:
            where.append(f"statement {self.statement}")
        return (", ".join(where) + ": " if where else "") + self.message


def validate(program: Program, signature: Signature) -> list[Problem]:
    sites = statement_sites(program)
    problems = _loop_problems(program)
    problems += [_at(site, "too-deep", why) for site in sites if (why := site_depth_problem(site))]
    problems += _scope_problems(sites)
    problems += _type_problems(sites, signature)
    problems += _write_problems(sites, signature)
    problems += _shape_problems(program, sites, signature)
    problems += _init_problems(program, sites, signature)
    written = {s.stmt.lhs.tensor for s in sites}
    for out in signature.outputs:
        if out.name not in written:
            problems.append(Problem("output-not-written", f"output {out.name} is never written"))
    return problems


def uninitialised_reads(program: Program, signature: Signature) -> list[Problem]:
    """The `uninitialised-read` problems alone (what the verifier refuses before building: the result
    of such a program is whatever memory held)."""
    return _init_problems(program, statement_sites(program), signature)


def _at(site: StmtSite, code: str, message: str) -> Problem:
    return Problem(code, message, site.nest_index + 1, site.order + 1)


# --- loops and indices -----------------------------------------------------------------------------

def _loop_problems(program: Program) -> list[Problem]:
    problems: list[Problem] = []
    for top, outermost in enumerate(program.nests):
        stack = [(outermost, ())]  # nests inside nests, in program order, without recursion
        while stack:
            nest, outer = stack.pop()
            names = list(outer)
            for lp in nest.loops:
                where = f"loop {lp.kind}^{{{lp.extent}}}_{{{lp.var}={lp.start}}}"
                if lp.extent < 1:
                    problems.append(Problem("loop-extent", f"{where}: extent must be at least 1", top + 1))
                if lp.kind == "B" and not is_bind_name(lp.var):
                    problems.append(Problem("bind-name", f"{where}: a B loop needs a binding name "
                                            "(tx, ty, tz, bx, by, bz, optionally with a suffix)", top + 1))
                if lp.kind != "B" and is_bind_name(lp.var):
                    problems.append(Problem("bind-name", f"{where}: binding name {lp.var!r} on a non-B loop",
                                            top + 1))
                if lp.var in names:
                    problems.append(Problem("loop-shadow", f"{where}: {lp.var!r} is already a loop variable "
                                            "of an enclosing loop", top + 1))
                names.append(lp.var)
            stack.extend((item, tuple(names)) for item in reversed(nest.body) if isinstance(item, Nest))
    return problems


def _scope_problems(sites: list[StmtSite]) -> list[Problem]:
    problems = []
    for site in sites:
        in_scope = {lp.var for lp in site.loops}
        seen = set()
        for node in (*walk_expr(site.stmt.lhs), *walk_expr(site.stmt.rhs)):
            if isinstance(node, Var) and node.name not in in_scope and node.name not in seen:
                seen.add(node.name)
                problems.append(_at(site, "index-out-of-scope",
                                    f"index {node.name!r} is used outside any loop that defines it"))
    return problems


# --- tensors ---------------------------------------------------------------------------------------

def _all_accesses(site: StmtSite):
    yield from accesses(site.stmt.lhs)
    yield from accesses(site.stmt.rhs)


def _type_problems(sites: list[StmtSite], signature: Signature) -> list[Problem]:
    problems = []
    first: dict[str, tuple[Access, StmtSite]] = {}
    for site in sites:
        for acc in _all_accesses(site):
            spec = signature.get(acc.tensor)
            if spec is not None:
                if acc.dtype != spec.code:
                    problems.append(_at(site, "type-conflict", f"{acc.tensor} is {spec.dtype} in the "
                                        f"signature but accessed as {acc.dtype}"))
                if acc.scope != "g":
                    problems.append(_at(site, "scope-on-known", f"{acc.tensor} is a known tensor and must "
                                        f"stay in global scope, found scope {acc.scope!r}"))
                if len(acc.indices) != len(spec.shape):
                    problems.append(_at(site, "rank-mismatch", f"{acc.tensor} has {len(spec.shape)} "
                                        f"dimensions but is accessed with {len(acc.indices)} subscripts"))
                continue
            if acc.tensor not in first:
                first[acc.tensor] = (acc, site)
                continue
            ref, ref_site = first[acc.tensor]
            if (acc.dtype, acc.scope) != (ref.dtype, ref.scope):
                problems.append(_at(site, "type-conflict", f"{acc.tensor} is accessed as "
                                    f"{{{acc.dtype},{acc.scope}}} here but as {{{ref.dtype},{ref.scope}}} in "
                                    f"statement {ref_site.order + 1}"))
            if len(acc.indices) != len(ref.indices):
                problems.append(_at(site, "rank-mismatch", f"{acc.tensor} is accessed with "
                                    f"{len(acc.indices)} subscripts here but {len(ref.indices)} in "
                                    f"statement {ref_site.order + 1}"))
    return _dedupe(problems)


def _write_problems(sites: list[StmtSite], signature: Signature) -> list[Problem]:
    inputs = {t.name for t in signature.inputs}
    written = {s.stmt.lhs.tensor for s in sites}
    problems = []
    reported = set()
    for site in sites:
        if site.stmt.lhs.tensor in inputs:
            problems.append(_at(site, "write-to-input", f"writes input {site.stmt.lhs.tensor}"))
        for acc in _all_accesses(site):
            name = acc.tensor
            if name not in written and name not in signature and name not in reported:
                reported.add(name)
                problems.append(_at(site, "undefined-tensor", f"{name} is not in the signature and no "
                                    "statement writes it"))
    return problems


def _shape_problems(program: Program, sites: list[StmtSite], signature: Signature) -> list[Problem]:
    table = tensor_table(program, signature)
    problems = []
    for name, info in table.items():
        if info.role == "intermediate" and info.shape is None and info.shape_problem != "never written":
            problems.append(Problem("shape-unknown", f"cannot infer the shape of {name}: {info.shape_problem}"))
    for site in sites:
        bounds = site.bounds
        lhs = site.stmt.lhs
        unguarded = {id(a) for a in unguarded_reads(site.stmt)}
        for acc in _all_accesses(site):
            info = table.get(acc.tensor)
            if info is None or info.shape is None or len(acc.indices) != len(info.shape):
                continue
            constants = [(d, ix.value, size) for d, (ix, size) in enumerate(zip(acc.indices, info.shape, strict=True))
                         if isinstance(ix, Num) and not 0 <= ix.value < size]
            for d, value, size in constants:  # anywhere, also inside an if_then_else branch
                problems.append(_at(site, "subscript-out-of-range", f"{acc.tensor} subscript {d + 1} is "
                                    f"{value}, outside 0..{size - 1}"))
            if constants:
                continue
            # The same subscripts as lowering checks (leir.lower.check), with the same ranges: a
            # program that passes here is not refused there for an access out of bounds.
            writes = acc is lhs and info.known
            found = subscript_overflow(acc, bounds, info.shape) if writes or id(acc) in unguarded else None
            if found is not None:
                d, (lo, hi) = found
                code, what = ("write-out-of-range", "writes") if writes else ("subscript-out-of-range", "reads")
                problems.append(_at(site, code, f"{what} {acc.tensor} at subscript {d + 1} = "
                                    f"{format_expr(acc.indices[d])} in {lo}..{hi} over the loop ranges, outside "
                                    f"0..{info.shape[d] - 1}"))
    return _dedupe(problems)


# --- initialisation --------------------------------------------------------------------------------

def _init_problems(program: Program, sites: list[StmtSite], signature: Signature) -> list[Problem]:
    """Reads that certainly see an uninitialised element (docs/leir.md §4.4), decided statically:
    a tensor read before any statement writes it (and not written later inside a loop that also
    encloses the read, which could carry the value round), and an update without implicit
    initialisation that reads its own element unconditionally on its first execution."""
    inputs = {t.name for t in signature.inputs}
    inits = implicit_inits(program, signature)
    writers: dict[str, list[StmtSite]] = {}
    for site in sites:
        writers.setdefault(site.stmt.lhs.tensor, []).append(site)
    problems = []
    for site in sites:
        lhs = site.stmt.lhs
        reported = set()
        for acc in _reads(site):
            name = acc.tensor
            if name in inputs or name in reported or name not in writers:
                continue
            if any(w.order < site.order or w is site or _share_loop(w, site) for w in writers[name]):
                continue
            reported.add(name)
            problems.append(_at(site, "uninitialised-read", f"reads {name} before any statement writes it"))
        if (lhs.tensor not in inputs and site.order not in inits and is_update(site.stmt)
                and not any(w.order < site.order for w in writers[lhs.tensor])
                and _reads_unconditionally(site.stmt.rhs, lhs)):
            problems.append(_at(site, "uninitialised-read", f"updates {lhs.tensor} before it is initialised: "
                                "no earlier statement writes it and this form gets no implicit "
                                "initialisation (X+e, X-e, X*e, max(X,e), min(X,e))"))
    return problems


def _reads(site: StmtSite):
    for ix in site.stmt.lhs.indices:
        yield from accesses(ix)
    yield from accesses(site.stmt.rhs)


def _share_loop(a: StmtSite, b: StmtSite) -> bool:
    """Both statements sit inside a common loop (same top-level nest): a later write can reach an
    earlier read in the next iteration."""
    return a.nest_index == b.nest_index


def _reads_unconditionally(expr, target: Access) -> bool:
    """`target` is read whenever `expr` is evaluated: outside the branches of `if_then_else`."""
    stack = [expr]
    while stack:
        node = stack.pop()
        if node == target:
            return True
        stack.extend((node.cond,) if isinstance(node, Select) else children(node))
    return False


def _dedupe(problems: list[Problem]) -> list[Problem]:
    return list(dict.fromkeys(problems))


def intermediates_json(program: Program, signature: Signature) -> dict:
    """{name: {"shape", "dtype", "scope"}} of the intermediates, in order of first occurrence."""
    from leir.dtypes import torch_name

    out = {}
    for name, info in tensor_table(program, signature).items():
        if info.role == "intermediate":
            out[name] = {"shape": list(info.shape) if info.shape is not None else None,
                         "dtype": torch_name(info.dtype), "scope": info.scope}
    return out


__all__ = ["Problem", "validate", "intermediates_json"]
