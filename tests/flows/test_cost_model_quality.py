"""The cost model's ranking quality as a search needs it: within each program (median Spearman, top-k
recall of the fastest measured state) besides across programs, overall and per held-out family."""
from __future__ import annotations

import pytest

from flows.cost_model import ranking_quality


def states(family: str, program: str, times: list[float], predicted: list[float]) -> list[dict]:
    return [{"family": family, "program_id": program, "state_id": f"{program}-{k}", "time_us": t, "predicted": p}
            for k, (t, p) in enumerate(zip(times, predicted, strict=True))]


def test_a_perfect_ranking_and_a_reversed_one():
    times = [10.0, 4.0, 7.0, 1.0, 9.0, 3.0, 6.0]
    perfect = states("gemm", "p1", times, times)
    reversed_ = states("softmax", "p2", times, [-t for t in times])
    q = ranking_quality(perfect + reversed_)
    assert q["per_family"]["gemm"]["spearman_within_program"] == pytest.approx(1.0)
    assert q["per_family"]["gemm"]["top1_recall"] == 1.0 and q["per_family"]["gemm"]["top5_recall"] == 1.0
    assert q["per_family"]["softmax"]["spearman_within_program"] == pytest.approx(-1.0)
    assert q["per_family"]["softmax"]["top1_recall"] == 0.0
    # the fastest (1.0) is predicted slowest of 7: not in the predicted top 5 either
    assert q["per_family"]["softmax"]["top5_recall"] == 0.0
    assert q["top1_recall"] == 0.5 and q["programs_within"] == 2 and q["states"] == 14


def test_size_alone_gives_a_good_across_figure_and_nothing_within():
    """Two programs of very different sizes, each ranked at random inside: across programs the
    correlation is high (the size decides), within a program it is not: why both are reported."""
    small = states("ew", "small", [1.0, 1.2, 0.8, 1.1, 0.9], [0.0, 0.0, 0.0, 0.0, 0.0])
    large = states("ew", "large", [100.0, 80.0, 120.0, 90.0, 110.0], [10.0, 10.0, 10.0, 10.0, 10.0])
    q = ranking_quality(small + large)
    assert q["spearman"] > 0.8 and q["spearman_within_program"] is None  # a constant prediction: no correlation


def test_programs_with_too_few_states_are_not_ranked():
    q = ranking_quality(states("x", "p", [1.0, 2.0], [1.0, 2.0]))
    assert q["programs_within"] == 0 and q["top1_recall"] is None


MM = "L^{16}_{a=0}L^{24}_{c=0}L^{32}_{e=0}[E^{f32,g}_{a,e}=E^{f32,g}_{a,e}+A^{f32,g}_{a,c}*C^{f32,g}_{c,e};];"


def test_the_static_estimate_is_reported_beside_the_learned_model_on_the_same_held_out_states():
    import numpy as np

    from flows.cost_model import held_out_quality, static_estimate
    from leir.parse import parse_program
    from search.cost_model import program_features

    orders = ["acE", "aeC", "caE", "ceA", "eaC", "ecA"]  # the matmul's six loop orders

    def reordered(order: str) -> str:
        loops = {"a": "L^{16}_{a=0}", "c": "L^{24}_{c=0}", "e": "L^{32}_{e=0}"}
        return "".join(loops[v.lower()] for v in order) + MM[MM.index("["):]

    programs = [parse_program(reordered(o)) for o in orders] * 2
    families = ["gemm"] * 6 + ["gemm2"] * 6
    rows = [{"family": f, "program_id": f, "state_id": f"{f}-{k}", "time_us": 2.0 ** static_estimate(p)}
            for k, (f, p) in enumerate(zip(families, programs, strict=True))]
    features = np.vstack([program_features(p) for p in programs])
    q = held_out_quality(rows, features, {"gemm": "train", "gemm2": "test"}, seed=0, programs=programs)
    static = q["static_estimate"]
    assert len({r["time_us"] for r in rows[6:]}) > 2       # the orders differ in the estimate
    assert static["spearman_within_program"] == pytest.approx(1.0) and static["top1_recall"] == 1.0
    assert static["programs_within"] == q["programs_within"] == 1 and "per_family" not in static
    assert "static_estimate" not in held_out_quality(rows, features, {"gemm": "train", "gemm2": "test"}, seed=0)
