"""What a catalogue workload is: shape parameters with ranges and constraints, inputs, dtypes, a
family for the train/test split, and a factory of the PyTorch module.

Two profiles: `default` ranges keep every instance small enough to translate and verify on a CPU in
well under a second; `full` ranges give the larger shapes of a full build.
"""
from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

import torch
import torch.nn as nn

PROFILES = ("default", "full")
DEFAULT_DTYPES = ("float32", "float16", "float64")


@dataclass(frozen=True)
class Param:
    """An integer shape parameter: values `low..high` (multiples of `multiple_of`) per profile, or an
    explicit tuple of `choices` (then the same in both profiles)."""

    name: str
    low: int = 1
    high: int = 1
    full_low: int | None = None
    full_high: int | None = None
    multiple_of: int = 1
    choices: tuple[int, ...] = ()

    def values(self, profile: str) -> list[int]:
        if self.choices:
            return list(self.choices)
        lo, hi = (self.low, self.high) if profile == "default" else (
            self.full_low if self.full_low is not None else self.low,
            self.full_high if self.full_high is not None else self.high)
        return [v for v in range(lo, hi + 1) if v % self.multiple_of == 0]

    def to_json(self) -> dict:
        return {"name": self.name, "default": _span(self.values("default")), "full": _span(self.values("full")),
                "multiple_of": self.multiple_of}


def _span(values: list[int]) -> list[int]:
    return [values[0], values[-1]] if values else []


@dataclass(frozen=True)
class Input:
    """One forward argument. `kind`: float, positive (floats > 0), unit (floats in (0, 1)), index
    (int64 in [0, high(p))), sign (+1/-1 floats) or bool."""

    shape: Callable[[dict], tuple[int, ...]]
    kind: str = "float"
    high: Callable[[dict], int] | None = None

    def make(self, params: dict, dtype: torch.dtype, gen: torch.Generator) -> torch.Tensor:
        shape = tuple(self.shape(params))
        if self.kind == "index":
            return torch.randint(0, self.high(params), shape, generator=gen)
        if self.kind == "bool":
            return torch.rand(shape, generator=gen) > 0.5
        x = torch.randn(shape, generator=gen, dtype=torch.float64)
        if self.kind == "positive":
            x = x.abs() + 0.1
        elif self.kind == "unit":
            x = torch.sigmoid(x)
        elif self.kind == "sign":
            x = torch.where(x >= 0, 1.0, -1.0).to(torch.float64)
        return x.to(dtype)


@dataclass(frozen=True)
class Workload:
    name: str
    family: str
    kind: str  # "single" or "composite"
    params: tuple[Param, ...]
    inputs: tuple[Input, ...]
    module: Callable[[dict], nn.Module]
    constraint: Callable[[dict], bool] = field(default=lambda p: True)
    dtypes: tuple[str, ...] = DEFAULT_DTYPES
    description: str = ""

    def to_json(self) -> dict:
        return {"name": self.name, "family": self.family, "kind": self.kind, "dtypes": list(self.dtypes),
                "params": [p.to_json() for p in self.params], "description": self.description}


def op_module(name: str, forward: Callable, layers: Callable[[], dict] | None = None) -> nn.Module:
    """A module of its own class `name` whose forward is `forward(self, *inputs)`; `layers()` gives
    the sub-modules (parameters) it owns."""
    def __init__(self):
        nn.Module.__init__(self)
        for key, layer in (layers() if layers else {}).items():
            setattr(self, key, layer)

    cls = type(name, (nn.Module,), {"__init__": __init__, "forward": forward})
    return cls()
