"""Public verification API: a transformation against its original, or an original against a
reference function (PyTorch eager in float64), with the same inputs, comparison and statuses.

Without a `pool` the work runs in the calling process (quick, for tests and interactive use, but a
crash or a hang of a generated kernel then hits the caller); with a `WorkerPool` every request runs
in a worker under a time limit, and a crash or a hang becomes that request's status.
"""
from __future__ import annotations

import hashlib
import json
import logging
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence

import numpy as np

from gpu_tasks.guard import DEFAULT_LIMITS, Limits
from gpu_tasks.inputs import make_draws
from gpu_tasks.pair_groups import MAX_GROUP, pair_groups
from gpu_tasks.pool import Job, JobFailure, WorkerPool
from gpu_tasks.requests import PairRequest, ReferenceRequest
from gpu_tasks.verification import Verification, describe_error, failure
from leir.ast import Program
from leir.errors import LeirError
from leir.parse import parse_program
from leir.printer import format_program
from leir.signature import Signature

# An original may miss the float64 reference by this many times what PyTorch itself misses it by in the
# program's dtype on the same draw (params.yaml verify.pytorch_error_factor; compare.raised_bounds).
OWN_ERROR_FACTOR = 2.0

ProgramLike = str | Program
SignatureLike = Signature | Mapping | str
ReferenceFn = Callable[[dict[str, np.ndarray]], object]
log = logging.getLogger(__name__)


# The jobs, called by name: they run in the pool's workers, whose fork server imported TVM once, and
# this module imports them only when it runs one itself (without a pool). A process that only sends
# work (a flow's process, a Dask worker) never imports TVM or PyTorch for it (some 5 s and hundreds
# of MB per process).

def verify_pair_job(request: PairRequest) -> Verification:
    from gpu_tasks.jobs import verify_pair_job as job

    return job(request)


def verify_group_job(requests: tuple[PairRequest, ...]) -> list[Verification]:
    from gpu_tasks.group_verify import verify_group_job as job

    return job(requests)


def verify_reference_job(request: ReferenceRequest) -> Verification:
    from gpu_tasks.jobs import verify_reference_job as job

    return job(request)


def pair_request(before: ProgramLike, after: ProgramLike, signature: SignatureLike, *,
                 target: str = "llvm", arch: str = "sm_90", draws: int = 3, seed: int = 0,
                 tolerances: Mapping | None = None, limits: Limits = DEFAULT_LIMITS, form: str = "plain"
                 ) -> PairRequest:
    return PairRequest(program_text(before), program_text(after), signature_text(signature),
                       target, arch, draws, seed, tolerances, limits, form)


def verify_pair(before: ProgramLike, after: ProgramLike, signature: SignatureLike, target: str = "llvm",
                draws: int = 3, seed: int = 0, *, arch: str = "sm_90", tolerances: Mapping | None = None,
                limits: Limits = DEFAULT_LIMITS, pool: WorkerPool | None = None, form: str = "plain"
                ) -> Verification:
    """`after` compared with the original `before` on `draws` seeded input draws, both lowered in
    `form` (plain or tensorir)."""
    request = pair_request(before, after, signature, target=target, arch=arch, draws=draws, seed=seed,
                           tolerances=tolerances, limits=limits, form=form)
    return verify_pairs([request], pool)[0]


def verify_pairs(requests: Iterable[PairRequest], pool: WorkerPool | None = None,
                 max_group: int = MAX_GROUP) -> list[Verification]:
    return list(iter_verify_pairs(requests, pool, max_group))


