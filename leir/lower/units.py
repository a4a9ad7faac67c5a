"""Timing units: a lowered program cut at its top-level nests, each piece a function of its own.

The measure stage times every state of an original program, and the states of one
program share most of their nests: a step rewrites one or two. Compiling and timing each distinct
piece once, and taking a state's time as the sum of its pieces' times, costs a fraction of compiling
every whole state (`gpu_tasks.state_timing`, "units").

A unit is a run of consecutive top-level items of the plan (nests and the fills placed before them)
that can be run again and again on its own with the same result: an item that writes a tensor that
an earlier item of the program wrote (a fill and its reduction, a sum split into two nests, an
in-place update of an output) joins that item's unit, so that repeating a unit never feeds it its
own output (a division repeated in place would reach denormals and time something else).
Intermediates that only one unit touches are allocated inside it, as in the whole program's
function; those that cross units are arguments.
"""
from __future__ import annotations

from dataclasses import dataclass

from leir.ast import accesses
from leir.lower.emit import emit_unit_primfunc
from leir.lower.planner import Plan, PLoop, PStore
from leir.signature import Signature


@dataclass(frozen=True)
class TimingUnit:
    items: tuple                 # the plan's top-level items it runs, in program order
    args: tuple[str, ...]        # known tensors (signature order), then shared intermediates (plan order)
    local: tuple[str, ...]       # intermediates only this unit touches: allocated inside it
    writes: tuple[str, ...]      # tensors it writes, in plan order


def timing_units(plan: Plan, signature: Signature) -> list[TimingUnit]:
    """The plan's top-level items grouped into units (see the module docstring), in program order."""
    groups: list[tuple[list, set[str], set[str]]] = []  # (items, written, touched)
    for item in plan.items:
        written, touched = _tensors(item)
        first = next((k for k, (_, w, _t) in enumerate(groups) if w & written), None)
        if first is None:
            groups.append(([item], written, touched))
            continue
        merged_items = [it for g in groups[first:] for it in g[0]] + [item]
        merged_w = set().union(written, *(g[1] for g in groups[first:]))
        merged_t = set().union(touched, *(g[2] for g in groups[first:]))
        del groups[first:]
        groups.append((merged_items, merged_w, merged_t))
    users: dict[str, int] = {}
    for _, _, touched in groups:
        for name in touched:
            users[name] = users.get(name, 0) + 1
    order = list(plan.tensors)
    units = []
    for items, written, touched in groups:
        known = tuple(t.name for t in signature.tensors if t.name in touched)
        inter = [n for n in plan.top_allocs if n in touched]
        args = known + tuple(n for n in inter if users[n] > 1)
        # A unit that touches no known or shared tensor (a nest writing a scratch tensor nobody reads)
        # still takes one argument: TVM places a function on the device of its arguments.
        units.append(TimingUnit(tuple(items), args or (signature.tensors[0].name,),
                                tuple(n for n in inter if users[n] == 1),
                                tuple(n for n in order if n in written)))
    return units


def unit_primfunc(plan: Plan, signature: Signature, unit: TimingUnit, name: str):
    """The unit's PrimFunc, named `name`."""
    return emit_unit_primfunc(plan, signature, unit.items, unit.args, unit.local, name)


def _tensors(item) -> tuple[set[str], set[str]]:
    """(tensors written, tensors touched) by a plan item and everything inside it."""
    written: set[str] = set()
    touched: set[str] = set()
    stack = [item]
    while stack:
        node = stack.pop()
        if isinstance(node, PLoop):
            stack.extend(node.body)
            continue
        assert isinstance(node, PStore)
        written.add(node.lhs.tensor)
        touched.update(a.tensor for a in accesses(node.lhs))
        if node.rhs is not None:
            touched.update(a.tensor for a in accesses(node.rhs))
    return written, touched
