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
import time
from functools import cache
from pathlib import Path

from rich.console import Console

from flows.config import ROOT, Params
from flows.keys import stable_id
from flows.storage import shards, write_shard

# The packages whose code decides each stage's data (as the stage's deps in dvc.yaml): a change to one
# of them changes that stage's shard keys, and only those.
STAGE_CODE = {
    "generate": ("leir", "workloads", "gpu_tasks"),
    "transform": ("leir", "strategies"),
    "verify": ("leir", "gpu_tasks"),
    "follow_ups": ("leir", "strategies", "gpu_tasks"),
    "tokens": ("leir",),
    "search": ("leir", "workloads", "strategies", "gpu_tasks", "search"),
}
CODE_PACKAGES = tuple(dict.fromkeys(p for pkgs in STAGE_CODE.values() for p in pkgs))
# The profile entries that decide what a stage's shard holds. The others (which families and workloads
# are selected, other stages' knobs) must not change its keys: a family added to the selection leaves
# the keys of the families already built as they were (incremental builds).
STAGE_PROFILE_KEYS = {
    "generate": ("workload_profile", "instances_per_workload", "dtypes", "extra_dtypes"),
    "transform": ("max_variants_per_site", "max_steps_per_program_strategy", "inline_depth", "inline_branches",
                  "leir_extensions", "min_parallel_work"),
    "verify": (),
    "follow_ups": ("leir_extensions", "min_parallel_work", "follow_ups"),
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


def shard_task(fn):
    """A cached shard task (key: its `key` argument), its result persisted zlib-compressed: rows of LEIR
    text pickle to ten times their Parquet size (the release build's cache reached 1.2 GB as plain
    pickle; Prefect's own `compressed/pickle` uses lzma, minutes of CPU at that size)."""
    from prefect import task
    from prefect.serializers import CompressedSerializer

    return task(cache_key_fn=key_from_arg, persist_result=True,
                result_serializer=CompressedSerializer(serializer="pickle", compressionlib="zlib"))(fn)


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
    """One worker pool per process (tasks on Dask workers get their own), of the profile's
    `verify.workers` processes: a stage asking for another size gets a pool of that size (the old one
    is closed). A daemonic process (a Dask worker started with daemon=True) cannot have children: it
    verifies in-process instead."""
    global _POOL
    import multiprocessing

    if multiprocessing.current_process().daemon:
        return None
    size, timeout_s = int(params.verify["workers"]), float(params.verify["timeout_s"])
    if _POOL is not None and (_POOL.size, _POOL.timeout_s) != (size, timeout_s):
        _POOL.close()
        _POOL = None
    if _POOL is None:
        from gpu_tasks.pool import WorkerPool

        _POOL = WorkerPool(workers=size, timeout_s=timeout_s)
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


def prepared_ahead(chunks: list, prepare, ahead: bool = True):
    """`prepare(chunk)` of each of `chunks`, in order, the next one computed in a thread while the
    caller works on the current one (verifies it in the worker pool: the shard's Python work and the
    pool's then overlap on the two cores). `ahead=False`: each in turn, in this thread (where the
    caller verifies in this process, whose LEIR caches are not shared across threads)."""
    if not ahead:
        yield from map(prepare, chunks)
        return
    from concurrent.futures import ThreadPoolExecutor

    with ThreadPoolExecutor(max_workers=1, thread_name_prefix="prepared-ahead") as pool:
        pending = pool.submit(prepare, chunks[0]) if chunks else None
        for k in range(len(chunks)):
            current = pending.result()
            pending = pool.submit(prepare, chunks[k + 1]) if k + 1 < len(chunks) else None
            yield current


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
    """Submit (name, task, args) and collect in order, with the stage's progress (shards, rows, rate,
    time left)."""
    futures = [(name, t.submit(*args)) for name, t, args in calls]
    results = {}
    with StageProgress(label, total=len(futures)) as progress:
        for name, fut in futures:
            results[name] = fut.result()
            progress.shard_done(name, _rows_of(results[name]))
    return results


def _rows_of(result) -> int:
    if isinstance(result, list):
        return len(result)
    if isinstance(result, dict):
        return sum(len(v) for v in result.values() if isinstance(v, list))
    return 0


class StageProgress:
    """A stage's progress: shards done of all, rows, rate and the time left. A Rich progress bar on a
    terminal; otherwise (a log, `dvc repro` in a pipe, a scheduled run) one line per shard, so that a
    20-minute stage never runs silent. `items` counts work inside the shards (states, steps) when the
    stage knows it; the estimate then follows the items, else the shards."""

    def __init__(self, label: str, total: int, unit: str = "rows", items: int | None = None):
        self.label, self.total, self.unit, self.items = label, total, unit, items
        self.done = self.rows = 0
        self.start = time.perf_counter()
        self._progress = self._bar = None

    def __enter__(self) -> StageProgress:
        if console.is_terminal and self.total:
            from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeRemainingColumn

            self._progress = Progress(TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(),
                                      TextColumn("{task.fields[detail]}"), TimeRemainingColumn(),
                                      console=console, transient=True)
            self._progress.start()
            self._bar = self._progress.add_task(self.label, total=self.items or self.total, detail="")
        return self

    def __exit__(self, *exc) -> None:
        if self._progress is not None:
            self._progress.stop()

    def shard_done(self, name: str, rows: int = 0) -> None:
        """One shard finished with `rows` rows."""
        self.done += 1
        self.rows += rows
        self._show(1 if not self.items else 0, f"shard {self.done}/{self.total} ({name})")

    def advance(self, items: int, rows: int | None = None) -> None:
        """`items` more of the stage's inner work done (one group, one batch)."""
        self.done += 1
        self.rows += items if rows is None else rows
        self._show(items, f"{self.done}/{self.total}")

    def _show(self, step: int, where: str) -> None:
        elapsed = time.perf_counter() - self.start
        rate = self.rows / elapsed if elapsed > 0 else 0.0
        detail = f"{self.rows:,} {self.unit}, {rate:,.1f}/s"
        if self._progress is not None:
            self._progress.update(self._bar, advance=step, detail=detail)
            return
        share = (self.rows / self.items) if self.items else (self.done / self.total if self.total else 1.0)
        left = elapsed * (1 - share) / share if share > 0 else float("nan")
        console.print(f"{self.label}: {where} done, {detail}, {elapsed:,.0f} s, ~{_duration(left)} left",
                      soft_wrap=True, highlight=False)


def _duration(seconds: float) -> str:
    if seconds != seconds:  # NaN: nothing done yet
        return "?"
    if seconds < 90:
        return f"{seconds:.0f} s"
    return f"{seconds / 60:.0f} min" if seconds < 5400 else f"{seconds / 3600:.1f} h"


def say(message: str) -> None:
    """Progress on the console. Flows call this rather than `console` itself: a Dask task runner
    pickles a flow's function by value with the globals it names, and a Console holds a lock."""
    console.print(message)
