"""The static figures the chain of thought reasons from (strategies/analysis/cost.py): work, bytes as
written, the parallel extent and vector width on each target, the innermost loop's dependence chain,
strides and reuse. Hand-computed on small programs."""
from __future__ import annotations

from leir.analysis import element_bytes
from leir.parse import parse_expr, parse_program
from strategies.analysis.cost import figures, operation_counts

MM = "B^{4}_{tx=0}L^{8}_{a=0}L^{6}_{c=0}[D^{f64,g}_{tx,a}=D^{f64,g}_{tx,a}+A^{f64,g}_{tx,c}*C^{f64,g}_{c,a};];"


def main(text: str, target: str = "llvm"):
    program = parse_program(text)
    return figures(program, range(len(program.nests)), target).main


def test_a_matmul_nest_on_the_cpu():
    m = main(MM)
    assert (m.executions, m.ops, m.calls, m.loaded, m.stored) == (192, 2, 0, 24, 8)
    assert m.reduction == ("c",) and m.chain  # c is innermost and carries the reduction
    assert (m.parallel, m.vector, m.unrolled) == (1, 1, 1)  # a B loop runs serially on the CPU
    assert dict(m.strides) == {"D": 0, "A": 1, "C": 8}
    # A[tx,c] is read again for every a: in between, the c loop touches 1 element of D, 6 of A and 6 of C
    # (8 + 48 + 48 bytes); C[c,a] again for every tx: the a, c loops touch 8 of D, 6 of A, 48 of C
    reuse = {r.tensor: (r.times, r.loops, r.distance) for r in m.reuse}
    assert reuse == {"A": (8, ("a",), 8 + 48 + 48), "C": (4, ("tx",), 64 + 48 + 384)}


def test_the_parallel_extent_follows_the_target():
    parallel = MM.replace("B^{4}_{tx=0}", "P^{4}_{d=0}").replace("tx", "d")
    assert main(parallel).parallel == 4 and main(parallel).parallel_loops == ("d",)
    assert main(parallel, "cuda").parallel == 1  # a P loop is serial inside a CUDA kernel
    assert main(MM, "cuda").parallel == 4 and main(MM, "cuda").parallel_loops == ("tx",)
    nested = "P^{4}_{d=0}P^{8}_{a=0}[C^{f64,g}_{d,a}=A^{f64,g}_{d,a};];"
    assert main(nested).parallel == 4  # no nested parallelism on the CPU


def test_vector_lanes_break_the_chain_on_the_cpu_only():
    lanes = "B^{4}_{tx=0}L^{8}_{a=0}V^{6}_{c=0}[D^{f64,g}_{tx,a}=D^{f64,g}_{tx,a}+A^{f64,g}_{tx,c};];"
    assert main(lanes).vector == 6 and not main(lanes).chain
    assert main(lanes, "cuda").vector == 1 and main(lanes, "cuda").chain


def test_scopes_count_as_memory_only_where_the_target_has_a_hierarchy():
    shared = "B^{4}_{tx=0}L^{8}_{a=0}[D^{f64,s}_{tx,a}=A^{f64,g}_{tx,a}*2;];"
    assert main(shared).stored == 8 and main(shared, "cuda").stored == 0
    scalar = "B^{4}_{tx=0}L^{8}_{a=0}[D^{f64,l}=D^{f64,l}+A^{f64,g}_{tx,a};];"
    assert (main(scalar).loaded, main(scalar).stored) == (8, 0)  # a local scalar is a register on the CPU
    local_array = "B^{4}_{tx=0}L^{8}_{a=0}[D^{f64,l}_{a}=A^{f64,g}_{tx,a};];"
    assert main(local_array).stored == 8 and main(local_array, "cuda").stored == 0


def test_operation_counts_and_element_bytes():
    assert operation_counts(parse_expr("exp(A^{f32,g}_{a}-D^{f32,g})/E^{f32,g}+max(A^{f32,g}_{a},0)")) == (4, 1)  # -, /, +, max; exp
    assert operation_counts(parse_expr("A^{f32,g}_{a+1}")) == (0, 0)  # subscripts are no work
    assert [element_bytes(c) for c in ("f64", "f32", "bf16", "i8", "bool")] == [8, 4, 2, 1, 1]
