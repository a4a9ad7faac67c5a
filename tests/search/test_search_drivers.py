"""The search core with fake verify/measure callables (no TVM): determinism for a seed, budgets,
de-duplication, each driver, and the policies' ordering and rejection of bad proposals."""
from __future__ import annotations

import hashlib
import itertools

import pytest

from leir.ast import Program, accesses
from leir.parse import parse_program
from leir.printer import format_program
from leir.signature import Signature
from search.drivers import DRIVERS, Action, Budget, DriverConfig, Node, Policy, run
from search.policies import (
    LibraryPolicy,
    LlmConfig,
    LlmPolicy,
    RandomPolicy,
    library_actions,
    make_policy,
    parse_answers,
)
from strategies.base import Context

SIG = Signature.from_json({"tensors": [
    {"name": "A", "shape": [16, 32], "dtype": "float32", "role": "input"},
    {"name": "C", "shape": [32, 16], "dtype": "float32", "role": "input"},
    {"name": "D", "shape": [16, 16], "dtype": "float32", "role": "output"}]})
MATMUL = parse_program("L^{16}_{b=0}L^{16}_{a=0}L^{32}_{c=0}"
                       "[D^{f32,g}_{b,a}=D^{f32,g}_{b,a}+A^{f32,g}_{b,c}*C^{f32,g}_{c,a};];")


def fake_time(program: Program) -> float:
    """A deterministic 'runtime': parallel and vector loops help, everything else is noise-free
    pseudo-random around 1000 µs."""
    text = format_program(program)
    jitter = int(hashlib.sha256(text.encode()).hexdigest()[:4], 16) / 65535
    return 1000.0 / (1 + text.count("P^") * 1.5 + text.count("V^") * 0.8) * (0.9 + 0.2 * jitter)


class Fakes:
    def __init__(self, failing: str = ""):
        self.verified: list[str] = []
        self.roots: set[str] = set()
        self.failing = failing

    def verify(self, root: Program, state: Program) -> str:
        self.roots.add(format_program(root))
        text = format_program(state)
        self.verified.append(text)
        return "mismatch" if self.failing and self.failing in text else "exact"

    def measure(self, root: Program, state: Program):
        return fake_time(root), fake_time(state), 0.01


def search(driver: str, policy=None, budget=None, seed=0, fakes=None, failing: str = "", **cfg):
    fakes = fakes or Fakes(failing)
    result = run(MATMUL, SIG, driver, policy or LibraryPolicy(per_strategy=4, per_site=2), fakes.verify,
                 fakes.measure, budget=budget or Budget(states=12), seed=seed, config=DriverConfig(**cfg))
    return result, fakes


def summary(result) -> list:
    return [(n["strategy"], n["status"], n["speedup"]) for n in result.to_json()["states"]]


@pytest.mark.parametrize("driver", DRIVERS)
def test_driver_improves_and_respects_budget(driver):
    result, fakes = search(driver, budget=Budget(states=10), depth=3, branching=3, width=2, iterations=20)
    assert result.states_verified <= 10
    assert len(fakes.verified) == result.states_verified
    assert fakes.roots == {format_program(MATMUL)}  # always verified against the root
    assert result.best.speedup > 1.0
    out = result.to_json()
    assert out["best_speedup"] == result.best.speedup and out["best_leir"] == result.best.text
    # the trajectory is a path: each step's parent is the previous one
    path = result.best.path()
    assert [n.depth for n in path] == list(range(len(path)))
    assert len(out["trajectory"]) == len(path) - 1 >= 1
    assert all(step["status"] == "exact" for step in out["trajectory"])


@pytest.mark.parametrize("driver", DRIVERS)
def test_deterministic_for_a_seed(driver):
    a, _ = search(driver, policy=RandomPolicy(seed=3, per_strategy=4, per_site=2), seed=3)
    b, _ = search(driver, policy=RandomPolicy(seed=3, per_strategy=4, per_site=2), seed=3)
    assert summary(a) == summary(b) and a.best.text == b.best.text


class SideBySide(Fakes):
    """Fakes with `verify_many`, recording its batches; states with `failing` in them fail."""

    def __init__(self, failing: str = ""):
        super().__init__(failing)
        self.batches: list[list[str]] = []

    def verify_many(self, root: Program, states: list[Program]) -> list[str]:
        self.batches.append([format_program(s) for s in states])
        return [self.verify(root, s) for s in states]


def ranked_library():
    from search.cost_model import CostModel, RankedPolicy

    return RankedPolicy(LibraryPolicy(per_strategy=4, per_site=2), CostModel(seed=0, min_samples=4))


