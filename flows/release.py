"""The release stage: `lake/releases/vX.Y.Z/` with Parquet per split, chat JSONL for SFT, a dataset
card (Hugging Face YAML header), Croissant metadata listing every file with its sha256, and a
CHANGELOG entry. Files are written in a fixed order with sorted rows, so a rebuild is byte-identical.
"""
from __future__ import annotations

import datetime
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
from flows.storage import read_table, release_inputs, strategy_coverage  # noqa: E402
from flows.tasks import say  # noqa: E402

SPLITS = ("train", "test")
SEMVER = re.compile(r"^(0|[1-9]\d*)\.(0|[1-9]\d*)\.(0|[1-9]\d*)$")
# A development release (semantic versioning's pre-release `dev` with the content hash as build
# metadata): what the default build writes when the data changed and release.version did not.
DEV_VERSION = re.compile(r"^(0|[1-9]\d*)\.(0|[1-9]\d*)\.(0|[1-9]\d*)-dev\+([0-9a-f]{12})$")
SEMVER_RULES = """\
- **MAJOR** (X): the record format changes (columns, answer format, LEIR conventions) or strategies
  are renamed or removed; consumers must adapt.
- **MINOR** (Y): more data in the same format: new workloads, strategies, dtypes or shapes.
- **PATCH** (Z): corrections of existing records with the same selection (verification fixes,
  filter fixes, CoT wording)."""


class ReleaseError(Exception):
    pass


def parse_version(version: str, development: bool = False) -> tuple[int, int, int]:
    """(major, minor, patch) of a published version; with `development`, also of a development one
    (`0.1.1-dev+<hash>`)."""
    m = SEMVER.match(version) or (DEV_VERSION.match(version) if development else None)
    if not m:
        raise ReleaseError(f"version must be MAJOR.MINOR.PATCH (semantic versioning), got {version!r}")
    return tuple(int(x) for x in m.groups()[:3])  # type: ignore[return-value]


def development_version(published: str, earlier: list[str], digest: str) -> str:
    """The development release of data that changed after `published`: the next patch above it and
    every release made, as a pre-release `dev` with the first 12 hex digits of the content hash as
    build metadata (`0.1.1-dev+3f2a...`). It sorts below the release it leads to and never takes a
    published version's place."""
    top = max([parse_version(published), *(parse_version(v) for v in earlier)])
    return f"{top[0]}.{top[1]}.{top[2] + 1}-dev+{digest[:12]}"


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
                 filter_counters: list[dict], programs: pa.Table | None = None,
                 coverage: list[dict] | None = None, development_of: str | None = None) -> Path:
    """Write the release folder; refuses a version that exists or is not above the last one.
    `programs` (the released steps' programs) adds the card's shape, family and dtype sections;
    `coverage` (flows.storage.strategy_coverage) the section on strategies short of samples;
    `development_of` (a development version's published release) says so on the card."""
    parse_version(version, development=development_of is not None)
    releases = Path(lake) / "releases"
    earlier = previous_versions(releases)
    if version in earlier:
        raise ReleaseError(f"release v{version} exists already; bump the version (rules in the dataset card)")
    if earlier and parse_version(version, development=True) < parse_version(earlier[-1]):
        raise ReleaseError(f"version {version} is below the last release {earlier[-1]}")
    out = releases / f"v{version}"
    tmp = releases / f".v{version}.tmp"
    if tmp.exists():
        _remove_tree(tmp)
    date = release_date(params)
    (tmp / "data").mkdir(parents=True)
    (tmp / "chat").mkdir()
    (tmp / "chat_jsonl").mkdir()
    sizes, tables = {}, {"default": {}, "chat": {}}
    for split in SPLITS:
        part = _split(samples, split)
        sizes[split] = part.num_rows
        chat = _chat_table(part)
        tables["default"][split], tables["chat"][split] = part, chat
        pq.write_table(part, tmp / "data" / f"{split}.parquet", compression="zstd")
        pq.write_table(chat, tmp / "chat" / f"{split}.parquet", compression="zstd")
        with open(tmp / "chat_jsonl" / f"{split}.jsonl", "w", encoding="utf-8") as f:
            for row in chat.to_pylist():
                f.write(json.dumps(row, ensure_ascii=False) + "\n")
    pq.write_table(steps.sort_by("step_id"), tmp / "data" / "steps.parquet", compression="zstd")
    per_strategy = dict(sorted(Tally(steps.column("strategy").to_pylist()).items()))
    shapes = _released_shapes(programs, steps, tmp / "shapes.png") if programs is not None else None
    info = dataset_info(tmp, tables)
    card = _card(version, params, sizes, per_strategy, gate, filter_counters, info, date)
    if development_of is not None:
        card += _development_section(version, development_of)
    if coverage is not None:
        card += _coverage_section(coverage, int(params.release.get("min_samples_per_strategy", 100)))
    if shapes is not None:
        card += _data_sections(shapes, samples, steps, tmp)
    (tmp / "README.md").write_text(card)
    (tmp / "CHANGELOG.md").write_text(_changelog(releases, earlier, version, sizes, per_strategy))
    _write_croissant(tmp, version, params, tables, date)
    tmp.rename(out)
    return out


