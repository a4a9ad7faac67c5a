"""Layout operators as copy nests with rearranged subscripts (docs/leir.md §5): reshape and its kin,
permute/transpose, expand, repeat, flip, slicing and indexing, cat/stack, split/chunk (stacked on a
leading literal index), padding, triangular masks, gathers, and tensor factories."""
from __future__ import annotations

from leir.ast import Num
from leir.frontend.emit import Emitter, Ref, broadcast_read, copy_nest, store
from leir.frontend.expr import X, affine, both, select, within
from leir.frontend.registry import UnsupportedForm, op


def row_major_index(out_vars, out_shape, src_shape) -> list:
    """Subscripts of `src` for the element at `out_vars` of a row-major reshape to `out_shape`.
    Leading and trailing dimensions that both shapes share map straight through."""
    lo = 0
    while lo < min(len(out_shape), len(src_shape)) and out_shape[lo] == src_shape[lo]:
        lo += 1
    hi = 0
    while (hi < min(len(out_shape), len(src_shape)) - lo
           and out_shape[-1 - hi] == src_shape[-1 - hi]):
        hi += 1
    out_mid = list(zip(out_vars[lo:len(out_vars) - hi], out_shape[lo:len(out_shape) - hi], strict=True))
    src_mid = src_shape[lo:len(src_shape) - hi]
    flat = None
    for var, size in out_mid:
        if size == 1:
            continue
        flat = X(var) if flat is None else flat * size + var
    flat = X(0) if flat is None else flat
    mid = []
    stride = 1
    strides = []
    for size in reversed(src_mid):
        strides.append(stride)
        stride *= size
    strides.reverse()
    for d, (size, st) in enumerate(zip(src_mid, strides, strict=True)):
        if size == 1:
            mid.append(Num(0))
            continue
        e = flat if st == 1 else flat // st
        if d > 0 and any(s != 1 for s in src_mid[:d]):
            e = e % size
        mid.append(e.node)
    return list(out_vars[:lo]) + mid + list(out_vars[len(out_vars) - hi:])


@op("reshape", "view", "flatten", "unflatten", "squeeze", "unsqueeze", "view_as", "reshape_as", "ravel",
    "atleast_1d", "atleast_2d", "atleast_3d")
def reshape(em, out, x, *_, **__):
    copy_nest(em, out, lambda *v: x.at(*row_major_index(v, out.shape, x.shape)))


def _dims(args, rank):
    if len(args) == 1 and isinstance(args[0], list | tuple):
        args = tuple(args[0])
    return [d % rank for d in args]


@op("permute")
def permute(em, out, x, *dims, **kw):
    order = _dims(dims or (kw["dims"],), x.rank)
    inverse = [0] * x.rank
    for i, d in enumerate(order):
        inverse[d] = i
    copy_nest(em, out, lambda *v: x.at(*(v[inverse[d]] for d in range(x.rank))))


@op("transpose")
def transpose(em, out, x, dim0, dim1):
    a, b = dim0 % x.rank, dim1 % x.rank

    def read(*v):
        ix = list(v)
        ix[a], ix[b] = v[b], v[a]
        return x.at(*ix)
    copy_nest(em, out, read)


@op("t", "mT")
def t(em, out, x):
    if x.rank < 2:
        return copy_nest(em, out, lambda *v: x.at(*v))
    transpose(em, out, x, -2, -1)


@op("movedim", "moveaxis")
def movedim(em, out, x, source, destination):
    src = _dims([source] if isinstance(source, int) else source, x.rank)
    dst = _dims([destination] if isinstance(destination, int) else destination, x.rank)
    order = [None] * x.rank
    for s, d in zip(src, dst, strict=True):
        order[d] = s
    rest = iter(d for d in range(x.rank) if d not in src)
    order = [o if o is not None else next(rest) for o in order]
    permute(em, out, x, order)


@op("expand", "expand_as", "broadcast_to")
def expand(em, out, x, *_, **__):
    copy_nest(em, out, lambda *v: broadcast_read(x, v, out.shape))


@op("repeat", "tile")
def repeat(em, out, x, *_, **__):
    offset = out.rank - x.rank

    def tiled(v, d, n):
        if out.shape[offset + d] == n:
            return v[offset + d]
        return Num(0) if n == 1 else v[offset + d] % n
    copy_nest(em, out, lambda *v: x.at(*(tiled(v, d, n) for d, n in enumerate(x.shape))))


@op("flip")
def flip(em, out, x, *dims, **kw):
    flipped = _dims(dims or (kw["dims"],), x.rank)
    copy_nest(em, out, lambda *v: x.at(*((X(n - 1) - c) if d in flipped else c
                                         for d, (c, n) in enumerate(zip(v, x.shape, strict=True)))))


