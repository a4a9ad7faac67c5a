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

- symbolic rewrites, splits, reorder and stacked tensors (`evaluation.symbolic_effects`, merged in
  below): `factorization` a sum became a product that multiplies out to it; `expand_factorization`
  fewer products of sums; `collect` / `expand_collect` terms grouped by / distributed from a common
  power of one access; `cancellation` a smaller degree as one fraction; `expand_cancellation` a
  numerator split term by term over its denominator; `apart` a polynomial part plus proper partial
  fractions in one access; `together` fewer sums of fractions; `powsimp` / `expand_powsimp` fewer /
  more exponentials or like powers to combine in a product; `additive_split` one sum accumulation
  became several of fewer terms; `multiplicative_split` a new sum and a store of the result from it
  in fewer loops; `partially_equivalent_then_correct` the sum of exp no longer reads its offset and
  a later statement multiplies it by an exp that does; `expression_reorder` the same program up to
  the order of + and * operands and of nests and body items; `tensor_concat_to_fuse_operators` /
  `tensor_split_to_decouple_operators` intermediates of one shape stacked into one with one more
  axis / split out of it.

Every registered strategy has a predicate. Each is a necessary structural sign of the strategy, not
a proof of equivalence: the caller only asks once the answer verifies.
"""
from __future__ import annotations

from collections.abc import Callable
from itertools import combinations

from evaluation.symbolic_effects import SYMBOLIC
from leir.analysis import statement_sites, tensor_table
from leir.ast import Access, BinOp, Call, Loop, Nest, Program, Select, Stmt, Var, accesses, walk_expr
from leir.signature import Signature

Effect = Callable[[Program, Program, Signature], bool]
EFFECTS: dict[str, Effect] = {}


def effect(*names: str):
    def register(fn: Effect) -> Effect:
        for name in names:
            EFFECTS[name] = fn
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
def _reorder(a: Program, b: Program, sig: Signature) -> bool:
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
def _split(a: Program, b: Program, sig: Signature) -> bool:
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
    EFFECTS[_name] = _more_of_kind(_kind)


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
               and len(info.shape) == 1 and _numel(info.shape) == _numel(before[name].shape)
               for name, info in after.items())


def _numel(shape) -> int:
    n = 1
    for d in shape:
        n *= d
    return n


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


EFFECTS.update(SYMBOLIC)
