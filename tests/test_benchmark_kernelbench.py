"""benchmarks/bench_kernelbench.py: which problems a run takes, the size it picks, what it counts as
correct and fast, and one problem end to end in its own process (slow)."""
from __future__ import annotations

import argparse
import json
import math
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "benchmarks"))

import bench_kernelbench as kb  # noqa: E402

DATA = ROOT / "tests" / "data" / "kernelbench"


def _touch(folder: Path, *names: str) -> None:
    folder.mkdir(parents=True, exist_ok=True)
    for n in names:
        (folder / n).write_text("")


def test_a_checkout_is_read_by_level_and_by_problem_number(tmp_path):
    _touch(tmp_path / "KernelBench" / "level1", "10_b.py", "2_a.py", "1_c.py", "notes.py")
    _touch(tmp_path / "KernelBench" / "level2", "3_d.py")
    found = kb.problem_files(tmp_path, [1, 2])
    assert [(lv, f.name) for lv, f in found] == [("1", "1_c.py"), ("1", "2_a.py"), ("1", "10_b.py"), ("2", "3_d.py")]
    # a level folder given directly, and a flat folder of problem files
    assert [f.name for _, f in kb.problem_files(tmp_path / "KernelBench", [2])] == ["3_d.py"]
    flat = kb.problem_files(tmp_path / "KernelBench" / "level1", [1, 2])
    assert [(lv, f.name) for lv, f in flat] == [("level1", "1_c.py"), ("level1", "2_a.py"), ("level1", "10_b.py")]


def test_quick_runs_take_numbered_problems_then_every_nth_of_each_level():
    files = [("1", Path(f"{i}_x.py")) for i in range(1, 11)] + [("2", Path(f"{i}_y.py")) for i in range(1, 6)]
    assert kb.parse_numbers("1-3,7") == {1, 2, 3, 7}
    with pytest.raises(argparse.ArgumentTypeError):
        kb.parse_numbers("1-a")
    every = kb.selected(files, None, 4)
    assert [(lv, f.name) for lv, f in every] == [("1", "1_x.py"), ("1", "5_x.py"), ("1", "9_x.py"),
                                                 ("2", "1_y.py"), ("2", "5_y.py")]
    assert [f.name for _, f in kb.selected(files, {2, 3, 4}, 2)] == ["2_x.py", "4_x.py", "2_y.py", "4_y.py"]


def test_fast_1_counts_every_problem_and_the_means_only_the_correct_ones():
    rows = [kb.ratios({"level": "1", "problem": "a", "correct": True, "translated": True, "speedup": 4.0,
                       "best_us": 10.0, "torch_eager_us": 20.0, "torch_compile_best_us": 5.0}),
            kb.ratios({"level": "1", "problem": "b", "correct": True, "translated": True, "speedup": 9.0,
                       "best_us": 10.0, "torch_eager_us": 5.0, "torch_compile_best_us": 80.0}),
            {"level": "1", "problem": "c", "correct": False, "error": "search: boom"},
            kb.ratios({"level": "1", "problem": "tiny", "correct": True, "translated": True, "speedup": 2.0,
                       "best_us": 1.0, "torch_eager_us": 30.0, "eager_under_floor": True}),
            kb.ratios({"level": "2", "problem": "d", "correct": False, "translated": True, "best_us": 1.0,
                       "torch_eager_us": 100.0, "error": "best state does not match PyTorch"})]
    s = kb.summary(rows)
    # eager under the floor: counted, never compared (its 30x over eager is PyTorch's cost per call)
    assert s["1"]["problems"] == 4 and s["1"]["compared"] == 3 and s["1"]["eager_under_floor"] == 1
    assert s["1"]["correct"] == 3 and s["1"]["translated"] == 3
    assert s["1"]["fast_1_eager"] == pytest.approx(1 / 3) and s["1"]["fast_1_compile"] == pytest.approx(1 / 3)
    assert s["1"]["geomean_over_eager"] == pytest.approx(1.0)          # sqrt(2 x 0.5)
    assert s["1"]["geomean_over_compile"] == pytest.approx(2.0)        # sqrt(0.5 x 8)
    assert s["1"]["geomean_over_naive"] == pytest.approx((4.0 * 9.0 * 2.0) ** (1 / 3))
    # a wrong best state is never fast, however fast it is
    assert s["2"]["fast_1_eager"] == 0 and s["2"]["geomean_over_eager"] is None
    assert s["all"]["problems"] == 5 and set(s["all"]["failures"]) == {"c", "d"}


