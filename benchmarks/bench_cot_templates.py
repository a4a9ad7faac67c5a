"""Distinct CoT templates per strategy (numbers and names abstracted, flows.reports.template) in the
released samples of one or two lakes: `python benchmarks/bench_cot_templates.py LAKE [BASELINE_LAKE]`.
Prints per strategy the CoTs and templates (and the baseline's, when given), then the medians; and,
to show that the variety is not only the list of options, the median once the `Options:` and `By the
figures:` lines are dropped as well."""
from __future__ import annotations

import sys
from pathlib import Path

import duckdb

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from flows.reports import cot_templates  # noqa: E402


def released(lake: str, without_options: bool = False) -> dict:
    table = duckdb.sql(f"select answer, strategies from read_parquet('{lake}/samples/*.parquet')").to_arrow_table()
    if without_options:
        import pyarrow as pa

        from strategies.cot import split_answer

        def drop(answer: str) -> str:
            think, _ = split_answer(answer)
            kept = [x for x in think.splitlines() if not x.startswith(("Options:", "By the figures:"))]
            return answer.replace(think, "\n".join(kept), 1)

        table = pa.table({"answer": [drop(a) for a in table.column("answer").to_pylist()],
                          "strategies": table.column("strategies")})
    return cot_templates(table)


def main(argv: list[str]) -> None:
    after = released(argv[0])
    before = released(argv[1]) if len(argv) > 1 else None
    names = sorted(set(after["strategies"]) | set(before["strategies"] if before else ()))
    print(f"{'strategy':58} {'cots':>6} {'templ':>6}" + (f" {'base cots':>9} {'base templ':>10}" if before else ""))
    for name in names:
        a = after["strategies"].get(name, {"cots": 0, "templates": 0})
        line = f"{name:58} {a['cots']:>6} {a['templates']:>6}"
        if before:
            b = before["strategies"].get(name, {"cots": 0, "templates": 0})
            line += f" {b['cots']:>9} {b['templates']:>10}"
        print(line)
    print(f"median templates per strategy: {after['median_templates']} ({after['cots']} CoTs, "
          f"{after['templates']} templates)")
    strict = released(argv[0], without_options=True)
    print(f"median without the options lines: {strict['median_templates']} ({strict['templates']} templates)")
    if before:
        print(f"baseline median: {before['median_templates']} ({before['cots']} CoTs, {before['templates']} templates)")


if __name__ == "__main__":
    main(sys.argv[1:])
