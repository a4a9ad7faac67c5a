"""The shape model: which extents a catalogue instance gets, from the dimensions real networks use.

Every shape parameter has a *role* (batch, tokens, features, channels, spatial, sequence, head_dim,
volume) and draws from that role's values in real models: powers of two and the common model widths
(48, 96, 192, 384, 768, ...), image sides of CNN stages (7, 14, 28, 56, 112, 224), head dims 16-128.
Kernel sizes, strides and groups are fixed choices of the operator (`Param.choices`).

A deliberate minority of instances (`ODD_SHARE`, marked `shape_source = "odd-extents"`) draws odd and
prime extents instead, so that edge handling (remainders of splits and tiles) stays in the data.

A per-instance **work budget** keeps CPU verification affordable: the work of an instance is counted
on the meta device (no data, no compute) as multiply-accumulates of matmuls/convolutions plus one unit
per element each other operator touches, which tracks the iteration count of the naive LEIR program.
An instance over budget steps its parameters down their value lists, batch first, then the parameter
furthest up its list, until it fits (or every parameter is at its smallest value).

Profiles: `tiny` (the small integer ranges of each `Param`, for tests), `default` (model dimensions
under the budget of `make run`) and `release` (model dimensions under a larger budget).
"""
from __future__ import annotations

ROLE_VALUES: dict[str, tuple[int, ...]] = {
    "batch": (1, 2, 4, 8, 16, 32),
    "tokens": (16, 32, 64, 128, 256, 512, 1024, 2048),
    "features": (16, 32, 48, 64, 96, 128, 192, 256, 384, 512, 768, 1024, 2048, 4096),
    "channels": (3, 16, 32, 48, 64, 96, 128, 192, 256, 384, 512),
    "spatial": (7, 8, 14, 16, 28, 32, 56, 64, 112, 224),
    "sequence": (16, 32, 64, 128, 256, 512, 1024, 2048),
    "head_dim": (16, 32, 64, 128),
    "volume": (4, 8, 16, 32),
}
# Odd and prime extents near the model dimensions: what a remainder loop must handle.
ODD_VALUES: dict[str, tuple[int, ...]] = {
    "batch": (1, 3, 5, 7),
    "tokens": (15, 17, 31, 33, 63, 65, 97, 127, 129, 255, 257),
    "features": (15, 17, 31, 33, 63, 65, 97, 127, 129, 255, 257, 383, 769),
    "channels": (3, 5, 15, 17, 31, 33, 63, 65, 127),
    "spatial": (7, 9, 13, 15, 17, 27, 31, 33, 55, 57),
    "sequence": (15, 17, 31, 33, 63, 65, 127, 129, 257),
    "head_dim": (15, 17, 31, 33, 63),
    "volume": (3, 5, 7, 9),
}
ROLES = tuple(ROLE_VALUES)
ODD_SHARE = 0.06  # of instances; the odd-share test checks that at most 10% are odd
SHAPE_SOURCES = ("model-dims", "odd-extents", "tiny-ranges")
WORK_BUDGET = {"tiny": None, "default": 1 << 21, "release": 1 << 22}
PROFILES = tuple(WORK_BUDGET)
SCANS = ("cumsum", "cumprod", "cummax", "cummin", "logcumsumexp")
# Fused ATen kernels that the translator spells as several passes over their input (docs/leir.md §5:
# normalisations are sum, mean, squared deviations, variance, normalise; softmaxes max, exp-sum, divide).
PASSES = {"native_layer_norm": 5, "native_group_norm": 5, "native_batch_norm": 5, "_native_batch_norm_legit": 5,
          "_native_batch_norm_legit_functional": 5, "_softmax": 3, "_log_softmax": 3, "var": 3, "std": 3,
          "var_mean": 3, "std_mean": 3, "logsumexp": 3, "_fused_rms_norm": 3}


def role_values(role: str, odd: bool = False) -> tuple[int, ...]:
    if role not in ROLE_VALUES:
        raise ValueError(f"unknown shape role {role!r}; expected one of {', '.join(ROLES)}")
    return (ODD_VALUES if odd else ROLE_VALUES)[role]


