"""The pipeline as Prefect flows: one flow per stage (a DVC stage runs one; each lives in the module
named after its stage), and `pipeline_flow` that runs them all in order.

generate -> transform -> verify -> filter -> follow_ups -> tokens -> measure -> cost_model -> search ->
report -> validate -> release. Shared task helpers (cache keys, progress, writing shards) live in
`flows.tasks`; stage modules import it and never this module.
"""
from __future__ import annotations

import json
import time
from pathlib import Path

from prefect import flow
from prefect.settings import PREFECT_FLOWS_HEARTBEAT_FREQUENCY, temporary_settings

from flows.config import Params
from flows.cost_model import cost_model_flow
from flows.filtering import filter_flow
from flows.follow_ups import follow_ups_flow
from flows.generate import generate_flow
from flows.measure import measure_flow
from flows.release import release_flow
from flows.reports import report_flow
from flows.search import search_flow
from flows.tasks import console
from flows.tokens import tokens_flow
from flows.transform import transform_flow
from flows.validate import GateFailed, validate_flow
from flows.verify import verify_flow

__all__ = ["STAGES", "STAGE_FLOWS", "GateFailed", "gate_refusal", "run_stage", "pipeline_flow",
           "PROCESS_SHARD_STAGES"]

STAGES = ("generate", "transform", "verify", "filter", "follow_ups", "tokens", "measure", "cost_model", "search",
          "report", "validate", "release")
STAGE_FLOWS = {"generate": generate_flow, "transform": transform_flow, "verify": verify_flow,
               "filter": filter_flow, "follow_ups": follow_ups_flow, "tokens": tokens_flow, "measure": measure_flow,
               "cost_model": cost_model_flow, "search": search_flow, "report": report_flow, "validate": validate_flow,
               "release": release_flow}


# Stages whose shards are pure Python work with no worker pool of their own: with the local runner and
# a profile's `shard_workers` above 1, their shards run in that many processes (the release build's
# transform was 25 minutes on one core while the other idled). Their output does not depend on it.
PROCESS_SHARD_STAGES = ("transform", "tokens")


def local_runner(stage: str, params: Params):
    """The task runner of `stage` under the local runner: a process pool of the profile's
    `shard_workers` for the stages of PROCESS_SHARD_STAGES, else None (the flow's own: shards in
    turn)."""
    workers = int(params.profile.get("shard_workers") or 1)
    if stage not in PROCESS_SHARD_STAGES or workers <= 1:
        return None
    from prefect.task_runners import ProcessPoolTaskRunner

    return ProcessPoolTaskRunner(max_workers=workers)


def run_stage(stage: str, params: Params, lake: Path, reports: Path, task_runner=None, **extra) -> dict:
    fl = STAGE_FLOWS[stage]
    task_runner = task_runner or local_runner(stage, params)
    if task_runner is not None:
        fl = fl.with_options(task_runner=task_runner)
    args = {"raw": params.raw, "profile": params.profile_name, "lake": str(lake)}
    if stage not in ("generate", "transform", "verify"):
        args["reports"] = str(reports)
    start = time.perf_counter()
    with temporary_settings({PREFECT_FLOWS_HEARTBEAT_FREQUENCY: None}):
        result = fl(**args, **extra)
    result = {**result, "seconds": round(time.perf_counter() - start, 1)}
    _record_last_run(lake, stage, params, result)
    if result.get("refused"):
        raise GateFailed(result["refused"])  # outside the flow: a message for the caller, no Prefect traceback
    return result


def gate_refusal(results: list[dict]) -> str | None:
    """The gate's refusal among the stage results of `pipeline_flow`, if the chain stopped at it."""
    return next((r["refused"] for r in results if isinstance(r, dict) and r.get("refused")), None)


def _record_last_run(lake: Path, stage: str, params: Params, result: dict) -> None:
    """`lake/last_run.json` for `steptp lake status`, and one line per stage run in `lake/runs.jsonl`
    (wall time and counts: the measured throughput of each stage). Logs, not data: no stage reads them."""
    import datetime

    lake = Path(lake)
    lake.mkdir(parents=True, exist_ok=True)
    info = {"stage": stage, "profile": params.profile_name,
            "finished_at": datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds")}
    tmp = lake / ".last_run.json.tmp"
    tmp.write_text(json.dumps(info) + "\n")
    tmp.replace(lake / "last_run.json")
    with open(lake / "runs.jsonl", "a", encoding="utf-8") as log:
        log.write(json.dumps({**info, **{k: v for k, v in result.items() if k != "stage"}}, default=str) + "\n")


@flow(name="pipeline")
def pipeline_flow(raw: dict, profile: str, lake: str, reports: str, stop_after: str = "release") -> list[dict]:
    params = Params(raw, profile)
    out = []
    for stage in STAGES:
        try:
            out.append(run_stage(stage, params, Path(lake), Path(reports)))
        except GateFailed as e:  # the chain stops here; the caller reads the refusal (gate_refusal)
            out.append({"stage": stage, "refused": str(e)})
            break
        console.print(f"[bold]{stage}[/]: {out[-1]}")
        if stage == stop_after:
            break
    return out
