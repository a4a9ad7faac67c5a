"""The validate stage: the Great Expectations release gate over the samples and released steps ->
`reports/gate.json`; a refusal fails the stage (`GateFailed`) and nothing is released."""
from __future__ import annotations

import json
from pathlib import Path

from flows.prefect_env import configure

configure()

from prefect import flow  # noqa: E402
from prefect.task_runners import ThreadPoolTaskRunner  # noqa: E402

from flows.config import Params  # noqa: E402
from flows.storage import read_table, release_inputs  # noqa: E402
from flows.tasks import console  # noqa: E402


class GateFailed(Exception):
    pass


@flow(name="validate", task_runner=ThreadPoolTaskRunner(max_workers=1))
def validate_flow(raw: dict, profile: str, lake: str, reports: str) -> dict:
    from expectations.release_gate import check_release

    params, lake = Params(raw, profile), Path(lake)
    steps, producible = release_inputs(lake, params)
    report = check_release(read_table(lake, "samples").to_pandas(), steps.to_pandas(), producible, params)
    Path(reports).mkdir(parents=True, exist_ok=True)
    (Path(reports) / "gate.json").write_text(json.dumps(report.to_json(), indent=1) + "\n")
    console.print(report.text())
    if not report.success:
        raise GateFailed(report.text())
    return {"stage": "validate", "expectations": report.checked}
