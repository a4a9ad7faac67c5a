"""Convolutions (docs/leir.md §5): an optional padding nest, one multiply-accumulate nest with subscripts
`c*stride+g*dilation`, and a bias nest when there is a bias.

A transposed convolution of stride 1 (or any dilation) is the same over an input that the padding nest
also spreads out by the stride, with the kernel flipped. One of stride s > 1 and no dilation is
computed by phases instead (`_phase_conv_transpose`): output position `o = s*q + r` receives only the
taps `t` congruent to `r+P` modulo s, where a spread input multiplies s-1 of every s taps per dimension
by zero (s^n - 1 of s^n in n dimensions: KernelBench's 3D ones at stride 2 did 8x PyTorch's work)."""
from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from leir.ast import Neg
from leir.frontend.emit import Emitter, Ref, accumulate, store
from leir.frontend.expr import X, add_index, affine, both, lit, select, within
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
    if any(s > 1 for s in stride) and all(d == 1 for d in dilation):
        _phase_conv_transpose(em, out, x, weight, bias, stride, padding, groups)
        return
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


@dataclass(frozen=True)
class _Phases:
    """One spatial dimension of a transposed convolution by phases (stride s, no dilation): output
    `o = s*q + r` sums `x[q + c(r) - j] * w[t0(r) + s*j]` over `j < taps`, with `c(r) = (r+P)//s` and
    `t0(r) = (r+P) % s`; the input is padded by `pad` so that every read is in range, a phase's taps
    past the kernel are zero (every phase has as many), and `q` runs to `ceil(O/s)` (the last phase's
    extra outputs are computed and never read)."""

    stride: int
    taps: int
    offsets: tuple[int, ...]      # c(r) per phase
    first_taps: tuple[int, ...]   # t0(r) per phase
    pad: tuple[int, int]
    extent: int                   # q's extent

    @classmethod
    def of(cls, kernel: int, stride: int, padding: int, size: int, out_size: int) -> _Phases:
        taps = -(-kernel // stride)
        offsets = tuple((r + padding) // stride for r in range(stride))
        first = tuple((r + padding) % stride for r in range(stride))
        extent = -(-out_size // stride)
        lo = max(0, taps - 1 - min(offsets))
        hi = max(0, extent + max(offsets) - size)
        return cls(stride, taps, offsets, first, (lo, hi), extent)

    def input_index(self, q, j, r, padding: int):
        """The padded input's subscript of phase `r`, tap `j` counted backwards (`j' = taps-1-j`, so
        that the subscript grows with it): `q + j' + c(r) + pad - (taps-1)`."""
        offset = self.pad[0] - (self.taps - 1)
        return add_index(add_index(q, j), _of_phase(r, self.offsets, lambda: (X(r) + padding) // self.stride, offset))

    def kernel_tap(self, j, r, padding: int):
        """The kernel tap of phase `r`, tap `j` counted backwards: `t0(r) + s*(taps-1) - s*j'`."""
        first = _of_phase(r, self.first_taps, lambda: (X(r) + padding) % self.stride, self.stride * (self.taps - 1))
        return (X(first) - X(affine(j, self.stride))).node


def _of_phase(r, values: tuple[int, ...], generic: Callable[[], X], offset: int = 0):
    """`values[r] + offset` as an index expression (`r` None: the one phase of stride 1): linear in
    `r` where the values are (stride 2, or a padding that is a multiple of the stride), else
    `generic() + offset` (`//` or `%` of `r+P`)."""
    if r is None:
        return lit(values[0] + offset)
    step = values[1] - values[0]
    if all(v == values[0] + step * k for k, v in enumerate(values)):
        return _linear(r, step, values[0] + offset)
    return _linear(generic(), 1, offset)


def _linear(var, scale: int, offset: int):
    """`var*scale+offset` for any signs (`affine` takes a non-negative scale)."""
    if scale == 0:
        return lit(offset)
    if scale > 0:
        return affine(var, scale, offset)
    return (X(offset) - X(affine(var, -scale))).node if offset else Neg(affine(var, -scale))


def _phase_conv_transpose(em, out, x, weight, bias, stride, padding, groups):
    """`_Phases` in every dimension, in three nests (after the input's padding):

    1. the kernel re-laid by phase, `V[r..., j..., ci, co] = w[ci, co, t(r, j)...]` (0 past the kernel);
    2. the multiply-accumulate into a phase-major, channels-last temporary
       `Y[r..., q..., n, co] += x[n, ci, q+j+c(r)...] * V[r..., j..., ci, co]`: the output channels are
       its unit stride and V's, and the input is the same along them, so the micro-kernel tiles it
       with no copy whatever the spatial sizes (KernelBench's shrunk 3D ones have 3 to 8 positions a
       row and 64 to 128 channels); the batch beside the channels is the tile's rows in one tiling
       step (a micro-kernel of 8 steps, not 14 to 16 with the batch first);
    3. each output element read from its phase, with the bias."""
    n = len(stride)
    kernel = weight.shape[2:]
    dims = [_Phases.of(k, s, p, size, o) for k, s, p, size, o in
            zip(kernel, stride, padding, x.shape[2:], out.shape[2:], strict=True)]
    phased = [i for i, d in enumerate(dims) if d.stride > 1]
    src = pad_input(em, x, tuple(d.pad for d in dims))

    def phase_vars(v):
        return dict(zip(phased, v[:len(phased)], strict=True)), v[len(phased):]

    taps = tuple(d.taps for d in dims)
    relaid = em.temp(tuple(dims[i].stride for i in phased) + taps + weight.shape[:2], weight.code)

    def relay(*v):
        rs, v = phase_vars(v)
        js, (ci, co) = v[:n], v[n:]
        at = [d.kernel_tap(j, rs.get(i), p) for i, (d, j, p) in enumerate(zip(dims, js, padding, strict=True))]
        inside = [within(0, t, k) for t, k, d in zip(at, kernel, dims, strict=True) if d.stride * d.taps > k]
        value = weight.at(ci, co, *at)
        return store(relaid, (*rs.values(), *js, ci, co), select(both(*inside), value, 0) if inside else value)
    em.nest(relaid.shape, relay)

    y = em.temp(tuple(dims[i].stride for i in phased) + tuple(d.extent for d in dims) + out.shape[:2], out.code)
    cin_per_group, cout_per_group = x.shape[1] // groups, weight.shape[1]

    def body(*v):
        rs, v = phase_vars(v)
        qs, b, c, f, js = v[:n], v[n], v[n + 1], v[n + 2], v[n + 3:]
        if groups == 1:
            channel, wout = f, c
        else:
            channel, wout = (c // cout_per_group) * cin_per_group + f, c % cout_per_group
        pos = [d.input_index(q, j, rs.get(i), p) for i, (d, q, j, p) in enumerate(zip(dims, qs, js, padding,
                                                                                       strict=True))]
        return accumulate(y, (*rs.values(), *qs, b, c),
                          src.at(b, channel, *pos) * relaid.at(*rs.values(), *js, channel, wout))
    em.nest(list(y.shape) + [cin_per_group] + list(taps), body)

    def gather(*v):
        o = v[2:]
        value = y.at(*(X(o[i]) % dims[i].stride for i in phased),
                     *((X(o[i]) // d.stride).node if d.stride > 1 else o[i] for i, d in enumerate(dims)), v[0], v[1])
        return store(out, v, value + bias.at(v[1]) if bias is not None else value)
    em.nest(out.shape, gather)


def _register_conv_transpose(n):
    @op(f"conv_transpose{n}d", float32_kernel=True)
    def conv_transpose(em, out, x, weight, bias=None, stride=1, padding=0, output_padding=0, groups=1,
                       dilation=1):
        _conv_transpose(em, out, x, weight, bias, stride, padding, output_padding, groups, dilation, n)
    return conv_transpose


for _n in (1, 2, 3):
    _register_conv_transpose(_n)
