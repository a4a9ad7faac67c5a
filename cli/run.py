"""`steptp run`, `steptp stage`, `steptp repro`, `steptp release`, `steptp serve`: the pipeline."""
from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path
from typing import Annotated

import typer

from cli.common import fail
from flows.config import ROOT, load_params

STAGE_NAMES = ("generate", "transform", "verify", "filter", "tokens", "search", "report", "validate", "release",
               "measure")
ProfileOpt = Annotated[str | None, typer.Option(help="Profile of params.yaml (default: its `profile`).")]
LakeOpt = Annotated[Path, typer.Option(help="The lake folder.")]
ReportsOpt = Annotated[Path, typer.Option(help="Where reports (JSON metrics, PNG plots) go.")]


def _task_runner(runner: str, address: str | None, workers: int = 2):
    if runner == "local":
        return None
    if runner != "dask":
        fail(f"--runner must be local or dask, got {runner!r}")
    if workers < 1:
        fail("--workers must be at least 1")
    from flows.pipeline import dask_runner

    return dask_runner(address, workers)


def register(app: typer.Typer) -> None:
    @app.command("run")
    def run(profile: ProfileOpt = None,
            runner: Annotated[str, typer.Option(help="local (processes on this machine) or dask.")] = "local",
            address: Annotated[str | None, typer.Option(help="Dask scheduler, e.g. tcp://host:8786 "
                                                        "(with --runner dask; default: a local cluster).")]
            = None,
            workers: Annotated[int, typer.Option(help="Worker processes of the local Dask cluster (with "
                                                      "--runner dask and no --address).")] = 2,
            stop_after: Annotated[str, typer.Option(help="Last stage to run.")] = "release",
            lake: LakeOpt = Path("lake"), reports: ReportsOpt = Path("reports")):
        """Run the whole chain (generate → transform → verify → filter → tokens → search → report →
        validate → release) as one Prefect flow. Finished shard tasks are cached: a killed run resumes
        where it stopped."""
        if stop_after not in STAGE_NAMES:
            fail(f"--stop-after must be one of {', '.join(STAGE_NAMES)}")
        params = load_params(profile=profile)
        from flows.prefect_env import local_server

        with local_server():
            from flows.pipeline import GateFailed, gate_refusal, pipeline_flow

            task_runner = _task_runner(runner, address, workers)
            try:
                if task_runner is None:
                    refused = gate_refusal(pipeline_flow(params.raw, params.profile_name, str(lake), str(reports),
                                                         stop_after))
                    if refused:
                        raise GateFailed(refused)
                else:
                    _run_with_runner(params, lake, reports, stop_after, task_runner)
            except GateFailed as e:  # the failed expectations, exit 1: a refusal, not a crash
                fail(f"release refused by the gate:\n{e}", code=1)

    @app.command("stage")
    def stage(name: Annotated[str, typer.Argument(help=f"One of: {', '.join(STAGE_NAMES)} (measure: optional "
                                                  "timings of released steps, not in the default chain).")],
              profile: ProfileOpt = None, lake: LakeOpt = Path("lake"), reports: ReportsOpt = Path("reports")):
        """Run one stage as a Prefect flow (what each DVC stage in dvc.yaml calls)."""
        if name not in STAGE_NAMES:
            fail(f"unknown stage {name!r}; stages: {', '.join(STAGE_NAMES)}")
        params = load_params(profile=profile)
        from flows.prefect_env import local_server

        with local_server():
            from flows.pipeline import GateFailed, run_stage

            try:
                result = run_stage(name, params, lake, reports)
            except GateFailed as e:
                fail(f"release refused by the gate:\n{e}", code=1)
        typer.echo(f"{name}: {result}", err=True)

    @app.command("repro")
    def repro(push: Annotated[bool, typer.Option(help="dvc push to the default remote afterwards.")] = True):
        """Initialise DVC if needed (with its local remote), then `dvc repro` the pipeline of dvc.yaml
        with one Prefect server for all stages. A second call right after does nothing."""
        env = dvc_env()
        ensure_dvc(env)
        if subprocess.call([_dvc(), "status", "--quiet"], cwd=ROOT, env=env) == 0:
            typer.echo("Data and pipelines are up to date.", err=True)
            return
        from flows.prefect_env import local_server

        with local_server():
            env["PREFECT_API_URL"] = os.environ["PREFECT_API_URL"]
            code = subprocess.call([_dvc(), "repro"], cwd=ROOT, env=env)
        if code:
            raise typer.Exit(code)
        if push:
            if subprocess.call([_dvc(), "push", "--quiet"], cwd=ROOT, env=env):
                typer.echo("warning: dvc push to the default remote failed (the lake is complete locally)", err=True)

    @app.command("release")
    def release(version: Annotated[str, typer.Option(help="Semantic version MAJOR.MINOR.PATCH.")],
                profile: ProfileOpt = None, lake: LakeOpt = Path("lake"), reports: ReportsOpt = Path("reports"),
                tag: Annotated[bool, typer.Option(help="Tag the commit data-vX.Y.Z and dvc push.")] = True):
        """Gate and write release vX.Y.Z from the current lake (run the pipeline first), then tag and push."""
        from flows.release import ReleaseError, parse_version

        try:
            parse_version(version)
        except ReleaseError as e:
            fail(str(e))
        params = load_params(profile=profile)
        from flows.prefect_env import local_server

        with local_server():
            from flows.pipeline import GateFailed, run_stage

            try:
                run_stage("validate", params, lake, reports)
                result = run_stage("release", params, lake, reports, version=version)
            except (GateFailed, ReleaseError) as e:
                fail(str(e), code=1)
        typer.echo(f"released: {result['path']}", err=True)
        if tag:
            _tag_and_push(version)

    @app.command("serve")
    def serve(cron: Annotated[str, typer.Option(help="Cron schedule of the pipeline deployment.")] = "0 3 * * *",
              profile: ProfileOpt = None,
              name: Annotated[str, typer.Option(help="Deployment name.")] = "steptp-nightly"):
        """Serve the pipeline as a scheduled Prefect deployment (Ctrl-C to stop). Prefect state stays under
        .prefect/ of the project; point PREFECT_API_URL at a server to see it in the UI."""
        params = load_params(profile=profile)
        from flows.pipeline import scheduled_pipeline

        scheduled_pipeline.serve(name=name, cron=cron, parameters={
            "profile": params.profile_name, "lake": str(ROOT / "lake"), "reports": str(ROOT / "reports")})


