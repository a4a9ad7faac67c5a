"""The learned cost model (search.cost_model): features from the LEIR tree, ranking on recorded
measurements, and the ranked policy in front of a policy.

tests/data/search/matmul128_measured_states.jsonl holds the verified, timed states of two real
searches on matmul 128^3 float32 (this 2-core machine, 2026-12-01, speedup = naive time / state time
in one session): `beam_library` (library policy, beam) and `mcts_library_model` (library policy
ranked by the model, MCTS). The model trains on one search and ranks the other's states.
"""
from __future__ import annotations

import json
import random
from pathlib import Path

import numpy as np
import pytest

from leir import Signature, parse_program
from leir.analysis import statement_sites
from search.cost_model import FEATURE_NAMES, CostModel, RankedPolicy, program_features, rank_by_model
from search.drivers import Action, DriverConfig, Node, Policy, run
from strategies.base import Context

pytest.importorskip("xgboost")

DATA = Path(__file__).resolve().parents[1] / "data" / "search" / "matmul128_measured_states.jsonl"
MM = "B^{128}_{tx=0}L^{128}_{a=0}L^{128}_{c=0}[D^{f32,g}_{tx,a}=D^{f32,g}_{tx,a}+A^{f32,g}_{tx,c}*C^{f32,g}_{c,a};];"
SIG = Signature.from_json({"tensors": [{"name": n, "shape": [128, 128], "dtype": "float32", "role": r}
                                       for n, r in (("A", "input"), ("C", "input"), ("D", "output"))]})


def recorded(search: str) -> list[tuple[str, float]]:
    rows = [json.loads(line) for line in DATA.read_text().splitlines() if line.strip()]
    return [(r["leir"], r["speedup"]) for r in rows if r["search"] == search]


def ranks(x) -> np.ndarray:
    """Average ranks (ties share their mean rank: tree ensembles predict many equal values)."""
    x = np.asarray(x, dtype=float)
    order = np.argsort(x, kind="stable")
    r = np.empty(len(x))
    r[order] = np.arange(len(x))
    for v in np.unique(x):
        r[x == v] = r[x == v].mean()
    return r


def spearman(a, b) -> float:
    return float(np.corrcoef(ranks(a), ranks(b))[0, 1])


def trained_on(rows) -> CostModel:
    model = CostModel(seed=0)
    for text, speedup in rows:
        model.add(parse_program(text), speedup)
    return model


def feature(program: str, name: str) -> float:
    return float(program_features(parse_program(program))[FEATURE_NAMES.index(name)])


def test_features_read_loop_kinds_strides_and_exps_from_the_tree():
    assert feature(MM, "loop0_large") == 1.0 and feature(MM, "loop0_unit") == 1.0   # C walks rows, A along c
    assert feature(MM, "vector_width") == 0.0 and feature(MM, "log_parallel_extent") == 0.0
    tuned = ("P^{16}_{g=0}L^{4}_{h=0}L^{128}_{c=0}L^{8}_{tx=0}V^{32}_{a=0}[D^{f32,g}_{g*8+tx,h*32+a}="
             "D^{f32,g}_{g*8+tx,h*32+a}+A^{f32,g}_{g*8+tx,c}*C^{f32,g}_{c,h*32+a};];")
    assert feature(tuned, "vector_width") == 32.0 and feature(tuned, "log_parallel_extent") == 4.0
    assert feature(tuned, "loop0_unit") == 3.0 and feature(tuned, "loop0_zero") == 1.0   # D (r+w), C; A and feature(tuned, "loop0_V") == 1
    soft = "B^{4}_{tx=0}L^{8}_{a=0}[C^{f32,g}_{tx,a}=exp(A^{f32,g}_{tx,a});];"
    assert feature(soft, "exp_calls") == 1.0 and feature(soft.replace("exp(", "fast_exp("), "fast_exp_calls") == 1.0
    assert np.array_equal(program_features(parse_program(MM)), program_features(parse_program(MM)))


