"""Verifying a program's steps in groups (`gpu_tasks.group_verify`) gives the verdicts of verifying
each pair whole (`gpu_tasks.jobs.verify_pair_job`), byte for byte, while building each distinct nest
once and running the nests states share once per draw."""
from __future__ import annotations

import json

import numpy as np
import pytest

pytest.importorskip("tvm")

from gpu_tasks import group_verify  # noqa: E402
from gpu_tasks.group_verify import verify_group_job  # noqa: E402
from gpu_tasks.jobs import clear_caches, verify_pair_job  # noqa: E402
from gpu_tasks.pair_groups import pair_groups  # noqa: E402
from gpu_tasks.verify import iter_verify_pairs, pair_request  # noqa: E402
from leir.parse import parse_program  # noqa: E402
from leir.printer import format_program  # noqa: E402
from strategies.base import Context  # noqa: E402
from strategies.registry import get  # noqa: E402
from tests.strategies.test_cot import CASES  # noqa: E402

SECOND = ("loop_reorder", "compute_inline", "loop_split", "loop_fusion")  # a step after the first


def _as_json(verifications) -> list[str]:
    return [json.dumps(v.to_json(), sort_keys=True) for v in verifications]


def _case_requests() -> list:
    """Each strategy's steps on its CoT case (both programs' signature, verified on llvm), and for the
    first of them one more step on its result, verified against that result and against the case."""
    requests = []
    for name, (text, signature, target, *_) in sorted(CASES.items()):
        ctx = Context(parse_program(text), signature, target)
        steps = list(get(name).transformations(ctx, limit=3))
        requests += [pair_request(t.before, t.after, signature) for t in steps]
        if not steps:
            continue
        then = ctx.with_program(steps[0].after)
        more = next((t for s in SECOND for t in get(s).transformations(then, limit=1)), None)
        if more is not None:
            requests += [pair_request(then.program, more.after, signature),
                         pair_request(ctx.program, more.after, signature)]
    return requests


def test_grouped_verdicts_are_the_whole_state_verdicts_for_every_strategy():
    requests = _case_requests()
    assert len({r.signature for r in requests}) > 5 and len(requests) > 120
    groups = pair_groups(requests)
    assert max(len(g) for g in groups) > 1
    grouped = [None] * len(requests)
    for group in groups:
        for i, v in zip(group, verify_group_job(tuple(requests[i] for i in group)), strict=True):
            grouped[i] = v
    clear_caches()
    whole = [verify_pair_job(r) for r in requests]
    assert {v.status for v in whole} <= {"exact", "close"}
    assert _as_json(grouped) == _as_json(whole)


MM = ("B^{8}_{tx=0}L^{16}_{a=0}[E^{f32,l}_{tx,a}=0;];"
      "B^{8}_{tx=0}L^{16}_{a=0}L^{12}_{c=0}[E^{f32,l}_{tx,a}=E^{f32,l}_{tx,a}+A^{f32,g}_{tx,c}*C^{f32,g}_{c,a};];"
      "B^{8}_{tx=0}L^{16}_{a=0}[D^{f32,g}_{tx,a}=exp(E^{f32,l}_{tx,a});];")
MM_SIG = json.dumps({"tensors": [{"name": "A", "shape": [8, 12], "dtype": "float32", "role": "input"},
                                 {"name": "C", "shape": [12, 16], "dtype": "float32", "role": "input"},
                                 {"name": "D", "shape": [8, 16], "dtype": "float32", "role": "output"}]})


def _with_last_nest(rhs: str) -> str:
    return format_program(parse_program(MM.replace("exp(E^{f32,l}_{tx,a})", rhs)))


