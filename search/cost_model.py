"""A learned cost model that ranks a policy's proposals before any of them is measured.

Features come from the LEIR tree alone (`program_features`): loop extents and kinds, the stride of
every access along the innermost loop and along the loops above it, reuse (iterations per distinct
element), the vector width, the parallel extent, unrolling, local-scope accumulators, how many
exponentials are computed and whether they are the vectorisable `fast_exp`. Each statement's
features are weighted by its share of the program's iterations, so the heaviest statement decides.
`state_features` adds the static estimate of `strategies.analysis.cost` under weighings that each keep
one of its parts (`ESTIMATE_PARTS`), the search's analytic estimate, and the figures that estimate is
weighed from (`figure_features`: the carried chain, bytes per execution, strided accesses, reuse
distance against the caches, independent accumulators inside the reduction, index arithmetic,
guards, the vector loop's bits and gathers, and program totals of work, traffic and the
intermediate tensors between nests).

`PriorModel` is the offline model learned from a lake: a regressor of log2 µs (it ranks programs)
and a ranker (`rank:pairwise` over the states of each program beside their original, on
`ranking_matrix` rows), calibrated to a log2 speedup over the original; the search starts from it.
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
from dataclasses import dataclass, field, replace

import numpy as np

from leir.analysis import access_strides, element_bytes, statement_sites, tensor_boxes
from leir.ast import BinOp, Call, Program, Select, accesses, walk_expr
from leir.object_cache import MISSING, ObjectCache
from search.analysis import DEFAULT_MACHINE, Machine, log2_cycles, log2_speedup
from search.drivers import Action, Node, Policy
from strategies.analysis.cost import (
    ESTIMATE,
    Estimate,
    StatementCost,
    accessed_boxes,
    estimated_cycles_each,
    nest_statement_costs,
)
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


# The static estimate the chains of thought reason from (`strategies.analysis.cost`), whole and
# under weighings that keep one of its parts: the ranking model learns what each part costs on the
# machine that measured the lake (its nominal weights are only plausible values).
_NO_MEMORY = {"l1": 0.0, "l2": 0.0, "memory": 0.0}
_NO_OVERHEAD = {"loop_entry": 0.0, "nest": 0.0, "parallel_start": 0.0}
_NO_WORK = {"issue": 1e9, "latency": 0.0}
ESTIMATE_PARTS: tuple[tuple[str, Estimate], ...] = (
    ("all", ESTIMATE),
    ("compute", replace(ESTIMATE, **_NO_MEMORY, **_NO_OVERHEAD)),
    ("memory", replace(ESTIMATE, **_NO_WORK, **_NO_OVERHEAD)),
    ("overhead", replace(ESTIMATE, **_NO_WORK, **_NO_MEMORY)),
    ("latency", replace(ESTIMATE, issue=1e9, **_NO_MEMORY, **_NO_OVERHEAD)),
    ("one_core", replace(ESTIMATE, cores=1, parallel_start=0.0)),
    ("flat_cache", replace(ESTIMATE, l1=2.0, l2=2.0, memory=2.0)),
)
# Per statement (weighed by its share of the program's iterations), then program totals.
STATEMENT_FIGURE_NAMES: tuple[str, ...] = (
    "chain", "log_bytes_per_execution", "strided_share", "reuse_beyond_l1", "reuse_beyond_l2", "log_reuse_distance",
    "log_accumulators", "log_reduction_extent", "loops_inside_reduction", "index_ops", "index_divisions", "selects",
    "log_vector_bits", "vector_over_reduction", "vector_gathers")
FIGURE_FEATURE_NAMES: tuple[str, ...] = STATEMENT_FIGURE_NAMES + (
    "log_traffic", "log_ops", "log_calls", "log_intermediate_bytes", "n_tensors", "heaviest_nest_share",
    "heavy_nests")
STATE_FEATURE_NAMES: tuple[str, ...] = (FEATURE_NAMES + tuple(f"log_cycles_{n}" for n, _ in ESTIMATE_PARTS)
                                        + ("log_cycles_search",) + FIGURE_FEATURE_NAMES)
# A state beside its program's original: its own features and how each differs from the original's.
RANKING_FEATURE_NAMES: tuple[str, ...] = STATE_FEATURE_NAMES + tuple(f"delta_{n}" for n in STATE_FEATURE_NAMES)
RANKER_PARAMS = {"objective": "rank:pairwise", "max_depth": 6, "eta": 0.1, "rounds": 300}


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


def state_features(program: Program, features: np.ndarray | None = None) -> np.ndarray:
    """`program_features` (`features` where they were computed already), the log2 of each static
    estimate and `figure_features` (order: STATE_FEATURE_NAMES)."""
    cycles = estimated_cycles_each(program, range(len(program.nests)), "llvm", tuple(e for _, e in ESTIMATE_PARTS))
    tree = program_features(program) if features is None else features
    return np.concatenate([tree, [math.log2(max(1.0, c)) for c in cycles],
                           [log2_cycles(program, DEFAULT_MACHINE)], figure_features(program)])


# Each top-level nest's statement figures, kept by nest as the static estimate's are
# (`strategies.analysis.cost._NEST_CYCLES`): a search featurises hundreds of states of one program,
# which share most of their nests. Guarded by the shapes of the tensors the nest accesses.
_NEST_FIGURES = ObjectCache(8192)


@dataclass(frozen=True)
class _StatementFigures:
    iterations: int
    values: tuple[float, ...]   # STATEMENT_FIGURE_NAMES, unweighted
    ops: int                    # arithmetic operations, transcendental calls and bytes moved, all executions
    calls: int
    traffic: int
    writes: tuple[str, str]     # (tensor, dtype) of the left-hand side
    reads: tuple[str, ...]      # tensors of the right-hand side


def _statement_figures(site, shapes: dict, cost: StatementCost) -> _StatementFigures:
    loops, n = site.loops, cost.executions
    values = dict.fromkeys(STATEMENT_FIGURE_NAMES, 0.0)
    values["chain"] = float(cost.chain)
    values["log_bytes_per_execution"] = math.log2(1 + cost.loaded + cost.stored)
    values["strided_share"] = cost.strided / max(1, len(cost.strides))
    if cost.reuse:
        distance = max(r.distance or 0 for r in cost.reuse)
        values["log_reuse_distance"] = math.log2(1 + distance)
        values["reuse_beyond_l1"] = float(distance > DEFAULT_MACHINE.l1_bytes)
        values["reuse_beyond_l2"] = float(distance > DEFAULT_MACHINE.l2_bytes)
    reduction = set(cost.reduction)
    if reduction:  # the loops inside the innermost reduction loop: independent accumulators
        last = max(k for k, lp in enumerate(loops) if lp.var in reduction)
        values["log_accumulators"] = math.log2(math.prod(lp.extent for lp in loops[last + 1:]))
        values["log_reduction_extent"] = math.log2(math.prod(lp.extent for lp in loops if lp.var in reduction))
        values["loops_inside_reduction"] = float(len(loops) - 1 - last)
    accs = [*accesses(site.stmt.lhs), *accesses(site.stmt.rhs)]
    index_ops = [node for a in accs for ix in a.indices for node in walk_expr(ix) if isinstance(node, BinOp)]
    values["index_ops"] = float(len(index_ops))
    values["index_divisions"] = float(sum(node.op in ("/", "//", "%") for node in index_ops))
    values["selects"] = float(sum(isinstance(node, Select) for node in walk_expr(site.stmt.rhs)))
    vector = next((lp for lp in loops if lp.kind == "V"), None)
    if vector is not None:
        values["log_vector_bits"] = math.log2(vector.extent * 8 * element_bytes(site.stmt.lhs.dtype))
        values["vector_over_reduction"] = float(vector.var in reduction)
        strides = [access_strides(shapes.get(a.tensor), a) for a in accs]
        gathers = sum(st is None or abs(st.get(vector.var, 0)) > 1 for st in strides)
        values["vector_gathers"] = gathers / max(1, len(accs))
    return _StatementFigures(n, tuple(values.values()), cost.ops * n, cost.calls * n, (cost.loaded + cost.stored) * n,
                             (site.stmt.lhs.tensor, site.stmt.lhs.dtype),
                             tuple(a.tensor for a in accesses(site.stmt.rhs)))


def _nest_figures(nest, sites: list, shapes: dict) -> tuple[_StatementFigures, ...]:
    boxes = accessed_boxes(sites, shapes)
    kept = _NEST_FIGURES.get(nest, boxes)
    if kept is MISSING:
        costs = nest_statement_costs(nest, sites, shapes, "llvm")
        kept = tuple(_statement_figures(site, shapes, cost) for site, cost in zip(sites, costs, strict=True))
        _NEST_FIGURES.put(nest, kept, boxes)
    return kept


def figure_features(program: Program) -> np.ndarray:
    """What the static estimate's figures (`strategies.analysis.cost.statement_cost`) say of the
    program (order: FIGURE_FEATURE_NAMES): per statement, weighed by its share of the program's
    iterations, whether the innermost loop carries a chain, bytes per execution, the share of strided
    accesses, the reuse distance (and whether it is beyond L1 / L2), the independent accumulators and
    loops inside the innermost reduction loop and the reduction's extent, index arithmetic (divisions
    apart), guards, and the vector loop's bits, whether it runs over a reduction and its share of
    gathers; then the program's operations, calls and bytes moved (log2), the bytes of intermediate
    tensors (written by one top-level nest, read by another), the number of tensors, and the heaviest
    nest's share of the iterations and the nests above 5% of them."""
    shapes = tensor_boxes(program)
    by_nest: dict[int, list] = {}
    for site in statement_sites(program):
        by_nest.setdefault(site.nest_index, []).append(site)
    per_nest = {k: _nest_figures(program.nests[k], sites, shapes) for k, sites in by_nest.items()}
    total = sum(s.iterations for figs in per_nest.values() for s in figs) or 1
    weighted = np.zeros(len(STATEMENT_FIGURE_NAMES))
    ops = calls = traffic = 0
    nest_share: dict[int, float] = {}
    written: dict[str, tuple[str, set[int]]] = {}  # tensor: (first dtype written, nests that write it)
    read: dict[str, set[int]] = {}
    for k, figs in per_nest.items():
        for s in figs:
            w = s.iterations / total
            weighted += w * np.asarray(s.values)
            ops, calls, traffic = ops + s.ops, calls + s.calls, traffic + s.traffic
            nest_share[k] = nest_share.get(k, 0.0) + w
            written.setdefault(s.writes[0], (s.writes[1], set()))[1].add(k)
            for t in s.reads:
                read.setdefault(t, set()).add(k)
    intermediate = sum(math.prod(shapes[t]) * element_bytes(dtype) for t, (dtype, nests) in written.items()
                       if shapes.get(t) and read.get(t, set()) - nests)
    totals = (math.log2(1 + traffic), math.log2(1 + ops), math.log2(1 + calls), math.log2(1 + intermediate),
              len(shapes), max(nest_share.values(), default=0.0), sum(v > 0.05 for v in nest_share.values()))
    return np.concatenate([weighted, np.asarray(totals, dtype=np.float64)])