def test_the_size_is_the_largest_instance_within_the_statement_cap_counted_without_allocating():
    from gpu_tasks.guard import iteration_count

    matmul = DATA / "1_Square_matrix_multiplication_4096.py"   # level 1 problem 1 at its own size, 2^36 statements
    problem, tr, limit = kb.choose_size(matmul, 2**18)
    assert iteration_count(tr.program) == 2**18 and problem.shrunk["N"] == 64 and limit in kb.SHRINK_LADDER
    # a cap below even the smallest rung: the smallest rung (every input at most 2^10 elements: N = 32)
    problem, tr, limit = kb.choose_size(matmul, 10)
    assert limit == kb.SHRINK_LADDER[-1] and problem.shrunk["N"] == 32
    # the file's own sizes when they fit
    problem, tr, limit = kb.choose_size(DATA / "19_ReLU.py", 2**40)
    assert limit is None and not problem.shrunk


def test_a_hanging_problem_is_its_own_row_and_the_run_goes_on(tmp_path):
    hang = tmp_path / "7_hang.py"
    hang.write_text("import time\ntime.sleep(60)\n")
    args = argparse.Namespace(max_statements=2**20, budget=2, driver="greedy", wall=60.0, min_run_time=0.05,
                              prior="", compile_modes=[], timeout=3.0, memory_gb=0,
                              eager_floor_us=50.0)
    row = kb.in_own_process("x", hang, args)
    assert row["failed_at"] == "timeout" and not row["correct"] and row["level"] == "x"


@pytest.mark.slow
def test_one_problem_end_to_end_correct_and_timed_against_eager_and_compile(tmp_path):
    out = tmp_path / "rows.jsonl"
    cmd = [sys.executable, str(ROOT / "benchmarks" / "bench_kernelbench.py"), str(DATA), "--problems", "19",
           "--budget", "3", "--min-run-time", "0.1", "--prior", "", "--out", str(out), "--plot", str(tmp_path / "p.png")]
    done = subprocess.run(cmd, capture_output=True, text=True, timeout=900)
    assert done.returncode == 0, done.stderr[-2000:]
    (row,) = [json.loads(line) for line in out.read_text().splitlines()]
    assert row["correct"] and row["translated"], row.get("error")
    assert row["states"] >= 1 and row["naive_us"] > 0 and row["best_us"] <= row["naive_us"] * 1.5
    assert row["torch_eager_us"] > 0 and row["torch_compile_us"] > 0 and row["torch_compile_s"] > 0
    assert math.isclose(row["over_eager"], row["torch_eager_us"] / row["best_us"])
    assert "| kernelbench | 1 | 1 | 1 |" in done.stdout and (tmp_path / "p.png").stat().st_size > 0
    # a rerun with the same rows file skips the problem
    again = subprocess.run(cmd, capture_output=True, text=True, timeout=300)
    assert "1 already in" in again.stdout and len(out.read_text().splitlines()) == 1


def test_a_problem_whose_pytorch_output_is_zero_on_every_draw_is_named_degenerate_not_mistranslated():
    """80_Gemm_Max_Subtract_GELU subtracts a one-element mean from itself: PyTorch's output is zero on
    every draw, so no verification can judge the translation; the row says so instead of blaming it."""
    import numpy as np

    from gpu_tasks.verify import verify_against_reference

    signature = {"tensors": [{"name": "A", "shape": [4, 8], "dtype": "float32", "role": "input"},
                             {"name": "D", "shape": [4, 8], "dtype": "float32", "role": "output"}]}
    program = "B^{4}_{tx=0}L^{8}_{a=0}[D^{f32,g}_{tx,a}=A^{f32,g}_{tx,a}-A^{f32,g}_{tx,a};];"
    zero = verify_against_reference(program, signature, lambda inputs: np.zeros((4, 8)))
    assert zero.status == "invalid" and kb.reference_degenerate(zero)
    wrong = verify_against_reference(program, signature, lambda inputs: inputs["A"])
    assert wrong.status == "mismatch" and not kb.reference_degenerate(wrong)
