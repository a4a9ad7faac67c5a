"""Is a model's answer consistent with the strategy it names?

Two checks. *Exact*: the named strategy is applied to the original (every site, every parameter
variant, in the strategy's deterministic order, at most `cap` transformations and `budget_s`
seconds) and one of the results is alpha-equivalent to the answer. *Effect*: the change from the
original to the answer shows the strategy's structural effect (each rule's `recognizes`), whatever its
spelling. The label passes when either holds (the harness also requires the answer to verify);
`exact` is kept as its own field. This runs as a worker-pool job (a module-level function; the
symbolic strategies use sympy, whose worst cases are slow), and the set of results per (original,
strategy) is memoised so that many answers to one prompt enumerate once.
"""
from __future__ import annotations

import time
from dataclasses import dataclass
from functools import lru_cache

from leir.ast import Program
from leir.canon import alpha_hash
from leir.parse import parse_program
from leir.signature import Signature

DEFAULT_CAP = 500
DEFAULT_BUDGET_S = 20.0


@dataclass(frozen=True, slots=True)
class LabelRequest:
    original: str  # LEIR text
    signature: str  # JSON text
    target: str
    strategy: str
    answer_alpha: str  # alpha_hash of the answer under the signature
    cap: int = DEFAULT_CAP
    budget_s: float = DEFAULT_BUDGET_S
    answer: str = ""  # the answer's LEIR text, for the effect check


@dataclass(frozen=True, slots=True)
class LabelResult:
    passed: bool  # exact or by effect
    error: str = ""
    exact: bool = False  # alpha-equivalent to one of the library's transformations
    by: str = ""  # "exact", "sign" (the rule recognises the step in another spelling) or "" (not passed)


def label_job(request: LabelRequest) -> LabelResult:
    from strategies.registry import ALL_NAMES

    if request.strategy not in ALL_NAMES:
        return LabelResult(False, f"{request.strategy!r} is not one of the 43 strategies")
    try:
        hashes, complete = strategy_results(request.original, request.signature, context_target(request.target),
                                            request.strategy, request.cap, request.budget_s)
    except Exception as e:  # a strategy's bug on an unusual original must not end the run
        hashes, complete, failure = frozenset(), False, f"the label check failed: {type(e).__name__}: {e}"
    else:
        failure = ""
    if request.answer_alpha in hashes:
        return LabelResult(True, exact=True, by="exact")
    effect = _effect(request)
    if effect:
        return LabelResult(True, by="sign")
    if failure:
        return LabelResult(False, failure)
    how = f"its {len(hashes)} transformations" if complete else \
        f"the first {len(hashes)} of its transformations (enumeration capped)"
    exact = f"{request.strategy} does not apply to the original" if not hashes else \
        f"the answer is not {request.strategy} applied to the original: it matches none of {how}"
    if effect is None:
        return LabelResult(False, f"{exact} (and {request.strategy} has no structural effect to check instead)")
    return LabelResult(False, f"{exact}, nor does it show {request.strategy}'s effect")


def shows_effect(strategy: str, original: Program, answer: Program, signature: Signature) -> bool | None:
    """Whether original -> answer shows the named strategy's structural sign, as its rule states it
    (`Strategy.recognizes`); None when the name is not one of the 43."""
    from strategies.registry import ALL_NAMES, get

    if strategy not in ALL_NAMES:
        return None
    return bool(get(strategy).recognizes(original, answer, signature))


def _effect(request: LabelRequest) -> bool | None:
    """Whether the answer shows the strategy's structural effect (None: no answer to look at)."""
    if not request.answer:
        return None
    try:
        sig = Signature.from_json(request.signature)
        return shows_effect(request.strategy, parse_program(request.original), parse_program(request.answer), sig)
    except Exception:  # an answer the structure queries cannot read does not show the effect
        return False


@lru_cache(maxsize=128)
def strategy_results(original: str, signature: str, target: str, strategy: str, cap: int, budget_s: float
                     ) -> tuple[frozenset[str], bool]:
    """(alpha hashes of the strategy's transformations of `original`, whether the enumeration ended
    by itself rather than by the cap or the time budget)."""
    from strategies.base import Context
    from strategies.registry import get

    sig = Signature.from_json(signature)
    ctx = Context(parse_program(original), sig, target, useful_only=False)  # a model's step is named, not judged
    deadline = time.monotonic() + budget_s
    hashes: set[str] = set()
    count = 0
    for t in get(strategy).transformations(ctx):
        hashes.add(alpha_hash(t.after, sig))
        count += 1
        if count >= cap or time.monotonic() > deadline:
            return frozenset(hashes), False
    return frozenset(hashes), True


def context_target(target: str) -> str:
    """The strategies' target family (`llvm` or `cuda`) of a TVM target string."""
    return "cuda" if target.split()[0] in ("cuda", "nvptx") else "llvm"