def ranking_matrix(root: np.ndarray, states: np.ndarray) -> np.ndarray:
    """The ranking model's rows (RANKING_FEATURE_NAMES): each state's `state_features` and their
    difference from its original's (`root`)."""
    states = np.atleast_2d(states)
    return np.hstack([states, states - root[None, :]])


@dataclass(frozen=True)
class RankingSet:
    """What the ranking model learns from: `ranking_matrix` rows, each state's measured log2 speedup
    over its program's original, and the program each belongs to (a query group)."""

    matrix: np.ndarray
    log2_speedup: np.ndarray
    groups: list[str]


def train_ranker(data: RankingSet, seed: int = 0):
    """XGBoost `rank:pairwise` over the states of each program (pairs only within a program), and a
    linear calibration of its score to a log2 speedup over the original (least squares over the
    training rows: it keeps the order and gives the search a margin in log units)."""
    import xgboost as xgb

    order = sorted(range(len(data.groups)), key=lambda i: (data.groups[i], i))
    sizes: list[int] = []
    for k, i in enumerate(order):
        if k == 0 or data.groups[i] != data.groups[order[k - 1]]:
            sizes.append(0)
        sizes[-1] += 1
    matrix = xgb.DMatrix(data.matrix[order], label=data.log2_speedup[order], nthread=1)
    matrix.set_group(sizes)
    p = RANKER_PARAMS
    booster = xgb.train({**_booster_params(seed, depth=p["max_depth"], eta=p["eta"]), "objective": p["objective"]},
                        matrix, num_boost_round=p["rounds"])
    score = booster.predict(xgb.DMatrix(data.matrix, nthread=1))
    slope, intercept = np.polyfit(score, data.log2_speedup, 1) if np.ptp(score) > 0 else (0.0, 0.0)
    return booster, (float(slope), float(intercept))


