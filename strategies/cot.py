"""Chain of thought and prompts, rendered from the transformation record and a static analysis of
the LEIR tree (never from a text diff, never from timings).

The think block reasons before it acts:
(1) `Now:` what the program costs where the step acts, on the stated target: executions, operations,
    bytes loaded and stored per execution, parallel extent, vector width, the innermost loop's
    dependence chain and access strides, which tensor is reused across which loops
    (`strategies.analysis.cost`);
(2) `Options:` the other legal steps at this state, grouped by the figure each would improve;
(3) `Why <strategy>:` what this step improves, or, for a step that improves none of the figures by
    itself, the steps it makes legal next at the nests it changed;
(4) the record: `Strategy: X (level). <effect>`, `Where:`, `Parameters:`, `Legality checked:`;
(5) `Expected change:` the figures before -> after (only those that change);
(6) the exact state transition, quoting the affected nests `Before:` and `After:`.
No benefit is claimed that the figures do not show on the target: a parallel extent is a parallel
loop of the target (`P` on the CPU, `B` on a GPU), a memory benefit of a scope is claimed on a GPU
only. The answer is the published format:
`<think>...</think><answer>{"transformed_IR": ..., "applied_strategy": ...}</answer>`.
"""
from __future__ import annotations

import json
from collections import Counter
from dataclasses import dataclass
from functools import lru_cache

from leir.ast import Program
from leir.printer import format_nest
from leir.signature import Signature
from strategies.analysis.cost import Figures, StatementCost, estimated_cycles, figures
from strategies.analysis.prose import plural
from strategies.analysis.tree import changed_nests
from strategies.base import Context, Transformation

TASK_SINGLE = ("Apply exactly one optimization strategy to this LEIR program. Keep the known tensors "
               "(names, shapes, dtypes, global scope) unchanged and preserve the result. Reply with "
               "<think>your reasoning</think><answer>{\"transformed_IR\": ..., \"applied_strategy\": ...}</answer>.")
DEVICE = {"llvm": "the CPU", "cuda": "the GPU"}
# The figures a step can improve, in the order the reasoning weighs them, with what improving means.
GAINS = (
    ("parallel", "raises the parallel extent"),
    ("vector", "widens the vector lanes"),
    ("chain", "takes the dependent-update chain out of the innermost loop"),
    ("calls", "cuts transcendental calls"),
    ("ops", "cuts arithmetic"),
    ("passes", "cuts passes over memory"),
    ("traffic", "cuts the bytes moved"),
    ("stride", "makes the innermost accesses contiguous"),
    ("distance", "shortens the reuse distance"),
    ("unroll", "removes loop overhead"),
)


def prompt(program: Program, signature: Signature, target: str = "llvm", task: str = TASK_SINGLE) -> str:
    from leir.printer import format_program

    device = "a GPU (CUDA)" if target == "cuda" else "a CPU (LLVM)"
    return (f"The following tensor program is written in LEIR and will run on {device}:\n"
            f"{format_program(program)}\n"
            f"The known tensors are {signature.describe()}.\n{task}")


# --- weighing a step: the figures before and after -------------------------------------------------

@dataclass(frozen=True)
class Assessment:
    """A step's figures where it acts, before and after, on its target; what improves and worsens."""

    strategy: str
    target: str
    nests: range                     # the before-state's nests it changes
    before: Figures
    after: Figures
    gains: tuple[str, ...]
    losses: tuple[str, ...]
    changes: tuple[str, ...]         # "parallel extent 1 -> 4", in GAINS order
    cycles: tuple[float, float] = (0.0, 0.0)  # the static estimate where it acts, before and after

    @property
    def weighed(self) -> float:
        """before / after of the static estimate (analysis.cost.estimated_cycles): above 1, cheaper."""
        before, after = self.cycles
        return before / after if after > 0 else (1.0 if before == 0 else float("inf"))


# A step claims a benefit when a figure improves and the weighed estimate drops by at least this much:
# below it the figures' gains and losses cancel, and the clock, not the reasoning, decides.
BENEFIT_WEIGHED = 1.1


