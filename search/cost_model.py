"""A learned cost model that ranks a policy's proposals before any of them is measured.

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

from leir.analysis import access_strides, element_bytes, statement_sites, tensor_boxes
from leir.ast import Call, Program, accesses, walk_expr
from search.analysis import DEFAULT_MACHINE, Machine, log2_speedup
from search.drivers import Action, Node, Policy
from strategies.base import Context

DIVERSITY = 0.35  # log2 of predicted speedup a repeated kind of move gives up per earlier one
STRIDE_CLASSES = ("zero", "unit", "small", "large", "irregular")
INNER_LOOPS = 3  # loops (innermost first) whose per-access strides are features
FEATURE_NAMES: tuple[str, ...] = (
    ("log_iterations", "log_statements", "n_nests", "log_parallel_extent", "parallel_outer",
     "vector_width", "vector_share", "log_unrolled", "log_inner_extent", "log_reuse", "local_accumulator",
     "local_accesses", "log_footprint", "exp_calls", "fast_exp_calls", "n_loops", "element_bits")
    + tuple(f"loop{k}_{c}" for k in range(INNER_LOOPS) for c in STRIDE_CLASSES)
    + tuple(f"loop{k}_{kind}" for k in range(INNER_LOOPS) for kind in ("L", "P", "V", "U"))
)


def _stride_class(stride: int | None) -> str:
    if stride is None:
        return "irregular"
    s = abs(stride)
    return "zero" if s == 0 else "unit" if s == 1 else "small" if s <= 16 else "large"


def program_features(program: Program) -> np.ndarray:
    """The feature vector of a program (order: FEATURE_NAMES)."""
    sites = statement_sites(program)
    shapes = tensor_boxes(program)
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
        f["element_bits"] += w * 8 * element_bytes(s.stmt.lhs.dtype)
        f["local_accesses"] += w * sum(a.scope == "l" for a in accs)
        calls = [n for n in walk_expr(s.stmt.rhs) if isinstance(n, Call)]
        f["exp_calls"] += w * sum(c.fn == "exp" for c in calls)
        f["fast_exp_calls"] += w * sum(c.fn.startswith("fast_") for c in calls)  # any vectorisable fast form
        distinct = sum(math.prod(shapes.get(a.tensor) or (1,)) for a in dict.fromkeys(accs)) or 1
        f["log_reuse"] += w * math.log2(max(iters * len(accs) / distinct, 1.0))
        # Data one pass of the two innermost loops touches (a proxy for the working set of a tile).
        inner = loops[-2:]
        f["log_footprint"] += w * math.log2(max(1, sum(
            math.prod(lp.extent for lp in inner if (access_strides(shapes.get(a.tensor), a) or {}).get(lp.var, 0))
            for a in accs)))
        strides = [access_strides(shapes.get(a.tensor), a) for a in accs]
        for k in range(INNER_LOOPS):
            if k >= len(loops):
                break
            lp = loops[-1 - k]
            if lp.kind in ("L", "P", "V", "U"):
                f[f"loop{k}_{lp.kind}"] += w
            for st in strides:
                f[f"loop{k}_{_stride_class(None if st is None else st.get(lp.var, 0))}"] += w
    return np.array([f[n] for n in FEATURE_NAMES], dtype=np.float64)


def _features(programs: list[Program] | np.ndarray) -> np.ndarray:
    if isinstance(programs, np.ndarray):
        return programs
    return np.vstack([program_features(p) for p in programs]) if programs else np.zeros((0, len(FEATURE_NAMES)))


def _booster_params(seed: int, depth: int = 4, eta: float = 0.2) -> dict:
    return {"objective": "reg:squarederror", "max_depth": depth, "eta": eta, "subsample": 1.0,
            "min_child_weight": 1.0, "seed": seed, "nthread": 1, "verbosity": 0}


@dataclass
class PriorModel:
    """The offline cost model: an XGBoost regressor of log2(time in µs) of a program state on
    the machine that measured the lake's timings, trained on every timed state of a build. The search
    starts from it: before any state of a new search is timed, proposals are ranked by the time it
    predicts. Saved as one JSON file (the booster and what it was trained on)."""

    booster: object = field(repr=False)
    info: dict = field(default_factory=dict)

    @classmethod
    def train(cls, programs: list[Program] | np.ndarray, log2_us: list[float], seed: int = 0, rounds: int = 200,
              info: dict | None = None) -> PriorModel:
        import xgboost as xgb

        x, y = _features(programs), np.asarray(log2_us, dtype=np.float64)
        booster = xgb.train(_booster_params(seed, depth=6, eta=0.1), xgb.DMatrix(x, label=y, nthread=1),
                            num_boost_round=rounds)
        return cls(booster, {"features": list(FEATURE_NAMES), "rows": len(y), **(info or {})})

    def log2_us(self, programs: list[Program] | np.ndarray) -> np.ndarray:
        """Predicted log2 of each program's time in µs (lower is faster)."""
        x = _features(programs)
        if len(x) == 0:
            return np.zeros(0)
        import xgboost as xgb

        return self.booster.predict(xgb.DMatrix(x, nthread=1)).astype(np.float64)

    def save(self, path) -> None:
        import json
        import os
        import tempfile
        from pathlib import Path

        path = Path(path)
        path.parent.mkdir(parents=True, exist_ok=True)
        raw = self.booster.save_raw("json").decode()
        text = json.dumps({"format": "steptp-cost-model/1", "info": self.info, "booster": json.loads(raw)},
                          sort_keys=True) + "\n"
        fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
        with os.fdopen(fd, "w", encoding="utf-8") as f:
            f.write(text)
        os.replace(tmp, path)

    @classmethod
    def load(cls, path) -> PriorModel:
        """The model saved at `path`; ValueError when the file is not one (or was made with other features)."""
        import json
        from pathlib import Path

        import xgboost as xgb

        try:
            data = json.loads(Path(path).read_text(encoding="utf-8"))
        except (OSError, UnicodeDecodeError, json.JSONDecodeError) as e:
            raise ValueError(f"cannot read the cost model {path}: {e}") from None
        if not isinstance(data, dict) or data.get("format") != "steptp-cost-model/1":
            raise ValueError(f"{path} is not a steptp cost model")
        if data.get("info", {}).get("features") != list(FEATURE_NAMES):
            raise ValueError(f"{path} was trained on other features than this version computes; rebuild it "
                             "(`steptp stage cost_model`)")
        booster = xgb.Booster(params={"nthread": 1})
        booster.load_model(bytearray(json.dumps(data["booster"]).encode()))
        return cls(booster, data["info"])


