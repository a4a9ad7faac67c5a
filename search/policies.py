"""Policies that propose actions to the search (search.drivers): `library`, `random` and `llm`.

- `library`: every legal, non-trivial transformation of the registered strategies (capped per
  strategy and per site) and the macro actions of `search.macros` (a micro-kernel, a row kernel:
  several atomic steps offered as one proposal), ordered by what the program's own analysis
  predicts each does to its time (`search.analysis`: parallel extent, the stride of the innermost
  loop, reuse against the caches), ties broken by a cheap per-strategy prior, and spread out so that
  one kind of move does not fill the first places (`diversify`).
- `random`: the same actions in an order drawn from `random.Random(f"{seed}:random:{state}")`.
- `llm`: any OpenAI-compatible chat endpoint (`POST {base}/v1/chat/completions` with urllib),
  prompted in the published format (`strategies.cot.prompt`) with the search context; the reply is
  parsed with JSON only (never evaluated). An answer that does not parse, names no known strategy,
  or is not valid LEIR for the signature is a rejected proposal (counted, never verified).

No TVM here (DESIGN.md: `strategies` never imports TVM).
"""
from __future__ import annotations

import json
import os
import random
import urllib.error
import urllib.request
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field, replace

from leir.errors import LeirError
from leir.parse import parse_program
from leir.validate import validate
from search.analysis import DEFAULT_MACHINE, Machine, log2_speedup
from search.cost_model import DIVERSITY
from search.drivers import Action, Node, Policy
from search.macros import Macro, macro_proposals
from strategies.base import Context, Site, Transformation
from strategies.cot import TASK_MULTI, TASK_SINGLE, prompt, split_answer
from strategies.registry import ALL_NAMES, get, registered

POLICIES = ("library", "random", "llm")

def prior(t: Transformation) -> float:
    """A cheap score of how promising a transformation is on the CPU (higher first): its rule's
    `promise`. Only breaks ties of the analysis."""
    return get(t.strategy).promise(t)


def library_actions(ctx: Context, per_strategy: int = 12, per_site: int = 3, *, macros: bool = True,
                    machine: Machine | None = None) -> list[Action]:
    """Every legal action (capped) and the macros this state admits, best predicted first by the
    program's analysis (ties: the per-strategy prior, then registry and site order), spread out by
    kind of move (`diversify`)."""
    machine = machine or DEFAULT_MACHINE
    out = []
    for strategy in registered():  # a strategy not offered on the context's target yields nothing
        limit, at_site = strategy.search_variants or (per_strategy, per_site)
        for t in strategy.transformations(ctx, limit=max(limit, per_strategy), per_site=max(at_site, per_site)):
            out.append(Action(t.strategy, dict(t.params), t.after, t.site.to_json(), prior(t), "library", t))
    if macros:
        out += [macro_action(m) for m in macro_proposals(ctx, machine)]
    gains = [log2_speedup(ctx.program, a.after, machine) + 0.01 * a.prior for a in out]
    order = diversify(gains, [a.move for a in out])
    return [replace(out[i], prior=round(gains[i], 6)) for i in order]


def macro_action(m: Macro) -> Action:
    """A macro as one proposal whose steps are atomic actions of their strategies."""
    steps = tuple(Action(t.strategy, dict(t.params), t.after, t.site.to_json(), 0.0, f"macro:{m.name}", t)
                  for t in m.steps)
    return Action(m.name, dict(m.params), m.after, {}, 0.0, "macro", steps[-1].transformation, steps)


def diversify(scores: list[float], kinds: list[str], penalty: float = DIVERSITY) -> list[int]:
    """Indices of `scores` best first, where each earlier pick of the same kind lowers a candidate's
    score by `penalty` (ties: the given order): the first places go to different kinds of moves
    unless one kind is predicted much better."""
    queues: dict[str, list[int]] = {}
    for i in sorted(range(len(scores)), key=lambda i: (-scores[i], i)):
        queues.setdefault(kinds[i], []).append(i)
    used = dict.fromkeys(queues, 0)
    order = []
    while len(order) < len(scores):
        kind = max((k for k in queues if used[k] < len(queues[k])),
                   key=lambda k: (scores[queues[k][used[k]]] - penalty * used[k], -queues[k][used[k]]))
        order.append(queues[kind][used[kind]])
        used[kind] += 1
    return order


