"""PyTorch references: the timing process keeps its freed memory, as a caching allocator would."""
from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from gpu_tasks.torch_timing import CACHING_MALLOC_ENV, allocator, caching_malloc

# a 4096x4096 float32 output (64 MiB) is past glibc's largest mmap threshold (32 MiB)
_ELEMENTWISE = """
import json, torch
from gpu_tasks.torch_timing import allocator, time_callable
x = torch.ones(4096, 4096)
t = time_callable(lambda a: a * 3.0, (x,), min_run_time=0.05, cores=1)
print(json.dumps({"allocator": allocator(), "faults": t.faults_per_call, "us": t.us}))
"""


def _timed(env: dict) -> dict:
    done = subprocess.run([sys.executable, "-c", _ELEMENTWISE], capture_output=True, text=True, check=True,
                          env=env, cwd=os.getcwd())
    return json.loads(done.stdout.splitlines()[-1])


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="glibc's tunables")
def test_with_freed_blocks_kept_a_large_eager_output_is_not_faulted_in_at_every_call():
    plain = {k: v for k, v in os.environ.items() if k not in CACHING_MALLOC_ENV}
    default, kept = _timed(plain), _timed({**plain, **CACHING_MALLOC_ENV})
    assert default["allocator"] == "glibc default" and kept["allocator"] == "glibc, freed blocks kept"
    assert default["faults"] > 10_000  # every 4 KiB page of the 64 MiB output, at every call
    assert kept["faults"] < 0.1 * default["faults"], (default, kept)


def test_caching_malloc_sets_the_environment_for_the_block_only(monkeypatch):
    monkeypatch.setenv("MALLOC_MMAP_MAX_", "7")
    monkeypatch.delenv("MALLOC_TRIM_THRESHOLD_", raising=False)
    with caching_malloc():
        assert allocator() == "glibc, freed blocks kept"
    assert os.environ["MALLOC_MMAP_MAX_"] == "7" and "MALLOC_TRIM_THRESHOLD_" not in os.environ
    assert allocator() == "glibc default"


def test_a_re_time_repeats_the_thread_count_each_figure_kept_and_only_the_figures_it_names():
    import torch

    from gpu_tasks.torch_timing import kept_threads, reference_rows

    module, inputs = torch.nn.Linear(64, 64), (torch.ones(8, 64),)
    first = reference_rows({"k": (module, inputs)}, (), min_run_time=0.05)
    assert sorted(first["k"]["torch_eager_us_by_threads"]) == sorted({"1", str(os.cpu_count())})  # both counts
    kept = kept_threads({"k": {**first["k"], "torch_eager_threads": 1}, "bad": "ValueError: no module"})
    assert kept == {"k": {"torch_eager": 1}}
    again = reference_rows({"k": (module, inputs)}, ("default",), kept=kept)
    assert list(again["k"]["torch_eager_us_by_threads"]) == ["1"] and again["k"]["torch_eager_threads"] == 1
    assert again["k"]["torch_eager_runs"] >= 5 and again["k"]["torch_eager_us"] > 0
    assert "torch_compile_us" not in again["k"]  # the default mode kept no figure: not compiled, not re-timed
    only_compiled = reference_rows({"k": (module, inputs)}, (), kept={"k": {"torch_compile": 1}})
    assert "torch_eager_us" not in only_compiled["k"] and only_compiled["k"]["torch_errors"] is None  # eager not named


def test_figures_take_turns_window_by_window_and_each_keeps_its_fastest_window():
    from gpu_tasks.torch_timing import WINDOWS, time_callables

    log = []

    def named(name):
        def fn():
            if not log or log[-1] != name:
                log.append(name)
        return fn

    found = time_callables({"a": (named("a"), (), 1, 0.03), "b": (named("b"), (), 1, 0.03)})
    assert log == ["a", "b"] * WINDOWS  # a window of a, one of b, and again: never all of a's at once
    for t in found.values():
        assert len(t.us_by_window) == WINDOWS and t.threads == 1 and list(t.us_by_threads) == ["1"]
        assert abs(t.us - min(t.us_by_window)) < 1e-3 and t.runs >= 5 * WINDOWS


def test_a_callable_that_fails_names_its_error_and_leaves_the_others_timed():
    from gpu_tasks.torch_timing import time_callables

    def bad():
        raise ZeroDivisionError("no")

    found = time_callables({"ok": (lambda: None, (), 1, 0.01), "bad": (bad, (), 1, 0.01)})
    assert found["bad"] == "ZeroDivisionError: no" and found["ok"].us > 0


def test_each_compiled_figure_is_timed_in_its_windows_right_after_its_compilation():
    import torch

    from gpu_tasks.torch_timing import WINDOWS, reference_rows

    class Scale(torch.nn.Module):
        def forward(self, x):
            return torch.relu(x) * 2.0

    built = {"small": (Scale(), (torch.randn(4, 16),)), "large": (Scale(), (torch.randn(8, 32),))}
    rows = reference_rows(built, ("default",), min_run_time=0.03)
    for row in rows.values():
        assert row["torch_errors"] is None and row["torch_compile_us"] > 0 and row["torch_compile_s"] > 0
        assert len(row["torch_compile_us_by_window"]) == WINDOWS == len(row["torch_eager_us_by_window"])
        assert abs(row["torch_compile_us"] - min(row["torch_compile_us_by_window"])) < 1e-3
