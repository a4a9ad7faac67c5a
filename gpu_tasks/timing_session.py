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

import math
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


class Sampler:
    """One function's samples: each call TVM's `time_evaluator` mean over a batch of back-to-back runs
    (after the evaluator's own discarded warm-up run, which brings the function's data back into the
    caches after the other functions of a round).

    The first call calibrates: an evaluator that grows its batch until it lasts `min_repeat_ms`.
    Every later call runs a fixed batch of `runs` = ceil(min_repeat_ms / that mean): each sample then
    lasts about `min_repeat_ms` (a little less once the function runs faster than while it was
    calibrated: 1.75-2.0 ms of a 2 ms length on small kernels), and every sample of a session
    averages the same number of runs. Left to itself, TVM's evaluator keeps its batch
    between calls and multiplies it by 1.618 whenever a batch falls under `min_repeat_ms`, so after a
    dip in the machine's speed a microsecond kernel's samples lasted 1.6 times the sample length (3.3
    ms per 2 ms sample, measured on the release states), the time of the rounds and nothing gained."""

    def __init__(self, module, name: str, device, min_repeat_ms: int):
        self._module, self._name, self._device = module, name, device
        self.min_repeat_ms = int(min_repeat_ms)
        self.runs: int | None = None  # the batch, once calibrated
        self._evaluate = module.time_evaluator(name, device, number=1, repeat=1, min_repeat_ms=self.min_repeat_ms)

    def __call__(self, *args):
        result = self._evaluate(*args)
        if self.runs is None:
            self.runs = runs_per_sample(float(result.mean), self.min_repeat_ms)
            self._evaluate = self._module.time_evaluator(self._name, self._device, number=self.runs, repeat=1,
                                                         min_repeat_ms=0)
        return result


def runs_per_sample(mean_s: float, min_repeat_ms: float) -> int:
    """The batch whose runs of `mean_s` seconds last `min_repeat_ms` (at least one run)."""
    if mean_s <= 0:
        return 1
    return max(1, math.ceil(min_repeat_ms * 1e-3 / mean_s - 1e-9))


LiveFn = Callable[[list[list[float]], list[int]], list[int]]


def measure_rounds(evaluators: Sequence, args: list, request, live: LiveFn | None = None
                   ) -> tuple[list[list[float]], int]:
    """Seconds per run of each evaluator, in interleaved rounds (forward, then reverse order); after
    `min_rounds`, only the evaluators `live(samples, alive)` keeps go on (default: those whose relative
    interquartile range is above `target_spread`), up to `max_rounds` or until `max_measure_s` have
    passed."""
    for evaluate in evaluators:
        evaluate(*args)  # warm-up: caches, page faults, the thread pool's start; a Sampler's calibration
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