def iter_verify_pairs(requests: Iterable[PairRequest], pool: WorkerPool | None = None,
                      max_group: int = MAX_GROUP) -> Iterator[Verification]:
    """Verifications in input order, each as soon as it and all before it are done. Pairs with the
    same signature and protocol are verified in groups of at most `max_group` (`gpu_tasks.group_verify`:
    the same verdicts, each distinct nest built once); a group whose worker crashed or ran out of time
    is verified again pair by pair, so that the pair at fault alone gets the crash or the time-out."""
    requests = list(requests)
    groups = pair_groups(requests, max_group)
    done: dict[int, Verification] = {}
    position = 0

    def ready() -> Iterator[Verification]:
        nonlocal position
        while position in done:
            yield done.pop(position)
            position += 1

    if pool is None:
        for group in groups:
            done.update(zip(group, _in_process(group, requests), strict=True))
            yield from ready()
        return
    jobs = [Job(*_group_call(group, requests), affinity=_original_key(requests[group[0]]),
                timeout_s=pool.timeout_s * (1 + (len(group) - 1) * GROUP_TIMEOUT_SHARE)) for group in groups]
    failed: list[int] = []
    for g, result in pool.imap(jobs):
        if isinstance(result, JobFailure) and len(groups[g]) > 1:
            if result.kind == "error":  # a bug of the grouped path: say so, the pairs still get verdicts
                log.warning("a group of %d pairs failed (%s); verifying them one by one", len(groups[g]),
                            result.message)
            failed.extend(groups[g])
            continue
        if isinstance(result, JobFailure | Verification):
            result = [as_verification(result)]
        done.update(zip(groups[g], result, strict=True))
        yield from ready()
    if failed:
        single = [Job(verify_pair_job, (requests[i],), affinity=_original_key(requests[i])) for i in failed]
        for (_, result), i in zip(pool.imap(single), failed, strict=True):
            done[i] = as_verification(result)
            yield from ready()
    yield from ready()


def verify_apart(requests: Sequence[PairRequest], pool: WorkerPool,
                 timeouts_s: Sequence[float | None] | None = None) -> list[Verification]:
    """Each pair in a job of its own, so that the pool's workers verify them side by side (a search
    verifies a state and, on the other core, the state it will most likely ask for next). The same
    verdicts as `verify_pairs`; `timeouts_s`: a time limit per pair (None: the pool's)."""
    timeouts_s = list(timeouts_s or [None] * len(requests))
    jobs = [Job(verify_pair_job, (r,), affinity=_original_key(r), timeout_s=t)
            for r, t in zip(requests, timeouts_s, strict=True)]
    return [as_verification(result) for result in pool.run(jobs)]


# A group job's time limit: the pool's limit per job, plus this share of it for every further pair
# (a group of 48 steps of one release program verifies in a few seconds; a hang still ends).
GROUP_TIMEOUT_SHARE = 0.25


def _group_call(group: list[int], requests: list[PairRequest]) -> tuple:
    if len(group) == 1:
        return verify_pair_job, (requests[group[0]],)
    return verify_group_job, (tuple(requests[i] for i in group),)


def _in_process(group: list[int], requests: list[PairRequest]) -> list[Verification]:
    """A group verified in this process; should the grouped path raise (a bug), pair by pair."""
    if len(group) > 1:
        try:
            return verify_group_job(tuple(requests[i] for i in group))
        except Exception as e:
            log.warning("a group of %d pairs failed (%s); verifying them one by one", len(group), describe_error(e))
    return [verify_pair_job(requests[i]) for i in group]


def verify_against_reference(program: ProgramLike, signature: SignatureLike, reference_fn: ReferenceFn,
                             target: str = "llvm", draws: int = 3, seed: int = 0, *, arch: str = "sm_90",
                             tolerances: Mapping | None = None, limits: Limits = DEFAULT_LIMITS,
                             pool: WorkerPool | None = None, form: str = "plain",
                             own_fn: ReferenceFn | None = None, own_factor: float = OWN_ERROR_FACTOR
                             ) -> Verification:
    """`program` compared with `reference_fn(inputs)`, which gets the same draws with floats widened to
    float64 and returns the output (a dict by name, or a sequence in signature order, when the
    signature has several). The reference runs here, in the caller; the program in `pool` if given.
    `own_fn`: the same computation by PyTorch in the program's dtype (an original's
    `Translation.reference_in_dtype`); each draw's bounds are then raised to `own_factor` times its
    error against the reference where that is larger (`compare.raised_bounds`)."""
    options = dict(target=target, draws=draws, seed=seed, arch=arch, tolerances=tolerances, limits=limits,
                   form=form, own_factor=own_factor)
    return verify_against_references([(program, signature, reference_fn, own_fn)], pool, **options)[0]


def verify_against_references(items: Iterable[tuple], pool: WorkerPool | None = None, **options
                              ) -> list[Verification]:
    """Many originals at once, each `(program, signature, reference_fn)` or `(..., own_fn)`
    (`options` as for `verify_against_reference`): the references run here one after the other, the
    programs in parallel in `pool`."""
    return verify_requests([reference_request(*item, **options) for item in items], pool)


