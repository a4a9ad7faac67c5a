"""Mixed precision (docs/leir.md §4.5): a statement computes in the dtype of its left-hand side, reads of
other dtypes are converted, the store rounds once; conditions compare in the dtype of their operands.
Golden text of both forms and the CUDA source, and the values, for float16 and bfloat16 (whose
bfloat16 statements TVM 0.27 would otherwise compute in float32: leir.lower.expr.BF16_WORK)."""
from __future__ import annotations

import ml_dtypes
import numpy as np
import pytest
import tvm
from test_lower_semantics import sig

from leir.lower import FORMS, build, cuda_source, lower_to_script, run_executable, run_numpy

BF16 = np.dtype(ml_dtypes.bfloat16)
F32 = np.float32

# docs/leir.md §4.5: a float32 accumulator over float16 operands, rounded once into the float16 result
MATMUL = ("B^{4}_{tx=0}L^{3}_{a=0}L^{64}_{c=0}[E^{f32,l}_{tx,a}=E^{f32,l}_{tx,a}+A^{CODE,g}_{tx,c}*C^{CODE,g}_{c,a};];"
          "B^{4}_{tx=0}L^{3}_{a=0}[D^{CODE,g}_{tx,a}=E^{f32,l}_{tx,a};];")


def matmul(code: str):
    dtype = {"f16": "float16", "bf16": "bfloat16"}[code]
    s = sig({"A": ((4, 64), dtype), "C": ((64, 3), dtype)}, {"D": ((4, 3), dtype)})
    return MATMUL.replace("CODE", code), s


def half_inputs(code: str, seed: int = 0):
    rng = np.random.default_rng(seed)
    dt = np.float16 if code == "f16" else BF16
    return {"A": rng.standard_normal((4, 64)).astype(dt), "C": rng.standard_normal((64, 3)).astype(dt)}


def r(x, dt=BF16):
    """numpy: round float32 values to `dt` and back (one rounding)."""
    return np.asarray(x, F32).astype(dt).astype(F32)


@pytest.mark.parametrize("form", FORMS)
@pytest.mark.parametrize("code", ["f16", "bf16"])
def test_float32_accumulator_reads_half_operands_as_float32(code, form):
    program, s = matmul(code)
    script = lower_to_script(program, s, form=form)
    assert 'scope="local"' in script or "T.alloc_local((4, 3))" in script  # E: float32, local
    if code == "f16":  # conversions where the accumulator reads, one rounding where D is stored
        assert 'T.Cast("float32", A[' in script and 'T.Cast("float32", C[' in script
        assert 'T.Cast("float16", E[' in script
    else:  # bfloat16 read through its bits (exact); E rounded to nearest even (bound once), then
        # stored as the upper half of the float32 that now holds a bfloat16
        assert 'T.reinterpret("float32", T.Cast("uint32", T.reinterpret("uint16", A[' in script
        assert 'T.reinterpret("bfloat16", T.Cast("uint16", T.reinterpret("uint32", T.Let(' in script
        assert "T.uint32(32767)" in script and "where={x: E[" in script
    inputs = half_inputs(code)
    a, c = inputs["A"].astype(F32), inputs["C"].astype(F32)
    want = np.zeros((4, 3), F32)
    for k in range(64):  # float32 accumulation in program order; each product is exact in float32
        want = want + a[:, k:k + 1] * c[k:k + 1, :]
    got = run_numpy(program, s, inputs, form=form)["D"]
    np.testing.assert_array_equal(got.astype(F32), want.astype(got.dtype).astype(F32))


def test_a_half_precision_product_would_round_where_the_float32_one_does_not():
    """The evidence behind the rule's example: rounding each float16 product (the old reading,
    which promoted after multiplying) changes the float32 sum."""
    inputs = half_inputs("f16", 3)
    a, c = inputs["A"], inputs["C"]
    exact = (a.astype(F32)[:, :, None] * c.astype(F32)[None]).sum(1)
    rounded = (a[:, :, None] * c[None]).astype(F32).sum(1)
    assert not np.array_equal(exact, rounded)


