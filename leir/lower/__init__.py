"""LEIR -> TVM TIR: lowering, building, running (docs/leir.md §4). The public API lives in `api`:

`lower_to_primfunc`, `lower_to_script`, `build`, `cuda_source`, `run_numpy`, `run_executable`, `plan`,
`make_target`, in two forms (`FORMS`: `plain` loops and stores, or `tensorir` blocks). The steps:
`check` (what TIR cannot express), `rules` (loop-kind and fill decisions), `planner` (the plan tree),
`expr` (expressions and types), `emit` (the IR builder of the plain form), `blocks` and `tensorir`
(the block form).

The API names are loaded on first use (PEP 562), so that the planning modules import without TVM.
"""
from __future__ import annotations

__all__ = [
    "LoweringError", "make_target", "lower_to_primfunc", "lower_to_script", "build", "cuda_source",
    "run_numpy", "run_executable", "plan", "TARGET_KINDS", "FORMS",
]


def __getattr__(name: str):
    if name in __all__:
        from leir.lower import api

        return getattr(api, name)
    raise AttributeError(f"module 'leir.lower' has no attribute {name!r}")
