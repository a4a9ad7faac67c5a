"""The worker pool: order, crash and hang isolation, replacement, affinity, and verification through it.
One pool serves every test (the `pool` fixture); each test leaves it working for the next."""
from __future__ import annotations

import os
from pathlib import Path

from gpu_tasks import testing
from gpu_tasks.jobs import cache_stats_job, verify_pair_job
from gpu_tasks.pool import Job, JobFailure
from gpu_tasks.verify import as_verification, pair_request, verify_against_reference, verify_pair, verify_pairs
from tests.conftest import EXAMPLES
from tests.gpu_tasks.conftest import (
    MATMUL,
    MATMUL_REORDERED,
    MATMUL_SIG,
    MATMUL_VARIANTS,
    MATMUL_WRONG,
)


def test_results_come_back_in_input_order(pool):
    jobs = [Job(testing.sleep_for, (0.3,)), Job(testing.echo, ("fast",)), Job(testing.echo, (3,))]
    assert pool.run(jobs) == [0.3, "fast", 3]


def test_a_segfault_is_a_crash_and_the_pool_goes_on(pool):
    replaced = pool.replacements
    results = pool.run([Job(testing.echo, (1,)), Job(testing.segfault), Job(testing.echo, (2,))])
    assert results[0] == 1 and results[2] == 2
    assert results[1] == JobFailure("crash", "the worker died from signal SIGSEGV")
    assert pool.replacements == replaced + 1
    assert len(set(pool.broadcast(testing.worker_pid))) == pool.size


def test_an_abrupt_exit_is_a_crash(pool):
    assert pool.run([Job(testing.exit_abruptly, (7,))]) == [JobFailure("crash", "the worker exited with status 7")]
    assert pool.run([Job(testing.echo, ("alive",))]) == ["alive"]


def test_a_hung_job_times_out_and_the_pool_goes_on(pool):
    results = pool.run([Job(testing.sleep_for, (60,), timeout_s=0.5), Job(testing.echo, ("next",))])
    assert isinstance(results[0], JobFailure) and results[0].kind == "timeout"
    assert results[1] == "next"
    assert os.getpid() not in pool.broadcast(testing.worker_pid)


def test_a_python_error_in_a_job_is_reported_not_raised(pool):
    [result] = pool.run([Job(testing.raise_error, ("boom",))])
    where = f"{Path(testing.__file__).resolve()}:"  # the message says where it raised
    assert result.kind == "error" and result.message.startswith(f"ValueError: boom (at {where}")


def test_pool_failures_become_verification_statuses():
    assert as_verification(JobFailure("crash", "x")).status == "crash"
    assert as_verification(JobFailure("timeout", "x")).status == "timeout"
    assert as_verification(JobFailure("error", "x")).status == "runtime_error"


def test_jobs_with_one_affinity_key_stay_on_one_worker(pool):
    jobs = [Job(testing.worker_pid, affinity="k1") for _ in range(6)] + [Job(testing.worker_pid, affinity="k2")]
    pids = pool.run(jobs)
    assert len(set(pids[:6])) <= 2 and pids[6] in pool.broadcast(testing.worker_pid)


def test_verification_through_the_pool_matches_in_process(pool):
    requests = [pair_request(MATMUL, after, MATMUL_SIG) for after in (MATMUL, MATMUL_REORDERED, MATMUL_WRONG)]
    assert [v.status for v in verify_pairs(requests, pool)] == ["exact", "exact", "mismatch"]
    assert verify_pair(MATMUL, "not leir", MATMUL_SIG, pool=pool).status == "invalid"


def test_against_reference_through_the_pool(pool):
    import torch

    ex = EXAMPLES[0]
    v = verify_against_reference(ex["leir"], ex["signature"],
                                 lambda i: torch.from_numpy(i["A"]) @ torch.from_numpy(i["C"]), pool=pool)
    assert v.status in ("exact", "close")