@pytest.mark.parametrize("form", FORMS)
def test_a_statement_converts_a_wider_read_to_its_own_dtype_first(form):
    """D^{f16} = E^{f32} * A^{f16}: E rounds to float16 where it is read, the product rounds again."""
    s = sig({"E": ((64,), "float32"), "A": ((64,), "float16")}, {"D": ((64,), "float16")})
    rng = np.random.default_rng(0)
    e, a = rng.standard_normal(64).astype(F32), rng.standard_normal(64).astype(np.float16)
    got = run_numpy("B^{64}_{tx=0}[D^{f16,g}_{tx}=E^{f32,g}_{tx}*A^{f16,g}_{tx};];", s, {"E": e, "A": a}, form=form)
    want = (e.astype(np.float16) * a)  # numpy float16 arithmetic rounds the product once
    np.testing.assert_array_equal(got["D"], want)


@pytest.mark.parametrize("form", FORMS)
def test_a_condition_compares_in_the_dtype_of_its_operands(form):
    """In a float16 statement, `E^{f32} > A^{f16}` compares in float32: E = A + 1e-4 is greater there,
    though both round to the same float16."""
    s = sig({"E": ((8,), "float32"), "A": ((8,), "float16")}, {"D": ((8,), "float16")})
    a = np.linspace(1, 2, 8).astype(np.float16)
    e = a.astype(F32) + F32(1e-4)
    assert np.array_equal(e.astype(np.float16), a)
    got = run_numpy("B^{8}_{tx=0}[D^{f16,g}_{tx}=if_then_else(E^{f32,g}_{tx}>A^{f16,g}_{tx},1,0);];", s,
                    {"E": e, "A": a}, form=form)
    np.testing.assert_array_equal(got["D"], np.ones(8, np.float16))


BF16_CASES = {  # statement -> numpy emulation rounding every operation and every conversion to bfloat16
    "D^{bf16,g}_{tx,a}=A^{bf16,g}_{tx,a}*C^{bf16,g}_{tx,a}+exp(A^{bf16,g}_{tx,a})/C^{bf16,g}_{tx,a}":
        lambda a, c, e: r(r(a * c) + r(r(np.exp(a)) / c)),
    "D^{bf16,g}_{tx,a}=A^{bf16,g}_{tx,a}*0.1+C^{bf16,g}_{tx,a}**2":
        lambda a, c, e: r(r(a * r(0.1)) + r(c * c)),
    "D^{bf16,g}_{tx,a}=E^{f32,g}_{tx,a}*A^{bf16,g}_{tx,a}": lambda a, c, e: r(r(e) * a),
    "D^{bf16,g}_{tx,a}=max(E^{f32,g}_{tx,a},A^{bf16,g}_{tx,a})-1.5": lambda a, c, e: r(np.maximum(r(e), a) - 1.5),
}


@pytest.mark.parametrize("form", FORMS)
@pytest.mark.parametrize("stmt", list(BF16_CASES), ids=range(len(BF16_CASES)))
def test_bfloat16_rounds_every_operation_and_conversion(stmt, form):
    """TVM 0.27's BF16ComputeLegalize alone would compute the whole statement in float32 and round once
    (and keep the literal 0.1 unrounded); LLVM's loads, stores and conversions of bfloat16 are checked
    against numpy's ml_dtypes, element by element."""
    s = sig({"A": ((4, 3), "bfloat16"), "C": ((4, 3), "bfloat16"), "E": ((4, 3), "float32")},
            {"D": ((4, 3), "bfloat16")})
    rng = np.random.default_rng(1)
    a, c = (rng.standard_normal((4, 3)) * 3).astype(BF16), rng.standard_normal((4, 3)).astype(BF16)
    e = rng.standard_normal((4, 3)).astype(F32)
    got = run_numpy(f"B^{{4}}_{{tx=0}}L^{{3}}_{{a=0}}[{stmt};];", s, {"A": a, "C": c, "E": e}, form=form)["D"]
    want = BF16_CASES[stmt](a.astype(F32), c.astype(F32), e)
    np.testing.assert_array_equal(got.astype(F32), want)


