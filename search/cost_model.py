"""A learned cost model that ranks a policy's proposals before any of them is measured (issue 14).

Features come from the LEIR tree alone (`program_features`): loop extents and kinds, the stride of
every access along the innermost loop and along the loops above it, reuse (iterations per distinct
element), the vector width, the parallel extent, unrolling, local-scope accumulators, how many
exponentials are computed and whether they are the vectorisable `fast_exp`. Each statement's
features are weighted by its share of the program's iterations, so the heaviest statement decides.

`CostModel` is an XGBoost regressor of log(root time / state time) trained online on the search's
own measurements (every verified, timed state); `RankedPolicy` wraps any policy (`library`, `random`,
`llm`) and yields its proposals best-predicted first, re-ranking the rest whenever the model learned
something new. Until the model has `min_samples` measurements it keeps the policy's own order.
Deterministic: the regressor runs single-threaded with a fixed seed, ties keep the policy's order.

No TVM here; xgboost and numpy only.
"""
from __future__ import annotations

import math
from collections.abc import Iterator
from dataclasses import dataclass, field

import numpy as np

from leir.analysis import affine_form, statement_sites
from leir.ast import Access, Call, Program, accesses, walk_expr
from search.drivers import Action, Node, Policy
from strategies.base import Context

STRIDE_CLASSES = ("zero", "unit", "small", "large", "irregular")
INNER_LOOPS = 3  # loops (innermost first) whose per-access strides are features
FEATURE_NAMES: tuple[str, ...] = (
    ("log_iterations", "log_statements", "n_nests", "log_parallel_extent", "parallel_outer",
     "vector_width", "vector_share", "log_unrolled", "log_inner_extent", "log_reuse", "local_accumulator",
     "local_accesses", "log_footprint", "exp_calls", "fast_exp_calls", "n_loops")
    + tuple(f"loop{k}_{c}" for k in range(INNER_LOOPS) for c in STRIDE_CLASSES)
    + tuple(f"loop{k}_{kind}" for k in range(INNER_LOOPS) for kind in ("L", "P", "V", "U"))
)


def _strides(shape: tuple[int, ...] | None, acc: Access) -> dict[str, int] | None:
    """Element stride of `acc` per loop variable (row-major); None for a gather or unknown shape."""
    if shape is None or len(shape) != len(acc.indices):
        return None
    out: dict[str, int] = {}
    step = 1
    for extent, ix in zip(reversed(shape), reversed(acc.indices), strict=True):
        form = affine_form(ix)
        if form is None:
            return None
        for var, c in form[0].items():
            out[var] = out.get(var, 0) + c * step
        step *= max(int(extent), 1)
    return out


def _stride_class(stride: int | None) -> str:
    if stride is None:
        return "irregular"
    s = abs(stride)
    return "zero" if s == 0 else "unit" if s == 1 else "small" if s <= 16 else "large"


def _shapes(program: Program) -> dict[str, tuple[int, ...] | None]:
    """Each tensor's shape from the bounding box of its accesses (known tensors included)."""
    shapes: dict[str, list[int] | None] = {}
    for site in statement_sites(program):
        bounds = site.bounds
        for acc in (*accesses(site.stmt.lhs), *accesses(site.stmt.rhs)):
            box = shapes.get(acc.tensor, [1] * len(acc.indices))
            if box is None or len(box) != len(acc.indices):
                shapes[acc.tensor] = None
                continue
            for d, ix in enumerate(acc.indices):
                form = affine_form(ix)
                if form is None:
                    continue
                hi = form[1] + sum(c * (bounds[v][1] if c > 0 else bounds[v][0])
                                   for v, c in form[0].items() if v in bounds)
                box[d] = max(box[d], hi + 1)
            shapes[acc.tensor] = box
    return {k: tuple(v) if v is not None else None for k, v in shapes.items()}


