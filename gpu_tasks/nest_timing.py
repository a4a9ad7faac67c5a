"""Timing a group's states nest by nest (`StateGroupRequest.unit == "nest"`, the measure stage's default).

The states of one original program share most of their nests: a step rewrites one or two of them.
Here each state is cut into timing units (`leir.lower.units`: its top-level nests, a nest together
with the fill before it or with an earlier nest whose output it updates), every distinct unit of the
group is compiled once (structurally equal functions are one unit) and timed once, and a state's time
in round r is the sum of its units' times in round r. A unit goes on while a state it belongs to does
(`gpu_tasks.timing_session.undecided_states`: a comparison of that state still unresolved), so every
round of a state is a real sum of its units' samples of that round. At release scale that compiles
about a sixth of the code the whole states would (benchmarks/bench_measure.py); it also makes
effects steadier, since the nests a step leaves alone add the very same samples to both sides.

What a state's whole function would do and the units do too: the same loops and stores, the same
LLVM optimisation, intermediates used by one nest allocated inside it. What differs: intermediates
that cross nests are arguments instead of one workspace, and each unit is one call (its argument
checks are off, TIMING_PASS_CONFIG). Before timing, each state's units run once in program order on
arrays of its own, so that every unit reads the values the program computes, not uninitialised memory.

Units are compiled in one module per build thread (TVM's compiler releases the GIL), so a group pays
LLVM's fixed cost per module a few times instead of once per state.
"""
from __future__ import annotations

import time

from gpu_tasks.cache import TIMING_PASS_CONFIG, BuildCache
from gpu_tasks.inputs import draw_inputs, plan_from_facts
from gpu_tasks.machine_lock import timing_lock
from gpu_tasks.runner import device_for, make_arguments
from gpu_tasks.threads import logical_cpus
from gpu_tasks.timing_session import (
    GroupTiming,
    Sampler,
    StateTime,
    measure_rounds,
    session_fingerprint,
    state_time,
    undecided_states,
)
from gpu_tasks.unit_build import Chain, Distinct, UnitFunction, chain_of, compile_units, intermediate
from gpu_tasks.verification import describe_error
from leir.lower.units import TimingUnit


def time_by_nests(loaded: dict, signature, request, outcome: list, start: float):
    distinct = Distinct()
    chains: dict[int, Chain] = {}
    for i, state in loaded.items():
        try:
            chains[i] = chain_of(state.program, signature, distinct)
        except Exception as e:
            outcome[i] = StateTime("build_error", error=f"state {i}: {describe_error(e)}")
    cache = BuildCache(capacity=1, pass_config=TIMING_PASS_CONFIG, llvm_opt_level=request.llvm_opt_level)
    functions = compile_units(distinct.funcs, cache.target(request.target, request.arch), TIMING_PASS_CONFIG,
                              request.build_threads or logical_cpus())
    for i, chain in list(chains.items()):
        bad = next((functions[u] for u, _ in chain.links if isinstance(functions[u], str)), None)
        if bad is not None:
            outcome[i] = StateTime("build_error", error=f"state {i}: {bad}")
            del chains[i]
    build_s = time.perf_counter() - start
    rounds, fingerprint, measure_start = 0, {}, time.perf_counter()
    if chains:
        ready = sorted(chains)
        inputs = draw_inputs(signature, plan_from_facts(signature, [loaded[i].facts for i in ready]), 0,
                             request.seed)
        device = device_for(request.target)
        known = dict(zip(signature.names, make_arguments(signature, inputs, device), strict=True))
        arrays: dict[int, dict] = {}
        for i in ready:  # each state's units once, in order: every unit then reads computed values
            try:
                arrays[i] = _state_arrays(chains[i], known, device)
                for u, unit in chains[i].links:
                    functions[u](*(arrays[i][n] for n in unit.args))
            except Exception as e:
                outcome[i] = StateTime("runtime_error", error=f"state {i}: {describe_error(e)}")
                del chains[i]
        owner: dict[int, tuple[int, TimingUnit]] = {}
        for i in sorted(chains):
            for u, unit in chains[i].links:
                owner.setdefault(u, (i, unit))
        timed = sorted(owner)
        runs = [_bound_run(functions[u], request, device, f"u{u}", [arrays[owner[u][0]][n] for n in owner[u][1].args])
                for u in timed]
        try:
            position = {u: k for k, u in enumerate(timed)}
            members = {i: [position[u] for u, _ in chains[i].links] for i in sorted(chains)}
            pairs = [(b, a) for b, a in request.pairs if b in members and a in members]

            stopped: dict[int, int] = {}  # a state that stopped: its rounds then (its units may go on)

            def still_live(samples: list[list[float]], alive: list[int]) -> list[int]:
                states = {i: state_samples([samples[k] for k in ks])[:stopped.get(i)] for i, ks in members.items()}
                undecided = undecided_states(states, pairs, request.target_spread, request.min_rounds)
                for i in members:
                    if i not in undecided:
                        stopped.setdefault(i, len(states[i]))
                wanted = {k for i in members if i not in stopped for k in members[i]}
                return [k for k in alive if k in wanted]

            with timing_lock(request.lock_path):
                samples, rounds = measure_rounds(runs, [], request, still_live)
            fingerprint = session_fingerprint(request.target, request.arch)
            by_unit = {u: [v * 1e6 for v in s] for u, s in zip(timed, samples, strict=True)}
            for i in sorted(chains):
                outcome[i] = state_time(state_samples([by_unit[u] for u, _ in chains[i].links]))
        except Exception as e:
            for i in chains:
                outcome[i] = StateTime("runtime_error", error=describe_error(e))
    return GroupTiming(tuple(outcome), fingerprint, rounds, round(build_s, 3),
                       round(time.perf_counter() - measure_start, 3), len(distinct.funcs))


def state_samples(unit_samples: list[list[float]]) -> list[float]:
    """A state's samples from its units' samples: round r's sum over the units, for the rounds every
    unit has (a unit goes on while any state it belongs to does, so it may have more)."""
    rounds = min(len(s) for s in unit_samples)
    return [sum(s[r] for s in unit_samples) for r in range(rounds)]


def _state_arrays(chain: Chain, known: dict, device) -> dict:
    """The state's tensors by name: the group's known tensors, and its own shared intermediates."""
    out = dict(known)
    for _, unit in chain.links:
        for name in unit.args:
            if name not in out:
                out[name] = intermediate(chain, name, device)
    return out


def _bound_run(function: UnitFunction, request, device, name: str, args: list):
    evaluate = Sampler(function.executable.mod, name, device, int(request.min_repeat_ms))
    return lambda *_: evaluate(*args)
