"""Typed parameters: every variant a strategy makes round-trips through its params dataclass to the
same published JSON, and malformed parameters are a refusal that names what is wrong, never a crash
(a model's answer or a hand-written record can hold anything)."""
from __future__ import annotations

import pytest

from leir.parse import parse_program
from strategies.base import Context, Illegal, NoParams
from strategies.registry import ALL_NAMES, get, registered
from tests.strategies.test_cot import CASES


def _contexts() -> list[Context]:
    return [Context(parse_program(text), signature, target)
            for _, (text, signature, target, *_) in sorted(CASES.items())]


def test_every_variant_round_trips_through_its_params():
    seen = set()
    for ctx in _contexts():
        for strategy in registered():
            for t in strategy.transformations(ctx, limit=40):
                typed = strategy.params_type.from_json(t.params)
                assert typed.to_json() == t.params, (strategy.name, t.params)
                seen.add(strategy.name)
    assert sorted(seen) == sorted(ALL_NAMES)


def test_strategies_with_variants_declare_their_params():
    """A strategy whose steps carry parameters says what they are (a dataclass of typed fields)."""
    for ctx in _contexts():
        for strategy in registered():
            t = next(strategy.transformations(ctx, limit=1), None)
            if t is not None and t.params:
                assert strategy.params_type is not NoParams, strategy.name


@pytest.mark.parametrize(("name", "params", "reason"), [
    ("loop_split", {"factor": "2"}, "factor: Input should be a valid integer"),
    ("loop_split", {}, "factor: Field required"),
    ("loop_split", {"factor": 2, "width": 4}, "width: Unexpected keyword argument"),
    ("loop_vectorization", {"exp": "slow"}, "exp: Input should be 'fast'"),
    ("loop_reorder", {"swap": ["a", 3]}, "swap.1: Input should be a valid string"),
    ("set_storage_scope", {"scope": "x"}, "scope: Input should be 'g', 's' or 'l'"),
    ("loop_parallelization", {"at": 1}, "at: Unexpected keyword argument"),
])
def test_malformed_params_are_refused_with_what_is_wrong(name, params, reason):
    with pytest.raises(Illegal, match=reason.replace("(", r"\(").replace(")", r"\)")) as err:
        get(name).params_type.from_json(params)
    assert "expected:" in str(err.value)


def test_a_malformed_or_incomplete_step_is_no_step():
    """`apply` with parameters that do not parse, or name no variant of the site, gives no
    transformation (and `rewrite` says why)."""
    ctx = next(c for c in _contexts() if list(get("loop_reorder").sites(c)))
    reorder = get("loop_reorder")
    site = next(iter(reorder.sites(ctx)))
    assert reorder.apply(ctx, site, {"swap": [1, 2]}) is None
    with pytest.raises(Illegal, match="is not a loop of this band"):
        reorder.rewrite(ctx, site, {"swap": ["nope", site.loops[0]]})
    with pytest.raises(Illegal, match="names the loop and the position"):
        reorder.rewrite(ctx, site, {"move": site.loops[0]})


@pytest.mark.parametrize(("name", "params"), [
    ("loop_vectorization", {"width": 0}), ("loop_tiling", {"factors": [0, 0]}), ("loop_split", {"factor": 0}),
    ("reduction_factorization", {"factor": 0}), ("loop_vectorization", {"width": 0, "partials": True}),
])
def test_a_zero_factor_is_a_reason_not_a_crash(name, params):
    strategy = get(name)
    for ctx in _contexts():
        for site in strategy.sites(ctx):
            assert strategy.apply(ctx, site, params) is None
