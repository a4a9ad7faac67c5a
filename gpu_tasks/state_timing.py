"""Timing of program states in groups: every state of one original, measured once.

The data lake times each distinct program state its release refers to (the originals, and the
before and after state of every released step) once per machine; a step's effect is then the ratio
of its two states' times. A group is one original program with all its states: they share a
signature, so one set of argument tensors serves them all, and they are measured in one session,
interleaved (docs/pipeline.md, "Measured effects"): round r times every state once, in program order
on even rounds and in reverse order on odd ones, so that a drift of the machine hits every state
alike and each step's before and after are compared within the same minutes.

Repeats follow the comparisons the caller names (`pairs`: a step's before and after state): after
`min_rounds` rounds, a state goes on while a comparison it is part of has an interval that is still
unresolved (`gpu_tasks.effect`), a state in no comparison while its relative interquartile range is
above `target_spread`; at most `max_rounds` (or until the group has used `max_measure_s`). Each
sample is TVM's `time_evaluator` mean over a batch of back-to-back runs calibrated to last
`min_repeat_ms` (`gpu_tasks.timing_session.Sampler`).

Nest by nest (`unit="nest"`), the states are timed as the sums of their nests first; then the states
of every comparison that has a side under `whole_below_us` per call or changes the number of
top-level nests with a side under `whole_changed_below_us`, and the states of `whole`, are timed whole
as well, in a second session of their own (`GroupTiming.whole`): a sum of separate calls is no
measure of a state that runs in a microsecond, nor of a step that fuses or splits short nests.

Builds are made as a program is deployed (TVM's default LLVM optimisation; the per-call argument
checks left out, see TIMING_PASS_CONFIG), and first, outside the machine's timing lock, on every
core: TVM's compiler releases the GIL, so a thread per core compiles the group's states side by side,
in one module per thread.
"""
from __future__ import annotations

import time
from dataclasses import dataclass, replace

from gpu_tasks.cache import TIMING_PASS_CONFIG, BuildCache
from gpu_tasks.effect import DEFAULT_WHOLE_BELOW_US, DEFAULT_WHOLE_CHANGED_BELOW_US, compared_whole
from gpu_tasks.guard import DEFAULT_LIMITS, Limits
from gpu_tasks.inputs import draw_inputs, plan_from_facts
from gpu_tasks.jobs import VerificationFailed, load_program, load_signature
from gpu_tasks.machine_lock import timing_lock
from gpu_tasks.runner import device_for, make_arguments
from gpu_tasks.threads import logical_cpus
from gpu_tasks.timing_session import (  # noqa: F401 (re-exported: the timing API lives here)
    GroupTiming,
    Sampler,
    StateTime,
    measure_rounds,
    relative_iqr,
    session_fingerprint,
    state_time,
    undecided_states,
)
from gpu_tasks.unit_build import UnitFunction, compile_units
from gpu_tasks.verification import describe_error

DEFAULT_MIN_ROUNDS = 5
DEFAULT_MAX_ROUNDS = 15
DEFAULT_TARGET_SPREAD = 0.03
DEFAULT_SAMPLE_MS = 4
DEFAULT_MAX_MEASURE_S = 120.0
# `state`: each state is one function, compiled and timed whole. `nest` (llvm only): each state is cut
# into its top-level nests (`leir.lower.units`); every distinct nest of the group is compiled and timed
# once, and a state's time is the sum of its nests' times, round by round.
UNITS = ("state", "nest")


@dataclass(frozen=True)
class StateGroupRequest:
    """Time `states` (LEIR texts of programs with the same `signature`, JSON text) in one session."""

    states: tuple[str, ...]
    signature: str
    target: str = "llvm"
    arch: str = "sm_90"
    min_rounds: int = DEFAULT_MIN_ROUNDS
    max_rounds: int = DEFAULT_MAX_ROUNDS
    target_spread: float = DEFAULT_TARGET_SPREAD
    min_repeat_ms: int = DEFAULT_SAMPLE_MS
    max_measure_s: float = DEFAULT_MAX_MEASURE_S
    seed: int = 0
    limits: Limits = DEFAULT_LIMITS
    lock_path: str | None = None
    form: str = "plain"
    build_threads: int = 0  # 0: one per logical CPU
    llvm_opt_level: int | None = None  # None: TVM's default (3), as deployed
    unit: str = "state"  # what is compiled and timed: each whole `state`, or each distinct `nest` (UNITS)
    pairs: tuple[tuple[int, int], ...] = ()  # (before, after) state indices: the comparisons that decide the rounds
    whole: tuple[int, ...] = ()  # with `unit="nest"`: states timed whole as well, whatever their pairs
    whole_below_us: float = DEFAULT_WHOLE_BELOW_US  # with `unit="nest"`: a pair with a side under this is timed whole
    # with `unit="nest"`: a pair that changes the number of nests with a side under this is timed whole
    whole_changed_below_us: float = DEFAULT_WHOLE_CHANGED_BELOW_US


