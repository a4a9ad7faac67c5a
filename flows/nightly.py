"""The nightly build that `steptp serve` schedules, and the git plumbing (release tags, `dvc push`)
it shares with `steptp release`.

One run: `dvc repro` of every stage but `release` (DVC recomputes only what a changed parameter,
source file or input affects, so an unchanged night costs seconds); a refused gate fails the
`validate` stage, and the run ends `Failed` with the gate's failures as its message. Then, when the
tables a release is made from changed since the last release (`dvc status release`), the next
release: its version (params.yaml `release.version` while above every release made, otherwise the
last release bumped by `release.version_policy`) goes into params.yaml, `dvc repro release` writes
`lake/releases/vX.Y.Z`, params.yaml and dvc.lock are committed and tagged `data-vX.Y.Z`, and
`dvc push` stores the data. The release stage is kept out of the first `dvc repro` because it would
rewrite the release of the current version with the changed tables. Nothing is released over
uncommitted changes to tracked source files: the tag would not rebuild that release.

Every run leaves `lake/last_scheduled_run.json` (time, state, release made or not) for
`steptp lake status`; Prefect's state hooks fill in the final state.
"""
from __future__ import annotations

import collections
import datetime
import json
import subprocess
import time
from pathlib import Path

import yaml
from prefect import flow, get_run_logger
from prefect.client.schemas.objects import ConcurrencyLimitConfig, ConcurrencyLimitStrategy
from prefect.states import Completed

from flows.config import PARAMS, ROOT, load_params, set_param
from flows.lake_guard import lake_lock
from flows.params_schema import check_params
from flows.prefect_env import dvc_env, dvc_executable, ensure_dvc
from flows.storage import SCHEDULED_RUN_LOG
from flows.versions import SEMVER, ReleaseError, next_version, parse_version, previous_versions

# The deterministic tables a release is made from (the release stage's table inputs in dvc.yaml).
RELEASE_TABLES = ("lake/programs", "lake/steps", "lake/verifications", "lake/samples")
TAG_PREFIX = "data-v"
GATE = ROOT / "reports" / "gate.json"
LAKE = ROOT / "lake"  # where the DVC stages write (their default `--lake`)


class NightlyError(Exception):
    """A step of the nightly build (or of the git/DVC plumbing) failed; the message says which and why."""


class GateRefused(NightlyError):
    """The release gate refused the lake: the message lists the gate's failures."""


# --- git plumbing ------------------------------------------------------------------------------


def git(*args: str, root: Path = ROOT) -> str:
    done = subprocess.run(["git", *args], cwd=root, capture_output=True, text=True)
    if done.returncode:
        raise NightlyError(f"git {' '.join(args)} failed: {(done.stderr or done.stdout).strip()}")
    return done.stdout


def released_versions(root: Path = ROOT) -> list[str]:
    """Versions released here or anywhere this clone knows of: release folders and `data-v*` tags."""
    tags = [t.removeprefix(TAG_PREFIX) for t in git("tag", "--list", f"{TAG_PREFIX}*", root=root).split()]
    found = set(previous_versions(root / "lake" / "releases")) | {v for v in tags if SEMVER.match(v)}
    return sorted(found, key=parse_version)


def commit_and_tag(version: str, paths: tuple[str, ...] = ("dvc.lock",), root: Path = ROOT) -> str:
    """Commit `paths` (dvc.lock is what `dvc checkout` restores a release from) when they changed, and
    tag that commit `data-vX.Y.Z`. Returns the tag; an existing tag is left as it is."""
    tag = f"{TAG_PREFIX}{version}"
    present = [p for p in paths if (root / p).exists()]
    if present and git("status", "--porcelain", "--", *present, root=root).strip():
        git("add", "--", *present, root=root)
        git("commit", "-q", "-m", f"Data release v{version}", "--", *present, root=root)
    if subprocess.call(["git", "rev-parse", "-q", "--verify", f"refs/tags/{tag}"], cwd=root,
                       stdout=subprocess.DEVNULL) != 0:
        git("tag", tag, root=root)
    return tag


def record_release(env: dict, lake: Path, root: Path = ROOT) -> bool:
    """After a release written outside `dvc repro` (`steptp release --version X`): `dvc commit` the
    validate and release stages, so that dvc.lock records the release folder it now holds (the release
    stage's output is the whole `lake/releases`) and `dvc status` stays clean. Both stages were just
    run by the command on the current lake, so what the lock records is what they make of it. Only
    inside a DVC checkout whose lake is `lake`; returns whether it committed."""
    if not (root / ".dvc").is_dir() or not (root / "dvc.yaml").exists():
        return False
    if Path(lake).resolve() != (root / "lake").resolve():
        return False
    done = subprocess.run([dvc_executable(), "commit", "--force", "--quiet", "validate", "release"], cwd=root,
                          env=env, capture_output=True, text=True)
    if done.returncode:
        raise NightlyError(f"dvc commit of the release failed: {(done.stderr or done.stdout).strip()}")
    return True


