"""Every strategy recognises its own steps: each transformation the library makes, for all 43
strategies and every parameter variant they enumerate, shows the strategy's structural sign
(`Strategy.recognizes`), which is what the label check credits when a model writes the step in
another spelling. A recogniser narrower than its rule would refuse the rule's own output (a vector
width splits its loop; a copy re-laid as a packed tensor; inlining into one reader keeps the
producer) and give a model's equivalent answer no credit.

The programs: each strategy's CoT case (tests/strategies/test_cot.py, one per strategy, the target it
is written for), every strategy tried on every one of them, and a sample of the catalogue's
originals with, for the mathematical strategies, their states after one compute_inline (as the
transform stage enumerates them)."""
from __future__ import annotations

from collections import Counter

import pytest

from leir.parse import parse_program
from leir.printer import format_program
from strategies.base import Context
from strategies.registry import ALL_NAMES, get, registered
from tests.strategies.test_cot import CASES

PER_STRATEGY = 60  # transformations looked at per (state, strategy)


def _case_contexts() -> list[tuple[str, Context]]:
    return [(name, Context(parse_program(text), signature, target))
            for name, (text, signature, target, *_) in sorted(CASES.items())]


@pytest.fixture(scope="module")
def catalogue_states() -> list[tuple[str, Context, list[Context]]]:
    from cli.strategies import sample_catalogue

    out = []
    for p in sample_catalogue(24, seed=0):
        inline = [p.context.with_program(t.after) for t in get("compute_inline").transformations(p.context, limit=2)]
        out.append((p.name, p.context, inline))
    return out


def _unrecognised(strategy, ctx: Context, seen: Counter) -> list[str]:
    wrong = []
    for t in strategy.transformations(ctx, limit=PER_STRATEGY):
        seen[strategy.name] += 1
        if not strategy.recognizes(ctx.program, t.after, ctx.signature):
            wrong.append(f"{strategy.name} {t.params_json()} at {t.site.describe()}:\n"
                         f"  {format_program(ctx.program)}\n  -> {t.after_text}")
    return wrong


def test_every_strategy_recognises_its_own_steps(catalogue_states):
    seen: Counter = Counter()
    wrong: list[str] = []
    for _, ctx in _case_contexts():
        for strategy in registered():
            wrong += _unrecognised(strategy, ctx, seen)
    for _, ctx, inline in catalogue_states:
        for strategy in registered():
            for state in [ctx] + (inline if strategy.level == "mathematical" else []):
                wrong += _unrecognised(strategy, state, seen)
    assert not wrong, f"{len(wrong)} steps not recognised by their own rule:\n" + "\n".join(wrong[:40])
    assert [n for n in ALL_NAMES if not seen[n]] == [], "every strategy has steps looked at"
    # and every parameter variant of the strategies that have them
    assert seen["loop_vectorization"] >= 20 and seen["layout_transformation"] >= 20, seen


@pytest.mark.parametrize("name", ["loop_vectorization", "layout_transformation", "compute_inline"])
def test_the_variants_that_change_the_shape_of_the_step_are_recognised(name, catalogue_states):
    """The variants a narrower recogniser refused, each seen and recognised: a vector width (the
    loop split first) and partial sums; a transposed or packed copy; inlining into one reader."""
    variants = Counter()
    for _, ctx, _ in catalogue_states:
        for t in get(name).transformations(ctx, limit=PER_STRATEGY):
            assert get(name).recognizes(ctx.program, t.after, ctx.signature), t.after_text
            variants[tuple(sorted(k for k in t.params))] += 1
    expected = {"loop_vectorization": [("width",), ("partials", "width")],
                "layout_transformation": [("copy", "order"), ("copy", "dim", "factor"), ("order",)],
                "compute_inline": [("into",)]}[name]
    assert all(variants[v] for v in expected), variants


def test_a_step_of_another_strategy_is_not_recognised():
    """Recognition names the strategy: a vectorised loop is not a parallel one, a split not a tiling."""
    text, signature, target, *_ = CASES["loop_vectorization"]
    ctx = Context(parse_program(text), signature, target)
    t = next(get("loop_vectorization").transformations(ctx))
    assert not get("loop_parallelization").recognizes(ctx.program, t.after, signature)
    assert not get("loop_tiling").recognizes(ctx.program, t.after, signature)
    text, signature, target, *_ = CASES["loop_split"]
    ctx = Context(parse_program(text), signature, target)
    t = next(get("loop_split").transformations(ctx))
    assert not get("loop_tiling").recognizes(ctx.program, t.after, signature)
    assert get("loop_split").recognizes(ctx.program, t.after, signature)


def test_the_sympy_gate_judges_the_rewritten_statement_as_recognition_judges_the_programs(catalogue_states):
    """The algebraic rules' gate asks `recognizes` of the one statement `build` rewrote (cached per
    statement pair): on every candidate the rules build, built but not yet gated, its answer is the
    whole programs' answer, refusals included."""
    from strategies.analysis.algebra import translate
    from strategies.base import Illegal
    from strategies.rules.mathematical.symbolic import SympyStrategy, _key, _rewritten, _shown

    sympy_rules = [s for s in registered() if isinstance(s, SympyStrategy)]
    judged, refused = 0, 0
    contexts = [c for _, c in _case_contexts()] + [s for _, c, inline in catalogue_states for s in [c, *inline]]
    for ctx in contexts:
        for rule in sympy_rules:
            for site in rule.sites(ctx):
                for raw in rule.parameters(ctx, site):
                    params = rule.params_type.from_json(raw)
                    try:
                        if rule.check(ctx, site, params):
                            continue
                        rewrite = rule.build(ctx, site, params)
                    except Illegal:
                        continue
                    st = ctx.sites[site.stmts[0]]
                    after = translate(st.stmt).target.rebuild(_rewritten(rule.name, st.stmt, _key(params))[1])
                    whole = rule.recognizes(ctx.program, rewrite.program, ctx.signature)
                    assert _shown(rule, st.stmt, after) == whole, (rule.name, format_program(rewrite.program))
                    judged += 1
                    refused += not whole
    assert judged >= 50 and refused >= 10, (judged, refused)
