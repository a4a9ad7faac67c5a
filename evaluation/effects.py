"""Does an answer show the structural effect of the strategy it names?

A model may carry out a strategy in another spelling than our library (an online softmax with prefix
arrays instead of scalar accumulators, the other loop of a pair moved first, a different tile
size). The label check accepts such an answer when it verifies (checked by the caller) and the
original -> answer change has the strategy's effect, stated here per strategy as a predicate over
the two programs' structure:

- loops: `loop_reorder` the same loops of a nest in another order; `loop_split` one loop split into
  an outer and an inner loop whose extents multiply to it; `loop_tiling` two loops split, both tile
  loops outside both point loops; `loop_fusion`/`operator_fusion` fewer top-level nests holding the
  same statements; `operator_fission` more nests, same statements; `loop_unrolling`,
  `loop_parallelization`, `loop_vectorization`, `loop_binding` more loops of kind U, P, V, B over
  the same extents; `reduction_factorization` a new intermediate and one more nest;
- graph: `compute_inline` an intermediate no longer written and fewer statements;
  `dead_code_elimination` fewer statements and no new tensor; `expression_splitting` more
  statements in as many nests; `common_subexpression_elimination` a new intermediate;
- memory: `set_storage_scope` an intermediate in another scope; `layout_transformation` an
  intermediate stored with its dimensions permuted; `set_storage_layout` an intermediate stored
  flat; `cache_read_write` a new local or shared tensor; `precompute_indices` a new integer tensor
  read inside a subscript;
- softmax family: `online_softmax` a running max and a sum of exponentials rescaled by exp of a
  difference with that max, computed in one nest (in the original, separate passes);
  `flashattention_wo_tiling` that, plus an output accumulator rescaled in the same nest;
  `normal_loop_max_to_prefix_max` / `normal_loop_summation_on_exp_to_prefix_summation_on_exp` a
  max / sum-of-exp written as a scan that reads its own previous element; `exponential_split` more
  exponentials; `expand_log` more logarithms, `logsimp` fewer.

- symbolic rewrites (one statement's expression): the predicate finds the statements whose
  right-hand side changed (the programs otherwise alike: the same statements, loops and left-hand
  sides), translates the changed part of both (`strategies.analysis.algebra.algebra_target`: the
  whole right-hand side, or `e` of an accumulation `X op e`) with the strategies' bridge
  (`strategies.analysis.sympy_bridge`, one symbol per distinct access) and states the effect as a
  property of the two sympy forms (`expression_effect`). Translation keeps products of sums as they
  are written (`distribute(False)`: sympy would otherwise turn `2*(A+C)` into `2*A+2*C`); sympy's
  automatic canonicalisation (order of operands, `A*A` = `A**2`, `x**a*x**b` = `x**(a+b)`) is what
  makes an answer in another spelling comparable. Expressions over `MAX_OPS` operations or
  `MAX_SYMBOLS` symbols are not looked at (no effect shown), as the strategies themselves leave them.
  `factorization`: a sum of the original became a product: the answer holds a product with a sum
  among its factors (or an integer power of a sum) that multiplies out to a sum of the original (or
  to the numerator of one, over a common denominator); `expand_factorization`: fewer products with a
  sum among their factors; `collect`: for some access x and power k, a new product x**k*(sum) and
  fewer terms of sums that carry the factor x**k; `expand_collect`: the reverse; `cancellation`: the
  answer is one fraction p/q in lowest terms, where the original as one fraction had a larger total
  degree (a common factor of p and q removed) or was a sum of fractions (sympy.cancel, the library's
  step, combines those too); exponentials, logarithms and roots are opaque atoms and must be the same
  on both sides; `expand_cancellation`: more terms of a sum over one denominator that the original
  divides by (at least two: a numerator split term by term); `apart`: for some access x in a
  denominator, the answer is a polynomial part in x plus proper fractions in x, each over a power of
  a single factor in x, and the original was not; `together`: fewer sums that add fractions, and the
  answer still divides; `powsimp`: fewer products of several exponentials or of powers with one
  exponent; `expand_powsimp`: more (`x**(a+b)` -> `x**a*x**b` is invisible here: sympy combines equal
  bases itself, so that spelling is left to the exact match);
- splits of a sum reduction: `additive_split` a tensor written by one sum accumulation `S=S+(g+t)` is
  written by two or more sum accumulations, each of fewer terms; `multiplicative_split` a sum
  accumulation of a product `S=S+f*g` became a new sum `T=T+...` and a store of `S` from `T` in fewer
  loops; `partially_equivalent_then_correct` the sum `S=S+exp(y-R)` no longer reads R, and a later
  statement multiplies S by an exponential that reads R (the correction);
- `expression_reorder`: the same program up to the order of the operands of + and * (a chain of
  them, `-` read as adding a negation) and the order of nests and body items, and not equal;
- stacked tensors: `tensor_concat_to_fuse_operators` two or more intermediates of one shape are gone
  and a new intermediate has that shape with one more axis (the parts stacked, on any axis);
  `tensor_split_to_decouple_operators` the reverse: new intermediates of a shape that a stacked
  intermediate has with one more axis, which is gone or accessed less.

Every registered strategy has a predicate, in one registry (`EFFECTS`, filled by `effect` and
`expression_effect`). Each is a necessary structural sign of the strategy, not a proof of
equivalence: the caller only asks once the answer verifies. sympy's own steps sometimes do something
else as a side effect, and such a library step shows no effect here (it still passes by the exact
match): `cancellation` that only multiplies out a polynomial (cancel expands p and q; nothing is a
fraction), `factorization` that only brings a sum over a common denominator (factor does that
first), `apart` in an access that only gathers the terms free of it. Answers that rename loop
indices or move statements as well as rewriting an expression are not compared (the programs must
be alike but for the rewritten expressions).
"""
from __future__ import annotations

