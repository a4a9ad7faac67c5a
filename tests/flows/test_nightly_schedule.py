"""The nightly build for real, on a throwaway copy of the project (tiny profile, its own git repository,
DVC remote and Prefect home): `steptp serve --cron "* * * * *"` starts its own Prefect server and one
scheduled run completes with the first release; then direct runs of the flow: an unchanged night
recomputes and releases nothing, a refused gate fails the run and releases nothing, changed tables
release the next patch version. Every process the tests start is stopped."""
from __future__ import annotations

import json
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest

from flows.config import ROOT, set_param

pytestmark = [pytest.mark.slow, pytest.mark.filterwarnings("ignore::DeprecationWarning")]
VENV = Path(sys.executable).parent.parent
RUN_FLOW = ("import json; from flows.nightly import nightly_build; s = nightly_build(return_state=True); "
            "print('STATE ' + json.dumps({'name': s.name, 'message': s.message}))")


def git(project: Path, *args: str) -> str:
    return subprocess.run(["git", *args], cwd=project, check=True, capture_output=True, text=True).stdout


def make_project(dest: Path) -> Path:
    """Copy the checkout's files (tracked and new, as git lists them), point .venv at this venv, pick
    the tiny profile and commit it all to a fresh repository."""
    files = subprocess.run(["git", "ls-files", "-z", "--cached", "--others", "--exclude-standard"], cwd=ROOT,
                           check=True, capture_output=True, text=True).stdout.split("\0")
    for name in filter(None, files):
        if (ROOT / name).is_file():
            (dest / name).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(ROOT / name, dest / name)
    (dest / ".venv").symlink_to(VENV)
    set_param(dest / "params.yaml", ("profile",), "tiny")
    for args in (["init", "-q"], ["config", "user.name", "nightly test"], ["config", "user.email", "n@example.org"],
                 ["add", "-A"], ["commit", "-q", "-m", "project"]):
        git(dest, *args)
    return dest