def _features(programs: list[Program] | np.ndarray) -> np.ndarray:
    if isinstance(programs, np.ndarray):
        return programs
    return np.vstack([program_features(p) for p in programs]) if programs else np.zeros((0, len(FEATURE_NAMES)))


def _booster_params(seed: int, depth: int = 4, eta: float = 0.2) -> dict:
    return {"objective": "reg:squarederror", "max_depth": depth, "eta": eta, "subsample": 1.0,
            "min_child_weight": 1.0, "seed": seed, "nthread": 1, "verbosity": 0}


MODEL_FORMAT = "steptp-cost-model/2"


@dataclass
class PriorModel:
    """The offline cost model of the machine that measured the lake's timings, trained on every timed
    state of a build: `booster`, an XGBoost regressor of log2(time in µs) of a state (it ranks states
    of different programs: `log2_us`), and `ranker`, an XGBoost `rank:pairwise` model of the states
    of one program beside their original (`log2_speedup`, calibrated to log2 units). The search
    starts from the ranker: before any state of a new search is timed, proposals are ranked by the
    speedup over the original it predicts. Saved as one JSON file (the boosters and what they were
    trained on)."""

    booster: object = field(repr=False)
    info: dict = field(default_factory=dict)
    ranker: object = field(default=None, repr=False)
    calibration: tuple[float, float] = (0.0, 0.0)  # log2 speedup = slope * ranker score + intercept

    @classmethod
    def train(cls, programs: list[Program] | np.ndarray, log2_us: list[float], seed: int = 0, rounds: int = 200,
              info: dict | None = None, ranking: RankingSet | None = None) -> PriorModel:
        """The regressor on `programs` (or their `program_features`) and, given `ranking`, the ranker."""
        import xgboost as xgb

        x, y = _features(programs), np.asarray(log2_us, dtype=np.float64)
        booster = xgb.train(_booster_params(seed, depth=6, eta=0.1), xgb.DMatrix(x, label=y, nthread=1),
                            num_boost_round=rounds)
        ranker, calibration = None, (0.0, 0.0)
        if ranking is not None and len(ranking.groups):
            ranker, calibration = train_ranker(ranking, seed)
        extra = {"ranking_features": list(RANKING_FEATURE_NAMES), "ranking_rows": len(ranking.groups),
                 "ranker": dict(RANKER_PARAMS)} if ranker is not None else {}
        return cls(booster, {"features": list(FEATURE_NAMES), "rows": len(y), **extra, **(info or {})}, ranker,
                   calibration)

    def log2_speedup(self, root: Program, programs: list[Program], root_features: np.ndarray | None = None,
                     features: np.ndarray | None = None) -> np.ndarray:
        """Predicted log2 speedup of each of `programs` over `root` (higher is faster): the ranker's,
        or without one the regressor's difference of predicted times. `root_features` (the root's
        `state_features`) and `features` (the programs' `program_features`) where known already."""
        if not programs:
            return np.zeros(0)
        if self.ranker is None:
            return float(self.log2_us([root])[0]) - self.log2_us(programs if features is None else features)
        import xgboost as xgb

        base = state_features(root) if root_features is None else root_features
        rows = ranking_matrix(base, np.vstack([state_features(p, None if features is None else features[i])
                                               for i, p in enumerate(programs)]))
        slope, intercept = self.calibration
        return slope * self.ranker.predict(xgb.DMatrix(rows, nthread=1)).astype(np.float64) + intercept

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
        ranker = json.loads(self.ranker.save_raw("json").decode()) if self.ranker is not None else None
        text = json.dumps({"format": MODEL_FORMAT, "info": self.info, "booster": json.loads(raw), "ranker": ranker,
                           "calibration": list(self.calibration)}, sort_keys=True) + "\n"
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
        if not isinstance(data, dict) or data.get("format") not in ("steptp-cost-model/1", MODEL_FORMAT):
            raise ValueError(f"{path} is not a steptp cost model")
        info = data.get("info", {})
        ranked = data.get("ranker") is not None
        if info.get("features") != list(FEATURE_NAMES) or (
                ranked and info.get("ranking_features") != list(RANKING_FEATURE_NAMES)):
            raise ValueError(f"{path} was trained on other features than this version computes; rebuild it "
                             "(`steptp stage cost_model`)")

        def booster(raw: dict):
            b = xgb.Booster(params={"nthread": 1})
            b.load_model(bytearray(json.dumps(raw).encode()))
            return b

        # a model of format 1 (before the ranker) still ranks, by its regressor
        return cls(booster(data["booster"]), info, booster(data["ranker"]) if ranked else None,
                   tuple(data.get("calibration") or (0.0, 0.0)))