import math
from collections import Counter
from collections.abc import Callable
from itertools import combinations

import sympy
from sympy.core.parameters import distribute

from leir.analysis import StmtSite, reduction_op, statement_sites, tensor_table
from leir.ast import Access, BinOp, Call, Loop, Neg, Nest, Program, Select, Stmt, Var, accesses, walk_expr
from leir.signature import Signature
from strategies.analysis.algebra import MAX_OPS, MAX_SYMBOLS, algebra_target, atomize
from strategies.analysis.sympy_bridge import Bridge, Untranslatable, count_ops

Effect = Callable[[Program, Program, Signature], bool]
EFFECTS: dict[str, Effect] = {}
_SYMPY_ERRORS = (sympy.PolynomialError, sympy.SympifyError, NotImplementedError, ValueError, TypeError,
                 AttributeError, RecursionError, ZeroDivisionError)


def effect(*names: str):
    """Register a predicate over (original, answer, signature) for the strategies `names`."""
    def register(fn: Effect) -> Effect:
        for name in names:
            EFFECTS[name] = fn
        return fn
    return register


def expression_effect(*names: str):
    """Register a predicate over (original expression, answer expression) in sympy: the strategies'
    effect holds when one rewritten statement shows it (`rewritten_expressions`)."""
    def register(fn: Callable[[sympy.Expr, sympy.Expr], bool]):
        def check(a: Program, b: Program, sig: Signature) -> bool:
            for e0, e1 in rewritten_expressions(a, b):
                try:
                    if e0 != e1 and fn(e0, e1):
                        return True
                except _SYMPY_ERRORS:
                    continue
            return False
        effect(*names)(check)
        return fn
    return register


def shows_effect(strategy: str, original: Program, answer: Program, signature: Signature) -> bool | None:
    """True/False when `strategy` has a structural effect to look for, None when it has none."""
    check = EFFECTS.get(strategy)
    return None if check is None else bool(check(original, answer, signature))


# --- what the programs are made of ----------------------------------------------------------------

def _extents(nest: Nest) -> list[int]:
    return [lp.extent for lp in nest.loops]


def _statements(program: Program) -> list[Stmt]:
    return [site.stmt for site in statement_sites(program)]


def _intermediates(program: Program, signature: Signature) -> dict:
    return {name: info for name, info in tensor_table(program, signature).items() if info.role == "intermediate"}


def _shaped_intermediates(program: Program, signature: Signature) -> dict:
    """The intermediates whose shape is known and not 0-d (the stacked-tensor predicates compare shapes)."""
    return {name: info for name, info in _intermediates(program, signature).items() if info.shape}


def _changed_nests(a: Program, b: Program) -> list[tuple[Nest, Nest]]:
    """Pairs of top-level nests at the same position that differ (programs with as many nests)."""
    if len(a.nests) != len(b.nests):
        return []
    return [(x, y) for x, y in zip(a.nests, b.nests, strict=True) if x != y]


