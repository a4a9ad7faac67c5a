"""PyTorch -> LEIR (docs/leir.md §5): `translate(module, inputs) -> Translation`.

`translator` drives the translation (torch.fx trace, operator calls, naming, emission); each module of
`ops` decomposes one operator family and registers its handlers in `registry` on import, which is
why this package imports `ops`. `kernelbench` reads KernelBench-style problem files.
"""
from leir.frontend import ops  # noqa: F401  (registers every operator handler)
from leir.frontend.translator import (
    Translation,
    TranslationError,
    UnsupportedOperator,
    supported_operators,
    translate,
)

__all__ = ["Translation", "translate", "TranslationError", "UnsupportedOperator", "supported_operators"]
