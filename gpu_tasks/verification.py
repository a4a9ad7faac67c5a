"""The result of one verification: a status from a closed set plus the evidence behind it."""
from __future__ import annotations

import math
from dataclasses import asdict, dataclass, replace

# Statuses of the `verifications` table, in no particular order.
STATUSES = ("exact", "close", "mismatch", "build_error", "runtime_error", "timeout", "crash", "invalid")
PASSING = ("exact", "close")


@dataclass(frozen=True, slots=True)
class Verification:
    """`exact`: bitwise equal on every draw; `close`: within the dtype's tolerance on every draw;
    the error statuses carry their reason in `error`. Metrics are maxima over draws and outputs."""

    status: str
    max_abs_err: float | None = None
    max_rel_err: float | None = None
    rel_l2_err: float | None = None
    draws: int = 0
    bitwise_equal: bool = False
    error: str = ""
    # how much of the dtype's tolerance the differences use, the worst criterion of the worst output
    # and draw (1.0: at the limit); for an original against its float64 reference, how far rounding
    # in the program's dtype alone moves its outputs
    tolerance_share: float | None = None

    def __post_init__(self):
        if self.status not in STATUSES:
            raise ValueError(f"unknown verification status {self.status!r}")

    @property
    def passed(self) -> bool:
        return self.status in PASSING

    def with_error_prefix(self, prefix: str) -> Verification:
        return replace(self, error=f"{prefix}{self.error}") if self.error else self

    def to_json(self) -> dict:
        """JSON-safe (non-finite metrics become null, JSON has no NaN or infinity)."""
        out = asdict(self)
        for key in ("max_abs_err", "max_rel_err", "rel_l2_err", "tolerance_share"):
            out[key] = _finite_or_none(out[key])
        return out


def failure(status: str, error: str, draws: int = 0) -> Verification:
    return Verification(status=status, error=error, draws=draws)


def _finite_or_none(x: float | None) -> float | None:
    return x if x is not None and math.isfinite(x) else None


MAX_ERROR_CHARS = 2000


def describe_error(e: BaseException) -> str:
    """`Type: message` on one line, bounded in length (TVM messages can list every option it has)."""
    message = " ".join(line.strip() for line in str(e).strip().splitlines() if line.strip())
    text = f"{type(e).__name__}: {message}" if message else type(e).__name__
    return text if len(text) <= MAX_ERROR_CHARS else text[:MAX_ERROR_CHARS - 3] + "..."
