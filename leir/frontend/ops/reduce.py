"""Reductions, softmax family and scans.

A reduction loops over the input's dimensions in their order (the first loop is the `B` loop) and
accumulates into a temporary of the keep-dim shape (literal 0 at reduced positions); a second nest
writes the result (a copy for sum, a division for mean, ...). Softmax-like operators reduce into
temporaries of the reduced shape (max, then sum of exp) and normalise (docs/leir.md §1, §5).
"""
from __future__ import annotations

from collections.abc import Sequence

from leir.ast import Num
from leir.frontend.emit import Emitter, Ref, accumulate, accumulate_over, store
from leir.frontend.expr import X, exp, fabs, log, select, sqrt
from leir.frontend.registry import UnsupportedForm, op


def reduced_dims(rank: int, dim) -> tuple[int, ...]:
    """PyTorch's `dim` argument (None, int, or a sequence) as sorted non-negative dimensions."""
    if dim is None or (isinstance(dim, Sequence) and len(dim) == 0):
        return tuple(range(rank))
    dims = dim if isinstance(dim, Sequence) else (dim,)
    if rank == 0:
        return ()
    return tuple(sorted({d % rank for d in dims}))


def keep_shape(shape, dims) -> tuple[int, ...]:
    return tuple(1 if d in dims else n for d, n in enumerate(shape))


def drop_shape(shape, dims) -> tuple[int, ...]:
    return tuple(n for d, n in enumerate(shape) if d not in dims)


def keep_index(v, dims) -> list:
    """Subscripts of the keep-dim accumulator at input position `v`."""
    return [Num(0) if d in dims else x for d, x in enumerate(v)]


def drop_index(v, dims) -> list:
    return [x for d, x in enumerate(v) if d not in dims]


def from_keep(out_vars, out_rank: int, dims, rank: int) -> list:
    """Subscripts of a keep-dim tensor from those of a result with or without the reduced dims."""
    if out_rank == rank:
        return list(out_vars)
    it = iter(out_vars)
    return [Num(0) if d in dims else next(it) for d in range(rank)]


def reduce_into(em: Emitter, x: Ref, dims, op_name: str, term=lambda v: v, code=None, keep=True) -> Ref:
    """A temporary holding `op` over `dims` of `term(x)` (keep-dim or reduced shape)."""
    shape = keep_shape(x.shape, dims) if keep else drop_shape(x.shape, dims)
    acc = em.temp(shape, code or x.code)
    index = keep_index if keep else drop_index
    accumulate_over(em, acc, x.shape, lambda v: index(v, dims), lambda v: term(x.at(*v)), op_name)
    return acc


def finish(em: Emitter, out: Ref, acc: Ref, dims, rank: int, fn=lambda a: a) -> None:
    """`out = fn(acc)` over the result, reading the keep-dim accumulator."""
    em.nest(out.shape, lambda *v: store(out, v, fn(acc.at(*from_keep(v, out.rank, dims, rank)))))


def _count(x: Ref, dims) -> int:
    n = 1
    for d in dims:
        n *= x.shape[d]
    return n


@op("sum", float32_kernel=True)
def sum_(em, out, x, dim=None, keepdim=False, dtype=None):
    dims = reduced_dims(x.rank, dim)
    acc = reduce_into(em, x, dims, "+", code=out.code)
    finish(em, out, acc, dims, x.rank)


@op("mean", float32_kernel=True)
def mean(em, out, x, dim=None, keepdim=False, dtype=None):
    dims = reduced_dims(x.rank, dim)
    acc = reduce_into(em, x, dims, "+", code=out.code)
    finish(em, out, acc, dims, x.rank, lambda a: a / _count(x, dims))


@op("prod", float32_kernel=True)
def prod(em, out, x, dim=None, keepdim=False, dtype=None):
    dims = reduced_dims(x.rank, dim)
    acc = reduce_into(em, x, dims, "*", code=out.code)
    finish(em, out, acc, dims, x.rank)


def _extreme(em, out, x, dim, keepdim, which):
    if isinstance(out, list):  # max(x, dim) -> (values, indices)
        values, indices = out
        dims = reduced_dims(x.rank, dim)
        acc = reduce_into(em, x, dims, which)
        finish(em, values, acc, dims, x.rank)
        arg_extreme(em, indices, x, dim, which)
        return
    dims = reduced_dims(x.rank, dim)
    acc = reduce_into(em, x, dims, which)
    finish(em, out, acc, dims, x.rank)


@op("max")
def max_(em, out, x, dim=None, keepdim=False):
    if isinstance(dim, Ref):
        from leir.frontend.ops.pointwise import maximum

        return maximum(em, out, x, dim)
    _extreme(em, out, x, dim, keepdim, "max")