def _merge(extents: list[int], pairs: tuple[tuple[int, int], ...]) -> list[int] | None:
    """`extents` with each (outer, inner) position pair replaced by its product at the outer place."""
    inner = {i for _, i in pairs}
    out = []
    for k, e in enumerate(extents):
        if k in inner:
            continue
        partner = next((i for o, i in pairs if o == k), None)
        out.append(e * extents[partner] if partner is not None else e)
    return out


def _split_from(original: list[int], answer: list[int], n_pairs: int, adjacent: bool) -> bool:
    """`answer` is `original` with `n_pairs` loops each split into an outer and an inner loop
    (adjacent for a split; for tiling the tile loops come before all point loops)."""
    if len(answer) != len(original) + n_pairs:
        return False
    positions = range(len(answer))
    for pairs in combinations(combinations(positions, 2), n_pairs):
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


# --- loops ------------------------------------------------------------------------------------------

@effect("loop_reorder")
def _loop_reorder(a: Program, b: Program, sig: Signature) -> bool:
    """The same loops (each known by its extent and where its index is used) in another order."""
    return any(len(x.loops) == len(y.loops) and sorted(_roles(x)) == sorted(_roles(y)) and _roles(x) != _roles(y)
               for x, y in _changed_nests(a, b))


def _roles(nest: Nest) -> list[tuple]:
    """Per loop of the nest, outermost first: its extent and the (tensor, subscript position) pairs
    where its index appears, which name the loop whatever the answer calls its index."""
    uses: dict[str, set] = {lp.var: set() for lp in nest.loops}
    for stmt in _statements(Program((nest,))):
        for acc in [stmt.lhs, *accesses(stmt.rhs)]:
            for k, ix in enumerate(acc.indices):
                for n in walk_expr(ix):
                    if isinstance(n, Var) and n.name in uses:
                        uses[n.name].add((acc.tensor, k))
    return [(lp.extent, tuple(sorted(uses[lp.var]))) for lp in nest.loops]


@effect("loop_split")
def _loop_split(a: Program, b: Program, sig: Signature) -> bool:
    return any(_split_from(_extents(x), _extents(y), 1, adjacent=True) for x, y in _changed_nests(a, b))


@effect("loop_tiling")
def _tiling(a: Program, b: Program, sig: Signature) -> bool:
    return any(_split_from(_extents(x), _extents(y), 2, adjacent=False) for x, y in _changed_nests(a, b))


@effect("loop_fusion", "operator_fusion")
def _fusion(a: Program, b: Program, sig: Signature) -> bool:
    return len(b.nests) < len(a.nests) and len(_statements(b)) >= len(_statements(a)) - (len(a.nests) - len(b.nests))


@effect("operator_fission")
def _fission(a: Program, b: Program, sig: Signature) -> bool:
    return len(b.nests) > len(a.nests) and len(_statements(b)) >= len(_statements(a))


def _more_of_kind(kind: str) -> Effect:
    def check(a: Program, b: Program, sig: Signature) -> bool:
        count = lambda p: sum(lp.kind == kind for n in p.nests for lp in _all_loops(n))  # noqa: E731
        extents = lambda p: sorted(lp.extent for n in p.nests for lp in _all_loops(n))  # noqa: E731
        return count(b) > count(a) and extents(b) == extents(a)
    return check


def _all_loops(nest: Nest) -> list[Loop]:
    return list(nest.loops) + [lp for item in nest.body if isinstance(item, Nest) for lp in _all_loops(item)]


for _name, _kind in (("loop_unrolling", "U"), ("loop_parallelization", "P"), ("loop_vectorization", "V"),
                     ("loop_binding", "B")):
    effect(_name)(_more_of_kind(_kind))


@effect("reduction_factorization")
def _rfactor(a: Program, b: Program, sig: Signature) -> bool:
    return len(b.nests) == len(a.nests) + 1 and len(_intermediates(b, sig)) > len(_intermediates(a, sig))


# --- graph ------------------------------------------------------------------------------------------

@effect("compute_inline")
def _inline(a: Program, b: Program, sig: Signature) -> bool:
    return bool(set(_intermediates(a, sig)) - set(_intermediates(b, sig))) and len(_statements(b)) < len(_statements(a))


@effect("dead_code_elimination")
def _dead_code(a: Program, b: Program, sig: Signature) -> bool:
    return len(_statements(b)) < len(_statements(a)) and set(_intermediates(b, sig)) <= set(_intermediates(a, sig))


@effect("expression_splitting")
def _expression_splitting(a: Program, b: Program, sig: Signature) -> bool:
    return len(b.nests) == len(a.nests) and len(_statements(b)) > len(_statements(a))