def estimate_work(workload, params: dict) -> int:
    """Work units of one instance: multiply-accumulates of contractions plus the elements every other
    operator touches (the largest tensor of each call), counted on the meta device."""
    return _meta_figures(workload, params)[0]


def estimate_bytes(workload, params: dict) -> int:
    """Bytes of the tensors one float32 forward pass of an instance holds: its inputs and every
    operator's output, counted on the meta device (nothing is allocated): what a guard compares with a
    memory limit before the instance is built."""
    return _meta_figures(workload, params)[1]


def _meta_figures(workload, params: dict) -> tuple[int, int]:
    key = (workload.name, tuple(sorted(params.items())))
    if key not in _WORK:
        _WORK[key] = _count_work(workload, dict(params))
    return _WORK[key]


_WORK: dict[tuple, tuple[int, int]] = {}


def _count_work(workload, params: dict) -> tuple[int, int]:
    import torch
    from torch.utils._python_dispatch import TorchDispatchMode
    from torch.utils._pytree import tree_leaves
    from torch.utils.flop_counter import FlopCounterMode

    def nbytes(tensors) -> int:
        return sum(t.numel() * t.element_size() for t in tree_leaves(tensors) if isinstance(t, torch.Tensor))

    class Elements(TorchDispatchMode):
        total = 0
        held = 0

        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            out = func(*args, **(kwargs or {}))
            sizes = [t.numel() for t in tree_leaves((args, kwargs, out)) if isinstance(t, torch.Tensor)]
            work = max(sizes, default=1) * PASSES.get(func.__name__.split(".")[0], 1)
            if func.__name__.split(".")[0] in SCANS:  # LEIR writes a scan as a reduction over the prefix
                dim = args[1] if len(args) > 1 else (kwargs or {}).get("dim", 0)
                work *= args[0].shape[dim] if args[0].dim() else 1
            Elements.total += work
            Elements.held += nbytes(out)
            return out

    with torch.device("meta"):
        module = workload.module(params)
        inputs = [torch.empty(tuple(spec.shape(params)), dtype=_meta_dtype(spec.kind)) for spec in workload.inputs]
    flops = FlopCounterMode(display=False)
    with flops, Elements(), torch.no_grad():
        module(*inputs)
    return int(flops.get_total_flops() // 2 + Elements.total), nbytes(inputs) + Elements.held


def _meta_dtype(kind: str):
    import torch

    return {"index": torch.int64, "bool": torch.bool}.get(kind, torch.float32)


def fit_to_budget(workload, params: dict, profile: str, odd: bool) -> dict:
    """Step parameters down their value lists until the instance's work is within the profile's budget."""
    budget = WORK_BUDGET[profile]
    if budget is None:
        return params
    params = dict(params)
    lists = {p.name: tuple(p.values(profile, odd)) for p in workload.params if p.same_as is None}
    work = estimate_work(workload, params)
    while work > budget:
        movable = [n for n, vs in lists.items() if vs.index(params[n]) > 0]
        if not movable:
            break  # every parameter at its smallest value: the smallest instance there is
        name = _next_to_shrink(workload, params, lists, movable)
        old = params[name]
        params[name] = lists[name][lists[name].index(old) - 1]
        _tie(workload, params)
        if not workload.constraint(params):
            params[name] = old
            _tie(workload, params)
            lists[name] = lists[name][lists[name].index(old):]  # this one cannot go lower
            continue
        work = estimate_work(workload, params)
    return params


def _next_to_shrink(workload, params: dict, lists: dict, movable: list[str]) -> str:
    """Batch first (inference runs batch 1), then the parameter furthest up its list."""
    roles = {p.name: p.role for p in workload.params}
    batch = [n for n in movable if roles[n] == "batch"]
    if batch:
        return batch[0]
    return max(movable, key=lambda n: (lists[n].index(params[n]) / max(len(lists[n]) - 1, 1), params[n]))


def _tie(workload, params: dict) -> None:
    for p in workload.params:
        if p.same_as is not None:
            params[p.name] = params[p.same_as]
