"""`steptp translate` runs each problem file in a process of its own (issue 28, finding 2): a file that
hangs, exits, crashes, exhausts memory, raises KeyboardInterrupt, replaces `json.dumps` or prints to
stdout costs its own record, which names the cause, and the batch goes on; Ctrl-C stops the batch.

The batch runs through the installed `steptp` command, as a user runs it: stdout must carry exactly
one JSON record per file whatever the files print."""
from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from gpu_tasks.pool import JobFailure

PROBLEMS = Path(__file__).parents[1] / "data" / "kernelbench"
STEPTP = Path(sys.executable).parent / "steptp"
GOOD = (PROBLEMS / "19_ReLU.py").read_text()

# What a hostile (or merely broken) problem file does, at import time; the cause its record must name.
HOSTILE = {
    "hang": ("while True:\n    pass\n", "timeout"),
    "exit": ("import os\nos._exit(3)\n", "exit"),
    "segfault": ("import ctypes\nctypes.string_at(0)\n", "signal"),
    "memory": ("blocks = [bytearray(1 << 30) for _ in range(50)]\n", "memory"),
    "interrupt": ("raise KeyboardInterrupt('raised by the file')\n", "interrupted"),
}
FORGED = '{"file": "forged.py", "ok": true, "forged": true}'


def _write(folder: Path, name: str, text: str) -> Path:
    path = folder / f"{name}.py"
    path.write_text(text)
    return path


def _run(files, *options, env=None, timeout=600):
    return subprocess.run([str(STEPTP), "translate", *map(str, files), "--max-elements", "64", *options],
                          capture_output=True, text=True, timeout=timeout, env=env)


def test_each_hostile_file_costs_its_own_record_and_names_the_cause(tmp_path):
    files = [_write(tmp_path, "good_first", GOOD)]
    for name, (code, _) in HOSTILE.items():
        files.append(_write(tmp_path, name, code))
    # a file that replaces json.dumps and one that prints a record of its own, each followed by a good file
    files.append(_write(tmp_path, "forge_json", f"import json\njson.dumps = lambda *a, **k: {FORGED!r}\n" + GOOD))
    files.append(_write(tmp_path, "after_forge", GOOD))
    files.append(_write(tmp_path, "prints", f"print({FORGED!r}, flush=True)\n" + GOOD))
    files.append(_write(tmp_path, "good_last", GOOD))
    start = time.monotonic()
    result = _run(files, "--timeout", "15", "--memory", "256")
    wall = time.monotonic() - start
    lines = result.stdout.splitlines()
    records = [json.loads(line) for line in lines]  # every line of stdout is one record
    assert result.returncode == 1 and "Traceback" not in result.stderr
    assert [r["file"] for r in records] == [str(f) for f in files]
    by_name = {Path(r["file"]).stem: r for r in records}
    for name, (_, cause) in HOSTILE.items():
        assert not by_name[name]["ok"] and by_name[name]["cause"] == cause, by_name[name]
    assert "15 s" in by_name["hang"]["error"]
    assert "status 3" in by_name["exit"]["error"]
    assert "SIGSEGV" in by_name["segfault"]["error"]
    assert "256 MiB" in by_name["memory"]["error"]
    assert by_name["interrupt"]["exception"]["type"] == "KeyboardInterrupt"
    assert by_name["interrupt"]["exception"]["line"] == 1
    for name in ("good_first", "after_forge", "prints", "good_last"):
        assert by_name[name]["ok"] and by_name[name]["verification"]["status"] == "exact", by_name[name]
    assert "forged" not in result.stdout and not by_name["forge_json"]["ok"]
    assert wall < 15 + 120  # the hang costs its time limit, the others seconds


