"""benchmarks/fma_peak.py measures the FMA ceiling that bench_search compares matmul and conv2d
kernels against; the shares it reports follow from the multiply-add count, the time and the peak."""
from __future__ import annotations

import shutil
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "benchmarks"))

import bench_search  # noqa: E402
import fma_peak  # noqa: E402


@pytest.mark.skipif(shutil.which("gcc") is None, reason="the peak loop is compiled by gcc")
def test_the_peak_loop_compiles_runs_and_reports_a_rate():
    rate = fma_peak.measure_gmacs(1)
    assert rate is not None and rate > 0.5   # any CPU of this century retires more than 0.5 G FMA/s


def test_no_compiler_means_no_peak(monkeypatch):
    monkeypatch.setattr(fma_peak.shutil, "which", lambda _name: None)
    assert fma_peak.measure_gmacs(2) is None


def test_shares_are_multiply_adds_per_second_over_the_peak():
    # 256^3 multiply-adds in 67.108864 µs are 250 G/s: the whole of a 250 G/s peak, half of 500
    shares = bench_search.peak_shares("matmul_256", 500.0, 67.108864, 2 * 67.108864, None)
    assert shares["best_peak_share"] == 0.5 and shares["metaschedule_peak_share"] == 0.25
    assert shares["own_best_peak_share"] is None and shares["multiply_adds"] == 256 ** 3


def test_memory_bound_programs_and_an_unknown_peak_get_no_share():
    assert bench_search.peak_shares("softmax_64x512", 500.0, 10.0, 10.0, 10.0) == {}
    assert bench_search.peak_shares("matmul_128", None, 10.0, 10.0, 10.0) == {}


def test_the_table_puts_torch_compile_beside_eager_and_metaschedule():
    row = {"program": "matmul_128", "form": "B", "session_naive_us": 3000.0, "drivers": {"beam": {
        "best_us": 50.0, "speedup": 60.0}}, "metaschedule_us": 40.0, "session_best_us": 50.0,
        "torch_eager_1t_us": 55.0, "torch_eager_all_us": 45.0, "torch_eager_us": 45.0, "torch_compile_us": 100.0,
        "torch_compile_max_autotune_us": 80.0, "torch_compile_best_us": 80.0, "metaschedule_over_best_search": 0.8}
    table = bench_search.markdown_table([row], ["beam"])
    assert "torch.compile µs (default / max-autotune)" in table.splitlines()[0]
    cells = [c.strip() for c in table.splitlines()[-1].split("|")]
    # ... | eager 1 thread / all cores | compile default / max-autotune | MS / best | eager / best | compile / best
    assert cells[7:12] == ["55.0 / 45.0", "100.0 / 80.0", "0.80", "0.90 (own session 0.90)", "1.60"]
