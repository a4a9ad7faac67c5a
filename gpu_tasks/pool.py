"""A pool of worker processes with a time limit per job: a crash or a hang costs one job, never the
caller (docs/cli.md, `steptp verify`).

Design:
- Workers are forked from a *fork server* that imported TVM once (`multiprocessing`'s forkserver
  with a preload list): every worker, first or replacement, starts warm in milliseconds, and is
  forked from a process that never ran a kernel (forking the caller itself would copy whatever
  thread pools TVM, OpenMP or PyTorch started there, a classic source of deadlocks). `spawn` would
  pay the ~2-4 s TVM import per worker.
- One duplex pipe per worker; the parent waits on all pipes and process sentinels at once with the
  nearest deadline as timeout. A worker whose pipe closes or whose process ends mid-job is reported
  as `crash` (with the signal); one past its deadline is killed and reported as `timeout`. Either way
  a fresh worker takes its slot and the remaining jobs go on.
- Results come back in input order (`imap` streams them as soon as the prefix is complete).
- Jobs may carry an affinity key (e.g. the original program of a transformation): an idle worker
  prefers pending jobs with the key of its previous job, then keys no other worker holds, so that the
  per-process build cache sees each original once.
- Untrusted code (a user's problem file, `steptp translate`) runs in a fresh process per job
  (`max_jobs_per_worker=1`, so that nothing it changes in a process reaches the next job) forked
  from the caller (`start_method="fork"`: the caller has imported what the jobs need and runs no
  threads of its own), with a memory limit besides the time limit (`memory_mb`: resident memory a
  job may add to its worker's; the parent samples it every `MEMORY_POLL_S` while jobs run, and a
  worker past it is killed and reported as `memory`).
"""
from __future__ import annotations

import multiprocessing as mp
import os
import signal
import sys
import time
from collections import OrderedDict, deque
from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass, field
from multiprocessing import context, popen_forkserver, spawn
from multiprocessing.connection import Connection, wait

from gpu_tasks.threads import kernel_process_env, set_thread_env

# Modules imported once in the fork server, so that every worker starts with TVM loaded (and
# without PyTorch, see worker_env).
DEFAULT_PRELOAD = ("gpu_tasks.worker_env", "gpu_tasks.jobs", "gpu_tasks.group_verify")
DEFAULT_TIMEOUT_S = 60.0
START_METHODS = ("forkserver", "fork")
MEMORY_POLL_S = 0.05  # how often running workers' memory is sampled when there is a memory limit


@dataclass(frozen=True, slots=True)
class Job:
    """`fn(*args)` in a worker; `fn` must be a module-level function (it travels by name)."""

    fn: Callable
    args: tuple = ()
    affinity: str = ""
    timeout_s: float | None = None


@dataclass(frozen=True, slots=True)
class JobFailure:
    """What came back instead of a result: `crash`, `timeout`, `memory` (past the pool's memory limit)
    or `error` (the job raised). A crash has the worker's exit code (negative: the signal that killed
    it) when it is known."""

    kind: str
    message: str
    exitcode: int | None = field(default=None, compare=False)