def _development_section(version: str, published: str) -> str:
    return "\n".join(["## Development release", "",
                      f"v{version} is not a published release: the lake changed after v{published} was released "
                      f"and `release.version` in params.yaml still says {published}. Its files are what "
                      f"v{published} would hold now; `+{version.split('+')[1]}` is their content hash. Publish "
                      "them by setting `release.version` (and `release.date`) in params.yaml to a new version, "
                      "by the rules above, and running the pipeline again (or `steptp release --version X.Y.Z`).",
                      ""])


def _released_shapes(programs: pa.Table, steps: pa.Table, plot: Path) -> list[dict]:
    from flows.reports import plot_shapes, program_shapes

    released = set(steps.column("program_id").to_pylist())
    rows = [r for r in program_shapes(programs) if r["program_id"] in released]
    plot_shapes(rows, plot)
    return rows


def _coverage_section(coverage: list[dict], minimum: int) -> str:
    """The strategies released fewer than `minimum` times, and why, from the lake's own counts."""
    short = [c for c in coverage if c["released"] < minimum]
    lines = ["## Strategies with fewer than " f"{minimum} samples", ""]
    if not short:
        return "\n".join([*lines, f"None: every strategy with a site has at least {minimum} released steps.", ""])
    lines += ["| strategy | programs with a site | steps made | verified | released | why |",
              "| --- | --- | --- | --- | --- | --- |"]
    for c in short:
        if not c["steps"]:
            why = "no site in this profile's programs"
        elif c["verified"] < minimum:
            why = (f"its sites are rare: {c['steps']} steps in {c['programs']} programs at this profile, "
                   f"{c['verified']} of them verified")
        else:
            why = "the filter (duplicates of one after-state keep the rarest strategy; per-level caps) kept fewer"
        counts = " | ".join(str(c[k]) for k in ("programs", "steps", "verified", "released"))
        lines.append(f"| {c['strategy']} | {counts} | {why} |")
    return "\n".join([*lines, ""])


def _data_sections(shapes: list[dict], samples: pa.Table, steps: pa.Table, folder: Path) -> str:
    """What the data holds: shapes (figures and histogram), families, dtypes, file sizes."""
    from flows.reports import shape_figures

    figures = shape_figures(shapes)
    program_of = dict(zip(steps.column("step_id").to_pylist(), steps.column("program_id").to_pylist(), strict=True))
    shape_of = {r["program_id"]: r for r in shapes}
    per_family, per_dtype = Tally(), Tally()
    for ids in samples.column("step_ids").to_pylist():
        first = shape_of.get(program_of.get((json.loads(ids) or [None])[0]))
        if first:
            per_family[first["family"]] += 1
            per_dtype[first["dtype"]] += 1
    programs_per_family = Tally(r["family"] for r in shapes)
    sources = figures["programs_by_shape_source"]
    files = sorted(p for p in folder.rglob("*") if p.is_file() and p.name != "README.md")
    lines = ["## Shapes", "",
             f"{len(shapes)} source programs. Median largest tensor extent: {figures['median_largest_dim']}; "
             f"programs with a prime extent above 7: {100 * figures['prime_dim_share']:.1f}% (the odd-extents "
             "minority keeps remainder handling in the data). Shapes come from the dimensions real networks "
             "use, under a per-instance work budget (`workloads/shapes.py`).", "",
             "![largest tensor extent per program](shapes.png)", "",
             "| shape source | programs |", "| --- | --- |", *(f"| {k} | {v} |" for k, v in sources.items()), "",
             "## Families", "", "| family | programs | samples |", "| --- | --- | --- |",
             *(f"| {f} | {programs_per_family[f]} | {per_family.get(f, 0)} |" for f in sorted(programs_per_family)),
             "", "## Dtypes", "", "| dtype | programs | samples |", "| --- | --- | --- |",
             *(f"| {d} | {n} | {per_dtype.get(d, 0)} |" for d, n in figures["programs_by_dtype"].items()), "",
             "## Sizes", "", "| file | bytes |", "| --- | --- |",
             *(f"| `{p.relative_to(folder).as_posix()}` | {p.stat().st_size} |" for p in files), ""]
    return "\n".join(lines)


