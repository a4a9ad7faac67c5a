"""The pipeline as Prefect flows: one flow per stage (a DVC stage runs one), and `pipeline` for all.

Shard tasks (one per workload family) are cached across runs: the key is the content of the shard's
inputs, the parameters the stage reads, and a hash of the project's code, and results persist under
`lake/.prefect-results`. A run killed at any point resumes from the finished tasks; shards are
written atomically (flows.storage), so no table is ever half-written.
"""
from __future__ import annotations

import atexit
import hashlib
import json
from functools import lru_cache
from pathlib import Path

import pyarrow as pa

from flows.prefect_env import configure

configure()

from prefect import flow, task  # noqa: E402
from prefect.settings import PREFECT_FLOWS_HEARTBEAT_FREQUENCY, temporary_settings  # noqa: E402
from prefect.task_runners import ThreadPoolTaskRunner  # noqa: E402
from rich.console import Console  # noqa: E402

from flows import stages  # noqa: E402
from flows.config import ROOT, Params  # noqa: E402
from flows.keys import stable_id  # noqa: E402
from flows.storage import build_catalog, read_table, shards, write_shard  # noqa: E402

STAGES = ("generate", "transform", "verify", "filter", "tokens", "search", "report", "validate", "release")
CODE_PACKAGES = ("leir", "workloads", "strategies", "gpu_tasks")
console = Console(stderr=True)


@lru_cache(maxsize=1)
def code_hash() -> str:
    """sha256 over the source of the packages whose code decides the data (once per process: every
    shard key uses it, and the code does not change during a run)."""
    h = hashlib.sha256()
    for pkg in CODE_PACKAGES:
        for path in sorted((ROOT / pkg).rglob("*")):
            if path.suffix in (".py", ".lark") and "__pycache__" not in path.parts:
                h.update(path.relative_to(ROOT).as_posix().encode())
                h.update(path.read_bytes())
    return h.hexdigest()[:16]


def _key_from_arg(context, parameters) -> str:
    return f"{context.task.name}-{parameters['key']}"


_POOL = None


def shared_pool(params: Params):
    """One worker pool per process (tasks on Dask workers get their own). A daemonic process (a Dask
    worker started with daemon=True) cannot have children: it verifies in-process instead."""
    global _POOL
    import multiprocessing

    if multiprocessing.current_process().daemon:
        return None
    if _POOL is None:
        from gpu_tasks.pool import WorkerPool

        _POOL = WorkerPool(workers=int(params.verify["workers"]), timeout_s=float(params.verify["timeout_s"]))
        atexit.register(_POOL.close)
    return _POOL


@task(cache_key_fn=_key_from_arg, persist_result=True)
def generate_task(key: str, shard: stages.Shard, raw: dict, profile: str) -> list[dict]:
    params = Params(raw, profile)
    return stages.generate_shard(shard, params, shared_pool(params))


@task(cache_key_fn=_key_from_arg, persist_result=True)
def transform_task(key: str, programs: list[dict], raw: dict, profile: str) -> list[dict]:
    return stages.transform_shard(programs, Params(raw, profile))


@task(cache_key_fn=_key_from_arg, persist_result=True)
def verify_task(key: str, steps: list[dict], signatures: dict, raw: dict, profile: str) -> list[dict]:
    params = Params(raw, profile)
    return stages.verify_shard(steps, signatures, params, shared_pool(params))


def _stage_key(stage: str, params: Params, lake: Path, *content) -> str:
    """Cache key of a shard task: its inputs, the parameters that decide them, the code, and the lake
    (two lakes never share work, so each can be rebuilt from scratch to check determinism)."""
    relevant = {"seed": params.seed, "profile": params.profile, "verify": params.verify}
    return stable_id(stage, str(Path(lake).resolve()), relevant, code_hash(), *content, length=32)


def _write(lake: Path, table: str, results: dict[str, list[dict]]) -> int:
    """Write one shard per family, then drop shards that the current plan no longer has."""
    for name, rows in results.items():
        write_shard(lake, table, name, rows)
    for path in shards(lake, table):
        if path.stem not in results:
            path.unlink()
    return sum(len(r) for r in results.values())


