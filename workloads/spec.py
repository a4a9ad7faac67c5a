"""What a catalogue workload is: shape parameters (each with a role of the shape model,
`workloads.shapes`), inputs, dtypes, a family for the train/test split, and a factory of the PyTorch
module.
"""
from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

import torch
import torch.nn as nn

from workloads.shapes import PROFILES, role_values

DEFAULT_DTYPES = ("float32", "float16", "float64", "bfloat16")


@dataclass(frozen=True)
class Param:
    """An integer shape parameter. In the `tiny` profile it takes `low..high` (tests); in the model
    profiles it draws from its `role`'s values (`workloads.shapes.ROLE_VALUES`, or the odd extents of
    that role). `choices` fixes the values in every profile (kernel sizes, groups); `same_as` ties the
    parameter to another one in the model profiles (square images)."""

    name: str
    low: int = 1
    high: int = 1
    role: str | None = None
    multiple_of: int = 1
    choices: tuple[int, ...] = ()
    same_as: str | None = None

    def __post_init__(self):
        if not self.choices and self.role is None:
            raise ValueError(f"parameter {self.name}: give a role or choices")
        if self.role is not None:
            role_values(self.role)  # an unknown role fails here, when the catalogue is built

    def values(self, profile: str, odd: bool = False) -> list[int]:
        if profile not in PROFILES:
            raise ValueError(f"unknown profile {profile!r}; expected one of {', '.join(PROFILES)}")
        if self.choices:
            return list(self.choices)
        found = range(self.low, self.high + 1) if profile == "tiny" else role_values(self.role, odd)
        return [v for v in found if v % self.multiple_of == 0]

    def to_json(self) -> dict:
        return {"name": self.name, "role": self.role, "tiny": _span(self.values("tiny")),
                "model": list(self.values("default")), "odd": list(self.values("default", odd=True)),
                "multiple_of": self.multiple_of, "same_as": self.same_as}


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
