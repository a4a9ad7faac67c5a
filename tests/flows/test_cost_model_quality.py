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