# --- slicing and indexing -----------------------------------------------------------------------------

@op("narrow")
def narrow(em, out, x, dim, start, length):
    d = dim % x.rank
    start = start % x.shape[d]
    copy_nest(em, out, lambda *v: x.at(*(affine(c, 1, start) if i == d else c for i, c in enumerate(v))))


@op("select")
def select_(em, out, x, dim, index):
    d = dim % x.rank
    index = index % x.shape[d]
    copy_nest(em, out, lambda *v: x.at(*v[:d], index, *v[d:]))


@op("getitem")
def getitem(em, out, x, index):
    """Basic indexing: ints, slices with a positive step, None, Ellipsis, and one integer tensor."""
    if not isinstance(index, tuple):
        index = (index,)
    index = _expand_ellipsis(index, x.rank)

    def read(*v):
        out_pos, ix = 0, []
        for d_item in index:
            if d_item is None:
                out_pos += 1
                continue
            size = x.shape[len(ix)]
            if isinstance(d_item, int):
                ix.append(Num(d_item % size))
            elif isinstance(d_item, slice):
                start, _, step = d_item.indices(size)
                if step <= 0:
                    raise UnsupportedForm("a slice with a negative step")
                ix.append(affine(v[out_pos], step, start))
                out_pos += 1
            elif isinstance(d_item, Ref):
                if d_item.code in ("bool",) or d_item.rank != 1:
                    raise UnsupportedForm("indexing with a boolean or multi-dimensional tensor")
                ix.append(d_item.at(v[out_pos]).node)
                out_pos += 1
            else:
                raise UnsupportedForm(f"index {d_item!r}")
        ix += list(v[out_pos:])
        return x.at(*ix)
    copy_nest(em, out, read)


def _expand_ellipsis(index, rank):
    used = sum(1 for i in index if i is not None and i is not Ellipsis)
    if Ellipsis not in index:
        return tuple(index) + (slice(None),) * (rank - used)
    k = index.index(Ellipsis)
    return index[:k] + (slice(None),) * (rank - used) + index[k + 1:]


@op("index_select")
def index_select(em, out, x, dim, index):
    d = dim % x.rank
    copy_nest(em, out, lambda *v: x.at(*v[:d], index.at(v[d]).node, *v[d + 1:]))


@op("gather", "take_along_dim")
def gather(em, out, x, dim, index, *_, **__):
    d = dim % x.rank
    copy_nest(em, out, lambda *v: x.at(*v[:d], index.at(*v).node, *v[d + 1:]))


@op("embedding")
def embedding(em, out, indices, weight, *_, **__):
    copy_nest(em, out, lambda *v: weight.at(indices.at(*v[:-1]).node, v[-1]))


# --- joining and splitting -------------------------------------------------------------------------------

def _write_block(em: Emitter, out: Ref, part: Ref, d: int, offset: int) -> None:
    def body(*v):
        ix = [affine(c, 1, offset) if i == d else c for i, c in enumerate(v)]
        return store(out, ix, part.at(*v))
    em.nest(part.shape, body)


@op("cat")
def cat(em, out, tensors, dim=0):
    parts = [t for t in tensors if isinstance(t, Ref) and t.numel() > 0]
    d = dim % out.rank
    offset = 0
    for part in parts:
        _write_block(em, out, part, d, offset)
        offset += part.shape[d]


@op("stack")
def stack(em, out, tensors, dim=0):
    d = dim % out.rank
    for k, part in enumerate(tensors):
        em.nest(part.shape, lambda *v, k=k, part=part: store(out, [*v[:d], Num(k), *v[d:]], part.at(*v)))


def _split_parts(em, outs, x, d):
    offset = 0
    for part in outs:
        copy_nest(em, part, lambda *v, o=offset: x.at(*(affine(c, 1, o) if i == d else c for i, c in enumerate(v))))
        offset += part.shape[d]


@op("split", "split_with_sizes", "tensor_split")
def split(em, out, x, split_size_or_sections=None, dim=0, **__):
    _split_parts(em, out, x, dim % x.rank)


@op("chunk")
def chunk(em, out, x, chunks, dim=0):
    _split_parts(em, out, x, dim % x.rank)


@op("unbind")
def unbind(em, out, x, dim=0):
    d = dim % x.rank
    for k, part in enumerate(out):
        copy_nest(em, part, lambda *v, k=k: x.at(*v[:d], k, *v[d:]))


# --- padding, masks, factories -----------------------------------------------------------------------

