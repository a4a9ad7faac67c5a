"""Inputs of the evaluation harness: a predictions JSONL file, or predictions scored against a split of
the lake (the original, its signature and the prompt come from the lake)."""
from __future__ import annotations

import json
import sys
from pathlib import Path

from evaluation.harness import Prediction


def read_predictions(path: Path | str) -> list[Prediction]:
    """A predictions JSONL file ("-" for stdin), one `Prediction` per non-blank line."""
    text = sys.stdin.read() if str(path) == "-" else Path(path).read_text(encoding="utf-8")
    return parse_predictions(text)


def parse_predictions(text: str) -> list[Prediction]:
    """The predictions of JSONL text, one `Prediction` per non-blank line."""
    return [parse_prediction(n, line) for n, line in enumerate(text.splitlines(), start=1) if line.strip()]


def parse_prediction(lineno: int, text: str) -> Prediction:
    where = f"line {lineno}"
    try:
        obj = json.loads(text)
    except (json.JSONDecodeError, RecursionError) as e:
        return Prediction(None, None, "", "", error=f"{where}: not JSON: {e}")
    if not isinstance(obj, dict):
        return Prediction(None, None, "", "", error=f'{where}: expected an object {{"id", "signature", '
                                                    '"original_IR", "response"}')
    missing = [k for k in ("id", "signature", "original_IR", "response") if k not in obj]
    line_id = obj.get("id")
    if missing:
        return Prediction(line_id, None, "", "", error=f"{where}: missing {', '.join(missing)}")
    if not isinstance(obj["original_IR"], str) or not isinstance(obj["response"], str):
        return Prediction(line_id, None, "", "", error=f"{where}: original_IR and response must be text")
    k = obj.get("k")
    if k is not None and (not isinstance(k, int) or isinstance(k, bool) or k < 1):
        return Prediction(line_id, None, "", "", error=f"{where}: k must be a positive integer")
    prompt = obj.get("prompt") if isinstance(obj.get("prompt"), str) else None
    return Prediction(line_id, obj["signature"], obj["original_IR"], obj["response"], prompt=prompt, k=k)


def lake_predictions(sources: dict[str, tuple[object, str, str]], predictions: list[dict],
                     split: str = "test") -> list[Prediction]:
    """Predictions `{"id" or "sample_id", "response"}` scored against a lake split, given its
    `sources` (sample_id -> (signature, original LEIR, prompt); `flows.lake_queries.split_sources`). Ids
    that are not samples of the split are `input_error`; samples of the split without a prediction
    come last, in sample order, as `missing`."""
    out, seen = [], set()
    for n, obj in enumerate(predictions, start=1):
        if not isinstance(obj, dict):
            error = f'line {n}: expected an object {{"sample_id", "response"}}'
            out.append(Prediction(None, None, "", "", error=error))
            continue
        sample_id, response = obj.get("sample_id", obj.get("id")), obj.get("response")
        if sample_id not in sources:
            out.append(Prediction(sample_id, None, "", "", error=f"line {n}: {sample_id!r} is not a sample of the "
                                                               f"{split} split"))
            continue
        if not isinstance(response, str):
            out.append(Prediction(sample_id, None, "", "", error=f"line {n}: response must be text"))
            continue
        seen.add(sample_id)
        sig, before, prompt = sources[sample_id]
        out.append(Prediction(sample_id, sig, before, response, prompt=prompt))
    for sample_id in sorted(set(sources) - seen):
        out.append(Prediction(sample_id, None, "", "", error="no prediction for this sample", error_status="missing"))
    return out