def dvc_push(env: dict) -> None:
    done = subprocess.run([dvc_executable(), "push", "--quiet"], cwd=ROOT, env=env, capture_output=True, text=True)
    if done.returncode:
        raise NightlyError(f"dvc push to the default remote failed: {(done.stderr or done.stdout).strip()}")


def uncommitted_sources(root: Path = ROOT) -> list[str]:
    """Tracked files with uncommitted changes, other than what the build itself writes (dvc.lock,
    params.yaml's release version, reports/): a release tagged on top of them would not reproduce."""
    entries = git("status", "--porcelain", "--untracked-files=no", "-z", root=root).split("\0")
    changed, skip = [], False
    for entry in entries:
        if skip or not entry:  # a rename's second entry is its old path
            skip = False
            continue
        changed.append(entry[3:])
        skip = entry[0] in "RC"
    return [p for p in changed if p not in ("dvc.lock", "params.yaml") and not p.startswith("reports/")]


# --- the nightly build ---------------------------------------------------------------------------


def _run_dvc(args: list[str], env: dict, log) -> tuple[int, str]:
    """Run dvc, sending each line of its output to the run's log; (exit code, last lines of output)."""
    tail: collections.deque[str] = collections.deque(maxlen=30)
    proc = subprocess.Popen([dvc_executable(), *args], cwd=ROOT, env=env, stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, text=True, bufsize=1)
    for line in proc.stdout:
        line = line.rstrip()
        if line:
            log.info(line)
            tail.append(line)
    return proc.wait(), "\n".join(tail)


def pipeline_stages() -> list[str]:
    """The stages of dvc.yaml but `release` (that one runs only when there is something to release)."""
    stages = list(yaml.safe_load((ROOT / "dvc.yaml").read_text())["stages"])
    return [s for s in stages if s != "release"]


def gate_refusal(gate_file: Path, since: float) -> str | None:
    """The gate's failures when `gate_file` (reports/gate.json) was written since `since` (this run)
    and refuses, else None."""
    if not gate_file.exists() or gate_file.stat().st_mtime < since:
        return None
    gate = json.loads(gate_file.read_text())
    if gate.get("success"):
        return None
    failures = gate.get("failures") or ["(the gate listed no failures; see reports/gate.json)"]
    return "release refused by the gate:\n" + "\n".join(f"- {f}" for f in failures)


def changed_release_tables(status: dict) -> list[str]:
    """The release tables that `dvc status release --json` reports as changed since the last release
    (all of them when no release was ever made here)."""
    changed = set()
    for entry in status.get("release", []):
        if isinstance(entry, dict):
            changed.update(entry.get("changed deps", {}))
    return [t for t in RELEASE_TABLES if t in changed]


def _release_status(env: dict) -> dict:
    done = subprocess.run([dvc_executable(), "status", "release", "--json"], cwd=ROOT, env=env,
                          capture_output=True, text=True)
    if done.returncode:
        raise NightlyError(f"dvc status release failed: {(done.stderr or done.stdout).strip()}")
    return json.loads(done.stdout or "{}")


# --- the record that `steptp lake status` shows --------------------------------------------------


def _now() -> str:
    return datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds")


def _write_record(record: dict) -> None:
    path = LAKE / SCHEDULED_RUN_LOG
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{SCHEDULED_RUN_LOG}.tmp")
    tmp.write_text(json.dumps(record, indent=1) + "\n")
    tmp.replace(path)


def read_record(lake: Path) -> dict | None:
    path = Path(lake) / SCHEDULED_RUN_LOG
    return json.loads(path.read_text()) if path.exists() else None


def _start_record() -> dict:
    from prefect.runtime import deployment, flow_run

    scheduled = flow_run.scheduled_start_time
    record = {"flow_run_id": str(flow_run.id), "flow_run_name": flow_run.name, "deployment": deployment.name,
              "scheduled_for": scheduled.isoformat(timespec="seconds") if scheduled else None,
              "started_at": _now(), "finished_at": None, "state": "Running", "message": None,
              "release": None, "tables_changed": None, "repro_s": None}
    _write_record(record)
    return record


def _update_record(record: dict, **fields) -> None:
    record.update(fields)
    _write_record(record)


def _finish(record: dict, version: str | None, message: str):
    _update_record(record, message=message)
    return Completed(message=message, data={"release": version, "message": message,
                                            "tables_changed": record["tables_changed"]})


