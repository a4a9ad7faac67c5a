"""Tree addressing and edits shared by the rules: items by (nest, path), the bands (every nest, nested
ones included) and their loops, replacing and removing items, substituting loop variables, fresh
names. Everything works on the AST; nothing here touches text."""
from __future__ import annotations

from collections.abc import Iterator

from leir.analysis import StmtSite, tensor_order
from leir.ast import Access, Loop, Neg, Nest, Num, Program, Stmt, Var, accesses, map_expr, map_stmt, walk_expr
from leir.names import IndexNames, TensorNames

# --- addressing ------------------------------------------------------------------------------------

def get_item(program: Program, nest: int, path: tuple[int, ...] = ()) -> Nest | Stmt:
    item: Nest | Stmt = program.nests[nest]
    for i in path:
        if not isinstance(item, Nest):
            raise IndexError(f"path {path} goes through a statement")
        item = item.body[i]
    return item


def enclosing_loops(program: Program, nest: int, path: tuple[int, ...]) -> tuple[Loop, ...]:
    """The loops of the nests above the nest at (nest, path), outermost first (its own excluded)."""
    loops: tuple[Loop, ...] = ()
    item = program.nests[nest]
    for i in path:
        loops += item.loops
        item = item.body[i]
    return loops


def bands(program: Program) -> Iterator[tuple[int, tuple[int, ...], Nest, tuple[Loop, ...]]]:
    """(top nest, path, nest, enclosing loops) for every nest, nested ones included, program order."""
    def visit(top, path, nest, outer):
        yield top, path, nest, outer
        for i, item in enumerate(nest.body):
            if isinstance(item, Nest):
                yield from visit(top, path + (i,), item, outer + nest.loops)

    for top, nest in enumerate(program.nests):
        yield from visit(top, (), nest, ())


def loop_positions(program: Program) -> Iterator[tuple[int, tuple[int, ...], int, Nest, tuple[Loop, ...]]]:
    """(top nest, path to the nest, loop position, nest, enclosing loops) for every loop, program order."""
    for top, path, nest, outer in bands(program):
        for k in range(len(nest.loops)):
            yield top, path, k, nest, outer


def changed_nests(before: Program, after: Program) -> tuple[range, range]:
    """The top-level nest ranges that differ (common prefix and suffix removed)."""
    b, a = before.nests, after.nests
    start = 0
    while start < min(len(b), len(a)) and b[start] == a[start]:
        start += 1
    end_b, end_a = len(b), len(a)
    while end_b > start and end_a > start and b[end_b - 1] == a[end_a - 1]:
        end_b, end_a = end_b - 1, end_a - 1
    return range(start, end_b), range(start, end_a)


# --- edits ---------------------------------------------------------------------------------------------

def replace_item(program: Program, nest: int, path: tuple[int, ...], new: tuple[Nest | Stmt, ...]) -> Program:
    """Replace the item at (nest, path) by zero or more items (top level: nests only)."""
    if not path:
        if not all(isinstance(n, Nest) for n in new):
            raise TypeError("only nests can stand at the top level")
        return Program(program.nests[:nest] + tuple(new) + program.nests[nest + 1:])

    def rebuild(item: Nest, rest: tuple[int, ...]) -> Nest:
        i = rest[0]
        if len(rest) == 1:
            body = item.body[:i] + tuple(new) + item.body[i + 1:]
        else:
            body = item.body[:i] + (rebuild(item.body[i], rest[1:]),) + item.body[i + 1:]
        return Nest(item.loops, body)

    return Program(program.nests[:nest] + (rebuild(program.nests[nest], path),) + program.nests[nest + 1:])


def replace_stmt(program: Program, site: StmtSite, *stmts: Stmt) -> Program:
    """The statement at `site` replaced by `stmts` (in its place, in this order)."""
    return replace_item(program, site.nest_index, site.path, stmts)


def replace_nests(program: Program, first: int, count: int, new: tuple[Nest, ...]) -> Program:
    """Top-level nests first..first+count-1 replaced by `new`."""
    return Program(program.nests[:first] + tuple(new) + program.nests[first + count:])


