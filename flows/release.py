"""The release stage: `lake/releases/vX.Y.Z/` with Parquet per split, chat JSONL for SFT, a dataset
card (Hugging Face YAML header), Croissant metadata listing every file with its sha256, and a
CHANGELOG entry. Files are written in a fixed order with sorted rows, so a rebuild is byte-identical.
"""
from __future__ import annotations

import hashlib
import json
import re
from collections import Counter as Tally
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq

from flows.prefect_env import configure

configure()

from prefect import flow  # noqa: E402
from prefect.task_runners import ThreadPoolTaskRunner  # noqa: E402

from flows.config import Params  # noqa: E402
from flows.storage import read_table, release_inputs  # noqa: E402
from flows.validate import GateFailed  # noqa: E402

SPLITS = ("train", "test")
SEMVER = re.compile(r"^(0|[1-9]\d*)\.(0|[1-9]\d*)\.(0|[1-9]\d*)$")
SEMVER_RULES = """\
- **MAJOR** (X): the record format changes (columns, answer format, LEIR conventions) or strategies
  are renamed or removed; consumers must adapt.
- **MINOR** (Y): more data in the same format: new workloads, strategies, dtypes or shapes.
- **PATCH** (Z): corrections of existing records with the same selection (verification fixes,
  filter fixes, CoT wording)."""


class ReleaseError(Exception):
    pass


def parse_version(version: str) -> tuple[int, int, int]:
    m = SEMVER.match(version)
    if not m:
        raise ReleaseError(f"version must be MAJOR.MINOR.PATCH (semantic versioning), got {version!r}")
    return tuple(int(x) for x in m.groups())  # type: ignore[return-value]


def previous_versions(releases: Path) -> list[str]:
    found = [p.name[1:] for p in releases.glob("v*") if SEMVER.match(p.name[1:])]
    return sorted(found, key=parse_version)


VERSION_POLICIES = ("patch", "minor", "major")


def next_version(released: list[str], configured: str, policy: str = "patch") -> str:
    """The version of the next automatic (nightly) release: `configured` (params.yaml's
    `release.version`) while it is above every release made, otherwise the last release bumped by
    `policy` (`release.version_policy`: patch, minor or major)."""
    if policy not in VERSION_POLICIES:
        raise ReleaseError(f"release.version_policy must be one of {', '.join(VERSION_POLICIES)}, got {policy!r}")
    wanted = parse_version(configured)
    made = sorted((parse_version(v) for v in released), reverse=True)
    if not made or wanted > made[0]:
        return configured
    major, minor, patch = made[0]
    bumped = {"patch": (major, minor, patch + 1), "minor": (major, minor + 1, 0), "major": (major + 1, 0, 0)}[policy]
    return "{}.{}.{}".format(*bumped)


def make_release(lake: Path, version: str, samples: pa.Table, steps: pa.Table, params, gate: dict,
                 filter_counters: list[dict]) -> Path:
    """Write the release folder; refuses a version that exists or is not above the last one."""
    parse_version(version)
    releases = Path(lake) / "releases"
    earlier = previous_versions(releases)
    if version in earlier:
        raise ReleaseError(f"release v{version} exists already; bump the version (rules in the dataset card)")
    if earlier and parse_version(version) < parse_version(earlier[-1]):
        raise ReleaseError(f"version {version} is below the last release {earlier[-1]}")
    out = releases / f"v{version}"
    tmp = releases / f".v{version}.tmp"
    if tmp.exists():
        _remove_tree(tmp)
    (tmp / "data").mkdir(parents=True)
    (tmp / "chat").mkdir()
    sizes = {}
    for split in SPLITS:
        part = _split(samples, split)
        sizes[split] = part.num_rows
        pq.write_table(part, tmp / "data" / f"{split}.parquet", compression="zstd")
        with open(tmp / "chat" / f"{split}.jsonl", "w", encoding="utf-8") as f:
            for row in part.select(["prompt", "answer"]).to_pylist():
                f.write(json.dumps({"messages": [{"role": "user", "content": row["prompt"]},
                                                 {"role": "assistant", "content": row["answer"]}]},
                                   ensure_ascii=False) + "\n")
    pq.write_table(steps.sort_by("step_id"), tmp / "data" / "steps.parquet", compression="zstd")
    per_strategy = dict(sorted(Tally(steps.column("strategy").to_pylist()).items()))
    (tmp / "README.md").write_text(_card(version, params, sizes, per_strategy, gate, filter_counters))
    (tmp / "CHANGELOG.md").write_text(_changelog(releases, earlier, version, sizes, per_strategy))
    _write_croissant(tmp, version, params, samples.schema)
    tmp.rename(out)
    return out


