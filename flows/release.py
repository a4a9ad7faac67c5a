"""The release stage: `lake/releases/vX.Y.Z/` with Parquet per split, chat JSONL for SFT, a dataset
card (Hugging Face YAML header), Croissant metadata listing every file with its sha256, and a
CHANGELOG entry. Files are written in a fixed order with sorted rows, so a rebuild is byte-identical.

What a release is made of is one `ReleaseInputs`; the card is a template filled from it
(flows.card, `flows/templates/card.md`), the measured configs' schemas are flows.release_configs,
the Croissant metadata flows.croissant, the version rules flows.versions.
"""
from __future__ import annotations

import hashlib
import json
import shutil
import tempfile
from collections import Counter
from dataclasses import dataclass
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
from prefect import flow
from prefect.task_runners import ThreadPoolTaskRunner

from flows.card import card, changelog, released_shapes
from flows.config import Params
from flows.croissant import dataset_info, write_croissant
from flows.lake_guard import release_problems
from flows.lake_queries import family_splits, release_inputs, strategy_coverage
from flows.release_configs import SPLITS, Measured, chat_table, measured_inputs, write_measured
from flows.storage import read_table
from flows.tasks import say
from flows.versions import (
    ReleaseError,
    development_version,
    parse_version,
    previous_versions,
    release_date,
)


@dataclass(frozen=True)
class ReleaseInputs:
    """What a release is made of. `programs` (the released steps' programs) adds the card's shape,
    family and dtype sections; `coverage` (flows.lake_queries.strategy_coverage) the section on strategies
    short of samples; `measured` the configs made of measurements, the card's effect sections and
    the offline cost model; `splits` (family -> split, `lake/splits`) the card's split section;
    `reports` (the reports folder) the deterministic reports the card cites, copied into `reports/`
    (PINNED_REPORTS: a tag pins them)."""

    samples: pa.Table
    steps: pa.Table
    params: Params
    gate: dict
    filter_counters: list[dict]
    programs: pa.Table | None = None
    coverage: list[dict] | None = None
    measured: Measured | None = None
    splits: dict[str, str] | None = None
    reports: Path | None = None


@dataclass(frozen=True)
class Written:
    """What writing a release's data gave the card: the folder, sizes per split, steps per strategy,
    every config's tables, and the released programs' shapes."""

    folder: Path
    version: str
    sizes: dict[str, int]
    per_strategy: dict[str, int]
    tables: dict[str, dict[str, pa.Table]]
    shapes: list[dict] | None


def make_release(lake: Path, version: str, inputs: ReleaseInputs, development_of: str | None = None) -> Path:
    """Write the release folder; refuses a version that exists or is not above the last one.
    `development_of` (a development version's published release) says so on the card."""
    parse_version(version, development=development_of is not None)
    releases = Path(lake) / "releases"
    earlier = previous_versions(releases)
    if version in earlier:
        raise ReleaseError(f"release v{version} exists already; bump the version (rules in the dataset card)")
    if earlier and parse_version(version, development=True) < parse_version(earlier[-1]):
        raise ReleaseError(f"version {version} is below the last release {earlier[-1]}")
    out = releases / f"v{version}"
    releases.mkdir(parents=True, exist_ok=True)
    # A name of this writer's own (a fixed one let a second writer delete the first one's half-written
    # folder); a killed writer's is removed under the lake's lock (flows.lake_guard).
    tmp = Path(tempfile.mkdtemp(prefix=f".v{version}.tmp-", dir=releases))
    try:
        _write_release(tmp, version, inputs, development_of,
                       changelog(releases, earlier, version, inputs.samples, inputs.steps))
        tmp.rename(out)  # whole or absent: the rename is atomic, and refused onto a folder with files
    except OSError as e:
        _remove_tree(tmp)
        if out.exists():
            raise ReleaseError(f"release v{version} was written by another writer meanwhile ({out})") from e
        raise
    except BaseException:
        _remove_tree(tmp)
        raise
    return out


