"""TVM's MetaSchedule on the very function our search times: the tuned reference of the search
report.

`tensorir_reference` lowers the ORIGINAL LEIR program to its TensorIR form (`leir.lower`, the block
form `tvm.s_tir.Schedule` works on), tunes it with `tune_tir` (`tune_primfunc`), checks that the
tuned function computes what the program computes, and then times, in one session of our timing
protocol (`gpu_tasks.timing`: deployment builds, `time_evaluator` samples of at least
`min_repeat_ms`, interleaved rounds ABC-CBA, the machine's timing lock), the naive program, the
search's best state and the tuned function. So the three times are comparable with each other and
with the search's own speedups. `gpu_tasks.metaschedule_relax` keeps the earlier reference (TVM's
own path from the PyTorch module through Relax) as a second figure.

Builder workers use `build_without_gpu_intrinsics`: TVM's default build function first imports
`tvm.s_tir.tensor_intrin`, whose CUDA part alone takes ~47 s on a 2-core machine, in every builder
process, and LocalBuilder starts new processes for every batch. CPU targets never use those
intrinsics. The tuning process itself imports the same package when it creates a TuneContext (80 s
measured on a busy 2-core machine, 1.2 s of it for the x86 intrinsics that CPU schedule rules use):
`register_cpu_intrinsics` loads only the host CPU's part instead.
"""
from __future__ import annotations

import importlib
import importlib.util
import logging
import os
import platform
import sys
import tempfile
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass


class MetaScheduleError(RuntimeError):
    """Tuning found no schedule, or the tuned function computes something else."""


def build_without_gpu_intrinsics(mod, target, _params):
    """MetaSchedule's default build, less the import of every tensor intrinsic of every target."""
    from tvm.driver import build as tvm_build
    from tvm.s_tir.transform import RemoveWeightLayoutRewriteBlock

    return tvm_build(RemoveWeightLayoutRewriteBlock(skip_tensor_rewrite=True)(mod), target=target)


def register_cpu_intrinsics() -> None:
    """Make the `import tvm.s_tir.tensor_intrin` of MetaSchedule's TuneContext register only the host
    CPU's tensor intrinsics (x86, or arm_cpu on ARM hosts), the ones CPU schedule rules can ask for:
    the package itself imports every target's, CUDA's alone ~50 s. Once per process; a process that
    has imported the package already keeps it. Only processes that tune for the CPU call this."""
    name = "tvm.s_tir.tensor_intrin"
    if name in sys.modules:
        return
    import tvm.s_tir

    spec = importlib.util.find_spec(name)
    package = importlib.util.module_from_spec(spec)  # its __init__ (every target's intrinsics) not run
    sys.modules[name] = package
    try:
        importlib.import_module(f"{name}.{'arm_cpu' if platform.machine() in ('aarch64', 'arm64') else 'x86'}")
    except BaseException:
        del sys.modules[name]
        raise
    tvm.s_tir.tensor_intrin = package


@contextmanager
def quiet_metaschedule() -> Iterator[None]:
    """MetaSchedule logs every round to stdout at INFO (its log files go to the work dir): quiet it
    for the tuning, then give the caller's level back. Its logger setup also lists the names of the
    handlers its logger has, and fails on one without a name (pytest's log capture leaves two there
    after a first tuning), so those are set aside during the tuning."""
    logger = logging.getLogger("tvm.s_tir.meta_schedule")
    level = logger.level
    unnamed = [h for h in logger.handlers if h.get_name() is None]
    for h in unnamed:
        logger.removeHandler(h)
    logger.setLevel(logging.WARNING)
    try:
        yield
    finally:
        logger.setLevel(level)
        for h in unnamed:
            logger.addHandler(h)


def tuning_target():
    """The host CPU with its `mcpu` and its core count (MetaSchedule sizes parallel loops by it)."""
    import tvm

    return tvm.target.Target({"kind": "llvm", "mcpu": tvm.target.codegen.llvm_get_system_cpu(),
                              "num-cores": os.cpu_count() or 1})


def tune_primfunc(func, trials: int, seed: int = 0):
    """`func` (a TensorIR PrimFunc) tuned by MetaSchedule's `tune_tir` with `trials` measured
    candidates (batches of at most 32), then the best schedule applied (`compile_tir`)."""
    import tvm
    from tvm.s_tir import meta_schedule as ms

    mod = tvm.IRModule({"main": func})
    target = tuning_target()
    register_cpu_intrinsics()
    with quiet_metaschedule(), tempfile.TemporaryDirectory() as wd:
        builder = ms.builder.LocalBuilder(max_workers=1, timeout_sec=600, f_build=build_without_gpu_intrinsics)
        db = ms.tune_tir(mod=mod, target=target, work_dir=wd, max_trials_global=trials,
                         num_trials_per_iter=min(trials, 32), seed=seed, builder=builder)
        sch = ms.tir_integration.compile_tir(db, mod, target)
    if sch is None:
        raise MetaScheduleError(f"MetaSchedule found no valid schedule in {trials} trials")
    return sch.mod["main"]


