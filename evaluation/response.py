"""Reading a model's response for the evaluation harness: lenient with layout, strict with content.

A response is `<think>...</think><answer>{json}</answer>`. Tolerated: whitespace around and between
the parts, and Markdown code fences (```` ``` ```` or ```` ```json ````) around the whole response or
around the JSON inside `<answer>`. Required: nothing but whitespace before `<think>` and after
`</answer>`; the JSON parsed with `json.loads` (never `eval`); a single answer is exactly
`{"transformed_IR": str, "applied_strategy": str}`, a multi answer a non-empty list of exactly
`{"idx": int, "transformed_IR": str, "applied_strategy": str}`.

Guards run on the text before anything is parsed: the size of the response, code that has no
business in an answer (`__import__`, `eval(`, ...; the JSON is never evaluated, but such an answer is
hostile and reported as `rejected`), the bracket depth of the JSON and of each IR (a 1000-deep
nesting would exhaust the recursion of a parser or of a tree walk), and the size of each IR.
"""
from __future__ import annotations

import json
import re
from dataclasses import dataclass

MAX_RESPONSE_CHARS = 1_000_000  # a long chain of thought is ~100k characters
MAX_IR_CHARS = 200_000
MAX_JSON_DEPTH = 16  # a multi answer is 2 deep
MAX_IR_DEPTH = 64  # realistic LEIR stays below 10 (nested nests, subscripts, gathers, parentheses)
MAX_ITEMS = 64

STRATEGY_KEY = "applied_strategy"
# Markers of code in an answer. LEIR contains none of them (no `_` outside `^{}`/`_{}`, and no
# letters `t` or `p` in index names), so they never reject a valid IR.
_INJECTION = re.compile(r"__|\bimport\b|\beval\s*\(|\bexec\s*\(|\bcompile\s*\(|\bos\.|\bsubprocess\b|\blambda\b")
_FENCE_OPEN = re.compile(r"\A```[A-Za-z0-9_-]*[ \t]*\n?")
_FENCE_CLOSE = re.compile(r"\n?[ \t]*```\Z")
# "Propose 3 different ..." (TASK_MULTI) and the published "give me at least 3 different ...".
_REQUESTED = re.compile(r"\b[Pp]ropose\s+(?P<exact>\d+)\s+different\b|\bat least\s+(?P<least>\d+)\s+different\b")


class ResponseError(Exception):
    """Why a response cannot be scored: `kind` is `format_error` or `rejected` (a guard)."""

    def __init__(self, kind: str, message: str):
        super().__init__(message)
        self.kind = kind


@dataclass(frozen=True, slots=True)
class AnswerItem:
    transformed_ir: str
    strategy: str
    idx: int | None = None


@dataclass(frozen=True, slots=True)
class ParsedResponse:
    items: tuple[AnswerItem, ...]
    multi: bool


@dataclass(frozen=True, slots=True)
class Requested:
    """How many answers a prompt asks for: exactly `count`, or `at_least` that many."""

    count: int
    at_least: bool = False

    def satisfied_by(self, n: int) -> bool:
        return n >= self.count if self.at_least else n == self.count


def requested_answers(prompt: str | None) -> Requested | None:
    """The number of answers a multi-answer prompt asks for; None for a single-answer prompt."""
    if not prompt:
        return None
    m = _REQUESTED.search(prompt)
    if m is None:
        return None
    if m.group("exact"):
        return Requested(int(m.group("exact")))
    return Requested(int(m.group("least")), at_least=True)


def parse_response(text: str, *, bare_json: bool = False, strategy_keys: tuple[str, ...] = (STRATEGY_KEY,)
                   ) -> ParsedResponse:
    """The answer items of `text`; `ResponseError` otherwise. `bare_json` also accepts a response that
    is only the JSON (the published labels without chain of thought); `strategy_keys` are the accepted
    spellings of the strategy key (the published prompts ask for `applied_strategies`)."""
    if not isinstance(text, str):
        raise ResponseError("format_error", "the response is not text")
    if len(text) > MAX_RESPONSE_CHARS:
        raise ResponseError("rejected", f"response of {len(text):,} characters exceeds the limit of "
                                        f"{MAX_RESPONSE_CHARS:,}")
    body = answer_body(text, bare_json)
    found = _INJECTION.search(body)
    if found:
        raise ResponseError("rejected", f"code injection attempt in the answer ({_around(body, found)!r}); "
                                        "nothing was evaluated")
    depth = json_depth(body)
    if depth > MAX_JSON_DEPTH:
        raise ResponseError("rejected", f"JSON nesting depth {depth} exceeds the limit of {MAX_JSON_DEPTH}")
    try:
        value = json.loads(body)
    except (json.JSONDecodeError, RecursionError) as e:
        raise ResponseError("format_error", f"the answer is not JSON: {e}") from None
    if isinstance(value, dict):
        return ParsedResponse((_item(value, strategy_keys, with_idx=False, where="the answer"),), multi=False)
    if isinstance(value, list):
        if not value:
            raise ResponseError("format_error", "the answer list is empty")
        if len(value) > MAX_ITEMS:
            raise ResponseError("rejected", f"{len(value)} answers exceed the limit of {MAX_ITEMS}")
        items = tuple(_item(v, strategy_keys, with_idx=True, where=f"answer item {i + 1}") for i, v in enumerate(value))
        return ParsedResponse(items, multi=True)
    raise ResponseError("format_error", f"the answer is a JSON {type(value).__name__}, expected an object or a list")


