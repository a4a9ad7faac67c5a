"""The strategy survey: per strategy, where it applies on a set of programs, how
many transformations it makes, and how many of the applied ones verify as the strategy declares.

Program states: every given program (an original); for the mathematical strategies also the results
of one compute_inline step (as the transform stage does, up to `inline_cap` per program). Per
program and strategy the transformations (at most `per_site` parameter variants per site) are
counted, and a seeded sample of at most `cap` of them is verified.

This module only enumerates and counts. Verification is passed in as `verify(items) -> results`
(items: (transformation, signature) pairs; results: objects with `status` and `error`, such as
`gpu_tasks.verify.verify_pairs` in a worker pool), so that `strategies` imports neither TVM nor the
catalogue (dependencies point one way: tests/test_architecture.py); `steptp strategies survey` wires them in.
"""
from __future__ import annotations

import json
import random
import time
from collections import Counter
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field, replace

from leir.signature import Signature
from strategies.base import Context, Strategy, Transformation
from strategies.registry import get, registered

ACCEPTED = {"exact": ("exact",), "reassociating": ("exact", "close")}
MAX_FAILURES = 3              # failing applications quoted per strategy

Verify = Callable[[list[tuple[Transformation, Signature]]], Sequence]


@dataclass(frozen=True)
class SurveyProgram:
    name: str
    context: Context


@dataclass
class StrategyRow:
    strategy: str
    level: str
    exactness: str
    programs_with_sites: int = 0   # programs where it has a legal site (original or one inline step)
    sites: int = 0                 # legal sites: distinct sites with a legal, non-trivial variant
    transformations: int = 0       # legal transformations enumerated (per_site variants per site)
    applications: int = 0          # transformations verified (sampled, `cap` per program)
    statuses: Counter = field(default_factory=Counter)
    failures: list[str] = field(default_factory=list)
    seconds: float = 0.0           # enumeration time
    # `close` results of variants that declare themselves reassociating inside an exact strategy
    # (loop_vectorization with fast_exp): a pass for that variant, not for the strategy's class
    close_variants: int = 0

    @property
    def passed(self) -> int:
        return sum(self.statuses[s] for s in ACCEPTED[self.exactness]) + self.close_variants

    @property
    def pass_rate(self) -> float | None:
        return self.passed / self.applications if self.applications else None

    def to_json(self) -> dict:
        return {"strategy": self.strategy, "level": self.level, "exactness": self.exactness,
                "programs_with_sites": self.programs_with_sites, "sites": self.sites,
                "transformations": self.transformations, "applications": self.applications,
                "passed": self.passed, "pass_rate": self.pass_rate, "statuses": dict(sorted(self.statuses.items())),
                "failures": self.failures, "seconds": round(self.seconds, 3)}


@dataclass
class Survey:
    programs: list[str]
    rows: list[StrategyRow]
    settings: dict

    def to_json(self) -> dict:
        return {"programs": self.programs, "settings": self.settings, "strategies": [r.to_json() for r in self.rows]}

    def table(self) -> str:
        """A markdown table, one row per strategy, then the totals."""
        head = ("| strategy | level | exactness | programs with sites | sites | transformations | applications "
                "| passed | pass rate | other statuses |")
        lines = [head, "|" + "---|" * 10]
        for r in self.rows:
            rate = "-" if r.pass_rate is None else f"{100 * r.pass_rate:.1f}%"
            other = ", ".join(f"{s} {n}" for s, n in sorted(r.statuses.items()) if s not in ACCEPTED[r.exactness])
            lines.append(f"| {r.strategy} | {r.level} | {r.exactness} | {r.programs_with_sites}/{len(self.programs)} "
                         f"| {r.sites} | {r.transformations} | {r.applications} | {r.passed} | {rate} | {other} |")
        apps = sum(r.applications for r in self.rows)
        ok = sum(r.passed for r in self.rows)
        lines.append(f"| **total** | | | | {sum(r.sites for r in self.rows)} | "
                     f"{sum(r.transformations for r in self.rows)} | {apps} | {ok} | "
                     f"{'-' if not apps else f'{100 * ok / apps:.1f}%'} | |")
        return "\n".join(lines)


def program_states(program: SurveyProgram, strategy: Strategy, inline: list[Context]) -> list[Context]:
    """The states a strategy is tried on: the original, on a target the strategy is offered on (the
    survey checks every strategy, so a GPU-only one is tried on the program's CUDA twin and a CPU-only
    one on its CPU twin), and for a mathematical strategy the results of one compute_inline step."""
    ctx = program.context
    if not strategy.offered(ctx):
        ctx = replace(ctx, target=strategy.targets[0])
    return [ctx] + (inline if strategy.level == "mathematical" else [])


def sample(items: list, cap: int | None, key: str) -> list:
    """At most `cap` items, a seeded choice that keeps their order."""
    if cap is None or len(items) <= cap:
        return items
    return [items[i] for i in sorted(random.Random(key).sample(range(len(items)), cap))]


def survey(programs: Iterable[SurveyProgram], verify: Verify, strategies: Sequence[str] | None = None,
           cap: int | None = 2, per_site: int | None = 2, inline_cap: int = 2, seed: int = 0,
           progress: Callable[[str], None] | None = None) -> Survey:
    """Enumerate every strategy on every program state, then verify the sampled applications in one
    batch (so that a worker pool sees them all at once)."""
    chosen = [get(n) for n in strategies] if strategies else registered()
    rows = {s.name: StrategyRow(s.name, s.level, s.exactness) for s in chosen}
    programs = list(programs)
    pending: list[tuple[str, str, Transformation, Signature]] = []  # (strategy, program, ...)
    for p in programs:
        inline = [p.context.with_program(t.after)
                  for t in get("compute_inline").transformations(p.context, limit=inline_cap)] if inline_cap > 0 else []
        for s in chosen:
            row, start = rows[s.name], time.perf_counter()
            found: list[Transformation] = []
            for state in program_states(p, s, inline):
                found.extend(s.transformations(state, per_site=per_site))
            row.seconds += time.perf_counter() - start
            sites = {(t.before_text, json.dumps(t.site.to_json(), sort_keys=True)) for t in found}
            row.sites += len(sites)
            row.transformations += len(found)
            row.programs_with_sites += bool(found)
            for t in sample(found, cap, f"survey:{seed}:{s.name}:{p.name}"):
                pending.append((s.name, p.name, t, p.context.signature))
        if progress:
            progress(p.name)
    results = verify([(t, sig) for _, _, t, sig in pending]) if pending else []
    for (name, program, t, _), v in zip(pending, results, strict=True):
        row = rows[name]
        row.applications += 1
        row.statuses[v.status] += 1
        if v.status not in ACCEPTED[row.exactness] and v.status in ACCEPTED[t.exactness]:
            row.close_variants += 1
        elif v.status not in ACCEPTED[row.exactness] and len(row.failures) < MAX_FAILURES:
            error = getattr(v, "error", "") or ""
            detail = error.splitlines()[0][:160] if error else ""
            row.failures.append(f"{program}: {v.status}: site {json.dumps(t.site.to_json())} params "
                                f"{t.params_json()} {detail}".strip())
    settings = {"cap": cap, "per_site": per_site, "inline_cap": inline_cap, "seed": seed}
    return Survey([p.name for p in programs], [rows[s.name] for s in chosen], settings)