@dataclass(frozen=True)
class SessionTimes:
    """Medians (µs) of one interleaved timing session, and its spread (largest relative IQR)."""

    naive_us: float
    best_us: float | None
    tuned_us: float
    spread: float
    verification: str  # the tuned function against the naive program: exact or close
    threads: int = 0   # TVM's threads in the timing process (the timing workers use every core)


def tensorir_reference(program, signature, trials: int, *, best=None, seed: int = 0, repeats: int = 5,
                       min_repeat_ms: int = 20, lock_path: str | None = None) -> dict:
    """MetaSchedule's tuned time for the TensorIR of `program` (the original, naive LEIR), timed in one
    session with `program` and with `best` (the search's best state, LEIR; None: none).

    Returns `metaschedule_us` (the tuned function), `session_naive_us`, `session_best_us`,
    `session_spread`, `metaschedule_verification`, `metaschedule_tuning_s` (wall time of the tuning)."""
    from gpu_tasks.threads import logical_cpus, tvm_threads_here
    from leir.lower import lower_to_primfunc

    # before tuning: MetaSchedule's runner processes inherit the thread count, so its candidates are
    # measured with every core, as our timing workers measure the search's states
    tvm_threads_here(logical_cpus())
    program, signature = _program(program), _signature(signature)
    start = time.perf_counter()
    tuned = tune_primfunc(lower_to_primfunc(program, signature, "llvm", form="tensorir"), trials, seed)
    tuning_s = time.perf_counter() - start
    times = time_against_tuned(program, signature, tuned, best=best, seed=seed, repeats=repeats,
                               min_repeat_ms=min_repeat_ms, lock_path=lock_path)
    return {"metaschedule_us": times.tuned_us, "session_naive_us": times.naive_us,
            "session_best_us": times.best_us, "session_spread": times.spread,
            "metaschedule_verification": times.verification, "metaschedule_tuning_s": round(tuning_s, 1),
            "session_threads": times.threads}


def time_against_tuned(program, signature, tuned, *, best=None, seed: int = 0, repeats: int = 5,
                       min_repeat_ms: int = 20, lock_path: str | None = None) -> SessionTimes:
    """Check that `tuned` (a PrimFunc with the signature's arguments) computes what `program` does,
    then time the naive program, `best` (if any) and `tuned` interleaved (our timing protocol)."""
    import tvm

    from gpu_tasks.cache import TIMING_CACHE, TIMING_PASS_CONFIG, Built
    from gpu_tasks.compare import judge
    from gpu_tasks.inputs import draw_inputs, make_draws, plan_inputs
    from gpu_tasks.jobs import output_codes
    from gpu_tasks.machine_lock import timing_lock
    from gpu_tasks.runner import make_arguments, run_built
    from gpu_tasks.threads import logical_cpus, tvm_threads_here
    from gpu_tasks.timing import measure_interleaved, summarize_samples
    from gpu_tasks.timing_session import Sampler
    from gpu_tasks.tolerances import tolerance_table

    program, signature = _program(program), _signature(signature)
    # as many threads as the timing workers that timed the search (before the first kernel runs here)
    threads = tvm_threads_here(logical_cpus())
    naive = TIMING_CACHE.build(program, signature, "llvm")
    target = tuning_target()
    with tvm.transform.PassContext(config=TIMING_PASS_CONFIG):   # as the naive program and best state
        ex = tvm.compile(tvm.IRModule({"main": tuned}), target=target)
    tuned_built = Built(ex, ex["main"], str(target))
    draws = make_draws(signature, [program], 2, seed)
    verdict = judge([run_built(naive, signature, d) for d in draws], [run_built(tuned_built, signature, d)
                                                                      for d in draws],
                    output_codes(signature), tolerance_table())
    if not verdict.passed:
        raise MetaScheduleError(f"the tuned function differs from the program: {verdict.status} {verdict.error}")
    built = [naive] + ([TIMING_CACHE.build(_program(best), signature, "llvm")] if best is not None else [])
    built.append(tuned_built)
    inputs = draw_inputs(signature, plan_inputs(signature, [program]), 0, seed)
    device = tvm.cpu(0)
    evaluators = [Sampler(b.executable.mod, "main", device, int(min_repeat_ms)) for b in built]
    args = [make_arguments(signature, inputs, device) for _ in built]
    with timing_lock(lock_path):
        samples = measure_interleaved(evaluators, args, repeats)
    medians, spread = summarize_samples(samples)
    return SessionTimes(medians[0], medians[1] if best is not None else None, medians[-1], spread, verdict.status,
                        threads)


def _program(program):
    from leir.parse import parse_program

    return parse_program(program) if isinstance(program, str) else program


def _signature(signature):
    from leir.signature import Signature

    return signature if isinstance(signature, Signature) else Signature.from_json(signature)