def answer_body(text: str, bare_json: bool = False) -> str:
    """The JSON text inside `<answer>`, fences and surrounding whitespace removed."""
    text = strip_fences(text.strip())
    if not text.startswith("<think>"):
        if bare_json and not text.startswith("<"):
            return strip_fences(text)
        raise ResponseError("format_error", "the response must start with <think>")
    _, closed, rest = text[len("<think>"):].partition("</think>")
    if not closed:
        raise ResponseError("format_error", "<think> is not closed by </think>")
    rest = rest.lstrip()
    if not rest.startswith("<answer>"):
        raise ResponseError("format_error", "</think> must be followed by <answer>")
    body, closed, tail = rest[len("<answer>"):].partition("</answer>")
    if not closed:
        raise ResponseError("format_error", "<answer> is not closed by </answer>")
    if tail.strip():
        raise ResponseError("format_error", "text after </answer>")
    return strip_fences(body.strip())


def strip_fences(text: str) -> str:
    """`text` without one Markdown code fence around it (opening with an optional language tag)."""
    if text.startswith("```") and text.endswith("```") and len(text) >= 6:
        inner = _FENCE_CLOSE.sub("", _FENCE_OPEN.sub("", text, count=1), count=1)
        return inner.strip()
    return text


def json_depth(text: str) -> int:
    """The deepest nesting of `[`/`{` outside JSON strings (a scan, no parsing)."""
    depth = deepest = 0
    in_string = escaped = False
    for ch in text:
        if in_string:
            if escaped:
                escaped = False
            elif ch == "\\":
                escaped = True
            elif ch == '"':
                in_string = False
        elif ch == '"':
            in_string = True
        elif ch in "[{":
            depth += 1
            deepest = max(deepest, depth)
        elif ch in "]}":
            depth -= 1
    return deepest


def bracket_depth(text: str) -> int:
    """The deepest nesting of `(`, `[` and `{` in LEIR text."""
    depth = deepest = 0
    for ch in text:
        if ch in "([{":
            depth += 1
            deepest = max(deepest, depth)
        elif ch in ")]}":
            depth -= 1
    return deepest


def ir_text_problem(ir: str) -> str:
    """Why LEIR text must not even be parsed ("" when it may): size, nesting depth, code."""
    if len(ir) > MAX_IR_CHARS:
        return f"IR of {len(ir):,} characters exceeds the limit of {MAX_IR_CHARS:,}"
    depth = bracket_depth(ir)
    if depth > MAX_IR_DEPTH:
        return f"IR nesting depth {depth} exceeds the limit of {MAX_IR_DEPTH}"
    found = _INJECTION.search(ir)
    if found:
        return f"code injection attempt in the IR ({_around(ir, found)!r}); nothing was evaluated"
    return ""


def _item(value, strategy_keys: tuple[str, ...], *, with_idx: bool, where: str) -> AnswerItem:
    if not isinstance(value, dict):
        raise ResponseError("format_error", f"{where} is not a JSON object")
    keys = set(value)
    strategy_key = next((k for k in strategy_keys if k in keys), strategy_keys[0])
    expected = {"transformed_IR", strategy_key} | ({"idx"} if with_idx else set())
    missing, extra = sorted(expected - keys), sorted(keys - expected)
    if missing or extra:
        parts = [f"missing {', '.join(missing)}"] if missing else []
        parts += [f"unexpected {', '.join(extra)}"] if extra else []
        raise ResponseError("format_error", f"{where}: {'; '.join(parts)}")
    ir, strategy = value["transformed_IR"], value[strategy_key]
    if not isinstance(ir, str) or not isinstance(strategy, str):
        raise ResponseError("format_error", f"{where}: transformed_IR and {strategy_key} must be strings")
    idx = value.get("idx")
    if with_idx and (not isinstance(idx, int) or isinstance(idx, bool)):
        raise ResponseError("format_error", f"{where}: idx must be an integer")
    return AnswerItem(ir.strip(), strategy.strip(), idx)


def _around(text: str, match: re.Match, width: int = 24) -> str:
    return text[max(0, match.start() - 4):match.end() + width]
