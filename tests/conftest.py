"""Shared fixtures: the golden example programs (tests/data/programs.jsonl)."""
from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

DATA = Path(__file__).parent / "data"


def load_examples() -> list[dict]:
    return [json.loads(line) for line in (DATA / "programs.jsonl").read_text().splitlines() if line.strip()]


EXAMPLES = load_examples()


@pytest.fixture(params=EXAMPLES, ids=[e["name"] for e in EXAMPLES])
def example(request) -> dict:
    return request.param


def pytest_configure(config):
    # the Ctrl-C batch test, slow until its failure in full runs is understood: `-m "not slow or interrupt"`
    # runs the default suite with it, in its place (tests/cli/test_cli_translate_isolation.py)
    config.addinivalue_line("markers", "interrupt: the Ctrl-C batch test (see tests/cli/test_cli_translate_isolation.py)")


def pytest_sessionstart(session):
    # Under pytest-xdist (`make test`) each worker process keeps its own Prefect home: the servers that
    # the tests' `steptp` subprocesses start would otherwise share one SQLite database across workers.
    worker = os.environ.get("PYTEST_XDIST_WORKER")
    if worker:
        home = Path(os.environ.get("PREFECT_HOME") or Path(__file__).parents[1] / ".prefect") / f"xdist-{worker}"
        home.mkdir(parents=True, exist_ok=True)
        os.environ["PREFECT_HOME"] = str(home)
