"""`steptp serve` and `steptp lake status` on the nightly build: a clear error instead of a server
that cannot start, and the last scheduled run (time, state, release made or not) in the status."""
from __future__ import annotations

import json
import socket

import pytest
from typer.testing import CliRunner

from cli.main import app
from flows.storage import SCHEDULED_RUN_LOG


@pytest.fixture
def runner():
    return CliRunner()


def test_serve_says_when_its_port_is_taken(runner, monkeypatch, tmp_path):
    monkeypatch.delenv("PREFECT_API_URL", raising=False)
    monkeypatch.setenv("PREFECT_HOME", str(tmp_path / "prefect"))
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        result = runner.invoke(app, ["serve", "--cron", "* * * * *", "--port", str(port)])
    assert result.exit_code == 1
    assert f"error: port {port} on 127.0.0.1 is in use" in result.output
    assert not (tmp_path / "prefect" / "server.log").exists()  # no server was started


def test_serve_help_explains_the_schedule_and_the_server(runner):
    result = runner.invoke(app, ["serve", "--help"], env={"COLUMNS": "200"})
    assert result.exit_code == 0
    text = " ".join(result.output.split())
    for phrase in ("dvc repro", "data-vX.Y.Z", "PREFECT_API_URL", "--port", "--cron", "lake status"):
        assert phrase in text, phrase


def write_run(lake, **fields) -> None:
    lake.mkdir(parents=True, exist_ok=True)
    record = {"flow_run_id": "0193", "flow_run_name": "wise-owl", "deployment": "steptp-nightly",
              "scheduled_for": "2026-12-01T03:00:00+00:00", "started_at": "2026-12-01T03:00:02+00:00",
              "finished_at": "2026-12-01T03:00:09+00:00", "state": "Completed", "message": None,
              "release": None, "tables_changed": [], "repro_s": 2.1}
    record.update(fields)
    (lake / SCHEDULED_RUN_LOG).write_text(json.dumps(record))


def status_text(runner, lake) -> str:
    result = runner.invoke(app, ["lake", "status", "--lake", str(lake)], env={"COLUMNS": "200"})
    assert result.exit_code == 0, result.output
    return result.output


def test_lake_status_shows_the_last_scheduled_run(runner, tmp_path):
    lake = tmp_path / "lake"
    lake.mkdir()
    assert "last scheduled run: - (none yet: `steptp serve` schedules the nightly build)" in status_text(runner, lake)

    write_run(lake, state="Completed", release="0.1.1", message="released v0.1.1 (tag data-v0.1.1)")
    assert ("last scheduled run: 2026-12-01T03:00:09+00:00 Completed, released v0.1.1 (flow run wise-owl)"
            in status_text(runner, lake))

    write_run(lake, state="Completed", message="no release: the release tables did not change since the last release")
    text = status_text(runner, lake)
    assert "Completed, no release (flow run wise-owl)" in text and "  no release: the release tables did not" in text

    write_run(lake, state="Failed", message="Flow run encountered an exception: GateRefused: release refused by "
              "the gate:\n- strategy_shares.share: expect_column_values_to_be_between failed")
    text = status_text(runner, lake)
    assert "Failed, no release (flow run wise-owl)" in text
    assert "  - strategy_shares.share: expect_column_values_to_be_between failed" in text

    write_run(lake, state="Running", finished_at=None)
    assert "2026-12-01T03:00:02+00:00 Running, release pending" in status_text(runner, lake)

    result = runner.invoke(app, ["lake", "status", "--lake", str(lake), "--json"])
    assert json.loads(result.output)["last_scheduled_run"]["state"] == "Running"


@pytest.mark.parametrize("command", [["stage", "generate"], ["run"]])
def test_prefect_results_go_under_the_lake_the_command_builds(runner, monkeypatch, tmp_path, command):
    """`--lake X`: the task cache a killed run resumes from is X/.prefect-results, not the project's
    lake/ (an explicit PREFECT_LOCAL_STORAGE_PATH is kept)."""
    import contextlib
    import os

    import flows.pipeline
    import flows.prefect_env

    seen = []
    monkeypatch.setattr(flows.prefect_env, "local_server", contextlib.nullcontext)
    monkeypatch.setattr(flows.pipeline, "run_stage", lambda *a, **k: seen.append(os.environ["PREFECT_LOCAL_STORAGE_PATH"]))
    monkeypatch.setattr(flows.pipeline, "pipeline_flow", lambda *a, **k: seen.append(os.environ["PREFECT_LOCAL_STORAGE_PATH"]))
    monkeypatch.setattr(flows.pipeline, "gate_refusal", lambda result: None)
    monkeypatch.delenv("PREFECT_LOCAL_STORAGE_PATH", raising=False)
    lake = tmp_path / "elsewhere"
    result = runner.invoke(app, [*command, "--profile", "tiny", "--lake", str(lake)])
    assert result.exit_code == 0, result.output
    assert seen == [str(lake.resolve() / ".prefect-results")]
    monkeypatch.setenv("PREFECT_LOCAL_STORAGE_PATH", str(tmp_path / "mine"))
    seen.clear()
    assert runner.invoke(app, [*command, "--profile", "tiny", "--lake", str(lake)]).exit_code == 0
    assert seen == [str(tmp_path / "mine")]


def test_serve_refuses_a_schedule_that_is_not_cron_in_one_line(runner, monkeypatch, tmp_path):
    monkeypatch.delenv("PREFECT_API_URL", raising=False)
    monkeypatch.setenv("PREFECT_HOME", str(tmp_path / "prefect"))
    result = runner.invoke(app, ["serve", "--cron", "61 * * * *"])
    assert result.exit_code == 2
    assert result.output.startswith("error: --cron '61 * * * *' is not a cron schedule")
    assert len(result.output.strip().splitlines()) == 1
    assert not (tmp_path / "prefect" / "server.log").exists()


def test_lake_status_without_a_lake_is_an_error(runner, tmp_path):
    result = runner.invoke(app, ["lake", "status", "--lake", str(tmp_path / "nonexistent")])
    assert result.exit_code == 2 and "no lake at" in result.output


def test_lake_status_names_a_truncated_shard_and_exits_1(runner, tmp_path):
    from flows.storage import write_shard

    lake = tmp_path / "lake"
    good = write_shard(lake, "programs", "a", [{"program_id": "p1", "workload": "matmul", "seed": 1}])
    bad = lake / "programs" / "b.parquet"
    bad.write_bytes(good.read_bytes()[:40])
    result = runner.invoke(app, ["lake", "status", "--lake", str(lake), "--json"])
    assert result.exit_code == 1, result.output
    info = json.loads(result.output)
    assert info["tables"]["programs"] == {"shards": 2, "rows": 1}
    assert list(info["unreadable_shards"]) == [str(bad)]
    table = runner.invoke(app, ["lake", "status", "--lake", str(lake)], env={"COLUMNS": "300"})
    assert table.exit_code == 1 and f"unreadable shard (not counted): {bad}" in " ".join(table.output.split())
