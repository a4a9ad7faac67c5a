"""The environment a pool's processes start with: a Dask nanny's trim threshold is not inherited."""
from __future__ import annotations

import os

import pytest

from gpu_tasks.threads import NANNY_MALLOC_VARIABLE, kernel_process_env, nanny_malloc_setting


def read_env(name: str) -> str | None:
    return os.environ.get(name)


@pytest.fixture
def nanny_env(monkeypatch):
    import dask
    import distributed  # noqa: F401  (a Dask worker has it imported)

    value = str(dask.config.get("distributed.nanny.pre-spawn-environ")[NANNY_MALLOC_VARIABLE])
    monkeypatch.setenv(NANNY_MALLOC_VARIABLE, value)
    return value


def test_the_nanny_setting_is_gone_inside_the_block_and_back_after(nanny_env):
    assert nanny_malloc_setting() == nanny_env
    with kernel_process_env():
        assert NANNY_MALLOC_VARIABLE not in os.environ
    assert os.environ[NANNY_MALLOC_VARIABLE] == nanny_env


def test_a_value_the_user_chose_stays(monkeypatch):
    import distributed  # noqa: F401  (as in a Dask worker: only the nanny's value goes)

    from gpu_tasks.torch_timing import CACHING_MALLOC_ENV

    monkeypatch.setenv(NANNY_MALLOC_VARIABLE, CACHING_MALLOC_ENV[NANNY_MALLOC_VARIABLE])
    assert nanny_malloc_setting() is None
    with kernel_process_env():
        assert os.environ[NANNY_MALLOC_VARIABLE] == CACHING_MALLOC_ENV[NANNY_MALLOC_VARIABLE]


def test_pool_workers_start_without_the_nanny_setting(nanny_env):
    """The fork server starts with the first worker: it and every worker forked from it run without
    the nanny's threshold (verification ran at half its rate with it). In a fresh process, as in a
    Dask worker, whose fork server has not started yet."""
    import subprocess
    import sys

    from flows.config import ROOT

    code = ("import distributed, os; from gpu_tasks.pool import Job, WorkerPool; "
            "from tests.gpu_tasks.test_process_env import read_env; "
            "pool = WorkerPool(workers=1, timeout_s=60); "
            f"print(pool.run([Job(read_env, ({NANNY_MALLOC_VARIABLE!r},))]), os.environ[{NANNY_MALLOC_VARIABLE!r}]); "
            "pool.close()")
    out = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=120,
                         env={**os.environ, "PYTHONPATH": str(ROOT)})
    assert out.returncode == 0, out.stderr[-2000:]
    assert out.stdout.split() == ["[None]", nanny_env]
