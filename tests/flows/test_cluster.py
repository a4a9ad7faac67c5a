"""A build on a Dask cluster of two worker "machines" on this host (each worker names its machine
with STEPTP_MACHINE): the same deterministic tables as the local runner, every program timed on one
of the machines, each step's effect computed within the machine that timed it."""
from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from flows.config import load_params

pytestmark = pytest.mark.filterwarnings("ignore::DeprecationWarning")

# Both programs of the tiny profile written for the CPU, so that the measure stage has two programs
# to share between the machines.
OVERRIDES = {"profiles": {"tiny": {"gpu_share": 0.0}}}
DETERMINISTIC = ("programs", "steps", "verifications", "samples", "follow_ups")
STAGES = ("generate", "transform", "verify", "filter", "follow_ups", "measure")
MACHINES = ("machine-a", "machine-b")


def table_bytes(lake: Path) -> dict[str, bytes]:
    return {p.relative_to(lake).as_posix(): p.read_bytes()
            for t in DETERMINISTIC for p in sorted((lake / t).glob("*.parquet"))}


@pytest.fixture(scope="module")
def harness(tmp_path_factory):
    os.environ["PREFECT_LOCAL_STORAGE_PATH"] = str(tmp_path_factory.mktemp("prefect-results"))
    from prefect.testing.utilities import prefect_test_harness

    with prefect_test_harness(server_startup_timeout=120):
        yield


@pytest.fixture(scope="module")
def builds(harness, tmp_path_factory):
    """The stages up to measure, once with the local runner and once on a cluster of two machines."""
    from flows.cluster import dask_runner, local_cluster
    from flows.pipeline import run_stage

    params = load_params(profile="tiny", overrides=OVERRIDES)
    local, cluster = tmp_path_factory.mktemp("local"), tmp_path_factory.mktemp("cluster")
    for stage in STAGES[:-1]:
        run_stage(stage, params, local / "lake", local / "reports")
    with local_cluster(2, machines=MACHINES) as address:
        results = {stage: run_stage(stage, params, cluster / "lake", cluster / "reports",
                                    task_runner=dask_runner(address)) for stage in STAGES}
    return local / "lake", cluster / "lake", results


def test_the_cluster_writes_the_local_runners_tables_byte_for_byte(builds):
    local, cluster, results = builds
    assert results["verify"]["verified"] == results["transform"]["rows"] > 10
    assert table_bytes(cluster) == table_bytes(local)
    assert len(table_bytes(local)) >= 8


def test_each_machine_times_programs_under_its_own_name_and_decides_their_steps(builds):
    from flows.measured import measured_rows
    from flows.storage import read_table

    _, lake, results = builds
    timings = read_table(lake, "timings").to_pylist()
    name_of = {r["machine_id"]: json.loads(r["machine"]).get("machine") for r in timings}
    assert sorted(name_of.values()) == sorted(MACHINES)  # two programs, two idle workers: one each
    assert results["measure"]["states_timed"] > 0 and results["measure"]["states_failed"] == 0
    program_machines = {}
    for r in timings:
        program_machines.setdefault(r["program_id"], set()).add(r["machine_id"])
    assert all(len(ms) == 1 for ms in program_machines.values()), program_machines  # one session each
    shards = sorted(p.stem for p in (lake / "timings").glob("*.parquet"))
    assert all(p.split("-", 1)[0] in name_of for p in shards)

    timed = {(r["machine_id"], r["state_id"]) for r in timings if r["status"] == "ok"}
    effects = [e for e in read_table(lake, "effects").to_pylist() if e["effect"] is not None]
    assert effects
    for e in effects:  # both sides of every effect were timed on the machine that reports it
        assert (e["machine_id"], e["before_state_id"]) in timed and (e["machine_id"], e["after_state_id"]) in timed

    measured = measured_rows(lake, "llvm")
    assert set(measured.machines) == set(name_of)
    deciding = [r for r in measured.deciding if r["machine_id"] is not None]
    assert {r["machine_id"] for r in deciding} == set(name_of)
    assert not measured.others  # no program was timed on both machines


