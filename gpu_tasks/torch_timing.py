"""PyTorch references timed as a user would configure them: eager and `torch.compile`, each with one
thread and with every core, the faster kept.

Why both thread counts: PyTorch's OpenMP region with one thread per core waits at every barrier for
the slowest thread, and a thread that another busy process has descheduled costs a scheduler slice
(a softmax timed 11.7 µs alone and 4,594 µs with one other job running on a 2-core machine). On one
thread nothing waits. A user on a busy machine sets the thread count; the reference does the same.

Each figure is `torch.utils.benchmark`'s `blocked_autorange` median with its run count and spread
(interquartile range over the median). The compiled module is built with one compile thread (no pool
of compile workers left running beside the timing), its compile time is reported, and it is checked
against eager on the same inputs before it is timed. `process_threads` is the timing process's
thread count before it times: what shares its cores from inside.
"""
from __future__ import annotations

import os
import time
from dataclasses import asdict, dataclass

COMPILE_MODES = ("default", "max-autotune")


@dataclass(frozen=True)
class TorchTime:
    us: float                    # median µs per call with the faster thread count
    threads: int                 # that thread count
    runs: int                    # timed blocks (each of `number` calls)
    number: int                  # calls per block
    spread: float                # interquartile range / median
    us_by_threads: dict          # {threads: median µs}

    def to_row(self, prefix: str) -> dict:
        row = asdict(self)
        return {f"{prefix}_{k}" if k != "us" else f"{prefix}_us": v for k, v in row.items()}


def process_threads() -> int:
    """Threads of this process (Linux: /proc/self/status; elsewhere the Python threads)."""
    try:
        with open("/proc/self/status") as f:
            return next(int(line.split()[1]) for line in f if line.startswith("Threads:"))
    except (OSError, StopIteration, ValueError):
        import threading

        return threading.active_count()


def time_callable(fn, inputs, min_run_time: float = 0.5, cores: int | None = None) -> TorchTime:
    """`fn(*inputs)` timed with one thread and with `cores` (every core) threads; the faster kept."""
    import torch
    from torch.utils import benchmark

    cores = cores or max(1, os.cpu_count() or 1)
    found = {}
    with torch.no_grad():
        for threads in sorted({1, cores}):
            timer = benchmark.Timer(stmt="f(*x)", globals={"f": fn, "x": inputs}, num_threads=threads)
            found[threads] = timer.blocked_autorange(min_run_time=min_run_time)
    threads = min(found, key=lambda t: found[t].median)
    m = found[threads]
    return TorchTime(us=float(m.median * 1e6), threads=threads, runs=len(m.times), number=int(m.number_per_run),
                     spread=float(m.iqr / m.median) if m.median > 0 else 0.0,
                     us_by_threads={str(t): round(float(v.median * 1e6), 3) for t, v in sorted(found.items())})


def compiled(module, inputs, mode: str):
    """(`torch.compile(module, mode=mode)` after its first call, the seconds that took): compiled with
    one compile thread, and refused (ValueError) when its output differs from eager's."""
    import torch
    import torch._inductor.config as inductor

    inductor.compile_threads = 1  # no compile-worker pool beside the timing
    torch._dynamo.reset()
    start = time.perf_counter()
    fn = torch.compile(module, mode=None if mode == "default" else mode)
    with torch.no_grad():
        got = fn(*inputs)
        seconds = time.perf_counter() - start
        want = module(*inputs)
    if not torch.allclose(got, want, rtol=1e-3, atol=1e-4):
        raise ValueError(f"torch.compile(mode={mode!r}) differs from eager: max error "
                         f"{(got - want).abs().max().item():.3g}")
    return fn, seconds


def reference_times(module, inputs, modes=COMPILE_MODES, min_run_time: float = 0.5) -> dict:
    """Eager first (before anything is compiled in this process), then each compile mode: the row's
    columns `torch_eager_*`, `torch_compile_*` (default mode) and `torch_compile_max_autotune_*`,
    with `*_s` the compile time; a mode that fails leaves its figures out and says why in
    `torch_errors`."""
    row = {"torch_process_threads": process_threads(),
           **time_callable(module, inputs, min_run_time).to_row("torch_eager")}
    errors = []
    for mode in modes:
        prefix = "torch_compile" if mode == "default" else "torch_compile_" + mode.replace("-", "_")
        try:
            fn, seconds = compiled(module, inputs, mode)
            row.update(time_callable(fn, inputs, min_run_time).to_row(prefix))
            row[f"{prefix}_s"] = round(seconds, 2)
        except Exception as e:  # reported in the row, never hidden
            errors.append(f"{mode}: {type(e).__name__}: {str(e).strip().splitlines()[-1] if str(e).strip() else ''}")
    row["torch_errors"] = "; ".join(errors) or None
    return row
