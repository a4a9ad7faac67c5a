"""Reading the published Step-TP release (chat-template JSONL) as predictions to re-verify.

Each line is `{"messages": [{"role": "user", "content": PROMPT}, {"role": "assistant", "content": ANSWER}]}`
(a system message first is allowed). From the prompt come:
- the original program: the first quote- or line-delimited piece of the prompt that starts with a
  loop header and parses as LEIR (`parse_program`; the published prompts quote it,
  `Give the following IR of M: '<LEIR>', where ...`, ours put it on a line of its own);
- the signature: the known tensors in the published wording
  `'A' with the dtype torch.float32 and shape torch.Size([16, 64]), ..., and 'D' with ...`, read by a
  strict parser of that wording (the pieces must follow each other with nothing but `, `, `, and `
  or ` and ` between them), in the order stated;
- which known tensor is the output: the wording does not say, and the published order is not always
  inputs-then-output, so the output is every known tensor that the program *writes* (inputs are
  never written; an accumulator such as `C=C+b` is read too, so "written but never read" would miss
  it). The published format has exactly one; a line whose program writes none is malformed.
"""
from __future__ import annotations

import json
import re
from pathlib import Path

from evaluation.harness import Prediction
from leir.analysis import statement_sites
from leir.ast import Program
from leir.errors import LeirError
from leir.parse import parse_program
from leir.signature import Signature

_TENSOR = re.compile(r"'(?P<name>[A-Z][a-z]*)' with the dtype torch\.(?P<dtype>[a-z0-9_]+) "
                     r"and shape torch\.Size\(\[(?P<shape>[0-9, ]*)\]\)")
_SEPARATORS = (", ", ", and ", " and ")
_LOOP_START = re.compile(r"[LPVUB]\^\{")


class PublishedFormatError(ValueError):
    """A published line whose prompt does not state a program and its known tensors."""


def program_from_prompt(prompt: str) -> tuple[str, Program]:
    """(LEIR text, program) of the first piece of the prompt that is a LEIR program."""
    for piece in re.split(r"['\n]", prompt):
        piece = piece.strip()
        if not _LOOP_START.match(piece):
            continue
        try:
            return piece, parse_program(piece)
        except (LeirError, RecursionError):
            continue
    raise PublishedFormatError("the prompt states no LEIR program")


def tensors_from_prompt(prompt: str) -> list[tuple[str, str, list[int]]]:
    """(name, dtype, shape) of every known tensor, in the order the prompt states them."""
    matches = list(_TENSOR.finditer(prompt))
    if not matches:
        raise PublishedFormatError("the prompt states no known tensors "
                                   "('X' with the dtype torch.D and shape torch.Size([...]))")
    for a, b in zip(matches, matches[1:], strict=False):
        gap = prompt[a.end():b.start()]
        if gap not in _SEPARATORS:
            raise PublishedFormatError(f"unexpected text {gap!r} between the known tensors {a['name']} and {b['name']}")
    out = []
    for m in matches:
        dims = [d.strip() for d in m["shape"].split(",")] if m["shape"].strip() else []
        if any(not d.isdigit() for d in dims):
            raise PublishedFormatError(f"bad shape torch.Size([{m['shape']}]) of {m['name']}")
        out.append((m["name"], m["dtype"], [int(d) for d in dims]))
    return out


def signature_from_prompt(prompt: str, program: Program) -> Signature:
    """The signature: the stated tensors, role `output` for those the program writes."""
    tensors = tensors_from_prompt(prompt)
    written = {site.stmt.lhs.tensor for site in statement_sites(program)}
    names = [name for name, _, _ in tensors]
    if not written & set(names):
        raise PublishedFormatError(f"the program writes none of the known tensors {', '.join(names)}")
    obj = {"tensors": [{"name": name, "shape": shape, "dtype": dtype, "role": "output" if name in written else "input"}
                       for name, dtype, shape in tensors]}
    try:
        return Signature.from_json(obj)
    except LeirError as e:
        raise PublishedFormatError(f"known tensors: {e}") from None


def chat_messages(obj) -> tuple[str, str]:
    """(user prompt, assistant answer) of one chat-template record."""
    messages = obj.get("messages") if isinstance(obj, dict) else None
    if not isinstance(messages, list):
        raise PublishedFormatError('expected {"messages": [user prompt, assistant answer]}')
    messages = [m for m in messages if not (isinstance(m, dict) and m.get("role") == "system")]
    if len(messages) != 2 or not all(isinstance(m, dict) and isinstance(m.get("content"), str) for m in messages):
        raise PublishedFormatError("expected exactly a user message and an assistant message with text content")
    user, assistant = messages
    if user.get("role", "user") != "user" or assistant.get("role", "assistant") != "assistant":
        raise PublishedFormatError("expected the user message first, then the assistant message")
    return user["content"], assistant["content"]


def published_predictions(path: Path) -> list[Prediction]:
    """Each line of a published JSONL file as a `Prediction` (malformed lines carry their error)."""
    return published_from_text(Path(path).read_text(encoding="utf-8"))


def published_from_text(text: str) -> list[Prediction]:
    """Each line of published JSONL text as a `Prediction` (malformed lines carry their error)."""
    out = []
    for lineno, line in enumerate(text.splitlines(), start=1):
        if not line.strip():
            continue
        line_id = f"line {lineno}"
        try:
            prompt, answer = chat_messages(json.loads(line))
            text, program = program_from_prompt(prompt)
            signature = signature_from_prompt(prompt, program)
        except (json.JSONDecodeError, PublishedFormatError) as e:
            out.append(Prediction(line_id, None, "", "", error=f"{line_id}: {e}"))
            continue
        out.append(Prediction(line_id, signature.to_json(), text, answer, prompt=prompt))
    return out
