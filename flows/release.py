"""The release stage: `lake/releases/vX.Y.Z/` with Parquet per split, chat JSONL for SFT, a dataset
card (Hugging Face YAML header), Croissant metadata listing every file with its sha256, and a
CHANGELOG entry. Files are written in a fixed order with sorted rows, so a rebuild is byte-identical.
"""
from __future__ import annotations

import datetime
import hashlib
import json
import re
import shutil
import tempfile
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq

from flows.prefect_env import configure

configure()

from prefect import flow  # noqa: E402
from prefect.task_runners import ThreadPoolTaskRunner  # noqa: E402

from flows.config import Params  # noqa: E402
from flows.lake_guard import SEMVER, release_problems  # noqa: E402
from flows.measured import configs_section, measured_section  # noqa: E402
from flows.storage import family_splits, read_table, release_inputs, strategy_coverage  # noqa: E402
from flows.tasks import say  # noqa: E402

SPLITS = ("train", "test")
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


F64, I64, STR, BOOL = pa.float64(), pa.int64(), pa.string(), pa.bool_()
MESSAGES = pa.list_(pa.struct([("role", pa.string()), ("content", pa.string())]))
# The configs made of measurements: never read by the deterministic ones.
MEASURED_SCHEMAS = {
    **{name: pa.schema([
        ("step_id", STR), ("program_id", STR), ("parent_step_id", STR), ("depth", I64), ("family", STR), ("split", STR),
        ("strategy", STR), ("level", STR), ("site", STR), ("params", STR), ("claim", STR), ("enables", STR),
        ("before_state_id", STR), ("after_state_id", STR), ("before_leir", STR), ("after_leir", STR),
        ("verification", STR), ("exactness", STR), ("before_us", F64), ("after_us", F64), ("speedup", F64),
        ("speedup_low", F64), ("speedup_high", F64), ("effect", STR), ("timing_unit", STR), ("paired", BOOL),
        ("rounds", I64), ("chain_speedup", F64), ("chain_speedup_low", F64), ("chain_speedup_high", F64),
        ("chain_effect", STR), ("chain_step_id", STR), ("chain_strategy", STR), ("chain_after_leir", STR),
        ("dead_end", BOOL), ("machine_id", STR)]) for name in ("measured", "gpu_steps")},
    "sft": pa.schema([
        ("messages", MESSAGES), ("sample_id", STR), ("split", STR), ("kind", STR), ("step_ids", STR),
        ("strategies", STR), ("claim", STR), ("effect", STR), ("speedup", F64), ("speedup_low", F64),
        ("speedup_high", F64), ("step_effect", STR), ("chain_effect", STR)]),
    "preference": pa.schema([
        ("prompt", STR), ("chosen", STR), ("rejected", STR), ("split", STR), ("chosen_step_id", STR),
        ("rejected_step_id", STR), ("chosen_strategy", STR), ("rejected_strategy", STR), ("chosen_effect", STR),
        ("rejected_effect", STR), ("chosen_speedup", F64), ("chosen_speedup_low", F64), ("rejected_speedup", F64),
        ("rejected_speedup_high", F64), ("chosen_us", F64), ("rejected_us", F64), ("margin", F64),
        ("before_us", F64)]),
    "preference_chat": pa.schema([
        ("prompt", MESSAGES), ("chosen", MESSAGES), ("rejected", MESSAGES), ("split", STR), ("chosen_step_id", STR),
        ("rejected_step_id", STR), ("margin", F64)]),
    **{name: pa.schema([
        ("trajectory_id", STR), ("program_id", STR), ("family", STR), ("workload", STR), ("dtype", STR),
        ("split", STR), ("driver", STR), ("policy", STR), ("seed", I64), ("states", pa.list_(STR)),
        ("strategies", pa.list_(STR)), ("sites", pa.list_(STR)), ("params", pa.list_(STR)),
        ("exactness", pa.list_(STR)), ("verification", pa.list_(STR)), ("max_abs_err", pa.list_(F64)),
        ("times_us", pa.list_(F64)), ("speedups", pa.list_(F64)), ("speedups_low", pa.list_(F64)),
        ("speedups_high", pa.list_(F64)), ("step_effects", pa.list_(STR)), ("best_speedup", F64), ("steps", I64),
        ("search_states", I64), ("search_speedup", F64), ("wall_s", F64), ("machine_id", STR), ("cpu", STR),
        ("format", STR)]) for name in ("trajectories", "trajectories_fast_exp")},
}
# How each config's rows are ordered (a rebuild gives the same bytes).
SORT_KEYS = {"measured": ("step_id",), "gpu_steps": ("step_id",), "sft": ("sample_id",),
             "preference": ("prompt", "chosen_step_id", "rejected_step_id"),
             "preference_chat": ("chosen_step_id", "rejected_step_id"), "trajectories": ("trajectory_id",),
             "trajectories_fast_exp": ("trajectory_id",)}


