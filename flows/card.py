"""The dataset card of a release (its README.md) and its CHANGELOG: the Hugging Face YAML header and
the sections that describe the release from its own contents."""
from __future__ import annotations

import json
from collections import Counter
from pathlib import Path

import pyarrow as pa

from flows.release_configs import MEASURED_SCHEMAS, SPLITS, Measured
from flows.versions import SEMVER_RULES

TEMPLATE = Path(__file__).parent / "templates" / "card.md"


def card(inputs, written, info: list[dict], date: str, development_of: str | None = None) -> str:
    """The card (README.md): the template `templates/card.md` filled from the release's inputs
    (flows.release.ReleaseInputs) and what writing its data gave (flows.release.Written), then the
    sections drawn from its contents, in a fixed order."""
    import jinja2

    env = jinja2.Environment(loader=jinja2.FileSystemLoader(TEMPLATE.parent), trim_blocks=True,
                             keep_trailing_newline=False, autoescape=False, undefined=jinja2.StrictUndefined)
    return env.get_template(TEMPLATE.name).render(
        header=_header(inputs.params, written, info), version=written.version,
        target=inputs.params.verify["target"], sizes=written.sizes, per_strategy=written.per_strategy,
        filter_counters=inputs.filter_counters, gate=inputs.gate, semver_rules=SEMVER_RULES, date=date,
        sections=_sections(inputs, written, development_of))


def _header(params, written, info: list[dict]) -> str:
    """The Hugging Face YAML header: license, tags, size, every config's files and `dataset_info`."""
    import yaml

    tables = written.tables
    extra = [{"config_name": c, "data_files": [{"split": sp, "path": f"{c}/{sp}.parquet"} for sp in tables[c]]}
             for c in MEASURED_SCHEMAS if tables.get(c)]
    header = {
        "license": params.release["license"],
        "pretty_name": "Step-TP (rebuilt)",
        "language": ["en"],
        "task_categories": ["text-generation"],
        "tags": ["compilers", "tensor-programs", "tvm", "chain-of-thought", "leir"],
        "size_categories": [_size_category(sum(written.sizes.values()))],
        # every config is Parquet (one builder for all: `datasets.load_dataset(DIR, "chat")` works)
        "configs": [{"config_name": "default", "default": True,
                     "data_files": [{"split": s, "path": f"data/{s}.parquet"} for s in SPLITS]},
                    {"config_name": "chat",
                     "data_files": [{"split": s, "path": f"chat/{s}.parquet"} for s in SPLITS]}, *extra],
        "dataset_info": info,
    }
    return yaml.safe_dump(header, sort_keys=False).rstrip()


def _sections(inputs, written, development_of: str | None) -> str:
    """The sections after the template's, each drawn from the release's own contents."""
    from flows.measured import configs_section, measured_section

    params, samples, steps = inputs.params, inputs.samples, inputs.steps
    out = ""
    if inputs.splits is not None:
        out += _split_section(samples, inputs.splits, steps)
    if development_of is not None:
        out += _development_section(written.version, development_of)
    out += configs_section({c: {sp: t.num_rows for sp, t in parts.items()} for c, parts in written.tables.items()})
    if inputs.measured is not None:
        out += measured_section(inputs.measured)
    if inputs.coverage is not None:
        minimum = int(params.release.get("min_samples_per_strategy", 100))
        out += _coverage_section(inputs.coverage, minimum, inputs.filter_counters)
    if written.shapes is not None:
        out += _data_sections(written.shapes, samples, steps, written.folder)
    return out + _limitations_section(params, samples, steps, inputs.programs, inputs.measured, inputs.splits) \
        + INTENDED_USE


def _size_category(n: int) -> str:
    for limit, name in ((1_000, "n<1K"), (10_000, "1K<n<10K"), (100_000, "10K<n<100K"), (1_000_000, "100K<n<1M")):
        if n < limit:
            return name
    return "1M<n<10M"


def changelog(releases: Path, earlier: list[str], version: str, samples: pa.Table, steps: pa.Table) -> str:
    """CHANGELOG.md: this version's entry above the previous release's changelog."""
    splits = Counter(samples.column("split").to_pylist())
    sizes = {s: splits.get(s, 0) for s in SPLITS}
    per_strategy = Counter(steps.column("strategy").to_pylist())
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


def _development_section(version: str, published: str) -> str:
    return "\n".join(["## Development release", "",
                      f"v{version} is not a published release: the lake changed after v{published} was released "
                      f"and `release.version` in params.yaml still says {published}. Its files are what "
                      f"v{published} would hold now; `+{version.split('+')[1]}` is their content hash. Publish "
                      "them by setting `release.version` (and `release.date`) in params.yaml to a new version, "
                      "by the rules above, and running the pipeline again (or `steptp release --version X.Y.Z`).",
                      ""])


def released_shapes(programs: pa.Table, steps: pa.Table, plot: Path) -> list[dict]:
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


def _gpu_verification(measured: Measured | None) -> str:
    """Whether the steps of GPU programs ran on a GPU at all."""
    if measured is None or not measured.gpu_steps:
        return "No released step belongs to a program written for a GPU."
    n, on = len(measured.gpu_steps), measured.verified_on_cuda
    return (f"Of the {n} released steps of programs written for a GPU (`gpu_steps`), {on} were also run on a GPU "
            "(CUDA)." if on else f"None of the {n} released steps of programs written for a GPU (`gpu_steps`) was "
            "run on a GPU: no GPU was present when they were verified.")


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
                "(LEIR's meaning does not depend on the target). "
                if gpu_only else "No released step is of a GPU-only strategy. ")
             + _gpu_verification(measured),
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
             f"{len(shapes)} source programs have a released step; the figures and tables below describe them "
             "(`reports/summary.json` describes every generated program, so its counts are larger). Median largest "
             f"tensor extent: {figures['median_largest_dim']}; "
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
