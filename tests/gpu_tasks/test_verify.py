"""Verification in the calling process: originals against PyTorch, transformations against originals,
and every failure status that does not need a worker to die."""
from __future__ import annotations

import numpy as np
import pytest
import torch

from gpu_tasks.cache import BUILD_CACHE
from gpu_tasks.guard import Limits
from gpu_tasks.jobs import clear_caches
from gpu_tasks.verify import verify_against_reference, verify_pair
from leir import Signature, parse_program
from tests.conftest import EXAMPLES
from tests.gpu_tasks.conftest import (
    MATMUL,
    MATMUL_RENAMED,
    MATMUL_REORDERED,
    MATMUL_REVERSED,
    MATMUL_SIG,
    MATMUL_VARIANTS,
    MATMUL_WRONG,
)

RELU_SIG = {"tensors": [{"name": "A", "shape": [4, 8], "dtype": "float32", "role": "input"},
                        {"name": "C", "shape": [4, 8], "dtype": "float32", "role": "output"}]}
RELU = "B^{4}_{tx=0}L^{8}_{a=0}[C^{f32,g}_{tx,a}=max(A^{f32,g}_{tx,a},0);];"


def torch_reference(expression: str):
    def reference(inputs: dict[str, np.ndarray]):
        scope = {name: torch.from_numpy(array) for name, array in inputs.items()}
        return eval(expression, {"torch": torch}, scope)
    return reference


@pytest.mark.parametrize("ex", EXAMPLES, ids=[e["name"] for e in EXAMPLES])
def test_originals_agree_with_pytorch_in_float64(ex):
    v = verify_against_reference(ex["leir"], ex["signature"], torch_reference(ex["torch"]))
    assert v.status in ("exact", "close"), v.error
    assert v.draws == 3 and v.max_rel_err < 1e-9


def test_a_wrong_reference_is_a_mismatch():
    ex = EXAMPLES[0]  # matmul
    v = verify_against_reference(ex["leir"], ex["signature"], torch_reference("A @ C + 1e-6"))
    assert v.status == "mismatch"


def test_a_failing_reference_is_a_runtime_error_of_the_reference():
    ex = EXAMPLES[0]
    v = verify_against_reference(ex["leir"], ex["signature"], torch_reference("A @ A"))
    assert v.status == "runtime_error" and v.error.startswith("reference: RuntimeError")


def test_pytorchs_own_dtype_run_raises_the_bounds_and_is_optional():
    """An original against PyTorch (float64) with PyTorch's own run in its dtype: a reference that is
    off lets the same error through only when PyTorch's own run is that far off too; an own run that
    raises (no kernel in that dtype) leaves the plain bounds."""
    ex = EXAMPLES[0]  # matmul
    off = torch_reference("(A @ C) * 1.001")
    assert verify_against_reference(ex["leir"], ex["signature"], off).status == "mismatch"
    v = verify_against_reference(ex["leir"], ex["signature"], off, own_fn=torch_reference("A @ C"))
    assert v.status == "close"
    failing = torch_reference("A @ A")
    assert verify_against_reference(ex["leir"], ex["signature"], off, own_fn=failing).status == "mismatch"


def test_identity_is_exact():
    v = verify_pair(MATMUL, MATMUL, MATMUL_SIG)
    assert v.status == "exact" and v.bitwise_equal and v.draws == 3 and v.max_abs_err == 0.0


def test_reordered_loops_are_exact():
    assert verify_pair(MATMUL, MATMUL_REORDERED, MATMUL_SIG).status == "exact"


def test_a_reassociated_float32_reduction_is_close():
    v = verify_pair(MATMUL, MATMUL_REVERSED, MATMUL_SIG)
    assert v.status == "close" and 0 < v.max_rel_err and v.rel_l2_err < 1e-5


def test_a_wrong_transformation_is_a_mismatch():
    v = verify_pair(MATMUL, MATMUL_WRONG, MATMUL_SIG)
    assert v.status == "mismatch" and "max abs" in v.error and v.max_abs_err > 1.0


def test_an_element_left_unwritten_is_a_mismatch():
    after = RELU.replace("L^{8}_{a=0}", "L^{7}_{a=0}")
    v = verify_pair(RELU, after, RELU_SIG)
    assert v.status == "mismatch" and "NaN" in v.error


@pytest.mark.parametrize("program", [
    "B^{4}_{tx=0}L^{8}_{a=0}[C^{f32,g}_{tx,a}=1.5;];",                                   # constant
    "B^{4}_{tx=0}L^{8}_{a=0}[C^{f32,g}_{tx,a}=A^{f32,g}_{tx,a}-A^{f32,g}_{tx,a};];",     # all zero
])
def test_degenerate_evidence_is_invalid(program):
    v = verify_pair(program, program, RELU_SIG)
    assert v.status == "invalid" and v.error.startswith("degenerate evidence")