@dataclass(frozen=True)
class Measured:
    """What a release says about speed, from the lake's measurements: per released step (`effects`,
    the `measured` rows), the `sft` rows, preference pairs in both forms, the search's trajectories,
    the machine that measured them and how (`timing`: protocol, rounds, units, the nest/whole
    agreement), the offline cost model (its file and held-out quality)."""

    effects: list[dict]
    preference: list[dict]
    trajectories: list[dict]
    machine: dict | None
    cost_model: Path | None = None
    cost_model_quality: dict | None = None
    sft: list[dict] = field(default_factory=list)
    preference_chat: list[dict] = field(default_factory=list)
    timing: dict = field(default_factory=dict)
    trajectories_left_out: dict = field(default_factory=dict)  # reason -> trajectories not released
    gpu_steps: list[dict] = field(default_factory=list)  # the records of steps of GPU programs: never timed

    def rows(self, config: str) -> list[dict]:
        published = [t for t in self.trajectories if t["format"] == "published"]
        return {"measured": self.effects, "gpu_steps": self.gpu_steps, "sft": self.sft, "preference": self.preference,
                "preference_chat": self.preference_chat, "trajectories": published,
                "trajectories_fast_exp": [t for t in self.trajectories if t["format"] != "published"]}[config]


def measured_inputs(lake: Path, params, reports: Path | None = None) -> Measured:
    """The release's measured parts, from the `timings`, `effects`, `follow_ups`, `trajectories` and
    cost model of `lake`."""
    from flows.cost_model import MODEL_PATH
    from flows.measured import (
        measured_rows,
        preference_chat_rows,
        preference_pairs,
        release_trajectories,
        sft_rows,
    )

    target = params.verify["target"]
    rows, machine, timing, chain_prompt, chain_answer = measured_rows(lake, target)
    # `measured` holds what this build can time: the steps of programs written for its target; the
    # records of the others (programs written for a GPU) are `gpu_steps`, with the same columns
    effects = [r for r in rows if r["program_target"] == target]
    gpu_steps = [r for r in rows if r["program_target"] != target]
    samples = read_table(lake, "samples").to_pylist()
    per_prompt = int(params.release.get("preference_pairs_per_prompt", 4))
    pairs = preference_pairs(samples, effects, per_prompt)
    split_of = family_splits(lake)  # the samples' split (flows.filtering.split_families)
    model = Path(lake) / MODEL_PATH
    quality = None
    if reports is not None and (Path(reports) / "cost_model.json").exists():
        quality = json.loads((Path(reports) / "cost_model.json").read_text()).get("quality")
    trajectories, left_out = release_trajectories(lake, split_of)
    return Measured(effects, pairs, trajectories, machine, model if model.exists() else None, quality,
                    sft_rows(samples, effects, chain_prompt, chain_answer), preference_chat_rows(pairs), timing,
                    left_out, gpu_steps)


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
                 coverage: list[dict] | None = None, measured: Measured | None = None,
                 splits: dict[str, str] | None = None, reports: Path | None = None,
                 development_of: str | None = None) -> Path:
    """Write the release folder; refuses a version that exists or is not above the last one.
    `programs` (the released steps' programs) adds the card's shape, family and dtype sections;
    `coverage` (flows.storage.strategy_coverage) the section on strategies short of samples;
    `measured` the configs made of measurements (`measured`, `preference`, `trajectories`), the
    card's effect sections and the offline cost model; `splits` (family -> split, `lake/splits`) the
    card's split section (test families, coverage, structural overlap); `reports` (the reports folder)
    the deterministic reports the card cites, copied into `reports/` (PINNED_REPORTS: a tag pins them);
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
        _write_release(tmp, releases, earlier, version, samples, steps, params, gate, filter_counters, programs,
                       coverage, measured, splits, reports, development_of)
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


def _write_release(tmp: Path, releases: Path, earlier: list[str], version: str, samples, steps, params, gate,
                   filter_counters, programs, coverage, measured, splits, reports, development_of) -> None:
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
    if measured is not None:
        _write_measured(tmp, measured, tables)
    per_strategy = dict(sorted(Counter(steps.column("strategy").to_pylist()).items()))
    shapes = _released_shapes(programs, steps, tmp / "shapes.png") if programs is not None else None
    if reports is not None:
        _pin_reports(Path(reports), tmp / "reports")
    info = dataset_info(tmp, tables)
    card = _card(version, params, sizes, per_strategy, gate, filter_counters, info, date, tables)
    if splits is not None:
        card += _split_section(samples, splits, steps)
    if development_of is not None:
        card += _development_section(version, development_of)
    card += configs_section({c: {sp: t.num_rows for sp, t in splits.items()} for c, splits in tables.items()})
    if measured is not None:
        card += measured_section(measured)
    if coverage is not None:
        card += _coverage_section(coverage, int(params.release.get("min_samples_per_strategy", 100)), filter_counters)
    if shapes is not None:
        card += _data_sections(shapes, samples, steps, tmp)
    card += _limitations_section(params, samples, steps, programs, measured, splits)
    card += INTENDED_USE
    (tmp / "README.md").write_text(card)
    (tmp / "CHANGELOG.md").write_text(_changelog(releases, earlier, version, sizes, per_strategy))
    _write_croissant(tmp, version, params, tables, date)


def _write_measured(folder: Path, measured: Measured, tables: dict) -> None:
    """`measured/`, `preference/`, `trajectories/` (a Parquet file per split that has rows) and the
    offline cost model (`cost_model.json`)."""
    for config, schema in MEASURED_SCHEMAS.items():
        rows = measured.rows(config)
        for split in SPLITS:
            part = [r for r in rows if r.get("split") == split]
            if not part:
                continue
            table = pa.Table.from_pylist([{k: r.get(k) for k in schema.names} for r in part], schema=schema)
            table = table.sort_by([(k, "ascending") for k in SORT_KEYS[config]])
            (folder / config).mkdir(exist_ok=True)
            pq.write_table(table, folder / config / f"{split}.parquet", compression="zstd")
            tables.setdefault(config, {})[split] = table
    if measured.cost_model is not None:
        shutil.copyfile(measured.cost_model, folder / "cost_model.json")


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


# What removed a strategy's steps, from the filter's counters (flows.filtering.select_steps): the
# counter keys before and after each rule, and what the card calls the loss.
LOSSES = (("generated", "has_verification", "{n} have no verification"),
          ("has_verification", "verified", "{n} failed verification"),
          ("verified", "unique", "de-duplication removed {n} (the same after-state as a step of a rarer strategy)"),
          ("unique", "cap_per_strategy", "the cap per strategy removed {n}"),
          ("cap_per_strategy", "cap_per_level", "the cap per level removed {n}"))


def _coverage_section(coverage: list[dict], minimum: int, counters: list[dict] | None = None) -> str:
    """The strategies released fewer than `minimum` times, and why: few sites, and each filter rule
    that removed some of them (the counters' per-strategy counts, `reports/filter.json`)."""
    short = [c for c in coverage if c["released"] < minimum]
    lines = ["## Strategies with fewer than " f"{minimum} samples", ""]
    if not short:
        return "\n".join([*lines, f"None: every strategy with a site has at least {minimum} released steps.", ""])
    stages = {c["key"]: c["per_strategy"] for c in counters or [] if c.get("key") and c.get("per_strategy") is not None}
    lines += ["| strategy | programs with a site | steps made | verified | released | why |",
              "| --- | --- | --- | --- | --- | --- |"]
    for c in short:
        counts = " | ".join(str(c[k]) for k in ("programs", "steps", "verified", "released"))
        lines.append(f"| {c['strategy']} | {counts} | {_why_short(c, stages, minimum)} |")
    return "\n".join([*lines, ""])


def _why_short(c: dict, stages: dict[str, dict], minimum: int) -> str:
    if not c["steps"]:
        return "no site in this profile's programs"
    parts = []
    if c["steps"] < minimum:
        parts.append(f"few sites: {c['steps']} step{'s' * (c['steps'] != 1)} made in {c['programs']} "
                     f"program{'s' * (c['programs'] != 1)}")
    if not stages:  # counters without per-strategy counts (a filter.json of an older build)
        if c["verified"] < c["steps"]:
            parts.append(f"{c['steps'] - c['verified']} failed verification")
        return "; ".join(parts) or "the filter kept fewer"
    k = c["strategy"]
    for before, after, what in LOSSES:
        if before in stages and after in stages:
            lost = stages[before].get(k, 0) - stages[after].get(k, 0)
            if lost > 0:
                parts.append(what.format(n=lost))
    return "; ".join(parts) or "none lost after the steps were made"


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


def _split_section(samples: pa.Table, splits: dict[str, str], steps: pa.Table | None = None) -> str:
    """The test split: its families, the strategies it covers, samples per strategy, and how much of it
    the train split has seen (structural overlap, per sample and nest by nest) with the size of the
    clean part."""
    from flows.reports import split_figures

    fig = split_figures(samples, splits, steps)
    ov = fig["overlap"]
    per = fig["samples_per_strategy"]
    lines = ["## Test split", "",
             "Whole workload families are held out, chosen for coverage (`flows.filtering.split_families`: the "
             "set of families, near `filter.test_fraction` of the samples, that covers the most strategies, "
             "gives 20 test samples to the most strategies with 100 or more, and keeps a quarter of every "
             "strategy found in two families or more in train; ties by a seeded rank), never a random share of "
             f"samples. Test families ({len(fig['families']['test'])}): "
             + ", ".join(f"`{f}`" for f in fig["families"]["test"]) + ".", "",
             f"The test split covers {fig['strategies_in_test']} of the {fig['strategies_released']} released "
             "strategies." + (" In the train split only: " + ", ".join(f"`{k}`" for k in fig["train_only"]) + "."
                              if fig["train_only"] else "")
             + (" In the test split only (each found in one family, held out for coverage: a model trained on the "
                "train split never saw them): " + ", ".join(f"`{k}`" for k in fig["test_only"]) + "."
                if fig["test_only"] else ""), "",
             f"**Structural overlap**: {ov['overlapping']} of {ov['test_samples']} test samples "
             f"({100 * ov['share']:.1f}%) have a before-state whose every loop nest has a twin in a train state "
             "(before- or after-state) once tensor names, loop indices, loop extents and integer literals are "
             "abstracted (`leir.canon.structure_hashes`); the column `structural_overlap` marks them. The clean "
             f"part of the test split is the other **{ov['clean']}** samples; `steptp eval --split test` scores "
             "both. In the train split the same column marks the samples whose before-state's every nest has a "
             f"twin in a test state: {ov.get('train_overlapping', 0)} of {fig['train']}."
             + (f" Nest by nest, {ov['test_nests_seen']} of the {ov['test_nests']} loop nests of the "
                        f"{ov['test_states']} distinct test states have a twin in train (a partial overlap the "
                        "flag, which asks for every nest, does not count)." if "test_nests" in ov else ""), "",
             "| strategy | train samples | test samples |", "| --- | --- | --- |",
             *(f"| {k} | {v['train']} | {v['test']} |" for k, v in per.items()), ""]
    return "\n".join(lines)


def _limitations_section(params, samples: pa.Table, steps: pa.Table, programs: pa.Table | None,
                         measured: Measured | None, splits: dict[str, str] | None = None) -> str:
    """What the release does not show, from its own contents."""
    from strategies.registry import get

    target = params.verify["target"]
    strategies = sorted(set(steps.column("strategy").to_pylist()))
    gpu_only = [k for k in strategies if get(k).needs_gpu]
    gpu_steps = sum(1 for k in steps.column("strategy").to_pylist() if k in gpu_only)
    lines = ["## Limitations", "",
             f"- **Verification on the CPU.** Every released step was verified by running it on target `{target}` "
             "against the original on seeded inputs (a few draws, tolerances per dtype), not proved equivalent. "
             + (f"{gpu_steps} steps of GPU-only strategies ({', '.join(gpu_only)}) were verified on the CPU too "
                "(LEIR's meaning does not depend on the target); none was run on a GPU."
                if gpu_only else "No released step is of a GPU-only strategy."),
             "- **Effects are measurements of one machine.** The `measured`, `sft`, `preference`, "
             "`preference_chat` and `trajectories` configs and the cost model come from timings of one CPU; another "
             "machine may rank the same steps differently. GPU-target steps have no measured effect (their "
             "records are `gpu_steps`)."
             + ("" if measured is not None and measured.machine else " This release holds no timing."),
             ]
    if programs is not None and "program_id" in steps.column_names:
        released = set(steps.column("program_id").to_pylist())
        dtype_of = {p["program_id"]: p["dtype"] for p in programs.select(["program_id", "dtype"]).to_pylist()}
        per_dtype = Counter(dtype_of.get(p) for p in steps.column("program_id").to_pylist())
        programs_per = Counter(dtype_of[p] for p in released if p in dtype_of)
        half = {d: (programs_per.get(d, 0), per_dtype.get(d, 0)) for d in ("float16", "bfloat16")}
        lines.append("- **Half precision is thin.** " + "; ".join(
            f"{d}: {n} programs, {k} of {steps.num_rows} released steps" for d, (n, k) in half.items())
            + " (only the kinds the profile lists under `extra_dtypes`; float32 accumulators).")
    from flows.reports import split_figures

    ov = split_figures(samples, splits or {}, steps)["overlap"]
    nests = (f"; nest by nest, {ov['test_nests_seen']} of the {ov['test_nests']} loop nests of the test states have "
             "a twin in train" if ov.get("test_nests") else "")
    if ov["test_samples"]:
        lines.append(f"- **Structural overlap.** {ov['overlapping']} of {ov['test_samples']} test samples "
                     f"({100 * ov['share']:.1f}%) repeat, up to names and sizes, every loop nest of their state from "
                     f"the train split{nests} (section Test split); report scores on the clean part beside the "
                     "whole split.")
    lines += ["- **Mostly single steps, generated text.** A `default` sample is one step (or k options) from one "
              "state; multi-step records are the two-step chains of `sft` and the search's `trajectories`. Prompts "
              "and chains of thought are generated from the LEIR tree by the pipeline (deterministic templates over "
              "a static analysis), not written by people, and cite no timing; where the static figures and the "
              "clock disagree the card gives the rate (section Measured effects).",
              "- **Synthetic shapes.** Programs are traced PyTorch modules at shapes drawn under a work budget "
              "(section Shapes): smaller than production layers, and one instance per workload at this profile.",
              "- **The split follows coverage.** The test families were chosen so that the test split covers the "
              "strategies; they are not a random sample of workloads, their mix differs from the train split's, "
              "and a strategy found in one family only is in one split only (section Test split).",
              ""]
    return "\n".join(lines)


INTENDED_USE = "\n".join([
    "## Intended use", "",
    "Supervised fine-tuning and evaluation of language models that propose one verified optimisation step "
    "of a tensor program written in LEIR, with its reasoning (`default`, `chat`); preference tuning and "
    "cost-model research on the measured configs, on the machine they were measured on. Score a model with "
    "`steptp eval --split test` (whole test split and its clean part). Not a benchmark of hardware speed, "
    "not a source of schedules for production without verifying them on the target, and not evidence "
    "that a step is correct on a GPU.", ""])


def _data_sections(shapes: list[dict], samples: pa.Table, steps: pa.Table, folder: Path) -> str:
    """What the data holds: shapes (figures and histogram), families, dtypes, file sizes."""
    from flows.reports import shape_figures

    figures = shape_figures(shapes)
    program_of = dict(zip(steps.column("step_id").to_pylist(), steps.column("program_id").to_pylist(), strict=True))
    shape_of = {r["program_id"]: r for r in shapes}
    per_family, per_dtype = Counter(), Counter()
    for ids in samples.column("step_ids").to_pylist():
        first = shape_of.get(program_of.get((json.loads(ids) or [None])[0]))
        if first:
            per_family[first["family"]] += 1
            per_dtype[first["dtype"]] += 1
    programs_per_family = Counter(r["family"] for r in shapes)
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


def _card(version, params, sizes, per_strategy, gate, counters, info, date, tables=None) -> str:
    rel = params.release
    extra = [{"config_name": c, "data_files": [{"split": sp, "path": f"{c}/{sp}.parquet"} for sp in tables[c]]}
             for c in MEASURED_SCHEMAS if tables and tables.get(c)]
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
                     "data_files": [{"split": s, "path": f"chat/{s}.parquet"} for s in SPLITS]}, *extra],
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
             "## Filtering", "", "| rule | before | after | note |", "| --- | --- | --- | --- |",
             *(f"| {c['rule']} | {c['before']} | {c['after']} | {c.get('note', '')} |" for c in counters), "",
             "## Release gate (Great Expectations)", "",
             f"{'passed' if gate.get('success') else 'FAILED'}: {gate.get('expectations_checked', 0)} expectations.",
             "", "## Versioning", "", SEMVER_RULES, "",
             "## Files", "", "`data/{train,test}.parquet` (samples; config `default`), `data/steps.parquet` (the "
             "released steps), `chat/{train,test}.parquet` (a `messages` column: user prompt, assistant answer; "
             "config `chat`), the same as JSON Lines in `chat_jsonl/{train,test}.jsonl` for SFT tools, "
             "`shapes.png` (the programs' shapes), `reports/` (the build's deterministic reports this card "
             "cites: filter counters, gate, split, strategies, verification, errors, summary and their figures), "
             "`croissant.json` (Croissant metadata with sha256 of every file and its Responsible-AI fields), "
             "`CHANGELOG.md`; made of measurements (sections Configs and Measured effects): `measured/`, `sft/`, "
             "`preference/`, `preference_chat/`, `trajectories/` (one folder per config) and `cost_model.json`; "
             "`gpu_steps/` (the records of the GPU programs' steps, never timed). "
             "Load with `datasets.load_dataset(DIR)` or `datasets.load_dataset(DIR, NAME)` for NAME in `chat`, "
             "`measured`, `gpu_steps`, `sft`, `preference`, `preference_chat`, `trajectories`, or with "
             "`mlcroissant.Dataset(jsonld=DIR + \"/croissant.json\")` (record sets `train`, `test`, "
             "`measured_train`, ...; the configs of nested message lists are files only).", "",
             f"Released {date} (`release.date` of params.yaml: the date the version was cut, not the build's "
             "clock). The `default` and `chat` files are the same bytes on every rebuild; the measured ones are "
             "the same for the same `timings` table (versioned with DVC).", ""]
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
               ".png": "image/png", ".json": "application/json"}
    distribution = [mlc.FileObject(id=f, name=f, content_url=f, encoding_formats=[formats[Path(f).suffix]],
                                   sha256=hashlib.sha256((folder / f).read_bytes()).hexdigest()) for f in files]
    record_sets = []
    for config, splits in tables.items():
        if any(pa.types.is_list(f.type) and pa.types.is_struct(f.type.value_type)
               for f in next(iter(splits.values())).schema):
            continue  # nested messages (`chat`, `sft`, `preference_chat`): their files are listed above
        folder_name = "data" if config == "default" else config
        for split, table in splits.items():
            set_id = split if config == "default" else f"{config}_{split}"
            fields = [mlc.Field(id=f"{set_id}/{f.name}", name=f.name, data_types=[_croissant_type(f.type)],
                                repeated=True if pa.types.is_list(f.type) else None,
                                source=mlc.Source(file_object=f"{folder_name}/{split}.parquet",
                                                  extract=mlc.Extract(column=f.name)))
                      for f in table.schema]
            record_sets.append(mlc.RecordSet(id=set_id, name=set_id, fields=fields))
    rel = params.release
    creator = rel.get("creator") or {"name": "Step-TP data lake maintainers"}
    metadata = mlc.Metadata(
        name=f"step-tp-v{version}", version=version, license=[rel["license"]],
        description="Step-level verified LEIR tensor-program transformations with chain of thought.",
        creators=[mlc.Organization(name=creator["name"], url=creator.get("url"))],
        url=rel.get("url"), cite_as=rel.get("cite_as") or CITATION,
        date_published=datetime.datetime.fromisoformat(date), distribution=distribution, record_sets=record_sets,
        **RESPONSIBLE_AI)
    (folder / "croissant.json").write_text(json.dumps(metadata.to_json(), indent=1, sort_keys=True, default=str)
                                           + "\n")


