"""Imports every strategy module so that each registers itself (add new modules here)."""
from __future__ import annotations

import importlib

STRATEGY_MODULES = (
    "strategies.graph",
    "strategies.loops",
    "strategies.memory",
    "strategies.algebra",
    "strategies.softmax",
    "strategies.softmax_splits",
    "strategies.graph_tensors",
)

for _module in STRATEGY_MODULES:
    try:
        importlib.import_module(_module)
    except ModuleNotFoundError as e:  # a level not written yet
        if e.name != _module:
            raise
