"""Shared fixtures of the gpu_tasks tests: small programs, and one worker pool for the whole run
(starting the fork server costs one TVM import, ~3 s; every worker after that is a fork)."""
from __future__ import annotations

import pytest

from gpu_tasks.pool import WorkerPool
from leir import Signature

MATMUL_SIG = Signature.from_json({"tensors": [
    {"name": "A", "shape": [8, 64], "dtype": "float32", "role": "input"},
    {"name": "C", "shape": [64, 6], "dtype": "float32", "role": "input"},
    {"name": "D", "shape": [8, 6], "dtype": "float32", "role": "output"}]})
MATMUL = "B^{8}_{tx=0}L^{6}_{a=0}L^{64}_{c=0}[D^{f32,g}_{tx,a}=D^{f32,g}_{tx,a}+A^{f32,g}_{tx,c}*C^{f32,g}_{c,a};];"
# The spatial loops reordered and kinds changed: every element still sums c = 0..63 in order.
MATMUL_REORDERED = ("L^{6}_{a=0}P^{8}_{f=0}U^{64}_{c=0}"
                    "[D^{f32,g}_{f,a}=D^{f32,g}_{f,a}+A^{f32,g}_{f,c}*C^{f32,g}_{c,a};];")
# The reduction runs backwards: a reassociation, equal only up to float32 rounding.
MATMUL_REVERSED = ("B^{8}_{tx=0}L^{6}_{a=0}L^{64}_{c=0}"
                   "[D^{f32,g}_{tx,a}=D^{f32,g}_{tx,a}+A^{f32,g}_{tx,63-c}*C^{f32,g}_{63-c,a};];")
# Wrong: subtracts instead of adding.
MATMUL_WRONG = "B^{8}_{tx=0}L^{6}_{a=0}L^{64}_{c=0}[D^{f32,g}_{tx,a}=D^{f32,g}_{tx,a}-A^{f32,g}_{tx,c}*C^{f32,g}_{c,a};];"


def matmul(loops: str, row: str = "tx") -> str:
    """MATMUL's statement under other loops (`row` is the index of D's rows)."""
    return loops + (f"[D^{{f32,g}}_{{{row},a}}=D^{{f32,g}}_{{{row},a}}+A^{{f32,g}}_{{{row},c}}"
                    f"*C^{{f32,g}}_{{c,a}};];")


# Correct transformations of MATMUL that lower to distinct functions (distinct builds).
MATMUL_VARIANTS = [
    matmul("P^{8}_{f=0}L^{6}_{a=0}L^{64}_{c=0}", "f"),
    matmul("B^{8}_{tx=0}U^{6}_{a=0}L^{64}_{c=0}"),
    matmul("B^{8}_{tx=0}L^{6}_{a=0}U^{64}_{c=0}"),
    matmul("B^{8}_{tx=0}L^{64}_{c=0}V^{6}_{a=0}"),
    matmul("L^{6}_{a=0}B^{8}_{tx=0}L^{64}_{c=0}"),
    MATMUL_REORDERED,
]
# On the CPU a `B` loop is an ordinary loop: renamed, this is MATMUL's very function.
MATMUL_RENAMED = matmul("L^{8}_{f=0}L^{6}_{a=0}L^{64}_{c=0}", "f")


@pytest.fixture(scope="session")
def pool():
    with WorkerPool(workers=2, timeout_s=30.0) as p:
        yield p
