"""Parse+format and validation throughput of LEIR.

Corpus: the golden examples, and programs of about 1,000 characters made by chaining example nests
(renamed apart is not needed for parsing). Prints programs/s on one core for the median program of
the corpus and for the ~1,000-character programs, and the ratio against two baselines: the goal
(500 programs/s per core at ~1,000 characters) and Lark's stock LALR parser on the same grammar.
"""
from __future__ import annotations

import json
import statistics
import time
from pathlib import Path

from leir import Signature, format_program, parse_program
from leir.parse import parse_with_spec
from leir.validate import validate

ROOT = Path(__file__).resolve().parent.parent
GOAL_PER_S = 500


def corpus() -> tuple[list[str], list[str], list[Signature]]:
    rows = [json.loads(x) for x in (ROOT / "tests/data/programs.jsonl").read_text().splitlines() if x]
    texts = [r["leir"] for r in rows]
    long = []
    for r in rows:
        text = r["leir"]
        while len(text) < 950:
            text += r["leir"]
        long.append(text)
    return texts, long, [Signature.from_json(r["signature"]) for r in rows]


def rate(fn, items, seconds=1.5) -> float:
    """Items per CPU-second of this process (one core: the code is single-threaded, and CPU time
    does not count the time other processes take the core), median of 5 rounds."""
    rates = []
    for _ in range(5):
        n, start = 0, time.process_time()
        while time.process_time() - start < seconds / 5:
            for it in items:
                fn(it)
            n += len(items)
        rates.append(n / (time.process_time() - start))
    return statistics.median(rates)


def main():
    texts, long, sigs = corpus()
    median_text = sorted(texts, key=len)[len(texts) // 2]
    long_chars = statistics.median(len(t) for t in long)
    round_trip = lambda t: format_program(parse_program(t))  # noqa: E731
    med = rate(round_trip, [median_text])
    big = rate(round_trip, long)
    stock = rate(lambda t: format_program(parse_with_spec(t)), long)
    pairs = [(parse_program(t), s) for t, s in zip(texts, sigs, strict=True)]
    val = rate(lambda ps: validate(*ps), pairs)
    print(f"parse+format, median corpus program ({len(median_text)} chars): {med:,.0f} programs/s")
    print(f"parse+format, ~{long_chars:.0f}-char programs: {big:,.0f} programs/s "
          f"(goal {GOAL_PER_S}/s per core: ratio {big / GOAL_PER_S:.2f}x)")
    print(f"stock Lark LALR (contextual lexer, same grammar), ~{long_chars:.0f}-char programs: {stock:,.0f} "
          f"programs/s; ours is {big / stock:.2f}x")
    print(f"validation, corpus programs (median {statistics.median(len(t) for t in texts):.0f} chars): "
          f"{val:,.0f} programs/s")


if __name__ == "__main__":
    main()