def _by_family(table, column="family") -> dict[str, list[dict]]:
    out: dict[str, list[dict]] = {}
    for row in table.to_pylist():
        out.setdefault(row[column], []).append(row)
    return dict(sorted(out.items()))


def _run_tasks(label: str, calls: list[tuple[str, object, tuple]]) -> dict[str, list[dict]]:
    """Submit (name, task, args) and collect in order, with a progress bar."""
    from rich.progress import Progress

    futures = [(name, t.submit(*args)) for name, t, args in calls]
    results = {}
    with Progress(console=console, transient=True) as progress:
        bar = progress.add_task(label, total=len(futures))
        for name, fut in futures:
            results[name] = fut.result()
            progress.advance(bar)
    return results


@flow(name="generate", task_runner=ThreadPoolTaskRunner(max_workers=1))
def generate_flow(raw: dict, profile: str, lake: str) -> dict:
    params, lake = Params(raw, profile), Path(lake)
    plan = stages.plan_generate(params)
    calls = [(s.name, generate_task, (_stage_key("generate", params, lake, s.items), s, raw, profile)) for s in plan]
    n = _write(lake, "programs", _run_tasks("generate: translate and verify", calls))
    return {"stage": "generate", "shards": len(plan), "rows": n}


@flow(name="transform", task_runner=ThreadPoolTaskRunner(max_workers=1))
def transform_flow(raw: dict, profile: str, lake: str) -> dict:
    params, lake = Params(raw, profile), Path(lake)
    families = _by_family(read_table(lake, "programs"))
    calls = [(f, transform_task, (_stage_key("transform", params, lake, rows), rows, raw, profile))
             for f, rows in families.items()]
    n = _write(lake, "steps", _run_tasks("transform: apply strategies", calls))
    return {"stage": "transform", "shards": len(calls), "rows": n}


@flow(name="verify", task_runner=ThreadPoolTaskRunner(max_workers=1))
def verify_flow(raw: dict, profile: str, lake: str) -> dict:
    params, lake = Params(raw, profile), Path(lake)
    programs = read_table(lake, "programs").to_pylist()
    family_of = {p["program_id"]: p["family"] for p in programs}
    signatures = {p["program_id"]: p["signature"] for p in programs}
    steps = _group(read_table(lake, "steps").to_pylist(), lambda s: family_of[s["program_id"]])
    calls = []
    for family, rows in steps.items():
        sigs = {r["program_id"]: signatures[r["program_id"]] for r in rows}
        calls.append((family, verify_task, (_stage_key("verify", params, lake, rows, sigs), rows, sigs, raw, profile)))
    n = _write(lake, "verifications", _run_tasks("verify: build, run, compare", calls))
    return {"stage": "verify", "shards": len(calls), "rows": n}


def _group(rows: list[dict], key) -> dict[str, list[dict]]:
    out: dict[str, list[dict]] = {}
    for r in rows:
        out.setdefault(key(r), []).append(r)
    return dict(sorted(out.items()))


@flow(name="filter", task_runner=ThreadPoolTaskRunner(max_workers=1))
def filter_flow(raw: dict, profile: str, lake: str, reports: str) -> dict:
    from flows.filtering import assemble_samples, select_steps
    from flows.tokens import count_tokens

    params, lake = Params(raw, profile), Path(lake)
    programs = read_table(lake, "programs")
    kept, counters = select_steps(programs, read_table(lake, "steps"), read_table(lake, "verifications"), params)
    samples, more = assemble_samples(kept, programs, params, count_tokens)
    by_split = _group(samples, lambda s: s["split"])
    _write(lake, "samples", by_split)
    Path(reports).mkdir(parents=True, exist_ok=True)
    (Path(reports) / "filter.json").write_text(json.dumps([c.to_json() for c in counters + more], indent=1) + "\n")
    return {"stage": "filter", "kept_steps": kept.num_rows, "samples": len(samples)}


