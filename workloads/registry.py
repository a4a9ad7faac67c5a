"""The catalogue: every workload by name, in a fixed order (singles, composites, then the workloads of
`workloads.mathematical`)."""
from __future__ import annotations

from functools import cache

from workloads.spec import Workload


@cache
def all_workloads() -> tuple[Workload, ...]:
    from workloads.composite import composite_workloads
    from workloads.mathematical import mathematical_workloads
    from workloads.single import single_workloads

    found = tuple(single_workloads()) + tuple(composite_workloads()) + tuple(mathematical_workloads())
    names = [w.name for w in found]
    dup = sorted({n for n in names if names.count(n) > 1})
    if dup:
        raise ValueError(f"workload names appear twice: {', '.join(dup)}")
    return found


def get_workload(name: str) -> Workload:
    for w in all_workloads():
        if w.name == name:
            return w
    raise KeyError(f"unknown workload {name!r}")


def workloads_of_kind(kind: str) -> list[Workload]:
    return [w for w in all_workloads() if w.kind == kind]
