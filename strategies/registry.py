"""The registry of the 43 strategies, by name, in the order and spelling of the published data."""
from __future__ import annotations

from strategies.base import EXACTNESS, LEVELS, Strategy

STRATEGY_NAMES: dict[str, tuple[str, ...]] = {
    "graph": (
        "operator_fusion", "operator_fission", "compute_inline", "expression_splitting",
        "tensor_concat_to_fuse_operators", "tensor_split_to_decouple_operators",
        "common_subexpression_elimination", "dead_code_elimination", "expression_reorder",
    ),
    "operator": (
        "loop_reorder", "loop_tiling", "loop_split", "loop_fusion", "loop_unrolling", "loop_parallelization",
        "loop_vectorization", "loop_binding", "reduction_factorization",
    ),
    "memory": (
        "cache_read_write", "layout_transformation", "set_storage_scope", "set_storage_layout",
        "precompute_indices",
    ),
    "mathematical": (
        "factorization", "expand_factorization", "cancellation", "expand_cancellation", "apart", "together",
        "powsimp", "expand_powsimp", "expand_log", "logsimp", "collect", "expand_collect",
        "partially_equivalent_then_correct", "normal_loop_max_to_prefix_max", "exponential_split",
        "multiplicative_split", "additive_split", "normal_loop_summation_on_exp_to_prefix_summation_on_exp",
        "online_softmax", "flashattention_wo_tiling",
    ),
}
ALL_NAMES: tuple[str, ...] = tuple(n for names in STRATEGY_NAMES.values() for n in names)
LEVEL_OF: dict[str, str] = {n: level for level, names in STRATEGY_NAMES.items() for n in names}

_REGISTRY: dict[str, Strategy] = {}


def register(cls: type[Strategy]) -> type[Strategy]:
    """Class decorator: checks the class-level name, level and exactness, and registers one instance."""
    name = getattr(cls, "name", None)
    if name not in LEVEL_OF:
        raise ValueError(f"{cls.__name__}: {name!r} is not one of the 43 published strategy names")
    if cls.level != LEVEL_OF[name]:
        raise ValueError(f"{name}: level {cls.level!r}, the published data says {LEVEL_OF[name]!r}")
    if cls.level not in LEVELS or cls.exactness not in EXACTNESS:
        raise ValueError(f"{name}: bad level or exactness")
    if name in _REGISTRY:
        raise ValueError(f"strategy {name!r} registered twice")
    _REGISTRY[name] = cls()
    return cls


def _load() -> None:
    import strategies.catalog  # noqa: F401  (imports every strategy module, which registers)


def get(name: str) -> Strategy:
    _load()
    if name not in _REGISTRY:
        known = ", ".join(ALL_NAMES)
        raise KeyError(f"unknown strategy {name!r}; the 43 strategies are: {known}")
    return _REGISTRY[name]


def registered() -> list[Strategy]:
    """Every registered strategy, in the published order."""
    _load()
    return [_REGISTRY[n] for n in ALL_NAMES if n in _REGISTRY]


def missing() -> list[str]:
    _load()
    return [n for n in ALL_NAMES if n not in _REGISTRY]