def test_a_scalar_output_that_depends_on_the_inputs_is_evidence():
    sig = {"tensors": [{"name": "A", "shape": [4, 8], "dtype": "float64", "role": "input"},
                       {"name": "C", "shape": [], "dtype": "float64", "role": "output"}]}
    total = "B^{4}_{tx=0}L^{8}_{a=0}[C^{f64,g}=C^{f64,g}+A^{f64,g}_{tx,a};];"
    assert verify_pair(total, total, sig).status == "exact"


def test_the_guard_rejects_absurd_programs_before_building():
    builds = BUILD_CACHE.stats.builds
    huge = "B^{4}_{tx=0}L^{8}_{a=0}L^{100000}_{c=0}L^{100000}_{d=0}[C^{f32,g}_{tx,a}=max(A^{f32,g}_{tx,a},0);];"
    v = verify_pair(RELU, huge, RELU_SIG)
    assert v.status == "invalid" and "after: rejected before building" in v.error
    assert "statement executions exceed" in v.error
    assert "bytes" in verify_pair(RELU, RELU, RELU_SIG, limits=Limits(max_buffer_bytes=100)).error
    assert BUILD_CACHE.stats.builds == builds


def test_a_syntax_error_in_after_is_invalid_with_the_parse_message():
    v = verify_pair(RELU, RELU.replace("max(", "max(("), RELU_SIG)
    assert v.status == "invalid"
    assert v.error == "after: 1:63: error: unexpected ',', expected one of ')', '+', '-'"


def test_a_bad_signature_is_invalid():
    v = verify_pair(RELU, RELU, {"tensors": [{"name": "A", "shape": [4, 8], "dtype": "float32", "role": "input"}]})
    assert v.status == "invalid" and v.error.startswith("signature:")


@pytest.mark.parametrize("after, message", [
    ("B^{4}_{tx=0}L^{8}_{a=0}[E^{c64,g}_{tx,a}=A^{f32,g}_{tx,a};C^{f32,g}_{tx,a}=max(A^{f32,g}_{tx,a},0);];",
     "dtype c64 of E cannot be lowered"),
    ("B^{4}_{tx=0}L^{8}_{a=0}[C^{f32,g}_{tx,a}=max(A^{f32,g}_{tx,9},0);];", "reads A out of bounds"),
])
def test_build_errors_name_the_side_and_the_reason(after, message):
    v = verify_pair(RELU, after, RELU_SIG)
    assert v.status == "build_error" and v.error.startswith("after: LoweringError") and message in v.error


@pytest.mark.skipif(__import__("tvm").cuda(0).exist, reason="a GPU is present: CUDA programs run here")
def test_cuda_without_a_gpu_is_a_runtime_error_with_the_reason():
    v = verify_pair(RELU, RELU, RELU_SIG, target="cuda")
    assert v.status == "runtime_error" and "no CUDA GPU" in v.error


def test_inputs_are_deterministic_and_seeded():
    # The reversed reduction's rounding error depends on the exact inputs: equal seeds, equal errors.
    a = verify_pair(MATMUL, MATMUL_REVERSED, MATMUL_SIG, seed=5)
    b = verify_pair(MATMUL, MATMUL_REVERSED, MATMUL_SIG, seed=5)
    c = verify_pair(MATMUL, MATMUL_REVERSED, MATMUL_SIG, seed=6)
    assert (a.max_abs_err, a.rel_l2_err) == (b.max_abs_err, b.rel_l2_err) != (c.max_abs_err, c.rel_l2_err)


def test_the_original_is_built_and_run_once_for_many_transformations():
    from gpu_tasks.jobs import BEFORE_OUTPUTS

    clear_caches()
    statuses = [verify_pair(MATMUL, after, MATMUL_SIG).status for after in MATMUL_VARIANTS]
    assert statuses == ["exact"] * len(MATMUL_VARIANTS)
    stats = BUILD_CACHE.stats
    assert stats.builds == 1 + len(MATMUL_VARIANTS)
    assert stats.text_hits == 0  # the original's outputs on the draws are reused, not recomputed
    assert BEFORE_OUTPUTS.hits == len(MATMUL_VARIANTS) - 1


def test_the_draws_are_drawn_once_per_process_and_kept_read_only():
    from gpu_tasks.inputs import draws_from_plans, plan_inputs
    from gpu_tasks.jobs import DRAWS, drawn

    clear_caches()
    first = [verify_pair(MATMUL, after, MATMUL_SIG) for after in MATMUL_VARIANTS]
    assert DRAWS.hits == len(MATMUL_VARIANTS) - 1
    again = []
    for after in MATMUL_VARIANTS:   # drawn afresh each time: the same verdicts and errors
        clear_caches()
        again.append(verify_pair(MATMUL, after, MATMUL_SIG))
    assert first == again
    sig = MATMUL_SIG
    plans = plan_inputs(sig, [parse_program(MATMUL)])
    kept = drawn(sig, sig.dumps(), plans, 3, 0)
    fresh = draws_from_plans(sig, plans, 3, 0)
    assert all(np.array_equal(kept[d][k], fresh[d][k]) and not kept[d][k].flags.writeable
               for d in range(3) for k in fresh[d])


