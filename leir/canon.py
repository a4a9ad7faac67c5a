"""Canonical names and the alpha-equivalence hash (docs/leir.md §7).

Two programs that differ only in the names of fresh intermediates and loop indices have the same
canonical form and hash. Known tensors keep their names (the signature fixes them); binding names
keep their axis (`tx`, `by`, ...), only their suffixes are renumbered.
"""
from __future__ import annotations

import hashlib

from leir.analysis import statement_sites, tensor_order
from leir.ast import Access, Loop, Nest, Num, Program, Stmt, Var, accesses, map_stmt
from leir.names import index_names, is_bind_name, tensor_names
from leir.object_cache import MISSING, ObjectCache
from leir.printer import format_program
from leir.signature import Signature


def known_tensors(program: Program, signature: Signature | None = None) -> list[str]:
    """The signature's names; without a signature, the tensors that are never written (inputs) or
    written but never read (outputs)."""
    if signature is not None:
        return list(signature.names)
    written, read = set(), set()
    for site in statement_sites(program):
        written.add(site.stmt.lhs.tensor)
        for ix in site.stmt.lhs.indices:
            read.update(a.tensor for a in accesses(ix))
        read.update(a.tensor for a in accesses(site.stmt.rhs))
    return [n for n in tensor_order(program) if n not in written or n not in read]


def canonical_names(program: Program, signature: Signature | None = None) -> Program:
    """Rename intermediates (first occurrence order, skipping known names) and loop indices (per
    top-level nest, outermost first) to the start of their sequences."""
    known = known_tensors(program, signature)
    fresh = (n for n in tensor_names() if n not in known)
    tensor_map = {n: n for n in known}
    for name in tensor_order(program):
        if name not in tensor_map:
            tensor_map[name] = next(fresh)
    return Program(tuple(_rename_nest(n, {}, tensor_map, _IndexAllocator()) for n in program.nests))


class _IndexAllocator:
    def __init__(self):
        self._indices = index_names()
        self._bind_counts: dict[str, int] = {}

    def fresh(self, old: str) -> str:
        if is_bind_name(old):
            prefix = old[:2]
            k = self._bind_counts.get(prefix, 0)
            self._bind_counts[prefix] = k + 1
            if k == 0:
                return prefix
            suffixes = index_names()
            for _ in range(k - 1):
                next(suffixes)
            return prefix + next(suffixes)
        return next(self._indices)


def _rename_nest(nest: Nest, outer: dict[str, str], tensors: dict[str, str], alloc: _IndexAllocator) -> Nest:
    """The nest with renamed tensors and loop indices. Loop indices are allocated in program order
    (a nest's loops, then its body in order); nests inside nests are handled with an explicit stack."""
    # Frame: [nest, index map, renamed loops, renamed body items, next body position].
    stack = [_open(nest, outer, alloc)]
    while True:
        frame = stack[-1]
        current, var_map, loops, body, i = frame
        if i == len(current.body):
            stack.pop()
            done = Nest(tuple(loops), tuple(body))
            if not stack:
                return done
            stack[-1][3].append(done)
            continue
        item = current.body[i]
        frame[4] = i + 1
        if isinstance(item, Stmt):
            body.append(map_stmt(item, _renamer(var_map, tensors)))
        else:
            stack.append(_open(item, var_map, alloc))


def _open(nest: Nest, outer: dict[str, str], alloc: _IndexAllocator) -> list:
    var_map = dict(outer)
    loops = []
    for lp in nest.loops:
        var_map[lp.var] = alloc.fresh(lp.var)
        loops.append(Loop(lp.kind, lp.extent, var_map[lp.var], lp.start))
    return [nest, var_map, loops, [], 0]


def _renamer(var_map: dict[str, str], tensors: dict[str, str]):
    def rename(node):
        if isinstance(node, Var):
            return Var(var_map.get(node.name, node.name))
        if isinstance(node, Access):
            return Access(tensors.get(node.tensor, node.tensor), node.dtype, node.scope, node.indices)
        return node

    return rename


