"""Contractions: matmul family, linear (multiply-accumulate nest, then a bias nest on the same
accumulator), einsum, bilinear and scaled dot-product attention (scores, mask, softmax, P@V)."""
from __future__ import annotations

import math

from leir.ast import Num
from leir.frontend.emit import Emitter, Ref, accumulate, broadcast_read, store
from leir.frontend.expr import select
from leir.frontend.ops.reduce import _softmax
from leir.frontend.registry import UnsupportedForm, op


def batch_index(shape, out_vars, out_shape, groups_dim: int | None = None) -> list:
    """Subscripts of the batch dimensions `shape` under the result's batch dimensions (right-aligned
    broadcasting). `groups_dim` (from the right) may be smaller by a whole factor: grouped-query heads."""
    offset = len(out_shape) - len(shape)
    ix = []
    for i, size in enumerate(shape):
        j = offset + i
        from_right = len(shape) - i
        if size == out_shape[j]:
            ix.append(out_vars[j])
        elif size == 1:
            ix.append(Num(0))
        elif groups_dim == from_right and out_shape[j] % size == 0:
            ix.append(out_vars[j] // (out_shape[j] // size))
        else:
            raise UnsupportedForm(f"cannot broadcast {list(shape)} to {list(out_shape)}")
    return ix


def matmul_into(em: Emitter, out: Ref, a: Ref, b: Ref, alpha=1) -> None:
    """`out += a @ b` with PyTorch's matmul rules (1-D promotion, broadcast batch dimensions)."""
    a_vec, b_vec = a.rank == 1, b.rank == 1
    n_batch = out.rank - (0 if a_vec else 1) - (0 if b_vec else 1)

    def body(*v):
        o, k = v[:-1], v[-1]
        batch, batch_shape = o[:n_batch], out.shape[:n_batch]
        ia = batch_index(a.shape[:-2], batch, batch_shape) + ([] if a_vec else [o[n_batch]]) + [k]
        ib = batch_index(b.shape[:-2], batch, batch_shape) + [k] + ([] if b_vec else [o[-1]])
        term = a.at(*ia) * b.at(*ib)
        return accumulate(out, o, term if alpha == 1 else term * alpha)
    em.nest(list(out.shape) + [a.shape[-1]], body)


def add_bias(em: Emitter, out: Ref, bias, beta=1) -> None:
    """`out += bias` broadcast (the bias nest on the accumulator of docs/leir.md §5)."""
    def body(*v):
        term = broadcast_read(bias, v, out.shape) if isinstance(bias, Ref) else bias
        return accumulate(out, v, term if beta == 1 else term * beta)
    em.nest(out.shape, body)


@op("matmul", "mm", "bmm", "dot", "mv", "inner", float32_kernel=True)
def matmul(em, out, a, b):
    matmul_into(em, out, a, b)


@op("addmm", "baddbmm", "addmv", "addbmm", float32_kernel=True)
def addmm(em, out, bias, a, b, *, beta=1, alpha=1):
    matmul_into(em, out, a, b, alpha)
    if beta != 0:
        add_bias(em, out, bias, beta)


@op("linear", float32_kernel=True)
def linear(em, out, x, weight, bias=None):
    if weight.rank != 2:
        raise UnsupportedForm("a linear weight that is not 2-D")

    def body(*v):
        o, k = v[:-1], v[-1]
        return accumulate(out, o, x.at(*o[:-1], k) * weight.at(o[-1], k))
    em.nest(list(out.shape) + [x.shape[-1]], body)
    if bias is not None:
        em.nest(out.shape, lambda *v: accumulate(out, v, bias.at(v[-1])))


@op("bilinear", float32_kernel=True)
def bilinear(em, out, x1, x2, weight, bias=None):
    def body(*v):
        o, i, j = v[:-2], v[-2], v[-1]
        return accumulate(out, o, x1.at(*o[:-1], i) * weight.at(o[-1], i, j) * x2.at(*o[:-1], j))
    em.nest(list(out.shape) + [x1.shape[-1], x2.shape[-1]], body)
    if bias is not None:
        em.nest(out.shape, lambda *v: accumulate(out, v, bias.at(v[-1])))


@op("einsum", float32_kernel=True)
def einsum(em, out, equation, *operands):
    if len(operands) == 1 and isinstance(operands[0], list | tuple):
        operands = tuple(operands[0])
    inputs, output = _parse_einsum(equation, len(operands))
    sizes = {}
    for spec, t in zip(inputs, operands, strict=True):
        for letter, n in zip(spec, t.shape, strict=True):
            sizes[letter] = n
    reduced = [c for spec in inputs for c in spec if c not in output]
    reduced = list(dict.fromkeys(reduced))
    order = list(output) + reduced

    def body(*v):
        var = dict(zip(order, v, strict=True))
        term = None
        for spec, t in zip(inputs, operands, strict=True):
            read = t.at(*(var[c] for c in spec))
            term = read if term is None else term * read
        o = [var[c] for c in output]
        return accumulate(out, o, term) if reduced else store(out, o, term)
    em.nest([sizes[c] for c in order], body)


def _parse_einsum(equation: str, n_operands: int):
    eq = equation.replace(" ", "")
    if "." in eq:
        raise UnsupportedForm("einsum with '...'")
    lhs, _, rhs = eq.partition("->")
    inputs = lhs.split(",")
    if len(inputs) != n_operands:
        raise UnsupportedForm(f"einsum equation {equation!r} for {n_operands} operands")
    if "->" not in eq:
        letters = "".join(inputs)
        rhs = "".join(sorted(c for c in set(letters) if letters.count(c) == 1))
    return inputs, rhs


@op("scaled_dot_product_attention", float32_kernel=True)
def scaled_dot_product_attention(em, out, q, k, v, attn_mask=None, dropout_p=0.0, is_causal=False,
                                 scale=None, enable_gqa=False):
    if dropout_p:
        raise UnsupportedForm("attention dropout")
    n_l, n_s = q.shape[-2], k.shape[-2]
    batch_shape = out.shape[:-2]
    scores = em.temp(batch_shape + (n_l, n_s), q.code)
    heads = 1 if enable_gqa else None  # the head dimension: last of the batch dimensions

    def qk(*ix):
        b, l, s, e = ix[:-3], ix[-3], ix[-2], ix[-1]
        qi = batch_index(q.shape[:-2], b, batch_shape) + [l, e]
        ki = batch_index(k.shape[:-2], b, batch_shape, heads) + [s, e]
        return accumulate(scores, (*b, l, s), q.at(*qi) * k.at(*ki))
    em.nest(list(scores.shape) + [q.shape[-1]], qk)
    factor = em.size_constant(1.0 / math.sqrt(q.shape[-1])) if scale is None else scale
    logits = em.temp(scores.shape, q.code)

    def masked(*ix):
        s_val = scores.at(*ix) * factor
        if is_causal:
            s_val = select(ix[-1].le(ix[-2]), s_val, float("-inf"))
        if isinstance(attn_mask, Ref):
            m = broadcast_read(attn_mask, ix, scores.shape)
            s_val = select(m.node, s_val, float("-inf")) if attn_mask.code == "bool" else s_val + m
        return store(logits, ix, s_val)
    em.nest(scores.shape, masked)
    probs = em.temp(scores.shape, q.code)
    _softmax(em, probs, logits, -1)

    def pv(*ix):
        b, l, ev, s = ix[:-3], ix[-3], ix[-2], ix[-1]
        vi = batch_index(v.shape[:-2], b, batch_shape, heads) + [s, ev]
        return accumulate(out, (*b, l, ev), probs.at(*b, l, s) * v.at(*vi))
    em.nest(list(out.shape) + [n_s], pv)