@lru_cache(maxsize=8192)
def _figures(program: Program, start: int, stop: int, target: str) -> Figures:
    return figures(program, range(start, stop), target)


@lru_cache(maxsize=8192)
def _cycles(program: Program, start: int, stop: int, target: str) -> float:
    return estimated_cycles(program, range(start, stop), target)


def assess(t: Transformation, target: str) -> Assessment:
    b_range, a_range = changed_nests(t.before, t.after)
    before = _figures(t.before, b_range.start, b_range.stop, target)
    after = _figures(t.after, a_range.start, a_range.stop, target)
    gains, losses, changes = [], [], []
    for key, b, a, text in _compared(before, after, target):
        if b == a:
            continue
        better = a > b if key in ("parallel", "vector", "unroll") else a < b
        (gains if better else losses).append(key)
        changes.append(text)
    cycles = (_cycles(t.before, b_range.start, b_range.stop, target),
              _cycles(t.after, a_range.start, a_range.stop, target))
    return Assessment(t.strategy, target, b_range, before, after, tuple(gains), tuple(losses), tuple(changes), cycles)


def _compared(before: Figures, after: Figures, target: str):
    """(key, before value, after value, phrase) per figure, in GAINS order."""
    mb, ma = before.main, after.main
    unit = "cores" if target == "llvm" else "threads"
    if mb and ma:
        yield "parallel", mb.parallel, ma.parallel, f"parallel extent {mb.parallel} -> {ma.parallel} {unit}"
        yield "vector", mb.vector, ma.vector, f"vector width {mb.vector} -> {ma.vector} lanes"
        yield ("chain", int(mb.chain), int(ma.chain),
               f"dependent-update chain in the innermost loop: {_yes(mb.chain)} -> {_yes(ma.chain)}")
    yield "calls", before.calls, after.calls, f"transcendental calls {before.calls:,} -> {after.calls:,}"
    yield "ops", before.ops, after.ops, f"arithmetic operations {before.ops:,} -> {after.ops:,}"
    yield "passes", before.nests, after.nests, f"passes (nests) {before.nests} -> {after.nests}"
    yield "traffic", before.traffic, after.traffic, f"bytes moved as written {before.traffic:,} -> {after.traffic:,}"
    if mb and ma:
        yield ("stride", mb.strided, ma.strided,
               f"strided or gathered accesses in the innermost loop {mb.strided} -> {ma.strided}")
        db, da = _distance(mb), _distance(ma)
        if db is not None and da is not None:
            yield "distance", db, da, f"largest reuse distance {db:,} -> {da:,} bytes"
        yield "unroll", mb.unrolled, ma.unrolled, f"unrolled iterations {mb.unrolled} -> {ma.unrolled}"


def _yes(flag: bool) -> str:
    return "yes" if flag else "no"


def _distance(s: StatementCost) -> int | None:
    known = [r.distance for r in s.reuse if r.distance is not None]
    return max(known) if known else None


# --- the state: every legal step, so that each CoT can weigh the others -----------------------------

@dataclass(frozen=True)
class StateSteps:
    """The legal steps of one program state (in enumeration order) with their assessments."""

    steps: tuple[Transformation, ...]
    assessments: tuple[Assessment, ...]

    def index(self, t: Transformation) -> int | None:
        return next((i for i, s in enumerate(self.steps) if s is t), None)


def state_steps(steps: list[tuple[Transformation, str]]) -> StateSteps:
    """`steps`: (transformation, the target it was enumerated for), of one program state."""
    return StateSteps(tuple(t for t, _ in steps), tuple(assess(t, target) for t, target in steps))


def enabled_next(t: Transformation, ctx: Context) -> list[str]:
    """The steps of the strategy's `enables` that are legal at the nests `t` changed in its result and
    were not legal at those nests before, on the same target."""
    from strategies.registry import get

    b_range, a_range = changed_nests(t.before, t.after)
    after_ctx = None
    out = []
    for name in get(t.strategy).enables:
        strategy = get(name)  # one not offered on the context's target has no legal site there
        if _legal_at(strategy, ctx, b_range):
            continue
        after_ctx = after_ctx or ctx.with_program(t.after)
        if _legal_at(strategy, after_ctx, a_range):
            out.append(name)
    return out


