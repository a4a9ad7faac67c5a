"""Normalisations (docs/leir.md §5): sum, mean, squared-deviation sum, biased variance, normalise with
`sqrt(var+eps)`, then the affine nest `weight*x+bias` (golden `layer_norm_last_dim`).

Statistics live in temporaries indexed by the kept dimensions; `stats_index(v)` maps a position of
the input to its statistics slot.
"""
from __future__ import annotations

import torch

from leir.dtypes import torch_name
from leir.frontend.emit import (
    ACCUMULATOR_CODE,
    HALF_CODES,
    NORM_CASCADE_TERMS,
    Emitter,
    Ref,
    accumulate,
    accumulate_over,
    store,
)
from leir.frontend.expr import sqrt
from leir.frontend.registry import UnsupportedForm, op


def normalise(em: Emitter, out: Ref, x: Ref, stats_shape, stats_index, count: int, eps,
              affine=None, centre=True) -> None:
    """Mean/variance statistics over the positions that share `stats_index`, then normalise and
    apply `affine(v, normalised) -> expr` (None: the normalised value is the result)."""
    if centre:
        total = em.temp(stats_shape, x.code)
        accumulate_over(em, total, x.shape, stats_index, lambda v: x.at(*v), cascade_terms=NORM_CASCADE_TERMS)
        mean = em.temp(stats_shape, x.code)
        em.nest(stats_shape, lambda *v: store(mean, v, total.at(*v) / count))

        def centred(v):
            return x.at(*v) - mean.at(*stats_index(v))
    else:
        def centred(v):
            return x.at(*v)
    squares = em.temp(stats_shape, x.code)
    accumulate_over(em, squares, x.shape, stats_index, lambda v: centred(v) ** 2, cascade_terms=NORM_CASCADE_TERMS)
    variance = em.temp(stats_shape, x.code)
    em.nest(stats_shape, lambda *v: store(variance, v, squares.at(*v) / count))

    def normalised(v):
        return centred(v) / sqrt(variance.at(*stats_index(v)) + eps)
    if affine is None:
        em.nest(x.shape, lambda *v: store(out, v, normalised(v)))
        return
    unit = em.temp(x.shape, x.code)
    em.nest(x.shape, lambda *v: store(unit, v, normalised(v)))
    em.nest(x.shape, lambda *v: store(out, v, affine(v, unit.at(*v))))


def scale_shift(weight, bias, index):
    """`weight*x+bias` with either part optional; None when both are absent."""
    if weight is None and bias is None:
        return None

    def apply(v, unit):
        y = unit if weight is None else weight.at(*index(v)) * unit
        return y if bias is None else y + bias.at(*index(v))
    return apply


def _trailing(x: Ref, normalized_shape) -> int:
    k = 1 if isinstance(normalized_shape, int) else len(normalized_shape)
    if k > x.rank:
        raise UnsupportedForm("normalized_shape longer than the input")
    return k


@op("layer_norm", float32_kernel=True)
def layer_norm(em, out, x, normalized_shape, weight=None, bias=None, eps=1e-05):
    k = _trailing(x, normalized_shape)
    lead = x.rank - k
    count = x.numel() // max(1, _prod(x.shape[:lead]))
    normalise(em, out, x, x.shape[:lead], lambda v: v[:lead], count, eps,
              scale_shift(weight, bias, lambda v: v[lead:]))


@op("rms_norm", float32_kernel=True)
def rms_norm(em, out, x, normalized_shape, weight=None, eps=None):
    k = _trailing(x, normalized_shape)
    lead = x.rank - k
    count = x.numel() // max(1, _prod(x.shape[:lead]))
    if eps is None:  # PyTorch's kernel takes the eps of the dtype it computes in: float32 for half inputs
        eps = torch.finfo(getattr(torch, torch_name(ACCUMULATOR_CODE if x.code in HALF_CODES else x.code))).eps
    normalise(em, out, x, x.shape[:lead], lambda v: v[:lead], count, eps,
              scale_shift(weight, None, lambda v: v[lead:]), centre=False)


@op("batch_norm", float32_kernel=True)
def batch_norm(em, out, x, running_mean, running_var, weight=None, bias=None, training=False,
               momentum=0.1, eps=1e-05):
    channel = _channel_affine(weight, bias)
    if training or running_mean is None:
        count = x.numel() // x.shape[1]
        normalise(em, out, x, (x.shape[1],), lambda v: [v[1]], count, eps, channel)
        return

    def body(*v):
        unit = (x.at(*v) - running_mean.at(v[1])) / sqrt(running_var.at(v[1]) + eps)
        return store(out, v, unit if channel is None else channel(v, unit))
    em.nest(x.shape, body)


def _channel_affine(weight, bias):
    return scale_shift(weight, bias, lambda v: [v[1]])


@op("instance_norm", float32_kernel=True)
def instance_norm(em, out, x, running_mean=None, running_var=None, weight=None, bias=None,
                  use_input_stats=True, momentum=0.1, eps=1e-05, cudnn_enabled=False):
    if not use_input_stats:
        raise UnsupportedForm("instance_norm with running statistics")
    count = x.numel() // (x.shape[0] * x.shape[1])
    normalise(em, out, x, x.shape[:2], lambda v: v[:2], count, eps, _channel_affine(weight, bias))


@op("group_norm", float32_kernel=True)
def group_norm(em, out, x, num_groups, weight=None, bias=None, eps=1e-05):
    per_group = x.shape[1] // num_groups
    count = x.numel() // (x.shape[0] * num_groups)

    def group_of(v):
        return [v[0], v[1] // per_group] if per_group > 1 else [v[0], v[1]]
    normalise(em, out, x, (x.shape[0], num_groups), group_of, count, eps, _channel_affine(weight, bias))


@op("normalize", float32_kernel=True)
def normalize(em, out, x, p=2.0, dim=1, eps=1e-12):
    if p != 2:
        raise UnsupportedForm(f"normalize with p={p!r}")
    d = dim % x.rank
    squares = em.temp(x.shape[:d] + x.shape[d + 1:], x.code)

    def drop(v):
        return list(v[:d]) + list(v[d + 1:])
    em.nest(x.shape, lambda *v: accumulate(squares, drop(v), x.at(*v) ** 2))
    from leir.frontend.expr import vmax

    em.nest(x.shape, lambda *v: store(out, v, x.at(*v) / vmax(sqrt(squares.at(*drop(v))), eps)))


def _prod(shape) -> int:
    n = 1
    for s in shape:
        n *= s
    return n
