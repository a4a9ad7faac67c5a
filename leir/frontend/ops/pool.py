"""Pooling (docs/leir.md §5): a padding nest with `-inf` (max) or 0 (average) when the windows reach
outside the input, then a max or sum nest over the window; average pooling divides by the window
size PyTorch uses (a literal when it is the same everywhere, else an expression of the position)."""
from __future__ import annotations

from leir.frontend.emit import Emitter, Ref, accumulate, store
from leir.frontend.expr import X, add_index, affine, both, select, vmax, vmin
from leir.frontend.ops.conv import pad_input, tuple_n
from leir.frontend.registry import UnsupportedForm, op


def _window_geometry(x: Ref, out: Ref, n, kernel_size, stride, padding, dilation):
    kernel = tuple_n(kernel_size, n, "kernel_size")
    stride = kernel if stride is None or stride == [] or stride == () else tuple_n(stride, n, "stride")
    padding, dilation = tuple_n(padding, n, "padding"), tuple_n(dilation, n, "dilation")
    needed = tuple((o - 1) * s + d * (k - 1) + 1 for o, s, d, k in zip(out.shape[-n:], stride, dilation, kernel,
                                                                     strict=True))
    extents = tuple(max(e, size + 2 * p) if p else e
                    for e, size, p in zip(needed, x.shape[-n:], padding, strict=True))
    return kernel, stride, padding, dilation, extents


def _window_nest(em, out, src, n, kernel, stride, dilation, how, acc=None):
    acc = acc or out

    def body(*v):
        o, taps = v[:out.rank], v[out.rank:]
        pos = [add_index(affine(c, s), affine(t, d))
               for c, t, s, d in zip(o[-n:], taps, stride, dilation, strict=True)]
        return accumulate(acc, o, src.at(*o[:-n], *pos), how)
    em.nest(list(out.shape) + list(kernel), body)


def _max_pool(em, out, x, n, kernel_size, stride=None, padding=0, dilation=1, ceil_mode=False,
              return_indices=False):
    if return_indices or isinstance(out, list):
        raise UnsupportedForm("return_indices=True")
    kernel, stride, padding, dilation, extents = _window_geometry(x, out, n, kernel_size, stride, padding,
                                                                  dilation)
    src = pad_input(em, x, tuple((p, p) for p in padding), float("-inf"), extents)
    _window_nest(em, out, src, n, kernel, stride, dilation, "max")


def _avg_pool(em, out, x, n, kernel_size, stride=None, padding=0, ceil_mode=False, count_include_pad=True,
              divisor_override=None):
    kernel, stride, padding, _, extents = _window_geometry(x, out, n, kernel_size, stride, padding, 1)
    src = pad_input(em, x, tuple((p, p) for p in padding), 0, extents)
    total = em.temp(out.shape, out.code)
    _window_nest(em, out, src, n, kernel, stride, (1,) * n, "+", total)
    spatial = x.shape[-n:]

    def body(*v):
        if divisor_override:
            return store(out, v, total.at(*v) / divisor_override)
        count = _window_count(v[-n:], out.shape[-n:], spatial, kernel, stride, padding, count_include_pad)
        return store(out, v, total.at(*v) / count)
    em.nest(out.shape, body)


def _window_count(pos, out_sizes, sizes, kernel, stride, padding, include_pad):
    """The divisor of PyTorch's avg_pool at output position `pos`: a literal or an expression."""
    literal, factors = 1, []
    for c, o_n, h, k, s, p in zip(pos, out_sizes, sizes, kernel, stride, padding, strict=True):
        counts = {_count_at(o, h, k, s, p, include_pad) for o in range(o_n)}
        if len(counts) == 1:
            literal *= counts.pop()
            continue
        start = X(affine(c, s, -p))
        if include_pad:
            factors.append(vmin(start + k, h + p) - start)
        else:
            factors.append(vmin(start + k, h) - vmax(start, 0))
    count = X(literal) if literal != 1 or not factors else None
    for f in factors:
        count = f if count is None else count * f
    return count


def _count_at(o, h, k, s, p, include_pad):
    start = o * s - p
    end = min(start + k, h + p)
    return end - start if include_pad else min(end, h) - max(start, 0)


def _register(n):
    @op(f"max_pool{n}d", f"max_pool{n}d_with_indices")
    def max_pool(em, out, x, kernel_size, stride=None, padding=0, dilation=1, ceil_mode=False,
                 return_indices=False):
        _max_pool(em, out, x, n, kernel_size, stride, padding, dilation, ceil_mode, return_indices)

    @op(f"avg_pool{n}d", float32_kernel=True)
    def avg_pool(em, out, x, kernel_size, stride=None, padding=0, ceil_mode=False, count_include_pad=True,
                 divisor_override=None):
        _avg_pool(em, out, x, n, kernel_size, stride, padding, ceil_mode, count_include_pad, divisor_override)

    @op(f"adaptive_avg_pool{n}d", float32_kernel=True)
    def adaptive_avg_pool(em, out, x, output_size):
        _adaptive(em, out, x, n, "+")

    @op(f"adaptive_max_pool{n}d")
    def adaptive_max_pool(em, out, x, output_size, return_indices=False):
        if return_indices or isinstance(out, list):
            raise UnsupportedForm("return_indices=True")
        _adaptive(em, out, x, n, "max")


for _n in (1, 2, 3):
    _register(_n)


def _bounds(o, h, n_out):
    return (o * h) // n_out, ((o + 1) * h + n_out - 1) // n_out


def _adaptive(em: Emitter, out: Ref, x: Ref, n: int, how: str) -> None:
    """PyTorch's adaptive windows `[floor(o*H/O), ceil((o+1)*H/O))`; uneven ones are guarded."""
    sizes, outs = x.shape[-n:], out.shape[-n:]
    widths = [max(b - a for a, b in (_bounds(o, h, m) for o in range(m))) for h, m in zip(sizes, outs, strict=True)]
    even = [h % m == 0 for h, m in zip(sizes, outs, strict=True)]
    acc = out if how == "max" else em.temp(out.shape, out.code)

    def window(*v):
        o, taps = v[:out.rank], v[out.rank:]
        pos, guards = [], []
        for c, t, h, m, ok in zip(o[-n:], taps, sizes, outs, even, strict=True):
            if ok:
                pos.append(add_index(affine(c, h // m), t))
            else:
                start = X(c) * h // m
                pos.append((start + t).node)
                guards.append((start + t).lt(((X(c) + 1) * h + (m - 1)) // m))
        read = x.at(*o[:-n], *pos)
        if guards:
            read = select(both(*guards), read, float("-inf") if how == "max" else 0)
        return accumulate(acc, o, read, how)
    em.nest(list(out.shape) + widths, window)
    if how == "max":
        return

    def divide(*v):
        count = 1
        factors = []
        for c, h, m, ok in zip(v[-n:], sizes, outs, even, strict=True):
            if ok:
                count *= h // m
            else:
                factors.append(((X(c) + 1) * h + (m - 1)) // m - X(c) * h // m)
        div = X(count) if count != 1 or not factors else None
        for f in factors:
            div = f if div is None else div * f
        return store(out, v, acc.at(*v) / div)
    em.nest(out.shape, divide)