@flow(name="report", task_runner=ThreadPoolTaskRunner(max_workers=1))
def report_flow(raw: dict, profile: str, lake: str, reports: str) -> dict:
    from flows.reports import build_reports

    lake, out = Path(lake), Path(reports)
    counters = json.loads((out / "filter.json").read_text()) if (out / "filter.json").exists() else []
    summary = build_reports(read_table(lake, "programs"), read_table(lake, "steps"),
                            read_table(lake, "verifications"), read_table(lake, "samples"), counters, out)
    build_catalog(lake)
    return {"stage": "report", **summary}


def release_inputs(lake: Path, params: Params):
    """The released steps (joined with their verification and family) and the strategies the
    selection could produce (those with at least one verified step)."""
    import duckdb

    con = duckdb.connect()
    for name in ("programs", "steps", "verifications", "samples"):
        con.register(name, read_table(lake, name))
    released_ids = {i for row in read_table(lake, "samples").column("step_ids").to_pylist() for i in json.loads(row)}
    con.register("released", pa.table({"step_id": sorted(released_ids)}))
    steps = con.sql("""SELECT s.step_id, s.program_id, s.strategy, s.level, s.after_leir, s.exactness, v.status,
                              p.family
                       FROM steps s JOIN released USING (step_id) JOIN programs p USING (program_id)
                       JOIN verifications v USING (step_id) ORDER BY s.step_id""").to_arrow_table()
    producible = [r[0] for r in con.execute("""SELECT DISTINCT s.strategy FROM steps s JOIN verifications v
        USING (step_id) WHERE v.status = 'exact' OR (v.status = 'close' AND s.exactness = 'reassociating')
        ORDER BY 1""").fetchall()]
    con.close()
    return steps, producible


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


class GateFailed(Exception):
    pass


@flow(name="release", task_runner=ThreadPoolTaskRunner(max_workers=1))
def release_flow(raw: dict, profile: str, lake: str, reports: str, version: str | None = None) -> dict:
    from flows.release import make_release

    params, lake = Params(raw, profile), Path(lake)
    version = version or params.release["version"]
    steps, _ = release_inputs(lake, params)
    gate = json.loads((Path(reports) / "gate.json").read_text())
    if not gate.get("success"):
        raise GateFailed("the release gate did not pass; run the validate stage")
    counters = json.loads((Path(reports) / "filter.json").read_text())
    existing = lake / "releases" / f"v{version}"
    if existing.exists():
        return _compare_release(existing, lake, version, steps, params, gate, counters)
    out = make_release(lake, version, read_table(lake, "samples"), steps, params, gate, counters)
    return {"stage": "release", "version": version, "path": str(out)}


def _compare_release(existing: Path, lake: Path, version, steps, params, gate, counters) -> dict:
    """Re-running a release: fine when the files would be identical, an error when they differ."""
    import tempfile

    from flows.release import ReleaseError, make_release

    with tempfile.TemporaryDirectory(dir=lake) as tmp:
        fresh = make_release(Path(tmp), version, read_table(lake, "samples"), steps, params, gate, counters)
        files = sorted(p.relative_to(fresh) for p in fresh.rglob("*") if p.is_file())
        same = files == sorted(p.relative_to(existing) for p in existing.rglob("*") if p.is_file()) and all(
            (fresh / f).read_bytes() == (existing / f).read_bytes() for f in files)
    if not same:
        raise ReleaseError(f"release v{version} exists with other contents; bump the version in params.yaml "
                           "(rules in the dataset card)")
    return {"stage": "release", "version": version, "path": str(existing), "unchanged": True}


STAGE_FLOWS = {"generate": generate_flow, "transform": transform_flow, "verify": verify_flow,
               "filter": filter_flow, "report": report_flow, "validate": validate_flow, "release": release_flow}


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


@flow(name="steptp-pipeline")
def scheduled_pipeline(profile: str = "default", lake: str = "lake", reports: str = "reports") -> list[dict]:
    """The deployment's entry point: reads params.yaml at run time, then runs the whole chain."""
    from flows.config import load_params

    params = load_params(profile=profile)
    return pipeline_flow(params.raw, params.profile_name, lake, reports)


import flows.pipeline_measure  # noqa: E402,F401  (registers the optional measure stage)
import flows.pipeline_search  # noqa: E402,F401  (registers the search stage, issue 8)
import flows.pipeline_tokens  # noqa: E402,F401  (registers the tokens stage, issue 7)