# What Croissant's `citeAs` asks for: the publication that describes the dataset, in BibTeX.
CITATION = """@misc{liu2026steptp,
  title = {Step-TP: A Grounded, Step-Level Dataset with Chain-of-Thought Reasoning for LLM-Guided Tensor Program
           Optimization},
  author = {Liu and Zheng and Su and Wu},
  year = {2026},
  note = {Rebuilt with the Step-TP data lake toolchain}
}"""
# Croissant's Responsible-AI fields (`rai:`), true of every release this pipeline builds.
RESPONSIBLE_AI = {
    "data_collection": "Generated, not collected: PyTorch modules of a workload catalogue, traced to LEIR at shapes "
                       "drawn under a work budget, rewritten by 43 rule-based strategies, verified with TVM against "
                       "the original program on seeded input draws; chains of thought rendered from each "
                       "transformation record by templates over a static analysis; runtimes measured with TVM on one "
                       "CPU named in the card.",
    "data_collection_type": ["Synthetic"],
    "data_limitations": "Verified on seeded inputs, not proved equivalent. Runtimes and effect classes are "
                        "measurements of one machine: another CPU may rank the same steps differently, and steps "
                        "of programs written for a GPU are not timed. Shapes are smaller than production layers. "
                        "Chains of thought are template text over static figures that can disagree with the clock "
                        "(the card gives the rate).",
    "data_biases": "The mix of strategies follows the catalogue's workloads and the filter's caps, not how often a "
                   "compiler would use each; the test split holds out families chosen for strategy coverage, not "
                   "at random; half-precision programs are few.",
    "personal_sensitive_information": "None: the records are generated tensor programs and text about them.",
    "data_use_cases": "Supervised fine-tuning (default, chat, sft), preference tuning (preference, "
                      "preference_chat), process supervision and search research (measured, trajectories) of models "
                      "that optimise tensor programs; evaluation on the held-out test split. Not a benchmark of "
                      "hardware speed, nor a source of production schedules without verification on the target.",
}


