"""The search core with fake verify/measure callables (no TVM): determinism for a seed, budgets,
de-duplication, each driver, and the policies' ordering and rejection of bad proposals."""
from __future__ import annotations

import hashlib
import itertools

import pytest

from leir.ast import Program
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


def search(driver: str, policy=None, budget=None, seed=0, fakes=None, **cfg):
    fakes = fakes or Fakes()
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


def test_beam_keeps_width():
    result, _ = search("beam", budget=Budget(states=40), depth=3, branching=3, width=2)
    by_depth = {}
    for n in result.nodes[1:]:
        by_depth.setdefault(n.depth, set()).add(n.parent.id)
    assert all(len(parents) <= 2 for d, parents in by_depth.items() if d > 1)


def test_mcts_visits_add_up():
    result, _ = search("mcts", budget=Budget(states=15), depth=3, branching=3, iterations=15)
    root = result.root
    assert root.visits >= result.states_verified
    assert sum(c.visits for c in root.children) <= root.visits


def test_library_prior_orders_parallel_outer_first():
    actions = library_actions(Context(MATMUL, SIG))
    assert actions[0].strategy == "loop_parallelization" and actions[0].site["loops"] == ["b"]
    assert [a.prior for a in actions] == sorted((a.prior for a in actions), reverse=True)
    assert all(a.transformation is not None for a in actions)


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
