"""The release gate: Great Expectations suites over the tables of a release.

`check_release(samples, steps, producible, params)` derives the frames the suites need (answers
parsed, the family of each sample, strategy shares, the strategies the selection can produce but
the release lacks), runs one GX validation per frame, and returns a `GateReport` whose `failures`
read as sentences. A release is made only when `report.success` is true.
"""
from __future__ import annotations

import json
import os
from dataclasses import dataclass, field

import pandas as pd

from strategies.registry import ALL_NAMES, LEVEL_OF

STATUSES = ["exact", "close", "mismatch", "build_error", "runtime_error", "timeout", "crash", "invalid"]
SAMPLE_COLUMNS = ["sample_id", "split", "prompt", "answer", "step_ids", "strategies", "prompt_tokens",
                  "answer_tokens", "structural_overlap"]  # overlap with the other split
STEP_COLUMNS = ["step_id", "program_id", "strategy", "level", "before_leir", "after_leir", "exactness", "status",
                "family", "unit_loop_scheduled"]


@dataclass
class GateReport:
    success: bool
    failures: list[str] = field(default_factory=list)
    checked: int = 0

    def to_json(self) -> dict:
        return {"success": self.success, "expectations_checked": self.checked, "failures": self.failures}

    def text(self) -> str:
        head = f"release gate: {'passed' if self.success else 'FAILED'} ({self.checked} expectations)"
        return "\n".join([head, *(f"- {f}" for f in self.failures)])


SCHEDULING_KINDS = ("P", "V", "U", "B")  # parallel, vectorised, unrolled, bound: meaningless on one iteration


def unit_scheduled_loops(leir_text: str) -> set[tuple[str, str]]:
    """The (kind, index) of the loops of extent 1 the program marks parallel, vectorised, unrolled or
    bound."""
    from leir.analysis import iter_nests
    from leir.parse import parse_program

    return {(lp.kind, lp.var) for nest, _ in iter_nests(parse_program(leir_text)) for lp in nest.loops
            if lp.extent == 1 and lp.kind in SCHEDULING_KINDS}


def adds_unit_scheduled_loop(before: str | None, after: str) -> bool:
    """Whether a step parallelises, vectorises, unrolls or binds a loop of extent 1 (originals bind
    the extent-1 loop of a 0-d result themselves: only loops the step adds count). A nest the step
    adds with a copy of such a loop (the combining nest of a reduction split keeps the original's
    `B^{1}_{tx=0}`) schedules nothing new: the same kind and index were there before."""
    return bool(unit_scheduled_loops(after) - (unit_scheduled_loops(before) if before else set()))


def derive_frames(samples: pd.DataFrame, steps: pd.DataFrame, producible: list[str]) -> dict[str, pd.DataFrame]:
    """The frames the suites check, computed from the release tables."""
    from strategies.cot import split_answer

    after_by_step = dict(zip(steps["step_id"], steps["after_leir"], strict=True))
    family_by_step = dict(zip(steps["step_id"], steps["family"], strict=True))
    parses, matches, families = [], [], []
    for answer, step_ids in zip(samples["answer"], samples["step_ids"], strict=True):
        ids = json.loads(step_ids) if isinstance(step_ids, str) else []
        families.append(family_by_step.get(ids[0]) if ids else None)
        try:
            _, body = split_answer(answer)
            items = body if isinstance(body, list) else [body]
            parses.append(True)
            matches.append(len(items) == len(ids) and all(
                after_by_step.get(i) == item.get("transformed_IR") for i, item in zip(ids, items, strict=True)))
        except (ValueError, AttributeError, TypeError):
            parses.append(False)
            matches.append(False)
    checked = samples.assign(answer_parses=parses, ir_matches_step=matches, family=families)
    if "before_leir" in steps:  # no step schedules a loop of one iteration
        steps = steps.assign(unit_loop_scheduled=[adds_unit_scheduled_loop(b, a) for b, a in
                                                  zip(steps["before_leir"], steps["after_leir"], strict=True)])
    splits = (checked.dropna(subset=["family"]).groupby("family")["split"].nunique().rename("n_splits")
              .reset_index())
    counts = steps["strategy"].value_counts()
    shares = pd.DataFrame({"strategy": counts.index, "share": (counts / max(len(steps), 1)).values})
    released = set(steps["strategy"])
    missing = pd.DataFrame({"strategy": sorted(s for s in producible if s not in released)}, dtype=object)
    return {"samples": checked, "steps": steps, "family_splits": splits, "strategy_shares": shares,
            "missing_strategies": missing}


