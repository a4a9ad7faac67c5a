"""Prefect set up offline and inside the project (shared/STACK.md, "Prefect 3.9").

Call `configure()` before importing prefect: state lives under `.prefect/` of the project, task
results under the lake, telemetry is off. `local_server()` runs one API server for a whole run, so
that every stage process talks to it instead of starting (and tearing down) its own.
"""
from __future__ import annotations

import contextlib
import os
import socket
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

from flows.config import ROOT


def configure(lake: Path | None = None) -> None:
    os.environ.setdefault("PREFECT_HOME", str(ROOT / ".prefect"))
    os.environ.setdefault("PREFECT_SERVER_ANALYTICS_ENABLED", "false")
    os.environ.setdefault("PREFECT_LOGGING_LEVEL", "WARNING")
    os.environ.setdefault("PREFECT_SERVER_LOGGING_LEVEL", "WARNING")
    os.environ.setdefault("PREFECT_LOCAL_STORAGE_PATH", str(Path(lake or ROOT / "lake").resolve() / ".prefect-results"))
    os.environ.setdefault("PREFECT_RESULTS_PERSIST_BY_DEFAULT", "true")
    os.environ.setdefault("GX_ANALYTICS_ENABLED", "false")


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@contextlib.contextmanager
def local_server(timeout_s: float = 120):
    """A Prefect API server on loopback for the duration of the block (reuses PREFECT_API_URL if set)."""
    if os.environ.get("PREFECT_API_URL"):
        yield os.environ["PREFECT_API_URL"]
        return
    configure()
    port = _free_port()
    home = Path(os.environ["PREFECT_HOME"])
    home.mkdir(parents=True, exist_ok=True)
    log = open(home / "server.log", "ab")
    proc = subprocess.Popen([sys.executable, "-m", "prefect", "server", "start", "--host", "127.0.0.1",
                             "--port", str(port)], stdout=log, stderr=subprocess.STDOUT)
    url = f"http://127.0.0.1:{port}/api"
    try:
        deadline = time.monotonic() + timeout_s
        while True:
            try:
                urllib.request.urlopen(url + "/health", timeout=2).read()
                break
            except OSError:
                if proc.poll() is not None or time.monotonic() > deadline:
                    raise RuntimeError(f"the Prefect server did not start; see {log.name}") from None
                time.sleep(0.5)
        os.environ["PREFECT_API_URL"] = url
        yield url
    finally:
        _flush_api_logs()  # before the server goes: logs still queued would end in "Error logging to API"
        os.environ.pop("PREFECT_API_URL", None)
        proc.terminate()
        try:
            proc.wait(timeout=20)
        except subprocess.TimeoutExpired:
            proc.kill()
        log.close()


def _flush_api_logs() -> None:
    try:
        from prefect.logging.handlers import APILogHandler

        APILogHandler.flush()
    except Exception:  # nothing was logged, or Prefect was never imported: nothing to send
        pass
