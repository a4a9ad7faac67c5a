"""Jobs that misbehave on purpose, for tests of the worker pool's isolation (never used otherwise)."""
from __future__ import annotations

import ctypes
import os
import time


def echo(value):
    return value


def worker_pid() -> int:
    return os.getpid()


def exit_abruptly(status: int = 3) -> None:
    """Leave without cleanup, as a fatal error in native code would."""
    os._exit(status)


def segfault() -> None:
    ctypes.string_at(0)  # reads address 0: SIGSEGV


def sleep_for(seconds: float) -> float:
    time.sleep(seconds)
    return seconds


def raise_error(message: str = "deliberate failure") -> None:
    raise ValueError(message)


def tvm_thread_count() -> int:
    """Threads of TVM's pool in this worker (it reads TVM_NUM_THREADS when it first starts)."""
    import tvm_ffi

    return int(tvm_ffi.get_global_func("runtime.NumThreads")())


def torch_importable() -> bool:
    try:
        import torch  # noqa: F401
    except ImportError:
        return False
    return True


def hold_memory(mib: int, seconds: float = 30.0) -> int:
    """Touch `mib` MiB and keep it (a job that eats memory), then return how much it held."""
    block = bytearray(mib * 1024 * 1024)  # zero-filled: every page is touched
    time.sleep(seconds)
    return len(block) // (1024 * 1024)


def mutate_module_state() -> str:
    """Change process-wide state (what untrusted code might do); reports what it found first."""
    import json

    found = "patched" if getattr(json, "_steptp_patched", False) else "clean"
    json._steptp_patched = True
    return found