def program_features(program: Program) -> np.ndarray:
    """The feature vector of a program (order: FEATURE_NAMES)."""
    sites = statement_sites(program)
    shapes = _shapes(program)
    f = dict.fromkeys(FEATURE_NAMES, 0.0)
    total = sum(math.prod(lp.extent for lp in s.loops) for s in sites) or 1
    f["log_iterations"] = math.log2(total)
    f["log_statements"] = math.log2(len(sites) + 1)
    f["n_nests"] = len(program.nests)
    for s in sites:
        iters = math.prod(lp.extent for lp in s.loops)
        w = iters / total
        loops = s.loops
        par = math.prod(lp.extent for lp in loops if lp.kind == "P")
        f["log_parallel_extent"] += w * math.log2(par)
        f["parallel_outer"] += w * float(bool(loops) and loops[0].kind == "P")
        vec = [lp.extent for lp in loops if lp.kind == "V"]
        f["vector_width"] += w * (vec[0] if vec else 0)
        f["vector_share"] += w * float(bool(vec))
        f["log_unrolled"] += w * math.log2(math.prod(lp.extent for lp in loops if lp.kind == "U"))
        f["log_inner_extent"] += w * math.log2(loops[-1].extent if loops else 1)
        f["n_loops"] += w * len(loops)
        accs = [*accesses(s.stmt.lhs), *accesses(s.stmt.rhs)]
        f["local_accumulator"] += w * float(s.stmt.lhs.scope == "l")
        f["local_accesses"] += w * sum(a.scope == "l" for a in accs)
        calls = [n for n in walk_expr(s.stmt.rhs) if isinstance(n, Call)]
        f["exp_calls"] += w * sum(c.fn == "exp" for c in calls)
        f["fast_exp_calls"] += w * sum(c.fn == "fast_exp" for c in calls)
        distinct = sum(math.prod(shapes.get(a.tensor) or (1,)) for a in dict.fromkeys(accs)) or 1
        f["log_reuse"] += w * math.log2(max(iters * len(accs) / distinct, 1.0))
        # Data one pass of the two innermost loops touches (a proxy for the working set of a tile).
        inner = loops[-2:]
        f["log_footprint"] += w * math.log2(max(1, sum(
            math.prod(lp.extent for lp in inner if (_strides(shapes.get(a.tensor), a) or {}).get(lp.var, 0))
            for a in accs)))
        strides = [_strides(shapes.get(a.tensor), a) for a in accs]
        for k in range(INNER_LOOPS):
            if k >= len(loops):
                break
            lp = loops[-1 - k]
            if lp.kind in ("L", "P", "V", "U"):
                f[f"loop{k}_{lp.kind}"] += w
            for st in strides:
                f[f"loop{k}_{_stride_class(None if st is None else st.get(lp.var, 0))}"] += w
    return np.array([f[n] for n in FEATURE_NAMES], dtype=np.float64)


@dataclass
class CostModel:
    """XGBoost regressor of log speedup over the root, trained on (features, measured speedup)."""

    seed: int = 0
    min_samples: int = 4
    rounds: int = 60
    features: list[np.ndarray] = field(default_factory=list)
    targets: list[float] = field(default_factory=list)
    version: int = 0           # bumps on every retraining (rankings made before are stale)
    _booster: object = field(default=None, repr=False)

    @property
    def trained(self) -> bool:
        return self._booster is not None

    def add(self, program: Program, speedup: float) -> None:
        """One measurement; retrains (a few milliseconds) when enough are known."""
        if not speedup or speedup <= 0 or not math.isfinite(speedup):
            return
        self.features.append(program_features(program))
        self.targets.append(math.log(speedup))
        if len(self.targets) >= self.min_samples:
            self.fit()

    def fit(self) -> None:
        import xgboost as xgb

        x = np.vstack(self.features)
        y = np.asarray(self.targets)
        params = {"objective": "reg:squarederror", "max_depth": 4, "eta": 0.2, "subsample": 1.0,
                  "min_child_weight": 1.0, "seed": self.seed, "nthread": 1, "verbosity": 0}
        self._booster = xgb.train(params, xgb.DMatrix(x, label=y), num_boost_round=self.rounds)
        self.version += 1

    def predict(self, programs: list[Program] | np.ndarray) -> np.ndarray:
        """Predicted log speedup of each program (higher is faster); zeros while untrained."""
        x = programs if isinstance(programs, np.ndarray) else (
            np.vstack([program_features(p) for p in programs]) if programs else np.zeros((0, len(FEATURE_NAMES))))
        if not self.trained or len(x) == 0:
            return np.zeros(len(x))
        import xgboost as xgb

        return self._booster.predict(xgb.DMatrix(x))


@dataclass
class RankedPolicy(Policy):
    """`inner`'s proposals, best predicted first by `model` (which learns from every measured state)."""

    inner: Policy
    model: CostModel = field(default_factory=CostModel)
    limit: int = 400             # proposals of one state that are ranked (the policy's first ones)

    @property
    def name(self) -> str:
        return f"{getattr(self.inner, 'name', 'policy')}+model"

    def observe(self, node: Node) -> None:
        if node.accepted:
            self.model.add(node.program, node.speedup)

    def actions(self, ctx: Context, node: Node, want: int) -> Iterator[Action]:
        pending: list[Action] = []
        for action in self.inner.actions(ctx, node, want):
            pending.append(action)
            if len(pending) >= self.limit:
                break
        if not pending:
            return
        feats = np.vstack([program_features(a.after) for a in pending])
        alive = list(range(len(pending)))
        version, order = None, list(alive)
        while alive:
            if self.model.version != version:     # learned something since the last ranking
                version = self.model.version
                scores = self.model.predict(feats[alive])
                order = [alive[i] for i in sorted(range(len(alive)), key=lambda i: (-scores[i], alive[i]))]
            pick = order.pop(0)
            alive.remove(pick)
            yield pending[pick]


def rank_by_model(model: CostModel, programs: list[Program]) -> list[int]:
    """Indices of `programs`, best predicted first (ties in the given order)."""
    scores = model.predict(programs)
    return sorted(range(len(programs)), key=lambda i: (-scores[i], i))
