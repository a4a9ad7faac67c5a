"""What a verification job is asked: the requests the pool's workers run (`gpu_tasks.jobs`), kept
apart from the jobs so that a process that only sends work (a flow, a Dask worker, `steptp verify`)
builds them without importing TVM or PyTorch."""
from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

import numpy as np

from gpu_tasks.guard import DEFAULT_LIMITS, Limits


@dataclass(frozen=True)
class PairRequest:
    """Verify `after` against `before` (LEIR text) under `signature` (JSON text)."""

    before: str
    after: str
    signature: str
    target: str = "llvm"
    arch: str = "sm_90"
    draws: int = 3
    seed: int = 0
    tolerances: Mapping | None = None
    limits: Limits = DEFAULT_LIMITS
    form: str = "plain"  # the lowering form both sides are built in (leir.lower.FORMS)


@dataclass(frozen=True)
class ReferenceRequest:
    """Verify `program` against outputs computed elsewhere (e.g. PyTorch) on the given inputs."""

    program: str
    signature: str
    inputs: list[dict[str, np.ndarray]]
    expected: list[dict[str, np.ndarray]]
    target: str = "llvm"
    arch: str = "sm_90"
    tolerances: Mapping | None = None
    limits: Limits = DEFAULT_LIMITS
    form: str = "plain"
    own: list[dict[str, np.ndarray]] | None = None  # PyTorch in the program's dtype (compare.judge)
    own_factor: float = 2.0
