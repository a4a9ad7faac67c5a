"""The strategy framework: one class per atomic strategy, registered by name (xDSL-style passes).

A strategy enumerates its *sites* in a deterministic order, the meaningful *parameters* at each site,
*checks* a step (`check`: why it is not legal or cannot help here, or None) and only then *builds*
the new tree (`build`: surgery only, never a legality decision). The base class turns that into
`Transformation` records and drops results that are alpha-equivalent to the input (a
"transformation" that only renames or reprints is not a step), change a dtype, need a reassociation
the program cannot verify, or leave the format the context admits.

Parameters are typed: each strategy declares a `Params` dataclass (`params_type`), validated from the
published JSON (`Params.from_json`: an unknown key, a missing one or a wrong type is a reason, never a
crash) and written back to it (`Params.to_json`: the fields that are set).

A site is a typed match: besides where it is (nest, path, loops, statements, tensors) it carries what
the strategy found there (`Site.match`, a small frozen `Match`), so that the rewrite works on that
match instead of finding it again. `Match.to_json` gives the keys the site's JSON adds.
"""
from __future__ import annotations

import json
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field, fields, replace
from functools import cached_property
from typing import Any, ClassVar

from pydantic import ConfigDict, ValidationError
from pydantic.dataclasses import dataclass as pydantic_dataclass

from leir.analysis import StmtSite, extensions_used, implicit_inits, statement_sites, tensor_table
from leir.ast import EXTENSION_FNS, Program
from leir.canon import alpha_hash
from leir.printer import format_program
from leir.signature import Signature

LEVELS = ("graph", "operator", "memory", "mathematical")
EXACTNESS = ("exact", "reassociating")
TARGETS = ("llvm", "cuda")


class Illegal(Exception):
    """A rewrite that would change the program's meaning (or cannot be expressed): the reason."""


def refuse(reason: str | None) -> None:
    """Raise `Illegal(reason)` when an analysis found a reason ("why not, or None"), else nothing."""
    if reason:
        raise Illegal(reason)


def unhelpful(ctx: Context, reason: str | None) -> str | None:
    """The reason a legal step cannot help (a loop of one iteration made parallel, a copy read
    once, partial results in global memory inside serial loops), unless the context asks for every
    legal step (`useful_only=False`: the evaluation recognises a model's step as the strategy it
    names whether or not it helps)."""
    return reason if ctx.useful_only else None


# --- typed parameters ---------------------------------------------------------------------------------

PARAMS_CONFIG = ConfigDict(extra="forbid", strict=True, frozen=True)


class Params:
    """A strategy's parameters (a pydantic dataclass made by `params_dataclass`). Built from the published JSON
    with its types checked (`from_json`); written back as the fields that are set, lists as lists
    (`to_json`), so a record's params survive the round trip unchanged."""

    @classmethod
    def from_json(cls, data: dict) -> Params:
        """The typed parameters of `data`; `Illegal` naming what is wrong (an unknown key, a missing
        one, a value of the wrong type), in the order pydantic reports them."""
        if not isinstance(data, dict):
            raise Illegal(f"parameters must be a JSON object, got {type(data).__name__}")
        try:
            return cls(**data)
        except ValidationError as e:
            problems = "; ".join(f"{'.'.join(map(str, err['loc'])) or 'parameters'}: {err['msg']}"
                                 for err in e.errors())
            expected = ", ".join(f.name for f in fields(cls)) or "none"
            raise Illegal(f"bad parameters ({problems}; expected: {expected})") from None
        except TypeError as e:  # a key that is not a valid identifier
            raise Illegal(f"bad parameters ({e})") from None

    def to_json(self) -> dict[str, Any]:
        return {f.name: _copy(v) for f in fields(self) if (v := getattr(self, f.name)) is not None}


def _copy(value):
    return [_copy(v) for v in value] if isinstance(value, (list, tuple)) else value


def params_dataclass(cls):
    """Class decorator: a strategy's `Params` dataclass (frozen, strict types, no unknown keys)."""
    return pydantic_dataclass(config=PARAMS_CONFIG)(cls)


@params_dataclass
class NoParams(Params):
    """A strategy whose step has no parameters (`{}`)."""