@effect("common_subexpression_elimination")
def _cse(a: Program, b: Program, sig: Signature) -> bool:
    return bool(set(_intermediates(b, sig)) - set(_intermediates(a, sig)))


# --- memory -----------------------------------------------------------------------------------------

@effect("set_storage_scope")
def _scope(a: Program, b: Program, sig: Signature) -> bool:
    before, after = _intermediates(a, sig), _intermediates(b, sig)
    return any(name in before and before[name].scope != info.scope for name, info in after.items())


@effect("layout_transformation")
def _layout(a: Program, b: Program, sig: Signature) -> bool:
    before, after = _intermediates(a, sig), _intermediates(b, sig)
    return any(name in before and before[name].shape and info.shape and before[name].shape != info.shape
               and sorted(before[name].shape) == sorted(info.shape) for name, info in after.items())


@effect("set_storage_layout")
def _flat(a: Program, b: Program, sig: Signature) -> bool:
    before, after = _intermediates(a, sig), _intermediates(b, sig)
    return any(name in before and before[name].shape and len(before[name].shape) > 1 and info.shape
               and len(info.shape) == 1 and math.prod(info.shape) == math.prod(before[name].shape)
               for name, info in after.items())


@effect("cache_read_write")
def _cache(a: Program, b: Program, sig: Signature) -> bool:
    new = set(_intermediates(b, sig)) - set(_intermediates(a, sig))
    return any(_intermediates(b, sig)[name].scope in ("l", "s") for name in new)


@effect("precompute_indices")
def _indices(a: Program, b: Program, sig: Signature) -> bool:
    table = _intermediates(b, sig)
    new = set(table) - set(_intermediates(a, sig))
    in_subscripts = {acc.tensor for stmt in _statements(b) for top in accesses(stmt.rhs) for ix in top.indices
                     for acc in accesses(ix)}
    return any(table[name].dtype.startswith(("i", "u")) and name in in_subscripts for name in new)


# --- the softmax family and the symbolic splits -----------------------------------------------------

def _calls(program: Program, fn: str) -> int:
    return sum(isinstance(n, Call) and n.fn == fn for stmt in _statements(program) for n in walk_expr(stmt.rhs))


def _computes_max(stmt: Stmt) -> bool:
    return any(isinstance(n, Call) and n.fn == "max" for n in walk_expr(stmt.rhs))


def _reads_itself(stmt: Stmt) -> bool:
    return any(acc.tensor == stmt.lhs.tensor for acc in accesses(stmt.rhs))


def _rescaled_by(stmt: Stmt, maxima: set[str]) -> bool:
    """The statement multiplies by exp(...) of a difference that reads one of `maxima`."""
    return any(isinstance(n, Call) and n.fn == "exp" and isinstance(n.args[0], BinOp) and n.args[0].op == "-"
               and any(acc.tensor in maxima for acc in accesses(n.args[0])) for n in walk_expr(stmt.rhs))


def _one_pass_nests(program: Program) -> list[tuple[set[str], list[Stmt]]]:
    """Per top-level nest: the running maxima it writes, and its statements rescaled by them."""
    out = []
    for nest in program.nests:
        stmts = _statements(Program((nest,)))
        read = {acc.tensor for s in stmts for acc in accesses(s.rhs)}
        # a running max: written by a max and read again in the nest (directly, or through a copy
        # of its previous value that feeds the max)
        maxima = {s.lhs.tensor for s in stmts if _computes_max(s) and s.lhs.tensor in read}
        rescaled = [s for s in stmts if maxima and s.lhs.tensor not in maxima and _reads_itself(s)
                    and _rescaled_by(s, maxima)]
        out.append((maxima, rescaled))
    return out


@effect("online_softmax")
def _online_softmax(a: Program, b: Program, sig: Signature) -> bool:
    def fused(p: Program) -> int:
        return sum(bool(rescaled) for _, rescaled in _one_pass_nests(p))
    return fused(b) > fused(a)


@effect("flashattention_wo_tiling")
def _flash(a: Program, b: Program, sig: Signature) -> bool:
    def outputs(p: Program) -> int:  # the sum and the output accumulator, both rescaled in one pass
        return sum(len({s.lhs.tensor for s in rescaled}) >= 2 for _, rescaled in _one_pass_nests(p))
    return outputs(b) > outputs(a)