def _record_final_state(flow, flow_run, state) -> None:
    """State hook: the run's final state in the record. A run that never reached the body (cancelled
    because the previous night still runs, crashed on start) must not overwrite a running record."""
    record = read_record(LAKE) or {}
    if record.get("state") == "Running" and record.get("flow_run_id") != str(flow_run.id):
        return
    if record.get("flow_run_id") != str(flow_run.id):
        record = {"flow_run_id": str(flow_run.id), "flow_run_name": flow_run.name, "release": None}
    record.update(state=state.name, finished_at=_now())
    if not state.is_completed() or not record.get("message"):
        record["message"] = state.message
    _write_record(record)


# --- the flow ------------------------------------------------------------------------------------


@flow(name="nightly-build", on_completion=[_record_final_state], on_failure=[_record_final_state],
      on_crashed=[_record_final_state], on_cancellation=[_record_final_state])
def nightly_build(push: bool = True) -> dict:
    """`dvc repro`, then a release (version, tag, `dvc push`) when the release tables changed and the
    gate passed. Raises GateRefused (the run ends Failed) when the gate refuses."""
    with lake_lock(ROOT / "lake", "steptp serve (nightly build)"):  # LakeBusy: this run fails, naming the holder
        return _build(push)


def _build(push: bool) -> dict:
    log = get_run_logger()
    record = _start_record()
    text = PARAMS.read_text()
    problems = check_params(yaml.safe_load(text), PARAMS, text)
    if problems:  # before dvc starts a stage (each skips the check under this run's lock)
        raise NightlyError(f"{PARAMS} is not valid; nothing was run:\n" + "\n".join(problems))
    env = dvc_env()  # carries the lock (LOCK_ENV) to the stages dvc starts
    env["PREFECT_LOGGING_LEVEL"] = "WARNING"  # the stages' own Prefect chatter stays out of this run's log
    ensure_dvc(env)
    started = time.time()
    code, tail = _run_dvc(["repro", *pipeline_stages()], env, log)
    _update_record(record, repro_s=round(time.time() - started, 1))
    if code:
        refusal = gate_refusal(GATE, started)
        if refusal:
            raise GateRefused(refusal)
        raise NightlyError(f"dvc repro failed (exit {code}); its last lines:\n{tail}")
    changed = changed_release_tables(_release_status(env))
    _update_record(record, tables_changed=changed)
    if not changed:
        if push:
            dvc_push(env)
        return _finish(record, None, "no release: the release tables did not change since the last release")
    version = _release(env, log)
    _update_record(record, release=version)
    try:
        tag = commit_and_tag(version, ("dvc.lock", "params.yaml"))
    except NightlyError as e:
        raise NightlyError(f"released v{version} (lake/releases/v{version}), but could not tag it: {e}") from None
    if push:
        try:
            dvc_push(env)
        except NightlyError as e:
            raise NightlyError(f"released v{version} and tagged {tag}, but {e}") from None
    return _finish(record, version, f"released v{version} (tag {tag}); changed: {', '.join(changed)}")


def _release(env: dict, log) -> str:
    """Write the next release through DVC's release stage; params.yaml is put back if that fails."""
    dirty = uncommitted_sources()
    if dirty:
        raise NightlyError("not released: uncommitted changes to tracked files (" + ", ".join(dirty[:10])
                           + "); the release tag would not reproduce the release. Commit them first.")
    params = load_params()
    try:
        version = next_version(released_versions(), str(params.release["version"]),
                               params.release.get("version_policy", "patch"))
    except ReleaseError as e:
        raise NightlyError(str(e)) from None
    original = PARAMS.read_text()
    if version != str(params.release["version"]):
        import datetime

        set_param(PARAMS, ("release", "version"), version)
        if "date" in params.release:  # the new version's own date (the card, Croissant's datePublished)
            set_param(PARAMS, ("release", "date"), datetime.datetime.now(datetime.UTC).date().isoformat())
    code, tail = _run_dvc(["repro", "release"], env, log)
    if code:
        PARAMS.write_text(original)
        raise NightlyError(f"the release stage failed (exit {code}); its last lines:\n{tail}")
    return version


def serve(name: str, cron: str) -> None:
    """Serve the nightly build as a deployment on `cron`, until Ctrl-C or SIGTERM. A run that comes due
    while the previous one still runs is cancelled by the server (two `dvc repro` at once would fight
    over DVC's lock, and queued runs would only pile up behind a long one)."""
    nightly_build.serve(name=name, cron=cron, global_limit=ConcurrencyLimitConfig(
        limit=1, collision_strategy=ConcurrencyLimitStrategy.CANCEL_NEW))