def _suites(params) -> dict[str, list]:
    import great_expectations as gx

    E = gx.expectations
    max_share = float(params.filter["max_strategy_share"])
    return {
        "samples": [
            E.ExpectTableColumnsToMatchSet(column_set=SAMPLE_COLUMNS + ["answer_parses", "ir_matches_step", "family"],
                                           exact_match=True),
            E.ExpectColumnValuesToNotBeNull(column="sample_id"),
            E.ExpectColumnValuesToBeUnique(column="sample_id"),
            E.ExpectColumnValuesToBeInSet(column="split", value_set=["train", "test"]),
            E.ExpectColumnValuesToNotBeNull(column="prompt"),
            E.ExpectColumnValuesToBeInSet(column="answer_parses", value_set=[True]),
            E.ExpectColumnValuesToBeInSet(column="ir_matches_step", value_set=[True]),
            E.ExpectTableRowCountToBeBetween(min_value=1),
        ],
        "steps": [
            E.ExpectTableColumnsToMatchSet(column_set=STEP_COLUMNS, exact_match=False),
            E.ExpectColumnValuesToNotBeNull(column="step_id"),
            E.ExpectColumnValuesToBeUnique(column="step_id"),
            E.ExpectColumnValuesToNotBeNull(column="program_id"),
            E.ExpectColumnValuesToBeInSet(column="strategy", value_set=list(ALL_NAMES)),
            E.ExpectColumnValuesToBeInSet(column="level", value_set=sorted(set(LEVEL_OF.values()))),
            E.ExpectColumnValuesToBeInSet(column="exactness", value_set=["exact", "reassociating"]),
            E.ExpectColumnValuesToBeInSet(column="status", value_set=["exact", "close"]),  # every step verified
            # parallelising, vectorising, unrolling or binding a loop of extent 1 cannot help
            E.ExpectColumnValuesToBeInSet(column="unit_loop_scheduled", value_set=[False]),
        ],
        "family_splits": [E.ExpectColumnValuesToBeBetween(column="n_splits", min_value=1, max_value=1)],
        "strategy_shares": [E.ExpectColumnValuesToBeBetween(column="share", min_value=0, max_value=max_share)],
        "missing_strategies": [E.ExpectTableRowCountToEqual(value=0)],
    }


def check_release(samples: pd.DataFrame, steps: pd.DataFrame, producible: list[str], params) -> GateReport:
    os.environ.setdefault("GX_ANALYTICS_ENABLED", "false")
    import great_expectations as gx
    from great_expectations.data_context.types.base import ProgressBarsConfig

    frames = derive_frames(samples, steps, producible)
    context = gx.get_context(mode="ephemeral")
    context.variables.progress_bars = ProgressBarsConfig(globally=False)
    source = context.data_sources.add_pandas("release")
    failures, checked = [], 0
    for name, expectations in _suites(params).items():
        batch = source.add_dataframe_asset(name).add_batch_definition_whole_dataframe("all")
        suite = context.suites.add(gx.ExpectationSuite(name=name))
        for expectation in expectations:
            suite.add_expectation(expectation)
        definition = context.validation_definitions.add(gx.ValidationDefinition(data=batch, suite=suite, name=name))
        result = definition.run(batch_parameters={"dataframe": frames[name]})
        checked += len(result.results)
        failures.extend(_describe(name, r) for r in result.results if not r.success)
    return GateReport(not failures, failures, checked)


def _describe(table: str, r) -> str:
    cfg = r.expectation_config
    column = cfg.kwargs.get("column")
    where = f"{table}.{column}" if column else table
    res = r.result or {}
    detail = []
    if res.get("unexpected_count"):
        examples = res.get("partial_unexpected_list", [])[:5]
        detail.append(f"{res['unexpected_count']} unexpected value(s), e.g. {examples}")
    if "observed_value" in res and res["observed_value"] is not None:
        detail.append(f"observed {res['observed_value']}")
    return f"{where}: {cfg.type} failed" + (f" ({'; '.join(detail)})" if detail else "")