@pytest.mark.parametrize("driver", DRIVERS)
@pytest.mark.parametrize("ranked", [False, True])
def test_states_verified_ahead_leave_the_search_as_it_was(driver, ranked):
    """With `verify_many`, each state is verified with the one most likely asked for next (the ranked
    policy's next pick, a macro's next step); a kept verdict is used at that state's turn, so the
    search reaches the same states, verdicts and speedups in the same order, and no reached state is
    verified twice."""
    policy = ranked_library if ranked else (lambda: LibraryPolicy(per_strategy=4, per_site=2))
    plain, before = search(driver, policy=policy(), budget=Budget(states=24), failing="L^{4}")
    fakes = SideBySide(failing="L^{4}")
    result = run(MATMUL, SIG, driver, policy(), fakes.verify, fakes.measure, budget=Budget(states=24),
                 config=DriverConfig(), verify_many=fakes.verify_many)
    assert summary(result) == summary(plain)
    assert [n.text for n in result.nodes] == [n.text for n in plain.nodes]
    assert result.verified_ahead == len(fakes.batches) and all(len(b) == 2 for b in fakes.batches)
    reached = [n.text for n in result.nodes[1:]]
    assert sorted(set(before.verified)) == sorted(reached)
    ahead = [b[1] for b in fakes.batches]
    assert result.used_ahead == sum(t in reached for t in ahead) and (result.used_ahead > 0 or not ranked)
    assert all(fakes.verified.count(t) == 1 for t in reached)       # a kept verdict is not asked for again
    assert not set(ahead) & {b[0] for b in fakes.batches}           # never ahead of a state verified already


def test_random_policy_depends_on_seed_only():
    ctx = Context(MATMUL, SIG)
    node = Node(0, MATMUL, format_program(MATMUL), "root")
    orders = [[(a.strategy, str(a.params)) for a in RandomPolicy(seed=s).actions(ctx, node, 0)] for s in (1, 1, 2)]
    assert orders[0] == orders[1] != orders[2]
    assert sorted(orders[0]) == sorted(orders[2])


def test_states_are_deduplicated_by_alpha_hash():
    result, fakes = search("bfs", budget=Budget(states=40), depth=2, branching=6)
    alphas = [n.alpha for n in result.nodes]
    assert len(alphas) == len(set(alphas))
    assert len(fakes.verified) == len(set(fakes.verified))
    assert result.duplicates > 0  # e.g. the same two loops parallelised in either order, or swaps undone


def test_wall_time_budget():
    ticks = itertools.count()
    fakes = Fakes()
    result = run(MATMUL, SIG, "bfs", LibraryPolicy(), fakes.verify, fakes.measure,
                 budget=Budget(states=1000, wall_s=5), config=DriverConfig(depth=3, branching=8),
                 clock=lambda: float(next(ticks)))
    assert result.stopped == "wall_time"
    assert result.states_verified <= 5


def test_failed_states_are_not_expanded_nor_best():
    fakes = Fakes(failing="P^")
    result, _ = search("bfs", fakes=fakes, budget=Budget(states=20), depth=2, branching=4)
    failed = [n for n in result.nodes if n.status == "mismatch"]
    assert failed and all(not n.children and n.speedup is None for n in failed)
    assert "P^" not in result.best.text


def test_greedy_follows_the_best_child():
    result, _ = search("greedy", budget=Budget(states=30), depth=3, branching=4)
    path = result.best.path()
    for parent, child in zip(path, path[1:], strict=False):
        siblings = [c for c in parent.children if c.accepted]
        assert child.speedup == max(c.speedup for c in siblings)
        assert child.speedup > parent.speedup


def test_beam_expands_accepted_states_branching_proposals_at_a_time():
    result, _ = search("beam", policy=LibraryPolicy(per_strategy=4, per_site=2, macros=False),
                       budget=Budget(states=40), depth=3, branching=3, width=2)
    origins = [n.origin for n in result.nodes[1:]]
    runs = [len(list(g)) for _, g in itertools.groupby(o.id for o in origins)]
    assert origins[0] is result.root and max(runs) <= 3
    assert all(o.accepted and o.depth < 3 for o in origins)
    assert len({o.id for o in origins}) > 2   # the beam moved on from the root


class Scripted(Policy):
    """Proposals from a table {state text: [(strategy, text), ...]}, in that order."""

    name = "scripted"

    def __init__(self, table):
        self.table = table

    def actions(self, ctx, node, want):
        for strategy, text in self.table.get(node.text, []):
            yield Action(strategy, {}, parse_program(text))