def _croissant_type(t: pa.DataType):
    import mlcroissant as mlc

    t = t.value_type if pa.types.is_list(t) else t
    if pa.types.is_integer(t):
        return mlc.DataType.INTEGER
    if pa.types.is_floating(t):
        return mlc.DataType.FLOAT
    if pa.types.is_boolean(t):
        return mlc.DataType.BOOL
    return mlc.DataType.TEXT


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
              strategy_coverage(lake, steps, params.verify["target"]), measured_inputs(lake, params, Path(reports)),
              family_splits(lake), Path(reports))
    existing = lake / "releases" / f"v{version}"
    if not existing.exists():
        out = make_release(lake, version, *inputs)
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
        return result | {"unchanged": True}
    make_release(lake, dev, *inputs, development_of=version)
    say(f"[bold]release[/]: v{version} exists with other contents; wrote the development release v{dev} beside it "
        "(to publish, set release.version in params.yaml to a new version)")
    return result


def _refuse_damaged(folder: Path) -> None:
    problems = release_problems(folder)
    if problems:
        raise ReleaseError(f"release {folder} is damaged ({'; '.join(problems)}); it was not written by a whole "
                           "run of this version: move it out of the lake and run again")


# The folders of a release whose bytes are its data (the content hash of a development release), with
# the pinned reports its card cites.
RELEASE_DATA_FOLDERS = ("data", "chat", "chat_jsonl", "measured", "gpu_steps", "sft", "preference",
                        "preference_chat", "trajectories", "trajectories_fast_exp", "reports")


def _compare_release(existing: Path, lake: Path, version: str, inputs: tuple) -> tuple[bool, str]:
    """(whether a rebuild of `version` from the lake is identical to the release folder, the content
    hash of the rebuild's data: every file whose bytes do not name the version)."""
    with tempfile.TemporaryDirectory(dir=lake, prefix=".compare-") as tmp:
        fresh = make_release(Path(tmp), version, *inputs)
        files = sorted(p.relative_to(fresh) for p in fresh.rglob("*") if p.is_file())
        same = files == sorted(p.relative_to(existing) for p in existing.rglob("*") if p.is_file()) and all(
            (fresh / f).read_bytes() == (existing / f).read_bytes() for f in files)
        digest = hashlib.sha256()
        for f in files:
            if f.parts[0] in RELEASE_DATA_FOLDERS or f.name == "shapes.png":
                digest.update(f.as_posix().encode() + b"\0" + (fresh / f).read_bytes())
    return same, digest.hexdigest()
