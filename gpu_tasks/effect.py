"""A step's measured effect from its two states' samples: an interval, never a threshold
on the spread. Pure arithmetic (numpy), no TVM: the timing workers, the release and the reports use it.

When both states were timed in one session (the same rounds, interleaved: `paired`), the speedup of
a step is the median over the rounds of before/after within a round, and its interval a bootstrap
over the rounds, resampled as pairs: what disturbs one round (a burst of another process, a slow
phase of the host) moves both sides of it and cancels in its ratio. On this project's 2-core
machines that resolves a tenth more of the steps than the ratio of the two medians with the same
rounds (benchmarks/bench_repeatability.py measures what the choice does to two sessions' agreement).
From two sessions the speedup is the ratio of the medians, each side resampled on its own (wider).
The percentile interval at LEVEL is read off RESAMPLES resamples drawn from a generator seeded by the
step's identity, so the same samples always give the same interval.

The class (`classify`): with the noise margin m (NOISE_MARGIN: a difference no one would deploy for,
and what two sessions of this machine disagree by on a steady kernel):

- `faster` when the whole interval lies above 1 + m, `slower` when it lies below 1 / (1 + m);
- `neutral` when the whole interval lies within [1 / (1 + m), 1 + m];
- `unresolved` otherwise: the interval straddles a bound, the states were never timed tightly
  enough to say. Never `neutral` by default.
"""
from __future__ import annotations

import hashlib
import math
from collections.abc import Sequence

import numpy as np

NOISE_MARGIN = 0.05
LEVEL = 0.95
RESAMPLES = 2000
MIN_SAMPLES = 5  # fewer samples on a side give no interval: `unresolved`
EFFECTS = ("faster", "neutral", "slower", "unresolved")
RESOLVED = ("faster", "neutral", "slower")


def _generator(key: str) -> np.random.Generator:
    return np.random.default_rng(int.from_bytes(hashlib.sha256(key.encode()).digest()[:8], "little"))


def point_speedup(before: Sequence[float], after: Sequence[float], paired: bool = False) -> float:
    """The speedup: the median of the rounds' before/after (`paired`), else median(before) / median(after)."""
    b, a = np.asarray(before, dtype=float), np.asarray(after, dtype=float)
    if paired:
        n = min(len(b), len(a))
        return float(np.median(b[:n] / a[:n]))
    return float(np.median(b) / np.median(a))


def speedup_interval(before: Sequence[float], after: Sequence[float], key: str, paired: bool = False,
                     level: float = LEVEL, resamples: int = RESAMPLES) -> tuple[float, float]:
    """The bootstrap percentile interval of `point_speedup`. `paired`: the i-th samples of both sides
    come from the same round of one session (their ratios resampled, over the rounds both have);
    otherwise each side is resampled on its own."""
    b, a = np.asarray(before, dtype=float), np.asarray(after, dtype=float)
    rng = _generator(key)
    if paired:
        n = min(len(b), len(a))
        ratios_by_round = b[:n] / a[:n]
        ratios = np.median(ratios_by_round[rng.integers(0, n, (resamples, n))], axis=1)
    else:
        ratios = (np.median(b[rng.integers(0, len(b), (resamples, len(b)))], axis=1)
                  / np.median(a[rng.integers(0, len(a), (resamples, len(a)))], axis=1))
    tail = 100 * (1 - level) / 2
    lo, hi = np.percentile(ratios, [tail, 100 - tail])
    return float(lo), float(hi)


def classify(low: float, high: float, margin: float = NOISE_MARGIN) -> str:
    """The effect class of a speedup whose interval is [low, high] (the module's rule)."""
    if low > 1 + margin:
        return "faster"
    if high < 1 / (1 + margin):
        return "slower"
    if low >= 1 / (1 + margin) and high <= 1 + margin:
        return "neutral"
    return "unresolved"


def step_effect(before: Sequence[float] | None, after: Sequence[float] | None, key: str, paired: bool = False,
                margin: float = NOISE_MARGIN) -> dict:
    """{speedup, speedup_low, speedup_high, effect} of a step whose states' samples (µs per run) are
    `before` and `after`; all None when either side was not measured, `unresolved` (with the point
    speedup) when either has fewer than MIN_SAMPLES samples."""
    none = {"speedup": None, "speedup_low": None, "speedup_high": None, "effect": None}
    if not before or not after or min(before) <= 0 or min(after) <= 0:
        return none
    speedup = point_speedup(before, after, paired)
    if min(len(before), len(after)) < MIN_SAMPLES:
        return {**none, "speedup": speedup, "effect": "unresolved"}
    low, high = speedup_interval(before, after, key, paired)
    return {"speedup": speedup, "speedup_low": low, "speedup_high": high, "effect": classify(low, high, margin)}


# The whole-state rule's defaults (`compared_whole`; `measure.whole_below_us`, `measure.whole_changed_below_us`).
# A step that changes the number of nests is compared whole when a side runs under the second: above it,
# the nest sums' speedup was the whole states' within 2.2% for 80% of 882 such release steps
# (docs/pipeline.md, "Measured effects").
DEFAULT_WHOLE_BELOW_US = 5.0
DEFAULT_WHOLE_CHANGED_BELOW_US = 500.0


def compared_whole(nests: tuple[int | None, int | None], times_us: tuple[float, float], whole_below_us: float,
                   whole_changed_below_us: float = math.inf) -> bool:
    """Whether a step timed nest by nest is compared on its two states timed whole: where a side runs
    under `whole_below_us` per call (a sum of separate calls is no measure of a state that runs in
    microseconds), or where the step changes the number of top-level nests and a side runs under
    `whole_changed_below_us` (a fusion or fission of short nests; above it a nest sum gives the
    whole-state speedup: docs/pipeline.md, "Measured effects")."""
    small = min(times_us)
    return small < whole_below_us or (nests[0] != nests[1] and small < whole_changed_below_us)


def beyond(low: float | None, margin: float = NOISE_MARGIN) -> bool:
    """Whether an interval starting at `low` lies above 1 by the noise margin (`faster`)."""
    return low is not None and math.isfinite(low) and low > 1 + margin
