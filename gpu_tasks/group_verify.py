"""Verifying the steps of one program together: each distinct nest compiled once, each input plan
drawn once, the nests that states share run once per draw.

A release verifies some twenty steps per original program, and the states of one program share most
of their top-level nests: a step rewrites one or two. `verify_pair_job` compiles and runs every
state whole. Here a group of pairs with the same signature and protocol (llvm, plain form) is
verified by units (`gpu_tasks.unit_build`: a state's top-level nests, a nest with the fill before
it or with an earlier nest whose output it updates):

- the group's distinct units are compiled once, in one module, as verification builds are
  (`gpu_tasks.cache.VERIFY_PASS_CONFIG`, LLVM's optimisation level 0);
- each distinct input plan is drawn once;
- on each draw a state runs its units in program order, and what a unit writes is remembered under
  the units that led to it (the same functions on the same tensors, from the same draw): a state that
  begins with units already run takes their outputs and runs from its first new unit on.

The verdicts are `verify_pair_job`'s, byte for byte: the units are the whole function's loops and
stores at the same optimisation level (LLVM reassociates no floating point at any level), outputs
start from the same sentinels, intermediates are uninitialised as in the whole function (a program
that certainly reads one before writing it is refused before building; one that may read an element
no nest wrote reads garbage either way, and its verdict is no evidence in either), and a pair that
meets anything else
(a parse or guard failure, a lowering, build or run error, a program that writes an input) is
verified whole by `verify_pair_job`, whose message its row then carries
(tests/gpu_tasks/test_group_verify.py compares the two on every strategy's steps).
"""
from __future__ import annotations

from collections import OrderedDict
from dataclasses import dataclass

import numpy as np
import tvm

from gpu_tasks.cache import BUILD_CACHE, VERIFY_PASS_CONFIG
from gpu_tasks.compare import judge
from gpu_tasks.inputs import InputFacts, draws_from_plans, numpy_dtype, plan_from_facts
from gpu_tasks.jobs import PairRequest, VerificationFailed, load_program, load_signature, output_codes, verify_pair_job
from gpu_tasks.pair_groups import GROUP_TARGET
from gpu_tasks.runner import device_for, sentinel_array
from gpu_tasks.tolerances import tolerance_table
from gpu_tasks.unit_build import Chain, Distinct, chain_of, compile_units, intermediate
from gpu_tasks.verification import Verification

REMEMBERED_BYTES = 256 << 20   # what a group keeps of its units' outputs (least recently used dropped first)


class _Whole(Exception):
    """This pair is verified whole instead (`verify_pair_job`)."""


@dataclass(frozen=True)
class _Pair:
    before: str
    after: str
    draws: tuple  # the plan's key


def verify_group_job(requests: tuple[PairRequest, ...]) -> list[Verification]:
    """The verdicts of `requests` (one group, see `group_key`), in order."""
    results: list[Verification | None] = [None] * len(requests)
    try:
        signature = load_signature(requests[0].signature)
    except VerificationFailed:
        return [verify_pair_job(r) for r in requests]
    first = requests[0]
    pairs: dict[int, _Pair] = {}
    programs, draws = {}, {}
    for i, r in enumerate(requests):
        try:
            before = load_program("before", r.before, signature, r.limits)
            after = load_program("after", r.after, signature, r.limits)
        except VerificationFailed:
            continue
        plans = plan_from_facts(signature, [before.facts, InputFacts(frozenset(), after.facts.index_ranges)])
        key = tuple(sorted(plans.items()))
        if key not in draws:
            draws[key] = draws_from_plans(signature, plans, first.draws, first.seed)
        programs[r.before], programs[r.after] = before.program, after.program
        pairs[i] = _Pair(r.before, r.after, key)
    runs = _Runs(signature, _compiled_chains(programs, signature, first.arch), device_for(GROUP_TARGET))
    codes, tolerances = output_codes(signature), tolerance_table(first.tolerances)
    by_before: dict[tuple, list[int]] = {}
    for i, pair in pairs.items():
        by_before.setdefault((pair.before, pair.draws), []).append(i)
    for (before, key), members in by_before.items():
        inputs = list(enumerate(draws[key]))
        try:
            expected = [runs.outputs(before, (key, d), draw) for d, draw in inputs]
        except _Whole:
            continue
        for i in members:
            try:
                actual = [runs.outputs(pairs[i].after, (key, d), draw) for d, draw in inputs]
            except _Whole:
                continue
            results[i] = judge(expected, actual, codes, tolerances)
    return [v if v is not None else verify_pair_job(r) for r, v in zip(requests, results, strict=True)]


