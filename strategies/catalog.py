"""Imports every rule module so that each registers its strategies (add new modules here), by level."""
from __future__ import annotations

import importlib

RULE_MODULES = (
    "strategies.rules.graph.fusion",
    "strategies.rules.graph.inline",
    "strategies.rules.graph.expressions",
    "strategies.rules.graph.cse",
    "strategies.rules.graph.stacking",
    "strategies.rules.operator.loops",
    "strategies.rules.operator.fusion",
    "strategies.rules.operator.rfactor",
    "strategies.rules.memory.cache",
    "strategies.rules.memory.layout",
    "strategies.rules.memory.scope",
    "strategies.rules.memory.indices",
    "strategies.rules.mathematical.symbolic",
    "strategies.rules.mathematical.scans",
    "strategies.rules.mathematical.softmax",
    "strategies.rules.mathematical.splits",
)

for _module in RULE_MODULES:
    importlib.import_module(_module)
