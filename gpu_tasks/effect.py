"""A step's measured effect from its two states' times (issue 24): the rule that labels a step
`faster`, `neutral` or `slower`. Pure arithmetic, no TVM: the release and the reports use it.

The margin a speedup must clear is `spreads` times the measured spread (the larger relative
interquartile range of the two states' samples), and never less than `min_effect`: a 1.01x inside
the noise is `neutral`, so is a 1.015x measured with a tiny spread (a difference no one would
deploy for).
"""
from __future__ import annotations

import math

MIN_EFFECT = 0.02
SPREADS = 2.0
EFFECTS = ("faster", "neutral", "slower")


def effect_class(speedup: float, spread: float, min_effect: float = MIN_EFFECT, spreads: float = SPREADS) -> str:
    """`faster` when `speedup` exceeds 1 by more than the margin, `slower` when it falls short of 1
    by as much (1/(1+margin)), `neutral` otherwise."""
    margin = max(min_effect, spreads * max(spread, 0.0))
    if speedup > 1.0 + margin or math.isinf(speedup):
        return "faster"
    if speedup < 1.0 / (1.0 + margin):
        return "slower"
    return "neutral"


def step_effect(before_us: float | None, after_us: float | None, before_spread: float | None,
                after_spread: float | None, min_effect: float = MIN_EFFECT, spreads: float = SPREADS) -> dict:
    """{speedup, spread, effect} of a step whose states took `before_us` and `after_us` (medians);
    all None when either side was not measured."""
    if not before_us or not after_us or before_us <= 0 or after_us <= 0:
        return {"speedup": None, "spread": None, "effect": None}
    speedup = before_us / after_us
    spread = max(before_spread or 0.0, after_spread or 0.0)
    return {"speedup": speedup, "spread": spread, "effect": effect_class(speedup, spread, min_effect, spreads)}