def test_a_pair_that_fails_in_a_group_carries_the_whole_state_message():
    good = _with_last_nest("exp(E^{f32,l}_{tx,a})*1")
    wrong = _with_last_nest("exp(E^{f32,l}_{tx,a})+1")
    overwrites = MM + "B^{8}_{tx=0}L^{12}_{c=0}[A^{f32,g}_{tx,c}=0;];"  # writes an input: verified whole
    requests = [pair_request(MM, after, MM_SIG) for after in (good, wrong, "B^{8}_{tx=0}[", overwrites, MM)]
    grouped = verify_group_job(tuple(requests))
    clear_caches()
    whole = [verify_pair_job(r) for r in requests]
    statuses = [v.status for v in whole]
    assert statuses[:3] == ["exact", "mismatch", "invalid"] and statuses[4] == "exact"
    assert _as_json(grouped) == _as_json(whole)


def test_states_that_begin_alike_run_their_shared_nests_once_per_draw(monkeypatch):
    calls: list[int] = []
    original = group_verify.compile_units

    def counting(funcs, target, config, threads=1):
        return [_Counted(f, u, calls) for u, f in enumerate(original(funcs, target, config, threads))]

    monkeypatch.setattr(group_verify, "compile_units", counting)
    afters = [_with_last_nest(rhs) for rhs in ("exp(E^{f32,l}_{tx,a})*1", "exp(E^{f32,l}_{tx,a}*1)",
                                              "1*exp(E^{f32,l}_{tx,a})")]
    results = verify_group_job(tuple(pair_request(MM, a, MM_SIG, draws=2) for a in afters))
    assert [v.status for v in results] == ["exact"] * 3
    # units: the fill with the product (unit 0, the same in all four states), then the exponential
    # (one per state); 2 draws: unit 0 runs once per draw, the others once per state and draw
    assert calls.count(0) == 2
    assert len(calls) == 2 + 4 * 2 and len(set(calls)) == 5


class _Counted:
    def __init__(self, function, index: int, calls: list[int]):
        self.function, self.index, self.calls = function, index, calls

    def __call__(self, *args):
        self.calls.append(self.index)
        return self.function(*args)


def test_the_pool_verifies_in_groups_and_returns_input_order():
    from gpu_tasks.pool import WorkerPool

    requests = _case_requests()[:40]
    requests = requests[::2] + requests[1::2]  # groups interleaved
    whole = _as_json(verify_pair_job(r) for r in requests)
    with WorkerPool(workers=2, timeout_s=60) as pool:
        assert _as_json(iter_verify_pairs(requests, pool)) == whole
    assert _as_json(iter_verify_pairs(requests)) == whole


def test_smaller_groups_give_the_same_verdicts_side_by_side():
    """The search's grounding splits one root's states in as many groups as the pool has workers."""
    from gpu_tasks.pool import WorkerPool

    requests = [r for r in _case_requests() if r.signature == _case_requests()[0].signature][:12]
    assert len(requests) > 4 and len(pair_groups(requests)) == 1
    assert [len(g) for g in pair_groups(requests, max_group=len(requests) // 2)] == [len(requests) // 2] * 2
    whole = _as_json(verify_pair_job(r) for r in requests)
    with WorkerPool(workers=2, timeout_s=60) as pool:
        assert _as_json(iter_verify_pairs(requests, pool, max_group=len(requests) // 2)) == whole


def test_pairs_outside_the_grouped_protocol_are_verified_alone():
    requests = [pair_request(MM, MM, MM_SIG), pair_request(MM, MM, MM_SIG, form="tensorir"),
                pair_request(MM, MM, MM_SIG)]
    assert pair_groups(requests) == [[0, 2], [1]]
    # tolerances as the verifier takes them (numpy values, Tolerance objects) group without trouble
    from gpu_tasks.tolerances import Tolerance

    looser = {"float32": {"max_abs": np.float32(1e-3), "max_rel": 1e-2, "rel_l2": 1e-4}}
    as_objects = {"float32": Tolerance(1e-3, 1e-2, 1e-4)}
    requests = [pair_request(MM, MM, MM_SIG, tolerances=t) for t in (looser, as_objects, looser, None)]
    assert pair_groups(requests) == [[0, 2], [1], [3]]