@dataclass
class CostModel:
    """XGBoost regressor of log speedup over the root, trained on (features, measured speedup). It
    can predict from the start, before this search has timed anything (`set_root`): with a `prior`
    (the offline model learned from the lake) its predicted log speedup over the root, with
    `analytic` the program's own analysis (`search.analysis`: parallel extent, innermost strides,
    reuse against the caches), with both their weighted mean (`prior_weight` for the lake's model).
    The online booster learns what that starting point gets wrong for this program (it is the margin
    the booster starts from). Without either, the model has no opinion until it is trained."""

    seed: int = 0
    min_samples: int = 4
    rounds: int = 60
    prior: PriorModel | None = None
    analytic: bool = False
    prior_weight: float = 0.5
    machine: Machine | None = None
    features: list[np.ndarray] = field(default_factory=list)
    margins: list[float] = field(default_factory=list)
    targets: list[float] = field(default_factory=list)
    version: int = 0           # bumps on every retraining (rankings made before are stale)
    _booster: object = field(default=None, repr=False)
    _root: Program | None = field(default=None, repr=False)
    _root_log2: float | None = field(default=None, repr=False)

    @property
    def trained(self) -> bool:
        return self._booster is not None

    def set_root(self, root: Program) -> None:
        """The program speedups are measured against (needed by the prior and the analysis)."""
        if self._root is None:
            self._root = root
            if self.prior is not None:
                self._root_log2 = float(self.prior.log2_us([root])[0])
            self.version += 1

    def margin(self, programs: list[Program] | None, x: np.ndarray) -> np.ndarray:
        """The predicted log speedup over the root before any measurement (natural log, as the
        targets): the lake's model and the analysis, weighted; zeros without either."""
        parts, weights = [], []
        if self.prior is not None and self._root_log2 is not None and len(x):
            parts.append((self._root_log2 - self.prior.log2_us(x)) * math.log(2))
            weights.append(self.prior_weight if self.analytic else 1.0)
        if self.analytic and self._root is not None and programs is not None and len(x):
            machine = self.machine or DEFAULT_MACHINE
            parts.append(np.array([log2_speedup(self._root, p, machine) for p in programs]) * math.log(2))
            weights.append(1.0 - self.prior_weight if parts[:-1] else 1.0)
        if not parts:
            return np.zeros(len(x))
        return sum(w * p for w, p in zip(weights, parts, strict=True))

    def add(self, program: Program, speedup: float) -> None:
        """One measurement; retrains (a few milliseconds) when enough are known."""
        if not speedup or speedup <= 0 or not math.isfinite(speedup):
            return
        x = program_features(program)
        self.features.append(x)
        self.margins.append(float(self.margin([program], x[None, :])[0]))
        self.targets.append(math.log(speedup))
        if len(self.targets) >= self.min_samples:
            self.fit()

    def fit(self) -> None:
        import xgboost as xgb

        x = np.vstack(self.features)
        y = np.asarray(self.targets)
        data = xgb.DMatrix(x, label=y, base_margin=np.asarray(self.margins), nthread=1)
        self._booster = xgb.train(_booster_params(self.seed), data, num_boost_round=self.rounds)
        self.version += 1

    def predict(self, programs: list[Program] | np.ndarray, margin: np.ndarray | None = None) -> np.ndarray:
        """Predicted log speedup of each program (higher is faster): the starting point (`margin`)
        alone while the online booster is untrained. Given a feature matrix, pass its `margin` (the
        analysis needs the programs)."""
        x = _features(programs)
        if margin is None:
            margin = self.margin(None if isinstance(programs, np.ndarray) else list(programs), x)
        if not self.trained or len(x) == 0:
            return margin
        import xgboost as xgb

        return self._booster.predict(xgb.DMatrix(x, base_margin=margin, nthread=1))


