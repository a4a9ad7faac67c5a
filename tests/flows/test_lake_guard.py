"""One writer per lake (flows.lake_guard): a second writer is refused naming the holder, the kernel frees
the lock of a killed holder, the stages a holder starts go on under its lock, and the temporary
folders of dead writers go when the next writer takes the lake."""
from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from typer.testing import CliRunner

from flows.config import ROOT
from flows.lake_guard import LOCK_ENV, LakeBusy, lake_lock

HOLD = """
import sys, time
from flows.lake_guard import lake_lock
with lake_lock(sys.argv[1], "test holder"):
    print("held", flush=True)
    time.sleep(120)
"""


@pytest.fixture
def holder(tmp_path):
    """A separate process that holds the lock of `tmp_path / 'lake'` until it is killed."""
    lake = tmp_path / "lake"
    env = {k: v for k, v in os.environ.items() if k != LOCK_ENV}
    proc = subprocess.Popen([sys.executable, "-c", HOLD, str(lake)], cwd=ROOT, env=env, stdout=subprocess.PIPE,
                            text=True)
    assert proc.stdout.readline().strip() == "held"
    yield lake, proc
    proc.kill()
    proc.wait()


def test_a_second_writer_is_refused_naming_the_holder(holder):
    lake, proc = holder
    with pytest.raises(LakeBusy) as refused:
        with lake_lock(lake, "second"):
            pass
    assert f"pid {proc.pid} (test holder) since " in str(refused.value)
    assert str(lake.resolve()) in str(refused.value)


def test_the_lock_of_a_killed_holder_is_free_at_once(holder):
    lake, proc = holder
    proc.send_signal(signal.SIGKILL)
    proc.wait()
    with lake_lock(lake, "after the kill") as held:
        assert json.loads((held / ".lock").read_text())["command"] == "after the kill"
    assert (lake / ".lock").read_text() == ""  # released: no holder named


def test_processes_started_under_the_lock_go_on_under_it(tmp_path):
    lake = tmp_path / "lake"
    with lake_lock(lake, "parent"):
        assert os.environ[LOCK_ENV] == str(lake.resolve())
        child = subprocess.run([sys.executable, "-c", "import sys; from flows.lake_guard import lake_lock\n"
                                "with lake_lock(sys.argv[1]): print('in')", str(lake)], cwd=ROOT,
                               capture_output=True, text=True)
        assert child.returncode == 0, child.stderr
        assert child.stdout.strip() == "in"
    assert LOCK_ENV not in os.environ


def test_another_lake_is_not_covered_by_the_parents_lock(tmp_path, holder):
    lake, _ = holder
    with lake_lock(tmp_path / "other"):  # the environment names the other lake, not this one
        with pytest.raises(LakeBusy):
            with lake_lock(lake):
                pass


def test_the_temporary_folders_of_dead_writers_go_when_the_lake_is_taken(tmp_path):
    lake = tmp_path / "lake"
    dead = [lake / "releases" / ".v0.1.0.tmp-abc123", lake / ".compare-xyz"]
    kept = [lake / "releases" / "v0.1.0", lake / "steps"]
    for p in dead + kept:
        (p / "data").mkdir(parents=True)
        (p / "data" / "f.parquet").write_bytes(b"x")
    with lake_lock(lake):
        assert not any(p.exists() for p in dead)
        assert all((p / "data" / "f.parquet").exists() for p in kept)


@pytest.mark.parametrize("command", [["stage", "generate"], ["run"], ["release", "--version", "0.9.0"]])
def test_a_command_that_writes_a_held_lake_refuses_before_starting_anything(holder, command):
    from cli.main import app

    lake, proc = holder
    started = time.perf_counter()
    result = CliRunner().invoke(app, [*command, "--profile", "tiny", "--lake", str(lake)])
    assert result.exit_code == 1, result.output
    assert f"another run holds the lake {lake.resolve()}: pid {proc.pid}" in result.output
    assert not (lake / "programs").exists() and not (lake / "releases").exists()
    assert time.perf_counter() - started < 60  # no Prefect server was started and waited for


@pytest.mark.slow
def test_two_runs_of_one_lake_publish_one_whole_release(tmp_path):
    """The case of the report: `steptp run --profile tiny --lake L &` then the same again. The second is
    refused at once naming the first; the first publishes a whole release that `lake status` lists."""
    steptp = Path(sys.executable).with_name("steptp")
    lake = tmp_path / "lake"
    env = {k: v for k, v in os.environ.items() if k not in (LOCK_ENV, "PREFECT_API_URL")}
    env["PREFECT_HOME"] = str(tmp_path / "prefect")
    args = [str(steptp), "run", "--profile", "tiny", "--lake", str(lake), "--reports", str(tmp_path / "reports")]
    first = subprocess.Popen(args, cwd=ROOT, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    deadline = time.monotonic() + 120
    while not (lake / ".lock").exists() or not (lake / ".lock").read_text():
        assert first.poll() is None and time.monotonic() < deadline, first.stderr.read()
        time.sleep(0.2)
    second = subprocess.run(args, cwd=ROOT, env=env, capture_output=True, text=True, timeout=120)
    assert second.returncode == 1
    assert f"another run holds the lake {lake.resolve()}: pid {first.pid} (steptp run)" in second.stderr
    _, err = first.communicate(timeout=1800)
    assert first.returncode == 0, err[-3000:]
    from flows.lake_guard import release_problems

    (release,) = sorted((lake / "releases").glob("v*"))
    assert release_problems(release) == []
    assert [p.name for p in (lake / "releases").iterdir()] == [release.name]  # no temporary folder left
