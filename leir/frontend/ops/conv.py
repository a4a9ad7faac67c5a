"""Convolutions (docs/leir.md §5): an optional padding nest, one multiply-accumulate nest with subscripts
`c*stride+g*dilation`, and a bias nest when there is a bias. A transposed convolution is the same
over an input that the padding nest also spreads out by the stride, with the kernel flipped."""
from __future__ import annotations

from leir.frontend.emit import Emitter, Ref, accumulate, store
from leir.frontend.expr import X, add_index, affine, both, select, within
from leir.frontend.registry import UnsupportedForm, op


def tuple_n(value, n: int, name: str) -> tuple[int, ...]:
    if isinstance(value, int):
        return (value,) * n
    value = tuple(value)
    if len(value) == 1:
        return value * n
    if len(value) != n:
        raise UnsupportedForm(f"{name}={value!r} for {n} spatial dimensions")
    return value


def same_padding(kernel, dilation) -> tuple[tuple[int, int], ...]:
    pads = []
    for k, d in zip(kernel, dilation, strict=True):
        total = d * (k - 1)
        pads.append((total // 2, total - total // 2))
    return tuple(pads)


def pad_input(em: Emitter, x: Ref, pads, fill=0, extents=None) -> Ref:
    """A padding nest over the last len(pads) dimensions: `if_then_else(lo<=c<n+lo&..., x[c-lo], fill)`.
    `extents` (default: padded size) lets pooling read past the right edge (ceil_mode)."""
    n = len(pads)
    lead = x.shape[:-n]
    spatial = x.shape[-n:]
    if extents is None:
        extents = tuple(s + lo + hi for s, (lo, hi) in zip(spatial, pads, strict=True))
    if all(lo == 0 for lo, _ in pads) and all(e <= s for e, s in zip(extents, spatial, strict=True)):
        return x
    padded = em.temp(lead + tuple(extents), x.code)

    def body(*v):
        sv = v[len(lead):]
        guards = [within(lo, c, s + lo) for c, s, (lo, _), e in zip(sv, spatial, pads, extents, strict=True)
                  if lo > 0 or e > s]
        src = x.at(*v[:len(lead)], *(affine(c, 1, -lo) for c, (lo, _) in zip(sv, pads, strict=True)))
        return store(padded, v, select(both(*guards), src, fill))
    em.nest(padded.shape, body)
    return padded


def _conv(em, out, x, weight, bias, stride, padding, dilation, groups, n):
    if x.rank != n + 2:
        raise UnsupportedForm("an input without a batch dimension")
    kernel = weight.shape[2:]
    stride, dilation = tuple_n(stride, n, "stride"), tuple_n(dilation, n, "dilation")
    if padding == "valid":
        pads = ((0, 0),) * n
    elif padding == "same":
        pads = same_padding(kernel, dilation)
    else:
        pads = tuple((p, p) for p in tuple_n(padding, n, "padding"))
    src = pad_input(em, x, pads)
    cin_per_group, cout_per_group = weight.shape[1], out.shape[1] // groups

    def body(*v):
        o, r = v[:n + 2], v[n + 2:]
        f, taps = r[0], r[1:]
        channel = f if groups == 1 else (o[1] // cout_per_group) * cin_per_group + f
        pos = [add_index(affine(c, s), affine(t, d)) for c, t, s, d in zip(o[2:], taps, stride, dilation,
                                                                          strict=True)]
        return accumulate(out, o, src.at(o[0], channel, *pos) * weight.at(o[1], f, *taps))
    em.nest(list(out.shape) + [cin_per_group] + list(kernel), body)
    if bias is not None:
        em.nest(out.shape, lambda *v: accumulate(out, v, bias.at(v[1])))


def _register_conv(n):
    @op(f"conv{n}d", float32_kernel=True)
    def conv(em, out, x, weight, bias=None, stride=1, padding=0, dilation=1, groups=1):
        _conv(em, out, x, weight, bias, stride, padding, dilation, groups, n)
    return conv


for _n in (1, 2, 3):
    _register_conv(_n)


def _spread_input(em: Emitter, x: Ref, stride, offsets, extents) -> Ref:
    """`z[c] = x[(c-P)//s]` where `c-P` is a multiple of the stride inside the input, else 0."""
    n = len(stride)
    lead, spatial = x.shape[:-n], x.shape[-n:]
    if all(s == 1 for s in stride) and all(p == 0 for p in offsets) and tuple(extents) == tuple(spatial):
        return x
    z = em.temp(lead + tuple(extents), x.code)

    def body(*v):
        sv = v[len(lead):]
        guards, index = [], []
        for c, s, p, size in zip(sv, stride, offsets, spatial, strict=True):
            shifted = affine(c, 1, -p)
            guards.append(within(0, shifted, (size - 1) * s + 1))
            if s > 1:
                guards.append((X(shifted) % s).eq(0))
                index.append((X(shifted) // s).node)
            else:
                index.append(shifted)
        return store(z, v, select(both(*guards), x.at(*v[:len(lead)], *index), 0))
    em.nest(z.shape, body)
    return z


def _conv_transpose(em, out, x, weight, bias, stride, padding, output_padding, groups, dilation, n):
    if x.rank != n + 2:
        raise UnsupportedForm("an input without a batch dimension")
    kernel = weight.shape[2:]
    stride, dilation = tuple_n(stride, n, "stride"), tuple_n(dilation, n, "dilation")
    padding = tuple_n(padding, n, "padding")
    offsets = [d * (k - 1) - p for k, d, p in zip(kernel, dilation, padding, strict=True)]
    extents = [o + d * (k - 1) for o, k, d in zip(out.shape[2:], kernel, dilation, strict=True)]
    src = _spread_input(em, x, stride, offsets, extents)
    cin_per_group, cout_per_group = x.shape[1] // groups, weight.shape[1]

    def body(*v):
        o, r = v[:n + 2], v[n + 2:]
        f, taps = r[0], r[1:]
        if groups == 1:
            channel, wout = f, o[1]
        else:
            channel, wout = (o[1] // cout_per_group) * cin_per_group + f, o[1] % cout_per_group
        pos = [add_index(c, affine(t, d)) for c, t, d in zip(o[2:], taps, dilation, strict=True)]
        flipped = [X(k - 1) - t for k, t in zip(kernel, taps, strict=True)]
        return accumulate(out, o, src.at(o[0], channel, *pos) * weight.at(channel, wout, *flipped))
    em.nest(list(out.shape) + [cin_per_group] + list(kernel), body)
    if bias is not None:
        em.nest(out.shape, lambda *v: accumulate(out, v, bias.at(v[1])))


def _register_conv_transpose(n):
    @op(f"conv_transpose{n}d", float32_kernel=True)
    def conv_transpose(em, out, x, weight, bias=None, stride=1, padding=0, output_padding=0, groups=1,
                       dilation=1):
        _conv_transpose(em, out, x, weight, bias, stride, padding, output_padding, groups, dilation, n)
    return conv_transpose


for _n in (1, 2, 3):
    _register_conv_transpose(_n)