def variant(n: int, kind: str = "L") -> str:
    """A distinct program per n (the matmul with loop extents split as n*... no: a renamed copy would
    be a duplicate, so each variant reorders and marks loops differently)."""
    loops = [("b", 16), ("a", 16), ("c", 32)]
    order = [loops[i] for i in ((0, 1, 2), (1, 0, 2), (0, 2, 1), (2, 0, 1), (1, 2, 0), (2, 1, 0))[n % 6]]
    kinds = [kind if k == n // 6 else "L" for k in range(3)]
    head = "".join(f"{k}^{{{e}}}_{{{v}=0}}" for k, (v, e) in zip(kinds, order, strict=True))
    return head + "[D^{f32,g}_{b,a}=D^{f32,g}_{b,a}+A^{f32,g}_{b,c}*C^{f32,g}_{c,a};];"


def test_beam_keeps_a_diverse_frontier():
    """Four tilings of the root measure fastest, a parallelisation a little slower: the beam's
    second round expands the best tiling and the parallelisation, not two tilings."""
    root = format_program(MATMUL)
    tilings = [variant(k) for k in (1, 2, 3, 4)]
    par = variant(6, "P")   # P on the first loop of order 0
    table = {root: [("loop_tiling", t) for t in tilings] + [("loop_parallelization", par)]}
    for k, t in enumerate([*tilings, par]):
        table[format_program(parse_program(t))] = [("loop_unrolling", variant(7 + 2 * k + j, "U")) for j in range(2)]
    times = {format_program(parse_program(t)): 100.0 + k for k, t in enumerate(tilings)}
    times[format_program(parse_program(par))] = 110.0

    def measure(r, state):
        return 1000.0, times.get(format_program(state), 200.0)

    result = run(MATMUL, SIG, "beam", Scripted(table), lambda r, s: "exact", measure,
                 budget=Budget(states=9), config=DriverConfig(depth=3, branching=5, width=2))
    second = [n.parent.action.strategy for n in result.nodes[6:]]
    assert second == ["loop_tiling", "loop_tiling", "loop_parallelization", "loop_parallelization"]


def test_greedy_widens_and_restarts_instead_of_stopping():
    """The root's first four proposals are all slower; the fifth is faster. Greedy of old stopped
    after four; now it widens the root and climbs on."""
    root = format_program(MATMUL)
    texts = [variant(k) for k in range(1, 6)]
    table = {root: [("loop_reorder", t) for t in texts]}
    table[format_program(parse_program(texts[4]))] = [("loop_parallelization", variant(6, "P"))]
    fast = {format_program(parse_program(texts[4])): 500.0, format_program(parse_program(variant(6, "P"))): 250.0}

    def measure(r, state):
        return 1000.0, fast.get(format_program(state), 2000.0)

    result = run(MATMUL, SIG, "greedy", Scripted(table), lambda r, s: "exact", measure,
                 budget=Budget(states=20), config=DriverConfig(depth=4, branching=4))
    assert result.best.speedup == 4.0 and len(result.trajectory) == 2
    assert result.stopped == "done"   # nothing left to propose anywhere, before the budget


def test_mcts_visits_add_up():
    result, _ = search("mcts", budget=Budget(states=15), depth=3, branching=3, iterations=15)
    root = result.root
    assert root.visits >= sum(n.proposals for n in result.nodes) >= 1
    assert sum(c.visits for c in root.successors) <= root.visits


def test_library_order_comes_from_the_analysis_and_is_diverse():
    actions = library_actions(Context(MATMUL, SIG))
    assert all(a.transformation is not None for a in actions)
    first = actions[:4]
    # the reduction leaves the innermost position (or a micro-kernel does it) before partial sums
    assert first[0].strategy == "loop_reorder" and first[0].params == {"swap": ["a", "c"]}
    assert "micro_kernel" in [a.move for a in first] and len({a.move for a in first}) >= 2
    partials = next(i for i, a in enumerate(actions) if a.params.get("partials"))
    assert partials > 3
    macro = next(a for a in actions if a.steps)
    assert macro.after == macro.steps[-1].after and all(s.transformation is not None for s in macro.steps)


class ListPolicy(Policy):
    name = "list"

    def __init__(self, texts):
        self.texts = texts

    def actions(self, ctx, node, want):
        for t in self.texts:
            yield Action("loop_parallelization", {}, parse_program(t))


def test_same_state_under_other_names_is_a_duplicate():
    renamed = ("P^{16}_{e=0}L^{16}_{f=0}L^{32}_{g=0}"
               "[D^{f32,g}_{e,f}=D^{f32,g}_{e,f}+A^{f32,g}_{e,g}*C^{f32,g}_{g,f};];")
    original = format_program(MATMUL).replace("L^{16}_{b=0}", "P^{16}_{b=0}", 1)
    fakes = Fakes()
    result = run(MATMUL, SIG, "bfs", ListPolicy([original, renamed, format_program(MATMUL)]), fakes.verify,
                 fakes.measure, config=DriverConfig(depth=1, branching=5))
    assert result.states_verified == 1 and result.duplicates == 2


def test_unknown_driver_and_policy():
    with pytest.raises(ValueError, match="driver"):
        search("annealing")
    with pytest.raises(ValueError, match="policy"):
        make_policy("oracle")


# --- llm answers (the HTTP round trip is tested in tests/search/test_search_runner.py) -----------------

def test_llm_answers_are_parsed_and_checked():
    policy = LlmPolicy(LlmConfig("http://127.0.0.1:9", "m"))
    ctx = Context(MATMUL, SIG)
    good = format_program(MATMUL).replace("L^{16}_{b=0}", "P^{16}_{b=0}", 1)
    action, reason = policy.to_action(ctx, good, "loop_parallelization")
    assert action is not None and reason == "" and action.source == "llm"
    assert policy.to_action(ctx, good, "make_it_fast")[0] is None
    assert "not LEIR" in policy.to_action(ctx, "for i in range(10): pass", "loop_split")[1]
    assert "invalid LEIR" in policy.to_action(ctx, good.replace("D^", "Z^"), "loop_split")[1]
    text = ('<think>x</think><answer>[{"idx": 1, "transformed_IR": "a", "applied_strategy": "b"}]</answer>')
    assert parse_answers(text) == [("a", "b")]
    with pytest.raises(ValueError):
        parse_answers("<think>x</think><answer>__import__('os')</answer>")


def test_llm_unreachable_endpoint_yields_nothing():
    policy = LlmPolicy(LlmConfig("http://127.0.0.1:9", "m", timeout_s=2))
    node = Node(0, MATMUL, format_program(MATMUL), "root")
    assert list(policy.actions(Context(MATMUL, SIG), node, 3)) == []
    assert policy.errors


# --- the defaults on the published matmul (issue 27) ---------------------------------------------------

MM128 = parse_program("B^{128}_{tx=0}L^{128}_{a=0}L^{128}_{c=0}"
                      "[D^{f32,g}_{tx,a}=D^{f32,g}_{tx,a}+A^{f32,g}_{tx,c}*C^{f32,g}_{c,a};];")
SIG128 = Signature.from_json({"tensors": [{"name": n, "shape": [128, 128], "dtype": "float32", "role": r}
                                          for n, r in (("A", "input"), ("C", "input"), ("D", "output"))]})


def parallel_and_unit_stride_vector(program: Program) -> bool:
    """A statement under a parallel outer loop whose innermost loop is a vector loop that every access
    walks with stride 0 or 1, the output with stride 1."""
    from leir.analysis import access_strides, statement_sites, tensor_boxes

    shapes = tensor_boxes(program)
    for site in statement_sites(program):
        outer = [lp for lp in site.loops if lp.extent > 1]
        if not outer or outer[0].kind != "P" or site.loops[-1].kind != "V":
            continue
        v = site.loops[-1].var
        strides = [access_strides(shapes[a.tensor], a) for a in (site.stmt.lhs, *accesses(site.stmt.rhs))]
        if all(st is not None and abs(st.get(v, 0)) <= 1 for st in strides) and strides[0].get(v) == 1:
            return True
    return False


@pytest.mark.parametrize("driver", ["beam", "greedy", "mcts"])
def test_default_search_on_the_matmul_reaches_parallel_and_unit_stride_vector_code(driver):
    """The command's defaults (library policy ranked by the cost model and the analysis, depth 64,
    branching 4, width 2), budget 40, seed 1: with timings that say nothing (every state as fast as
    the root), the order of the proposals alone brings the search to such a state."""
    fakes = Fakes()
    result = run(MM128, SIG128, driver, make_policy("library", 1, ranked=True), fakes.verify,
                 lambda r, s: (1000.0, 1000.0, 0.01), budget=Budget(states=40), seed=1, config=DriverConfig())
    reached = [n for n in result.nodes if n.status == "exact" and parallel_and_unit_stride_vector(n.program)]
    assert reached and reached[0].id < 12
    assert not parallel_and_unit_stride_vector(MM128)
