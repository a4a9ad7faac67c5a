"""Lowering LEIR to TVM TIR, building it, and running it (the public API; docs/leir.md §4).

- `lower_to_primfunc` / `lower_to_script`: a program and its signature -> a PrimFunc named `main`
  whose arguments are the signature's tensors in order, or its TVMScript text (byte-identical for
  the same input, in every process), in one of two `FORMS`: `plain` (below) or `tensorir`, TVM's
  block form that `tvm.s_tir.Schedule` and MetaSchedule work with (`leir.lower.tensorir`); both
  compute the same values;
- `build`: `tvm.compile` for `llvm` (the host CPU, with its `mcpu`) or `cuda` (`arch`, sm_90 by
  default); the executable is called as `ex["main"](*tensors)` with outputs preallocated;
- `cuda_source`: the CUDA C source, without a GPU (no compiler runs);
- `run_numpy` / `run_executable`: run on numpy inputs, return the outputs by name;
- `plan`: the lowering decisions, with a note for every loop lowered differently from its kind.

How LEIR maps to TIR (modules: `check` checks, `rules` decisions, `planner` the
plan tree, `expr` expressions and types, `emit` the IR builder of the plain form, `blocks` and
`tensorir` the block form):
- plain loops and buffer stores (no schedulable blocks), one store per statement, program order;
- `L` serial, `U` unrolled, `P` parallel and `V` vectorized on the CPU, `B` bound to its CUDA
  thread index on CUDA and serial on the CPU; a `P`, `V` or `B` loop across which distinct
  iterations write the same element (a reduction axis, a scatter) is lowered serially, since running
  it in parallel would race; `V` only vectorizes an innermost loop, and a `P` inside a parallel loop
  stays serial (TVM's CPU backend has no nested parallelism);
- implicit initialisation (§4.4) is an explicit fill of exactly the elements a reduction writes,
  placed inside the spatial loops that partition them (else before the nest), never `T.init()`, so
  that it holds for any subscripts and any loop order;
- intermediates get the inferred shape, their dtype and scope; on CUDA, `g` intermediates are device
  workspaces allocated by the host, `s`/`l` intermediates live in the kernel that uses them and are
  promoted to global memory when their value crosses kernels; a nest with statements outside every
  thread binding runs as a one-thread kernel.
"""
from __future__ import annotations

from dataclasses import replace
from functools import lru_cache

import numpy as np
import tvm

from leir.analysis import program_depth
from leir.ast import Program
from leir.lower.blocks import plan_blocks
from leir.lower.emit import emit_primfunc
from leir.lower.planner import TARGET_KINDS, LoweringError, Plan, plan_program
from leir.lower.stack import call_with_stack_for
from leir.lower.tensorir import emit_tensorir
from leir.parse import parse_program
from leir.signature import Signature

__all__ = [
    "LoweringError", "make_target", "lower_to_primfunc", "lower_to_script", "build", "cuda_source",
    "run_numpy", "run_executable", "plan", "TARGET_KINDS", "FORMS",
]

# plain: loops and stores (fast to build); tensorir: blocks with iterator kinds, regions and T.init
FORMS = ("plain", "tensorir")


@lru_cache(maxsize=1)
def _host_cpu() -> str:
    return tvm.target.codegen.llvm_get_system_cpu()


def make_target(kind: str = "llvm", arch: str = "sm_90") -> tvm.target.Target:
    """The host CPU with its `mcpu` (float16 is 10-300x slower without it), or CUDA for `arch`
    (always explicit: TVM's default sm_50 is rejected by current nvcc)."""
    if kind == "llvm":
        return tvm.target.Target({"kind": "llvm", "mcpu": _host_cpu()})
    if kind == "cuda":
        return tvm.target.Target({"kind": "cuda", "arch": arch})
    raise LoweringError(f"unknown target kind {kind!r}; expected one of {', '.join(TARGET_KINDS)}")


def plan(program: Program | str, signature: Signature | dict | str, target_kind: str = "llvm",
         form: str = "plain") -> Plan:
    """The lowering decisions (loop kinds with the reason for each change, fills, allocations); for
    the tensorir form, its notes also say where a scan iterator or an explicit init block was needed."""
    program, signature = _as_program(program), _as_signature(signature)
    p = plan_program(program, signature, _checked_form(target_kind, form))
    if form == "tensorir":
        return replace(p, notes=p.notes + plan_blocks(p, program, signature).notes)
    return p


