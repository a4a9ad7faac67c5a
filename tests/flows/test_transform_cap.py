"""The release profile's verification budget: `steps_per_strategy` trims common strategies, keeps rare
ones whole, spreads what it keeps over the families, and keeps the compute_inline steps that kept
steps start from."""
from collections import Counter

from flows.transform import cap_per_strategy


def _row(step_id, strategy, parent=None):
    return {"step_id": step_id, "strategy": strategy, "parent_step_id": parent}


def _shards():
    gemm = [_row(f"g{i}", "loop_split") for i in range(10)] + [_row("gi", "compute_inline"),
                                                              _row("gp", "powsimp", parent="gi")]
    norm = [_row(f"n{i}", "loop_split") for i in range(3)] + [_row("ni", "compute_inline"),
                                                             _row("ni2", "compute_inline", parent="ni"),
                                                             _row("nf", "factorization", parent="ni2")]
    return {"gemm": gemm, "norm": norm}


def test_common_strategies_are_capped_and_spread_over_families():
    out = cap_per_strategy(_shards(), cap=4, seed=0)
    split = {f: [r["step_id"] for r in rows if r["strategy"] == "loop_split"] for f, rows in out.items()}
    assert len(split["gemm"]) == 2 and len(split["norm"]) == 2  # in turn: 2 + 2, not 4 from gemm
    assert all(i.startswith("g") for i in split["gemm"]) and all(i.startswith("n") for i in split["norm"])
    cap6 = cap_per_strategy(_shards(), cap=6, seed=0)
    assert Counter(r["strategy"] for r in cap6["norm"])["loop_split"] == 3  # norm runs out; gemm gives the rest
    assert Counter(r["strategy"] for r in cap6["gemm"])["loop_split"] == 3


def test_rare_strategies_and_the_ancestors_of_kept_steps_stay():
    out = cap_per_strategy(_shards(), cap=1, seed=0)
    ids = {r["step_id"] for rows in out.values() for r in rows}
    assert {"gp", "gi", "nf", "ni2", "ni"} <= ids  # ancestors kept beyond compute_inline's own cap of 1
    assert sum(r["strategy"] == "loop_split" for rows in out.values() for r in rows) == 1


def test_selection_is_seeded_and_keeps_row_order():
    a, b = cap_per_strategy(_shards(), cap=3, seed=0), cap_per_strategy(_shards(), cap=3, seed=0)
    assert a == b
    order = [r["step_id"] for r in _shards()["gemm"]]
    kept = [r["step_id"] for r in a["gemm"]]
    assert kept == sorted(kept, key=order.index)
    others = [cap_per_strategy(_shards(), cap=3, seed=s) for s in range(1, 6)]
    assert any(o["gemm"] != a["gemm"] for o in others)  # the seed decides which steps, not the row order


def test_inline_branches_bound_the_chains_inside_the_enumeration():
    """With `inline_branches`, only that many compute_inline results per state are rewritten further
    (a seeded choice); every inlining is still a step, and the chains below the others are never made."""
    import json

    from flows.config import load_params
    from flows.transform import transform_shard

    sig = {"tensors": [{"name": "A", "shape": [8], "dtype": "float64", "role": "input"},
                       {"name": "C", "shape": [8], "dtype": "float64", "role": "output"}]}
    leir = ("B^{8}_{tx=0}[D^{f64,g}_{tx}=A^{f64,g}_{tx}+2;];B^{8}_{tx=0}[E^{f64,g}_{tx}=D^{f64,g}_{tx}*3;];"
            "B^{8}_{tx=0}[F^{f64,g}_{tx}=exp(E^{f64,g}_{tx});];B^{8}_{tx=0}[C^{f64,g}_{tx}=F^{f64,g}_{tx}+1;];")
    program = {"program_id": "p", "verification_status": "exact", "signature": json.dumps(sig), "leir": leir,
               "rounding_share": 0.0}

    def steps(branches):
        profile = {"inline_depth": 2, **({"inline_branches": branches} if branches is not None else {})}
        return transform_shard([program], load_params(profile="tiny", overrides={"profiles": {"tiny": profile}}))

    every, bounded = steps(None), steps(1)
    roots = [r for r in bounded if r["depth"] == 0 and r["strategy"] == "compute_inline"]
    assert len(roots) >= 2  # several inlinings at the top, all of them steps
    assert len({r["parent_step_id"] for r in bounded if r["depth"] == 1}) == 1  # one of them explored
    assert len({r["parent_step_id"] for r in every if r["depth"] == 1}) == len(roots)
    assert {r["step_id"] for r in bounded} < {r["step_id"] for r in every}
    assert steps(1) == bounded  # seeded
