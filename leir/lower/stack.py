"""Room on the C stack for TVM's recursive passes over deep expressions.

LEIR's own code walks trees with explicit stacks, but TVM's C++ visitors (the IR builder's checks,
the TVMScript printer, structural hashing, the simplifier, LLVM code generation) recurse once or
more per level of an expression: on the main thread's 8 MiB stack, `exp(exp(...))` 2,400 deep
overflows it and kills the process (a flat sum of 10,000 terms is a tree 10,000 deep too). A program
deeper than `SHALLOW` is therefore lowered and built on a thread whose stack is sized for its depth
(measured: up to about 7 KiB per level; `BYTES_PER_LEVEL` leaves a margin of four). The stack is
virtual memory, touched only as deep as the passes go. Programs deeper than `MAX_EXPRESSION_DEPTH`
are refused before TVM sees them (leir.lower.check; validation says `too-deep` as well).
"""
from __future__ import annotations

import threading

SHALLOW = 256                  # this deep runs on the caller's thread (measured safe to ~1,200 levels)
BYTES_PER_LEVEL = 32 * 1024
BASE_BYTES = 8 * 1024 * 1024
_START = threading.Lock()      # threading.stack_size is process-wide: set it only around one start
_HERE = threading.local()      # `depth`: how deep the current thread's stack was sized for


def stack_bytes(depth: int) -> int:
    """The stack a thread lowering an expression `depth` deep gets (a multiple of 64 KiB)."""
    size = BASE_BYTES + depth * BYTES_PER_LEVEL
    return -(-size // 65536) * 65536


def call_with_stack_for(depth: int, fn, *args, **kwargs):
    """`fn(*args, **kwargs)`, on a thread with a stack for an expression `depth` deep when that is
    deeper than `SHALLOW` (else on this thread); what `fn` raises is raised here."""
    if depth <= max(SHALLOW, getattr(_HERE, "depth", 0)):
        return fn(*args, **kwargs)
    outcome: dict = {}

    def run():
        _HERE.depth = depth
        try:
            outcome["value"] = fn(*args, **kwargs)
        except BaseException as e:  # handed to the caller's thread
            outcome["error"] = e

    with _START:
        previous = threading.stack_size(stack_bytes(depth))
        try:
            thread = threading.Thread(target=run, name="leir-lower-deep", daemon=True)
            thread.start()
        finally:
            threading.stack_size(previous)
    thread.join()
    if "error" in outcome:
        raise outcome["error"]
    return outcome["value"]
