"""Trajectories grounded like steps: every state of a search's best trajectories verified
against the original on the verify stage's protocol and timed on the measure stage's, after the search.

The search itself verifies and times what it explores, with its own budget; a trajectory it returns
is then checked again as released data is: each state is verified against the root program
(`gpu_tasks.verify.verify_pairs`: the pipeline's draws, seed and tolerances), and all the states of
the trajectories of one root program are timed whole in one session (`gpu_tasks.state_timing`, the
measure stage's rounds and stopping rule), the comparisons that decide the rounds being each state
against the root and each step's before against its after. Each state then has its verification,
its time, its speedup over the root with an interval, and each step its effect class
(`gpu_tasks.effect`).
"""
from __future__ import annotations

import json
from dataclasses import dataclass, field

from gpu_tasks.effect import point_speedup, speedup_interval, step_effect


@dataclass(frozen=True)
class Grounding:
    """How trajectories are checked: the verify stage's protocol and the measure stage's rounds."""

    draws: int = 3
    seed: int = 0
    tolerances: dict | None = None
    target: str = "llvm"
    timing: dict = field(default_factory=dict)  # StateGroupRequest fields: min_rounds, max_rounds, ...
    timeout_s: float = 900.0


@dataclass(frozen=True)
class GroundedState:
    status: str
    max_abs_err: float | None
    samples_us: tuple[float, ...]


def ground(root: str, signature: str, trajectories: list[list[str]], grounding: Grounding, pools
           ) -> dict[str, GroundedState]:
    """{state text: its verification and samples} for the root and every state of `trajectories`
    (lists of LEIR texts, root excluded), verified in `pools.verify`, timed in `pools.timing`."""
    from gpu_tasks.pool import Job, JobFailure
    from gpu_tasks.state_timing import StateGroupRequest, time_states_job
    from gpu_tasks.verify import pair_request, verify_pairs

    states = list(dict.fromkeys([root, *(s for t in trajectories for s in t)]))
    requests = [pair_request(root, s, signature, target=grounding.target, draws=grounding.draws, seed=grounding.seed,
                             tolerances=grounding.tolerances) for s in states[1:]]
    # the states of one root are one group: split in as many as the pool has workers, they go side by side
    checks = verify_pairs(requests, pools.verify, max_group=max(1, -(-len(requests) // max(1, pools.verify.size))))
    position = {s: i for i, s in enumerate(states)}
    pairs = {(0, i) for i in range(1, len(states))}
    for t in trajectories:
        pairs |= {(position[a], position[b]) for a, b in zip([root, *t], t, strict=False)}
    request = StateGroupRequest(tuple(states), signature, target=grounding.target, unit="state",
                                pairs=tuple(sorted(pairs)), **grounding.timing)
    result = next(r for _, r in pools.timing.imap([Job(time_states_job, (request,), timeout_s=grounding.timeout_s)]))
    times = [()] * len(states) if isinstance(result, JobFailure) else [s.samples_us if s is not None and s.ok else ()
                                                                       for s in result.states]
    out = {root: GroundedState("original", 0.0, tuple(times[0]))}
    for s, v, samples in zip(states[1:], checks, times[1:], strict=True):
        out[s] = GroundedState(v.status, v.to_json()["max_abs_err"], tuple(samples))
    return out


def trajectory_figures(root: str, states: list[str], grounded: dict[str, GroundedState], key: str) -> dict:
    """The columns of one grounded trajectory (JSON lists over its states, root excluded, unless said):
    verification and max_abs_err per state, times_us (root first), speedups over the root with their
    intervals, each step's effect, and the best speedup (1.0: the root)."""
    root_samples = grounded[root].samples_us
    times, speedups, lows, highs, effects = [_median(root_samples)], [], [], [], []
    for k, s in enumerate(states):
        samples = grounded[s].samples_us
        times.append(_median(samples))
        if root_samples and samples:
            speedups.append(point_speedup(root_samples, samples, paired=True))
            low, high = speedup_interval(root_samples, samples, f"{key}-{k}", paired=True)
            lows.append(low)
            highs.append(high)
        else:
            speedups.append(None)
            lows.append(None)
            highs.append(None)
        before = grounded[root if k == 0 else states[k - 1]].samples_us
        effects.append(step_effect(before, samples, f"{key}-step-{k}", paired=True)["effect"]
                       if before and samples else None)
    best = max([1.0, *(x for x in speedups if x is not None)])
    return {"verification": json.dumps([grounded[s].status for s in states]),
            "max_abs_err": json.dumps([grounded[s].max_abs_err for s in states]),
            "times_us": json.dumps(times[1:]), "root_us": times[0], "speedups": json.dumps(speedups),
            "speedups_low": json.dumps(lows), "speedups_high": json.dumps(highs),
            "step_effects": json.dumps(effects), "best_speedup": best}


def _median(samples) -> float | None:
    import numpy as np

    return float(np.median(samples)) if len(samples) else None