@pytest.mark.parametrize("form", FORMS)
def test_bfloat16_intermediates_accumulators_and_vector_loops(form):
    """A bfloat16 accumulator (every update rounds), a bfloat16 intermediate (held in a float32 buffer
    that only ever holds bfloat16 values) and a vectorized bfloat16 loop."""
    s = sig({"A": ((4, 16), "bfloat16"), "C": ((16, 8), "bfloat16")}, {"D": ((4, 8), "bfloat16")})
    program = ("B^{4}_{tx=0}L^{8}_{a=0}L^{16}_{c=0}[G^{bf16,g}_{tx,a}=G^{bf16,g}_{tx,a}+A^{bf16,g}_{tx,c}*"
               "C^{bf16,g}_{c,a};];B^{4}_{tx=0}V^{8}_{a=0}[D^{bf16,g}_{tx,a}=G^{bf16,g}_{tx,a}*0.3+exp(A^{bf16,g}_{tx,a});];")
    script = lower_to_script(program, s, form=form)
    assert 'G = T.alloc_buffer((4, 8))' in script or 'G = T.sblock_alloc_buffer((4, 8))' in script  # float32
    rng = np.random.default_rng(0)
    a, c = rng.standard_normal((4, 16)).astype(BF16), rng.standard_normal((16, 8)).astype(BF16)
    af, cf = a.astype(F32), c.astype(F32)
    g = np.zeros((4, 8), F32)
    for k in range(16):
        g = r(g + r(af[:, k:k + 1] * cf[k:k + 1, :]))
    want = r(r(g * r(0.3)) + r(np.exp(af[:, :8])))
    got = run_numpy(program, s, {"A": a, "C": c}, form=form)["D"]
    np.testing.assert_array_equal(got.astype(F32), want)


@pytest.mark.parametrize("form", FORMS)
@pytest.mark.parametrize("code", ["f16", "bf16"])
def test_cuda_source_accumulates_half_operands_in_float(code, form):
    program, s = matmul(code)
    source = cuda_source(program, s, form=form)
    half = "half" if code == "f16" else "nv_bfloat16"
    assert f"{half}* __restrict__ A_ptr" in source and "float* __restrict__ E_ptr" in source
    if code == "f16":
        assert "((float)A_ptr[" in source and "((float)C_ptr[" in source and "((half)E_ptr[" in source
    else:  # bfloat16 read through its bits, the result stored as the upper half of a float
        assert "(*(ushort *)(&(" in source and "nv_bfloat16" in source


def _has_gpu() -> bool:
    try:
        return bool(tvm.cuda(0).exist)
    except Exception:  # a TVM build without the CUDA runtime
        return False


@pytest.mark.gpu
@pytest.mark.skipif(not _has_gpu(), reason="no CUDA GPU on this machine (tvm.cuda(0).exist is false)")
@pytest.mark.parametrize("code", ["f16", "bf16"])
def test_cuda_runs_mixed_precision_as_the_cpu_does(code):
    """Bit for bit: products of half values are exact in float32, and every bfloat16 step is rounded
    explicitly, so neither side's fused multiply-adds change a result."""
    program, s = matmul(code)
    program += ("B^{4}_{tx=0}L^{3}_{a=0}[F^{CODE,g}_{tx,a}=D^{CODE,g}_{tx,a}*0.3+exp(D^{CODE,g}_{tx,a});];"
                .replace("CODE", code) if code == "bf16" else "")
    if code == "bf16":
        s = sig({"A": ((4, 64), "bfloat16"), "C": ((64, 3), "bfloat16")},
                {"D": ((4, 3), "bfloat16"), "F": ((4, 3), "bfloat16")})
    inputs = half_inputs(code)
    got = run_executable(build(program, s, "cuda"), s, inputs, device=tvm.cuda(0))
    want = run_executable(build(program, s, "llvm"), s, inputs)
    for name in want:
        np.testing.assert_array_equal(np.asarray(got[name]).view(np.uint16), np.asarray(want[name]).view(np.uint16))