@dataclass(frozen=True)
class Context:
    """The program a strategy works on, its signature and the target; analyses computed once."""

    program: Program
    signature: Signature
    target: str = "llvm"
    # The share of the dtype's tolerance that rounding alone moves the original's outputs by, against
    # its float64 reference (the generate stage's measurement; None: not measured). Above
    # numerics.ROUNDING_SHARE_LIMIT no reassociating step is proposed (`reassociation_problem`).
    rounding_share: float | None = None
    # The project's extensions of the published LEIR format (leir.ast.EXTENSION_FNS) a step's result
    # may use: all of them for the toolchain and the search, none for released data unless the
    # profile's `leir_extensions` admits one.
    extensions: tuple[str, ...] = EXTENSION_FNS
    # Steps that are legal but cannot help (strategies.base.unhelpful) are not proposed.
    useful_only: bool = True
    # Fewest innermost iterations one start of a parallel loop must share among the cores (0: no
    # bound). What pays for a thread pool's start and join is the machine's, not the program's: the
    # pipeline's profiles set it (`min_parallel_work`, strategies.analysis.legality.MIN_PARALLEL_WORK);
    # the toolchain's own contexts leave it off.
    min_parallel_work: int = 0

    def __post_init__(self):
        if self.target not in TARGETS:
            raise ValueError(f"target must be one of {', '.join(TARGETS)}, got {self.target!r}")

    @cached_property
    def sites(self) -> list[StmtSite]:
        return statement_sites(self.program)

    @cached_property
    def tensors(self):
        return tensor_table(self.program, self.signature)

    @cached_property
    def inits(self) -> dict[int, int | float]:
        return implicit_inits(self.program, self.signature)

    @cached_property
    def alpha(self) -> str:
        return alpha_hash(self.program, self.signature)

    @cached_property
    def memo(self) -> dict:
        """Answers about this state that its steps ask again (strategies.cot's legality by nest),
        keyed by the question; a later state (`with_program`) starts with none."""
        return {}

    @property
    def gpu(self) -> bool:
        return self.target == "cuda"

    def with_program(self, program: Program) -> Context:
        """A later state of the same program: its measured rounding goes with it."""
        return replace(self, program=program)

    @cached_property
    def result_code(self) -> str | None:
        """The dtype code of the program's outputs (None when they differ): what its results are
        verified to."""
        codes = [t.code for t in self.signature.outputs]
        return codes[0] if len(set(codes)) == 1 else None

    @cached_property
    def reassociation_problem(self) -> str | None:
        """Why no reassociating step can be verified on this program, or None."""
        from strategies.analysis.numerics import rounding_problem

        return rounding_problem(self.rounding_share, self.result_code)


@dataclass(frozen=True)
class Match:
    """What a strategy found at a site, beyond where it is: frozen and hashable, so sites are too.
    Its JSON is its fields (tuples as lists), unless a subclass says otherwise."""

    def to_json(self) -> dict[str, Any]:
        return {f.name: _jsonable(getattr(self, f.name)) for f in fields(self)}


def _jsonable(value):
    return list(value) if isinstance(value, tuple) else value


@dataclass(frozen=True)
class LoopAt(Match):
    """The loop at this position of the site's band (outermost = 0)."""

    loop_index: int


@dataclass(frozen=True)
class Nests(Match):
    """The top-level nests the rewrite combines, in program order."""

    nests: tuple[int, ...]


@dataclass(frozen=True, slots=True)
class Site:
    """Where a strategy applies. `nest` is the top-level nest (0-based); `path` the body positions
    below it; `loops`, `stmts` (program order) and `tensors` name what is involved; `match` is what
    the strategy found there (None: the position says it all)."""

    nest: int
    path: tuple[int, ...] = ()
    loops: tuple[str, ...] = ()
    stmts: tuple[int, ...] = ()
    tensors: tuple[str, ...] = ()
    match: Match | None = None

    def to_json(self) -> dict:
        out: dict[str, Any] = {"nest": self.nest}
        for key in ("path", "loops", "stmts", "tensors"):
            value = getattr(self, key)
            if value:
                out[key] = list(value)
        if self.match is not None:
            out.update(self.match.to_json())
        return out

    def describe(self) -> str:
        parts = [f"nest {self.nest + 1}"]
        if self.loops:
            parts.append("loop" + ("s " if len(self.loops) > 1 else " ") + ", ".join(self.loops))
        if self.stmts:
            parts.append("statement" + ("s " if len(self.stmts) > 1 else " ")
                         + ", ".join(str(s + 1) for s in self.stmts))
        if self.tensors:
            parts.append("tensor" + ("s " if len(self.tensors) > 1 else " ") + ", ".join(self.tensors))
        return ", ".join(parts)


