"""The operator handlers of the translator, one module per operator family; each registers its
handlers in `leir.frontend.registry` when imported."""
from leir.frontend.ops import conv, linalg, loss, norm, pointwise, pool, reduce, shape  # noqa: F401