def test_the_pool_builds_each_original_at_most_once_per_worker(pool):
    """Pair by pair (a model's answers in the harness; a group's pairs when its worker died)."""
    def totals():
        stats = pool.broadcast(cache_stats_job)
        return sum(s["builds"] for s in stats), sum(s["hits"] for s in stats)

    builds0, hits0 = totals()
    requests = [pair_request(MATMUL, after, MATMUL_SIG, seed=11) for after in MATMUL_VARIANTS]
    jobs = [Job(verify_pair_job, (r,), affinity="matmul") for r in requests]
    assert all(as_verification(v).passed for v in pool.run(jobs))
    builds1, hits1 = totals()
    n = len(MATMUL_VARIANTS)
    # One build lookup per transformed side; the original's outputs on the draws are computed once per
    # worker (gpu_tasks.jobs._ArrayMemo), so it is looked up (and built) at most once per worker.
    lookups = (builds1 - builds0) + (hits1 - hits0)
    assert n + 1 <= lookups <= n + pool.size


def test_workers_are_recycled_after_a_number_of_jobs():
    from gpu_tasks.pool import WorkerPool

    with WorkerPool(workers=1, max_jobs_per_worker=2) as small:
        pids = small.run([Job(testing.worker_pid) for _ in range(5)])
        assert pids[0] == pids[1] != pids[2] == pids[3] != pids[4]
        assert small.replacements == 0


def test_workers_run_with_the_requested_thread_count(pool):
    assert pool.run([Job(testing.tvm_thread_count)]) == [1]


def test_a_job_that_cannot_be_sent_is_reported(pool):
    results = pool.run([Job(testing.echo, (lambda: 0,)), Job(testing.echo, ("after",))])
    assert results[0].kind == "error" and "could not be sent" in results[0].message
    assert results[1] == "after"


def test_workers_start_without_pytorch(pool):
    # tvm_ffi would import it (seconds per pool start); workers never need it.
    assert pool.run([Job(testing.torch_importable)]) == [False]


def test_many_originals_against_their_references(pool):
    import torch

    from gpu_tasks.verify import verify_against_references

    def reference(expression):
        return lambda inputs: eval(expression, {"torch": torch}, {k: torch.from_numpy(v) for k, v in inputs.items()})

    items = [(ex["leir"], ex["signature"], reference(ex["torch"])) for ex in EXAMPLES[:4]]
    items.append(("not leir", EXAMPLES[0]["signature"], reference("A")))
    results = verify_against_references(items, pool)
    assert [v.passed for v in results] == [True] * 4 + [False] and results[-1].status == "invalid"


def test_a_consumer_that_stops_early_leaves_the_pool_clean(pool):
    results = pool.imap([Job(testing.echo, (1,)), Job(testing.sleep_for, (30,)), Job(testing.sleep_for, (30,))])
    assert next(results) == (0, 1)
    results.close()  # the sleeping workers are replaced, not waited for
    assert pool.run([Job(testing.echo, ("clean",)), Job(testing.echo, ("slate",))]) == ["clean", "slate"]


# --- issue 28: a fresh forked process per job, and a memory limit ------------------------------------

def test_a_job_past_the_memory_limit_is_killed_and_reported():
    from gpu_tasks.pool import WorkerPool

    with WorkerPool(workers=1, memory_mb=64, timeout_s=60) as small:
        results = small.run([Job(testing.hold_memory, (512, 30.0)), Job(testing.hold_memory, (8, 0.0)),
                             Job(testing.echo, ("after",))])
    assert results[0].kind == "memory" and "64 MiB" in results[0].message
    assert results[1:] == [8, "after"]


def test_forked_workers_start_fresh_for_every_job():
    """start_method="fork" with one job per worker: no job sees what an earlier job changed in its own
    process, and crashes are reported with their exit codes."""
    import json

    from gpu_tasks.pool import WorkerPool

    with WorkerPool(workers=1, start_method="fork", max_jobs_per_worker=1) as fresh:
        assert fresh.run([Job(testing.mutate_module_state) for _ in range(3)]) == ["clean"] * 3
        pids = fresh.run([Job(testing.worker_pid) for _ in range(3)])
        crash = fresh.run([Job(testing.segfault), Job(testing.exit_abruptly, (5,))])
    assert len(set(pids)) == 3 and os.getpid() not in pids
    assert [(f.kind, f.exitcode) for f in crash] == [("crash", -11), ("crash", 5)]
    assert not getattr(json, "_steptp_patched", False)  # the caller's own modules are untouched
