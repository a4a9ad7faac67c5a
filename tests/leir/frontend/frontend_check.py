"""Numerical check of a translation for the tests: the program (through the verifier when the TVM
lowering is present, else through the test interpreter) against PyTorch eager in float64."""
from __future__ import annotations

import numpy as np

from tests.leir._interp import run_program


def have_verifier() -> bool:
    try:
        import gpu_tasks.verify  # noqa: F401
    except ImportError:
        return False
    return True


def draw(translation, seed: int = 0) -> dict[str, np.ndarray]:
    """Standard-normal floats; integer inputs keep the translation's example values (valid indices)."""
    rng = np.random.default_rng(seed)
    inputs = {}
    for spec in translation.signature.inputs:
        example = translation.example_inputs.get(spec.name)
        if example is not None and example.dtype.kind in "iub":
            inputs[spec.name] = example
        else:
            inputs[spec.name] = rng.standard_normal(spec.shape)
    return inputs


def interpret_error(translation, seed: int = 0) -> float:
    """Max absolute error of the interpreted program against the reference on one draw."""
    inputs = draw(translation, seed)
    got = run_program(translation.program, translation.signature, inputs)
    want = translation.reference(inputs)
    assert got.shape == want.shape, (got.shape, want.shape)
    both_nan = np.isnan(got) & np.isnan(want)
    return float(np.max(np.abs(np.where(both_nan, 0, got - want)), initial=0.0))