@dataclass
class CostModel:
    """XGBoost regressor of log speedup over the root, trained on (features, measured speedup). It
    can predict from the start, before this search has timed anything (`set_root`): with a `prior`
    (the offline model learned from the lake) its predicted log speedup over the root, with
    `analytic` the program's own analysis (`search.analysis`: parallel extent, innermost strides,
    reuse against the caches), with both their weighted mean (`prior_weight` for the lake's model, 0.5
    by default). With a prior that has a ranker, the prior's part is the ranker's predicted speedup
    over the root (the states of one program), else the regressor's predicted times.
    The online booster learns what that starting point gets wrong for this program (it is the margin
    the booster starts from). Without either, the model has no opinion until it is trained."""

    seed: int = 0
    min_samples: int = 4
    rounds: int = 60
    prior: PriorModel | None = None
    analytic: bool = False
    # the prior's share of the starting point: a ranker alone ranks held-out release states better
    # (median within-program Spearman 0.60 against 0.52 blended), but one trained on the default
    # profile's few states led the matmul search to 36x where the blend finds 114x
    prior_weight: float | None = None  # None: 0.5
    machine: Machine | None = None
    features: list[np.ndarray] = field(default_factory=list)
    margins: list[float] = field(default_factory=list)
    targets: list[float] = field(default_factory=list)
    version: int = 0           # bumps on every retraining (rankings made before are stale)
    _booster: object = field(default=None, repr=False)
    _root: Program | None = field(default=None, repr=False)
    _root_log2: float | None = field(default=None, repr=False)
    _root_features: np.ndarray | None = field(default=None, repr=False)

    @property
    def trained(self) -> bool:
        return self._booster is not None

    def set_root(self, root: Program) -> None:
        """The program speedups are measured against (needed by the prior and the analysis)."""
        if self._root is None:
            self._root = root
            if self.prior is not None:
                self._root_log2 = float(self.prior.log2_us([root])[0])
                if self.prior.ranker is not None:
                    self._root_features = state_features(root)
            self.version += 1

    def margin(self, programs: list[Program] | None, x: np.ndarray) -> np.ndarray:
        """The predicted log speedup over the root before any measurement (natural log, as the
        targets): the lake's model and the analysis, weighted; zeros without either."""
        parts, weights = [], []
        if self.prior is not None and self._root_log2 is not None and len(x):
            if self.prior.ranker is not None and programs is not None:  # the states of one program, ranked
                parts.append(self.prior.log2_speedup(self._root, programs, self._root_features, x) * math.log(2))
            else:
                parts.append((self._root_log2 - self.prior.log2_us(x)) * math.log(2))
            weights.append(self._prior_weight() if self.analytic else 1.0)
        if self.analytic and self._root is not None and programs is not None and len(x) and \
                (not parts or self._prior_weight() < 1.0):
            machine = self.machine or DEFAULT_MACHINE
            weights.append(1.0 - self._prior_weight() if parts else 1.0)
            parts.append(np.array([log2_speedup(self._root, p, machine) for p in programs]) * math.log(2))
        if not parts:
            return np.zeros(len(x))
        return sum(w * p for w, p in zip(weights, parts, strict=True))

    def _prior_weight(self) -> float:
        return 0.5 if self.prior_weight is None else self.prior_weight

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
    _upcoming: Action | None = field(default=None, init=False, repr=False, compare=False)

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
        def best() -> int:  # best predicted first; each earlier proposal of the same kind costs `diversity`
            return max(alive, key=lambda i: (scores[i] - self.diversity * used.get(kinds[i], 0), -i))

        while alive:
            if self.model.version != version:     # learned something since the last ranking
                version = self.model.version
                scores = self.model.predict(feats, margin) / math.log(2)
            pick = best()
            alive.remove(pick)
            used[kinds[pick]] = used.get(kinds[pick], 0) + 1
            self._upcoming = pending[best()] if alive else None  # the next pick unless the model learns
            yield pending[pick]
        self._upcoming = None

    def upcoming(self) -> Action | None:
        return self._upcoming


def rank_by_model(model: CostModel, programs: list[Program]) -> list[int]:
    """Indices of `programs`, best predicted first (ties in the given order)."""
    scores = model.predict(programs)
    return sorted(range(len(programs)), key=lambda i: (-scores[i], i))