def _scans(program: Program, fn: str) -> int:
    """Statements that compute a `fn` (max, exp) and read their own tensor's previous element behind
    a boundary (`if_then_else(a-1<0, boundary, X_{a-1})`)."""
    count = 0
    for stmt in _statements(program):
        nodes = list(walk_expr(stmt.rhs))
        if any(isinstance(n, Call) and n.fn == fn for n in nodes) and any(
                isinstance(n, Select) and any(isinstance(x, Access) and x.tensor == stmt.lhs.tensor
                                              for x in walk_expr(n.otherwise)) for n in nodes):
            count += 1
    return count


@effect("normal_loop_max_to_prefix_max")
def _prefix_max(a: Program, b: Program, sig: Signature) -> bool:
    return _scans(b, "max") > _scans(a, "max")


@effect("normal_loop_summation_on_exp_to_prefix_summation_on_exp")
def _prefix_sum_exp(a: Program, b: Program, sig: Signature) -> bool:
    return _scans(b, "exp") > _scans(a, "exp")


@effect("exponential_split")
def _exp_split(a: Program, b: Program, sig: Signature) -> bool:
    return _calls(b, "exp") > _calls(a, "exp")


@effect("expand_log")
def _expand_log(a: Program, b: Program, sig: Signature) -> bool:
    return _calls(b, "log") > _calls(a, "log")


@effect("logsimp")
def _logsimp(a: Program, b: Program, sig: Signature) -> bool:
    return 0 < _calls(b, "log") < _calls(a, "log")


# --- the rewritten expressions ----------------------------------------------------------------------

def rewritten_expressions(a: Program, b: Program) -> list[tuple[sympy.Expr, sympy.Expr]]:
    """(original, answer) sympy forms of every statement whose right-hand side changed, when the two
    programs are otherwise alike (same statements in the same places, loops and left-hand sides).
    Accumulations must keep their operator; the accumulated part is compared."""
    sa, sb = statement_sites(a), statement_sites(b)
    if len(sa) != len(sb):
        return []
    changed = []
    for x, y in zip(sa, sb, strict=True):
        if (x.nest_index, x.path, x.loops, x.stmt.lhs) != (y.nest_index, y.path, y.loops, y.stmt.lhs):
            return []
        if x.stmt.rhs != y.stmt.rhs:
            changed.append((x.stmt, y.stmt))
    out = []
    for s, t in changed:
        ts, tt = algebra_target(s), algebra_target(t)
        if ts is None or tt is None or ts.op != tt.op:
            continue
        if count_ops(ts.expr) > MAX_OPS or count_ops(tt.expr) > MAX_OPS:
            continue
        bridge = Bridge()  # one symbol table: the same access is the same symbol on both sides
        try:
            with distribute(False):
                e0, e1 = bridge.to_sympy(ts.expr), bridge.to_sympy(tt.expr)
        except Untranslatable:
            continue
        if len(e0.free_symbols | e1.free_symbols) <= MAX_SYMBOLS:
            out.append((e0, e1))
    return out


def _is_den(f: sympy.Expr) -> bool:
    return bool(f.is_Pow and f.exp.is_Number and f.exp < 0)


def _numerator_factors(node: sympy.Expr) -> list[sympy.Expr]:
    return [f for f in sympy.Mul.make_args(node) if not _is_den(f)]


def _denominator(term: sympy.Expr) -> sympy.Expr:
    return sympy.Mul(*[sympy.Pow(f.base, -f.exp) for f in sympy.Mul.make_args(term) if _is_den(f)])


def _is_sum_power(f: sympy.Expr) -> bool:
    return bool(f.is_Pow and f.base.is_Add and f.exp.is_Integer and f.exp > 1)


def _products_of_sums(e: sympy.Expr) -> list[sympy.Expr]:
    """Products (numerator factors) with a sum among their factors, and integer powers of sums."""
    out = []
    for node in sympy.preorder_traversal(e):
        if node.is_Mul:
            num = _numerator_factors(node)
            if len(num) >= 2 and any(f.is_Add or _is_sum_power(f) for f in num):
                out.append(sympy.Mul(*num, evaluate=False))
        elif _is_sum_power(node):
            out.append(node)
    return out


def _sums(e: sympy.Expr) -> list[sympy.Expr]:
    return [node for node in sympy.preorder_traversal(e) if node.is_Add]


# --- factor / expand ----------------------------------------------------------------------------------

@expression_effect("factorization")
def _factorization(e0: sympy.Expr, e1: sympy.Expr) -> bool:
    targets = set()
    for s in _sums(e0):
        targets.add(sympy.expand(s))
        targets.add(sympy.expand(sympy.fraction(sympy.together(s))[0]))
    before = {sympy.expand(p) for p in _products_of_sums(e0)}
    return any(sympy.expand(p) in targets and sympy.expand(p) not in before for p in _products_of_sums(e1))