def _legal_at(strategy, ctx: Context, nests: range) -> bool:
    return any(_legal_at_nest(strategy, ctx, nest) for nest in nests)


def _legal_at_nest(strategy, ctx: Context, nest: int) -> bool:
    """Whether `strategy` has a legal step at `nest` of `ctx`'s program. Every step of one state asks
    this of the same state (its before), so the answers are kept in the context's `memo`."""
    key = ("legal at nest", strategy.name, nest)
    if key not in ctx.memo:
        sites = ctx.memo.get(("sites", strategy.name))
        if sites is None:
            sites = ctx.memo[("sites", strategy.name)] = tuple(strategy.sites(ctx))
        ctx.memo[key] = any(strategy.apply(ctx, site, p) is not None
                            for site in sites if site.nest == nest for p in strategy.parameters(ctx, site))
    return ctx.memo[key]


# --- rendering -------------------------------------------------------------------------------------

# What a chain of thought claims for its step, derived from the record it is rendered from:
# `benefit` (a figure improves on the target), `enabling` (no figure improves by itself, and the step
# makes named steps legal next at the nests it changed), `none` (neither).
CLAIMS = ("benefit", "enabling", "none")


@dataclass(frozen=True)
class Reasoning:
    """What a step's think block weighs and concludes: its assessment, the other options of its state,
    the claim and the steps it makes legal next (`enables`, only for an `enabling` claim)."""

    target: str
    mine: Assessment
    others: tuple[Assessment, ...] | None
    claim: str
    enables: tuple[str, ...]


def reasoning(t: Transformation, ctx: Context | None = None, state: StateSteps | None = None) -> Reasoning:
    """The reasoning of `t`; `ctx` is the context it was enumerated in (its target; None: the CPU,
    or the GPU for a GPU-only strategy), `state` every legal step of that state (the options)."""
    target = ctx.target if ctx is not None else _default_target(t.strategy)
    index = state.index(t) if state is not None else None
    mine = state.assessments[index] if index is not None else assess(t, target)
    others = (tuple(a for i, a in enumerate(state.assessments) if i != index and a.target == target)
              if state is not None else None)
    if mine.gains and mine.weighed >= BENEFIT_WEIGHED:
        return Reasoning(target, mine, others, "benefit", ())
    nexts = tuple(enabled_next(t, ctx)) if ctx is not None else ()
    return Reasoning(target, mine, others, "enabling" if nexts else "none", nexts)


def think(t: Transformation, ctx: Context | None = None, state: StateSteps | None = None,
          why: Reasoning | None = None) -> str:
    """The think text of `t` (see `reasoning` for `ctx` and `state`; `why`: its reasoning, if made)."""
    why = why or reasoning(t, ctx, state)
    target, mine = why.target, why.mine
    lines = _now(mine, target)
    if why.others is not None:
        lines.extend(_options(list(why.others)))
    lines.append(_why(t, why))
    lines.append(f"Strategy: {t.strategy} ({t.level} level). {t.summary}".rstrip())
    lines.append(f"Where: {t.site.describe()}.")
    if t.params:
        lines.append("Parameters: " + ", ".join(f"{k}={_param(v)}" for k, v in t.params.items()) + ".")
    if t.facts:
        lines.append("Legality checked:")
        lines.extend(f"- {fact}" for fact in t.facts)
    if t.exactness == "reassociating":
        lines.append("Floating-point operations are reordered, so results agree within rounding, "
                     "not bit for bit.")
    lines.append(f"Expected change on {DEVICE[target]}: "
                 + ("; ".join(mine.changes) if mine.changes else "none of these figures") + ".")
    before_range, after_range = changed_nests(t.before, t.after)
    lines.append("Before:" + _quote(t.before, before_range))
    lines.append("After:" + _quote(t.after, after_range))
    return "\n".join(lines)


def _default_target(strategy: str) -> str:
    from strategies.registry import get

    return "cuda" if get(strategy).needs_gpu else "llvm"


