"""CUDA lowering: source generation without a GPU (thread bindings, shared/local placement, global
workspaces, one-thread kernels), and execution where a GPU exists (`-m gpu`)."""
from __future__ import annotations

import numpy as np
import pytest
import tvm
from test_lower_oracle import golden_rows, random_inputs
from test_lower_semantics import sig

from leir import Signature
from leir.lower import LoweringError, build, cuda_source, lower_to_script, plan, run_executable

ROWS = golden_rows()

# a block of threads per 8 rows: a per-thread accumulator (l), a shared staging buffer (s) and a
# global intermediate used in a single kernel
TILED = ("B^{4}_{bx=0}B^{8}_{tx=0}[L^{16}_{c=0}[F^{f32,l}_{bx,tx}=F^{f32,l}_{bx,tx}+A^{f32,g}_{bx*8+tx,c};];"
         "S^{f32,s}_{bx,tx}=F^{f32,l}_{bx,tx}*2;G^{f32,g}_{bx,tx}=S^{f32,s}_{bx,tx}+1;"
         "C^{f32,g}_{bx*8+tx}=G^{f32,g}_{bx,tx};];")
TILED_SIG = sig({"A": ((32, 16), "float32")}, {"C": ((32,), "float32")})


def kernels(source: str) -> list[str]:
    """The kernel bodies of a CUDA source (each `__global__` definition)."""
    parts = source.split('extern "C" __global__')
    return [p for p in parts[1:] if "{" in p.split(";")[0]]


@pytest.mark.parametrize("row", ROWS, ids=[r["name"] for r in ROWS])
def test_golden_programs_give_cuda_source(row):
    src = cuda_source(row["leir"], row["signature"])
    bound = "threadIdx.x" in src or "B^{1}_{tx=0}" in row["leir"]  # TVM drops a thread axis of extent 1
    assert kernels(src) and bound


def test_shared_and_local_intermediates_live_in_the_kernel():
    src = cuda_source(TILED, TILED_SIG, arch="sm_80")
    (kernel,) = kernels(src)
    assert "__shared__" in kernel and "float F_ptr[" in kernel
    assert "blockIdx.x" in kernel and "threadIdx.x" in kernel
    assert "float* __restrict__ G_ptr" in kernel  # global: a device workspace passed by the host
    p = plan(TILED, TILED_SIG, "cuda")
    assert p.scopes == {"F": "local", "G": "global", "S": "shared"} and p.top_allocs == ("G",)


def test_shared_intermediate_that_crosses_kernels_is_promoted_to_global():
    s = sig({"A": ((4, 6), "float32")}, {"C": ((4,), "float32")})
    p = ("B^{4}_{tx=0}L^{6}_{c=0}[F^{f32,s}_{tx}=F^{f32,s}_{tx}+A^{f32,g}_{tx,c};];"
         "B^{4}_{tx=0}[C^{f32,g}_{tx}=F^{f32,s}_{tx};];")
    assert plan(p, s, "cuda").scopes == {"F": "global"}
    assert "F_ptr" in cuda_source(p, s) and "__shared__" not in cuda_source(p, s)
    assert plan(p, s, "llvm").scopes == {"F": "shared"}


def test_bound_loop_over_a_reduction_axis_runs_in_one_thread():
    row = next(r for r in ROWS if r["name"] == "cross_entropy_mean")
    p = plan(row["leir"], row["signature"], "cuda")
    last = p.items[-1]
    assert (last.thread, last.extent) == ("blockIdx.x", 1)  # a one-thread kernel ...
    assert (last.body[0].var, last.body[0].kind) == ("tx", "serial")  # ... that loops over tx
    assert any("not bound to a thread" in n for n in p.notes)


def test_other_loop_kinds_are_serial_or_unrolled_in_kernels():
    s = sig({"A": ((4, 8), "float32")}, {"C": ((4, 8), "float32")})
    text = lower_to_script("B^{4}_{tx=0}P^{2}_{g=0}V^{2}_{h=0}U^{2}_{i=0}[C^{f32,g}_{tx,g*4+h*2+i}="
                           "A^{f32,g}_{tx,g*4+h*2+i};];", s, "cuda")
    assert 'T.thread_binding(4, thread="threadIdx.x")' in text and "T.unroll(2)" in text
    assert "T.parallel" not in text and "T.vectorized" not in text


def test_binding_names_map_to_thread_axes():
    s = sig({"A": ((2, 3, 4), "float32")}, {"C": ((2, 3, 4), "float32")})
    text = lower_to_script("B^{2}_{bya=0}B^{3}_{tz=0}B^{4}_{txb=0}[C^{f32,g}_{bya,tz,txb}=A^{f32,g}_{bya,tz,txb};];",
                           s, "cuda")
    for tag in ("blockIdx.y", "threadIdx.z", "threadIdx.x"):
        assert f'thread="{tag}"' in text


def test_nested_loops_bound_to_the_same_axis_are_an_error():
    s = sig({"A": ((4, 2), "float32")}, {"C": ((4, 2), "float32")})
    with pytest.raises(LoweringError, match="txa .threadIdx.x. is nested inside"):
        lower_to_script("B^{4}_{tx=0}B^{2}_{txa=0}[C^{f32,g}_{tx,txa}=A^{f32,g}_{tx,txa};];", s, "cuda")


def test_scan_gives_one_kernel_per_nest():
    s = sig({"D": ((2, 5), "float32")}, {"C": ((2, 5), "float32")})
    p = ("B^{2}_{tx=0}L^{5}_{a=0}[H^{f32,g}_{tx,a}=max(if_then_else(a-1<0,-inf,H^{f32,g}_{tx,a-1}),"
         "D^{f32,g}_{tx,a});];B^{2}_{tx=0}L^{5}_{a=0}[C^{f32,g}_{tx,a}=H^{f32,g}_{tx,a};];")
    assert len(kernels(cuda_source(p, s))) == 2


def _has_gpu() -> bool:
    try:
        return bool(tvm.cuda(0).exist)
    except Exception:  # a TVM build without the CUDA runtime
        return False


@pytest.mark.gpu
@pytest.mark.skipif(not _has_gpu(), reason="no CUDA GPU on this machine (tvm.cuda(0).exist is false)")
@pytest.mark.parametrize("row", ROWS, ids=[r["name"] for r in ROWS])
def test_cuda_execution_matches_the_cpu(row):
    signature = Signature.from_json(row["signature"])
    gpu, cpu = build(row["leir"], signature, "cuda"), build(row["leir"], signature, "llvm")
    inputs = random_inputs(signature, 0, int_high=4)
    got = run_executable(gpu, signature, inputs, device=tvm.cuda(0))
    want = run_executable(cpu, signature, inputs)
    for name in want:
        np.testing.assert_allclose(got[name], want[name], rtol=1e-9, atol=1e-9)


@pytest.mark.gpu
@pytest.mark.skipif(not _has_gpu(), reason="no CUDA GPU on this machine (tvm.cuda(0).exist is false)")
def test_cuda_execution_of_shared_and_local_scopes():
    inputs = random_inputs(TILED_SIG, 1)
    got = run_executable(build(TILED, TILED_SIG, "cuda"), TILED_SIG, inputs, device=tvm.cuda(0))
    np.testing.assert_allclose(got["C"], inputs["A"].sum(1) * 2 + 1, rtol=1e-5)