@expression_effect("expand_factorization")
def _expand_factorization(e0: sympy.Expr, e1: sympy.Expr) -> bool:
    return len(_products_of_sums(e1)) < len(_products_of_sums(e0))


def _power_of(f: sympy.Expr, symbols) -> tuple | None:
    """(x, k) when the factor is an access or index x, or its positive integer power x**k."""
    if f in symbols:
        return f, 1
    if f.is_Pow and f.base in symbols and f.exp.is_Integer and f.exp > 0:
        return f.base, int(f.exp)
    return None


def _grouping(e: sympy.Expr, symbols) -> tuple[Counter, Counter]:
    """Per (x, k): products x**k*(sum) in `e`, and terms of sums of `e` that carry the factor x**k."""
    grouped, terms = Counter(), Counter()
    for node in sympy.preorder_traversal(e):
        if node.is_Mul:
            num = _numerator_factors(node)
            if any(f.is_Add for f in num):
                for f in num:
                    key = _power_of(f, symbols)
                    if key:
                        grouped[key] += 1
        if node.is_Add:
            for t in node.args:
                for f in sympy.Mul.make_args(t):
                    key = _power_of(f, symbols)
                    if key:
                        terms[key] += 1
    return grouped, terms


@expression_effect("collect")
def _collect(e0: sympy.Expr, e1: sympy.Expr) -> bool:
    symbols = e0.free_symbols
    g0, t0 = _grouping(e0, symbols)
    g1, t1 = _grouping(e1, symbols)
    return any(g1[k] > g0[k] and t1[k] < t0[k] for k in set(g1) | set(t0))


@expression_effect("expand_collect")
def _expand_collect(e0: sympy.Expr, e1: sympy.Expr) -> bool:
    symbols = e0.free_symbols
    g0, t0 = _grouping(e0, symbols)
    g1, t1 = _grouping(e1, symbols)
    return any(g1[k] < g0[k] and t1[k] > t0[k] for k in set(g0) | set(t1))


# --- fractions ------------------------------------------------------------------------------------

def _rational_form(e: sympy.Expr) -> tuple[int, bool, frozenset] | None:
    """For `e` as one fraction p/q, with transcendental calls and roots as atoms: (total degree of p
    plus that of q, whether p and q have no common factor, the atoms); None when `e` is no rational
    function of its atoms."""
    table: dict = {}
    at = atomize(e, table)
    p, q = sympy.fraction(sympy.together(at))
    gens = sorted(at.free_symbols, key=lambda s: s.name)
    if not gens:
        return None
    try:
        degree = sympy.Poly(p, *gens).total_degree() + sympy.Poly(q, *gens).total_degree()
        lowest = sympy.gcd(p, q).is_Number
    except sympy.PolynomialError:
        return None
    return degree, bool(lowest), frozenset(table)


@expression_effect("cancellation")
def _cancellation(e0: sympy.Expr, e1: sympy.Expr) -> bool:
    """The answer is one fraction in lowest terms, and the original had a common factor (a larger
    degree) or was a sum of fractions (sympy.cancel combines those too)."""
    before, after = _rational_form(e0), _rational_form(e1)
    if before is None or after is None or after[2] != before[2] or not after[1] or _sums_of_fractions(e1):
        return False
    return after[0] < before[0] or _sums_of_fractions(e0) > 0


def _terms_over(e: sympy.Expr) -> Counter:
    """Per denominator: the terms of sums in `e` that divide by it."""
    out = Counter()
    for s in _sums(e):
        for t in s.args:
            d = _denominator(t)
            if d != 1:
                out[d] += 1
    return out


@expression_effect("expand_cancellation")
def _expand_cancellation(e0: sympy.Expr, e1: sympy.Expr) -> bool:
    known = {_denominator(node) for node in sympy.preorder_traversal(e0) if node.is_Mul or _is_den(node)} - {1}
    before, after = _terms_over(e0), _terms_over(e1)
    return any(n >= 2 and n > before[d] and d in known for d, n in after.items())


def _apart_form(e: sympy.Expr, x: sympy.Symbol) -> bool:
    """A polynomial in x plus at least one proper fraction in x over a power of one factor in x."""
    fractions = 0
    for t in sympy.Add.make_args(atomize(e, {})):
        p, q = sympy.fraction(t)
        if not q.has(x):
            continue
        factors = [f for f, _ in sympy.factor_list(q)[1] if f.has(x)]
        if len(factors) != 1 or sympy.degree(p, x) >= sympy.degree(q, x):
            return False
        fractions += 1
    return fractions > 0