def _run_with_runner(params, lake: Path, reports: Path, stop_after: str, task_runner) -> None:
    from flows.pipeline import STAGES, run_stage

    for stage in STAGES:
        result = run_stage(stage, params, lake, reports, task_runner=task_runner)
        typer.echo(f"{stage}: {result}", err=True)
        if stage == stop_after:
            break


def _dvc() -> str:
    return str(Path(sys.executable).with_name("dvc"))


def dvc_env() -> dict:
    env = dict(os.environ)
    env.setdefault("DVC_NO_ANALYTICS", "1")
    env.setdefault("DVC_SITE_CACHE_DIR", str(ROOT / ".dvc" / "tmp" / "site-cache"))
    env["PATH"] = f"{Path(sys.executable).parent}{os.pathsep}{env.get('PATH', '')}"
    return env


def ensure_dvc(env: dict) -> None:
    """`dvc init` when the checkout has no .dvc/ yet (the project's own .dvc/config names the remote)."""
    if not (ROOT / ".git").exists():
        fail("the project must be a git checkout for DVC")
    if not (ROOT / ".dvc").exists():
        subprocess.check_call([_dvc(), "init", "--quiet"], cwd=ROOT, env=env)
        subprocess.check_call([_dvc(), "config", "core.analytics", "false"], cwd=ROOT, env=env)
        subprocess.check_call([_dvc(), "remote", "add", "--default", "local", "../steptp-dvc-remote"],
                              cwd=ROOT, env=env)


def _tag_and_push(version: str) -> None:
    """Commit dvc.lock (what `dvc checkout` restores the release from), tag it, push the data."""
    tag = f"data-v{version}"
    changed = subprocess.run(["git", "status", "--porcelain", "--", "dvc.lock"], cwd=ROOT, capture_output=True,
                             text=True).stdout.strip()
    if (ROOT / "dvc.lock").exists() and changed:
        subprocess.call(["git", "add", "dvc.lock"], cwd=ROOT)
        if subprocess.call(["git", "commit", "-q", "-m", f"Data release v{version}", "--", "dvc.lock"], cwd=ROOT):
            typer.echo("warning: could not commit dvc.lock; the tag points at the current commit", err=True)
    if subprocess.call(["git", "rev-parse", "-q", "--verify", f"refs/tags/{tag}"], cwd=ROOT,
                       stdout=subprocess.DEVNULL) == 0:
        typer.echo(f"tag {tag} exists already", err=True)
    else:
        subprocess.check_call(["git", "tag", tag], cwd=ROOT)
        typer.echo(f"tagged {tag}", err=True)
    if subprocess.call([_dvc(), "push", "--quiet"], cwd=ROOT, env=dvc_env()):
        typer.echo("warning: dvc push failed", err=True)
