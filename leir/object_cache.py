"""Results kept by the identity of the tree they were computed from.

The states of one program share most of their subtrees (a step rewrites one or two nests and keeps
the others, the very same objects), and the same state is named, hashed and estimated several times
on its way through a stage. LEIR trees are immutable, so a result computed from one object holds
for as long as that object lives; trees are not compared by value here, since two trees equal as
values may print differently (the literal 1 against 1.0).

An entry holds its object (so that its id is not reused while the entry lives) and a `guard`, the
other inputs the result depends on, which must compare equal for a hit. The last `size` entries are
kept; a lock makes the cache safe for a Dask worker's threads.
"""
from __future__ import annotations

import threading
from collections import OrderedDict
from collections.abc import Hashable, Iterable
from dataclasses import replace

from leir.ast import Nest, Program

MISSING = object()


class ObjectCache:
    def __init__(self, size: int):
        self.size = size
        self._entries: OrderedDict[tuple, tuple] = OrderedDict()
        self._lock = threading.Lock()

    def get(self, obj: object, guard: object = None, key: Hashable = ()):
        """The result kept for `obj` (and `key`, other hashable inputs) under an equal `guard`, or MISSING."""
        with self._lock:
            hit = self._entries.get((id(obj), key))
            if hit is None or hit[0] is not obj or hit[1] != guard:
                return MISSING
            self._entries.move_to_end((id(obj), key))
            return hit[2]

    def put(self, obj: object, value, guard: object = None, key: Hashable = ()) -> None:
        with self._lock:
            self._entries[(id(obj), key)] = (obj, guard, value)
            self._entries.move_to_end((id(obj), key))
            while len(self._entries) > self.size:
                self._entries.popitem(last=False)

    def __len__(self) -> int:
        return len(self._entries)

    def holds(self, obj: object) -> bool:
        """Whether some entry was computed from `obj`."""
        with self._lock:
            return any(entry[0] is obj for entry in self._entries.values())


def share_nests(programs: Iterable[Program]) -> list[Program]:
    """`programs` with every top-level nest that prints the same as an earlier one replaced by that
    earlier object (equal text, equal tree: the parser is a function of the text). States parsed one by
    one from a table share no objects; shared, the figures kept by nest (the static estimate) are
    computed once per distinct nest of a program instead of once per state."""
    from leir.printer import format_nest

    seen: dict[str, Nest] = {}
    out = []
    for program in programs:
        nests = tuple(seen.setdefault(format_nest(n), n) for n in program.nests)
        same = all(a is b for a, b in zip(nests, program.nests, strict=True))
        out.append(program if same else replace(program, nests=nests))
    return out