def figure(leir: str, name: str) -> float:
    from search.cost_model import FIGURE_FEATURE_NAMES, figure_features

    return float(figure_features(parse_program(leir))[FIGURE_FEATURE_NAMES.index(name)])


def test_figure_features_see_the_chain_the_accumulators_the_vector_loop_and_the_intermediates():
    # the naive matmul: the reduction c innermost carries a chain, no accumulators inside it
    assert figure(MM, "chain") == 1.0 and figure(MM, "log_accumulators") == 0.0
    assert figure(MM, "log_reduction_extent") == 7.0 and figure(MM, "loops_inside_reduction") == 0.0
    # the tuned one: c outside a 8 x 32 tile of independent accumulators, 32 float32 lanes = 1024 bits
    tuned = ("P^{16}_{g=0}L^{4}_{h=0}L^{128}_{c=0}L^{8}_{tx=0}V^{32}_{a=0}[D^{f32,g}_{g*8+tx,h*32+a}="
             "D^{f32,g}_{g*8+tx,h*32+a}+A^{f32,g}_{g*8+tx,c}*C^{f32,g}_{c,h*32+a};];")
    assert figure(tuned, "chain") == 0.0 and figure(tuned, "log_accumulators") == 8.0
    assert figure(tuned, "loops_inside_reduction") == 2.0 and figure(tuned, "log_vector_bits") == 10.0
    assert figure(tuned, "vector_over_reduction") == 0.0 and figure(tuned, "vector_gathers") == 0.0
    assert figure(tuned, "index_ops") > figure(MM, "index_ops") == 0.0
    # two nests through an intermediate E (4 x 8 float32: 128 bytes); fused, nothing goes between nests
    two = "L^{4}_{a=0}L^{8}_{b=0}[E^{f32,g}_{a,b}=exp(A^{f32,g}_{a,b});];L^{4}_{a=0}L^{8}_{b=0}[C^{f32,g}_{a,b}=E^{f32,g}_{a,b}*2;];"
    fused = "L^{4}_{a=0}L^{8}_{b=0}[E^{f32,g}_{a,b}=exp(A^{f32,g}_{a,b});C^{f32,g}_{a,b}=E^{f32,g}_{a,b}*2;];"
    assert figure(two, "log_intermediate_bytes") == pytest.approx(np.log2(129))
    assert figure(fused, "log_intermediate_bytes") == 0.0
    assert figure(two, "heavy_nests") == 2.0 and figure(two, "heaviest_nest_share") == 0.5
    assert figure(fused, "heavy_nests") == 1.0 and figure(fused, "heaviest_nest_share") == 1.0
    # a vector loop across a strided access is a gather; a select is a guard
    gather = "L^{8}_{a=0}V^{8}_{b=0}[C^{f32,g}_{a,b}=A^{f32,g}_{b,a};];"
    assert figure(gather, "vector_gathers") == 0.5 and figure(gather, "strided_share") == 0.5
    guarded = "L^{8}_{a=0}[C^{f32,g}_{a}=if_then_else(a<4,A^{f32,g}_{a},0);];"
    assert figure(guarded, "selects") == 1.0


def test_figure_features_kept_by_nest_equal_those_computed_afresh():
    from search.cost_model import _NEST_FIGURES, figure_features

    rows = recorded("beam_library")[:12]
    first = [figure_features(parse_program(leir)) for leir, _ in rows]
    _NEST_FIGURES._entries.clear()
    again = [figure_features(parse_program(leir)) for leir, _ in rows]
    assert all(np.array_equal(a, b) for a, b in zip(first, again, strict=True))
    # the same program object twice: the second comes from the kept nests and is the same
    program = parse_program(rows[-1][0])
    assert np.array_equal(figure_features(program), figure_features(program))


