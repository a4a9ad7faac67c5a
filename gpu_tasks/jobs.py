"""What a worker does for one verification request: parse, guard, build (cached), run, compare.

Requests carry text, not objects, so that they pickle small and the worker reparses what it runs.
Every expected failure becomes a `Verification` with its status and a message saying which side
(`before:`, `after:`, `program:`) failed; only a bug raises.
"""
from __future__ import annotations

from collections import OrderedDict
from dataclasses import dataclass
from functools import lru_cache

import numpy as np

from gpu_tasks.cache import BUILD_CACHE, BuildCache, Built, cache_stats
from gpu_tasks.compare import Outputs, judge
from gpu_tasks.guard import Limits, limit_violation
from gpu_tasks.inputs import InputFacts, draws_from_plans, input_facts, plan_from_facts
from gpu_tasks.requests import PairRequest, ReferenceRequest
from gpu_tasks.runner import run_built
from gpu_tasks.tolerances import tolerance_table
from gpu_tasks.verification import Verification, describe_error, failure
from leir.ast import Program
from leir.errors import LeirError
from leir.parse import parse_program
from leir.signature import Signature
from leir.validate import uninitialised_reads


class VerificationFailed(Exception):
    """Carries a failed step (parse, guard, build, run) out as its Verification."""

    def __init__(self, verification: Verification):
        super().__init__(verification.error)
        self.verification = verification


def verify_pair_job(request: PairRequest) -> Verification:
    try:
        signature = load_signature(request.signature)
        before = load_program("before", request.before, signature, request.limits)
        after = load_program("after", request.after, signature, request.limits)
        # inputs are drawn positive where the before-program needs it: an after-program that passes an
        # input to `log` which the before-program does not restrict is checked on negative ones too
        # (`A*2+log(A)*0` is not `A*2`); the subscripts of both stay in bounds
        plans = plan_from_facts(signature, [before.facts, InputFacts(frozenset(), after.facts.index_ranges)])
        draws = drawn(signature, request.signature, plans, request.draws, request.seed)
        key = (request.before, request.signature, request.target, request.arch, request.form, request.draws,
               request.seed, tuple(sorted(plans.items())))
        expected = BEFORE_OUTPUTS.get(key)
        if expected is None:
            expected = run_draws("before", before, signature, draws, request.target, request.arch, request.form)
            BEFORE_OUTPUTS.put(key, expected)
        actual = run_draws("after", after, signature, draws, request.target, request.arch, request.form)
    except VerificationFailed as failed:
        return failed.verification
    return judge(expected, actual, output_codes(signature), tolerance_table(request.tolerances))


class _ArrayMemo:
    """Arrays by request, a list of {name: array} per draw: the before-program's outputs on the draws
    (`BEFORE_OUTPUTS`: every step of one original is verified against the same outputs, which the
    original computed once per worker instead of once per step; the release build verifies ~30 steps
    per original, and at realistic sizes the naive original is the slow side), and the draws
    themselves (`DRAWS`: a search verifies and times every state of a program on the same inputs; a
    float32 elementwise program of release size drew them in a third of its verification). Bounded by
    entries and by bytes; the arrays are made read-only, since every later use reads them."""

    def __init__(self, entries: int = 8, max_bytes: int = 256 << 20):
        self.entries, self.max_bytes = entries, max_bytes
        self.hits = 0
        self._items: OrderedDict = OrderedDict()

    def get(self, key):
        value = self._items.get(key)
        if value is not None:
            self._items.move_to_end(key)
            self.hits += 1
        return value

    def clear(self) -> None:
        self._items.clear()
        self.hits = 0

    def put(self, key, outputs: list) -> None:
        size = sum(a.nbytes for o in outputs for a in o.values())
        if size > self.max_bytes // self.entries:
            return
        for o in outputs:
            for a in o.values():
                a.flags.writeable = False
        self._items[key] = outputs
        while len(self._items) > self.entries:
            self._items.popitem(last=False)


