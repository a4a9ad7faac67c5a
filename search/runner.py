"""Search with TVM behind it: the verify/measure callables of `search.drivers`, one
`run_search` entry point (the search stage, `flows.search`, turns results into lake rows).

- verify: `gpu_tasks.verify.verify_pair(root, state)` in a worker pool (crash and hang isolation);
  verify_many: the state and the one the policy will most likely want next, side by side in the
  pool's two workers (`gpu_tasks.verify.verify_apart`; the one ahead under a shorter time limit);
- measure: `gpu_tasks.timing.time_pair(root, state)` in a timing pool (one worker using every
  core, the machine lock held while measuring): root and state interleaved in the same session, so
  the reward root_us / state_us never compares times from different runs.
The llm policy's replies are read with `evaluation.response` (lenient with layout, guarded, JSON only).
"""
from __future__ import annotations

import json
from collections.abc import Mapping
from contextlib import ExitStack
from dataclasses import dataclass

from leir.ast import Program
from leir.parse import parse_program
from leir.signature import Signature
from search.drivers import Budget, DriverConfig, SearchResult, run
from search.policies import make_policy


@dataclass(frozen=True)
class SearchSettings:
    target: str = "llvm"
    draws: int = 3
    verify_seed: int = 0
    tolerances: Mapping | None = None
    repeats: int = 5
    min_repeat_ms: int = 10   # each sample at least this long (the measure stage samples 4 ms)
    verify_timeout_s: float = 60.0
    ahead_timeout_s: float = 10.0   # the time limit of a state verified ahead of its turn


def tvm_callables(signature: Signature, settings: SearchSettings, pool, timer):
    """(verify, measure, verify_many) for `search.drivers.run`, backed by `pool` and `timer`
    (WorkerPools); verify_many is None for a pool of one worker."""
    from gpu_tasks.timing import time_pair
    from gpu_tasks.verify import pair_request, verify_apart, verify_pair

    def verify(root: Program, state: Program) -> str:
        return verify_pair(root, state, signature, settings.target, settings.draws, settings.verify_seed,
                           tolerances=settings.tolerances, pool=pool).status

    def verify_many(root: Program, states: list[Program]) -> list[str]:
        requests = [pair_request(root, s, signature, target=settings.target, draws=settings.draws,
                                 seed=settings.verify_seed, tolerances=settings.tolerances) for s in states]
        limits = [None] + [min(settings.ahead_timeout_s, pool.timeout_s)] * (len(states) - 1)
        return [v.status for v in verify_apart(requests, pool, limits)]

    def measure(root: Program, state: Program):
        t = time_pair(root, state, signature, settings.target, pool=timer, repeats=settings.repeats,
                      min_repeat_ms=settings.min_repeat_ms)
        return (t.before_us, t.after_us, t.spread) if t.status == "ok" else None

    return verify, measure, (verify_many if getattr(pool, "size", 1) > 1 else None)


def response_parser(text: str) -> list[tuple[str, str]]:
    """The llm policy's answer parser: evaluation.response's guards and leniency, JSON only."""
    from evaluation.response import ResponseError, ir_text_problem, parse_response

    try:
        parsed = parse_response(text)
    except ResponseError as e:
        raise ValueError(f"{e.kind}: {e}") from None
    for item in parsed.items:
        problem = ir_text_problem(item.transformed_ir)
        if problem:
            raise ValueError(problem)
    return [(i.transformed_ir, i.strategy) for i in parsed.items]


class Pools:
    """A verification pool and a timing pool, started once for many searches."""

    def __init__(self, workers: int = 2, timeout_s: float = 60.0):
        from gpu_tasks.pool import WorkerPool
        from gpu_tasks.timing import timing_pool

        self._stack = ExitStack()
        self.verify = self._stack.enter_context(WorkerPool(workers=workers, timeout_s=timeout_s))
        self.timing = self._stack.enter_context(timing_pool())

    def fingerprint(self, target: str = "llvm") -> dict:
        """The machine the timing pool measures on, as its worker sees it (threads included)."""
        if getattr(self, "_fingerprint", None) is None:
            from gpu_tasks.state_timing import session_fingerprint

            self._fingerprint = self.timing.broadcast(session_fingerprint, target)[0]
        return self._fingerprint

    def close(self) -> None:
        self._stack.close()

    def __enter__(self) -> Pools:
        return self

    def __exit__(self, *exc) -> None:
        self.close()


def run_search(program: Program | str, signature: Signature | Mapping | str, driver: str, policy: str = "library",
               budget: int | Budget = 16, seed: int = 0, *, config: DriverConfig | None = None,
               settings: SearchSettings | None = None, pools: Pools | None = None, wall_s: float = 600.0,
               policy_options: dict | None = None, as_result: bool = False,
               extensions: tuple[str, ...] | None = None) -> dict | SearchResult:
    """One search; the result as a dict (`SearchResult.to_json()`), or the `SearchResult`. `extensions`:
    the LEIR extensions its states may use (None: all)."""
    signature = signature if isinstance(signature, Signature) else Signature.from_json(
        json.loads(signature) if isinstance(signature, str) else signature)
    program = program if isinstance(program, Program) else parse_program(program)
    settings = settings or SearchSettings()
    options = dict(policy_options or {})
    if policy == "llm":
        options.setdefault("parse", response_parser)
    pol = make_policy(policy, seed, **options)
    budget = budget if isinstance(budget, Budget) else Budget(states=int(budget), wall_s=wall_s)
    with ExitStack() as stack:
        if pools is None:
            pools = stack.enter_context(Pools(timeout_s=settings.verify_timeout_s))
        verify, measure, verify_many = tvm_callables(signature, settings, pools.verify, pools.timing)
        result = run(program, signature, driver, pol, verify, measure, budget=budget, seed=seed,
                     config=config or DriverConfig(), target=settings.target, extensions=extensions,
                     verify_many=verify_many)
    if as_result:
        return result
    out = result.to_json()
    if policy == "llm":
        base = getattr(pol, "inner", pol)  # the llm policy itself when the cost model ranks it
        out["rejections"] = list(getattr(base, "rejections", []))
        out["llm_errors"] = list(getattr(base, "errors", []))
    return out