@op("min")
def min_(em, out, x, dim=None, keepdim=False):
    if isinstance(dim, Ref):
        from leir.frontend.ops.pointwise import minimum

        return minimum(em, out, x, dim)
    _extreme(em, out, x, dim, keepdim, "min")


@op("amax")
def amax(em, out, x, dim=(), keepdim=False):
    _extreme(em, out, x, dim, keepdim, "max")


@op("amin")
def amin(em, out, x, dim=(), keepdim=False):
    _extreme(em, out, x, dim, keepdim, "min")


def arg_extreme(em: Emitter, out: Ref, x: Ref, dim, which: str) -> None:
    """First index of the extreme: reduce, then scan backwards so the last match written is the first
    index (PyTorch semantics; the golden `argmax_first`)."""
    if dim is None:
        return _arg_extreme_flat(em, out, x, which)
    d = dim % x.rank
    best = em.temp(out.shape, x.code)
    keepdim = out.rank == x.rank

    def out_index(v):
        return [Num(0) if (i == d and keepdim) else a for i, a in enumerate(v) if i != d or keepdim]

    em.nest(x.shape, lambda *v: [accumulate(best, out_index(v), x.at(*v), which),
                                 store(out, out_index(v), 0)])
    last = x.shape[d] - 1

    def scan(*v):
        back = list(v)
        back[d] = X(last) - v[d]
        hit = x.at(*back).ge(best.at(*out_index(v))) if which == "max" else x.at(*back).le(best.at(*out_index(v)))
        return store(out, out_index(v), select(hit, back[d], out.at(*out_index(v))))
    em.nest(x.shape, scan)


def _arg_extreme_flat(em: Emitter, out: Ref, x: Ref, which: str) -> None:
    best = em.temp((), x.code)
    zeros = [Num(0)] * out.rank
    em.nest(x.shape, lambda *v: [accumulate(best, [], x.at(*v), which), store(out, zeros, 0)])
    strides = [1] * x.rank
    for d in range(x.rank - 2, -1, -1):
        strides[d] = strides[d + 1] * x.shape[d + 1]

    def scan(*v):
        back = [X(n - 1) - a for n, a in zip(x.shape, v, strict=True)]
        flat = back[0] * strides[0] if strides[0] != 1 else back[0]
        for b, s in zip(back[1:], strides[1:], strict=True):
            flat = flat + (b * s if s != 1 else b)
        hit = x.at(*back).ge(best.at()) if which == "max" else x.at(*back).le(best.at())
        return store(out, zeros, select(hit, flat, out.at(*zeros)))
    em.nest(x.shape, scan)


@op("argmax")
def argmax(em, out, x, dim=None, keepdim=False):
    arg_extreme(em, out, x, dim, "max")


@op("argmin")
def argmin(em, out, x, dim=None, keepdim=False):
    arg_extreme(em, out, x, dim, "min")


# --- norms, variance ---------------------------------------------------------------------------------

def _norm_terms(p):
    if p == 2:
        return (lambda a: a ** 2), "+", (lambda s: sqrt(s))
    if p == 1:
        return fabs, "+", (lambda s: s)
    if p == float("inf"):
        return fabs, "max", (lambda s: s)
    if isinstance(p, int | float) and p > 0:
        return (lambda a: fabs(a) ** p), "+", (lambda s: s ** (1.0 / p))
    raise UnsupportedForm(f"norm with p={p!r}")


@op("norm", "vector_norm", float32_kernel=True)
def norm(em, out, x, p=2, dim=None, keepdim=False, dtype=None, ord=None):  # noqa: A002
    p = ord if ord is not None else ("fro" if p is None else p)
    p = 2 if p == "fro" else p
    term, how, root = _norm_terms(p)
    dims = reduced_dims(x.rank, dim)
    acc = reduce_into(em, x, dims, how, term)
    finish(em, out, acc, dims, x.rank, root)


def _variance(em, out, x, dim, correction, keepdim, root):
    dims = reduced_dims(x.rank, dim)
    n = _count(x, dims)
    total = reduce_into(em, x, dims, "+")
    avg = em.temp(total.shape, x.code)
    em.nest(avg.shape, lambda *v: store(avg, v, total.at(*v) / n))
    dev = em.temp(total.shape, x.code)
    accumulate_over(em, dev, x.shape, lambda v: keep_index(v, dims),
                    lambda v: (x.at(*v) - avg.at(*keep_index(v, dims))) ** 2)
    finish(em, out, dev, dims, x.rank, lambda s: root(s / (n - correction)))


def _correction(unbiased, correction):
    if correction is not None:
        return correction
    return 1 if unbiased in (None, True) else 0