def _split(samples: pa.Table, split: str) -> pa.Table:
    mask = pa.compute.equal(samples.column("split"), split)
    return samples.filter(mask).sort_by("sample_id")


def _remove_tree(path: Path) -> None:
    for p in sorted(path.rglob("*"), reverse=True):
        p.rmdir() if p.is_dir() else p.unlink()
    path.rmdir()


def _card(version, params, sizes, per_strategy, gate, counters) -> str:
    rel = params.release
    header = {
        "license": rel["license"],
        "pretty_name": "Step-TP (rebuilt)",
        "language": ["en"],
        "task_categories": ["text-generation"],
        "tags": ["compilers", "tensor-programs", "tvm", "chain-of-thought", "leir"],
        "size_categories": [_size_category(sum(sizes.values()))],
        "configs": [{"config_name": "default",
                     "data_files": [{"split": s, "path": f"data/{s}.parquet"} for s in SPLITS]},
                    {"config_name": "chat",
                     "data_files": [{"split": s, "path": f"chat/{s}.jsonl"} for s in SPLITS]}],
        "dataset_info": {
            "features": [{"name": n, "dtype": "int64" if n.endswith("tokens") else "string"}
                         for n in ("sample_id", "split", "prompt", "answer", "step_ids", "strategies",
                                   "prompt_tokens", "answer_tokens")],
            "splits": [{"name": s, "num_examples": sizes[s]} for s in SPLITS],
        },
    }
    import yaml

    lines = ["---", yaml.safe_dump(header, sort_keys=False).rstrip(), "---", "",
             f"# Step-TP rebuilt, v{version}", "",
             "Step-level, verified transformations of tensor programs written in LEIR, each with a chain "
             "of thought, for teaching LLMs to optimise tensor programs (after Liu, Zheng, Su, Wu, 2026).",
             "Every released step was lowered to TVM and verified against the original program on seeded "
             f"inputs (target `{params.verify['target']}`); splits hold out whole workload families.", "",
             "## Splits", "", "| split | samples |", "| --- | --- |",
             *(f"| {s} | {sizes[s]} |" for s in SPLITS), "",
             "## Steps per strategy", "", "| strategy | steps |", "| --- | --- |",
             *(f"| {k} | {v} |" for k, v in per_strategy.items()), "",
             "## Filtering", "", "| rule | before | after |", "| --- | --- | --- |",
             *(f"| {c['rule']} | {c['before']} | {c['after']} |" for c in counters), "",
             "## Release gate (Great Expectations)", "",
             f"{'passed' if gate.get('success') else 'FAILED'}: {gate.get('expectations_checked', 0)} expectations.",
             "", "## Versioning", "", SEMVER_RULES, "",
             "## Files", "", "`data/{train,test}.parquet` (samples), `data/steps.parquet` (the released steps), "
             "`chat/{train,test}.jsonl` (`{\"messages\": [...]}` for SFT), `croissant.json` (Croissant metadata "
             "with sha256 of every file), `CHANGELOG.md`.", ""]
    return "\n".join(lines)


def _size_category(n: int) -> str:
    for limit, name in ((1_000, "n<1K"), (10_000, "1K<n<10K"), (100_000, "10K<n<100K"), (1_000_000, "100K<n<1M")):
        if n < limit:
            return name
    return "1M<n<10M"