@dataclass
class LibraryPolicy(Policy):
    per_strategy: int = 12
    per_site: int = 3
    macros: bool = True
    machine: Machine | None = None
    name: str = "library"

    def actions(self, ctx: Context, node: Node, want: int) -> Iterator[Action]:
        yield from library_actions(ctx, self.per_strategy, self.per_site, macros=self.macros, machine=self.machine)


@dataclass
class RandomPolicy(Policy):
    seed: int = 0
    per_strategy: int = 12
    per_site: int = 3
    name: str = "random"

    def actions(self, ctx: Context, node: Node, want: int) -> Iterator[Action]:
        acts = library_actions(ctx, self.per_strategy, self.per_site, macros=False)
        acts.sort(key=lambda a: (a.strategy, json.dumps(a.site, sort_keys=True), json.dumps(a.params, sort_keys=True)))
        random.Random(f"{self.seed}:random:{node.alpha}").shuffle(acts)
        yield from acts


# --- llm -------------------------------------------------------------------------------------------

# (transformed_IR, applied_strategy) pairs of a reply; raises ValueError when it does not parse.
AnswerParser = Callable[[str], list[tuple[str, str]]]


def parse_answers(text: str) -> list[tuple[str, str]]:
    """The published format, single or multi answer, read with `json.loads` only."""
    _, body = split_answer(text.strip())
    items = body if isinstance(body, list) else [body]
    out = []
    for item in items:
        if not isinstance(item, dict) or not isinstance(item.get("transformed_IR"), str) \
                or not isinstance(item.get("applied_strategy"), str):
            raise ValueError("an answer item lacks transformed_IR or applied_strategy strings")
        out.append((item["transformed_IR"], item["applied_strategy"]))
    return out


@dataclass(frozen=True)
class LlmConfig:
    base_url: str
    model: str
    api_key: str = ""
    temperature: float = 0.0
    max_tokens: int = 4096
    timeout_s: float = 120.0

    @classmethod
    def from_env(cls, base_url: str | None = None, model: str | None = None, api_key: str | None = None
                 ) -> LlmConfig:
        """Explicit values first, then STEPTP_LLM_BASE_URL, STEPTP_LLM_MODEL, STEPTP_LLM_API_KEY."""
        base = base_url or os.environ.get("STEPTP_LLM_BASE_URL", "")
        name = model or os.environ.get("STEPTP_LLM_MODEL", "")
        if not base or not name:
            raise ValueError("the llm policy needs a base URL and a model (STEPTP_LLM_BASE_URL, STEPTP_LLM_MODEL)")
        return cls(base, name, api_key if api_key is not None else os.environ.get("STEPTP_LLM_API_KEY", ""))


def chat(config: LlmConfig, messages: list[dict], seed: int | None = None) -> str:
    """One chat completion's text (POST /v1/chat/completions)."""
    base = config.base_url.rstrip("/")
    url = base + ("/chat/completions" if base.endswith("/v1") else "/v1/chat/completions")
    body = {"model": config.model, "messages": messages, "temperature": config.temperature,
            "max_tokens": config.max_tokens}
    if seed is not None:
        body["seed"] = seed
    headers = {"Content-Type": "application/json"}
    if config.api_key:
        headers["Authorization"] = f"Bearer {config.api_key}"
    request = urllib.request.Request(url, json.dumps(body).encode(), headers, method="POST")
    with urllib.request.urlopen(request, timeout=config.timeout_s) as response:
        reply = json.loads(response.read().decode("utf-8"))
    return reply["choices"][0]["message"]["content"]


def search_context(node: Node) -> str:
    path = [n for n in node.path()[1:] if n.action is not None]
    if not path:
        return "This is the original program (search depth 0)."
    steps = ", ".join(n.action.strategy for n in path)
    speed = f"{node.speedup:.2f}x" if node.speedup is not None else "unmeasured"
    return (f"This program was reached from the original by {len(path)} verified step(s) ({steps}); "
            f"it runs {speed} faster than the original (search depth {node.depth}).")