# Out of the default suite until its cause is found: in two full `make test` runs from fresh clones
# (2026-12-01, one loaded, one quiet) the batch printed nothing within 30 s of Ctrl-C, while the test
# passed in all 10 runs alone or with tests/cli (8.5 s). Suspect: the SIGINT reaching the worker that
# was just forked for the next file before it ignores the signal (gpu_tasks.pool.serve). Still run
# by `make test-all` (-m slow), and with the default suite by `pytest -m "not slow or interrupt"`; where it
# fails it now prints every thread's stack (SIGUSR1, cli.main) and the batch's processes.
@pytest.mark.slow
@pytest.mark.interrupt
def test_ctrl_c_stops_the_batch_and_its_processes(tmp_path):
    pid_file = tmp_path / "hang.pid"
    hang = _write(tmp_path, "hang", "import os\nopen(os.environ['HANG_PID_FILE'], 'w').write(str(os.getpid()))\n"
                                    "while True:\n    pass\n")
    files = [_write(tmp_path, "good", GOOD), hang, _write(tmp_path, "never", GOOD)]
    env = dict(os.environ, HANG_PID_FILE=str(pid_file))
    proc = subprocess.Popen([str(STEPTP), "translate", *map(str, files), "--max-elements", "64"], env=env,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, start_new_session=True)
    try:
        first = json.loads(proc.stdout.readline())
        deadline = time.monotonic() + 60
        while not pid_file.exists() or not pid_file.read_text():
            assert time.monotonic() < deadline, "the hanging file never started"
            time.sleep(0.1)
        os.killpg(proc.pid, signal.SIGINT)  # what the terminal sends on Ctrl-C: the whole group
        try:
            out, err = proc.communicate(timeout=30)
        except subprocess.TimeoutExpired:  # say where it is stuck: every thread's stack (cli.main)
            proc.send_signal(signal.SIGUSR1)
            time.sleep(2)
            children = subprocess.run(["ps", "-o", "pid,ppid,stat,args", "--ppid", str(proc.pid)],
                                      capture_output=True, text=True).stdout
            os.killpg(proc.pid, signal.SIGKILL)
            out, err = proc.communicate()
            pytest.fail(f"no exit within 30 s of Ctrl-C; stdout:\n{out}\nstderr (stacks):\n{err}\nchildren:\n{children}")
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
    assert first["ok"] and out == ""
    assert proc.returncode == 130 and "interrupted: 1 of 3 files translated" in err and "Traceback" not in err
    hung = int(pid_file.read_text())
    deadline = time.monotonic() + 10
    while Path(f"/proc/{hung}").exists() and time.monotonic() < deadline:
        time.sleep(0.1)
    assert not Path(f"/proc/{hung}").exists(), "the hanging file's process outlived the batch"


def test_records_are_made_by_the_batch_from_what_came_back():
    from cli.translate import file_record

    path = Path("p.py")
    timeout = file_record(path, JobFailure("timeout", "x"), 7, 100)
    assert timeout["cause"] == "timeout" and "7 s" in timeout["error"] and timeout["file"] == "p.py"
    signal_record = file_record(path, JobFailure("crash", "x", exitcode=-signal.SIGKILL), 7, 100)
    assert signal_record["cause"] == "signal" and "SIGKILL" in signal_record["error"]
    exit_record = file_record(path, JobFailure("crash", "x", exitcode=9), 7, 100)
    assert exit_record["cause"] == "exit" and "status 9" in exit_record["error"]
    memory = file_record(path, JobFailure("memory", "x"), 7, 100)
    assert memory["cause"] == "memory" and "100 MiB" in memory["error"]
    # the file's process cannot name another file or slip in fields of its own
    made = file_record(path, {"file": "other.py", "ok": True, "leir": "x", "injected": 1}, 7, 100)
    assert made["file"] == "p.py" and made["ok"] is True and "injected" not in made
    bad = file_record(path, {"ok": "yes"}, 7, 100)
    assert bad["ok"] is False and bad["cause"] == "exception"
    assert file_record(path, ["not", "a", "record"], 7, 100)["ok"] is False


@pytest.mark.parametrize("option", [["--max-elements", "-5"], ["--max-elements", "0"], ["--draws", "0"],
                                    ["--timeout", "0"], ["--memory", "1"], ["--workers", "0"], ["--set", "N"]])
def test_option_values_are_refused_at_the_boundary(option):
    from typer.testing import CliRunner

    from cli.main import app

    result = CliRunner().invoke(app, ["translate", str(PROBLEMS / "19_ReLU.py"), *option])
    assert result.exit_code == 2 and result.stdout.strip() == "" and "Traceback" not in result.output


@pytest.mark.slow
def test_a_batch_of_200_files_with_four_hostile_ones_gives_204_records(tmp_path):
    """The issue's done-when, through `benchmarks/bench_translate_batch.py`: 204 records in order, the
    four hostile files with their causes, within the time limits (the hang costs one)."""
    sys.path.insert(0, str(Path(__file__).parents[2] / "benchmarks"))
    from bench_translate_batch import check, make_batch, run_batch

    files, causes = make_batch(tmp_path, 200)
    records, wall, code = run_batch(files, timeout=60, memory=2048, workers=2)
    assert len(files) == len(records) == 204 and code == 1
    assert check(files, causes, records) == []
    assert sum(r["ok"] for r in records) >= 190
    assert wall < 60 + 204 * 10  # nothing waited on the hanging file but its own worker
