"""Stages on a Dask cluster: the task runner, a cluster of worker "machines" on this host, and what a
flow asks of the cluster it runs on.

A stage's flow runs in the caller's process either way and writes every table; only its tasks go to
the workers (`--runner dask`). Each worker is single-threaded and non-daemonic, so that a task may
start the verification or timing pool's processes. A worker is a machine to the measure stage: it
times under its own fingerprint, and `STEPTP_MACHINE` in its environment names it where several
workers share a host (`local_cluster(machines=...)`).
"""
from __future__ import annotations

import os
from collections.abc import Iterator, Sequence
from contextlib import contextmanager

from gpu_tasks.fingerprint import MACHINE_NAME_ENV


def non_daemonic_workers() -> None:
    """Dask workers that may start processes of their own (the pools): set before a cluster starts."""
    import dask

    dask.config.set({"distributed.worker.daemon": False})


def dask_runner(address: str | None = None, workers: int = 2):
    """A Dask task runner: the cluster at `address`, or a local cluster of `workers` single-threaded
    worker processes that the runner starts and stops with the flow (one stage; `steptp run` starts
    one cluster for all its stages instead, `local_cluster`)."""
    from prefect_dask import DaskTaskRunner

    if address:
        return DaskTaskRunner(address=address)
    non_daemonic_workers()
    return DaskTaskRunner(cluster_kwargs={"n_workers": workers, "threads_per_worker": 1, "processes": True})


@contextmanager
def local_cluster(workers: int = 2, machines: Sequence[str] | None = None) -> Iterator[str]:
    """A scheduler and `workers` single-threaded worker processes on this host, for the length of the
    block; yields the scheduler's address. With `machines`, one name per worker: each worker runs
    with STEPTP_MACHINE set to its name, so that its timings carry a machine id of their own (the
    rehearsal of a cluster of several machines on one host)."""
    from distributed import Nanny, Scheduler, SpecCluster

    if machines is not None and len(machines) != workers:
        raise ValueError(f"local_cluster: {workers} workers but {len(machines)} machine names")
    import dask

    non_daemonic_workers()
    names = list(machines) if machines is not None else [str(i) for i in range(workers)]
    specs = {name: {"cls": Nanny, "options": {"nthreads": 1, "name": name,
                                             "env": {MACHINE_NAME_ENV: name} if machines is not None else {}}}
             for name in names}
    # A nanny runs in this process and puts `pre-spawn-environ` (allocator and thread settings) into
    # this process's environment before it starts its worker: none here, and the environment as it was.
    saved = dict(os.environ)
    try:
        with dask.config.set({"distributed.nanny.pre-spawn-environ": {}}), \
                SpecCluster(workers=specs, scheduler={"cls": Scheduler, "options": {"dashboard_address": None}},
                            silence_logs=40) as cluster:
            cluster.wait_for_workers(workers)
            os.environ.clear()
            os.environ.update(saved)
            yield cluster.scheduler_address
    finally:
        os.environ.clear()
        os.environ.update(saved)


def on_cluster() -> bool:
    """Whether the running flow sends its tasks to a Dask cluster."""
    from prefect.context import FlowRunContext

    context = FlowRunContext.get()
    return context is not None and type(context.task_runner).__name__ == "DaskTaskRunner"


def flow_client():
    """The Dask client of the running flow's task runner (started on first use)."""
    from prefect.context import FlowRunContext

    return FlowRunContext.get().task_runner.client


def on_every_worker(fn, *args) -> dict[str, tuple[str, object]]:
    """`fn(*args)` once in every worker of the running flow's cluster (waiting for one to join):
    (its address, the result) by worker name, sorted; each runs as a task pinned to its worker."""
    client = flow_client()
    client.wait_for_workers(1)
    workers = client.scheduler_info()["workers"]
    futures = {str(info.get("name", address)): (address, client.submit(fn, *args, workers=[address],
                                                                       allow_other_workers=False, pure=False))
               for address, info in workers.items()}
    return {name: (address, future.result()) for name, (address, future) in sorted(futures.items())}
