"""Losses: an element-wise term accumulated into the (0-d for 'mean'/'sum') result, the mean folded
in as a division by the literal count (golden `cross_entropy_mean`: `D=D-G_{tx,C_{tx}}/4`)."""
from __future__ import annotations

from leir.frontend.emit import Emitter, Ref, accumulate, accumulate_over, broadcast_read, store
from leir.frontend.expr import X, exp, fabs, log, select, sqrt, vmax
from leir.frontend.ops.reduce import max_and_sumexp, softmax_dim, softmax_nest
from leir.frontend.registry import UnsupportedForm, op


def reduce_loss(em: Emitter, out: Ref, shape, term, reduction: str, sign: str = "+", count=None) -> None:
    """`out = sum/mean of term(v)` over `shape` (or `out[v] = term(v)` for reduction='none')."""
    if reduction == "none":
        em.nest(shape, lambda *v: store(out, v, term(*v) if sign == "+" else -term(*v)))
        return
    if reduction not in ("mean", "sum", "batchmean"):
        raise UnsupportedForm(f"reduction={reduction!r}")
    n = count or _numel(shape)
    if reduction == "batchmean":
        n = shape[0] if shape else 1

    def each(v):
        t = term(*v)
        return t if reduction == "sum" else t / n
    accumulate_over(em, out, shape, lambda v: [], each, sign)


def _numel(shape) -> int:
    n = 1
    for s in shape:
        n *= s
    return n


def _pair(fn):
    """A loss of two same-shaped (broadcast) tensors from an element-wise `fn(a, b)`."""
    def handler(em, out, a, b, *_, reduction="mean", **__):
        shape = _broadcast_shape(a, b)
        reduce_loss(em, out, shape, lambda *v: fn(_read(a, v, shape), _read(b, v, shape)), reduction)
    return handler


def _broadcast_shape(*refs) -> tuple[int, ...]:
    rank = max(r.rank for r in refs if isinstance(r, Ref))
    shape = [1] * rank
    for r in refs:
        if isinstance(r, Ref):
            for i, n in enumerate(r.shape):
                j = rank - r.rank + i
                shape[j] = max(shape[j], n)
    return tuple(shape)


def _read(x, v, shape):
    return broadcast_read(x, v, shape) if isinstance(x, Ref) else X(x)


op("mse_loss", float32_kernel=True)(_pair(lambda a, b: (a - b) ** 2))
op("l1_loss", float32_kernel=True)(_pair(lambda a, b: fabs(a - b)))


@op("smooth_l1_loss", float32_kernel=True)
def smooth_l1_loss(em, out, a, b, size_average=None, reduce=None, reduction="mean", beta=1.0):
    def term(x, y):
        z = fabs(x - y)
        return select(z.lt(beta), 0.5 * z ** 2 / beta, z - 0.5 * beta) if beta > 0 else z
    _pair(term)(em, out, a, b, reduction=reduction)


@op("huber_loss", float32_kernel=True)
def huber_loss(em, out, a, b, reduction="mean", delta=1.0, weight=None):
    if weight is not None:
        raise UnsupportedForm("huber_loss with weight")
    def term(x, y):
        z = fabs(x - y)
        return select(z.lt(delta), 0.5 * z ** 2, delta * (z - 0.5 * delta))
    _pair(term)(em, out, a, b, reduction=reduction)


@op("soft_margin_loss", float32_kernel=True)
def soft_margin_loss(em, out, x, y, *_, reduction="mean", **__):
    _pair(lambda x, y: log(1 + exp(-y * x)))(em, out, x, y, reduction=reduction)


@op("kl_div", float32_kernel=True)
def kl_div(em, out, x, target, size_average=None, reduce=None, reduction="mean", log_target=False):
    if log_target:
        fn = lambda x, t: exp(t) * (t - x)  # noqa: E731
    else:
        # PyTorch: xlogy(t, t) - t * x (0 where t == 0, NaN where t < 0).
        fn = lambda x, t: select(t.eq(0), 0, t * log(t)) - t * x  # noqa: E731
    _pair(fn)(em, out, x, target, reduction=reduction)


@op("binary_cross_entropy", float32_kernel=True)
def binary_cross_entropy(em, out, x, y, weight=None, size_average=None, reduce=None, reduction="mean"):
    if weight is not None:
        raise UnsupportedForm("binary_cross_entropy with weight")
    _pair(lambda p, t: -(t * vmax(log(p), -100) + (1 - t) * vmax(log(1 - p), -100)))(
        em, out, x, y, reduction=reduction)


@op("binary_cross_entropy_with_logits", float32_kernel=True)
def bce_with_logits(em, out, x, y, weight=None, size_average=None, reduce=None, reduction="mean",
                    pos_weight=None):
    if weight is not None or pos_weight is not None:
        raise UnsupportedForm("binary_cross_entropy_with_logits with weight or pos_weight")
    _pair(lambda z, t: (1 - t) * z + vmax(-z, 0) + log(exp(-vmax(-z, 0)) + exp(-z - vmax(-z, 0))))(
        em, out, x, y, reduction=reduction)


@op("hinge_embedding_loss", float32_kernel=True)
def hinge_embedding_loss(em, out, x, y, margin=1.0, size_average=None, reduce=None, reduction="mean"):
    # PyTorch: where(y != 1, max(0, margin - x), 0) + where(y != -1, x, 0), for any y.
    _pair(lambda x, y: select(y.ne(1), vmax(margin - x, 0), 0) + select(y.ne(-1), x, 0))(
        em, out, x, y, reduction=reduction)


