"""The Prefect server a command starts ends with the command, however the command ends: kill -9 of a
stage used to leave the server running, and its idle threads starved the next build's timings."""
from __future__ import annotations

import os
import signal
import subprocess
import sys
import time

from flows.config import ROOT

SERVE = """
import os, time
from flows.prefect_env import local_server
with local_server():
    mine = []
    for entry in os.listdir("/proc"):
        try:
            if entry.isdigit() and open(f"/proc/{entry}/stat").read().split(") ")[1].split()[1] == str(os.getpid()):
                mine.append(entry)
        except OSError:
            pass
    print(" ".join(mine), flush=True)
    time.sleep(300)
"""


def _alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().split(") ")[1].split()[0] != "Z"  # a zombie has ended
    except FileNotFoundError:
        return False


def test_the_server_ends_when_its_command_is_killed(tmp_path):
    env = {k: v for k, v in os.environ.items() if k != "PREFECT_API_URL"}
    env["PREFECT_HOME"] = str(tmp_path / "prefect")
    command = subprocess.Popen([sys.executable, "-c", SERVE], cwd=ROOT, env=env, stdout=subprocess.PIPE, text=True)
    children = [int(p) for p in command.stdout.readline().split()]
    assert children, "the server process was not found"
    assert all(_alive(p) for p in children)
    command.send_signal(signal.SIGKILL)  # no `finally`, no atexit: only the kernel can end the server
    command.wait()
    deadline = time.monotonic() + 30
    while any(_alive(p) for p in children) and time.monotonic() < deadline:
        time.sleep(0.2)
    assert not any(_alive(p) for p in children)