def _changelog(releases: Path, earlier: list[str], version: str, sizes: dict, per_strategy: dict) -> str:
    previous = ""
    if earlier:
        previous = (releases / f"v{earlier[-1]}" / "CHANGELOG.md").read_text()
    lines = [f"## v{version}", "",
             f"- samples: {sizes['train']} train, {sizes['test']} test",
             f"- steps: {sum(per_strategy.values())} over {len(per_strategy)} strategies"]
    if earlier:
        lines.append(f"- previous release: v{earlier[-1]}")
    entry = "\n".join(lines) + "\n"
    body = previous.removeprefix("# Changelog\n\n")
    return "# Changelog\n\n" + entry + ("\n" + body if body else "")


def _write_croissant(folder: Path, version: str, params, schema: pa.Schema) -> None:
    """Croissant metadata built with mlcroissant: every file as a FileObject (relative contentUrl,
    sha256), a record set per split over its Parquet file."""
    import mlcroissant as mlc

    files = sorted(p.relative_to(folder).as_posix() for p in folder.rglob("*") if p.is_file())
    formats = {".parquet": "application/x-parquet", ".jsonl": "application/jsonlines", ".md": "text/markdown"}
    distribution = [mlc.FileObject(id=f, name=f, content_url=f, encoding_formats=[formats[Path(f).suffix]],
                                   sha256=hashlib.sha256((folder / f).read_bytes()).hexdigest()) for f in files]
    record_sets = []
    for split in SPLITS:
        fields = [mlc.Field(id=f"{split}/{name}", name=name,
                            data_types=[mlc.DataType.INTEGER if name.endswith("tokens") else mlc.DataType.TEXT],
                            source=mlc.Source(file_object=f"data/{split}.parquet", extract=mlc.Extract(column=name)))
                  for name in schema.names]
        record_sets.append(mlc.RecordSet(id=split, name=split, fields=fields))
    rel = params.release
    metadata = mlc.Metadata(
        name=f"step-tp-v{version}", version=version, license=[rel["license"]],
        description="Step-level verified LEIR tensor-program transformations with chain of thought.",
        url=rel.get("url", "https://example.org/step-tp"), cite_as=rel.get("cite_as", "Step-TP (Liu et al., 2026)"),
        date_published=rel.get("date"), distribution=distribution, record_sets=record_sets)
    (folder / "croissant.json").write_text(json.dumps(metadata.to_json(), indent=1, sort_keys=True, default=str)
                                           + "\n")


@flow(name="release", task_runner=ThreadPoolTaskRunner(max_workers=1))
def release_flow(raw: dict, profile: str, lake: str, reports: str, version: str | None = None) -> dict:
    params, lake = Params(raw, profile), Path(lake)
    version = version or params.release["version"]
    steps, _ = release_inputs(lake, params)
    gate = json.loads((Path(reports) / "gate.json").read_text())
    if not gate.get("success"):
        raise GateFailed("the release gate did not pass; run the validate stage")
    counters = json.loads((Path(reports) / "filter.json").read_text())
    existing = lake / "releases" / f"v{version}"
    if existing.exists():
        return _compare_release(existing, lake, version, steps, params, gate, counters)
    out = make_release(lake, version, read_table(lake, "samples"), steps, params, gate, counters)
    return {"stage": "release", "version": version, "path": str(out)}


def _compare_release(existing: Path, lake: Path, version, steps, params, gate, counters) -> dict:
    """Re-running a release: fine when the files would be identical, an error when they differ."""
    import tempfile

    with tempfile.TemporaryDirectory(dir=lake) as tmp:
        fresh = make_release(Path(tmp), version, read_table(lake, "samples"), steps, params, gate, counters)
        files = sorted(p.relative_to(fresh) for p in fresh.rglob("*") if p.is_file())
        same = files == sorted(p.relative_to(existing) for p in existing.rglob("*") if p.is_file()) and all(
            (fresh / f).read_bytes() == (existing / f).read_bytes() for f in files)
    if not same:
        raise ReleaseError(f"release v{version} exists with other contents; bump the version in params.yaml "
                           "(rules in the dataset card)")
    return {"stage": "release", "version": version, "path": str(existing), "unchanged": True}
