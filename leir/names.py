"""Name sequences and fresh-name allocation (docs/leir.md §2).

Tensor names: `A C D ... Z` (upper-case without L P V B U T), then `Aa Ac ... Az Ca ...`, the later
letters lower-case without l p v b u t. Loop indices: `a c d f ... w`, then `aa ac ...` (lower-case
without t b v x y z e). Both are bijective numberings; `*_index` is the inverse of `*_name`.
"""
from __future__ import annotations

from collections.abc import Iterable, Iterator

TENSOR_FIRST = "ACDEFGHIJKMNOQRSWXYZ"
TENSOR_REST = "acdefghijkmnoqrswxyz"
INDEX_LETTERS = "acdfghijklmnopqrsuw"
# Words that lex as keywords, never allocated as loop indices.
KEYWORDS = frozenset({"exp", "log", "sqrt", "abs", "erf", "fast_exp", "fast_log", "fast_erf", "max", "min", "inf",
                      "if_then_else"})
BIND_PREFIXES = ("tx", "ty", "tz", "bx", "by", "bz")


def _bijective(n: int, first: str, rest: str) -> str:
    if n < 0:
        raise ValueError("name numbers start at 0")
    length, block = 1, len(first)
    while n >= block:
        n -= block
        length += 1
        block = len(first) * len(rest) ** (length - 1)
    digits = []
    for _ in range(length - 1):
        n, d = divmod(n, len(rest))
        digits.append(rest[d])
    return first[n] + "".join(reversed(digits))


def _bijective_index(name: str, first: str, rest: str) -> int | None:
    if not name or name[0] not in first or any(c not in rest for c in name[1:]):
        return None
    n = 0
    for length in range(1, len(name)):
        n += len(first) * len(rest) ** (length - 1)
    value = first.index(name[0])
    for c in name[1:]:
        value = value * len(rest) + rest.index(c)
    return n + value


def tensor_name(n: int) -> str:
    """The n-th tensor name (0-based): 0 -> 'A', 1 -> 'C', 20 -> 'Aa'."""
    return _bijective(n, TENSOR_FIRST, TENSOR_REST)


def tensor_name_index(name: str) -> int | None:
    """Position of `name` in the tensor sequence, None for names outside it."""
    return _bijective_index(name, TENSOR_FIRST, TENSOR_REST)


def index_name(n: int) -> str:
    """The n-th loop index name (0-based) of the raw sequence (keywords included)."""
    return _bijective(n, INDEX_LETTERS, INDEX_LETTERS)


def index_name_index(name: str) -> int | None:
    return _bijective_index(name, INDEX_LETTERS, INDEX_LETTERS)


def is_tensor_name(name: str) -> bool:
    return (len(name) >= 1 and name[0].isupper() and name[0].isascii() and name[0] not in "LPVBUT"
            and all("a" <= c <= "z" for c in name[1:]))


def is_bind_name(name: str) -> bool:
    return name[:2] in BIND_PREFIXES and all("a" <= c <= "z" for c in name[2:])


def tensor_names() -> Iterator[str]:
    n = 0
    while True:
        yield tensor_name(n)
        n += 1


def index_names() -> Iterator[str]:
    n = 0
    while True:
        name = index_name(n)
        if name not in KEYWORDS:
            yield name
        n += 1


class TensorNames:
    """Fresh tensor names continuing the sequence past the largest name in use (docs/leir.md §6)."""

    def __init__(self, used: Iterable[str]):
        self._used = set(used)
        positions = [tensor_name_index(n) for n in self._used]
        self._next = max((p for p in positions if p is not None), default=-1) + 1

    def fresh(self) -> str:
        while True:
            name = tensor_name(self._next)
            self._next += 1
            if name not in self._used:
                self._used.add(name)
                return name


class IndexNames:
    """Fresh loop index names that collide with no name in use and no keyword."""

    def __init__(self, used: Iterable[str]):
        self._used = set(used)
        positions = [index_name_index(n) for n in self._used]
        self._next = max((p for p in positions if p is not None), default=-1) + 1

    def fresh(self) -> str:
        while True:
            name = index_name(self._next)
            self._next += 1
            if name not in self._used and name not in KEYWORDS:
                self._used.add(name)
                return name


def bind_name(prefix: str, used: Iterable[str]) -> str:
    """A binding name for axis `prefix` ('tx', 'by', ...): the prefix itself, else prefix + suffix."""
    if prefix not in BIND_PREFIXES:
        raise ValueError(f"binding prefix must be one of {', '.join(BIND_PREFIXES)}")
    taken = set(used)
    if prefix not in taken:
        return prefix
    for suffix in index_names():
        if prefix + suffix not in taken:
            return prefix + suffix
    raise AssertionError("unreachable")