@dataclass
class LlmPolicy(Policy):
    """Asks the endpoint for `proposals` options per state (one request per state)."""

    config: LlmConfig
    proposals: int = 3
    seed: int = 0
    parse: AnswerParser = parse_answers
    name: str = "llm"
    rejections: list[dict] = field(default_factory=list)  # why each rejected proposal was rejected
    errors: list[str] = field(default_factory=list)       # failed requests

    def messages(self, ctx: Context, node: Node) -> list[dict]:
        ask = TASK_MULTI.format(k=self.proposals) if self.proposals > 1 else TASK_SINGLE
        task = search_context(node) + "\n" + ask
        return [{"role": "user", "content": prompt(ctx.program, ctx.signature, ctx.target, task=task)}]

    def actions(self, ctx: Context, node: Node, want: int) -> Iterator[Action]:
        try:
            text = chat(self.config, self.messages(ctx, node), seed=self.seed)
        except (urllib.error.URLError, OSError, ValueError, KeyError, IndexError, TypeError) as e:
            self.errors.append(f"{type(e).__name__}: {e}")
            return
        try:
            answers = self.parse(text)
        except Exception as e:  # whatever the parser raises, the reply is rejected
            self.rejections.append({"state": node.id, "reason": f"unparsable answer: {e}"})
            return
        for ir, strategy in answers:
            action, reason = self.to_action(ctx, ir, strategy)
            if action is None:
                self.rejections.append({"state": node.id, "strategy": strategy, "reason": reason})
            else:
                yield action

    def to_action(self, ctx: Context, ir: str, strategy: str) -> tuple[Action | None, str]:
        if strategy not in ALL_NAMES:
            return None, f"unknown strategy {strategy!r}"
        try:
            program = parse_program(ir)
        except LeirError as e:
            return None, f"not LEIR: {e}"
        except RecursionError:
            return None, "not LEIR: nested too deeply"
        problems = validate(program, ctx.signature)
        if problems:
            return None, f"invalid LEIR: {problems[0]}"
        s = get(strategy)
        t = Transformation(strategy, s.level, s.exactness, Site(0), {}, ctx.program, program)
        return Action(strategy, {}, program, {}, 0.0, "llm", t), ""


def make_policy(name: str, seed: int = 0, **options) -> Policy:
    """`library` (options: per_strategy, per_site, macros, machine) / `random` (per_strategy, per_site)
    or `llm` (options: config or base_url/model/api_key, proposals, parse). `ranked=True` (any policy)
    puts the learned cost model (`search.cost_model`) in front: the policy proposes, the model orders
    the proposals. Before the search has timed anything they are ranked by `prior` (a
    `search.cost_model.PriorModel`, the offline model learned from a lake) together with the program's
    own analysis (`analytic`, on by default; `machine`: a `search.analysis.Machine`), weighted by
    `prior_weight` (`search.cost_model.CostModel`)."""
    ranked = bool(options.pop("ranked", False))
    prior = options.pop("prior", None)
    prior_weight = options.pop("prior_weight", None)
    analytic = bool(options.pop("analytic", True))
    machine = options.get("machine") if name == "library" else options.pop("machine", None)
    policy = _base_policy(name, seed, options)
    if ranked:
        from search.cost_model import CostModel, RankedPolicy

        return RankedPolicy(policy, CostModel(seed=seed, prior=prior, analytic=analytic, machine=machine,
                                              prior_weight=prior_weight))
    return policy


def _base_policy(name: str, seed: int, options: dict) -> Policy:
    if name == "library":
        return LibraryPolicy(**options)
    if name == "random":
        return RandomPolicy(seed=seed, **options)
    if name == "llm":
        config = options.pop("config", None) or LlmConfig.from_env(
            options.pop("base_url", None), options.pop("model", None), options.pop("api_key", None))
        return LlmPolicy(config, seed=seed, **options)
    raise ValueError(f"unknown policy {name!r}; policies: {', '.join(POLICIES)}")