@op("pad", "constant_pad_nd")
def pad(em, out, x, pad, mode="constant", value=None):
    if mode != "constant":
        raise UnsupportedForm(f"pad mode {mode!r} (only 'constant')")
    fill = 0 if value is None else value
    n = len(pad) // 2
    lows = [pad[2 * (n - 1 - i)] for i in range(n)]  # pad lists the last dimension first

    def read(*v):
        lead = v[:out.rank - n]
        guards, ix = [], []
        for c, lo, size in zip(v[out.rank - n:], lows, x.shape[x.rank - n:], strict=True):
            ix.append(affine(c, 1, -lo))
            if lo > 0 or out.shape[out.rank - n + len(ix) - 1] > size + lo:
                guards.append(within(lo, c, lo + size))
        src = x.at(*lead, *ix)
        return select(both(*guards), src, fill) if guards else src
    copy_nest(em, out, read)


def _triangle(em, out, x, diagonal, upper):
    def read(*v):
        row, col = v[-2], v[-1]
        keep = (col - row).ge(diagonal) if upper else (col - row).le(diagonal)
        return select(keep, x.at(*v), 0)
    copy_nest(em, out, read)


@op("triu")
def triu(em, out, x, diagonal=0):
    _triangle(em, out, x, diagonal, True)


@op("tril")
def tril(em, out, x, diagonal=0):
    _triangle(em, out, x, diagonal, False)


def _fill(em, out, value):
    copy_nest(em, out, lambda *v: X(value))


@op("ones", "ones_like", "new_ones")
def ones(em, out, *_, **__):
    _fill(em, out, 1)


@op("zeros", "zeros_like", "new_zeros")
def zeros(em, out, *_, **__):
    _fill(em, out, 0)


@op("full", "full_like", "new_full")
def full(em, out, *args, fill_value=None, **__):
    value = fill_value if fill_value is not None else args[-1]
    if isinstance(value, Ref):
        raise UnsupportedForm("a tensor fill value")
    _fill(em, out, value)


@op("fill")
def fill(em, out, x, value):
    if isinstance(value, Ref):
        copy_nest(em, out, lambda *v: broadcast_read(value, v, out.shape))
    else:
        _fill(em, out, value)


@op("arange")
def arange(em, out, *args, **kw):
    nums = [a for a in args if isinstance(a, int | float)]
    start, step = (0, 1) if len(nums) == 1 else (nums[0], nums[2] if len(nums) > 2 else 1)
    copy_nest(em, out, lambda c: X(c) * step + start if step != 1 else (X(c) + start if start else X(c)))


@op("eye")
def eye(em, out, *_, **__):
    copy_nest(em, out, lambda r, c: select(X(r).eq(c), 1, 0))


@op("tensor", "scalar_tensor", "as_tensor")
def tensor(em, out, data, *_, **__):
    """`torch.tensor(0.5, device=x.device)` in forward: a constant the trace could not fold (one of its
    arguments came from a tensor); a number, or nested lists of numbers."""
    if isinstance(data, bool | int | float):
        return _fill(em, out, int(data) if isinstance(data, bool) else data)
    flat = _flat_numbers(data)
    if flat is None or len(flat) != out.numel():
        raise UnsupportedForm("torch.tensor of something other than numbers")
    em.nest((), lambda: [store(out, _unravel(k, out.shape), value) for k, value in enumerate(flat)])


def _flat_numbers(data):
    if isinstance(data, bool | int | float):
        return [int(data) if isinstance(data, bool) else data]
    if isinstance(data, list | tuple):
        parts = [_flat_numbers(d) for d in data]
        return None if any(p is None for p in parts) else [x for p in parts for x in p]
    return None


def _unravel(k: int, shape) -> list[int]:
    index = []
    for size in reversed(shape):
        index.append(k % size)
        k //= size
    return index[::-1]


@op("diag")
def diag(em, out, x, diagonal=0, *_, **__):
    """A vector to its diagonal matrix (`torch.diag(v)`), or a matrix to its diagonal vector."""
    if x.rank == 1 and diagonal == 0:
        copy_nest(em, out, lambda r, c: select(X(c).eq(r), x.at(r), 0))
        return
    if x.rank == 2:
        copy_nest(em, out, lambda i: x.at(affine(i, 1, max(0, -diagonal)), affine(i, 1, max(0, diagonal))))
        return
    raise UnsupportedForm(f"diag of a rank-{x.rank} tensor")



@op("getattr")
def tensor_attribute(em, out, x, name):
    """`x.T`, `x.mT` (transposes) and `x.data` (a copy)."""
    if name == "T":
        return permute(em, out, x, list(range(x.rank - 1, -1, -1)))
    if name == "mT":
        return transpose(em, out, x, -2, -1)
    if name in ("data", "real"):
        return copy_nest(em, out, lambda *v: x.at(*v))
    raise UnsupportedForm(f"tensor attribute {name!r}")