def _nests_text(nests: range) -> str:
    if len(nests) == 0:
        return "no nest"
    if len(nests) == 1:
        return f"nest {nests.start + 1}"
    return f"nests {nests.start + 1}-{nests.stop}"


def _now(a: Assessment, target: str) -> list[str]:
    f, m = a.before, a.before.main
    where = _nests_text(a.nests)
    if m is None:
        return [f"Now: {where} holds no statement."]
    loops = " ".join(f"{lp.var}({lp.extent}{'' if lp.kind == 'L' else ' ' + _KIND[lp.kind]})" for lp in m.loops)
    what = (f"accumulates into {m.tensor} over {', '.join(m.reduction)}" if m.reduction
            else f"writes each element of {m.tensor} once" if m.loops else f"writes {m.tensor}")
    work = (" and ".join([plural(m.ops, "operation")] * bool(m.ops) + [plural(m.calls, "transcendental call")]
                         * bool(m.calls)) or "a plain copy")
    verb = "run" if len(a.nests) > 1 else "runs"
    head = (f"Now: {where} {verb + ' ' + loops if loops else 'has no loop'}; its "
            f"{'main ' if len(f.statements) > 1 else ''}statement {what}: {m.executions:,} execution"
            f"{'' if m.executions == 1 else 's'} of {work}, each loading {m.loaded} bytes and storing {m.stored}")
    if len(f.statements) > 1:
        head += (f" ({len(f.statements)} statements in all: {f.ops:,} operations, {f.calls:,} transcendental calls, "
                 f"{f.traffic:,} bytes moved as written)")
    return [head + ".", _schedule(m, target), _reuse(m)]


_KIND = {"P": "parallel", "V": "vectorized", "U": "unrolled", "B": "bound"}


def _schedule(m: StatementCost, target: str) -> str:
    parts = []
    if target == "llvm":
        if m.parallel > 1:
            parts.append(f"{m.parallel_loops[0]} runs its {m.parallel} iterations in parallel")
        else:
            bound = [lp.var for lp in m.loops if lp.kind == "B"]
            parts.append("no loop runs in parallel" + (f" ({', '.join(bound)} is a GPU binding, serial on a CPU)"
                                                       if bound else ""))
        parts.append(f"the innermost loop runs as {m.vector} vector lanes" if m.vector > 1 else "no loop is vectorized")
    else:
        parts.append(f"{m.parallel} threads ({', '.join(m.parallel_loops)}) share the work" if m.parallel > 1
                     else "one thread does all the work")
    if m.loops:
        inner = m.loops[-1].var
        if m.chain:
            parts.append(f"the innermost loop {inner} carries the reduction, so each update waits for the previous one")
        strided = sorted({name for name, s in m.strides if s is None or s > 1})
        if strided:
            parts.append(f"{', '.join(strided)} {'is' if len(strided) == 1 else 'are'} walked along {inner} with a "
                         "stride or a gather")
        else:
            parts.append(f"every access walks {inner} contiguously or stays in a register")
    return f"On {DEVICE[target]}: " + "; ".join(parts) + "."


def _reuse(m: StatementCost) -> str:
    if not m.reuse:
        return "Reuse: no element is read twice by this statement."
    parts = []
    for r in m.reuse[:3]:
        apart = f", {r.distance:,} bytes apart" if r.distance is not None else ""
        parts.append(f"each element of {r.tensor} is read {r.times:,} times (across {', '.join(r.loops)}){apart}")
    return "Reuse: " + "; ".join(parts) + "."


def _options(others: list[Assessment]) -> list[str]:
    if not others:
        return ["Options: no other step is legal at this state."]
    counts = Counter(a.strategy for a in others)
    names = list(dict.fromkeys(a.strategy for a in others))
    listed = ", ".join(f"{n} x{counts[n]}" if counts[n] > 1 else n for n in names)
    lines = [f"Options: {plural(len(others), 'other legal step')} here ({listed})."]
    groups = []
    for key, verb in GAINS:
        by = list(dict.fromkeys(a.strategy for a in others if key in a.gains))
        if by:
            groups.append(f"{', '.join(by)} {_verb_plural(verb, len(by))}")
    neutral = [n for n in names if not any(a.gains for a in others if a.strategy == n)]
    if neutral:
        groups.append(f"{', '.join(neutral)} improve{'s' if len(neutral) == 1 else ''} no figure by "
                      f"{'itself' if len(neutral) == 1 else 'themselves'}")
    lines.append("By the figures: " + "; ".join(groups) + ".")
    return lines


