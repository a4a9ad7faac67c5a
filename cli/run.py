"""`steptp run`, `steptp stage`, `steptp repro`, `steptp release`, `steptp serve`: the pipeline."""
from __future__ import annotations

import contextlib
import os
import subprocess
from pathlib import Path
from typing import Annotated

import typer

from cli.common import fail
from flows.config import PARAMS, ROOT

STAGE_NAMES = ("generate", "transform", "verify", "filter", "follow_ups", "tokens", "measure", "cost_model", "search",
               "report", "validate", "release")
ProfileOpt = Annotated[str | None, typer.Option(help="Profile of params.yaml (default: its `profile`).")]
LakeOpt = Annotated[Path, typer.Option(help="The lake folder.")]
ReportsOpt = Annotated[Path, typer.Option(help="Where reports (JSON metrics, PNG plots) go.")]


def _params(profile: str | None, check: bool = True):
    """params.yaml with the chosen profile; one line and exit 2 when it cannot be read or has no such
    profile, one line per problem and exit 2 when it does not fit its schema (`check`: skipped where a
    parent command that checked it holds the lake, a stage of `steptp repro`: the check builds the
    catalogue and sizes the pinned shapes, 8 s a process)."""
    import yaml

    from cli.common import read_text
    from flows.config import Params

    _, text = read_text(PARAMS)
    try:
        raw = yaml.safe_load(text)
    except yaml.YAMLError as e:
        fail(f"{PARAMS}: not YAML: {' '.join(str(e).split())}")
    profiles = raw.get("profiles") if isinstance(raw, dict) else None
    if not isinstance(profiles, dict):
        fail(f"{PARAMS}: no profiles")
    name = profile or raw.get("profile", "default")
    if name not in profiles:
        fail(f"unknown profile {name!r}; {PARAMS.name} has {', '.join(profiles)}")
    from flows.params_schema import check_params

    problems = check_params(raw, PARAMS, text) if check else []
    if problems:  # before any stage writes: a typo must never rewrite the lake
        fail(f"{PARAMS} is not valid ({len(problems)} problem{'s' * (len(problems) > 1)}); nothing was run:\n"
             + "\n".join(f"  {p}" for p in problems))
    return Params(raw, name)


def _results_in(lake: Path) -> None:
    """Prefect's task results (the cache a killed run resumes from) under `lake/.prefect-results`, the
    lake this command builds, before any flow module imports Prefect (importing the `flows` package
    chose the default `lake/`; this replaces that choice); an explicit PREFECT_LOCAL_STORAGE_PATH is
    kept."""
    from flows.prefect_env import configure

    configure(lake)


@contextlib.contextmanager
def _writer_of(lake: Path, command: str):
    """The lake's write lock for the block (flows.lake_guard): a second writer of the same lake ends
    with one line naming the holder and exit status 1, before it starts anything."""
    from flows.lake_guard import LakeBusy, lake_lock

    with contextlib.ExitStack() as stack:
        try:
            stack.enter_context(lake_lock(lake, command))
        except LakeBusy as e:
            fail(str(e), code=1)
        yield


def _check_cron(cron: str) -> None:
    """One line and exit 2 for a schedule Prefect refuses (checked by Prefect's own schedule type,
    before any server starts)."""
    from pydantic import ValidationError

    from flows.prefect_env import configure

    configure()
    from prefect.client.schemas.schedules import CronSchedule

    try:
        CronSchedule(cron=cron)
    except ValidationError as e:
        reason = e.errors()[0]["msg"].removeprefix("Value error, ")
        fail(f"--cron {cron!r} is not a cron schedule (minute hour day month weekday): {reason}")


def _outside_project(lake: Path) -> bool:
    """A lake other than the project's `lake/`, which DVC does not track: no dvc.lock or tag for it."""
    return lake.resolve() != (ROOT / "lake").resolve()


def _check_runner(runner: str, workers: int) -> None:
    if runner not in ("local", "dask"):
        fail(f"--runner must be local or dask, got {runner!r}")
    if workers < 1:
        fail("--workers must be at least 1")