@dataclass
class RankedPolicy(Policy):
    """`inner`'s proposals, best predicted first by `model` (which learns from every measured state)."""

    inner: Policy
    model: CostModel = field(default_factory=CostModel)
    limit: int = 400             # proposals of one state that are ranked (the policy's first ones)
    diversity: float = DIVERSITY  # log2 of predicted speedup a repeated kind of move gives up per earlier one

    @property
    def name(self) -> str:
        return f"{getattr(self.inner, 'name', 'policy')}+model"

    def observe(self, node: Node) -> None:
        if node.accepted:
            self.model.add(node.program, node.speedup)

    def actions(self, ctx: Context, node: Node, want: int) -> Iterator[Action]:
        self.model.set_root(node.path()[0].program)
        pending: list[Action] = []
        for action in self.inner.actions(ctx, node, want):
            pending.append(action)
            if len(pending) >= self.limit:
                break
        if not pending:
            return
        feats = np.vstack([program_features(a.after) for a in pending])
        margin = self.model.margin([a.after for a in pending], feats)
        alive = list(range(len(pending)))
        kinds = [a.move for a in pending]
        used: dict[str, int] = {}
        version, scores = None, None
        while alive:
            if self.model.version != version:     # learned something since the last ranking
                version = self.model.version
                scores = self.model.predict(feats, margin) / math.log(2)
            # best predicted first; each earlier proposal of the same kind costs `diversity`
            pick = max(alive, key=lambda i: (scores[i] - self.diversity * used.get(kinds[i], 0), -i))
            alive.remove(pick)
            used[kinds[pick]] = used.get(kinds[pick], 0) + 1
            yield pending[pick]


def rank_by_model(model: CostModel, programs: list[Program]) -> list[int]:
    """Indices of `programs`, best predicted first (ties in the given order)."""
    scores = model.predict(programs)
    return sorted(range(len(programs)), key=lambda i: (-scores[i], i))