def remove_items(program: Program, keys: list[tuple[int, tuple[int, ...]]]) -> Program:
    """The program without the items at (nest, path); nests left without a body disappear."""
    def prune(nest: Nest, path: tuple[int, ...], doomed) -> Nest | None:
        body = []
        for i, item in enumerate(nest.body):
            if path + (i,) in doomed:
                continue
            if isinstance(item, Nest):
                item = prune(item, path + (i,), doomed)
                if item is None:
                    continue
            body.append(item)
        return Nest(nest.loops, tuple(body)) if body else None

    nests = []
    for top, nest in enumerate(program.nests):
        pruned = prune(nest, (), {p for t, p in keys if t == top})
        if pruned is not None:
            nests.append(pruned)
    return Program(tuple(nests))


def with_loop(nest: Nest, k: int, loop: Loop) -> Nest:
    """`nest` with its loop k replaced by `loop`."""
    return Nest(nest.loops[:k] + (loop,) + nest.loops[k + 1:], nest.body)


def map_nest_stmts(nest: Nest, fn) -> Nest:
    """Apply `fn(stmt) -> stmt` to every statement of a nest, nested nests included."""
    return Nest(nest.loops, tuple(fn(i) if isinstance(i, Stmt) else map_nest_stmts(i, fn) for i in nest.body))


def map_program_stmts(program: Program, fn) -> Program:
    """Apply `fn(stmt) -> stmt` to every statement of the program."""
    return Program(tuple(map_nest_stmts(n, fn) for n in program.nests))


def map_accesses(program: Program, mapping: dict) -> Program:
    """Every access of a tensor in `mapping` (reads, writes, gathers) rebuilt by `mapping[tensor](access)`."""
    def fn(n):
        if isinstance(n, Access) and n.tensor in mapping:
            return mapping[n.tensor](n)
        return n
    return map_program_stmts(program, lambda s: map_stmt(s, fn))


def tensor_accesses(ctx, tensor: str) -> list[tuple[Access, StmtSite]]:
    """(access, statement site) for every access of `tensor` (gathers in subscripts included), program
    order; within a statement the write first."""
    return [(a, s) for s in ctx.sites for a in (*accesses(s.stmt.lhs), *accesses(s.stmt.rhs)) if a.tensor == tensor]


# --- loop variables ------------------------------------------------------------------------------------

def substitute_vars(expr, mapping: dict[str, object]):
    """Replace loop variables by expressions (`{"a": BinOp("*", Var("g"), Num(4))}`)."""
    return map_expr(expr, lambda n: mapping.get(n.name, n) if isinstance(n, Var) else n)


def substitute_in_nest(nest: Nest, mapping: dict) -> Nest:
    """Every statement of the nest with its loop variables replaced by expressions (loops unchanged)."""
    return map_nest_stmts(nest, lambda s: map_stmt(s, lambda n: mapping.get(n.name, n)
                                                   if isinstance(n, Var) else n))


def rename_vars_in_nest(nest: Nest, mapping: dict[str, str]) -> Nest:
    """Loop variables renamed, in the loops and in every statement."""
    loops = tuple(Loop(lp.kind, lp.extent, mapping.get(lp.var, lp.var), lp.start) for lp in nest.loops)
    def rename(n):
        return Var(mapping.get(n.name, n.name)) if isinstance(n, Var) else n
    return map_nest_stmts(Nest(loops, nest.body), lambda s: map_stmt(s, rename))


def loop_vars(program: Program) -> list[str]:
    """Every loop variable (index or binding name) of the program, first occurrence order."""
    return list(dict.fromkeys(lp.var for _, _, nest, _ in bands(program) for lp in nest.loops))


def vars_in(node) -> list[str]:
    """Loop variables used in an expression (subscripts included), first occurrence order."""
    return list(dict.fromkeys(n.name for n in walk_expr(node) if isinstance(n, Var)))


# --- fresh names and literals ----------------------------------------------------------------------------

def fresh_tensors(program: Program, signature=None) -> TensorNames:
    """A `TensorNames` allocator continuing the sequence past every name in use (docs/leir.md §6)."""
    names = list(signature.names) if signature is not None else []
    return TensorNames(dict.fromkeys(names + tensor_order(program)))


def fresh_indices(program: Program) -> IndexNames:
    """An `IndexNames` allocator avoiding every loop variable in use."""
    return IndexNames(loop_vars(program))


def literal(value) -> object:
    """A LEIR literal for an int/float value (negative values and -inf as `Neg`)."""
    if value < 0:
        return Neg(Num(-value))
    return Num(value)