def time_states_job(request: StateGroupRequest) -> GroupTiming:
    """Build every state, then measure the ones that built in interleaved rounds (a worker's job)."""
    start = time.perf_counter()
    outcome: list[StateTime | None] = [None] * len(request.states)
    try:
        signature = load_signature(request.signature)
    except VerificationFailed as failed:
        bad = StateTime(failed.verification.status, error=failed.verification.error)
        return GroupTiming(tuple(bad for _ in request.states))
    loaded = {}
    for i, text in enumerate(request.states):
        try:
            loaded[i] = load_program(f"state {i}", text, signature, request.limits)
        except VerificationFailed as failed:
            outcome[i] = StateTime(failed.verification.status, error=failed.verification.error)
    if request.unit not in UNITS:
        raise ValueError(f"unknown timing unit {request.unit!r}; expected one of {', '.join(UNITS)}")
    nests = tuple(len(loaded[i].program.nests) if i in loaded else None for i in range(len(request.states)))
    if request.unit == "nest" and request.target == "llvm":
        from gpu_tasks.nest_timing import time_by_nests

        by_nests = time_by_nests(loaded, signature, request, outcome, start)
        return replace(_with_whole_states(by_nests, loaded, signature, request), nests=nests)
    return replace(_time_whole_states(loaded, signature, request, outcome, start, request.pairs), nests=nests)


def whole_pairs(loaded: dict, times: list[StateTime | None], request: StateGroupRequest
                ) -> tuple[tuple[int, int], ...]:
    """The pairs a nest-by-nest session also times whole (`gpu_tasks.effect.compared_whole` of their
    nest counts and nest-sum times: a side under `whole_below_us` per call, or a change in the number
    of top-level nests with a side under `whole_changed_below_us`)."""
    ok = {i for i, t in enumerate(times) if t is not None and t.ok and i in loaded}
    return tuple((b, a) for b, a in request.pairs if b in ok and a in ok and compared_whole(
        (len(loaded[b].program.nests), len(loaded[a].program.nests)), (times[b].median_us, times[a].median_us),
        request.whole_below_us, request.whole_changed_below_us))


def _with_whole_states(by_nests: GroupTiming, loaded: dict, signature, request: StateGroupRequest) -> GroupTiming:
    """`by_nests` with the whole-state times of the states of `whole_pairs` and `request.whole`."""
    pairs = whole_pairs(loaded, list(by_nests.states), request)
    ok = {i for i, t in enumerate(by_nests.states) if t is not None and t.ok}
    wanted = sorted({i for p in pairs for i in p} | {i for i in request.whole if i in ok})
    whole: list[StateTime | None] = [None] * len(request.states)
    if not wanted:
        return replace(by_nests, whole=tuple(whole))
    start = time.perf_counter()
    timed = _time_whole_states({i: loaded[i] for i in wanted}, signature, request, list(whole), start, pairs)
    return replace(by_nests, whole=timed.states, build_s=round(by_nests.build_s + timed.build_s, 3),
                   measure_s=round(by_nests.measure_s + timed.measure_s, 3),
                   functions=by_nests.functions + timed.functions,
                   fingerprint=by_nests.fingerprint or timed.fingerprint)


def _time_whole_states(loaded: dict, signature, request: StateGroupRequest, outcome: list,
                       start: float, pairs: tuple[tuple[int, int], ...]) -> GroupTiming:
    built = _build_all(loaded, signature, request)
    for i, b in built.items():
        if isinstance(b, str):
            outcome[i] = StateTime("build_error", error=b)
    ready = [i for i in sorted(built) if not isinstance(built[i], str)]
    build_s = time.perf_counter() - start
    rounds, fingerprint, measure_start = 0, {}, time.perf_counter()
    if ready:
        facts = [loaded[i].facts for i in ready]
        inputs = draw_inputs(signature, plan_from_facts(signature, facts), 0, request.seed)
        try:
            device = device_for(request.target)
            args = make_arguments(signature, inputs, device)  # inputs are never written: one set for all
            evaluators = [Sampler(built[i].executable.mod, built[i].name, device, int(request.min_repeat_ms))
                          for i in ready]
            position = {i: k for k, i in enumerate(ready)}
            live = [(position[b], position[a]) for b, a in pairs if b in position and a in position]

            def still_live(samples: list[list[float]], alive: list[int]) -> list[int]:
                undecided = undecided_states(dict(enumerate(samples)), live, request.target_spread,
                                             request.min_rounds)
                return [k for k in alive if k in undecided]

            with timing_lock(request.lock_path):
                samples, rounds = measure_rounds(evaluators, args, request, still_live)
            fingerprint = session_fingerprint(request.target, request.arch)
            for i, s in zip(ready, samples, strict=True):
                outcome[i] = state_time([v * 1e6 for v in s])
        except Exception as e:
            for i in ready:
                outcome[i] = StateTime("runtime_error", error=describe_error(e))
    return GroupTiming(tuple(outcome), fingerprint, rounds, round(build_s, 3),  # type: ignore[arg-type]
                       round(time.perf_counter() - measure_start, 3), len(ready))


def _build_all(loaded: dict, signature, request: StateGroupRequest) -> dict[int, UnitFunction | str]:
    """Each loaded state's function (deploy options), or the build error's text. Lowering runs here
    (Python); compiling runs on a thread per core, the states in one module per thread, as a group's
    nest units are (`gpu_tasks.unit_build.compile_units`; a module that fails is compiled again state
    by state)."""
    cache = BuildCache(capacity=1, pass_config=TIMING_PASS_CONFIG, llvm_opt_level=request.llvm_opt_level)
    target = cache.target(request.target, request.arch)
    funcs: dict[int, object] = {}
    out: dict[int, UnitFunction | str] = {}
    from leir.lower import lower_to_primfunc

    for i, state in loaded.items():
        try:
            funcs[i] = lower_to_primfunc(state.program, signature, target_kind=request.target, form=request.form)
        except Exception as e:
            out[i] = f"state {i}: {describe_error(e)}"
    order = sorted(funcs)
    compiled = compile_units([funcs[i] for i in order], target, TIMING_PASS_CONFIG,
                             request.build_threads or logical_cpus(), names=[f"state {i}" for i in order])
    out.update(zip(order, compiled, strict=True))
    return out
