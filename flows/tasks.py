"""What every stage's flow shares: the code hash and cache keys of shard tasks, the worker pool, the
progress bar over submitted tasks, and writing one shard per family.

Shard tasks (one per workload family) are cached across runs: the key is the content of the shard's
inputs, the parameters the stage reads, and a hash of the project's code, and results persist under
`lake/.prefect-results`. A run killed at any point resumes from the finished tasks; shards are
written atomically (flows.storage), so no table is ever half-written. Stage modules import this
module, never `flows.pipeline` (which imports them).
"""
from __future__ import annotations

import atexit
import hashlib
from functools import cache
from pathlib import Path

from flows.prefect_env import configure

configure()

from rich.console import Console  # noqa: E402

from flows.config import ROOT, Params  # noqa: E402
from flows.keys import stable_id  # noqa: E402
from flows.storage import shards, write_shard  # noqa: E402

# The packages whose code decides each stage's data (as the stage's deps in dvc.yaml): a change to one
# of them changes that stage's shard keys, and only those.
STAGE_CODE = {
    "generate": ("leir", "workloads", "gpu_tasks"),
    "transform": ("leir", "strategies"),
    "verify": ("leir", "gpu_tasks"),
    "tokens": ("leir",),
    "search": ("leir", "workloads", "strategies", "gpu_tasks", "search"),
}
CODE_PACKAGES = tuple(dict.fromkeys(p for pkgs in STAGE_CODE.values() for p in pkgs))
# The profile entries that decide what a stage's shard holds. The others (which families and workloads
# are selected, other stages' knobs) must not change its keys: a family added to the selection leaves
# the keys of the families already built as they were (incremental builds).
STAGE_PROFILE_KEYS = {
    "generate": ("workload_profile", "instances_per_workload", "dtypes", "extra_dtypes"),
    "transform": ("max_variants_per_site", "max_steps_per_program_strategy", "inline_depth", "leir_extensions"),
    "verify": (),
    "tokens": ("token_states_per_family",),
    "search": (),
}
console = Console(stderr=True)


@cache
def code_hash(packages: tuple[str, ...] = CODE_PACKAGES) -> str:
    """sha256 over the source of `packages` (once per process: every shard key uses it, and the code
    does not change during a run)."""
    h = hashlib.sha256()
    for pkg in packages:
        for path in sorted((ROOT / pkg).rglob("*")):
            if path.suffix in (".py", ".lark") and "__pycache__" not in path.parts:
                h.update(path.relative_to(ROOT).as_posix().encode())
                h.update(path.read_bytes())
    return h.hexdigest()[:16]


def key_from_arg(context, parameters) -> str:
    """The `cache_key_fn` of shard tasks: the task's name and its `key` argument."""
    return f"{context.task.name}-{parameters['key']}"


def stage_key(stage: str, params: Params, lake: Path, *content) -> str:
    """Cache key of a shard task: its inputs, the parameters that decide them, the stage's code, and
    the lake (two lakes never share work, so each can be rebuilt from scratch to check determinism).
    Of the profile, only the entries that decide the stage's shards count; each shard's own inputs are
    in `content`."""
    keys = STAGE_PROFILE_KEYS.get(stage, tuple(sorted(params.profile)))
    profile = {k: params.profile.get(k) for k in keys}
    relevant = {"seed": params.seed, "profile": profile, "verify": params.verify}
    code = code_hash(STAGE_CODE.get(stage, CODE_PACKAGES))
    return stable_id(stage, str(Path(lake).resolve()), relevant, code, *content, length=32)


_POOL = None


def shared_pool(params: Params):
    """One worker pool per process (tasks on Dask workers get their own). A daemonic process (a Dask
    worker started with daemon=True) cannot have children: it verifies in-process instead."""
    global _POOL
    import multiprocessing

    if multiprocessing.current_process().daemon:
        return None
    if _POOL is None:
        from gpu_tasks.pool import WorkerPool

        _POOL = WorkerPool(workers=int(params.verify["workers"]), timeout_s=float(params.verify["timeout_s"]))
        atexit.register(_POOL.close)
    return _POOL


def write_table(lake: Path, table: str, results: dict[str, list[dict]]) -> int:
    """Write one shard per family, then drop shards that the current plan no longer has."""
    for name, rows in results.items():
        write_shard(lake, table, name, rows)
    for path in shards(lake, table):
        if path.stem not in results:
            path.unlink()
    return sum(len(r) for r in results.values())


def group(rows: list[dict], key) -> dict[str, list[dict]]:
    """Rows by key(row), in key order."""
    out: dict[str, list[dict]] = {}
    for r in rows:
        out.setdefault(key(r), []).append(r)
    return dict(sorted(out.items()))


def by_family(table, column="family") -> dict[str, list[dict]]:
    """A table's rows by their family column, in family order."""
    return group(table.to_pylist(), lambda r: r[column])


def run_tasks(label: str, calls: list[tuple[str, object, tuple]]) -> dict[str, list[dict]]:
    """Submit (name, task, args) and collect in order, with a progress bar."""
    from rich.progress import Progress

    futures = [(name, t.submit(*args)) for name, t, args in calls]
    results = {}
    with Progress(console=console, transient=True) as progress:
        bar = progress.add_task(label, total=len(futures))
        for name, fut in futures:
            results[name] = fut.result()
            progress.advance(bar)
    return results


def say(message: str) -> None:
    """Progress on the console. Flows call this rather than `console` itself: a Dask task runner
    pickles a flow's function by value with the globals it names, and a Console holds a lock."""
    console.print(message)