def _write_release(tmp: Path, version: str, inputs: ReleaseInputs, development_of: str | None,
                   changelog_text: str) -> None:
    date = release_date(inputs.params)
    (tmp / "data").mkdir(parents=True)
    (tmp / "chat").mkdir()
    (tmp / "chat_jsonl").mkdir()
    sizes, tables = {}, {"default": {}, "chat": {}}
    for split in SPLITS:
        part = _split(inputs.samples, split)
        sizes[split] = part.num_rows
        chat = chat_table(part)
        tables["default"][split], tables["chat"][split] = part, chat
        pq.write_table(part, tmp / "data" / f"{split}.parquet", compression="zstd")
        pq.write_table(chat, tmp / "chat" / f"{split}.parquet", compression="zstd")
        with open(tmp / "chat_jsonl" / f"{split}.jsonl", "w", encoding="utf-8") as f:
            for row in chat.to_pylist():
                f.write(json.dumps(row, ensure_ascii=False) + "\n")
    pq.write_table(inputs.steps.sort_by("step_id"), tmp / "data" / "steps.parquet", compression="zstd")
    if inputs.measured is not None:
        write_measured(tmp, inputs.measured, tables)
    per_strategy = dict(sorted(Counter(inputs.steps.column("strategy").to_pylist()).items()))
    shapes = None if inputs.programs is None else released_shapes(inputs.programs, inputs.steps, tmp / "shapes.png")
    if inputs.reports is not None:
        _pin_reports(Path(inputs.reports), tmp / "reports")
    written = Written(tmp, version, sizes, per_strategy, tables, shapes)
    (tmp / "README.md").write_text(card(inputs, written, dataset_info(tmp, tables), date, development_of))
    (tmp / "CHANGELOG.md").write_text(changelog_text)
    write_croissant(tmp, version, inputs.params, tables, date)


# The reports the card cites, copied into the release (deterministic bytes only: no timings).
PINNED_REPORTS = ("filter.json", "gate.json", "splits.json", "strategies.json", "verification.json", "errors.json",
                  "summary.json", "strategy_distribution.png", "verification_outcomes.png", "shapes.png")


def _pin_reports(reports: Path, folder: Path) -> None:
    """Copy the PINNED_REPORTS that `reports` holds into the release's `reports/`: a tag of the
    release then pins the figures its card cites."""
    present = [name for name in PINNED_REPORTS if (reports / name).is_file()]
    if present:
        folder.mkdir(parents=True, exist_ok=True)
    for name in present:
        shutil.copyfile(reports / name, folder / name)


def _split(samples: pa.Table, split: str) -> pa.Table:
    mask = pa.compute.equal(samples.column("split"), split)
    return samples.filter(mask).sort_by("sample_id")


def _remove_tree(path: Path) -> None:
    for p in sorted(path.rglob("*"), reverse=True):
        p.rmdir() if p.is_dir() else p.unlink()
    path.rmdir()