def test_a_state_s_statement_costs_are_computed_once_for_the_estimate_and_the_figures(monkeypatch):
    """`state_features` reads each statement's costs twice (the static estimate, the figure features):
    on a program never seen, each statement's `statement_cost` runs once."""
    import search.cost_model
    import strategies.analysis.cost as cost
    from search.cost_model import state_features

    calls = []
    real = cost.statement_cost
    counted = lambda site, *a: calls.append(site.stmt) or real(site, *a)  # noqa: E731
    monkeypatch.setattr(cost, "statement_cost", counted)
    monkeypatch.setattr(search.cost_model, "statement_cost", counted, raising=False)  # wherever it is called
    program = parse_program(recorded("beam_library")[5][0])
    state_features(program)
    statements = [s.stmt for s in statement_sites(program)]
    assert len(statements) >= 1 and calls == statements
    state_features(program)  # the same nests again: nothing recomputed
    assert calls == statements


def test_model_trained_on_one_search_ranks_another_searchs_states():
    train, held_out = recorded("beam_library"), recorded("mcts_library_model")
    assert len(train) >= 40 and len(held_out) >= 40
    model = trained_on(train)
    programs = [parse_program(t) for t, _ in held_out]
    measured = np.array([s for _, s in held_out])
    rho = spearman(model.predict(programs), measured)
    assert rho >= 0.4, rho
    top5 = rank_by_model(model, programs)[:5]
    assert measured[top5].max() >= 0.8 * measured.max()      # the best few predicted hold a near-best state
    # the control: the same model on shuffled labels has learned nothing that ranks
    shuffled = [s for _, s in train]
    random.Random(0).shuffle(shuffled)
    control = trained_on([(t, s) for (t, _), s in zip(train, shuffled, strict=True)])
    assert spearman(control.predict(programs), measured) < rho - 0.2


def test_training_is_deterministic_and_waits_for_enough_samples():
    rows = recorded("beam_library")[:12]
    a, b = trained_on(rows), trained_on(rows)
    programs = [parse_program(t) for t, _ in recorded("mcts_library_model")[:10]]
    assert np.array_equal(a.predict(programs), b.predict(programs))
    early = trained_on(rows[:3])
    assert not early.trained and not early.predict(programs).any()   # untrained: no opinion


class ListPolicy(Policy):
    name = "list"

    def __init__(self, texts):
        self.texts = texts

    def actions(self, ctx, node, want):
        for i, t in enumerate(self.texts):
            yield Action("loop_reorder", {"i": i}, parse_program(t))


def test_ranked_policy_keeps_the_policy_order_until_trained_then_puts_predicted_fast_first():
    rows = recorded("beam_library")
    slow = min(rows, key=lambda r: r[1])[0]
    fast = max(rows, key=lambda r: r[1])[0]
    ctx = Context(parse_program(MM), SIG)
    root = Node(0, parse_program(MM), MM, "root")
    untrained = RankedPolicy(ListPolicy([slow, fast]))
    assert [a.params["i"] for a in untrained.actions(ctx, root, 2)] == [0, 1]
    ranked = RankedPolicy(ListPolicy([slow, fast]), trained_on(rows))
    assert [a.params["i"] for a in ranked.actions(ctx, root, 2)] == [1, 0]
    assert ranked.name == "list+model"


def test_ranked_policy_learns_from_the_search_it_serves():
    """In a search, every measured state trains the model (observe), and later rankings use it."""
    rows = recorded("beam_library")
    speed = {format_text(t): s for t, s in rows}
    texts = [t for t, _ in rows if format_text(t) != format_text(MM)][:20]   # the root is no proposal
    policy = RankedPolicy(ListPolicy(texts), CostModel(seed=0, min_samples=4))

    def measure(root, state):
        from leir.printer import format_program

        return 1000.0, 1000.0 / speed[format_program(state)]

    result = run(parse_program(MM), SIG, "bfs", policy, lambda r, s: "exact", measure,
                 config=DriverConfig(depth=1, branching=8))
    assert result.states_verified == 8
    assert len(policy.model.targets) == 8 and policy.model.trained
    first_four = [n.action.params["i"] for n in result.nodes[1:5]]
    assert first_four == [0, 1, 2, 3]          # before 4 measurements: the policy's own order
    later = [n.action.params["i"] for n in result.nodes[5:]]
    assert later != list(range(4, 8))          # afterwards the model picks from the rest


