"""Timing: interleaved medians with spread and fingerprint; one timing at a time per machine."""
from __future__ import annotations

import threading
import time

import pytest

from gpu_tasks.machine_lock import timing_lock
from gpu_tasks.timing import Timing, measure_interleaved, time_pair
from tests.gpu_tasks.conftest import MATMUL, MATMUL_REORDERED, MATMUL_SIG


def test_time_pair_reports_medians_speedup_spread_and_fingerprint(tmp_path):
    t = time_pair(MATMUL, MATMUL_REORDERED, MATMUL_SIG, repeats=3, min_repeat_ms=1,
                  lock_path=str(tmp_path / "lock"))
    assert t.status == "ok", t.error
    assert t.before_us > 0 and t.after_us > 0 and t.speedup == pytest.approx(t.before_us / t.after_us)
    assert t.spread >= 0 and t.repeats == 3
    assert set(t.fingerprint) == {"cpu_model", "logical_cpus", "tvm_threads", "tvm_version", "target", "id"}
    assert '"kind":"llvm"' in t.fingerprint["target"]


def test_timing_failures_carry_the_status():
    t = time_pair(MATMUL, "not leir", MATMUL_SIG)
    assert t.status == "invalid" and t.error.startswith("after:") and t.to_json()["before_us"] is None


def test_measurements_interleave_in_abba_order():
    calls = []

    class Evaluator:
        def __init__(self, name):
            self.name = name

        def __call__(self):
            calls.append(self.name)
            return type("Result", (), {"mean": 1e-6})()

    samples = measure_interleaved([Evaluator("b"), Evaluator("a")], [[], []], repeats=4)
    assert calls == ["b", "a"] + ["b", "a", "a", "b", "b", "a", "a", "b"]  # warm-up, then rounds
    assert samples == [[1e-6] * 4, [1e-6] * 4]


def test_one_timing_at_a_time_per_machine(tmp_path):
    lock = tmp_path / "timing.lock"
    held = threading.Event()
    release = threading.Event()

    def holder():
        with timing_lock(lock):
            held.set()
            release.wait(5)

    thread = threading.Thread(target=holder)
    thread.start()
    held.wait(5)
    with pytest.raises(TimeoutError):
        with timing_lock(lock, timeout_s=0.2):
            pass
    release.set()
    thread.join()
    start = time.monotonic()
    with timing_lock(lock, timeout_s=1.0) as waited:
        assert waited < 1.0
    assert time.monotonic() - start < 1.0


def test_flagging_large_speedups():
    from gpu_tasks.timing import TimingRequest, summarize

    request = TimingRequest("", "", "", flag_speedup=10.0, repeats=3)
    flagged = summarize([[1e-3] * 3, [1e-5] * 3], request, {})
    assert isinstance(flagged, Timing) and flagged.flagged and flagged.speedup == pytest.approx(100.0)
    assert not summarize([[1e-3] * 3, [5e-4] * 3], request, {}).flagged


@pytest.mark.skipif(__import__("tvm").cuda(0).exist, reason="a GPU is present: CUDA programs run here")
def test_timing_cuda_without_a_gpu_is_a_runtime_error():
    t = time_pair(MATMUL, MATMUL, MATMUL_SIG, target="cuda")
    assert t.status in ("runtime_error", "build_error") and t.error


def test_time_pair_in_the_tensorir_form(tmp_path):
    from gpu_tasks.cache import TIMING_CACHE

    t = time_pair(MATMUL, MATMUL_REORDERED, MATMUL_SIG, repeats=3, min_repeat_ms=1, form="tensorir",
                  lock_path=str(tmp_path / "lock"))
    assert t.status == "ok", t.error
    built = [func.script() for func, _ in TIMING_CACHE._by_hash.values()]
    assert sum("T.sblock(" in s for s in built) >= 2


def test_in_process_timing_gets_the_thread_count_of_the_timing_workers():
    """MetaSchedule's same-session comparison times in the calling process: its TVM pool must have as
    many threads as the timing workers (TVM alone takes half the logical CPUs on x86)."""
    import subprocess
    import sys

    code = ("import os; os.environ.pop('TVM_NUM_THREADS', None)\n"
            "from gpu_tasks.threads import logical_cpus, tvm_threads_here\n"
            "print(tvm_threads_here(logical_cpus()), logical_cpus())")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    got, wanted = out.stdout.split()[-2:]
    assert got == wanted  # on this 2-core x86 machine TVM alone would take 1


def test_a_named_machine_has_a_fingerprint_of_its_own(monkeypatch):
    """Two processes of one host standing for two machines (`STEPTP_MACHINE`) time under two ids;
    unnamed, the fingerprint is the CPU facts alone, as every earlier timing's."""
    from gpu_tasks.fingerprint import MACHINE_NAME_ENV, machine_fingerprint

    monkeypatch.delenv(MACHINE_NAME_ENV, raising=False)
    plain = machine_fingerprint("llvm")
    assert "machine" not in plain
    monkeypatch.setenv(MACHINE_NAME_ENV, "worker-b")
    named = machine_fingerprint("llvm")
    assert named["machine"] == "worker-b" and named["id"] != plain["id"]
    assert {k: v for k, v in named.items() if k not in ("machine", "id")} == {k: v for k, v in plain.items() if k != "id"}
    monkeypatch.setenv(MACHINE_NAME_ENV, "worker-c")
    assert machine_fingerprint("llvm")["id"] != named["id"]