def lower_to_primfunc(program: Program | str, signature: Signature | dict | str,
                      target_kind: str = "llvm", form: str = "plain") -> tvm.tirx.PrimFunc:
    program, signature = _as_program(program), _as_signature(signature)
    return call_with_stack_for(program_depth(program), _primfunc, program, signature, target_kind, form)


def _primfunc(program: Program, signature: Signature, target_kind: str, form: str) -> tvm.tirx.PrimFunc:
    p = plan_program(program, signature, _checked_form(target_kind, form))
    try:
        if form == "tensorir":
            return emit_tensorir(p, plan_blocks(p, program, signature), signature)
        return emit_primfunc(p, signature)
    except LoweringError:
        raise
    except Exception as e:  # a TVM check that the plan did not anticipate: keep its message
        raise LoweringError(f"cannot express the program in TIR: {_last_line(e)}") from e


def lower_to_script(program: Program | str, signature: Signature | dict | str,
                    target_kind: str = "llvm", form: str = "plain") -> str:
    program, signature = _as_program(program), _as_signature(signature)
    return call_with_stack_for(program_depth(program),
                               lambda: _primfunc(program, signature, target_kind, form).script())


def build(program: Program | str, signature: Signature | dict | str, target_kind: str = "llvm",
          arch: str = "sm_90", form: str = "plain"):
    program, signature = _as_program(program), _as_signature(signature)
    return call_with_stack_for(program_depth(program), _build, program, signature, target_kind, arch, form)


def _build(program: Program, signature: Signature, target_kind: str, arch: str, form: str):
    func = _primfunc(program, signature, target_kind, form)
    target = make_target(target_kind, arch)
    try:
        return tvm.compile(tvm.IRModule({"main": func}), target=target)
    except Exception as e:
        raise LoweringError(f"TVM could not build the program for {target_kind}: {_last_line(e)}") from e


def cuda_source(program: Program | str, signature: Signature | dict | str, arch: str = "sm_90",
                form: str = "plain") -> str:
    program = _as_program(program)
    return call_with_stack_for(program_depth(program),
                               lambda: build(program, signature, "cuda", arch, form).mod.imports[0].inspect_source())


def run_numpy(program: Program | str, signature: Signature | dict | str,
              inputs: dict[str, np.ndarray], form: str = "plain") -> dict[str, np.ndarray]:
    """Build for the CPU, run once and return the outputs by name. Inputs are converted to the
    signature's dtypes; outputs start as zeros."""
    signature = _as_signature(signature)
    return run_executable(build(program, signature, "llvm", form=form), signature, inputs)


def run_executable(ex, signature: Signature | dict | str, inputs: dict[str, np.ndarray],
                   device=None) -> dict[str, np.ndarray]:
    """Run a built executable once on numpy inputs (converted to the signature's dtypes) on `device`
    (the CPU by default); outputs start as zeros and are returned by name."""
    signature = _as_signature(signature)
    device = device or tvm.cpu()
    args, outputs = [], {}
    for spec in signature.tensors:
        if spec.role == "input":
            if spec.name not in inputs:
                raise LoweringError(f"run_numpy: no value for input {spec.name}")
            arr = np.array(inputs[spec.name], dtype=numpy_dtype(spec.dtype), order="C")  # keeps 0-d
            if arr.shape != spec.shape:
                raise LoweringError(f"run_numpy: input {spec.name} has shape {arr.shape}, the signature "
                                    f"says {spec.shape}")
        else:
            arr = np.zeros(spec.shape, numpy_dtype(spec.dtype))
        t = tvm.runtime.tensor(arr, device)
        args.append(t)
        if spec.role == "output":
            outputs[spec.name] = t
    ex["main"](*args)
    return {name: t.numpy() for name, t in outputs.items()}


def numpy_dtype(torch_name: str):
    if torch_name == "bfloat16":
        import ml_dtypes  # TVM's own dependency for bfloat16 arrays

        return ml_dtypes.bfloat16
    return np.dtype(torch_name)


def _checked_form(target_kind: str, form: str) -> str:
    """The target kind, once `form` is known (the target is checked by the planner)."""
    if form not in FORMS:
        raise LoweringError(f"unknown form {form!r}; expected one of {', '.join(FORMS)}")
    return target_kind


def _as_program(program: Program | str) -> Program:
    return parse_program(program) if isinstance(program, str) else program


def _as_signature(signature: Signature | dict | str) -> Signature:
    return signature if isinstance(signature, Signature) else Signature.from_json(signature)


def _last_line(e: Exception) -> str:
    lines = [ln.strip() for ln in str(e).strip().splitlines() if ln.strip()]
    return lines[-1] if lines else type(e).__name__