@dataclass(frozen=True)
class Rewrite:
    """What `Strategy.rewrite` returns: the new program, the legality facts that were checked, and
    why the step can pay off here (with this program's numbers). `exactness` overrides the
    strategy's class for this one rewrite when it can only be `close` (never the other way)."""

    program: Program
    facts: tuple[str, ...] = ()
    summary: str = ""
    exactness: str | None = None


@dataclass(frozen=True)
class Transformation:
    strategy: str
    level: str
    exactness: str
    site: Site
    params: dict = field(hash=False)
    before: Program = field(repr=False)
    after: Program = field(repr=False)
    facts: tuple[str, ...] = ()
    summary: str = ""

    @cached_property
    def before_text(self) -> str:
        return format_program(self.before)

    @cached_property
    def after_text(self) -> str:
        return format_program(self.after)

    def params_json(self) -> str:
        return json.dumps(self.params, sort_keys=True, separators=(",", ":"))

    def to_json(self) -> dict:
        return {"strategy": self.strategy, "level": self.level, "exactness": self.exactness,
                "site": self.site.to_json(), "params": self.params, "after": self.after_text,
                "facts": list(self.facts), "summary": self.summary}


def dtype_changed(ctx: Context, program: Program) -> list[str]:
    """Tensors of the context's program whose dtype `program` changes (no step silently
    changes an accumulator's dtype, so a float32 accumulator of a float16 program stays float32)."""
    after = tensor_table(program, ctx.signature)
    return [name for name, info in ctx.tensors.items() if name in after and after[name].dtype != info.dtype]


