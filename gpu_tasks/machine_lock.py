"""One timing at a time per machine: an exclusive `flock` on a lock file in the system temp folder
(shared by every checkout and process on the machine; STEPTP_TIMING_LOCK overrides the path)."""
from __future__ import annotations

import fcntl
import os
import tempfile
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path


def timing_lock_path() -> Path:
    return Path(os.environ.get("STEPTP_TIMING_LOCK") or Path(tempfile.gettempdir()) / "steptp-timing.lock")


@contextmanager
def timing_lock(path: Path | None = None, timeout_s: float = 600.0) -> Iterator[float]:
    """Hold the machine's timing lock; yields the seconds spent waiting for it. The kernel releases
    a flock when its holder dies, so a crashed timing never leaves the machine locked."""
    path = Path(path or timing_lock_path())
    path.parent.mkdir(parents=True, exist_ok=True)
    start = time.monotonic()
    with open(path, "a+b") as f:
        while True:
            try:
                fcntl.flock(f.fileno(), fcntl.LOCK_EX | fcntl.LOCK_NB)
                break
            except BlockingIOError:
                if time.monotonic() - start > timeout_s:
                    raise TimeoutError(f"timing lock {path} held for more than {timeout_s:.0f} s") from None
                time.sleep(0.01)
        try:
            yield time.monotonic() - start
        finally:
            fcntl.flock(f.fileno(), fcntl.LOCK_UN)
