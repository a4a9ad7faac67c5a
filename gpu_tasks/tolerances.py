"""Per-dtype tolerances of `close` (docs/cli.md, `steptp verify`; params.yaml
`verify.tolerance`, same keys).

An output is within tolerance when EVERY criterion holds (never one of several): the same non-finite
pattern as the reference, `max_abs_err <= max_abs * max(1, rms(reference))` (absolute for outputs of
order one, scaled for larger ones), `max_rel_err <= max_rel` and `rel_l2_err <= rel_l2` (metrics
defined in `compare`).
"""
from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

from leir.dtypes import code_of, is_float


@dataclass(frozen=True, slots=True)
class Tolerance:
    max_abs: float
    max_rel: float
    rel_l2: float

    def __post_init__(self):
        if min(self.max_abs, self.max_rel, self.rel_l2) < 0:
            raise ValueError("tolerances are non-negative")


EXACT = Tolerance(0.0, 0.0, 0.0)

# Keys are LEIR dtype codes; the values are params.yaml's. Reassociating a float32 sum of a few
# hundred terms moves it by a few ulp times sqrt(n); half precisions keep ~3 (f16) or ~2 (bf16)
# decimal digits, so their accumulations drift by about 1e-2.
DEFAULT_TOLERANCES: dict[str, Tolerance] = {
    "f64": Tolerance(max_abs=1e-9, max_rel=1e-7, rel_l2=1e-9),
    "f32": Tolerance(max_abs=1e-4, max_rel=1e-3, rel_l2=1e-5),
    "f16": Tolerance(max_abs=1e-2, max_rel=5e-2, rel_l2=1e-2),
    "bf16": Tolerance(max_abs=5e-2, max_rel=1e-1, rel_l2=5e-2),
}


def tolerance_table(mapping: Mapping | None = None) -> dict[str, Tolerance]:
    """The default table updated by `mapping`: {dtype: {"max_abs", "max_rel", "rel_l2"}} with the
    dtype as a PyTorch name (params.yaml) or a LEIR code; a `Tolerance` is taken as is."""
    table = dict(DEFAULT_TOLERANCES)
    for dtype, spec in (mapping or {}).items():
        code = dtype if dtype in table else code_of(str(dtype))
        if not isinstance(spec, Tolerance):
            spec = Tolerance(float(spec["max_abs"]), float(spec["max_rel"]), float(spec["rel_l2"]))
        table[code] = spec
    return table


def tolerance_for(code: str, table: Mapping[str, Tolerance] | None = None) -> Tolerance:
    """Integer and bool outputs are compared exactly; a float dtype without an entry falls back on
    the loosest float tolerance in the table."""
    if not is_float(code):
        return EXACT
    table = DEFAULT_TOLERANCES if table is None else table
    if code in table:
        return table[code]
    return max(table.values(), key=lambda t: t.max_rel)
