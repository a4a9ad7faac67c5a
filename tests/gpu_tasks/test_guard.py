"""The guard rejects absurd programs before they are built."""
from __future__ import annotations

from gpu_tasks.guard import Limits, buffer_bytes, iteration_count, limit_violation
from leir import Signature, parse_program

SIG = Signature.from_json({"tensors": [
    {"name": "A", "shape": [4, 6], "dtype": "float64", "role": "input"},
    {"name": "C", "shape": [6, 5], "dtype": "float64", "role": "input"},
    {"name": "D", "shape": [4, 5], "dtype": "float32", "role": "output"}]})
MATMUL = parse_program(
    "B^{4}_{tx=0}L^{5}_{a=0}L^{6}_{c=0}[D^{f32,g}_{tx,a}=D^{f32,g}_{tx,a}+A^{f64,g}_{tx,c}*C^{f64,g}_{c,a};];")


def test_counts():
    assert iteration_count(MATMUL) == 4 * 5 * 6
    assert buffer_bytes(MATMUL, SIG) == 24 * 8 + 30 * 8 + 20 * 4
    assert limit_violation(MATMUL, SIG) == ""


def test_too_many_iterations():
    huge = parse_program("B^{4}_{tx=0}L^{100000}_{f=0}L^{100000}_{a=0}L^{6}_{c=0}"
                         "[D^{f32,g}_{tx,0}=D^{f32,g}_{tx,0}+A^{f64,g}_{tx,c};];")
    reason = limit_violation(huge, SIG)
    assert "statement executions exceed" in reason


def test_too_many_bytes_in_an_intermediate():
    big = parse_program("B^{4}_{tx=0}L^{5}_{a=0}L^{4096}_{c=0}L^{4096}_{f=0}[E^{f64,g}_{tx,a,c,f}=1.0;];"
                        "B^{4}_{tx=0}L^{5}_{a=0}[D^{f32,g}_{tx,a}=E^{f64,g}_{tx,a,0,0};];")
    assert "bytes of buffers exceed" in limit_violation(big, SIG, Limits(max_iterations=10**12))