@flow(name="release", task_runner=ThreadPoolTaskRunner(max_workers=1))
def release_flow(raw: dict, profile: str, lake: str, reports: str, version: str | None = None) -> dict:
    """Release `version`, by default params.yaml's `release.version`. Run again on the same data it
    changes nothing. When that version was released with other contents, a version asked for
    (`steptp release --version`) is refused, but the default build (`make run`, `dvc repro`) writes a
    development release beside it (`development_version`) instead of failing: the edit-then-run loop
    never ends in an error, and no published release is ever overwritten."""
    params, lake = Params(raw, profile), Path(lake)
    asked = version is not None
    version = version or params.release["version"]
    steps, _ = release_inputs(lake, params)
    gate = json.loads((Path(reports) / "gate.json").read_text())
    if not gate.get("success"):  # a refusal, returned like the validate stage's (see flows.validate)
        return {"stage": "release", "refused": "the release gate did not pass; run the validate stage"}
    counters = json.loads((Path(reports) / "filter.json").read_text())
    inputs = ReleaseInputs(read_table(lake, "samples"), steps, params, gate, counters, read_table(lake, "programs"),
                           strategy_coverage(lake, steps, params.verify["target"]),
                           measured_inputs(lake, params, Path(reports)), family_splits(lake), Path(reports))
    existing = lake / "releases" / f"v{version}"
    if not existing.exists():
        out = make_release(lake, version, inputs)
        return {"stage": "release", "version": version, "path": str(out)}
    _refuse_damaged(existing)
    same, digest = _compare_release(existing, lake, version, inputs)
    if same:
        return {"stage": "release", "version": version, "path": str(existing), "unchanged": True}
    if asked:
        raise ReleaseError(f"release v{version} exists with other contents; choose a new version "
                           "(rules in the dataset card)")
    dev = development_version(version, previous_versions(lake / "releases"), digest)
    out = lake / "releases" / f"v{dev}"
    result = {"stage": "release", "version": dev, "path": str(out), "development_of": version}
    if out.exists():  # the same changed data, released as a development version before
        _refuse_damaged(out)
        if _compare_release(out, lake, dev, inputs, development_of=version)[0]:
            return result | {"unchanged": True}
        # the same data with another card or cost model (the code that writes them changed): a
        # development release is never published, so it is written again, whole
        _replace_release(lake, dev, inputs, version)
        say(f"[bold]release[/]: rewrote the development release v{dev} (same data; its card or cost model changed)")
        return result | {"rewritten": True}
    make_release(lake, dev, inputs, development_of=version)
    say(f"[bold]release[/]: v{version} exists with other contents; wrote the development release v{dev} beside it "
        "(to publish, set release.version in params.yaml to a new version)")
    return result


def _replace_release(lake: Path, version: str, inputs: ReleaseInputs, development_of: str) -> None:
    """Write the development release `version` again in place of the folder it has (kept aside until
    the new one is whole, and put back when writing it fails)."""
    out = lake / "releases" / f"v{version}"
    aside = out.with_name(f".{out.name}.replaced")
    if aside.exists():  # left by a run that was killed between the two renames
        _remove_tree(aside)
    out.rename(aside)
    try:
        make_release(lake, version, inputs, development_of=development_of)
    except BaseException:
        if not out.exists():
            aside.rename(out)
        raise
    _remove_tree(aside)


def _refuse_damaged(folder: Path) -> None:
    problems = release_problems(folder)
    if problems:
        raise ReleaseError(f"release {folder} is damaged ({'; '.join(problems)}); it was not written by a whole "
                           "run of this version: move it out of the lake and run again")


# The folders of a release whose bytes are its data (the content hash of a development release), with
# the pinned reports its card cites.
RELEASE_DATA_FOLDERS = ("data", "chat", "chat_jsonl", "measured", "gpu_steps", "sft", "preference",
                        "preference_chat", "trajectories", "trajectories_fast_exp", "reports")


def _compare_release(existing: Path, lake: Path, version: str, inputs: ReleaseInputs,
                     development_of: str | None = None) -> tuple[bool, str]:
    """(whether a rebuild of `version` from the lake is identical to the release folder, the content
    hash of the rebuild's data: every file whose bytes do not name the version)."""
    with tempfile.TemporaryDirectory(dir=lake, prefix=".compare-") as tmp:
        # the releases before it, as far as a changelog reads them (each one's CHANGELOG.md)
        mine = parse_version(version, development=True)
        for earlier in previous_versions(lake / "releases"):
            if parse_version(earlier) < mine:
                (Path(tmp) / "releases" / f"v{earlier}").mkdir(parents=True)
                shutil.copyfile(lake / "releases" / f"v{earlier}" / "CHANGELOG.md",
                                Path(tmp) / "releases" / f"v{earlier}" / "CHANGELOG.md")
        fresh = make_release(Path(tmp), version, inputs, development_of=development_of)
        files = sorted(p.relative_to(fresh) for p in fresh.rglob("*") if p.is_file())
        same = files == sorted(p.relative_to(existing) for p in existing.rglob("*") if p.is_file()) and all(
            (fresh / f).read_bytes() == (existing / f).read_bytes() for f in files)
        digest = hashlib.sha256()
        for f in files:
            if f.parts[0] in RELEASE_DATA_FOLDERS or f.name == "shapes.png":
                digest.update(f.as_posix().encode() + b"\0" + (fresh / f).read_bytes())
    return same, digest.hexdigest()