@expression_effect("apart")
def _apart(e0: sympy.Expr, e1: sympy.Expr) -> bool:
    candidates = {s for d in _denominators(e0) for s in d.free_symbols}
    return any(_apart_form(e1, x) and not _apart_form(e0, x) for x in sorted(candidates, key=lambda s: s.name))


def _denominators(e: sympy.Expr) -> list[sympy.Expr]:
    return [node.base for node in sympy.preorder_traversal(e) if _is_den(node)]


def _sums_of_fractions(e: sympy.Expr) -> int:
    return sum(any(_denominator(t) != 1 for t in s.args) for s in _sums(e))


@expression_effect("together")
def _together(e0: sympy.Expr, e1: sympy.Expr) -> bool:
    return bool(_denominators(e1)) and _sums_of_fractions(e1) < _sums_of_fractions(e0)


# --- powers -----------------------------------------------------------------------------------------

def _combinable(e: sympy.Expr) -> int:
    """Factors of products that powsimp would combine: several exponentials, or several powers with
    one non-integer exponent (sympy itself already combines powers of one base)."""
    n = 0
    for node in sympy.preorder_traversal(e):
        if node.is_Mul:
            n += max(0, sum(isinstance(f, sympy.exp) for f in node.args) - 1)
            same_exp = Counter(f.exp for f in node.args if f.is_Pow and not f.exp.is_Integer)
            n += sum(c - 1 for c in same_exp.values())
    return n


@expression_effect("powsimp")
def _powsimp(e0: sympy.Expr, e1: sympy.Expr) -> bool:
    return _combinable(e1) < _combinable(e0)


@expression_effect("expand_powsimp")
def _expand_powsimp(e0: sympy.Expr, e1: sympy.Expr) -> bool:
    return _combinable(e1) > _combinable(e0)


# --- splits of a sum reduction -------------------------------------------------------------------------

def _writers(program: Program) -> dict[str, list[StmtSite]]:
    out: dict[str, list[StmtSite]] = {}
    for site in statement_sites(program):
        out.setdefault(site.stmt.lhs.tensor, []).append(site)
    return out


def _element(stmt: Stmt) -> sympy.Expr | None:
    """The accumulated part of an accumulation, in sympy (None when it has none)."""
    target = algebra_target(stmt)
    if target is None or target.op is None or count_ops(target.expr) > MAX_OPS:
        return None
    try:
        with distribute(False):
            return Bridge().to_sympy(target.expr)
    except Untranslatable:
        return None


def _sum_accumulation(stmt: Stmt) -> bool:
    return reduction_op(stmt) in ("+", "-")


@effect("additive_split")
def _additive_split(a: Program, b: Program, sig: Signature) -> bool:
    after = _writers(b)
    for name, sites in _writers(a).items():
        parts = after.get(name, [])
        if len(sites) != 1 or len(parts) < 2 or not _sum_accumulation(sites[0].stmt):
            continue
        whole = _element(sites[0].stmt)
        if whole is None or len(sympy.Add.make_args(whole)) < 2:
            continue
        if not all(_sum_accumulation(p.stmt) for p in parts):
            continue
        sizes = [_element(p.stmt) for p in parts]
        if all(e is not None and len(sympy.Add.make_args(e)) < len(sympy.Add.make_args(whole)) for e in sizes):
            return True
    return False


@effect("multiplicative_split")
def _multiplicative_split(a: Program, b: Program, sig: Signature) -> bool:
    before, after = _writers(a), _writers(b)
    for name, sites in before.items():
        if len(sites) != 1 or not _sum_accumulation(sites[0].stmt):
            continue
        whole = _element(sites[0].stmt)
        if whole is None or len([f for f in sympy.Mul.make_args(whole) if not f.is_Number]) < 2:
            continue
        for site in after.get(name, []):
            if reduction_op(site.stmt) is not None or len(site.loops) >= len(sites[0].loops):
                continue
            new = {acc.tensor for acc in accesses(site.stmt.rhs)} - set(before)
            if any(_sum_accumulation(w.stmt) for t in new for w in after.get(t, [])):
                return True
    return False


def _exp_reads(expr) -> set[str]:
    """Tensors read inside the arguments of the exponentials of `expr`."""
    return {acc.tensor for n in walk_expr(expr) if isinstance(n, Call) and n.fn == "exp" for acc in accesses(n)}


