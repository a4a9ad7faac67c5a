"""The nightly build's decisions, each against the real tool it reads: what `dvc status` says changed,
what the gate wrote, what git holds (tags, uncommitted files), and the record that Prefect's state
hooks leave for `steptp lake status`. The scheduled run end to end is in test_nightly_schedule.py."""
from __future__ import annotations

import json
import os
import subprocess
import sys
import time
import types
import uuid
from pathlib import Path

import pytest
import yaml

from flows.config import ROOT
from flows.nightly import (
    RELEASE_TABLES,
    changed_release_tables,
    commit_and_tag,
    gate_refusal,
    pipeline_stages,
    released_versions,
    uncommitted_sources,
)

pytestmark = pytest.mark.filterwarnings("ignore::DeprecationWarning")
DVC = str(Path(sys.executable).with_name("dvc"))


def run(cmd: list[str], cwd: Path) -> str:
    env = dict(os.environ, DVC_NO_ANALYTICS="1", DVC_SITE_CACHE_DIR=str(cwd / ".dvc-site"))
    return subprocess.run(cmd, cwd=cwd, env=env, check=True, capture_output=True, text=True).stdout


def git_repo(path: Path) -> Path:
    path.mkdir(parents=True, exist_ok=True)
    for cmd in (["init", "-q"], ["config", "user.name", "t"], ["config", "user.email", "t@example.org"]):
        run(["git", *cmd], path)
    return path


def commit_all(repo: Path, message: str = "work") -> None:
    run(["git", "add", "-A"], repo)
    run(["git", "commit", "-q", "-m", message], repo)


# --- dvc status -> the release tables that changed ---------------------------------------------


def test_the_first_run_releases_everything_and_a_change_releases_what_changed(tmp_path):
    """A DVC project with the release stage's table deps: no release yet -> every table counts as changed;
    after the release stage ran, nothing; after one table changed, that table."""
    repo = git_repo(tmp_path / "p")
    for table in RELEASE_TABLES:
        (repo / table).mkdir(parents=True)
        (repo / table / "part-0.parquet").write_text(table)
    (repo / ".gitignore").write_text("/lake/\n/.dvc-site/\n")
    stage = {"cmd": "mkdir -p out && cat lake/samples/* > out/release.txt", "deps": list(RELEASE_TABLES),
             "outs": ["out"]}
    (repo / "dvc.yaml").write_text(yaml.safe_dump({"stages": {"release": stage}}))
    run([DVC, "init", "-q"], repo)
    commit_all(repo)

    def changed() -> list[str]:
        return changed_release_tables(json.loads(run([DVC, "status", "release", "--json"], repo)))

    assert changed() == list(RELEASE_TABLES)
    run([DVC, "repro", "-q", "release"], repo)
    assert changed() == []
    (repo / "lake" / "samples" / "part-0.parquet").write_text("other rows")
    assert changed() == ["lake/samples"]


def test_the_nightly_reproduces_every_stage_but_release_first():
    stages = list(yaml.safe_load((ROOT / "dvc.yaml").read_text())["stages"])
    assert pipeline_stages() == [s for s in stages if s != "release"]
    assert "validate" in pipeline_stages()  # the gate runs before anything is released
    release = yaml.safe_load((ROOT / "dvc.yaml").read_text())["stages"]["release"]
    assert set(RELEASE_TABLES) <= set(release["deps"])  # what decides a release is what the release reads


# --- the gate's verdict --------------------------------------------------------------------------


def test_gate_refusal_lists_the_failures_of_this_runs_gate(tmp_path):
    gate = tmp_path / "gate.json"
    assert gate_refusal(gate, time.time()) is None  # no gate report: not a refusal
    gate.write_text(json.dumps({"success": False, "expectations_checked": 19,
                                "failures": ["strategy_shares.share: expect_column_values_to_be_between failed",
                                             "splits: expect_column_distinct_values_to_equal_set failed"]}))
    written = gate.stat().st_mtime
    assert gate_refusal(gate, written + 5) is None  # written before this run: another run's verdict
    message = gate_refusal(gate, written - 5)
    assert message.splitlines() == ["release refused by the gate:",
                                    "- strategy_shares.share: expect_column_values_to_be_between failed",
                                    "- splits: expect_column_distinct_values_to_equal_set failed"]
    gate.write_text(json.dumps({"success": True, "expectations_checked": 19, "failures": []}))
    assert gate_refusal(gate, written - 5) is None


