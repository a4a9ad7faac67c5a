"""Chain of thought and prompts, rendered from the transformation record (never from a text diff).

The think block has four parts: (1) the strategy and why it can pay off here, with this program's
numbers; (2) where it applies; (3) the legality facts that were checked; (4) the exact state
transition, quoting the affected nests before and after. The answer is the published format:
`<think>...</think><answer>{"transformed_IR": ..., "applied_strategy": ...}</answer>`.
"""
from __future__ import annotations

import json

from leir.ast import Program
from leir.printer import format_nest
from leir.signature import Signature
from strategies.analysis.tree import changed_nests
from strategies.base import Context, Transformation

TASK_SINGLE = ("Apply exactly one optimization strategy to this LEIR program. Keep the known tensors "
               "(names, shapes, dtypes, global scope) unchanged and preserve the result. Reply with "
               "<think>your reasoning</think><answer>{\"transformed_IR\": ..., \"applied_strategy\": ...}</answer>.")


def prompt(program: Program, signature: Signature, target: str = "llvm", task: str = TASK_SINGLE) -> str:
    from leir.printer import format_program

    device = "a GPU (CUDA)" if target == "cuda" else "a CPU (LLVM)"
    return (f"The following tensor program is written in LEIR and will run on {device}:\n"
            f"{format_program(program)}\n"
            f"The known tensors are {signature.describe()}.\n{task}")


def think(t: Transformation, ctx: Context | None = None) -> str:
    before_range, after_range = changed_nests(t.before, t.after)
    lines = [f"Strategy: {t.strategy} ({t.level} level). {t.effect}".rstrip()]
    lines.append(f"Where: {t.site.describe()}.")
    if t.params:
        lines.append("Parameters: " + ", ".join(f"{k}={_param(v)}" for k, v in t.params.items()) + ".")
    if t.facts:
        lines.append("Legality checked:")
        lines.extend(f"- {fact}" for fact in t.facts)
    if t.exactness == "reassociating":
        lines.append("Floating-point operations are reordered, so results agree within rounding, "
                     "not bit for bit.")
    lines.append("Before:" + _quote(t.before, before_range))
    lines.append("After:" + _quote(t.after, after_range))
    return "\n".join(lines)


def answer(t: Transformation) -> str:
    body = json.dumps({"transformed_IR": t.after_text, "applied_strategy": t.strategy}, ensure_ascii=False)
    return f"<think>{think(t)}</think><answer>{body}</answer>"


def multi_answer(ts: list[Transformation]) -> str:
    """A multi-answer sample: one think block, a list of {"idx", "transformed_IR", "applied_strategy"}."""
    thoughts = "\n\n".join(f"Option {i + 1}:\n{think(t)}" for i, t in enumerate(ts))
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


def combine_answers(answers: list[str]) -> str:
    """A multi-answer sample from single answers (each in the published format)."""
    thoughts, items = [], []
    for i, text in enumerate(answers, start=1):
        think_text, body = split_answer(text)
        thoughts.append(f"Option {i}:\n{think_text}")
        items.append({"idx": i, "transformed_IR": body["transformed_IR"], "applied_strategy": body["applied_strategy"]})
    return f"<think>{chr(10).join(thoughts)}</think><answer>{json.dumps(items, ensure_ascii=False)}</answer>"
