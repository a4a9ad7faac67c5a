"""Tree edits shared by the strategies: address items by (nest, path), replace them, substitute
variables. Everything works on the AST; nothing here touches text."""
from __future__ import annotations

from leir.ast import Access, Loop, Nest, Program, Stmt, Var, map_expr, map_stmt


def get_item(program: Program, nest: int, path: tuple[int, ...] = ()) -> Nest | Stmt:
    item: Nest | Stmt = program.nests[nest]
    for i in path:
        if not isinstance(item, Nest):
            raise IndexError(f"path {path} goes through a statement")
        item = item.body[i]
    return item


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


def map_nest_stmts(nest: Nest, fn) -> Nest:
    """Apply `fn(stmt) -> stmt` to every statement of a nest, nested nests included."""
    return Nest(nest.loops, tuple(fn(i) if isinstance(i, Stmt) else map_nest_stmts(i, fn) for i in nest.body))


def substitute_vars(expr, mapping: dict[str, object]):
    """Replace loop variables by expressions (`{"a": BinOp("*", Var("g"), Num(4))}`)."""
    return map_expr(expr, lambda n: mapping.get(n.name, n) if isinstance(n, Var) else n)


def rename_vars_in_nest(nest: Nest, mapping: dict[str, str]) -> Nest:
    loops = tuple(Loop(lp.kind, lp.extent, mapping.get(lp.var, lp.var), lp.start) for lp in nest.loops)
    renamed = map_nest_stmts(Nest(loops, nest.body),
                             lambda s: map_stmt(s, lambda n: Var(mapping.get(n.name, n.name))
                                                if isinstance(n, Var) else n))
    return renamed


def rename_tensor(node, old: str, new: str, dtype: str | None = None, scope: str | None = None):
    """Rename a tensor in an expression (optionally changing its dtype/scope superscript)."""
    def fn(n):
        if isinstance(n, Access) and n.tensor == old:
            return Access(new, dtype or n.dtype, scope or n.scope, n.indices)
        return n
    return map_expr(node, fn)


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


# --- helpers added for the graph, loop and memory strategies ----------------------------------------

def map_program_stmts(program: Program, fn) -> Program:
    """Apply `fn(stmt) -> stmt` to every statement of the program."""
    return Program(tuple(map_nest_stmts(n, fn) for n in program.nests))


def replace_expr(node, old, new):
    """Replace every occurrence of the sub-expression `old` (structural equality) by `new`."""
    return map_expr(node, lambda n: new if n == old else n)


def enclosing_loops(program: Program, nest: int, path: tuple[int, ...]) -> tuple[Loop, ...]:
    """The loops of the nests above the nest at (nest, path), outermost first (its own excluded)."""
    loops: tuple[Loop, ...] = ()
    item = program.nests[nest]
    for i in path:
        loops += item.loops
        item = item.body[i]
    return loops


def loop_vars(program: Program) -> list[str]:
    """Every loop variable (index or binding name) of the program, first occurrence order."""
    seen: dict[str, None] = {}

    def visit(nest: Nest):
        for lp in nest.loops:
            seen.setdefault(lp.var, None)
        for item in nest.body:
            if isinstance(item, Nest):
                visit(item)

    for n in program.nests:
        visit(n)
    return list(seen)


def tensor_names_in(program: Program, signature=None) -> list[str]:
    """Every tensor name of the program (and of the signature), first occurrence order."""
    from leir.analysis import tensor_order

    names = list(signature.names) if signature is not None else []
    return list(dict.fromkeys(names + tensor_order(program)))


def fresh_tensors(program: Program, signature=None):
    """A `TensorNames` allocator continuing the sequence past every name in use (LEIR.md §6)."""
    from leir.names import TensorNames

    return TensorNames(tensor_names_in(program, signature))


def fresh_indices(program: Program):
    """An `IndexNames` allocator avoiding every loop variable in use."""
    from leir.names import IndexNames

    return IndexNames(loop_vars(program))


def nest_items(nest: Nest, items: tuple) -> tuple:
    """`items` wrapped in `nest`'s loops; without loops the items themselves (body splice)."""
    return (Nest(nest.loops, items),) if nest.loops else items


def vars_in(node) -> list[str]:
    """Loop variables used in an expression (subscripts included), first occurrence order."""
    from leir.ast import walk_expr

    return list(dict.fromkeys(n.name for n in walk_expr(node) if isinstance(n, Var)))


def with_stmts(nest: Nest, body: tuple) -> Nest:
    return Nest(nest.loops, body)


def literal(value) -> object:
    """A LEIR literal for an int/float value (negative values and -inf as `Neg`)."""
    from leir.ast import Neg, Num

    if value < 0:
        return Neg(Num(-value))
    return Num(value)