def release_date(params) -> str:
    """The release's own date, `release.date` of params.yaml (YYYY-MM-DD): what Croissant's
    `datePublished` and the card say. Never the build's clock: `dvc repro` rebuilds a release bit for bit."""
    import datetime

    value = params.release.get("date")
    if isinstance(value, datetime.date):  # YAML reads an unquoted 2026-12-01 as a date
        return value.isoformat()
    try:
        return datetime.date.fromisoformat(str(value)).isoformat()
    except ValueError:
        raise ReleaseError(f"release.date in params.yaml must be the release's date, YYYY-MM-DD "
                           f"(got {value!r})") from None


CHAT_SCHEMA = pa.schema([("messages", pa.list_(pa.struct([("role", pa.string()), ("content", pa.string())])))])


def _chat_table(part: pa.Table) -> pa.Table:
    """The `chat` config: one `messages` list (user prompt, assistant answer) per sample, for SFT."""
    rows = part.select(["prompt", "answer"]).to_pylist()
    messages = [[{"role": "user", "content": r["prompt"]}, {"role": "assistant", "content": r["answer"]}] for r in rows]
    return pa.table({"messages": pa.array(messages, type=CHAT_SCHEMA.field("messages").type)}, schema=CHAT_SCHEMA)


def _features(schema: pa.Schema) -> list[dict]:
    """Hugging Face `dataset_info.features` of an Arrow schema (the types a release uses)."""
    return [{"name": f.name, **_feature_type(f.type)} for f in schema]


def _feature_type(t: pa.DataType) -> dict:
    if pa.types.is_list(t):
        inner = t.value_type
        if pa.types.is_struct(inner):
            return {"list": [{"name": f.name, **_feature_type(f.type)} for f in inner]}
        return {"list": _feature_type(inner)["dtype"]}
    names = {pa.string(): "string", pa.large_string(): "large_string", pa.int64(): "int64", pa.int32(): "int32",
             pa.float64(): "float64", pa.float32(): "float32", pa.bool_(): "bool"}
    if t not in names:
        raise ReleaseError(f"no Hugging Face feature type for Arrow type {t}")
    return {"dtype": names[t]}


def dataset_info(folder: Path, tables: dict[str, dict[str, pa.Table]]) -> list[dict]:
    """`dataset_info` of the card, one entry per config: features, and per split the examples and the
    bytes of the Arrow data (`num_bytes`); the Parquet bytes to download and the Arrow bytes in all."""
    out = []
    for config, splits in tables.items():
        folder_name = "data" if config == "default" else config
        schema = next(iter(splits.values())).schema
        # the Arrow bytes of each split as a reader gets it back from its Parquet file (what `datasets`
        # counts; a table built in memory may be laid out a few bytes differently)
        read = {s: pq.read_table(folder / folder_name / f"{s}.parquet") for s in splits}
        entries = [{"name": s, "num_bytes": t.nbytes, "num_examples": t.num_rows} for s, t in read.items()]
        download = sum((folder / folder_name / f"{s}.parquet").stat().st_size for s in splits)
        out.append({"config_name": config, "features": _features(schema), "splits": entries,
                    "download_size": download, "dataset_size": sum(e["num_bytes"] for e in entries)})
    return out


def _split(samples: pa.Table, split: str) -> pa.Table:
    mask = pa.compute.equal(samples.column("split"), split)
    return samples.filter(mask).sort_by("sample_id")


def _remove_tree(path: Path) -> None:
    for p in sorted(path.rglob("*"), reverse=True):
        p.rmdir() if p.is_dir() else p.unlink()
    path.rmdir()


