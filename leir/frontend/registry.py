"""The operator registry of the translator and its errors.

The operator modules (`leir.frontend.ops.*`) register themselves here; this module imports none of
them: importing the package `leir.frontend` imports them all.

A handler is registered under PyTorch's own names (`relu`, `conv2d`, `add`, ...) and is called as
`handler(em, out, *args, **kwargs)` with the arguments of PyTorch's functional form: tensors arrive
as `Ref`s, everything else as Python values, `out` is the `Ref` (or list of `Ref`s for a tuple
result) the handler must write completely.
"""
from __future__ import annotations

from collections.abc import Callable

from leir.errors import LeirError

OPS: dict[str, Callable] = {}
# Operators whose PyTorch CPU kernel accumulates or computes in float32 for float16 and bfloat16 inputs
# and rounds its result once (docs/leir.md §4.5): the translator emits them in float32.
FLOAT32_KERNELS: set[str] = set()


class TranslationError(LeirError):
    """The module cannot be translated; nothing is emitted."""


class UnsupportedOperator(TranslationError):
    """An operator (or a form of one) the translator has no decomposition for."""

    def __init__(self, operator: str, where: str = "", detail: str = ""):
        self.operator, self.where, self.detail = operator, where, detail
        super().__init__(self.message())

    def message(self) -> str:
        msg = f"unsupported operator {self.operator!r}"
        if self.detail:
            msg += f" ({self.detail})"
        if self.where:
            msg += f" at {self.where}"
        return msg + "; supported operators: " + ", ".join(supported_operators())


class UnsupportedForm(TranslationError):
    """A supported operator called with arguments the translator cannot express (raised by handlers;
    the driver adds the operator name and source location)."""


def op(*names: str, float32_kernel: bool = False):
    """Register a handler under one or more PyTorch operator names; `float32_kernel`: PyTorch computes
    it in float32 for half-precision inputs (FLOAT32_KERNELS)."""
    def register(fn):
        for name in names:
            if name in OPS:
                raise ValueError(f"operator {name!r} registered twice")
            OPS[name] = fn
            if float32_kernel:
                FLOAT32_KERNELS.add(name)
        return fn
    return register


def computes_in_float32(name: str) -> bool:
    return name in FLOAT32_KERNELS


def supported_operators() -> list[str]:
    return sorted(OPS)


def handler_for(name: str) -> Callable | None:
    return OPS.get(name)
