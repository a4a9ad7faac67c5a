"""Prefect and DVC set up offline and inside the project (Prefect 3.9, DVC 3.67).

`configure()` runs when the `flows` package is imported, before any of its modules imports Prefect:
state lives under `.prefect/` of the project, task results under the lake, telemetry is off.
`local_server()` runs one API server for a whole run, so that every stage process talks to it
instead of starting (and tearing down) its own. `dvc_env()`,
`ensure_dvc()`: the environment and the repository that `dvc repro` runs in. Nothing here imports
Prefect or DVC, so that a command that only calls dvc stays fast.
"""
from __future__ import annotations

import contextlib
import os
import signal
import socket
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

from flows.config import ROOT

# The settings this module chose, with their values (not the user's own): a later call for a given
# lake may replace one that still holds the value chosen here.
_CHOSEN: dict[str, str] = {}


def configure(lake: Path | None = None) -> None:
    """Prefect's settings, each unless the environment has it already. The `flows` package calls it
    once, before any of its modules imports Prefect; a command that builds another lake calls it
    again with that lake, first thing, so that task results go under it."""
    _choose("PREFECT_HOME", str(ROOT / ".prefect"))
    _choose("PREFECT_SERVER_ANALYTICS_ENABLED", "false")
    _choose("PREFECT_LOGGING_LEVEL", "WARNING")
    _choose("PREFECT_SERVER_LOGGING_LEVEL", "WARNING")
    _choose("PREFECT_LOCAL_STORAGE_PATH", str(Path(lake or ROOT / "lake").resolve() / ".prefect-results"),
            replace=lake is not None)
    _choose("PREFECT_RESULTS_PERSIST_BY_DEFAULT", "true")
    _choose("GX_ANALYTICS_ENABLED", "false")


def _choose(name: str, value: str, replace: bool = False) -> None:
    if name not in os.environ or (replace and _CHOSEN.get(name) == os.environ[name]):
        os.environ[name] = _CHOSEN[name] = value


def die_with_parent():
    """A `preexec_fn` for a helper process that must not outlive this one (the Prefect server, `dvc
    repro`): on Linux the kernel sends it SIGTERM when this process ends, however it ends (kill -9
    included; prctl PR_SET_PDEATHSIG). None elsewhere, where the `finally` of the caller is all there is."""
    if not sys.platform.startswith("linux"):
        return None
    parent = os.getpid()

    def set_death_signal() -> None:
        import ctypes

        if ctypes.CDLL(None, use_errno=True).prctl(PR_SET_PDEATHSIG, signal.SIGTERM) != 0:
            return
        if os.getppid() != parent:  # the parent ended before the signal was armed
            os._exit(1)

    return set_death_signal


PR_SET_PDEATHSIG = 1  # linux/prctl.h


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _port_is_free(port: int) -> bool:
    with socket.socket() as s:
        try:
            s.bind(("127.0.0.1", port))
        except OSError:
            return False
    return True


def _api_url_setting(url: str):
    """Prefect reads its settings once, when imported: a process that imported it before the server
    started would otherwise go on using a temporary server of its own."""
    if "prefect" not in sys.modules:
        return contextlib.nullcontext()
    from prefect.settings import PREFECT_API_URL, temporary_settings

    return temporary_settings(updates={PREFECT_API_URL: url})


def _send_queued_logs() -> None:
    """Flow-run logs go to the API from a background queue: send what is left before the server stops
    (otherwise Prefect prints '--- Error logging to API ---' at exit)."""
    if "prefect" in sys.modules:
        from prefect.logging.handlers import APILogWorker

        APILogWorker.drain_all(timeout=5)


@contextlib.contextmanager
def local_server(timeout_s: float = 120, port: int | None = None):
    """A Prefect API server on loopback for the duration of the block (reuses PREFECT_API_URL if set),
    with its services: the scheduler that creates scheduled runs, and the UI at the URL without `/api`.
    `port`: a fixed port (the UI at a known address); by default a free one."""
    if os.environ.get("PREFECT_API_URL"):
        yield os.environ["PREFECT_API_URL"]
        return
    configure()
    if port and not _port_is_free(port):
        raise RuntimeError(f"port {port} on 127.0.0.1 is in use; pick another port")
    port = port or _free_port()
    home = Path(os.environ["PREFECT_HOME"])
    home.mkdir(parents=True, exist_ok=True)
    log = open(home / "server.log", "ab")
    proc = subprocess.Popen([sys.executable, "-m", "prefect", "server", "start", "--host", "127.0.0.1",
                             "--port", str(port)], stdout=log, stderr=subprocess.STDOUT,
                            preexec_fn=die_with_parent())
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
        with _api_url_setting(url):
            yield url
    finally:
        _send_queued_logs()
        os.environ.pop("PREFECT_API_URL", None)
        proc.terminate()
        try:
            proc.wait(timeout=20)
        except subprocess.TimeoutExpired:
            proc.kill()
        log.close()


def dvc_executable() -> str:
    """The venv's dvc (stage commands and dvc itself must not depend on what is first on PATH)."""
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
        raise RuntimeError(f"{ROOT} must be a git checkout for DVC")
    if not (ROOT / ".dvc").exists():
        for args in (["init", "--quiet"], ["config", "core.analytics", "false"],
                     ["remote", "add", "--default", "local", "../steptp-dvc-remote"]):
            subprocess.check_call([dvc_executable(), *args], cwd=ROOT, env=env)
