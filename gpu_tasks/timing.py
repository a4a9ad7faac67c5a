"""Timing of a transformation (docs/pipeline.md, "Measured effects").

Both programs are built as deployed (full LLVM optimisation, TVM's argument checks kept; a cache
apart from verification's) and first (outside the lock: a build running beside a measurement perturbs it
on a small machine), then, holding the machine's timing lock, measured with TVM's `time_evaluator`
(each sample a batch of runs calibrated to last `min_repeat_ms`, `timing_session.Sampler`) in
interleaved rounds, before-after then after-before, so that a drift of the machine hits both sides
alike. Reported: the median of the samples per side, the speedup before/after, and the spread
(interquartile range over median, the larger of the two sides). Speedups above `flag_speedup` are flagged for review.
"""
from __future__ import annotations

import math
from collections.abc import Iterable, Iterator
from dataclasses import asdict, dataclass, field

import numpy as np

from gpu_tasks.cache import TIMING_CACHE
from gpu_tasks.fingerprint import machine_fingerprint
from gpu_tasks.guard import DEFAULT_LIMITS, Limits
from gpu_tasks.inputs import plan_from_facts
from gpu_tasks.jobs import VerificationFailed, build, drawn, load_program, load_signature
from gpu_tasks.machine_lock import timing_lock
from gpu_tasks.pool import Job, JobFailure, WorkerPool
from gpu_tasks.runner import device_for, make_arguments
from gpu_tasks.threads import logical_cpus
from gpu_tasks.timing_session import Sampler
from gpu_tasks.verification import describe_error
from gpu_tasks.verify import ProgramLike, SignatureLike, program_text, signature_text

DEFAULT_REPEATS = 7
DEFAULT_MIN_REPEAT_MS = 50
DEFAULT_FLAG_SPEEDUP = 50.0


@dataclass(frozen=True)
class TimingRequest:
    before: str
    after: str
    signature: str
    target: str = "llvm"
    arch: str = "sm_90"
    repeats: int = DEFAULT_REPEATS
    min_repeat_ms: int = DEFAULT_MIN_REPEAT_MS  # TVM takes whole milliseconds
    flag_speedup: float = DEFAULT_FLAG_SPEEDUP
    seed: int = 0
    limits: Limits = DEFAULT_LIMITS
    lock_path: str | None = None
    form: str = "plain"  # the lowering form both sides are built in (leir.lower.FORMS)


@dataclass(frozen=True)
class Timing:
    """`status` is `ok`, or the failure status (`invalid`, `build_error`, `runtime_error`, `timeout`,
    `crash`) with `error`. Times in microseconds per run."""

    status: str
    before_us: float | None = None
    after_us: float | None = None
    speedup: float | None = None
    spread: float | None = None
    before_spread: float | None = None
    after_spread: float | None = None
    repeats: int = 0
    flagged: bool = False
    fingerprint: dict = field(default_factory=dict)
    error: str = ""

    def to_json(self) -> dict:
        out = asdict(self)
        for key, value in out.items():
            if isinstance(value, float) and not math.isfinite(value):
                out[key] = None
        return out


def timing_request(before: ProgramLike, after: ProgramLike, signature: SignatureLike, **options
                   ) -> TimingRequest:
    return TimingRequest(program_text(before), program_text(after), signature_text(signature), **options)


def time_pair(before: ProgramLike, after: ProgramLike, signature: SignatureLike, target: str = "llvm", *,
              pool: WorkerPool | None = None, **options) -> Timing:
    request = timing_request(before, after, signature, target=target, **options)
    return next(iter_time_pairs([request], pool))


def iter_time_pairs(requests: Iterable[TimingRequest], pool: WorkerPool | None = None) -> Iterator[Timing]:
    """Timings in input order. A timing pool should have one worker with one thread per core
    (`timing_pool()`); the machine lock keeps measurements apart anyway."""
    if pool is None:
        yield from (time_pair_job(r) for r in requests)
        return
    for _, result in pool.imap(Job(time_pair_job, (r,)) for r in requests):
        yield _as_timing(result)


def timing_pool(timeout_s: float = 300.0) -> WorkerPool:
    """One worker whose kernels may use every core (parallel loops are part of what is timed)."""
    return WorkerPool(workers=1, timeout_s=timeout_s, threads_per_worker=logical_cpus())


def time_pair_job(request: TimingRequest) -> Timing:
    try:
        signature = load_signature(request.signature)
        before = load_program("before", request.before, signature, request.limits)
        after = load_program("after", request.after, signature, request.limits)
        built = [build(label, p, signature, request.target, request.arch, TIMING_CACHE, request.form)
                 for label, p in (("before", before), ("after", after))]
    except VerificationFailed as failed:
        return Timing(failed.verification.status, error=failed.verification.error)
    inputs = drawn(signature, request.signature, plan_from_facts(signature, [before.facts, after.facts]), 1,
                   request.seed)[0]
    try:
        device = device_for(request.target)
        evaluators = [Sampler(b.executable.mod, "main", device, int(request.min_repeat_ms)) for b in built]
        args = [make_arguments(signature, inputs, device) for _ in built]
        with timing_lock(request.lock_path):
            samples = measure_interleaved(evaluators, args, request.repeats)
    except Exception as e:
        return Timing("runtime_error", error=describe_error(e))
    return summarize(samples, request, machine_fingerprint(built[0].target))


def measure_interleaved(evaluators: list, args: list[list], repeats: int) -> list[list[float]]:
    """Seconds per run, `repeats` samples per evaluator; rounds alternate their order (ABBA)."""
    for evaluate, a in zip(evaluators, args, strict=True):
        evaluate(*a)  # warm-up: caches, page faults, thread pool start; a Sampler's calibration
    samples: list[list[float]] = [[] for _ in evaluators]
    for round_ in range(repeats):
        order = range(len(evaluators)) if round_ % 2 == 0 else reversed(range(len(evaluators)))
        for i in order:
            samples[i].append(float(evaluators[i](*args[i]).mean))
    return samples


def summarize_samples(samples: list[list[float]]) -> tuple[list[float], float]:
    """(median in µs of each evaluator's samples (seconds), the largest relative interquartile range)."""
    return [float(np.median(s)) * 1e6 for s in samples], max(_relative_iqr(s) for s in samples)


def summarize(samples: list[list[float]], request: TimingRequest, fingerprint: dict) -> Timing:
    before_us, after_us = (float(np.median(s)) * 1e6 for s in samples)
    spreads = [_relative_iqr(s) for s in samples]
    speedup = before_us / after_us if after_us > 0 else math.inf
    return Timing("ok", before_us=before_us, after_us=after_us, speedup=speedup, spread=max(spreads),
                  before_spread=spreads[0], after_spread=spreads[1], repeats=request.repeats,
                  flagged=speedup > request.flag_speedup, fingerprint=fingerprint)


def _relative_iqr(values: list[float]) -> float:
    q25, median, q75 = np.percentile(values, [25, 50, 75])
    return float((q75 - q25) / median) if median > 0 else 0.0


def _as_timing(result) -> Timing:
    if isinstance(result, Timing):
        return result
    if isinstance(result, JobFailure):
        status = result.kind if result.kind in ("crash", "timeout") else "runtime_error"
        return Timing(status, error=result.message)
    return Timing("runtime_error", error=f"unexpected worker result {type(result).__name__}")
