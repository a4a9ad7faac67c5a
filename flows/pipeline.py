"""The pipeline as Prefect flows: one flow per stage (a DVC stage runs one; each lives in the module
named after its stage), and `pipeline_flow` that runs them all in order.

generate -> transform -> verify -> filter -> tokens -> search -> report -> validate -> release, plus
the optional `measure` stage. Shared task helpers (cache keys, progress, writing shards) live in
`flows.tasks`; stage modules import it and never this module.
"""
from __future__ import annotations

import json
from pathlib import Path

from flows.prefect_env import configure

configure()

from prefect import flow  # noqa: E402
from prefect.settings import PREFECT_FLOWS_HEARTBEAT_FREQUENCY, temporary_settings  # noqa: E402

from flows.config import Params  # noqa: E402
from flows.filtering import filter_flow  # noqa: E402
from flows.generate import generate_flow  # noqa: E402
from flows.measure import measure_flow  # noqa: E402
from flows.release import release_flow  # noqa: E402
from flows.reports import report_flow  # noqa: E402
from flows.search import search_flow  # noqa: E402
from flows.tasks import console  # noqa: E402
from flows.tokens import tokens_flow  # noqa: E402
from flows.transform import transform_flow  # noqa: E402
from flows.validate import GateFailed, validate_flow  # noqa: E402
from flows.verify import verify_flow  # noqa: E402

__all__ = ["STAGES", "STAGE_FLOWS", "GateFailed", "run_stage", "pipeline_flow", "dask_runner"]

STAGES = ("generate", "transform", "verify", "filter", "tokens", "search", "report", "validate", "release")
STAGE_FLOWS = {"generate": generate_flow, "transform": transform_flow, "verify": verify_flow,
               "filter": filter_flow, "tokens": tokens_flow, "search": search_flow, "report": report_flow,
               "validate": validate_flow, "release": release_flow, "measure": measure_flow}


def run_stage(stage: str, params: Params, lake: Path, reports: Path, task_runner=None, **extra) -> dict:
    fl = STAGE_FLOWS[stage]
    if task_runner is not None:
        fl = fl.with_options(task_runner=task_runner)
    args = {"raw": params.raw, "profile": params.profile_name, "lake": str(lake)}
    if stage not in ("generate", "transform", "verify"):
        args["reports"] = str(reports)
    with temporary_settings({PREFECT_FLOWS_HEARTBEAT_FREQUENCY: None}):
        result = fl(**args, **extra)
    _record_last_run(lake, stage, params)
    return result


def _record_last_run(lake: Path, stage: str, params: Params) -> None:
    """`lake/last_run.json` for `steptp lake status` (a log, not data: never read by a stage)."""
    import datetime

    lake = Path(lake)
    lake.mkdir(parents=True, exist_ok=True)
    info = {"stage": stage, "profile": params.profile_name,
            "finished_at": datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds")}
    tmp = lake / ".last_run.json.tmp"
    tmp.write_text(json.dumps(info) + "\n")
    tmp.replace(lake / "last_run.json")


@flow(name="pipeline")
def pipeline_flow(raw: dict, profile: str, lake: str, reports: str, stop_after: str = "release") -> list[dict]:
    params = Params(raw, profile)
    out = []
    for stage in STAGES:
        out.append(run_stage(stage, params, Path(lake), Path(reports)))
        console.print(f"[bold]{stage}[/]: {out[-1]}")
        if stage == stop_after:
            break
    return out


def dask_runner(address: str | None = None):
    """A Dask task runner: the cluster at `address`, or a local cluster of 2 single-threaded worker
    processes that may start the verification pool's own processes (non-daemonic workers)."""
    import dask
    from prefect_dask import DaskTaskRunner

    if address:
        return DaskTaskRunner(address=address)
    dask.config.set({"distributed.worker.daemon": False})
    return DaskTaskRunner(cluster_kwargs={"n_workers": 2, "threads_per_worker": 1, "processes": True})
