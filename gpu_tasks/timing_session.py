"""What one timing session of a group of states gives back, and how it measures: interleaved rounds
until each evaluator's spread is small (`gpu_tasks.state_timing` times whole states,
`gpu_tasks.nest_timing` their nests; both report through these)."""
from __future__ import annotations

import time
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field

import numpy as np

from gpu_tasks.fingerprint import machine_fingerprint


@dataclass(frozen=True)
class StateTime:
    """One state's measurement: `status` `ok` with its samples (µs per run, in round order), their
    median and relative interquartile range; or the failure status (`invalid`, `build_error`,
    `runtime_error`) with `error`."""

    status: str
    samples_us: tuple[float, ...] = ()
    median_us: float | None = None
    spread: float | None = None
    error: str = ""

    @property
    def ok(self) -> bool:
        return self.status == "ok"


@dataclass(frozen=True)
class GroupTiming:
    """The states' times in request order, the session's fingerprint and what it cost."""

    states: tuple[StateTime, ...]
    fingerprint: dict = field(default_factory=dict)
    rounds: int = 0
    build_s: float = 0.0
    measure_s: float = 0.0
    functions: int = 0  # functions compiled and timed: the states, or their distinct nests

    def to_json(self) -> dict:
        return asdict(self)


def session_fingerprint(target: str = "llvm", arch: str = "sm_90") -> dict:
    """The machine fingerprint of timings made here for `target` (its full target string, the CPU
    included): what the timing rows of one machine share (a pool job: the worker's thread settings)."""
    from leir.lower import make_target

    return machine_fingerprint(str(make_target(target, arch)))


def measure_rounds(evaluators: Sequence, args: list, request,
                   spreads=None) -> tuple[list[list[float]], int]:
    """Seconds per run of each evaluator, in interleaved rounds (forward, then reverse order); after
    `min_rounds`, only evaluators whose spread is above `target_spread` go on, up to `max_rounds` or
    until `max_measure_s` have passed. `spreads(samples)` gives every evaluator's spread (default: its
    relative interquartile range)."""
    for evaluate in evaluators:
        evaluate(*args)  # warm-up: caches, page faults, the thread pool's start
    samples: list[list[float]] = [[] for _ in evaluators]
    live = list(range(len(evaluators)))
    start, rounds = time.perf_counter(), 0
    while live and rounds < request.max_rounds:
        order = live if rounds % 2 == 0 else list(reversed(live))
        for i in order:
            samples[i].append(float(evaluators[i](*args).mean))
        rounds += 1
        if rounds >= request.min_rounds:
            if time.perf_counter() - start > request.max_measure_s:
                break
            spread = spreads(samples) if spreads else [relative_iqr(x) for x in samples]
            live = [i for i in live if spread[i] > request.target_spread]
    return samples, rounds


def relative_iqr(values: Sequence[float]) -> float:
    """Interquartile range over the median (0 for fewer than two values)."""
    if len(values) < 2:
        return 0.0
    q25, median, q75 = np.percentile(values, [25, 50, 75])
    return float((q75 - q25) / median) if median > 0 else 0.0
