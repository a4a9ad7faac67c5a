"""PyTorch eager reference of a translated module: signature inputs (numpy) -> output (numpy, float64).

Data inputs are passed positionally; parameters and buffers replace the module's own through
`torch.func.functional_call`, so the program is compared as a function of every signature input.
When the trace created tensor constants, the traced GraphModule (which owns them) runs instead.

`make_reference` computes in float64 (the reference); with `dtype` it runs a copy of the module in
that dtype instead (PyTorch's own result in the program's dtype, e.g. float16): how far that is from
the float64 reference says how well the dtype can do on those inputs at all.
"""
from __future__ import annotations

import copy
from collections.abc import Sequence

import numpy as np
import torch
from torch.func import functional_call


def _paths(module: torch.nn.Module) -> dict[int, str]:
    found = {}
    for name, t in module.named_parameters(remove_duplicate=False):
        found.setdefault(id(t), name)
    for name, t in module.named_buffers(remove_duplicate=False):
        found.setdefault(id(t), name)
    return found


def _constant_paths(gm) -> dict[int, str]:
    found = {}
    for name, t in gm.named_buffers(remove_duplicate=False):
        found.setdefault(id(t), name)
    for name, value in vars(gm).items():
        if isinstance(value, torch.Tensor):
            found.setdefault(id(value), name)
    return found


def make_reference(module, gm, plan, inputs64: Sequence, dtype: torch.dtype = torch.float64):
    """A function `inputs: dict[name, np.ndarray] -> np.ndarray` running `module` with its floating
    tensors in `dtype` (float64 by default); the result is returned as float64."""
    runner = gm if plan.constants else module
    paths = _constant_paths(gm) if plan.constants else {}
    paths.update(_paths(runner))
    bound = [(ref.name, paths[id(t)], t.dtype) for ref, t in plan.constants + plan.parameters]
    if dtype != torch.float64:
        runner = copy.deepcopy(runner).to(dtype)  # the same paths, its own tensors
    positions = [i for i, x in enumerate(inputs64) if isinstance(x, torch.Tensor)]
    input_names = [r.name for r in plan.inputs]
    fixed = list(inputs64)

    def reference(inputs: dict[str, np.ndarray]) -> np.ndarray:
        args = list(fixed)
        for pos, name in zip(positions, input_names, strict=True):
            args[pos] = _tensor(inputs[name], fixed[pos].dtype, dtype)
        state = {path: _tensor(inputs[name], like, dtype) for name, path, like in bound}
        with torch.no_grad():
            result = functional_call(runner, state, tuple(args))
        return _to_numpy(result)

    return reference


def _tensor(array, like_dtype, float_dtype=torch.float64) -> torch.Tensor:
    t = torch.as_tensor(np.asarray(array, dtype=np.float64) if _is_float_array(array) else np.asarray(array))
    if t.dtype.is_floating_point or like_dtype.is_floating_point:
        return t.to(float_dtype) if like_dtype.is_floating_point else t.to(like_dtype)
    return t.to(like_dtype)


def _is_float_array(array) -> bool:
    a = np.asarray(array)
    return a.dtype.kind == "f" or a.dtype.name == "bfloat16"


def _to_numpy(result) -> np.ndarray:
    if isinstance(result, tuple | list):
        return np.stack([_to_numpy(r) for r in result])
    result = result.detach().cpu()
    return (result.to(torch.float64) if result.is_floating_point() else result).numpy().copy()
