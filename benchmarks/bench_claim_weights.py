"""The claim/effect contradictions of a release's resolved timed steps under other weights of the static
estimate (strategies.analysis.cost.Estimate), without a rebuild:

    python benchmarks/bench_claim_weights.py RELEASE_DIR --lake LAKE [--set latency=4 --set latency=4,issue=2 ...]

Each step's `benefit` claim is recomputed from its before and after programs as the CoT decides it
(a figure improves and the weighed estimate drops by BENEFIT_WEIGHED); a step that loses its benefit
claim is counted as `none` (the steps it enables are not recomputed here). Prints, for the project's
weights and then each `--set` variant (the weights it names changed), the contradictions (`benefit` with
`slower`, or `none` with `faster` by 1.2x or more) of all resolved timed steps, the ratio to the 3%
goal, and the claims that changed. The baseline row must reproduce bench_decisions.py's figure.
"""
from __future__ import annotations

import argparse
import dataclasses
import sys
from pathlib import Path

import duckdb

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from leir import parse_program  # noqa: E402
from strategies import cot  # noqa: E402
from strategies.analysis.cost import ESTIMATE, estimated_cycles  # noqa: E402
from strategies.analysis.tree import changed_nests  # noqa: E402


@dataclasses.dataclass(frozen=True)
class Step:
    strategy: str
    before: object
    after: object


def contradicts(claim: str, effect: str, speedup: float) -> bool:
    return (claim == "benefit" and effect == "slower") or (claim == "none" and effect == "faster" and speedup >= 1.2)


def claim_under(step: Step, claim: str, target: str, weights) -> str:
    gains = cot.assess(step, target).gains
    b_range, a_range = changed_nests(step.before, step.after)
    after = estimated_cycles(step.after, a_range, target, weights)
    weighed = estimated_cycles(step.before, b_range, target, weights) / after if after > 0 else float("inf")
    if gains and weighed >= cot.BENEFIT_WEIGHED:
        return "benefit"
    return "none" if claim == "benefit" else claim


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("release", type=Path, nargs="?", default=Path("lake/releases/v0.1.0"),
                        help="a release directory (default: the one make run writes)")
    parser.add_argument("--lake", type=Path, default=Path("lake"),
                        help="the lake the release was built from (targets; default: make run's)")
    parser.add_argument("--set", action="append", default=[], metavar="NAME=VALUE",
                        help="Estimate weights to try instead of the project's, comma-separated "
                             "(latency=4,issue=2); repeatable: one row each")
    args = parser.parse_args()
    con = duckdb.connect()
    rows = con.execute(f"""
        SELECT m.strategy, m.claim, m.effect, m.speedup, m.before_leir, m.after_leir, p.target
        FROM read_parquet('{args.release / 'measured'}/*.parquet') m
        JOIN read_parquet('{args.lake / 'programs'}/*.parquet') p USING (program_id)
        WHERE m.effect IN ('faster', 'neutral', 'slower') ORDER BY m.step_id""").fetchall()
    steps = [(Step(s, parse_program(b), parse_program(a)), claim, effect, sp, target)
             for s, claim, effect, sp, b, a, target in rows]
    variants = [("project's weights", ESTIMATE)]
    weights = {f.name for f in dataclasses.fields(ESTIMATE)}
    for item in args.set:
        changes = {}
        for pair in item.split(","):
            name, _, value = pair.partition("=")
            if name not in weights:
                parser.error(f"--set {item}: Estimate has no weight {name!r}")
            kind = type(getattr(ESTIMATE, name))
            try:
                changes[name] = kind(value)
            except ValueError:
                parser.error(f"--set {item}: {name} takes a number ({kind.__name__}), not {value!r}")
        variants.append((item, dataclasses.replace(ESTIMATE, **changes)))
    for label, weights in variants:
        changed: dict[tuple, int] = {}
        bad = 0
        for step, claim, effect, speedup, target in steps:
            new = claim_under(step, claim, target, weights)
            if new != claim:
                changed[(claim, new, effect)] = changed.get((claim, new, effect), 0) + 1
            bad += contradicts(new, effect, speedup)
        share = bad / len(steps) if steps else 0.0
        print(f"{label}: contradictions {bad} of {len(steps)} resolved timed steps ({share:.1%}; goal at most 3%, "
              f"ratio {share / 0.03:.2f})")
        for (old, new, effect), n in sorted(changed.items()):
            print(f"  {old} -> {new} on {effect} steps: {n}")


if __name__ == "__main__":
    main()
