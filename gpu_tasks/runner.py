"""Run a built program on numpy inputs: tensors in signature order, outputs preallocated here.

Outputs start filled with a sentinel (NaN for floats, the dtype's minimum for integers), never with
zeros or leftovers: an element that a program forgets to write, or an accumulator it forgets to
initialise, then shows up as a difference instead of passing by luck.
"""
from __future__ import annotations

from collections.abc import Mapping

import numpy as np
import tvm

from gpu_tasks.cache import Built
from gpu_tasks.inputs import numpy_dtype
from leir.signature import Signature, TensorSpec


class NoDeviceError(RuntimeError):
    """The target's device is not present on this machine (CUDA without a GPU)."""


def cuda_present() -> bool:
    """Whether this machine has a CUDA GPU that TVM can run on."""
    return bool(tvm.cuda(0).exist)


def device_for(target_kind: str):
    if target_kind != "cuda":
        return tvm.cpu(0)
    device = tvm.cuda(0)
    if not device.exist:
        raise NoDeviceError("no CUDA GPU on this machine: CUDA programs build here but cannot run")
    return device


def sentinel_array(spec: TensorSpec) -> np.ndarray:
    dtype = numpy_dtype(spec.dtype)
    if dtype == np.bool_:
        fill = True
    elif np.issubdtype(dtype, np.integer):
        fill = np.iinfo(dtype).min
    else:
        fill = np.nan
    return np.full(spec.shape, fill, dtype=dtype)


def make_arguments(signature: Signature, inputs: Mapping[str, np.ndarray], device) -> list:
    """TVM tensors in signature order: the given inputs, sentinel-filled outputs."""
    args = []
    for spec in signature.tensors:
        array = inputs[spec.name] if spec.role == "input" else sentinel_array(spec)
        # Not np.ascontiguousarray: it turns a 0-d array into shape (1,).
        args.append(tvm.runtime.tensor(np.require(array, requirements="C"), device))
    return args


def run_built(built: Built, signature: Signature, inputs: Mapping[str, np.ndarray],
              target_kind: str = "llvm") -> dict[str, np.ndarray]:
    """One run; returns every output by name."""
    args = make_arguments(signature, inputs, device_for(target_kind))
    built.function(*args)
    return {spec.name: arg.numpy() for spec, arg in zip(signature.tensors, args, strict=True)
            if spec.role == "output"}
