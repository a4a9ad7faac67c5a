"""Reject absurd programs before building them: too many iterations or too many buffer bytes.

A transformation proposed by a model can multiply a loop extent by 1000 or allocate a huge
intermediate; building and running it would stall a worker for minutes or exhaust memory, so the
verifier reports `invalid` with the reason instead.
"""
from __future__ import annotations

import math
from dataclasses import dataclass

from gpu_tasks.inputs import numpy_dtype
from leir.analysis import statement_sites, tensor_table
from leir.ast import Program
from leir.dtypes import torch_name
from leir.signature import Signature


@dataclass(frozen=True, slots=True)
class Limits:
    """Defaults fit verification at small shapes on a 2-core machine: 2^30 statement executions is a
    few seconds of naive code; 1 GiB of buffers leaves room for two workers and the caller."""

    max_iterations: int = 2**30
    max_buffer_bytes: int = 2**30


DEFAULT_LIMITS = Limits()


def iteration_count(program: Program) -> int:
    """Statement executions: for each statement, the product of its enclosing loop extents."""
    return sum(math.prod(lp.extent for lp in site.loops) for site in statement_sites(program))


def buffer_bytes(program: Program, signature: Signature) -> int:
    """Bytes of every known tensor and every intermediate whose shape can be inferred."""
    total = 0
    for info in tensor_table(program, signature).values():
        if info.shape is None:
            continue
        try:
            itemsize = numpy_dtype(torch_name(info.dtype)).itemsize
        except (KeyError, TypeError):
            itemsize = 8  # a dtype the lowering will reject anyway
        total += math.prod(info.shape) * itemsize
    return total


def limit_violation(program: Program, signature: Signature, limits: Limits = DEFAULT_LIMITS) -> str:
    """Why `program` is too big to build ("" when it is within the limits)."""
    iterations = iteration_count(program)
    if iterations > limits.max_iterations:
        return f"{iterations:,} statement executions exceed the limit of {limits.max_iterations:,}"
    nbytes = buffer_bytes(program, signature)
    if nbytes > limits.max_buffer_bytes:
        return f"{nbytes:,} bytes of buffers exceed the limit of {limits.max_buffer_bytes:,}"
    return ""
