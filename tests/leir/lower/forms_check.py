"""Both lowering forms of a program, built and run on the same seeded draws: do they agree bitwise?"""
from __future__ import annotations

import numpy as np
import tvm

from gpu_tasks.inputs import make_draws
from gpu_tasks.runner import make_arguments
from leir import Signature, parse_program
from leir.lower import build


def form_outputs(program, signature: Signature, form: str, draws: list[dict]) -> list[dict[str, np.ndarray]]:
    ex = build(program, signature, "llvm", form=form)
    outs = []
    for inputs in draws:
        args = make_arguments(signature, inputs, tvm.cpu(0))
        ex["main"](*args)
        outs.append({s.name: a.numpy() for s, a in zip(signature.tensors, args, strict=True) if s.role == "output"})
    return outs


def forms_disagree(program, signature: Signature, draws: int = 2, seed: int = 0) -> str:
    """'' when the plain and the tensorir form give bitwise-equal outputs on every draw (NaN equal to
    NaN, so that unwritten sentinel elements must match too), else what differs."""
    program = parse_program(program) if isinstance(program, str) else program
    inputs = make_draws(signature, [program], draws, seed)
    plain = form_outputs(program, signature, "plain", inputs)
    blocks = form_outputs(program, signature, "tensorir", inputs)
    for k, (p, b) in enumerate(zip(plain, blocks, strict=True)):
        for name in p:
            if not np.array_equal(p[name], b[name], equal_nan=True):
                diff = np.nanmax(np.abs(p[name].astype(np.float64) - b[name].astype(np.float64)))
                return f"draw {k}, output {name}: max difference {diff}"
    return ""


def block_names(func) -> list[str]:
    """Names of the function's blocks below the root, as the scheduler lists them."""
    sch = tvm.s_tir.Schedule(func)
    names, stack = [], list(sch.get_child_blocks(sch.get_sblock("root")))
    while stack:
        rv = stack.pop(0)
        names.append(sch.get(rv).name_hint)
        stack.extend(sch.get_child_blocks(rv))
    return names


def schedule_rejects(func) -> str:
    """'' when `tvm.s_tir.Schedule` accepts the function with every check on and finds each block by
    name, else why not."""
    try:
        sch = tvm.s_tir.Schedule(func, debug_mask="all")
        for name in block_names(func):
            sch.get_sblock(name)
    except Exception as e:  # TVM's own error types
        return str(e).strip().splitlines()[-1]
    return ""