def _card(version, params, sizes, per_strategy, gate, counters, info, date) -> str:
    rel = params.release
    header = {
        "license": rel["license"],
        "pretty_name": "Step-TP (rebuilt)",
        "language": ["en"],
        "task_categories": ["text-generation"],
        "tags": ["compilers", "tensor-programs", "tvm", "chain-of-thought", "leir"],
        "size_categories": [_size_category(sum(sizes.values()))],
        # every config is Parquet (one builder for all: `datasets.load_dataset(DIR, "chat")` works)
        "configs": [{"config_name": "default", "default": True,
                     "data_files": [{"split": s, "path": f"data/{s}.parquet"} for s in SPLITS]},
                    {"config_name": "chat",
                     "data_files": [{"split": s, "path": f"chat/{s}.parquet"} for s in SPLITS]}],
        "dataset_info": info,
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
             "## Files", "", "`data/{train,test}.parquet` (samples; config `default`), `data/steps.parquet` (the "
             "released steps), `chat/{train,test}.parquet` (a `messages` column: user prompt, assistant answer; "
             "config `chat`), the same as JSON Lines in `chat_jsonl/{train,test}.jsonl` for SFT tools, "
             "`shapes.png` (the programs' shapes), `croissant.json` (Croissant metadata with sha256 of every "
             "file), `CHANGELOG.md`. Load with "
             "`datasets.load_dataset(DIR)` or `datasets.load_dataset(DIR, \"chat\")`, or with "
             "`mlcroissant.Dataset(jsonld=DIR + \"/croissant.json\")`.", "",
             f"Released {date} (`release.date` of params.yaml: the date the version was cut, not the build's "
             "clock, so that a rebuild is byte-identical).", ""]
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


def _write_croissant(folder: Path, version: str, params, tables: dict, date: str) -> None:
    """Croissant metadata built with mlcroissant: every file as a FileObject (relative contentUrl,
    sha256), a record set per config and split over its Parquet file, `datePublished` the release date."""
    import mlcroissant as mlc

    files = sorted(p.relative_to(folder).as_posix() for p in folder.rglob("*") if p.is_file())
    formats = {".parquet": "application/x-parquet", ".jsonl": "application/jsonlines", ".md": "text/markdown",
               ".png": "image/png"}
    distribution = [mlc.FileObject(id=f, name=f, content_url=f, encoding_formats=[formats[Path(f).suffix]],
                                   sha256=hashlib.sha256((folder / f).read_bytes()).hexdigest()) for f in files]
    record_sets = []
    for split in SPLITS:
        schema = tables["default"][split].schema
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
        date_published=datetime.datetime.fromisoformat(date), distribution=distribution, record_sets=record_sets)
    (folder / "croissant.json").write_text(json.dumps(metadata.to_json(), indent=1, sort_keys=True, default=str)
                                           + "\n")


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
    inputs = (read_table(lake, "samples"), steps, params, gate, counters, read_table(lake, "programs"),
              strategy_coverage(lake, steps))
    existing = lake / "releases" / f"v{version}"
    if not existing.exists():
        out = make_release(lake, version, *inputs)
        return {"stage": "release", "version": version, "path": str(out)}
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
        return result | {"unchanged": True}
    make_release(lake, dev, *inputs, development_of=version)
    say(f"[bold]release[/]: v{version} exists with other contents; wrote the development release v{dev} beside it "
        "(to publish, set release.version in params.yaml to a new version)")
    return result


def _compare_release(existing: Path, lake: Path, version: str, inputs: tuple) -> tuple[bool, str]:
    """(whether a rebuild of `version` from the lake is identical to the release folder, the content
    hash of the rebuild's data: every file whose bytes do not name the version)."""
    import tempfile

    with tempfile.TemporaryDirectory(dir=lake) as tmp:
        fresh = make_release(Path(tmp), version, *inputs)
        files = sorted(p.relative_to(fresh) for p in fresh.rglob("*") if p.is_file())
        same = files == sorted(p.relative_to(existing) for p in existing.rglob("*") if p.is_file()) and all(
            (fresh / f).read_bytes() == (existing / f).read_bytes() for f in files)
        digest = hashlib.sha256()
        for f in files:
            if f.parts[0] in ("data", "chat", "chat_jsonl") or f.name == "shapes.png":
                digest.update(f.as_posix().encode() + b"\0" + (fresh / f).read_bytes())
    return same, digest.hexdigest()
