"""Thread settings of processes that build, run and time kernels.

On a small machine TVM's thread pool and OpenBLAS fight each other, and several workers that each
start one thread per core oversubscribe it. The variables must be set before TVM first launches a
parallel kernel in the process (it reads them once, when its thread pool starts).
"""
from __future__ import annotations

import os
import sys
from collections.abc import Iterator
from contextlib import contextmanager

THREAD_VARIABLES = ("TVM_NUM_THREADS", "OMP_NUM_THREADS", "MKL_NUM_THREADS")


def logical_cpus() -> int:
    return max(1, os.cpu_count() or 1)


def set_thread_env(tvm_threads: int) -> None:
    """OpenBLAS single-threaded; TVM (and OpenMP, MKL) with `tvm_threads` threads."""
    os.environ["OPENBLAS_NUM_THREADS"] = "1"
    for name in THREAD_VARIABLES:
        os.environ[name] = str(tvm_threads)


# Dask's nanny starts every worker with the settings of `distributed.nanny.pre-spawn-environ`, among
# them MALLOC_TRIM_THRESHOLD_=65536: glibc then hands freed memory back to the system from 64 KiB up.
# The processes a pool starts from such a worker inherit it, and verification there ran at half its
# rate (406 steps of the default profile, one verifying process: 27.4 s against 14.0 s). glibc reads
# it when a process starts, so it must be gone from the environment a pool's processes start with.
NANNY_MALLOC_VARIABLE = "MALLOC_TRIM_THRESHOLD_"


def nanny_malloc_setting() -> str | None:
    """The trim threshold a Dask nanny put in this process's environment, if it is there (a value the
    user chose, such as CACHING_MALLOC_ENV's, is not the nanny's and stays)."""
    value = os.environ.get(NANNY_MALLOC_VARIABLE)
    if value is None or "distributed" not in sys.modules:
        return None
    import dask

    nanny = (dask.config.get("distributed.nanny.pre-spawn-environ", None) or {}).get(NANNY_MALLOC_VARIABLE)
    return value if nanny is not None and str(nanny) == value else None


@contextmanager
def kernel_process_env() -> Iterator[None]:
    """The environment for starting processes that build, run and time kernels: this process's,
    without the trim threshold a Dask nanny set (restored after the block)."""
    value = nanny_malloc_setting()
    if value is not None:
        del os.environ[NANNY_MALLOC_VARIABLE]
    try:
        yield
    finally:
        if value is not None:
            os.environ[NANNY_MALLOC_VARIABLE] = value


def tvm_threads() -> int:
    """Threads TVM's pool uses in this process (the variable, else one per core)."""
    value = os.environ.get("TVM_NUM_THREADS", "")
    return int(value) if value.isdigit() and int(value) > 0 else logical_cpus()


def tvm_threads_here(threads: int) -> int:
    """Ask for `threads` threads in this process's TVM thread pool and return how many it has. Without
    TVM_NUM_THREADS, TVM takes half the logical CPUs on x86 (it assumes hyper-threading): one thread
    on this 2-core machine, where the timing workers run `logical_cpus()`, so a parallel kernel timed
    in-process ran 2.8x slower than in the search's own session. The request only takes effect
    before the process's first parallel kernel starts the pool; the answer says whether it did."""
    import tvm

    os.environ["TVM_NUM_THREADS"] = str(int(threads))
    return int(tvm.get_global_func("runtime.NumThreads")())