@op("var", float32_kernel=True)
def var(em, out, x, dim=None, unbiased=None, keepdim=False, *, correction=None):
    if isinstance(dim, bool):
        dim, unbiased = None, dim
    _variance(em, out, x, dim, _correction(unbiased, correction), keepdim, lambda s: s)


@op("std", float32_kernel=True)
def std(em, out, x, dim=None, unbiased=None, keepdim=False, *, correction=None):
    if isinstance(dim, bool):
        dim, unbiased = None, dim
    _variance(em, out, x, dim, _correction(unbiased, correction), keepdim, sqrt)


# --- softmax family ------------------------------------------------------------------------------------

def max_and_sumexp(em: Emitter, x: Ref, d: int, scale=1.0) -> tuple[Ref, Ref]:
    """Temporaries `m = max over d` and `s = sum over d of exp(x - m)` (reduced shapes)."""
    dims = (d,)
    m = reduce_into(em, x, dims, "max", (lambda a: a) if scale == 1 else (lambda a: a * scale), keep=False)
    s = em.temp(m.shape, x.code)

    def body(*v):
        xv = x.at(*v) if scale == 1 else x.at(*v) * scale
        return accumulate(s, drop_index(v, dims), exp(xv - m.at(*drop_index(v, dims))))
    em.nest(x.shape, body)
    return m, s


def softmax_nest(em: Emitter, out: Ref, x: Ref, d: int, m: Ref, s: Ref, log_form=False, scale=1.0) -> None:
    """The normalising nest: `exp(x-m)/s`, or `x-m-log(s)` for log_softmax."""
    def body(*v):
        xv = x.at(*v) if scale == 1 else x.at(*v) * scale
        mv, sv = m.at(*drop_index(v, (d,))), s.at(*drop_index(v, (d,)))
        return store(out, v, xv - mv - log(sv) if log_form else exp(xv - mv) / sv)
    em.nest(x.shape, body)


def softmax_dim(x: Ref, dim) -> int:
    return (x.rank - 1 if dim is None else dim) % max(x.rank, 1)


def _softmax(em, out, x, dim, log_form=False, scale=1.0):
    d = softmax_dim(x, dim)
    m, s = max_and_sumexp(em, x, d, scale)
    softmax_nest(em, out, x, d, m, s, log_form, scale)


@op("softmax", float32_kernel=True)
def softmax(em, out, x, dim=None, *_, **__):
    _softmax(em, out, x, dim)


@op("log_softmax", float32_kernel=True)
def log_softmax(em, out, x, dim=None, *_, **__):
    _softmax(em, out, x, dim, log_form=True)


@op("softmin", float32_kernel=True)
def softmin(em, out, x, dim=None, *_, **__):
    _softmax(em, out, x, dim, scale=-1.0)


@op("logsumexp", float32_kernel=True)
def logsumexp(em, out, x, dim, keepdim=False):
    dims = reduced_dims(x.rank, dim)
    m = reduce_into(em, x, dims, "max")
    s = em.temp(m.shape, x.code)
    em.nest(x.shape, lambda *v: accumulate(s, keep_index(v, dims),
                                           exp(x.at(*v) - m.at(*keep_index(v, dims)))))
    em.nest(out.shape, lambda *v: store(out, v, log(s.at(*from_keep(v, out.rank, dims, x.rank)))
                                         + m.at(*from_keep(v, out.rank, dims, x.rank))))


# --- scans -----------------------------------------------------------------------------------------------

def _scan(em, out, x, dim, how, identity):
    """`out[..., i, ...] = op over j <= i of x[..., j, ...]`: the result's loops, then one over j."""
    d = dim % x.rank
    extents = list(x.shape) + [x.shape[d]]

    def body(*v):
        j = v[-1]
        src = list(v[:-1])
        src[d] = j
        return accumulate(out, v[:-1], select(j.le(v[d]), x.at(*src), identity), how)
    em.nest(extents, body)


@op("cumsum", float32_kernel=True)
def cumsum(em, out, x, dim, dtype=None):
    _scan(em, out, x, dim, "+", 0)


@op("cumprod", float32_kernel=True)
def cumprod(em, out, x, dim, dtype=None):
    _scan(em, out, x, dim, "*", 1)


@op("logcumsumexp", float32_kernel=True)
def logcumsumexp(em, out, x, dim):
    d = dim % x.rank
    total = em.temp(out.shape, x.code)
    _scan_term(em, total, x, d, exp)
    em.nest(out.shape, lambda *v: store(out, v, log(total.at(*v))))


def _scan_term(em, acc, x, d, term):
    extents = list(x.shape) + [x.shape[d]]

    def body(*v):
        j = v[-1]
        src = list(v[:-1])
        src[d] = j
        return accumulate(acc, v[:-1], select(j.le(v[d]), term(x.at(*src)), 0))
    em.nest(extents, body)