# --- git: versions, tags, uncommitted sources ----------------------------------------------------


def test_released_versions_come_from_folders_and_tags(tmp_path):
    repo = git_repo(tmp_path / "p")
    (repo / "a.txt").write_text("a")
    commit_all(repo)
    for name in ("v0.1.0", "v0.1.2", "vnext", ".v0.1.3.tmp"):
        (repo / "lake" / "releases" / name).mkdir(parents=True)
    for tag in ("data-v0.1.1", "data-v0.1.10", "v9.9.9", "data-vbad"):
        run(["git", "tag", tag], repo)
    assert released_versions(repo) == ["0.1.0", "0.1.1", "0.1.2", "0.1.10"]


def test_commit_and_tag_commits_the_lock_and_params_and_tags_that_commit(tmp_path):
    repo = git_repo(tmp_path / "p")
    (repo / "params.yaml").write_text("release:\n  version: 0.1.0\n")
    (repo / "code.py").write_text("x = 1\n")
    commit_all(repo, "code")
    (repo / "params.yaml").write_text("release:\n  version: 0.1.1\n")
    (repo / "dvc.lock").write_text("schema: '2.0'\n")  # new, untracked
    (repo / "code.py").write_text("x = 2\n")  # not the release's business: stays uncommitted
    assert commit_and_tag("0.1.1", ("dvc.lock", "params.yaml"), root=repo) == "data-v0.1.1"
    assert run(["git", "log", "-1", "--format=%s"], repo).strip() == "Data release v0.1.1"
    assert sorted(run(["git", "show", "--name-only", "--format=", "data-v0.1.1"], repo).split()) == \
        ["dvc.lock", "params.yaml"]
    assert run(["git", "status", "--porcelain"], repo).split() == ["M", "code.py"]
    head = run(["git", "rev-parse", "HEAD"], repo)
    assert commit_and_tag("0.1.1", ("dvc.lock", "params.yaml"), root=repo) == "data-v0.1.1"  # again: no-op
    assert run(["git", "rev-parse", "HEAD"], repo) == head


def test_uncommitted_sources_are_code_not_what_the_build_writes(tmp_path):
    repo = git_repo(tmp_path / "p")
    for name in ("dvc.lock", "params.yaml", "reports/gate.json", "flows/a.py", "flows/b.py", "my file.py"):
        (repo / name).parent.mkdir(parents=True, exist_ok=True)
        (repo / name).write_text("1\n")
    commit_all(repo)
    assert uncommitted_sources(repo) == []
    for name in ("dvc.lock", "params.yaml", "reports/gate.json", "my file.py"):
        (repo / name).write_text("2\n")
    run(["git", "mv", "flows/a.py", "flows/c.py"], repo)
    (repo / "untracked.py").write_text("new\n")  # untracked files are not part of any commit: ignored
    assert sorted(uncommitted_sources(repo)) == ["flows/c.py", "my file.py"]


# --- the record for `steptp lake status` ---------------------------------------------------------


@pytest.fixture
def lake(tmp_path, monkeypatch):
    import flows.nightly

    monkeypatch.setattr(flows.nightly, "LAKE", tmp_path / "lake")
    return tmp_path / "lake"


def a_run(name: str):
    return types.SimpleNamespace(id=uuid.uuid4(), name=name)


def test_state_hooks_record_the_final_state(lake):
    from prefect.states import Completed, Failed

    from flows.nightly import _record_final_state, _write_record, read_record

    night = a_run("quiet-night")
    _write_record({"flow_run_id": str(night.id), "flow_run_name": night.name, "state": "Running",
                   "release": "0.1.1", "message": "released v0.1.1 (tag data-v0.1.1)"})
    _record_final_state(None, night, Completed(message="All states completed."))
    record = read_record(lake)
    assert record["state"] == "Completed" and record["release"] == "0.1.1"
    assert record["message"] == "released v0.1.1 (tag data-v0.1.1)" and record["finished_at"]

    refused = a_run("refused-night")
    _write_record({"flow_run_id": str(refused.id), "flow_run_name": refused.name, "state": "Running",
                   "release": None, "message": None})
    _record_final_state(None, refused, Failed(message="GateRefused: release refused by the gate:\n- shares"))
    record = read_record(lake)
    assert record["state"] == "Failed" and record["release"] is None and "- shares" in record["message"]


