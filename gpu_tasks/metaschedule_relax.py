"""TVM's MetaSchedule-tuned time for a PyTorch module through Relax: the second reference figure of
the search report (the first, `gpu_tasks.metaschedule`, tunes the very function our search
times).

The path is TVM's own from the module: `torch.export` -> Relax (`from_exported_program`) -> the
preparation `compile_relax` applies (library dispatch, `LegalizeOps`, `FuseOps`, `FuseTIR`) ->
`tune_relax` over the fused kernels -> `compile_relax`. The compiled function must agree with
PyTorch eager; then each tuned kernel is timed alone and the whole function once through the Relax
VM. Its kernels are TVM's legalized operators, not our program, so the figure can differ from the
tuned TensorIR of the same program (fusion, layouts, a different starting loop nest).
"""
from __future__ import annotations

import tempfile

from gpu_tasks.metaschedule import (
    build_without_gpu_intrinsics,
    quiet_metaschedule,
    register_cpu_intrinsics,
    tuning_target,
)


def _fuse(mod, target):
    """The preparation compile_relax applies before it looks kernels up in the database, so that the
    kernels tuned are the ones it finds."""
    import tvm
    from tvm import relax

    try:
        dispatch = relax.pipeline.library_dispatch_passes(target)
    except (ValueError, AttributeError):
        dispatch = []
    with target:
        return tvm.transform.Sequential([*dispatch, relax.transform.LegalizeOps(),
                                         relax.transform.AnnotateTIROpPattern(), relax.transform.FoldConstant(),
                                         relax.transform.FuseOps(), relax.transform.FuseTIR()])(mod)


def metaschedule_times(module, inputs, trials: int, seed: int = 0) -> dict:
    """TVM's MetaSchedule-tuned times for `module` on `inputs`, `trials` measured candidates in all:

    - `metaschedule_us`: the sum over the tuned fused kernels, each timed alone as our timing
      protocol times a program (compiled function, seeded arguments, `time_evaluator`); the figure to
      set beside our own kernel times;
    - `metaschedule_vm_us`: one call of the whole compiled Relax function in the VM, which adds the
      VM's call and allocation overhead (it dominates on tiny programs);
    - `kernels`: the number of fused kernels tuned.
    """
    import torch
    import tvm
    from tvm import relax
    from tvm.relax.frontend.torch import from_exported_program
    from tvm.s_tir import meta_schedule as ms

    from gpu_tasks.threads import logical_cpus, tvm_threads_here

    tvm_threads_here(logical_cpus())  # tuning's runners and the timing here: every core, as our timing workers

    with torch.no_grad():
        mod = from_exported_program(torch.export.export(module, tuple(inputs)))
    target = tuning_target()
    fused = _fuse(mod, target)
    kernels = len(ms.relax_integration.extract_tasks(fused, target))
    register_cpu_intrinsics()
    with quiet_metaschedule():
        with tempfile.TemporaryDirectory() as wd:
            builder = ms.builder.LocalBuilder(max_workers=1, timeout_sec=600, f_build=build_without_gpu_intrinsics)
            db = ms.relax_integration.tune_relax(mod=fused, params={}, target=target, work_dir=wd,
                                                 max_trials_global=trials, num_trials_per_iter=min(trials, 32),
                                                 seed=seed, builder=builder)
            ex = ms.relax_integration.compile_relax(db, mod, target, params=None)
            with target, db, tvm.transform.PassContext(opt_level=3):
                tuned = relax.transform.MetaScheduleApplyDatabase()(fused)
    dev = tvm.cpu()
    vm = relax.VirtualMachine(ex, dev)
    args = [tvm.runtime.tensor(x.detach().contiguous().numpy(), dev) for x in inputs]
    _check_outputs(vm["main"](*args), module, inputs)
    timer = vm.time_evaluator("main", dev, number=1, repeat=5, min_repeat_ms=20)
    return {"metaschedule_us": _kernels_us(tuned, target, dev, seed),
            "metaschedule_vm_us": float(timer(*args).median) * 1e6, "kernels": kernels}


def _kernels_us(mod, target, dev, seed: int) -> float:
    """Sum over the module's PrimFuncs of each one's median time on seeded arguments (µs)."""
    import numpy as np
    import tvm
    from tvm.s_tir.meta_schedule.arg_info import ArgInfo

    rng = np.random.default_rng(seed)
    total = 0.0
    for _, f in sorted(((gv.name_hint, f) for gv, f in mod.functions.items() if isinstance(f, tvm.tirx.PrimFunc)),
                       key=lambda item: item[0]):
        lib = tvm.compile(tvm.IRModule({"main": f.with_attr("global_symbol", "main")}), target)
        args = []
        for info in ArgInfo.from_prim_func(f):
            shape, dtype = [int(d) for d in info.shape], str(info.dtype)
            values = rng.standard_normal(shape) if "float" in dtype else np.zeros(shape)
            args.append(tvm.runtime.tensor(values.astype(dtype), dev))
        evaluate = lib.mod.time_evaluator("main", dev, number=1, repeat=5, min_repeat_ms=20)
        total += float(evaluate(*args).median) * 1e6
    return total


def _check_outputs(got, module, inputs) -> None:
    """A reference that computes something else is no reference: the tuned module must agree with
    PyTorch eager on the inputs it is timed on."""
    import numpy as np
    import torch

    with torch.no_grad():
        want = module(*inputs)
    want = [want] if isinstance(want, torch.Tensor) else list(want)
    got = [got] if hasattr(got, "numpy") else list(got)
    if len(got) != len(want):
        raise ValueError(f"MetaSchedule module returned {len(got)} outputs, PyTorch {len(want)}")
    for i, (g, w) in enumerate(zip(got, want, strict=True)):
        g, w = g.numpy(), w.detach().numpy()
        if g.shape != w.shape or not np.allclose(g, w, rtol=1e-3, atol=1e-4 * max(1.0, float(np.abs(w).max()))):
            raise ValueError(f"MetaSchedule output {i} differs from PyTorch eager")