def canonical_text(program: Program, signature: Signature | None = None) -> str:
    """The program's text with canonical names. Kept for the last programs asked about (the very
    objects: trees that differ only in a literal's type, 1 against 1.0, are equal as trees but not as
    text): a step's result is hashed where it is made, named where its row is written and hashed again
    as the next state."""
    text = _TEXTS.get(program, signature)
    if text is MISSING:
        text = format_program(canonical_names(program, signature))
        _TEXTS.put(program, text, signature)
    return text


_TEXTS = ObjectCache(512)


def alpha_hash(program: Program, signature: Signature | None = None) -> str:
    """sha256 (hex) of the canonical text: equal for alpha-equivalent programs."""
    return hashlib.sha256(canonical_text(program, signature).encode()).hexdigest()


def structure_hashes(program: Program) -> list[str]:
    """One hash per top-level nest, equal for nests that differ only in names and sizes: every tensor
    name (known ones too) and loop index renamed by first occurrence, every loop's extent and start
    set to 0, and every integer literal set to 0 (subscript offsets and strides, guards: they follow
    from the extents). Float literals stay (they are the computation's constants). Done on the tree;
    what the split's structural-overlap check compares (flows.filtering)."""
    return [nest_structure_hash(nest) for nest in program.nests]


def nest_structure_hash(nest: Nest) -> str:
    """`structure_hashes` of one top-level nest (it depends on the nest alone)."""
    shape_free = _without_sizes(nest)
    alone = Program((shape_free,))
    fresh = tensor_names()
    tensors = {name: next(fresh) for name in tensor_order(alone)}
    renamed = _rename_nest(shape_free, {}, tensors, _IndexAllocator())
    return hashlib.sha256(format_program(Program((renamed,))).encode()).hexdigest()


def structure_hashes_of(texts) -> dict[str, list[str]]:
    """{LEIR text: its `structure_hashes`} for many states, each distinct nest hashed once: the states
    of one program, parsed apart, share their unchanged nests (`leir.object_cache.share_nests`), and a
    step rewrites one or two of them (the split's overlap check hashes every released state)."""
    from leir.object_cache import share_nests
    from leir.parse import parse_program

    texts = list(dict.fromkeys(texts))
    programs = share_nests(parse_program(t) for t in texts)  # alive while the memo is: ids stay unique
    memo: dict[int, str] = {}
    out = {}
    for text, program in zip(texts, programs, strict=True):
        for nest in program.nests:
            if id(nest) not in memo:
                memo[id(nest)] = nest_structure_hash(nest)
        out[text] = [memo[id(nest)] for nest in program.nests]
    return out


def _zero_int(node):
    return Num(0) if isinstance(node, Num) and isinstance(node.value, int) else node


def _without_sizes(nest: Nest) -> Nest:
    """`nest` with loop extents, starts and integer literals set to 0 (explicit stack, like _rename_nest)."""
    def strip(stmt: Stmt) -> Stmt:
        return map_stmt(stmt, _zero_int)

    stack = [(nest, [])]
    while True:
        current, body = stack[-1]
        if len(body) == len(current.body):
            stack.pop()
            done = Nest(tuple(Loop(lp.kind, 0, lp.var, 0) for lp in current.loops), tuple(body))
            if not stack:
                return done
            stack[-1][1].append(done)
            continue
        item = current.body[len(body)]
        if isinstance(item, Stmt):
            body.append(strip(item))
        else:
            stack.append((item, []))


def program_id(program: Program, signature: Signature) -> str:
    """Key of the `programs` table: canonical LEIR plus the signature (16 hex digits)."""
    text = canonical_text(program, signature) + "\n" + signature.dumps()
    return hashlib.sha256(text.encode()).hexdigest()[:16]


__all__ = ["known_tensors", "canonical_names", "canonical_text", "alpha_hash", "program_id", "structure_hashes",
           "nest_structure_hash", "structure_hashes_of"]