def _verb_plural(verb: str, n: int) -> str:
    """`raises ...` for one strategy, `raise ...` for several."""
    if n == 1:
        return verb
    first, _, rest = verb.partition(" ")
    return (first[:-2] if first.endswith("shes") else first[:-1]) + " " + rest


def _why(t: Transformation, why: Reasoning) -> str:
    mine, device = why.mine, DEVICE[why.target]
    cost = f", at the cost of {_and([_LOSS[k] for k in mine.losses])}" if mine.losses else ""
    verbs = [verb for key, verb in GAINS if key in mine.gains]
    if why.claim == "benefit":
        text = f"Why {t.strategy}: on {device} it {_and(verbs)}{cost}; weighed, {_weighing(mine)}"
        if why.others is not None:
            text += _rivals(t, mine, list(why.others))
        return text + "."
    if mine.gains:  # figures that improve, outweighed or cancelled by the ones that worsen
        text = (f"Why {t.strategy}: on {device} it {_and(verbs)}{cost}; weighed, {_weighing(mine)}, so by itself "
                "it does not pay")
    else:
        text = f"Why {t.strategy}: by itself it improves none of these figures on {device}{cost}"
    if why.claim == "enabling":
        return (text + f"; it makes {_and(list(why.enables))} legal at the "
                f"{_nests_text(changed_nests(t.before, t.after)[1])} next.")
    return text + "; it changes the program's form, as the effect below says, for later steps to use."


def _weighing(a: Assessment) -> str:
    """The static estimate's verdict in words (never a time: a model cannot measure at inference)."""
    before, after = a.cycles
    ratio = a.weighed
    if ratio >= BENEFIT_WEIGHED:
        return f"the estimated cycles where it acts fall {_ratio(ratio)} ({before:,.0f} -> {after:,.0f})"
    if ratio > 1 / BENEFIT_WEIGHED:
        return f"the estimated cycles where it acts stay about the same ({before:,.0f} -> {after:,.0f})"
    return f"the estimated cycles where it acts rise {_ratio(1 / ratio)} ({before:,.0f} -> {after:,.0f})"


def _ratio(x: float) -> str:
    return "without bound" if x == float("inf") else f"{x:.1f}x"


def _rivals(t: Transformation, mine: Assessment, others: list[Assessment]) -> str:
    """How the other options compare on this step's first gain."""
    key = next(k for k, _ in GAINS if k in mine.gains)
    rivals = [a for a in others if key in a.gains and a.strategy != t.strategy]
    if not rivals:
        return "; no other kind of step here improves that figure"
    better = (lambda x, y: x > y) if key in ("parallel", "vector", "unroll") else (lambda x, y: x < y)
    best = rivals[0]
    for a in rivals[1:]:
        if better(_after(a, key), _after(best, key)):
            best = a
    names = _and(list(dict.fromkeys(a.strategy for a in rivals)))
    if better(_after(best, key), _after(mine, key)):
        return (f"; {names} also {'improve' if ' and ' in names else 'improves'} it, {best.strategy} further "
                f"({_after(best, key):,} against {_after(mine, key):,} here)")
    return f"; {names} also {'improve' if ' and ' in names else 'improves'} it, none further than this step"


def _after(a: Assessment, key: str) -> int:
    """The figure `key` after the step (as `_compared` reads it)."""
    m = a.after.main
    if key in ("parallel", "vector", "unroll", "stride", "chain", "distance") and m is None:
        return 0
    return {"parallel": lambda: m.parallel, "vector": lambda: m.vector, "unroll": lambda: m.unrolled,
            "stride": lambda: m.strided, "chain": lambda: int(m.chain), "distance": lambda: _distance(m) or 0,
            "calls": lambda: a.after.calls, "ops": lambda: a.after.ops, "passes": lambda: a.after.nests,
            "traffic": lambda: a.after.traffic}[key]()


