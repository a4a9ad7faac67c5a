"""What one timing session of a group of states gives back, and how it measures: interleaved rounds
until every comparison the caller asked for is decided (`gpu_tasks.state_timing` times whole states,
`gpu_tasks.nest_timing` their nests; both report through these).

The stopping rule: after `min_rounds`, a state goes on while a comparison it is part of
(`pairs`: a step's before and after state) has an interval that is still `unresolved`
(`gpu_tasks.effect`) and wider than TIGHT (an interval that narrow straddles a bound of the noise
margin: the effect lies at the bound, and more rounds would not move it off); a state in no
comparison goes on while its relative interquartile range is above `target_spread`. Every state
stops at `max_rounds`, or when the group has used `max_measure_s`.
"""
from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, field

import numpy as np

from gpu_tasks.effect import NOISE_MARGIN, classify, speedup_interval
from gpu_tasks.fingerprint import machine_fingerprint

TIGHT = 1 + NOISE_MARGIN / 2  # high / low of an interval that more rounds would not resolve


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


def state_time(samples_us: Sequence[float]) -> StateTime:
    us = [float(v) for v in samples_us]
    return StateTime("ok", tuple(us), float(np.median(us)), relative_iqr(us))


@dataclass(frozen=True)
class GroupTiming:
    """The states' times in request order, the session's fingerprint and what it cost. `whole`: in a
    nest-by-nest session, each state's whole-state time where it was timed whole too (else None)."""

    states: tuple[StateTime, ...]
    fingerprint: dict = field(default_factory=dict)
    rounds: int = 0
    build_s: float = 0.0
    measure_s: float = 0.0
    functions: int = 0  # functions compiled and timed: the states, or their distinct nests
    whole: tuple[StateTime | None, ...] = ()
    nests: tuple[int | None, ...] = ()  # each state's number of top-level nests (None: it did not parse)

    def to_json(self) -> dict:
        return asdict(self)


def session_fingerprint(target: str = "llvm", arch: str = "sm_90") -> dict:
    """The machine fingerprint of timings made here for `target` (its full target string, the CPU
    included): what the timing rows of one machine share (a pool job: the worker's thread settings)."""
    from leir.lower import make_target

    return machine_fingerprint(str(make_target(target, arch)))


LiveFn = Callable[[list[list[float]], list[int]], list[int]]


def measure_rounds(evaluators: Sequence, args: list, request, live: LiveFn | None = None
                   ) -> tuple[list[list[float]], int]:
    """Seconds per run of each evaluator, in interleaved rounds (forward, then reverse order); after
    `min_rounds`, only the evaluators `live(samples, alive)` keeps go on (default: those whose relative
    interquartile range is above `target_spread`), up to `max_rounds` or until `max_measure_s` have
    passed."""
    for evaluate in evaluators:
        evaluate(*args)  # warm-up: caches, page faults, the thread pool's start
    samples: list[list[float]] = [[] for _ in evaluators]
    alive = list(range(len(evaluators)))
    start, rounds = time.perf_counter(), 0
    while alive and rounds < request.max_rounds:
        order = alive if rounds % 2 == 0 else list(reversed(alive))
        for i in order:
            samples[i].append(float(evaluators[i](*args).mean))
        rounds += 1
        if rounds >= request.min_rounds:
            if time.perf_counter() - start > request.max_measure_s:
                break
            alive = (live(samples, alive) if live is not None
                     else [i for i in alive if relative_iqr(samples[i]) > request.target_spread])
    return samples, rounds


def undecided_states(samples: dict[int, list[float]], pairs: Sequence[tuple[int, int]], target_spread: float,
                     min_rounds: int, margin: float = NOISE_MARGIN) -> set[int]:
    """The states of `samples` (state index -> samples so far, paired by round) still to time: those
    in a pair whose interval is unresolved, and those in no pair whose spread is above
    `target_spread`. A pair with a side missing from `samples` (it failed) is ignored."""
    paired = {i for p in pairs for i in p if all(k in samples for k in p)}
    out = {i for i, s in samples.items() if i not in paired and relative_iqr(s) > target_spread}
    for b, a in pairs:
        if b not in samples or a not in samples:
            continue
        sb, sa = samples[b], samples[a]
        n = min(len(sb), len(sa))
        if n < min_rounds:
            out |= {b, a}
            continue
        low, high = speedup_interval(sb[:n], sa[:n], f"{b}-{a}", paired=True)
        if classify(low, high, margin) == "unresolved" and high > TIGHT * low:
            out |= {b, a}
    return out


def relative_iqr(values: Sequence[float]) -> float:
    """Interquartile range over the median (0 for fewer than two values)."""
    if len(values) < 2:
        return 0.0
    q25, median, q75 = np.percentile(values, [25, 50, 75])
    return float((q75 - q25) / median) if median > 0 else 0.0