@effect("partially_equivalent_then_correct")
def _partial_then_correct(a: Program, b: Program, sig: Signature) -> bool:
    before, after = _writers(a), _writers(b)
    for name, sites in before.items():
        if len(sites) != 1 or not _sum_accumulation(sites[0].stmt):
            continue
        offsets = _exp_reads(sites[0].stmt.rhs) - {name}
        parts = after.get(name, [])
        sums = [p for p in parts if _sum_accumulation(p.stmt) and _exp_reads(p.stmt.rhs)]
        for r in offsets & set(before):
            partial = [p for p in sums if r not in _exp_reads(p.stmt.rhs)]
            if partial and any(p.order > partial[0].order and r in _exp_reads(p.stmt.rhs)
                               and name in {acc.tensor for acc in accesses(p.stmt.rhs)}
                               and not _sum_accumulation(p.stmt) for p in parts):
                return True
    return False


# --- reorder ----------------------------------------------------------------------------------------

def _ac(e) -> tuple:
    """`e` up to the order of the operands of chains of + (with - as adding a negation) and *."""
    if isinstance(e, BinOp) and e.op in ("+", "-"):
        return ("+",) + tuple(sorted((_ac(t) for t in _terms(e)), key=repr))
    if isinstance(e, BinOp) and e.op == "*":
        return ("*",) + tuple(sorted((_ac(f) for f in _factors(e)), key=repr))
    if isinstance(e, BinOp):
        return (e.op, _ac(e.lhs), _ac(e.rhs))
    if isinstance(e, Neg):
        return ("neg", _ac(e.operand))
    if isinstance(e, Call):
        return (e.fn,) + tuple(_ac(x) for x in e.args)
    return ("leaf", e)


def _terms(e) -> list:
    if isinstance(e, BinOp) and e.op == "+":
        return _terms(e.lhs) + _terms(e.rhs)
    if isinstance(e, BinOp) and e.op == "-":
        return _terms(e.lhs) + [Neg(e.rhs)]
    return [e]


def _factors(e) -> list:
    if isinstance(e, BinOp) and e.op == "*":
        return _factors(e.lhs) + _factors(e.rhs)
    return [e]


def _unordered(item) -> tuple:
    if isinstance(item, Stmt):
        return ("stmt", item.lhs, _ac(item.rhs))
    return ("nest", item.loops, tuple(sorted((_unordered(x) for x in item.body), key=repr)))


@effect("expression_reorder")
def _expression_reorder(a: Program, b: Program, sig: Signature) -> bool:
    if a == b:
        return False
    key = lambda p: sorted((_unordered(n) for n in p.nests), key=repr)  # noqa: E731
    return key(a) == key(b)


# --- stacked tensors ----------------------------------------------------------------------------------

def _stacks(stacked: tuple[int, ...], part: tuple[int, ...]) -> bool:
    """`stacked` is `part` with one more axis (of two or more parts) somewhere."""
    return len(stacked) == len(part) + 1 and any(
        stacked[:i] + stacked[i + 1:] == part and stacked[i] >= 2 for i in range(len(stacked)))


@effect("tensor_concat_to_fuse_operators")
def _concat(a: Program, b: Program, sig: Signature) -> bool:
    before, after = _shaped_intermediates(a, sig), _shaped_intermediates(b, sig)
    gone = Counter((tuple(i.shape), i.dtype) for n, i in before.items() if n not in after)
    return any(count >= 2 and _stacks(tuple(info.shape), shape) and info.dtype == dtype
               for name, info in after.items() if name not in before for (shape, dtype), count in gone.items())


def _uses(program: Program, tensor: str) -> int:
    return sum(acc.tensor == tensor for site in statement_sites(program)
               for acc in [site.stmt.lhs, *accesses(site.stmt.rhs)])


@effect("tensor_split_to_decouple_operators")
def _tensor_split(a: Program, b: Program, sig: Signature) -> bool:
    before, after = _shaped_intermediates(a, sig), _shaped_intermediates(b, sig)
    new = [i for n, i in after.items() if n not in before]
    for name, info in before.items():
        if name in after and _uses(b, name) >= _uses(a, name):
            continue
        parts = [i for i in new if _stacks(tuple(info.shape), tuple(i.shape)) and i.dtype == info.dtype]
        if len(parts) >= 2 or (parts and name in after):  # all parts split off, or one of them
            return True
    return False
