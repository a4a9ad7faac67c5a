"""The shape model (workloads/shapes.py): real-model dimensions by role, the work budget, the odd
minority, and a work measure that follows the naive LEIR program's iteration count."""
from __future__ import annotations

from collections import Counter
from dataclasses import replace

import pytest

from leir.ast import Nest
from leir.frontend import translate
from workloads.registry import all_workloads, get_workload
from workloads.sampling import build, sample_instance
from workloads.shapes import ODD_VALUES, ROLE_VALUES, WORK_BUDGET, estimate_work, fit_to_budget

CATALOGUE = all_workloads()


@pytest.fixture(scope="module")
def default_instances():
    return [(w, sample_instance(w, 0, k, "default")) for w in CATALOGUE for k in range(2)]


def _allowed(param, odd: bool) -> set[int]:
    if param.choices:
        return set(param.choices)
    return {v for v in (ODD_VALUES if odd else ROLE_VALUES)[param.role] if v % param.multiple_of == 0}


def test_every_parameter_has_a_role_or_fixed_choices():
    for w in CATALOGUE:
        for p in w.params:
            assert p.choices or p.role in ROLE_VALUES, (w.name, p.name)
            assert p.values("tiny") and p.values("default"), (w.name, p.name)


def test_model_instances_take_values_of_their_roles(default_instances):
    for w, inst in default_instances:
        odd = inst.shape_source == "odd-extents"
        assert inst.shape_source in ("model-dims", "odd-extents")
        for p in w.params:
            if p.same_as is not None:
                assert inst.params[p.name] == inst.params[p.same_as], (w.name, inst.params)  # square images
            else:
                assert inst.params[p.name] in _allowed(p, odd), (w.name, p.name, inst.params)


def test_instances_fit_the_work_budget(default_instances):
    budget = WORK_BUDGET["default"]
    for w, inst in default_instances:
        work = estimate_work(w, inst.params)
        if work > budget:  # only when nothing can go lower
            odd = inst.shape_source == "odd-extents"
            assert all(inst.params[p.name] == min(_allowed(p, odd)) for p in w.params if p.same_as is None), \
                (w.name, inst.params, work)


def test_the_odd_minority_is_present_and_at_most_a_tenth(default_instances):
    sources = Counter(inst.shape_source for _, inst in default_instances)
    share = sources["odd-extents"] / len(default_instances)
    assert 0.02 <= share <= 0.10, sources


def test_model_dimensions_are_realistic(default_instances):
    # the largest extent of each instance: the median is a real layer width, not a toy
    largest = sorted(max(inst.params.values()) for _, inst in default_instances)
    assert largest[len(largest) // 2] >= 64
    primes = [inst for _, inst in default_instances if inst.shape_source == "model-dims"
              and any(v > 7 and all(v % d for d in range(2, int(v ** 0.5) + 1)) for v in inst.params.values())]
    assert not primes, primes[:3]  # model dimensions are never prime above 7; the odd minority is marked


def test_a_larger_budget_gives_larger_instances():
    w = get_workload("matmul")
    big = {"M": 2048, "K": 4096, "N": 4096}
    small = fit_to_budget(w, big, "default", odd=False)
    large = fit_to_budget(w, big, "release", odd=False)
    assert estimate_work(w, small) <= WORK_BUDGET["default"] < estimate_work(w, large) <= WORK_BUDGET["release"]
    assert fit_to_budget(w, big, "tiny", odd=False) == big  # tiny has no budget: its ranges are small


def test_tiny_profile_keeps_its_small_ranges():
    for w in CATALOGUE[::10]:
        inst = sample_instance(w, 3, 0, "tiny")
        assert inst.shape_source == "tiny-ranges"
        for p in w.params:
            assert p.low <= inst.params[p.name] <= p.high or p.choices, (w.name, inst.params)


def _iterations(program) -> int:
    total = 0

    def walk(items, outer: int) -> None:
        nonlocal total
        for item in items:
            if isinstance(item, Nest):
                n = outer
                for lp in item.loops:
                    n *= lp.extent
                total += n
                walk(item.body, n)

    walk(program.nests, 1)
    return total


@pytest.mark.parametrize("name", ["matmul", "conv2d", "softmax_last", "layer_norm", "cumsum", "attention_mha_sdpa",
                                  "mlp2_gelu", "max_pool2d"])
def test_work_follows_the_naive_programs_iteration_count(name):
    w = get_workload(name)
    inst = sample_instance(w, 0, 0, "default")
    module, inputs = build(w, replace(inst, dtype="float32"))
    iterations = _iterations(translate(module, inputs, dtype="float32").program)
    work = estimate_work(w, inst.params)
    assert work / 4 <= iterations <= work * 4, (name, inst.params, work, iterations)