class WorkerPool:
    """`with WorkerPool(workers=2, timeout_s=30) as pool: results = pool.run(jobs)`."""

    def __init__(self, workers: int | None = None, timeout_s: float = DEFAULT_TIMEOUT_S,
                 threads_per_worker: int = 1, preload: Sequence[str] = DEFAULT_PRELOAD,
                 max_jobs_per_worker: int | None = None, start_method: str = "forkserver",
                 memory_mb: int | None = None):
        if start_method not in START_METHODS:
            raise ValueError(f"start_method must be one of {', '.join(START_METHODS)}, got {start_method!r}")
        self.size = workers or max(1, os.cpu_count() or 1)
        self.timeout_s = timeout_s
        self.threads_per_worker = threads_per_worker
        # Recycling bounds what a long run can leak in native code (LLVM, TVM) per process.
        self.max_jobs_per_worker = max_jobs_per_worker
        self.memory_mb = memory_mb
        self.replacements = 0  # workers started to replace a crashed or hung one
        self._ctx = mp.get_context(start_method)
        if start_method == "forkserver":
            self._ctx.set_forkserver_preload(list(preload))  # ignored once the fork server runs
        self._slots: list[_Worker] = [self._start() for _ in range(self.size)]

    # --- public ---------------------------------------------------------------------------------

    def run(self, jobs: Iterable[Job], on_result: Callable[[int, object], None] | None = None) -> list:
        """Every job's result (or `JobFailure`), in input order."""
        out = []
        for index, result in self.imap(jobs):
            if on_result is not None:
                on_result(index, result)
            out.append(result)
        return out

    def imap(self, jobs: Iterable[Job]) -> Iterator[tuple[int, object]]:
        """(index, result) in input order, each as soon as all earlier ones are done."""
        jobs = list(jobs)
        queue = _JobQueue(jobs)
        done: dict[int, object] = {}
        next_index = 0
        try:
            while next_index < len(jobs):
                self._dispatch(jobs, queue, done)
                self._collect(done)
                while next_index in done:
                    yield next_index, done.pop(next_index)
                    next_index += 1
        except KeyboardInterrupt:  # Ctrl-C: stop the running jobs at once, start nothing new
            for w in self._slots:
                if w.job is not None:
                    w.stop(kill=True)
                    w.job = None
            raise
        finally:
            self._abandon_running()

    def broadcast(self, fn: Callable, *args) -> list:
        """`fn(*args)` once in every worker (e.g. to read per-process statistics)."""
        if any(w.job is not None for w in self._slots):
            raise RuntimeError("broadcast while jobs are running")
        for w in self._slots:
            self._send(w, -1, Job(fn, args))
        done: dict[int, object] = {}
        while any(w.job is not None for w in self._slots):
            self._collect(done, by_slot=True)
        return [done[i] for i in range(self.size)]

    def close(self) -> None:
        for w in self._slots:
            w.stop()
        self._slots = []

    def __enter__(self) -> WorkerPool:
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    # --- workers ----------------------------------------------------------------------------------

    def _start(self) -> _Worker:
        parent_end, child_end = self._ctx.Pipe(duplex=True)
        args = (child_end, self.threads_per_worker)
        if self._ctx.get_start_method() == "fork":
            sys.stdout.flush()  # a forked child must not write the caller's buffered output again
            sys.stderr.flush()
            process = self._ctx.Process(target=serve, args=args, name="steptp-worker", daemon=True)
        else:
            process = _WarmProcess(target=serve, args=args, name="steptp-worker", daemon=True)
        with kernel_process_env():  # the fork server starts with the first worker and keeps this environment
            process.start()
        child_end.close()
        return _Worker(process, parent_end)

    def _replace(self, slot: int, graceful: bool = False) -> None:
        """A fresh worker in `slot`; the old one is killed, or asked to stop when `graceful`."""
        self._slots[slot].stop(kill=not graceful)
        self._slots[slot] = self._start()
        if not graceful:
            self.replacements += 1

    def _worn_out(self, w: _Worker) -> bool:
        return self.max_jobs_per_worker is not None and w.jobs_done >= self.max_jobs_per_worker

    def _dispatch(self, jobs: list[Job], queue: _JobQueue, done: dict[int, object]) -> None:
        for slot, w in enumerate(self._slots):
            while w.job is None:
                held = {o.affinity for o in self._slots if o is not w and o.affinity}
                index = queue.take(w.affinity, held)
                if index is None:
                    return
                try:
                    if not self._send(w, index, jobs[index]):
                        self._replace(slot)  # it died while idle: the job goes to its replacement
                        w = self._slots[slot]
                        if not self._send(w, index, jobs[index]):
                            done[index] = JobFailure("crash", "a fresh worker died before taking the job")
                except Exception as e:  # the job cannot be pickled: nothing was written to the pipe
                    done[index] = JobFailure("error", f"job could not be sent: {type(e).__name__}: {e}")

    def _send(self, w: _Worker, index: int, job: Job) -> bool:
        """False when the worker is gone; raises when the job cannot be pickled."""
        try:
            w.conn.send((index, job.fn, job.args))
        except (BrokenPipeError, ConnectionError, OSError):
            return False
        w.job = index
        w.affinity = job.affinity or w.affinity  # a job without a key leaves the warm cache as it is
        w.started = time.monotonic()
        w.deadline = w.started + (job.timeout_s or self.timeout_s)
        if self.memory_mb is not None:
            w.memory_base = resident_bytes(w.process.pid) or 0
        return True

    def _collect(self, done: dict[int, object], by_slot: bool = False) -> None:
        """Wait for at least one running job to finish, crash or pass its deadline."""
        running = [(slot, w) for slot, w in enumerate(self._slots) if w.job is not None]
        if not running:
            return
        timeout = max(0.0, min(w.deadline for _, w in running) - time.monotonic())
        if self.memory_mb is not None:
            timeout = min(timeout, MEMORY_POLL_S)
        ready = set(wait([w.conn for _, w in running] + [w.process.sentinel for _, w in running], timeout))
        now = time.monotonic()
        for slot, w in running:
            key = slot if by_slot else w.job
            if w.conn in ready or w.process.sentinel in ready:
                result, alive = w.receive()
                done[key] = result
                if not alive or self._worn_out(w):
                    self._replace(slot, graceful=alive)
            elif now >= w.deadline:
                limit = w.deadline - w.started
                done[key] = JobFailure("timeout", f"no result within {limit:.1f} s; the worker was killed")
                self._replace(slot)
            elif self._over_memory(w):
                done[key] = JobFailure("memory", f"the job's resident memory passed the limit of {self.memory_mb} MiB "
                                                 "(above its worker's own); the worker was killed")
                self._replace(slot)

    def _over_memory(self, w: _Worker) -> bool:
        if self.memory_mb is None:
            return False
        used = resident_bytes(w.process.pid)
        return used is not None and used - w.memory_base > self.memory_mb * 1024 * 1024

    def _abandon_running(self) -> None:
        """The consumer stopped early: workers still busy are replaced (their results would arrive
        out of turn in the next batch)."""
        for slot, w in enumerate(self._slots):
            if w.job is not None:
                self._replace(slot)


