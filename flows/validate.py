"""The validate stage: the Great Expectations release gate over the samples and released steps ->
`reports/gate.json`; a refusal fails the stage (`GateFailed`, raised by `flows.pipeline.run_stage` from
the flow's `refused` result) and nothing is released."""
from __future__ import annotations

import json
from pathlib import Path

from prefect import flow
from prefect.task_runners import ThreadPoolTaskRunner

from flows.config import Params
from flows.lake_queries import release_inputs
from flows.storage import read_table
from flows.tasks import console


class GateFailed(Exception):
    pass


@flow(name="validate", task_runner=ThreadPoolTaskRunner(max_workers=1))
def validate_flow(raw: dict, profile: str, lake: str, reports: str) -> dict:
    import logging

    import great_expectations.data_context.types.base  # noqa: F401 - makes the logger it sets to INFO

    from expectations.release_gate import check_release

    for name in ["great_expectations", *logging.root.manager.loggerDict]:  # GX sets INFO on some of its own
        if name.startswith("great_expectations"):
            logging.getLogger(name).setLevel(logging.WARNING)  # its INFO lines are not the gate's answer

    params, lake = Params(raw, profile), Path(lake)
    steps, producible = release_inputs(lake, params)
    report = check_release(read_table(lake, "samples").to_pandas(), steps.to_pandas(), producible, params)
    Path(reports).mkdir(parents=True, exist_ok=True)
    (Path(reports) / "gate.json").write_text(json.dumps(report.to_json(), indent=1) + "\n")
    if not report.success:
        # A refusal is an answer, not a crash: returned, not raised inside the flow (Prefect would log
        # it with a traceback); `run_stage` turns it into GateFailed for whoever called the stage.
        return {"stage": "validate", "expectations": report.checked, "refused": report.text()}
    console.print(report.text())
    return {"stage": "validate", "expectations": report.checked}
