"""PyTorch references timed as a user would configure them: eager and `torch.compile`, each with one
thread and with every core, the faster kept.

Why both thread counts: PyTorch's OpenMP region with one thread per core waits at every barrier for
the slowest thread, and a thread that another busy process has descheduled costs a scheduler slice
(a softmax timed 11.7 µs alone and 4,594 µs with one other job running on a 2-core machine). On one
thread nothing waits. A user on a busy machine sets the thread count; the reference does the same.

Each figure is the median of `torch.utils.benchmark` blocks of at least 10 ms of back-to-back calls,
with the block count and the spread (interquartile range over the median). The compiled module is
built with one compile thread (no pool of compile workers left running beside the timing), its
compile time is reported, and it is checked against eager on the same inputs before it is timed.
`process_threads` is the timing process's thread count before it times: what shares its cores from
inside.

The allocator: glibc hands a freed block of more than 32 MiB back to the system, so each eager call
of a large element-wise module writes its output into a fresh mapping whose every page faults (a
4096x4096 multiply: 16,384 faults and 15.9 ms a call, against 3.9 ms when the freed block is kept;
the TVM states it is compared with write into a kept output). A CPU user runs PyTorch with a caching
allocator (jemalloc or tcmalloc, as PyTorch's CPU tuning guide advises); CACHING_MALLOC_ENV makes
glibc keep its freed blocks to the same effect, and every figure records the page faults per call
(`*_faults_per_call`) and whether the setting was in force (`torch_allocator`). glibc reads it when
the process starts: it goes into the environment of the process that times (`caching_malloc`)."""
from __future__ import annotations

import math
import os
import statistics
import time
from contextlib import contextmanager
from dataclasses import asdict, dataclass

COMPILE_MODES = ("default", "max-autotune")

# glibc's tunables (read at start-up): nothing is mmap'd on its own, and no freed memory is trimmed
CACHING_MALLOC_ENV = {"MALLOC_MMAP_MAX_": "0", "MALLOC_TRIM_THRESHOLD_": str(2**40)}


def allocator() -> str:
    """The `torch_allocator` column: `glibc, freed blocks kept` when this process started with
    CACHING_MALLOC_ENV, else `glibc default` (each call may map and fault in its output afresh)."""
    kept = all(os.environ.get(k) == v for k, v in CACHING_MALLOC_ENV.items())
    return "glibc, freed blocks kept" if kept else "glibc default"


@contextmanager
def caching_malloc():
    """CACHING_MALLOC_ENV in this process's environment for the processes started inside the block
    (a spawned timing process reads it at start-up); the environment is restored after."""
    saved = {k: os.environ.get(k) for k in CACHING_MALLOC_ENV}
    os.environ.update(CACHING_MALLOC_ENV)
    try:
        yield
    finally:
        for k, v in saved.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v


def page_faults() -> int:
    """Minor page faults of this process so far (0 where `resource` is unavailable)."""
    try:
        import resource

        return resource.getrusage(resource.RUSAGE_SELF).ru_minflt
    except (ImportError, OSError):
        return 0


@dataclass(frozen=True)
class TorchTime:
    us: float                    # median µs per call with the faster thread count
    threads: int                 # that thread count
    runs: int                    # timed blocks (each of `number` calls)
    number: int                  # calls per block
    spread: float                # interquartile range / median
    us_by_threads: dict          # {threads: median µs}
    faults_per_call: float       # minor page faults per call over the kept thread count's blocks

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


BLOCK_S = 1e-2  # each timed block runs the call back to back for at least this long


def time_callable(fn, inputs, min_run_time: float = 0.5, cores: int | None = None,
                  at_threads: int | None = None) -> TorchTime:
    """`fn(*inputs)` timed with one thread and with `cores` (every core) threads; the faster kept.
    Blocks of at least BLOCK_S (a 100 µs call timed one at a time spreads by a third from jitter
    alone; 2 ms blocks on a noisy 2-core VM by a quarter), at least 5 of them and `min_run_time`
    seconds in all per thread count. `at_threads`: that thread count alone (a re-time of a figure
    whose thread count is known)."""
    import torch
    from torch.utils import benchmark

    cores = cores or max(1, os.cpu_count() or 1)
    found = {}
    before = torch.get_num_threads()
    try:
        with torch.no_grad():
            for threads in ([at_threads] if at_threads else sorted({1, cores})):
                # the thread count is set once for all the blocks: set per block (as Timer.timeit does
                # when it differs), resizing the OpenMP pool cost 0.7 ms a block
                torch.set_num_threads(threads)
                timer = benchmark.Timer(stmt="f(*x)", globals={"f": fn, "x": inputs}, num_threads=threads)
                timer.timeit(10)  # warms the call up (its first calls are several times slower)
                one = timer.timeit(10).median  # sizes the blocks
                number = max(1, math.ceil(BLOCK_S / max(one, 1e-9)))
                blocks, deadline, faults = [], time.perf_counter() + min_run_time, page_faults()
                while len(blocks) < 5 or time.perf_counter() < deadline:
                    blocks.append(timer.timeit(number).median)
                found[threads] = (number, blocks, (page_faults() - faults) / (number * len(blocks)))
    finally:
        torch.set_num_threads(before)
    medians = {t: statistics.median(b) for t, (_, b, _) in found.items()}
    threads = min(medians, key=medians.get)
    number, blocks, faults = found[threads]
    q1, _, q3 = statistics.quantiles(blocks, n=4) if len(blocks) > 1 else (blocks[0],) * 3
    return TorchTime(us=medians[threads] * 1e6, threads=threads, runs=len(blocks), number=number,
                     spread=(q3 - q1) / medians[threads] if medians[threads] > 0 else 0.0,
                     us_by_threads={str(t): round(v * 1e6, 3) for t, v in sorted(medians.items())},
                     faults_per_call=round(faults, 1))


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