def register(app: typer.Typer) -> None:
    @app.command("run")
    def run(profile: ProfileOpt = None,
            runner: Annotated[str, typer.Option(help="local (processes on this machine) or dask.")] = "local",
            address: Annotated[str | None, typer.Option(help="Dask scheduler, e.g. tcp://host:8786 "
                                                        "(with --runner dask; default: a local cluster).")]
            = None,
            workers: Annotated[int, typer.Option(min=1, help="Worker processes of the local Dask cluster (with "
                                                      "--runner dask and no --address).")] = 2,
            stop_after: Annotated[str, typer.Option(help="Last stage to run.")] = "release",
            lake: LakeOpt = Path("lake"), reports: ReportsOpt = Path("reports")):
        """Run the whole chain (generate → transform → verify → filter → follow_ups → tokens → measure →
        cost_model → search → report → validate → release) as one Prefect flow. Finished shard tasks
        are cached, keyed by their inputs and the code of their stage: a killed run resumes where it
        stopped, and a stage whose code changed is redone."""
        if stop_after not in STAGE_NAMES:
            fail(f"--stop-after must be one of {', '.join(STAGE_NAMES)}")
        params = _params(profile)
        _results_in(lake)
        from flows.prefect_env import local_server

        with _writer_of(lake, "steptp run"), local_server():
            from flows.pipeline import GateFailed, gate_refusal, pipeline_flow
            from flows.storage import StorageError

            _check_runner(runner, workers)
            try:
                if runner == "local":
                    refused = gate_refusal(pipeline_flow(params.raw, params.profile_name, str(lake), str(reports),
                                                         stop_after))
                    if refused:
                        raise GateFailed(refused)
                else:
                    _run_on_cluster(params, lake, reports, stop_after, address, workers)
            except GateFailed as e:  # the failed expectations, exit 1: a refusal, not a crash
                fail(f"release refused by the gate:\n{e}", code=1)
            except StorageError as e:  # a damaged shard: named, not a traceback
                fail(str(e), code=1)

    @app.command("stage")
    def stage(name: Annotated[str, typer.Argument(help=f"One of: {', '.join(STAGE_NAMES)}.")],
              profile: ProfileOpt = None, lake: LakeOpt = Path("lake"), reports: ReportsOpt = Path("reports")):
        """Run one stage as a Prefect flow (what each DVC stage in dvc.yaml calls)."""
        if name not in STAGE_NAMES:
            fail(f"unknown stage {name!r}; stages: {', '.join(STAGE_NAMES)}")
        from flows.lake_guard import LOCK_ENV

        params = _params(profile, check=os.environ.get(LOCK_ENV) != str(lake.resolve()))
        _results_in(lake)
        from flows.prefect_env import local_server

        with _writer_of(lake, f"steptp stage {name}"), local_server():
            from flows.pipeline import GateFailed, run_stage
            from flows.storage import StorageError
            from flows.versions import ReleaseError

            try:
                result = run_stage(name, params, lake, reports)
            except GateFailed as e:
                fail(f"release refused by the gate:\n{e}", code=1)
            except (ReleaseError, StorageError) as e:
                fail(str(e), code=1)
        typer.echo(f"{name}: {result}", err=True)

    @app.command("repro")
    def repro(push: Annotated[bool, typer.Option(help="dvc push to the default remote afterwards.")] = True):
        """Initialise DVC if needed (with its local remote), then `dvc repro` the pipeline of dvc.yaml
        with one Prefect server for all stages. A second call right after does nothing."""
        from flows.lake_guard import LOCK_ENV
        from flows.prefect_env import die_with_parent, dvc_env, dvc_executable, ensure_dvc

        env = dvc_env()
        try:
            ensure_dvc(env)
        except RuntimeError as e:
            fail(str(e))
        if subprocess.call([dvc_executable(), "status", "--quiet"], cwd=ROOT, env=env) == 0:
            typer.echo("Data and pipelines are up to date.", err=True)
            return
        _params(None)  # the file checked once here: the stages dvc starts run under this command's lock
        from flows.prefect_env import local_server

        with _writer_of(ROOT / "lake", "steptp repro"), local_server():
            env["PREFECT_API_URL"] = os.environ["PREFECT_API_URL"]
            env.update({k: os.environ[k] for k in (LOCK_ENV,)})  # the stages go on under this lock
            code = subprocess.call([dvc_executable(), "repro"], cwd=ROOT, env=env, preexec_fn=die_with_parent())
        if code:
            raise typer.Exit(code)
        if push:
            if subprocess.call([dvc_executable(), "push", "--quiet"], cwd=ROOT, env=env):
                typer.echo("warning: dvc push to the default remote failed (the lake is complete locally)", err=True)

    @app.command("release")
    def release(version: Annotated[str, typer.Option(help="Semantic version MAJOR.MINOR.PATCH.")],
                profile: ProfileOpt = None, lake: LakeOpt = Path("lake"), reports: ReportsOpt = Path("reports"),
                tag: Annotated[bool, typer.Option(help="Tag the commit data-vX.Y.Z and dvc push.")] = True):
        """Gate and write release vX.Y.Z from the current lake (run the pipeline first), then tag and push."""
        _results_in(lake)
        from flows.versions import ReleaseError, parse_version

        try:
            parse_version(version)
        except ReleaseError as e:
            fail(str(e))
        params = _params(profile)
        from flows.prefect_env import local_server

        with _writer_of(lake, f"steptp release --version {version}"), local_server():
            from flows.pipeline import GateFailed, run_stage

            try:
                run_stage("validate", params, lake, reports)
                result = run_stage("release", params, lake, reports, version=version)
            except (GateFailed, ReleaseError) as e:
                fail(str(e), code=1)
        typer.echo(f"released: {result['path']}", err=True)
        if _outside_project(lake):  # dvc.lock and the data-v tags describe the project's lake/ only
            typer.echo(f"not recorded or tagged: {lake} is not this checkout's lake/ (DVC tracks that one)", err=True)
            return
        from flows.nightly import NightlyError, commit_and_tag, dvc_env, dvc_push, record_release

        try:  # dvc.lock records the release folder: `dvc status` stays clean (a tag pins it)
            if record_release(dvc_env(), lake):
                typer.echo("dvc.lock: the validate and release stages recorded", err=True)
        except NightlyError as e:
            fail(str(e), code=1)
        if tag:

            try:
                typer.echo(f"tagged {commit_and_tag(version)}", err=True)
            except NightlyError as e:
                fail(str(e), code=1)
            try:
                dvc_push(dvc_env())
            except NightlyError as e:
                typer.echo(f"warning: {e}", err=True)

    @app.command("serve")
    def serve(cron: Annotated[str, typer.Option(help="Cron schedule of the nightly build, e.g. \"0 3 * * *\" "
                                                "(03:00 UTC) or \"* * * * *\" (every minute).")] = "0 3 * * *",
              name: Annotated[str, typer.Option(help="Deployment name.")] = "steptp-nightly",
              port: Annotated[int | None, typer.Option(min=1, max=65535,
                                                       help="Port of the local Prefect server and its UI (default: "
                                                            "a free one; ignored with PREFECT_API_URL).")]
              = None):
        """Serve the nightly build on a schedule until Ctrl-C: `dvc repro` (only what changed is
        recomputed), then, when the release tables changed and the gate passed, the next release
        (version policy of params.yaml), its git tag data-vX.Y.Z and `dvc push`. A refused gate fails
        the run and releases nothing. Uses the Prefect server at PREFECT_API_URL when set, otherwise
        starts the project's own (state under .prefect/) with its scheduler and UI, and stops it on
        exit. `steptp lake status` shows the last scheduled run."""
        _check_cron(cron)
        from flows.prefect_env import local_server

        os.environ.setdefault("PREFECT_LOGGING_LEVEL", "INFO")  # the runs' progress on this console
        with contextlib.ExitStack() as stack:
            try:
                url = stack.enter_context(local_server(port=port))
            except RuntimeError as e:
                fail(str(e), code=1)
            typer.echo(f"Prefect UI: {url.removesuffix('/api')} (flow runs of deployment nightly-build/{name}); "
                       f"schedule {cron!r} (UTC); Ctrl-C stops serving.", err=True)
            from flows.nightly import serve as serve_nightly

            serve_nightly(name, cron)


def _run_on_cluster(params, lake: Path, reports: Path, stop_after: str, address: str | None, workers: int) -> None:
    """Every stage with its tasks on the Dask cluster at `address`, or on a local cluster of `workers`
    processes started once for the whole run."""
    from contextlib import nullcontext

    from flows.cluster import dask_runner, local_cluster
    from flows.pipeline import STAGES, run_stage

    with nullcontext(address) if address else local_cluster(workers) as scheduler:
        for stage in STAGES:
            result = run_stage(stage, params, lake, reports, task_runner=dask_runner(scheduler))
            typer.echo(f"{stage}: {result}", err=True)
            if stage == stop_after:
                break
