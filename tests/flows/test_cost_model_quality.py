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
    from search.cost_model import state_features

    orders = ["acE", "aeC", "caE", "ceA", "eaC", "ecA"]  # the matmul's six loop orders

    def reordered(order: str) -> str:
        loops = {"a": "L^{16}_{a=0}", "c": "L^{24}_{c=0}", "e": "L^{32}_{e=0}"}
        return "".join(loops[v.lower()] for v in order) + MM[MM.index("["):]

    programs = [parse_program(reordered(o)) for o in orders] * 2
    families = ["gemm"] * 6 + ["gemm2"] * 6
    # the first order of each family is its original program (state id = program id)
    rows = [{"family": f, "program_id": f, "state_id": f if k % 6 == 0 else f"{f}-{k}",
             "time_us": 2.0 ** static_estimate(p)} for k, (f, p) in enumerate(zip(families, programs, strict=True))]
    features = np.vstack([state_features(p) for p in programs])
    q = held_out_quality(rows, features, {"gemm": "train", "gemm2": "test"}, seed=0, static=True)
    static = q["static_estimate"]
    assert len({r["time_us"] for r in rows[6:]}) > 2       # the orders differ in the estimate
    assert static["spearman_within_program"] == pytest.approx(1.0) and static["top1_recall"] == 1.0
    assert static["programs_within"] == q["programs_within"] == 1 and "per_family" not in static
    assert "static_estimate" not in held_out_quality(rows, features, {"gemm": "train", "gemm2": "test"}, seed=0)


def test_the_ranker_learns_a_programs_order_from_other_programs_states_and_the_model_round_trips(tmp_path):
    """Train on the loop orders of two matmuls, rank a third's (held out): its states' measured order
    (here: a time that grows with the estimate's memory part) is what the ranker predicts."""
    import math

    import numpy as np

    from flows.cost_model import held_out_quality, ranking_set
    from leir.parse import parse_program
    from search.cost_model import ESTIMATE_PARTS, FEATURE_NAMES, PriorModel, state_features

    memory = [n for n, _ in ESTIMATE_PARTS].index("memory")
    programs, rows = [], []
    for family, (i, j, k) in (("a", (16, 24, 32)), ("b", (24, 32, 16)), ("c", (32, 16, 24))):
        loops = {"a": f"L^{{{i}}}_{{a=0}}", "c": f"L^{{{j}}}_{{c=0}}", "e": f"L^{{{k}}}_{{e=0}}"}
        for n, order in enumerate(("ace", "aec", "cae", "cea", "eac", "eca")):
            p = parse_program("".join(loops[v] for v in order) + MM[MM.index("["):])
            programs.append(p)
            cycles = 2.0 ** state_features(p)[len(FEATURE_NAMES) + memory]
            rows.append({"family": family, "program_id": family, "state_id": family if n == 0 else f"{family}{n}",
                         "time_us": 1.0 + cycles / 1000.0})
    states = np.vstack([state_features(p) for p in programs])
    q = held_out_quality(rows, states, {"a": "train", "b": "train", "c": "test"}, seed=0)
    assert q["programs_within"] == 1 and q["spearman_within_program"] >= 0.8
    assert "regressor" in q and q["per_family"]["c"]["spearman_within_program"] == q["spearman_within_program"]
    data, kept = ranking_set(rows, states, list(range(len(rows))))
    assert len(kept) == len(rows) and data.log2_speedup[0] == 0.0  # the original over itself
    model = PriorModel.train(states[:, :len(FEATURE_NAMES)], [math.log2(r["time_us"]) for r in rows], ranking=data)
    model.save(tmp_path / "m.json")
    again = PriorModel.load(tmp_path / "m.json")
    test = programs[12:]
    assert np.allclose(again.log2_speedup(programs[12], test), model.log2_speedup(programs[12], test))
    predicted = model.log2_speedup(programs[12], test)
    measured = [math.log2(rows[12]["time_us"] / r["time_us"]) for r in rows[12:]]
    assert np.corrcoef(predicted, measured)[0, 1] > 0.8  # calibrated: log2 units, the same direction


def test_row_features_of_states_sharing_nests_are_those_of_states_parsed_apart():
    """The stage parses a lake's states apart, shares their unchanged nests and estimates a program's
    states together: the very same floats as each state on its own."""
    import numpy as np

    from flows.cost_model import parsed_states, row_features
    from leir.parse import parse_program
    from search.cost_model import state_features

    two = "L^{64}_{a=0}[C^{f32,g}_{a}=exp(A^{f32,g}_{a})*2;];L^{64}_{a=0}[D^{f32,g}_{a}=C^{f32,g}_{a}+{rhs};];"
    vec = "L^{16}_{a=0}V^{4}_{b=0}[C^{f32,g}_{a*4+b}=exp(A^{f32,g}_{a*4+b})*2;];"
    texts = [two.replace("{rhs}", r) for r in ("1", "A^{f32,g}_{a}", "C^{f32,g}_{a}")]
    texts.append(vec + two[two.index("];") + 2:].replace("{rhs}", "1"))
    rows = [{"program_id": f"p{k % 2}", "state_id": f"s{k}", "leir": t} for k, t in enumerate(texts * 2)]
    apart = np.vstack([state_features(parse_program(r["leir"])) for r in rows])
    assert np.array_equal(row_features(rows, parsed_states(rows)), apart)