@op("margin_ranking_loss", float32_kernel=True)
def margin_ranking_loss(em, out, a, b, y, margin=0.0, size_average=None, reduce=None, reduction="mean"):
    shape = _broadcast_shape(a, b, y)
    reduce_loss(em, out, shape, lambda *v: vmax(-_read(y, v, shape) * (_read(a, v, shape) - _read(b, v, shape))
                                                + margin, 0), reduction)


# --- classification losses ------------------------------------------------------------------------------

def _nll(em, out, logp: Ref, target: Ref, weight, reduction, sign_count=None):
    """`-logp[n, target[n], ...]`, weighted and averaged as PyTorch's nll_loss."""
    def picked(*v):
        return logp.at(v[0], target.at(*v).node, *v[1:])
    if weight is None:
        reduce_loss(em, out, target.shape, picked, reduction, sign="-")
        return
    if reduction == "none":
        em.nest(target.shape, lambda *v: store(out, v, -weight.at(target.at(*v).node) * picked(*v)))
        return
    num, den = em.temp((), logp.code), em.temp((), logp.code)
    em.nest(target.shape, lambda *v: [accumulate(num, [], weight.at(target.at(*v).node) * picked(*v)),
                                      accumulate(den, [], weight.at(target.at(*v).node))])
    em.nest((), lambda: store(out, [], -num.at() / den.at() if reduction == "mean" else -num.at()))


@op("nll_loss", float32_kernel=True)
def nll_loss(em, out, logp, target, weight=None, size_average=None, ignore_index=-100, reduce=None,
             reduction="mean"):
    _nll(em, out, logp, target, weight, reduction)


@op("cross_entropy", float32_kernel=True)
def cross_entropy(em, out, x, target, weight=None, size_average=None, ignore_index=-100, reduce=None,
                  reduction="mean", label_smoothing=0.0):
    if label_smoothing:
        raise UnsupportedForm("label_smoothing")
    d = softmax_dim(x, 1 if x.rank > 1 else 0)
    m, s = max_and_sumexp(em, x, d)
    logp = em.temp(x.shape, x.code)
    softmax_nest(em, logp, x, d, m, s, log_form=True)
    if target.code in ("i64", "i32", "i16", "i8", "u8"):
        _nll(em, out, logp, target, weight, reduction)
        return
    if weight is not None:
        raise UnsupportedForm("class weights with probability targets")
    count = x.numel() // x.shape[d]
    reduce_loss(em, out, x.shape, lambda *v: logp.at(*v) * target.at(*v), reduction, sign="-", count=count)


@op("cosine_similarity", float32_kernel=True)
def cosine_similarity(em, out, a, b, dim=1, eps=1e-08):
    shape = _broadcast_shape(a, b)
    d = dim % len(shape)
    stats = tuple(n for i, n in enumerate(shape) if i != d)
    dot, na, nb = (em.temp(stats, out.code) for _ in range(3))

    def drop(v):
        return [c for i, c in enumerate(v) if i != d]

    def sums(*v):
        x, y = _read(a, v, shape), _read(b, v, shape)
        return [accumulate(dot, drop(v), x * y), accumulate(na, drop(v), x * x), accumulate(nb, drop(v), y * y)]
    em.nest(shape, sums)
    em.nest(stats, lambda *v: store(out, v, dot.at(*v) / sqrt(vmax(na.at(*v) * nb.at(*v), eps * eps))))


@op("pairwise_distance", float32_kernel=True)
def pairwise_distance(em, out, a, b, p=2.0, eps=1e-06, keepdim=False):
    if p != 2:
        raise UnsupportedForm(f"pairwise_distance with p={p!r}")
    shape = _broadcast_shape(a, b)
    total = em.temp(shape[:-1], out.code)
    em.nest(shape, lambda *v: accumulate(total, v[:-1], (_read(a, v, shape) - _read(b, v, shape) + eps) ** 2))
    em.nest(out.shape, lambda *v: store(out, v, sqrt(total.at(*v[:len(shape) - 1]))))


@op("triplet_margin_loss", float32_kernel=True)
def triplet_margin_loss(em, out, anchor, positive, negative, margin=1.0, p=2.0, eps=1e-06, swap=False,
                        size_average=None, reduce=None, reduction="mean"):
    if p != 2 or swap:
        raise UnsupportedForm("triplet_margin_loss with p != 2 or swap")
    shape = _broadcast_shape(anchor, positive, negative)
    dp, dn = em.temp(shape[:-1], out.code), em.temp(shape[:-1], out.code)

    def sums(*v):
        x = _read(anchor, v, shape)
        return [accumulate(dp, v[:-1], (x - _read(positive, v, shape) + eps) ** 2),
                accumulate(dn, v[:-1], (x - _read(negative, v, shape) + eps) ** 2)]
    em.nest(shape, sums)
    reduce_loss(em, out, shape[:-1], lambda *v: vmax(sqrt(dp.at(*v)) - sqrt(dn.at(*v)) + margin, 0), reduction)


@op("cosine_embedding_loss", float32_kernel=True)
def cosine_embedding_loss(em, out, a, b, y, margin=0.0, size_average=None, reduce=None, reduction="mean"):
    n = a.shape[0]
    dot, na, nb = (em.temp((n,), out.code) for _ in range(3))
    em.nest(a.shape, lambda *v: [accumulate(dot, v[:1], a.at(*v) * b.at(*v)),
                                 accumulate(na, v[:1], a.at(*v) * a.at(*v)),
                                 accumulate(nb, v[:1], b.at(*v) * b.at(*v))])
    eps = 1e-12

    def term(i):
        cos = dot.at(i) / sqrt((na.at(i) + eps) * (nb.at(i) + eps))
        return select(y.at(i).eq(1), 1 - cos, 0) + select(y.at(i).eq(-1), vmax(cos - margin, 0), 0)
    reduce_loss(em, out, (n,), term, reduction)