BEFORE_OUTPUTS = _ArrayMemo()
DRAWS = _ArrayMemo(entries=4, max_bytes=512 << 20)


def drawn(signature: Signature, signature_text: str, plans: dict, draws: int, seed: int) -> list[dict]:
    """`draws_from_plans`, kept per process (`DRAWS`); read-only arrays."""
    key = (signature_text, tuple(sorted(plans.items())), draws, seed)
    found = DRAWS.get(key)
    if found is None:
        found = draws_from_plans(signature, plans, draws, seed)
        DRAWS.put(key, found)
    return found


def clear_caches() -> None:
    """Forget this process's builds and remembered outputs (tests that count builds start here)."""
    BUILD_CACHE.clear()
    BEFORE_OUTPUTS.clear()
    DRAWS.clear()


def verify_reference_job(request: ReferenceRequest) -> Verification:
    try:
        signature = load_signature(request.signature)
        program = load_program("program", request.program, signature, request.limits)
        actual = run_draws("program", program, signature, request.inputs, request.target, request.arch,
                           request.form)
    except VerificationFailed as failed:
        return failed.verification
    return judge(request.expected, actual, output_codes(signature), tolerance_table(request.tolerances),
                 request.own, request.own_factor)


def cache_stats_job() -> dict:
    return cache_stats()


# --- steps --------------------------------------------------------------------------------------
# Parsing, guarding and input analysis are memoised by text: an original comes back with every
# transformation of it, and these steps cost about as much Python time as lowering does.

@dataclass(frozen=True, slots=True)
class LoadedProgram:
    text: str
    program: Program
    facts: InputFacts


def load_signature(text: str) -> Signature:
    signature, problem = _parsed_signature(text)
    if problem:
        raise VerificationFailed(failure("invalid", f"signature: {problem}"))
    return signature


def load_program(label: str, text: str, signature: Signature, limits: Limits) -> LoadedProgram:
    """Parse and guard; a syntax error or an absurd size is `invalid`."""
    loaded, problem = _checked_program(text, signature, limits)
    if problem:
        raise VerificationFailed(failure("invalid", f"{label}: {problem}"))
    return loaded


@lru_cache(maxsize=64)
def _parsed_signature(text: str) -> tuple[Signature | None, str]:
    try:
        return Signature.from_json(text), ""
    except LeirError as e:
        return None, str(e)


@lru_cache(maxsize=512)
def _checked_program(text: str, signature: Signature, limits: Limits) -> tuple[LoadedProgram | None, str]:
    try:
        program = parse_program(text)
    except LeirError as e:
        return None, str(e)
    too_big = limit_violation(program, signature, limits)
    if too_big:
        return None, f"rejected before building: {too_big}"
    unset = uninitialised_reads(program, signature)
    if unset:  # its output is whatever memory held: exact at one size, a mismatch of 1e33 at the next
        return None, f"rejected before building: {unset[0]} (uninitialised-read, as `leir check` reports it)"
    return LoadedProgram(text, program, input_facts(program, signature)), ""


def build(label: str, loaded: LoadedProgram, signature: Signature, target: str, arch: str,
          cache: BuildCache = BUILD_CACHE, form: str = "plain") -> Built:
    try:
        return cache.build(loaded.program, signature, target, arch, text=loaded.text, form=form)
    except Exception as e:  # LoweringError, or TVM's own error types
        raise VerificationFailed(failure("build_error", f"{label}: {describe_error(e)}")) from None


def run_draws(label: str, loaded: LoadedProgram, signature: Signature, draws: list[dict[str, np.ndarray]],
              target: str, arch: str, form: str = "plain") -> list[Outputs]:
    built = build(label, loaded, signature, target, arch, form=form)
    try:
        return [run_built(built, signature, inputs, target) for inputs in draws]
    except Exception as e:
        raise VerificationFailed(failure("runtime_error", f"{label}: {describe_error(e)}")) from None


def output_codes(signature: Signature) -> dict[str, str]:
    return {spec.name: spec.code for spec in signature.outputs}
