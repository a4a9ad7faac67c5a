"""The generate stage's shard: translation pipelined with verification gives the rows that translating
and verifying each instance in turn gives; flows.tasks.prepared_ahead, which pipelines it."""
from __future__ import annotations

import json
import threading
from dataclasses import replace

import pytest

import flows.generate as generate
from flows.config import load_params, own_error_factor
from flows.tasks import prepared_ahead
from gpu_tasks.pool import WorkerPool


@pytest.fixture(scope="module")
def pool():
    p = WorkerPool(workers=2, timeout_s=60)
    yield p
    p.close()


def one_at_a_time(shard, params) -> dict[str, tuple]:
    """{program_id: (status, max_abs_err)}: each instance translated, then verified, before the next."""
    from gpu_tasks.verify import verify_against_reference
    from leir.canon import program_id
    from leir.frontend import translate
    from workloads.sampling import build

    out = {}
    for name, pinned in shard.items:
        w = generate._workload(name)
        for base in generate.instances_of(w, params, pinned):
            for dtype in generate.program_dtypes(params.profile, w, pinned):
                inst = replace(base, dtype=dtype)
                tr = translate(*build(w, inst), dtype=dtype)
                v = verify_against_reference(tr.program, tr.signature, tr.reference, params.verify["target"],
                                             int(params.verify["draws"]), params.seed,
                                             tolerances=params.verify["tolerance"], own_fn=tr.reference_in_dtype,
                                             own_factor=own_error_factor(params))
                out.setdefault(program_id(tr.program, tr.signature), (v.status, v.to_json()["max_abs_err"]))
    return out


def test_a_shard_verified_in_chunks_ahead_of_its_translation_gives_the_rows_of_one_at_a_time(pool, monkeypatch):
    params = load_params()
    shard = next(s for s in generate.plan_generate(params) if s.name == "softmax")  # 5 instances, 2 dtypes
    monkeypatch.setattr(generate, "GENERATE_CHUNK", 2)  # three chunks, the last one short
    rows = generate.generate_shard(shard, params, pool)
    assert [r["program_id"] for r in rows] == sorted(r["program_id"] for r in rows)
    assert {r["program_id"]: (r["verification_status"], r["max_abs_err"]) for r in rows} == one_at_a_time(shard, params)
    dtypes = {d for name, pinned in shard.items for d in generate.program_dtypes(params.profile,
                                                                                generate._workload(name), pinned)}
    assert {r["dtype"] for r in rows} == dtypes and len(dtypes) > 1
    assert all(json.loads(r["shape_params"]) and r["family"] == "softmax" for r in rows)
    monkeypatch.setattr(generate, "GENERATE_CHUNK", 8)  # one chunk, verified here without a pool: the same rows
    assert generate.generate_shard(shard, params, None) == rows


def test_the_next_chunk_is_prepared_while_the_caller_works_on_the_current_one():
    started = {k: threading.Event() for k in range(3)}

    def prepare(chunk: int) -> int:
        started[chunk].set()
        return chunk * 10

    got = []
    for value in prepared_ahead([0, 1, 2], prepare):
        got.append(value)
        if value < 20:  # while the caller holds this chunk, the next one is being prepared
            assert started[value // 10 + 1].wait(timeout=10)
    assert got == [0, 10, 20]
    assert list(prepared_ahead([0, 1, 2], prepare, ahead=False)) == [0, 10, 20]
    assert list(prepared_ahead([], prepare)) == []
