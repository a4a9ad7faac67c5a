"""Which verification requests go to one group job (`gpu_tasks.group_verify`): decided where the
work is sent, without TVM."""
from __future__ import annotations

from gpu_tasks.requests import PairRequest
from gpu_tasks.tolerances import tolerance_table

GROUP_TARGET, GROUP_FORM = "llvm", "plain"
MAX_GROUP = 48                 # pairs per group job: a crash or a time-out re-verifies at most this many whole


def group_key(request: PairRequest) -> tuple | None:
    """Pairs with equal keys can be verified in one group: everything but the two programs. None: the
    pair is verified alone (another target or form, or tolerances that `verify_pair_job` should judge)."""
    if request.target != GROUP_TARGET or request.form != GROUP_FORM:
        return None
    try:
        tolerances = tuple(sorted(tolerance_table(request.tolerances).items()))
        hash((tolerances, request.limits))
    except Exception:
        return None
    return (request.signature, request.arch, request.draws, request.seed, tolerances, request.limits)


def pair_groups(requests: list[PairRequest], max_group: int = MAX_GROUP) -> list[list[int]]:
    """Indices of `requests` in groups (in order of first appearance, at most `max_group` each); a pair
    that cannot be grouped is a group of its own."""
    groups: list[list[int]] = []
    open_group: dict[tuple, list[int]] = {}
    for i, r in enumerate(requests):
        key = group_key(r)
        if key is None:
            groups.append([i])
            continue
        group = open_group.get(key)
        if group is None or len(group) >= max_group:
            group = open_group[key] = []
            groups.append(group)
        group.append(i)
    return groups