def project_env(project: Path) -> dict:
    """The copy's own code (PYTHONPATH before the editable install), Prefect home and DVC caches; no
    server of the caller's."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(("PREFECT_", "DVC_"))}
    env.update(PYTHONPATH=str(project), PREFECT_HOME=str(project / ".prefect"), DVC_NO_ANALYTICS="1",
               PREFECT_SERVER_ANALYTICS_ENABLED="false", OPENBLAS_NUM_THREADS="1")
    return env


def record(project: Path) -> dict | None:
    path = project / "lake" / "last_scheduled_run.json"
    return json.loads(path.read_text()) if path.exists() else None


def descendants(pid: int) -> list[int]:
    out = subprocess.run(["ps", "-o", "pid=", "--ppid", str(pid)], capture_output=True, text=True).stdout.split()
    children = [int(p) for p in out]
    return children + [d for c in children for d in descendants(c)]


def port_open(port: int) -> bool:
    with socket.socket() as s:
        return s.connect_ex(("127.0.0.1", port)) == 0


def stop(proc: subprocess.Popen, timeout: float = 60) -> list[int]:
    """Ctrl-C for `steptp serve`, then SIGKILL for whatever of ours is left; the pids that outlived Ctrl-C."""
    family = descendants(proc.pid)
    proc.send_signal(signal.SIGINT)
    try:
        proc.wait(timeout=timeout)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()
    deadline = time.monotonic() + 20
    left = [p for p in family if Path(f"/proc/{p}").exists()]
    while left and time.monotonic() < deadline:
        time.sleep(0.5)
        left = [p for p in family if Path(f"/proc/{p}").exists()]
    for pid in left:
        try:
            os.kill(pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
    return left


@pytest.fixture(scope="module")
def served(tmp_path_factory):
    """The copy served on a per-minute schedule until its first scheduled run ended (or 10 minutes)."""
    project = make_project(tmp_path_factory.mktemp("nightly") / "steptp")
    log = project.parent / "serve.log"
    with open(log, "w") as out:
        proc = subprocess.Popen([str(project / ".venv" / "bin" / "steptp"), "serve", "--cron", "* * * * *"],
                                cwd=project, env=project_env(project), stdout=out, stderr=subprocess.STDOUT,
                                start_new_session=True)
    started = time.monotonic()
    try:
        while time.monotonic() - started < 600 and proc.poll() is None:
            run = record(project)
            if run and run["state"] not in ("Running", None):
                break
            time.sleep(2)
        waited = time.monotonic() - started
        port = int(re.search(r"Prefect UI: http://127\.0\.0\.1:(\d+)", log.read_text()).group(1))
    finally:
        left = stop(proc)
    yield {"project": project, "log": log.read_text(), "waited_s": waited, "port": port, "left": left,
           "exit_code": proc.returncode}


def test_serve_starts_a_scheduled_run_that_completes_and_releases(served):
    project, run = served["project"], record(served["project"])
    assert run is not None, served["log"][-3000:]
    assert run["state"] == "Completed", run
    assert run["deployment"] == "steptp-nightly" and run["scheduled_for"].endswith(":00+00:00")  # on the minute
    assert run["release"] == "0.1.0" and run["tables_changed"] == ["lake/programs", "lake/steps",
                                                                    "lake/verifications", "lake/samples"]
    assert "Cannot schedule flows on an ephemeral server" not in served["log"]
    assert (project / "lake" / "releases" / "v0.1.0" / "croissant.json").exists()
    assert git(project, "tag", "--list").split() == ["data-v0.1.0"]
    assert git(project, "log", "-1", "--format=%s", "data-v0.1.0").strip() == "Data release v0.1.0"
    assert "dvc.lock" in git(project, "show", "--name-only", "--format=", "data-v0.1.0").split()
    remote = project.parent / "steptp-dvc-remote"
    assert remote.exists() and any(p.is_file() for p in remote.rglob("*"))  # dvc push stored the data
    # serving stopped cleanly: its own server is gone, nothing it started outlived Ctrl-C
    assert served["exit_code"] == 0 and served["left"] == [] and not port_open(served["port"])


def run_flow(project: Path) -> tuple[dict, str]:
    """One nightly run of the copy, started directly (a temporary Prefect server of its own)."""
    env = dict(project_env(project), PREFECT_LOGGING_LEVEL="INFO")
    done = subprocess.run([str(project / ".venv" / "bin" / "python"), "-c", RUN_FLOW], cwd=project, env=env,
                          capture_output=True, text=True, timeout=600)
    state = [json.loads(line[6:]) for line in done.stdout.splitlines() if line.startswith("STATE ")]
    assert state, done.stdout[-2000:] + done.stderr[-3000:]
    return state[0], done.stdout + done.stderr


def commit_param(project: Path, keys: tuple[str, ...], value) -> None:
    set_param(project / "params.yaml", keys, value)
    git(project, "commit", "-q", "-am", f"{'.'.join(keys)} = {value}")


def test_an_unchanged_night_recomputes_and_releases_nothing(served):
    project = served["project"]
    head = git(project, "rev-parse", "HEAD")
    started = time.monotonic()
    state, output = run_flow(project)
    wall = time.monotonic() - started
    assert state["name"] == "Completed", output[-3000:]
    assert "no release: the release tables did not change" in state["message"]
    assert "Running stage" not in output and "didn't change, skipping" in output  # DVC recomputed nothing
    run = record(project)
    assert run["release"] is None and run["tables_changed"] == [] and run["state"] == "Completed"
    assert git(project, "rev-parse", "HEAD") == head and git(project, "tag", "--list").split() == ["data-v0.1.0"]
    print(f"unchanged nightly run: {wall:.1f} s in all, dvc repro {run['repro_s']} s")


def test_a_refused_gate_fails_the_run_and_releases_nothing(served):
    project = served["project"]
    commit_param(project, ("filter", "max_strategy_share"), 0.01)  # no strategy may hold 1% of the release
    head, releases = git(project, "rev-parse", "HEAD"), sorted(os.listdir(project / "lake" / "releases"))
    state, output = run_flow(project)
    assert state["name"] == "Failed", output[-3000:]
    assert "release refused by the gate:" in state["message"]
    assert "- strategy_shares.share: expect_column_values_to_be_between failed" in state["message"]
    assert sorted(os.listdir(project / "lake" / "releases")) == releases
    assert git(project, "tag", "--list").split() == ["data-v0.1.0"] and git(project, "rev-parse", "HEAD") == head
    assert "version: 0.1.0" in (project / "params.yaml").read_text()
    run = record(project)
    assert run["state"] == "Failed" and run["release"] is None and "strategy_shares.share" in run["message"]
    commit_param(project, ("filter", "max_strategy_share"), 0.35)


def test_changed_tables_release_the_next_patch_version(served):
    project = served["project"]
    commit_param(project, ("filter", "multi_answer_fraction"), 1.0)  # more multi-answer samples
    state, output = run_flow(project)
    assert state["name"] == "Completed", output[-3000:]
    assert state["message"].startswith("released v0.1.1 (tag data-v0.1.1)")
    assert record(project)["tables_changed"] == ["lake/samples"]
    assert git(project, "tag", "--list").split() == ["data-v0.1.0", "data-v0.1.1"]
    tagged = git(project, "show", "data-v0.1.1:params.yaml")
    assert "  version: 0.1.1 " in tagged and "multi_answer_fraction: 1.0" in tagged  # the tag rebuilds it
    assert git(project, "status", "--porcelain", "--untracked-files=no") == ""
    changelog = (project / "lake" / "releases" / "v0.1.1" / "CHANGELOG.md").read_text()
    assert "previous release: v0.1.0" in changelog and (project / "lake" / "releases" / "v0.1.0").exists()