def test_a_run_cancelled_while_another_runs_leaves_its_record_alone(lake):
    from prefect.states import Cancelled, Crashed

    from flows.nightly import _record_final_state, _write_record, read_record

    running = a_run("long-night")
    _write_record({"flow_run_id": str(running.id), "flow_run_name": running.name, "state": "Running",
                   "release": None, "message": None})
    _record_final_state(None, a_run("too-early"), Cancelled(message="deployment concurrency limit"))
    assert read_record(lake)["flow_run_name"] == "long-night" and read_record(lake)["state"] == "Running"
    _record_final_state(None, running, Crashed(message="the process was killed"))
    assert read_record(lake)["state"] == "Crashed"
    _record_final_state(None, a_run("next-night"), Cancelled(message="cancelled by hand"))
    record = read_record(lake)  # the last run was final: a later run's end is the news
    assert record["flow_run_name"] == "next-night" and record["state"] == "Cancelled"


@pytest.mark.slow
def test_an_explicit_release_records_itself_so_dvc_status_stays_clean(tmp_path):
    """`steptp release --version X` writes a release folder outside `dvc repro`; the release stage's
    output is the whole lake/releases, so the lock is stale until `record_release` commits the stages."""
    from flows.nightly import record_release

    repo = git_repo(tmp_path / "p")
    (repo / "lake" / "samples").mkdir(parents=True)
    (repo / "lake" / "samples" / "part-0.parquet").write_text("rows")
    (repo / ".gitignore").write_text("/lake/releases/\n/.dvc-site/\n/reports/\n")
    stages = {"validate": {"cmd": "mkdir -p reports && echo ok > reports/gate.json", "deps": ["lake/samples"],
                           "outs": [{"reports/gate.json": {"cache": False}}]},
              "release": {"cmd": "mkdir -p lake/releases/v0.1.0 && cp lake/samples/* lake/releases/v0.1.0/",
                          "deps": ["lake/samples", "reports/gate.json"],
                          "outs": [{"lake/releases": {"persist": True}}]}}
    (repo / "dvc.yaml").write_text(yaml.safe_dump({"stages": stages}))
    run([DVC, "init", "-q"], repo)
    commit_all(repo)
    run([DVC, "repro", "-q"], repo)

    def clean() -> bool:
        return json.loads(run([DVC, "status", "--json"], repo)) == {}

    assert clean()
    (repo / "lake" / "releases" / "v0.3.0").mkdir()  # what an explicit release writes beside the others
    (repo / "lake" / "releases" / "v0.3.0" / "part-0.parquet").write_text("rows")
    assert not clean()
    env = dict(os.environ, DVC_NO_ANALYTICS="1", DVC_SITE_CACHE_DIR=str(repo / ".dvc-site"))
    assert not record_release(env, tmp_path / "elsewhere", root=repo)  # another lake: DVC does not track it
    assert not clean()
    assert record_release(env, repo / "lake", root=repo)
    assert clean()
    run([DVC, "repro", "-q"], repo)  # and a repro afterwards keeps both releases
    assert sorted(p.name for p in (repo / "lake" / "releases").iterdir()) == ["v0.1.0", "v0.3.0"]
    assert clean()


def test_dvc_accepts_the_pipeline_file():
    """DVC's own schema check of dvc.yaml (a metric without its options broke `make run` once)."""
    out = subprocess.run([DVC, "stage", "list"], cwd=ROOT, capture_output=True, text=True)
    assert out.returncode == 0, out.stderr
    stages = [line.split()[0] for line in out.stdout.splitlines() if line.strip()]
    assert stages == list(yaml.safe_load((ROOT / "dvc.yaml").read_text())["stages"])
