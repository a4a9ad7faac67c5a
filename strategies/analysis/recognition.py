"""What two programs are made of, for the strategies' recognisers (`Strategy.recognizes`).

A model may carry out a strategy in another spelling than the library (the other loop of a pair
moved first, a different tile size, an online softmax with prefix arrays instead of scalar
accumulators). Each strategy states the structural sign of its step as a predicate over the
original and the answer; these are the structure queries those predicates share. A sign is
necessary, not a proof of equivalence: the caller asks only once the answer verifies.
"""
from __future__ import annotations

from collections import Counter
from itertools import combinations, permutations

from leir.analysis import StmtSite, reduction_op, statement_sites, tensor_table
from leir.ast import Access, Call, Loop, Nest, Program, Stmt, Var, accesses, walk_expr
from leir.signature import Signature


def statements(program: Program) -> list[Stmt]:
    return [site.stmt for site in statement_sites(program)]


def intermediates(program: Program, signature: Signature) -> dict:
    return {name: info for name, info in tensor_table(program, signature).items() if info.role == "intermediate"}


def shaped_intermediates(program: Program, signature: Signature) -> dict:
    """The intermediates whose shape is known and not 0-d."""
    return {name: info for name, info in intermediates(program, signature).items() if info.shape}


def writers(program: Program) -> dict[str, list[StmtSite]]:
    """Per tensor: the statements that write it, in program order."""
    out: dict[str, list[StmtSite]] = {}
    for site in statement_sites(program):
        out.setdefault(site.stmt.lhs.tensor, []).append(site)
    return out


def readers(program: Program) -> Counter:
    """Per tensor: how many statements read it."""
    return Counter(name for stmt in statements(program) for name in sorted({acc.tensor for acc in accesses(stmt.rhs)}))


def uses(program: Program, tensor: str) -> int:
    """Accesses of `tensor`, written or read."""
    return sum(acc.tensor == tensor for stmt in statements(program) for acc in [stmt.lhs, *accesses(stmt.rhs)])


def calls(program: Program, fn: str) -> int:
    return sum(isinstance(n, Call) and n.fn == fn for stmt in statements(program) for n in walk_expr(stmt.rhs))


def sum_accumulation(stmt: Stmt) -> bool:
    return reduction_op(stmt) in ("+", "-")


def all_loops(nest: Nest) -> list[Loop]:
    return list(nest.loops) + [lp for item in nest.body if isinstance(item, Nest) for lp in all_loops(item)]


def kind_count(program: Program, kind: str) -> int:
    """Loops of `kind` (L, U, P, V, B) anywhere in the program."""
    return sum(lp.kind == kind for n in program.nests for lp in all_loops(n))


def extents(nest: Nest) -> list[int]:
    return [lp.extent for lp in nest.loops]


def all_extents(program: Program) -> list[int]:
    return sorted(lp.extent for n in program.nests for lp in all_loops(n))


def changed_nests(a: Program, b: Program) -> list[tuple[Nest, Nest]]:
    """Pairs of nests at the same place that differ (programs with as many nests): the innermost
    band that changed, so that a step on a nest inside another's body is compared there."""
    if len(a.nests) != len(b.nests):
        return []
    out: list[tuple[Nest, Nest]] = []
    for x, y in zip(a.nests, b.nests, strict=True):
        if x != y:
            _changed_band(x, y, out)
    return out


def _changed_band(x: Nest, y: Nest, out: list) -> None:
    inner = [(u, v) for u, v in zip(x.body, y.body, strict=False) if u != v]
    if x.loops != y.loops or len(x.body) != len(y.body) or not all(
            isinstance(u, Nest) and isinstance(v, Nest) for u, v in inner):
        out.append((x, y))
        return
    for u, v in inner:
        _changed_band(u, v, out)


def split_from(original: list[int], answer: list[int], n_pairs: int, adjacent: bool) -> bool:
    """`answer` is `original` with `n_pairs` loops each split into an outer and an inner loop
    (adjacent for a split; for tiling the tile loops come before all point loops)."""
    if len(answer) != len(original) + n_pairs:
        return False
    for pairs in combinations(combinations(range(len(answer)), 2), n_pairs):
        used = [p for pair in pairs for p in pair]
        if len(set(used)) != len(used):
            continue
        if adjacent and any(i != o + 1 for o, i in pairs):
            continue
        if not adjacent and max(o for o, _ in pairs) > min(i for _, i in pairs):
            continue
        if any(answer[o] == 1 or answer[i] == 1 for o, i in pairs):
            continue
        merged = _merge(answer, pairs)
        if merged == original or (not adjacent and sorted(merged) == sorted(original)):
            return True
    return False


def _merge(extents: list[int], pairs: tuple[tuple[int, int], ...]) -> list[int]:
    """`extents` with each (outer, inner) position pair replaced by its product at the outer place."""
    inner = {i for _, i in pairs}
    out = []
    for k, e in enumerate(extents):
        if k in inner:
            continue
        partner = next((i for o, i in pairs if o == k), None)
        out.append(e * extents[partner] if partner is not None else e)
    return out


def roles(nest: Nest) -> list[tuple]:
    """Per loop of the nest, outermost first: its extent and the (tensor, subscript position) pairs
    where its index appears, which name the loop whatever the answer calls its index."""
    found: dict[str, set] = {lp.var: set() for lp in nest.loops}
    for stmt in statements(Program((nest,))):
        for acc in [stmt.lhs, *accesses(stmt.rhs)]:
            for k, ix in enumerate(acc.indices):
                for n in walk_expr(ix):
                    if isinstance(n, Var) and n.name in found:
                        found[n.name].add((acc.tensor, k))
    return [(lp.extent, tuple(sorted(found[lp.var]))) for lp in nest.loops]


def subscripts(program: Program, tensor: str) -> list[tuple]:
    """The subscripts of every access of `tensor`, in program order (writes and reads)."""
    return [tuple(acc.indices) for stmt in statements(program) for acc in [stmt.lhs, *accesses(stmt.rhs)]
            if acc.tensor == tensor]


def permuted_subscripts(a: Program, b: Program, tensor: str) -> bool:
    """Every access of `tensor` in `b` is its access in `a` with the subscripts in one other order."""
    xs, ys = subscripts(a, tensor), subscripts(b, tensor)
    if not xs or len(xs) != len(ys) or any(len(x) != len(y) for x, y in zip(xs, ys, strict=True)):
        return False
    rank = len(xs[0])
    return rank <= 6 and any(all(tuple(x[i] for i in order) == y for x, y in zip(xs, ys, strict=True))
                             for order in permutations(range(rank)) if list(order) != sorted(order))


def copies(program: Program) -> list[tuple[Stmt, Access]]:
    """Statements that copy one tensor's element into another (`E[..] = A[..]`), with the read."""
    return [(stmt, stmt.rhs) for stmt in statements(program) if isinstance(stmt.rhs, Access)]


def more_of_kind(a: Program, b: Program, kind: str) -> bool:
    """More loops of `kind` over the same extents."""
    return kind_count(b, kind) > kind_count(a, kind) and all_extents(b) == all_extents(a)


def fewer_nests(a: Program, b: Program) -> bool:
    """Fewer top-level nests holding the same statements (a fused nest may drop a copy per nest)."""
    return len(b.nests) < len(a.nests) and len(statements(b)) >= len(statements(a)) - (len(a.nests) - len(b.nests))


def new_intermediates(a: Program, b: Program, signature: Signature) -> list[str]:
    """Intermediates of `b` that `a` does not have, in `b`'s order."""
    before = intermediates(a, signature)
    return [name for name in intermediates(b, signature) if name not in before]