def verify_requests(prepared: Sequence[ReferenceRequest | Verification], pool: WorkerPool | None = None
                    ) -> list[Verification]:
    """The verdict of each of `prepared` (`reference_request`'s answers): a request is run in `pool`
    (in parallel) or here, a verdict already reached is kept."""
    requests = [r for r in prepared if isinstance(r, ReferenceRequest)]
    if pool is None:
        done = iter([verify_reference_job(r) for r in requests])
    else:
        done = iter([as_verification(r) for r in pool.run(Job(verify_reference_job, (r,)) for r in requests)])
    return [next(done) if isinstance(r, ReferenceRequest) else r for r in prepared]


def reference_request(program: ProgramLike, signature: SignatureLike, reference_fn: ReferenceFn,
                      own_fn: ReferenceFn | None = None, target: str = "llvm", draws: int = 3, seed: int = 0,
                      *, arch: str = "sm_90", tolerances: Mapping | None = None, limits: Limits = DEFAULT_LIMITS,
                      form: str = "plain", own_factor: float = OWN_ERROR_FACTOR) -> ReferenceRequest | Verification:
    """The worker's request, with the reference outputs (and PyTorch's own in the program's dtype,
    given `own_fn`) computed; or why there can be none."""
    try:
        sig = signature if isinstance(signature, Signature) else Signature.from_json(signature_text(signature))
        parsed = program if isinstance(program, Program) else parse_program(program)
    except LeirError as e:
        return failure("invalid", str(e))
    inputs = make_draws(sig, [parsed], draws, seed)
    try:
        expected = [reference_outputs(reference_fn, sig, draw) for draw in inputs]
    except Exception as e:
        return failure("runtime_error", f"reference: {describe_error(e)}")
    try:
        own = None if own_fn is None else [reference_outputs(own_fn, sig, draw) for draw in inputs]
    except Exception:  # PyTorch has no kernel in that dtype (avg_pool3d in float16): the plain bounds
        own = None
    return ReferenceRequest(format_program(parsed), sig.dumps(), inputs, expected, target, arch, tolerances,
                            limits, form, own, own_factor)


def reference_outputs(reference_fn: ReferenceFn, signature: Signature, inputs: dict[str, np.ndarray]
                      ) -> dict[str, np.ndarray]:
    result = reference_fn({name: _widen(a) for name, a in inputs.items()})
    names = [spec.name for spec in signature.outputs]
    if isinstance(result, Mapping):
        return {name: _to_numpy(result[name]) for name in names}
    if len(names) == 1:
        return {names[0]: _to_numpy(result)}
    return {name: _to_numpy(r) for name, r in zip(names, result, strict=True)}


def as_verification(result) -> Verification:
    """A worker's answer, or what the pool reports instead when the worker crashed or hung."""
    if isinstance(result, Verification):
        return result
    if isinstance(result, JobFailure):
        status = result.kind if result.kind in ("crash", "timeout") else "runtime_error"
        prefix = "" if status != "runtime_error" else "internal error in the worker: "
        return failure(status, prefix + result.message)
    return failure("runtime_error", f"unexpected worker result {type(result).__name__}")


# --- conversions ----------------------------------------------------------------------------------

def program_text(program: ProgramLike) -> str:
    return format_program(program) if isinstance(program, Program) else str(program)


def signature_text(signature: SignatureLike) -> str:
    if isinstance(signature, Signature):
        return signature.dumps()
    if isinstance(signature, Mapping):
        return json.dumps(signature, separators=(",", ":"))
    return str(signature)


def _original_key(request: PairRequest) -> str:
    """Transformations of one original share a key, so the pool sends them to a warm worker."""
    key = "\0".join((request.before, request.signature, request.target, request.arch, request.form))
    return hashlib.sha256(key.encode()).hexdigest()


def _widen(a: np.ndarray) -> np.ndarray:
    return a.astype(np.float64) if a.dtype.kind == "f" or a.dtype.name == "bfloat16" else a.copy()


def _to_numpy(x) -> np.ndarray:
    if hasattr(x, "detach"):  # a torch tensor
        x = x.detach().cpu().numpy()
    return np.asarray(x)