def test_pairs_verified_apart_in_two_workers_get_the_grouped_verdicts():
    """`verify_apart` (a search's state and the one it verifies ahead): one job per pair, so both
    workers take one; the verdicts are those of `verify_pairs`, and each pair has its own limit."""
    from gpu_tasks.pool import WorkerPool
    from gpu_tasks.verify import pair_request, verify_apart, verify_pairs

    requests = [pair_request(MATMUL, after, MATMUL_SIG) for after in (*MATMUL_VARIANTS, MATMUL_REVERSED)]
    with WorkerPool(workers=2, timeout_s=60) as pool:
        apart = verify_apart(requests, pool)
        assert apart == verify_pairs(requests, pool)
        unbuilt = pair_request(RELU, RELU, RELU_SIG)  # a build no worker holds yet: longer than the limit
        limited = verify_apart([requests[0], unbuilt], pool, [None, 1e-4])
    assert limited[0] == apart[0] and limited[1].status == "timeout"


def test_renamed_programs_share_a_build():
    clear_caches()
    assert verify_pair(MATMUL, MATMUL_RENAMED, MATMUL_SIG).status == "exact"
    assert (BUILD_CACHE.stats.builds, BUILD_CACHE.stats.structural_hits) == (1, 1)


def test_program_objects_and_signature_objects_are_accepted():
    v = verify_pair(parse_program(MATMUL), parse_program(MATMUL_REORDERED), Signature.from_json(MATMUL_SIG.to_json()))
    assert v.status == "exact"


def _cached_scripts() -> list[str]:
    return [func.script() for func, _ in BUILD_CACHE._by_hash.values()]


def test_both_lowering_forms_verify_and_are_cached_apart():
    clear_caches()
    assert verify_pair(MATMUL, MATMUL_REORDERED, MATMUL_SIG, form="tensorir").status == "exact"
    assert verify_pair(MATMUL, MATMUL_WRONG, MATMUL_SIG, form="tensorir").status == "mismatch"
    scripts = _cached_scripts()
    assert len(scripts) == 3 and all("T.sblock(" in s and "T.init()" in s for s in scripts)
    assert verify_pair(MATMUL, MATMUL_REORDERED, MATMUL_SIG).status == "exact"  # plain: its own builds
    assert BUILD_CACHE.stats.builds == 5 and sum("T.sblock(" not in s for s in _cached_scripts()) == 2
    v = verify_against_reference(RELU, RELU_SIG, torch_reference("torch.relu(A)"), form="tensorir")
    assert v.status == "exact"


VEC_SIG = {"tensors": [{"name": "A", "shape": [64], "dtype": "float32", "role": "input"},
                       {"name": "C", "shape": [64], "dtype": "float32", "role": "output"}]}
VEC_DOUBLE = "L^{64}_{a=0}[C^{f32,g}_{a}=A^{f32,g}_{a}*2;];"


@pytest.mark.parametrize("unset", [
    # D is read by the first nest, written only by the second: the first reads leftover memory
    "L^{64}_{a=0}[C^{f32,g}_{a}=D^{f32,g}_{a}*2;];L^{64}_{a=0}[D^{f32,g}_{a}=A^{f32,g}_{a};];",
])
def test_a_program_that_reads_memory_never_written_is_invalid_on_either_side(unset):
    """Its result is whatever the buffer held: it was `exact` at some sizes and a mismatch of 1e33 at
    others, changing between identical runs. `leir check` calls it uninitialised-read; so does verify."""
    clear_caches()
    after = verify_pair(VEC_DOUBLE, unset, VEC_SIG)
    assert after.status == "invalid"
    assert "uninitialised-read" in after.error and "rejected before building" in after.error
    assert verify_pair(unset, VEC_DOUBLE, VEC_SIG).status == "invalid"
    assert verify_pair(VEC_DOUBLE, VEC_DOUBLE, VEC_SIG).status == "exact"


IEEE_SIG = {"tensors": [{"name": "A", "shape": [64], "dtype": "float32", "role": "input"},
                        {"name": "C", "shape": [64], "dtype": "float32", "role": "output"}]}
TWICE = "L^{64}_{a=0}[C^{f32,g}_{a}=A^{f32,g}_{a}*2;];"


@pytest.mark.parametrize("after", [
    "L^{64}_{a=0}[C^{f32,g}_{a}=A^{f32,g}_{a}*2+log(A^{f32,g}_{a})*0;];",       # NaN where A < 0
    "L^{64}_{a=0}[C^{f32,g}_{a}=A^{f32,g}_{a}*2+10000000000.0-10000000000.0;];",  # rounded to 1024s
], ids=["times-zero", "add-subtract"])
def test_arithmetic_that_ieee_computes_differently_is_a_mismatch_not_folded_to_exact(after):
    # TVM's simplifier folded both to A*2 (exact); the before-program does not restrict A's sign, so
    # the after-program's log sees negative draws too
    assert verify_pair(TWICE, after, IEEE_SIG).status == "mismatch"