def prefix_of(mode: str) -> str:
    """The columns' prefix of a reference: `torch_eager`, `torch_compile` (the default mode),
    `torch_compile_max_autotune`."""
    return "torch_eager" if mode == "eager" else "torch_compile" + ("" if mode == "default" else
                                                                     "_" + mode.replace("-", "_"))


# A re-time (`kept`) times each figure with the thread count its first time kept, for this long: one
# thread count and 0.15 s where the first time took two and 0.5 s each (its blocks still at least 5 of
# BLOCK_S). It checks the figure, it does not choose again.
RECHECK_RUN_TIME = 0.15


def reference_rows(built: dict, modes=COMPILE_MODES, min_run_time: float = 0.5,
                   kept: dict[str, dict[str, int]] | None = None) -> dict[str, dict | str]:
    """{key: the row's columns, or why there are none} for `built` ({key: (module, inputs)}): every
    eager figure first, before anything is compiled in this process (the threads a compilation
    leaves behind moved a conv2d's eager time by 1.5x), then each compile mode: `torch_eager_*`,
    `torch_compile_*` (default mode) and `torch_compile_max_autotune_*`, with `*_s` the compile time;
    a mode that fails leaves its figures out and says why in `torch_errors`.

    `kept` ({key: {prefix: threads}}, the thread counts a first time kept): a re-time of those
    figures, each with its kept thread count alone for RECHECK_RUN_TIME seconds; a figure not in
    `kept` is not re-timed."""
    out: dict[str, dict | str] = {}
    for key, (module, inputs) in built.items():
        try:
            out[key] = eager_times(module, inputs, min_run_time, threads_of(kept, key, "eager"))
        except Exception as e:  # reported, never hidden
            out[key] = describe(e)
    for key, (module, inputs) in built.items():
        if isinstance(out[key], dict):
            wanted = [m for m in modes if kept is None or threads_of(kept, key, m)]
            out[key].update(compiled_times(module, inputs, wanted, min_run_time,
                                           {m: threads_of(kept, key, m) for m in wanted}))
    return out


def threads_of(kept: dict | None, key: str, mode: str) -> int | None:
    """The thread count `kept` holds for `key`'s `mode` figure (None: time with both)."""
    return (kept or {}).get(key, {}).get(prefix_of(mode))


def kept_threads(rows: dict[str, dict | str]) -> dict[str, dict[str, int]]:
    """{key: {prefix: the thread count it kept}} of `reference_rows`' rows: what a re-time repeats."""
    return {key: {p: row[f"{p}_threads"] for p in map(prefix_of, ("eager", *COMPILE_MODES))
                  if row.get(f"{p}_threads")}
            for key, row in rows.items() if isinstance(row, dict)}


def describe(e: Exception) -> str:
    """`Type: the message's last line`, as a row says why it has no figure."""
    return f"{type(e).__name__}: {str(e).strip().splitlines()[-1] if str(e).strip() else ''}"


def eager_times(module, inputs, min_run_time: float = 0.5, threads: int | None = None) -> dict:
    """The `torch_eager_*` columns and the process's thread count before it timed; `threads`: a
    re-time with that thread count alone (RECHECK_RUN_TIME)."""
    run_time = RECHECK_RUN_TIME if threads else min_run_time
    return {"torch_process_threads": process_threads(), "torch_allocator": allocator(),
            **time_callable(module, inputs, run_time, at_threads=threads).to_row("torch_eager")}


def compiled_times(module, inputs, modes=COMPILE_MODES, min_run_time: float = 0.5,
                   threads: dict[str, int | None] | None = None) -> dict:
    """The `torch_compile*` columns of each mode in `modes`, and `torch_errors`; `threads` ({mode:
    thread count}): re-times with those thread counts alone (RECHECK_RUN_TIME)."""
    row: dict = {}
    errors = []
    for mode in modes:
        prefix = prefix_of(mode)
        alone = (threads or {}).get(mode)
        try:
            fn, seconds = compiled(module, inputs, mode)
            row.update(time_callable(fn, inputs, RECHECK_RUN_TIME if alone else min_run_time,
                                     at_threads=alone).to_row(prefix))
            row[f"{prefix}_s"] = round(seconds, 2)
        except Exception as e:  # reported in the row, never hidden
            errors.append(f"{mode}: {describe(e)}")
    row["torch_errors"] = "; ".join(errors) or None
    return row