def format_text(text: str) -> str:
    from leir.printer import format_program

    return format_program(parse_program(text))


# --- the offline prior (issue 24) ---------------------------------------------------------------

def test_prior_trained_on_one_search_ranks_the_other_and_round_trips(tmp_path):
    from search.cost_model import PriorModel

    root_us = 1000.0  # any root time: the prior learns log2 µs; ranks do not depend on the scale
    train = [(parse_program(t), np.log2(root_us / s)) for t, s in recorded("beam_library")]
    prior = PriorModel.train([p for p, _ in train], [y for _, y in train], seed=0, info={"machine": "test"})
    test = recorded("mcts_library_model")
    predicted = prior.log2_us([parse_program(t) for t, _ in test])
    assert spearman(-predicted, [s for _, s in test]) > 0.5  # lower predicted time = higher speedup
    prior.save(tmp_path / "m.json")
    again = PriorModel.load(tmp_path / "m.json")
    assert again.info["machine"] == "test" and again.info["rows"] == len(train)
    assert np.allclose(again.log2_us([parse_program(t) for t, _ in test]), predicted)


def test_prior_load_refuses_what_is_not_a_model(tmp_path):
    from search.cost_model import PriorModel

    (tmp_path / "x.json").write_text('{"format": "other"}')
    with pytest.raises(ValueError, match="not a steptp cost model"):
        PriorModel.load(tmp_path / "x.json")
    with pytest.raises(ValueError, match="cannot read"):
        PriorModel.load(tmp_path / "missing.json")


def test_cost_model_with_a_prior_ranks_before_any_measurement():
    from search.cost_model import PriorModel

    rows = recorded("beam_library")
    prior = PriorModel.train([parse_program(t) for t, _ in rows], [-np.log2(s) for _, s in rows], seed=0)
    model = CostModel(seed=0, prior=prior)
    model.set_root(parse_program(MM))
    assert not model.trained
    states = [parse_program(t) for t, _ in recorded("mcts_library_model")]
    scores = model.predict(states)
    assert np.any(scores != 0)  # the prior speaks before the search has timed anything
    assert np.allclose(scores, (float(prior.log2_us([parse_program(MM)])[0]) - prior.log2_us(states)) * np.log(2))
    for text, speedup in rows[:6]:  # measurements refine it: the online booster starts from the prior's margin
        model.add(parse_program(text), speedup)
    assert model.trained and model.predict(states).shape == (len(states),)


def test_a_prior_with_a_ranker_ranks_another_searchs_states_and_the_search_starts_from_it():
    """The ranker learns from the states of one search of the matmul beside its original and ranks
    another search's; the cost model's starting point is half its calibrated speedup, half the analysis."""
    import math

    from search.analysis import DEFAULT_MACHINE, log2_speedup
    from search.cost_model import PriorModel, RankingSet, ranking_matrix, state_features

    root = parse_program(MM)
    train = [(parse_program(t), s) for t, s in recorded("beam_library")]
    states = np.vstack([state_features(p) for p, _ in train])
    data = RankingSet(ranking_matrix(state_features(root), states), np.log2([s for _, s in train]),
                      ["mm"] * len(train))
    prior = PriorModel.train([p for p, _ in train], [-math.log2(s) for _, s in train], seed=0, ranking=data)
    assert prior.ranker is not None and prior.info["ranking_rows"] == len(train)
    test = recorded("mcts_library_model")
    programs = [parse_program(t) for t, _ in test]
    predicted = prior.log2_speedup(root, programs)
    assert spearman(predicted, [s for _, s in test]) > 0.5  # higher predicted speedup = measured faster
    model = CostModel(seed=0, prior=prior, analytic=True)
    model.set_root(root)
    analytic = np.array([log2_speedup(root, p, DEFAULT_MACHINE) for p in programs])
    assert np.allclose(model.predict(programs), (0.5 * predicted + 0.5 * analytic) * math.log(2))
