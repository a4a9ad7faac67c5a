"""PyTorch references timed as a user would configure them: eager and `torch.compile`, each with one
thread and with every core, the faster kept.

Why both thread counts: PyTorch's OpenMP region with one thread per core waits at every barrier for
the slowest thread, and a thread that another busy process has descheduled costs a scheduler slice
(a softmax timed 11.7 µs alone and 4,594 µs with one other job running on a 2-core machine). On one
thread nothing waits. A user on a busy machine sets the thread count; the reference does the same.

Each figure is the median of `torch.utils.benchmark` blocks of at least 10 ms of back-to-back calls,
with the block count and the spread (interquartile range over the median), in the fastest of WINDOWS
windows; eager figures take turns window by window (a shared VM's CPU runs at two speeds for seconds
at a time). The compiled module is built with one compile thread (no pool of compile
workers left running beside the timing), its compile time is reported, and it is checked against
eager on the same inputs before it is timed.
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
from dataclasses import asdict, dataclass, field

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
    us: float                    # the fastest window's median µs per call, with the faster thread count
    threads: int                 # that thread count
    runs: int                    # timed blocks (each of `number` calls), all windows together
    number: int                  # calls per block
    spread: float                # interquartile range / median of the kept window's blocks
    us_by_threads: dict          # {threads: its fastest window's median µs}
    faults_per_call: float       # minor page faults per call over the kept thread count's blocks
    us_by_window: list           # the kept thread count's window medians, in the order they were timed

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

# Each figure is timed in this many windows, round-robin over the figures timed together, and its
# fastest window's median kept. A shared 2-core VM runs at two speeds that last from a fraction of a
# second to tens of seconds: a fixed pure-Python loop took 9.3 ms or 17.5 ms, and a float32 exp 720 or
# 960 µs, in turn (benchmarks/bench_host.py). One window of 0.5 s caught one of them; the figure and
# its re-time in another process then differed by up to 1.4x. Windows spread over the eager phase
# are each a chance to catch the fast speed; all of them are in `us_by_window`.
WINDOWS = 3


@dataclass
class _Figure:
    """One callable at one thread count, timed one window at a time."""
    fn: object
    inputs: tuple
    threads: int
    number: int = 0
    windows: list = field(default_factory=list)  # each window's block medians
    faults: int = 0

    def time_window(self, run_time: float) -> None:
        """Blocks of at least BLOCK_S (a 100 µs call timed one at a time spreads by a third from jitter
        alone; 2 ms blocks on a noisy 2-core VM by a quarter), at least 5 of them and `run_time`
        seconds in all, after 10 calls of warm-up (the first calls, and the caches the other figures'
        windows took)."""
        import torch
        from torch.utils import benchmark

        # the thread count is set once for all the blocks: set per block (as Timer.timeit does when it
        # differs), resizing the OpenMP pool cost 0.7 ms a block
        torch.set_num_threads(self.threads)
        timer = benchmark.Timer(stmt="f(*x)", globals={"f": self.fn, "x": self.inputs}, num_threads=self.threads)
        timer.timeit(10)
        if not self.number:  # sized once, by the first window
            self.number = max(1, math.ceil(BLOCK_S / max(timer.timeit(10).median, 1e-9)))
        blocks, deadline, faults = [], time.perf_counter() + run_time, page_faults()
        while len(blocks) < 5 or time.perf_counter() < deadline:
            blocks.append(timer.timeit(self.number).median)
        self.faults += page_faults() - faults
        self.windows.append(blocks)

    def fastest(self) -> tuple[float, list[float]]:
        """(the fastest window's median in seconds, that window's blocks)."""
        return min(((statistics.median(b), b) for b in self.windows), key=lambda mb: mb[0])


def time_callables(calls: dict, cores: int | None = None, windows: int = WINDOWS) -> dict:
    """{key: TorchTime, or why it has none} of `calls` ({key: (fn, inputs, threads or None, seconds)}):
    each call with one thread and with `cores` (every core) threads, or with `threads` alone where
    given (a re-time of a figure whose thread count is known), the faster kept; `seconds` per thread
    count, in `windows` windows, round-robin over every call and thread count (WINDOWS)."""
    import torch

    cores = cores or max(1, os.cpu_count() or 1)
    figures = {key: [_Figure(fn, inputs, t) for t in ([threads] if threads else sorted({1, cores}))]
               for key, (fn, inputs, threads, _) in calls.items()}
    failed: dict[str, str] = {}
    before = torch.get_num_threads()
    try:
        with torch.no_grad():
            for _ in range(windows):
                for key, figs in figures.items():
                    try:
                        if key not in failed:
                            for f in figs:
                                f.time_window(calls[key][3] / windows)
                    except Exception as e:  # reported in the row, never hidden
                        failed[key] = describe(e)
    finally:
        torch.set_num_threads(before)
    return {key: failed.get(key) or _summary(figs) for key, figs in figures.items()}


def _summary(figs: list[_Figure]) -> TorchTime:
    fastest = {f.threads: f.fastest() for f in figs}
    kept = min(figs, key=lambda f: fastest[f.threads][0])
    median, blocks = fastest[kept.threads]
    q1, _, q3 = statistics.quantiles(blocks, n=4) if len(blocks) > 1 else (blocks[0],) * 3
    runs = sum(map(len, kept.windows))
    return TorchTime(us=median * 1e6, threads=kept.threads, runs=runs, number=kept.number,
                     spread=(q3 - q1) / median if median > 0 else 0.0,
                     us_by_threads={str(t): round(m * 1e6, 3) for t, (m, _) in sorted(fastest.items())},
                     faults_per_call=round(kept.faults / (kept.number * runs), 1),
                     us_by_window=[round(statistics.median(b) * 1e6, 3) for b in kept.windows])


def time_callable(fn, inputs, min_run_time: float = 0.5, cores: int | None = None,
                  at_threads: int | None = None) -> TorchTime:
    """`fn(*inputs)` alone through time_callables (its windows one after another)."""
    found = time_callables({"f": (fn, inputs, at_threads, min_run_time)}, cores)["f"]
    if isinstance(found, str):
        raise RuntimeError(found)
    return found


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
# thread count and 0.15 s where the first time took two and 0.5 s each (in WINDOWS windows of at least
# 5 blocks of BLOCK_S). It checks the figure, it does not choose again.
RECHECK_RUN_TIME = 0.15


def reference_rows(built: dict, modes=COMPILE_MODES, min_run_time: float = 0.5,
                   kept: dict[str, dict[str, int]] | None = None) -> dict[str, dict | str]:
    """{key: the row's columns, or why there are none} for `built` ({key: (module, inputs)}): every
    eager figure first, before anything is compiled in this process (the threads a compilation
    leaves behind moved a conv2d's eager time by 1.5x), taking turns window by window (WINDOWS), then
    each module in each compile mode, timed right after its compilation: `torch_eager_*`,
    `torch_compile_*` (default mode) and `torch_compile_max_autotune_*`, with `*_s` the compile time;
    a mode that fails leaves its figures out and says why in `torch_errors`.

    `kept` ({key: {prefix: threads}}, the thread counts a first time kept): a re-time of those
    figures, each with its kept thread count alone for RECHECK_RUN_TIME seconds; a figure not in
    `kept` is not re-timed (nor its module compiled in that mode)."""

    def run_of(key: str, mode: str) -> tuple[int | None, float]:
        """(the thread count to time `key`'s `mode` figure with, None for both; for how long)."""
        threads = threads_of(kept, key, mode)
        return threads, RECHECK_RUN_TIME if threads else min_run_time

    head = {"torch_process_threads": process_threads(), "torch_allocator": allocator()}
    eager = time_callables({key: (module, inputs, *run_of(key, "eager")) for key, (module, inputs) in built.items()
                            if kept is None or threads_of(kept, key, "eager")})
    out: dict[str, dict | str] = {key: dict(head) for key in built}
    for key, found in eager.items():
        out[key] = {**head, **found.to_row("torch_eager")} if isinstance(found, TorchTime) else found
    for key, (module, inputs) in built.items():
        if not isinstance(out[key], dict):
            continue
        errors = []
        for mode in modes:
            if kept is not None and not threads_of(kept, key, mode):
                continue  # a mode that kept no figure is not compiled again
            try:
                # each compiled figure alone, right after its compilation (its windows back to back): a
                # re-time of compiled modules that stayed side by side ran 1.2-1.6x slower than their
                # first time, eager unmoved, for a reason not found
                fn, seconds = compiled(module, inputs, mode)
                threads, run_time = run_of(key, mode)
                out[key].update(time_callable(fn, inputs, run_time, at_threads=threads).to_row(prefix_of(mode)))
                out[key][f"{prefix_of(mode)}_s"] = round(seconds, 2)
            except Exception as e:  # reported in the row, never hidden
                errors.append(f"{mode}: {describe(e)}")
        out[key]["torch_errors"] = "; ".join(errors) or None
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