class _WarmProcess(context.ForkServerProcess):
    """A process forked from the fork server that does not re-run the caller's main module.

    multiprocessing normally re-imports `__main__` in every child so that functions defined there
    can be unpickled; for a script without an `if __name__ == "__main__"` guard that re-runs the
    script in each worker. Jobs here are module-level functions of importable modules, so the
    children skip it. (The preparation data is filtered by swapping a multiprocessing function for
    the duration of one start: start pools from one thread at a time.)"""

    @staticmethod
    def _Popen(process_obj):
        return _PopenWithoutMain(process_obj)


class _PopenWithoutMain(popen_forkserver.Popen):
    def _launch(self, process_obj):
        original = spawn.get_preparation_data

        def without_main(name):
            data = original(name)
            data.pop("init_main_from_name", None)
            data.pop("init_main_from_path", None)
            return data

        spawn.get_preparation_data = without_main
        try:
            super()._launch(process_obj)
        finally:
            spawn.get_preparation_data = original


class _Worker:
    def __init__(self, process, conn: Connection):
        self.process, self.conn = process, conn
        self.job: int | None = None
        self.jobs_done = 0
        self.affinity = ""
        self.deadline = self.started = 0.0
        self.memory_base = 0  # resident bytes when the running job started (pools with a memory limit)

    def receive(self) -> tuple[object, bool]:
        """(result, worker still alive)."""
        try:
            if self.conn.poll():
                status, payload = self.conn.recv()
                self.job = None
                self.jobs_done += 1
                return (payload if status == "ok" else JobFailure("error", payload)), True
        except (EOFError, OSError, ConnectionError):
            pass
        self.job = None
        message = self._death_message()
        return JobFailure("crash", message, self.process.exitcode), False

    def _death_message(self) -> str:
        self.process.join(timeout=1.0)
        code = self.process.exitcode
        if code is None:
            return "the worker closed its pipe"
        if code < 0:
            return f"the worker died from signal {signal.Signals(-code).name}"
        return f"the worker exited with status {code}"

    def stop(self, kill: bool = False) -> None:
        if not kill:
            try:
                self.conn.send(None)
            except (BrokenPipeError, ConnectionError, OSError):
                pass
            self.process.join(timeout=2.0)
        if self.process.is_alive():
            self.process.kill()
            self.process.join(timeout=2.0)
        self.conn.close()


class _JobQueue:
    """Pending job indices grouped by affinity key, keys in order of their first pending job."""

    def __init__(self, jobs: Sequence[Job]):
        self._keys: OrderedDict[str, deque[int]] = OrderedDict()
        for i, job in enumerate(jobs):
            self._keys.setdefault(job.affinity or f"\0{i}", deque()).append(i)

    def take(self, preferred: str, held: set[str]) -> int | None:
        if preferred in self._keys:
            return self._pop(preferred)
        for key in self._keys:
            if key not in held:
                return self._pop(key)
        return self._pop(next(iter(self._keys))) if self._keys else None

    def _pop(self, key: str) -> int:
        queue = self._keys[key]
        index = queue.popleft()
        if not queue:
            del self._keys[key]
        return index


def serve(conn: Connection, threads: int) -> None:
    """Worker main loop: run jobs until told to stop or the parent goes away."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # Ctrl-C is the parent's to handle
    set_thread_env(threads)
    while True:
        try:
            message = conn.recv()
        except (EOFError, OSError):
            return
        if message is None:
            return
        _index, fn, args = message
        try:
            reply = ("ok", fn(*args))
        except BaseException as e:  # a job must never take its worker down with a Python error
            reply = ("error", _error_text(e))
        try:
            conn.send(reply)
        except (BrokenPipeError, OSError):
            return
        except Exception as e:  # an unpicklable result
            conn.send(("error", f"result could not be sent back: {type(e).__name__}: {e}"))


def resident_bytes(pid: int) -> int | None:
    """Resident memory of process `pid` (Linux /proc), None when it is gone."""
    try:
        with open(f"/proc/{pid}/statm", encoding="ascii") as statm:
            return int(statm.read().split()[1]) * _PAGE_BYTES
    except (OSError, ValueError, IndexError):
        return None


_PAGE_BYTES = os.sysconf("SC_PAGE_SIZE")


def _error_text(error: BaseException) -> str:
    """`Type: message (at file:line)` of what a job raised: where it raised is what a bug report needs."""
    from leir.errors import describe_exception

    info = describe_exception(error)
    where = f" (at {info['file']}:{info['line']})" if info["file"] else ""
    return f"{info['type']}: {info['message']}{where}"