_LOSS = {"parallel": "parallel extent", "vector": "vector lanes", "chain": "a dependent-update chain",
         "calls": "more transcendental calls", "ops": "more arithmetic", "passes": "an extra pass",
         "traffic": "more bytes moved", "stride": "more strided accesses", "distance": "a longer reuse distance",
         "unroll": "fewer unrolled iterations"}


def _and(items: list[str]) -> str:
    return items[0] if len(items) == 1 else ", ".join(items[:-1]) + " and " + items[-1]


def answer(t: Transformation, ctx: Context | None = None, state: StateSteps | None = None,
           why: Reasoning | None = None) -> str:
    body = json.dumps({"transformed_IR": t.after_text, "applied_strategy": t.strategy}, ensure_ascii=False)
    return f"<think>{think(t, ctx, state, why)}</think><answer>{body}</answer>"


def multi_answer(ts: list[Transformation], ctx: Context | None = None) -> str:
    """A multi-answer sample: one think block, a list of {"idx", "transformed_IR", "applied_strategy"}."""
    thoughts = "\n\n".join(f"Option {i + 1}:\n{think(t, ctx)}" for i, t in enumerate(ts))
    items = [{"idx": i + 1, "transformed_IR": t.after_text, "applied_strategy": t.strategy} for i, t in enumerate(ts)]
    return f"<think>{thoughts}</think><answer>{json.dumps(items, ensure_ascii=False)}</answer>"


def _quote(program: Program, nests: range) -> str:
    if not len(nests):
        return " (no nest)"
    return "".join(f"\n  nest {i + 1}: {format_nest(program.nests[i])}" for i in nests)


def _param(value) -> str:
    return json.dumps(value) if not isinstance(value, str) else value


TASK_MULTI = ("Propose {k} different single-step optimizations of this LEIR program, each applying exactly one "
              "strategy to the program as given. Keep the known tensors unchanged and preserve the result. Reply "
              "with <think>your reasoning</think><answer>[{{\"idx\": 1, \"transformed_IR\": ..., "
              "\"applied_strategy\": ...}}, ...]</answer>.")


def split_answer(text: str) -> tuple[str, object]:
    """(think text, parsed answer JSON) of a response in the published format; ValueError otherwise."""
    head, sep, rest = text.partition("<think>")
    think, sep2, rest = rest.partition("</think>")
    _, sep3, rest = rest.partition("<answer>")
    body, sep4, _ = rest.partition("</answer>")
    if not (sep and sep2 and sep3 and sep4) or head.strip():
        raise ValueError("not <think>...</think><answer>...</answer>")
    return think, json.loads(body)


TASK_CHAIN = ("Optimize this LEIR program in {k} steps, each applying exactly one strategy to the result of the "
              "step before it (the first to the program as given). Keep the known tensors unchanged and preserve "
              "the result. Reply with <think>your reasoning</think><answer>[{{\"idx\": 1, \"transformed_IR\": ..., "
              "\"applied_strategy\": ...}}, ...]</answer>, idx in the order the steps apply.")


def combine_answers(answers: list[str], label: str = "Option") -> str:
    """A multi-answer sample from single answers (each in the published format): options of one
    state (`Option 1:` ...), or with `label="Step"` the steps of a chain, each applied to the result
    of the one before."""
    thoughts, items = [], []
    for i, text in enumerate(answers, start=1):
        think_text, body = split_answer(text)
        thoughts.append(f"{label} {i}:\n{think_text}")
        items.append({"idx": i, "transformed_IR": body["transformed_IR"], "applied_strategy": body["applied_strategy"]})
    return f"<think>{chr(10).join(thoughts)}</think><answer>{json.dumps(items, ensure_ascii=False)}</answer>"


# --- templates: how many distinct CoTs a strategy has once numbers and names are abstracted ----------