class Strategy:
    name: ClassVar[str]
    level: ClassVar[str]
    exactness: ClassVar[str]
    description: ClassVar[str]
    # The targets on which the strategy is offered (the target belongs to the program, never
    # to the strategy). Thread binding (B) only means something on a GPU; parallel (P) and vector (V)
    # loops only on the CPU (the CUDA lowering runs them serially inside a kernel). On any other
    # target the strategy has no transformation.
    targets: ClassVar[tuple[str, ...]] = TARGETS
    # The strategies whose steps this one's result can make legal where they were not: what a CoT
    # that justifies the step by a follow-up names, and what the follow-up stage tries on the result.
    enables: ClassVar[tuple[str, ...]] = ()
    # How promising a step of this strategy is on the CPU before anything is measured: the search's
    # prior, higher first (`promise` adds what the step's own parameters say).
    search_prior: ClassVar[float] = 1.0
    # (transformations per state, variants per site) the search enumerates where more than its
    # defaults: strategies whose every variant is a different schedule worth ranking.
    search_variants: ClassVar[tuple[int, int] | None] = None
    # The step's parameters: a `Params` dataclass whose JSON is the published one.
    params_type: ClassVar[type[Params]] = NoParams

    @property
    def needs_gpu(self) -> bool:
        return self.targets == ("cuda",)

    def offered(self, ctx: Context) -> bool:
        """Whether the strategy is offered on the context's target."""
        return ctx.target in self.targets

    def sites(self, ctx: Context) -> Iterable[Site]:
        """Candidate sites, in a deterministic order (program order, outer loops first)."""
        raise NotImplementedError

    def parameters(self, ctx: Context, site: Site) -> Iterable[dict]:
        """The meaningful parameter variants at a site (JSON-able dicts), deterministic order."""
        yield {}

    def check(self, ctx: Context, site: Site, params: Params) -> str | None:
        """Why the step is not legal here, or cannot help (`unhelpful`); None when it can be built.
        Analyses only: nothing of the new program is assembled here."""
        raise NotImplementedError(f"{self.name} states no legality check")

    def build(self, ctx: Context, site: Site, params: Params) -> Rewrite:
        """The new program of a step that `check` passed, with the facts checked and why it can pay:
        tree surgery only, never a legality decision."""
        raise NotImplementedError(f"{self.name} builds nothing")

    def gate(self, ctx: Context, site: Site, params: Params, rewrite: Rewrite) -> str | None:
        """The rule's own last look at what it built, where only the whole result can say (it
        validates, keeps its implicit initialisations, shows the strategy's sign): why it is no step,
        or None. Most rules need none: their check already says why the result is right."""
        return None

    def rewrite(self, ctx: Context, site: Site, params: dict | Params) -> Rewrite:
        """`check`, `build`, then the rule's `gate`: the rewritten program; `Illegal(reason)` when the
        parameters do not parse, the check gives a reason or the gate refuses the result."""
        typed = params if isinstance(params, Params) else self.params_type.from_json(params)
        refuse(self.check(ctx, site, typed))
        rewrite = self.build(ctx, site, typed)
        refuse(self.gate(ctx, site, typed, rewrite))
        return rewrite

    def promise(self, t: Transformation) -> float:
        """The search's prior of the step `t` of this strategy (higher first)."""
        return self.search_prior

    def recognizes(self, before: Program, after: Program, signature: Signature) -> bool:
        """Whether `before` -> `after` shows this strategy's structural sign, in whatever spelling a
        model wrote the step (another tile size, the other loop of a pair moved first): what the
        label check credits when an answer that verifies is not one of the library's own results.
        A necessary sign, not a proof: the caller asks only about answers that verify. Every
        strategy states its own (`strategies.analysis.recognition` holds the shared queries)."""
        raise NotImplementedError(f"{self.name} states no structural sign")

    def transformations(self, ctx: Context, limit: int | None = None,
                        per_site: int | None = None) -> Iterator[Transformation]:
        """Legal, non-trivial transformations in site order; at most `per_site` parameter variants
        per site and `limit` in all (the first ones in the deterministic order)."""
        if not self.offered(ctx):
            return
        count = 0
        for site in self.sites(ctx):
            at_site = 0
            for params in self.parameters(ctx, site):
                t = self.apply(ctx, site, params)
                if t is None:
                    continue
                yield t
                count, at_site = count + 1, at_site + 1
                if limit is not None and count >= limit:
                    return
                if per_site is not None and at_site >= per_site:
                    break

    def apply(self, ctx: Context, site: Site, params: dict) -> Transformation | None:
        """One transformation, or None when illegal, not offered on the context's target, or when the
        result is alpha-equivalent."""
        if not self.offered(ctx):
            return None
        try:
            rw = self.rewrite(ctx, site, params)
        except Illegal:
            return None
        if alpha_hash(rw.program, ctx.signature) == ctx.alpha:
            return None
        if dtype_changed(ctx, rw.program):
            return None  # a bug of the rule, never a step: docs/leir.md §4.5 computes in the left-hand dtype
        exactness = "reassociating" if "reassociating" in (self.exactness, rw.exactness) else self.exactness
        if exactness == "reassociating" and ctx.reassociation_problem:
            return None
        if set(EXTENSION_FNS) - set(ctx.extensions) and not set(extensions_used(rw.program)) <= set(ctx.extensions):
            return None  # outside the format the context admits
        return Transformation(self.name, self.level, exactness, site, dict(params), ctx.program,
                              rw.program, tuple(rw.facts), rw.summary)

    def replay(self, ctx: Context, site: dict, params: dict) -> Transformation | None:
        """The transformation recorded as (`site`, `params`): the site of `sites(ctx)` whose JSON is
        `site` (Site.to_json), rewritten with `params`; None when no site matches or the step is not
        legal there. What re-makes a released step or trajectory step from its record."""
        found = next((s for s in self.sites(ctx) if s.to_json() == site), None)
        return None if found is None else self.apply(ctx, found, params)

    def legal_sites(self, ctx: Context) -> list[Site]:
        """Sites with at least one legal, non-trivial parameter variant."""
        if not self.offered(ctx):
            return []
        return [s for s in self.sites(ctx)
                if any(self.apply(ctx, s, p) is not None for p in self.parameters(ctx, s))]
