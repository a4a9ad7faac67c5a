"""The lake's writers: one at a time, and releases whole.

`lake_lock(lake, command)` holds an exclusive lock on `lake/.lock` while a command writes the lake
(`steptp run`, `stage`, `repro`, `release`, the nightly build). A second writer is refused at once
with who holds the lake and since when (`LakeBusy`), never queued: two builds of one lake would each
replace shards the other reads. The lock is an `fcntl.flock` on an open file, so the kernel releases
it when its holder exits, killed or not: a stale lock cannot be left behind. The processes a holder
starts (`dvc repro` runs `steptp stage` once per stage) inherit the lock through LOCK_ENV and do not
take it again. Under the lock no other writer runs, so the temporary folders a killed writer left
(`.v*.tmp-*` under `releases/`, `.compare-*`) are removed.

`release_problems(folder)` says whether a release folder is whole, against its own Croissant metadata,
which lists every file of the release with its sha256 (flows.release writes it last, just before the
folder is renamed into place). `lake status` lists a release with its problems, and the release stage
refuses to compare a new build against a damaged one. No Prefect, no mlcroissant: a status command
stays fast.
"""
from __future__ import annotations

import contextlib
import datetime
import fcntl
import hashlib
import json
import os
import re
import shutil
import sys
from pathlib import Path

SEMVER = re.compile(r"^(0|[1-9]\d*)\.(0|[1-9]\d*)\.(0|[1-9]\d*)$")  # a published version
LOCK_ENV = "STEPTP_LAKE_LOCK"  # the resolved lake whose lock an ancestor process holds
LOCK_FILE = ".lock"
# The temporary folders of writers (flows.release): unique per writer, removed when a writer dies.
STALE_TEMP_PATTERNS = (("releases", ".v*.tmp-*"), (".", ".compare-*"))


class LakeBusy(RuntimeError):
    """Another process holds the lake's write lock."""


def _holder(path: Path) -> str:
    try:
        info = json.loads(path.read_text(encoding="utf-8") or "{}")
    except (OSError, ValueError):
        info = {}
    if not isinstance(info, dict) or not info:
        return "another process"
    return f"pid {info.get('pid', '?')} ({info.get('command', '?')}) since {info.get('since', '?')}"


def remove_stale_temps(lake: Path) -> list[Path]:
    """The temporary folders of writers that died (call only under the lock); returns what went."""
    gone = []
    for folder, pattern in STALE_TEMP_PATTERNS:
        base = lake / folder
        for path in sorted(base.glob(pattern)) if base.is_dir() else []:
            if path.is_dir() and not path.is_symlink():
                shutil.rmtree(path, ignore_errors=True)
                gone.append(path)
    return gone


@contextlib.contextmanager
def lake_lock(lake: Path, command: str | None = None):
    """Hold `lake`'s write lock for the block (or go on under an ancestor's, LOCK_ENV). Raises
    LakeBusy, naming the holder, when another process holds it."""
    lake = Path(lake).resolve()
    if os.environ.get(LOCK_ENV) == str(lake):
        yield lake
        return
    lake.mkdir(parents=True, exist_ok=True)
    path = lake / LOCK_FILE
    fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
    try:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            raise LakeBusy(f"another run holds the lake {lake}: {_holder(path)}; wait for it to finish "
                           f"(or stop it), then run again") from None
        info = {"pid": os.getpid(), "command": command or " ".join(Path(a).name if i == 0 else a
                                                                   for i, a in enumerate(sys.argv)),
                "since": datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds")}
        os.ftruncate(fd, 0)
        os.pwrite(fd, (json.dumps(info) + "\n").encode(), 0)
        remove_stale_temps(lake)
        previous = os.environ.get(LOCK_ENV)
        os.environ[LOCK_ENV] = str(lake)
        try:
            yield lake
        finally:
            if previous is None:
                os.environ.pop(LOCK_ENV, None)
            else:
                os.environ[LOCK_ENV] = previous
            os.ftruncate(fd, 0)
    finally:
        os.close(fd)

CARD_FILES = ("README.md", "CHANGELOG.md", "croissant.json")


def release_problems(folder: Path, hashes: bool = True) -> list[str]:
    """What is wrong with release `folder` (empty when whole): a missing card file, an unreadable
    `croissant.json`, a listed file that is missing or (with `hashes`) whose sha256 differs, a data
    file the metadata does not list."""
    folder = Path(folder)
    missing = [f for f in CARD_FILES if not (folder / f).is_file()]
    if "croissant.json" in missing:
        return [f"missing {', '.join(missing)}"]
    try:
        meta = json.loads((folder / "croissant.json").read_text(encoding="utf-8"))
        listed = {d["contentUrl"]: d.get("sha256") for d in meta.get("distribution", [])}
    except (OSError, ValueError, KeyError, TypeError, AttributeError) as e:
        return [f"croissant.json cannot be read: {e}"]
    problems = [f"missing {', '.join(missing)}"] if missing else []
    absent = [f for f in sorted(listed) if not (folder / f).is_file()]
    data = [f for f in absent if f not in missing]  # the card's own files are named above
    if data:
        more = " ..." if len(data) > 5 else ""
        problems.append(f"{len(data)} listed file(s) missing: {', '.join(data[:5])}{more}")
    if hashes:
        changed = [f for f in sorted(listed) if f not in absent and listed[f]
                   and hashlib.sha256((folder / f).read_bytes()).hexdigest() != listed[f]]
        if changed:
            problems.append(f"{len(changed)} file(s) differ from their sha256: {', '.join(changed[:5])}")
    present = sorted(p.relative_to(folder).as_posix() for p in folder.rglob("*") if p.is_file())
    unlisted = [f for f in present if f != "croissant.json" and f not in listed]
    if unlisted:
        problems.append(f"{len(unlisted)} file(s) not in croissant.json: {', '.join(unlisted[:5])}")
    return problems