def _compiled_chains(programs: dict, signature, arch: str) -> dict:
    """Each program text's (chain, functions), or None where lowering or building it failed or it
    writes an input (those pairs are verified whole)."""
    distinct, chains = Distinct(), {}
    inputs = {spec.name for spec in signature.inputs}
    for text, program in programs.items():
        try:
            chain = chain_of(program, signature, distinct)
        except Exception:
            chains[text] = None
            continue
        writes_input = any(inputs.intersection(unit.writes) for _, unit in chain.links)
        chains[text] = None if writes_input else chain
    functions = compile_units(distinct.funcs, BUILD_CACHE.target(GROUP_TARGET, arch), VERIFY_PASS_CONFIG) \
        if distinct.funcs else []
    for text, chain in chains.items():
        if chain is not None and any(isinstance(functions[u], str) for u, _ in chain.links):
            chains[text] = None
    return {text: (chain, functions) if chain is not None else None for text, chain in chains.items()}


class _Runs:
    """States run unit by unit on the group's draws; what each unit writes is remembered under its
    draw and the units up to it, so a later state with the same beginning starts where it differs."""

    def __init__(self, signature, compiled: dict, device):
        self.signature, self.compiled, self.device = signature, compiled, device
        self.outputs_of = {spec.name: spec for spec in signature.outputs}
        self.remembered: OrderedDict[tuple, dict] = OrderedDict()
        self.remembered_bytes = 0
        self.inputs: dict[tuple, dict] = {}

    def outputs(self, text: str, draw_id: tuple, draw: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        entry = self.compiled.get(text)
        if entry is None:
            raise _Whole
        chain, functions = entry
        prefix: tuple = (draw_id,)
        try:
            env = dict(self._inputs(draw_id, draw))
            for u, unit in chain.links:
                prefix += ((u, unit.args),)
                written = self.remembered.get(prefix)
                if written is not None:
                    self.remembered.move_to_end(prefix)
                else:
                    args = [env[n] if n in env else self._fresh(chain, n) for n in unit.args]
                    functions[u](*args)
                    written = {n: a for n, a in zip(unit.args, args, strict=True) if n in unit.writes}
                    self._remember(prefix, written)
                env.update(written)
            out = {name: env[name].numpy() if name in env else sentinel_array(spec)
                   for name, spec in self.outputs_of.items()}
        except _Whole:
            raise
        except Exception:  # a run error: the whole-state verification says what it is
            raise _Whole from None
        return out

    def _inputs(self, draw_id: tuple, draw: dict[str, np.ndarray]) -> dict:
        known = self.inputs.get(draw_id)
        if known is None:
            known = self.inputs[draw_id] = {
                spec.name: tvm.runtime.tensor(np.require(draw[spec.name], requirements="C"), self.device)
                for spec in self.signature.inputs}
        return known

    def _fresh(self, chain: Chain, name: str):
        spec = self.outputs_of.get(name)
        if spec is not None:
            return tvm.runtime.tensor(sentinel_array(spec), self.device)
        return intermediate(chain, name, self.device)

    def _remember(self, prefix: tuple, written: dict) -> None:
        self.remembered[prefix] = written
        self.remembered_bytes += sum(_nbytes(a) for a in written.values())
        while self.remembered_bytes > REMEMBERED_BYTES and len(self.remembered) > 1:
            _, dropped = self.remembered.popitem(last=False)
            self.remembered_bytes -= sum(_nbytes(a) for a in dropped.values())


def _nbytes(array) -> int:
    return int(np.prod(array.shape)) * numpy_dtype(str(array.dtype)).itemsize