def test_a_second_measure_on_the_cluster_reuses_every_program(builds, tmp_path):
    """A program timed on either machine of the cluster is not timed again (a resumed stage)."""
    from flows.cluster import dask_runner, local_cluster
    from flows.pipeline import run_stage
    from flows.storage import read_table

    _, lake, first = builds
    before = {t: read_table(lake, t).to_pylist() for t in ("timings", "effects")}
    environ = dict(os.environ)
    with local_cluster(2, machines=MACHINES) as address:
        again = run_stage("measure", load_params(profile="tiny", overrides=OVERRIDES), lake, tmp_path / "reports",
                          task_runner=dask_runner(address))
    assert again["states_timed"] == 0 and again["states_reused"] == first["measure"]["states"]
    key = lambda r: json.dumps(r, sort_keys=True, default=str)  # noqa: E731
    for table, rows in before.items():  # every machine's shards hold what they held
        assert sorted(map(key, read_table(lake, table).to_pylist())) == sorted(map(key, rows)), table
    assert dict(os.environ) == environ  # the nannies left this process's environment as it was


def test_a_family_goes_out_in_tasks_of_whole_programs():
    from flows.verify import task_chunks

    items = [({"program_id": p, "step_id": f"{p}{i}"}, "llvm") for p, n in (("a", 3), ("b", 2), ("c", 4))
             for i in range(n)]
    assert task_chunks(items, None) == [items]
    assert task_chunks([], 5) == []
    chunks = task_chunks(items, 5)
    assert [[s["program_id"] for s, _ in c] for c in chunks] == [list("aaabb"), list("cccc")]
    assert [[s["program_id"] for s, _ in c] for c in task_chunks(items, 3)] == [list("aaa"), list("bb"), list("cccc")]


def test_the_verification_pool_follows_the_profiles_size(harness):
    from flows.tasks import shared_pool

    one = shared_pool(load_params(profile="tiny", overrides={"verify": {"workers": 1}}))
    assert one.size == 1
    two = shared_pool(load_params(profile="tiny", overrides={"verify": {"workers": 2}}))
    assert two.size == 2 and two is shared_pool(load_params(profile="tiny", overrides={"verify": {"workers": 2}}))
    assert one._slots == []  # the pool of the other size was closed


@pytest.mark.slow
def test_a_worker_killed_mid_stage_costs_no_verdict(builds, tmp_path):
    """kill -9 of a worker while it verifies: the stage completes on the cluster (the task runs again
    elsewhere) and writes the local runner's verifications byte for byte."""
    import shutil
    import signal
    import threading
    import time

    from distributed import Client

    from flows.cluster import dask_runner, local_cluster
    from flows.pipeline import run_stage

    local, _, _ = builds
    lake = tmp_path / "lake"
    shutil.copytree(local, lake, ignore=shutil.ignore_patterns(".cache", ".prefect-results", "verifications"))
    params = load_params(profile="tiny", overrides=OVERRIDES)
    killed = []
    with local_cluster(2, machines=MACHINES) as address, Client(address) as client:
        victim = next(a for a, i in client.scheduler_info()["workers"].items() if i["name"] == MACHINES[1])
        pid = client.run(os.getpid, workers=[victim])[victim]

        def kill_when_busy():
            deadline = time.monotonic() + 120
            while time.monotonic() < deadline and not killed:
                if client.processing(workers=[victim]).get(victim):
                    os.kill(pid, signal.SIGKILL)
                    killed.append(pid)
                time.sleep(0.05)

        watcher = threading.Thread(target=kill_when_busy, daemon=True)
        watcher.start()
        result = run_stage("verify", params, lake, tmp_path / "reports", task_runner=dask_runner(address))
        watcher.join(timeout=5)
    assert killed, "the worker never took a task"
    assert result["verified"] == result["rows"] > 10
    mine = sorted((lake / "verifications").glob("*.parquet"))
    assert [p.read_bytes() for p in mine] == [p.read_bytes() for p in sorted((local / "verifications").glob("*.parquet"))]
