"""The release folder: files, Croissant metadata that mlcroissant loads, byte-identical rebuilds, versions."""
from __future__ import annotations

import hashlib
import json

import pyarrow.parquet as pq
import pytest
from test_filtering import tables

from flows.config import load_params
from flows.filtering import assemble_samples, select_steps
from flows.release import ReleaseInputs, make_release
from flows.storage import to_arrow
from flows.versions import ReleaseError


def release_of(lake, version, *inputs, development_of=None, **named):
    """make_release with the inputs given as ReleaseInputs' fields, in order or by name."""
    return make_release(lake, version, ReleaseInputs(*inputs, **named), development_of)


@pytest.fixture(scope="module")
def inputs():
    params = load_params(overrides={"filter": {"multi_answer_fraction": 1.0, "test_fraction": 0.34}})
    programs, steps, verifs = tables()
    kept, counters = select_steps(programs, steps, verifs, params)
    samples, _ = assemble_samples(kept, programs, params, count_tokens=len)
    return params, to_arrow("samples", samples), kept.select(["step_id", "strategy", "after_leir"]), counters


def build(lake, inputs, version="0.1.0"):
    params, samples, steps, counters = inputs
    return release_of(lake, version, samples, steps, params, {"success": True, "expectations_checked": 30},
                      [c.to_json() for c in counters])


def test_release_files_and_croissant(tmp_path, inputs):
    import mlcroissant as mlc

    out = build(tmp_path / "lake", inputs)
    names = sorted(p.relative_to(out).as_posix() for p in out.rglob("*") if p.is_file())
    assert names == ["CHANGELOG.md", "README.md", "chat/test.parquet", "chat/train.parquet", "chat_jsonl/test.jsonl",
                     "chat_jsonl/train.jsonl", "croissant.json", "data/steps.parquet", "data/test.parquet",
                     "data/train.parquet"]
    card = (out / "README.md").read_text()
    assert card.startswith("---\nlicense: apache-2.0\n") and "num_examples" in card and "MAJOR" in card
    meta = json.loads((out / "croissant.json").read_text())
    assert meta["datePublished"] == "2026-12-01"  # release.date of params.yaml, not the clock
    # a creator, no placeholder url, BibTeX, and the Responsible-AI fields mlcroissant validates
    assert meta["creator"]["name"] and "url" not in meta and meta["citeAs"].startswith("@misc{")
    for field in ("dataCollection", "dataLimitations", "dataBiases", "personalSensitiveInformation", "dataUseCases"):
        assert meta[f"rai:{field}"], field
    listed = {d["contentUrl"]: d["sha256"] for d in meta["distribution"]}
    assert set(listed) == set(names) - {"croissant.json"}
    for name, digest in listed.items():
        assert hashlib.sha256((out / name).read_bytes()).hexdigest() == digest
    dataset = mlc.Dataset(jsonld=str(out / "croissant.json"))
    records = list(dataset.records("train"))
    n_train = sum(1 for _ in (out / "chat_jsonl/train.jsonl").open())
    assert len(records) == n_train > 0
    line = json.loads((out / "chat_jsonl/train.jsonl").read_text().splitlines()[0])
    assert [m["role"] for m in line["messages"]] == ["user", "assistant"]
    assert line["messages"][1]["content"].startswith("<think>")
    chat = pq.read_table(out / "chat/train.parquet")
    assert chat.num_rows == n_train and chat.column("messages")[0].as_py() == line["messages"]


def test_card_dataset_info_describes_every_config_and_split(tmp_path, inputs):
    import yaml

    out = build(tmp_path / "lake", inputs)
    header = yaml.safe_load((out / "README.md").read_text().split("---")[1])
    configs = {c["config_name"]: c for c in header["configs"]}
    assert {f["path"].rsplit(".", 1)[1] for c in configs.values() for f in c["data_files"]} == {"parquet"}
    info = {i["config_name"]: i for i in header["dataset_info"]}
    assert set(info) == set(configs) == {"default", "chat"}
    for name, folder in (("default", "data"), ("chat", "chat")):
        splits = {s["name"]: s for s in info[name]["splits"]}
        for split in ("train", "test"):
            table = pq.read_table(out / folder / f"{split}.parquet")
            assert splits[split] == {"name": split, "num_bytes": table.nbytes, "num_examples": table.num_rows}
        assert info[name]["dataset_size"] == sum(s["num_bytes"] for s in splits.values())
        assert info[name]["download_size"] == sum((out / folder / f"{s}.parquet").stat().st_size for s in splits)
    assert info["chat"]["features"] == [{"name": "messages", "list": [{"name": "role", "dtype": "string"},
                                                                      {"name": "content", "dtype": "string"}]}]
    assert [f["name"] for f in info["default"]["features"]] == pq.read_schema(out / "data/train.parquet").names


def test_release_date_comes_from_params_never_the_clock(tmp_path, inputs):
    params, samples, steps, counters = inputs
    from flows.config import Params, ParamsError

    with pytest.raises(ParamsError, match="release.date: 'someday' is not a date YYYY-MM-DD"):
        load_params(overrides={"release": {"date": "someday"}})  # the schema refuses it before any stage
    raw = {**params.raw, "release": {**params.raw["release"], "date": "someday"}}
    with pytest.raises(ReleaseError, match="release.date"):  # and the release, given it anyway
        release_of(tmp_path / "lake", "0.1.0", samples, steps, Params(raw, params.profile_name), {"success": True}, [])


@pytest.mark.slow
def test_standard_clients_load_both_configs_without_warnings(tmp_path, inputs, monkeypatch):
    """`datasets.load_dataset(DIR)` and `(DIR, "chat")`, and mlcroissant, on a fresh release: the data
    comes back, and neither complains about the card's metadata or the Croissant file."""
    import logging

    monkeypatch.setenv("HF_DATASETS_OFFLINE", "1")
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setenv("HF_HOME", str(tmp_path / "hf"))
    import datasets
    import mlcroissant as mlc

    out = build(tmp_path / "lake", inputs)
    heard = []
    handler = logging.Handler(logging.WARNING)
    handler.emit = lambda record: heard.append(record.getMessage())
    loggers = [logging.getLogger(), datasets.logging.get_logger()]
    for logger in loggers:
        logger.addHandler(handler)
    try:
        default = datasets.load_dataset(str(out), cache_dir=str(tmp_path / "cache"))
        chat = datasets.load_dataset(str(out), "chat", cache_dir=str(tmp_path / "cache"))
        records = list(mlc.Dataset(jsonld=str(out / "croissant.json")).records("test"))
    finally:
        for logger in loggers:
            logger.removeHandler(handler)
    assert [m for m in heard if "dataset_info" in m or "recommended" in m or "warning" in m.lower()] == []
    samples = inputs[1]
    for split in ("train", "test"):
        n = sum(1 for s in samples.column("split").to_pylist() if s == split)
        assert default[split].num_rows == chat[split].num_rows == n > 0
    assert default["train"].info.splits["train"].num_bytes > 0
    assert [m["role"] for m in chat["test"][0]["messages"]] == ["user", "assistant"]
    assert chat["test"][0]["messages"][0]["content"] == default["test"][0]["prompt"]
    assert len(records) == default["test"].num_rows


def test_rebuild_is_byte_identical(tmp_path, inputs):
    a, b = build(tmp_path / "a", inputs), build(tmp_path / "b", inputs)
    for f in sorted(p for p in a.rglob("*") if p.is_file()):
        assert f.read_bytes() == (b / f.relative_to(a)).read_bytes(), f


def test_versions_follow_semver_and_never_overwrite(tmp_path, inputs):
    lake = tmp_path / "lake"
    build(lake, inputs, "0.2.0")
    with pytest.raises(ReleaseError, match="exists already"):
        build(lake, inputs, "0.2.0")
    with pytest.raises(ReleaseError, match="below the last release"):
        build(lake, inputs, "0.1.9")
    with pytest.raises(ReleaseError, match="semantic versioning"):
        build(lake, inputs, "1.0")
    out = build(lake, inputs, "0.3.0")
    log = (out / "CHANGELOG.md").read_text()
    assert log.index("## v0.3.0") < log.index("## v0.2.0") and "previous release: v0.2.0" in log


def test_card_shows_shapes_families_dtypes_and_sizes(tmp_path, inputs):
    params, samples, _, counters = inputs
    programs, steps, verifs = tables()
    rows = programs.to_pylist()
    for i, r in enumerate(rows):  # two shape sources and two dtypes among the released programs
        r.update(dtype=("float32", "float16")[i % 2], shape_source=("model-dims", "odd-extents")[i % 3 == 0])
    kept, _ = select_steps(to_arrow("programs", rows), steps, verifs, params)
    out = release_of(tmp_path / "lake", "0.1.0", samples, kept.select(["step_id", "program_id", "strategy",
                                                                         "after_leir"]),
                       params, {"success": True, "expectations_checked": 30}, [c.to_json() for c in counters],
                       to_arrow("programs", rows))
    card = (out / "README.md").read_text()
    for section in ("## Shapes", "## Families", "## Dtypes", "## Sizes"):
        assert section in card
    assert "![largest tensor extent per program](shapes.png)" in card and (out / "shapes.png").stat().st_size > 0
    assert "| odd-extents | 2 |" in card and "| model-dims | 4 |" in card
    assert "Median largest tensor extent: 6" in card  # the matmul's signature extents are 4, 5 and 6
    assert "| float16 | 3 |" in card and "| fam0 | 2 |" in card
    assert "`data/train.parquet` |" in card
    listed = {d["contentUrl"] for d in json.loads((out / "croissant.json").read_text())["distribution"]}
    assert "shapes.png" in listed
    again = release_of(tmp_path / "again", "0.1.0", samples, kept.select(["step_id", "program_id", "strategy",
                                                                            "after_leir"]),
                         params, {"success": True, "expectations_checked": 30}, [c.to_json() for c in counters],
                         to_arrow("programs", rows))
    assert (again / "shapes.png").read_bytes() == (out / "shapes.png").read_bytes()  # deterministic plot
    assert (again / "README.md").read_text() == card


@pytest.mark.parametrize(("released", "configured", "policy", "expected"), [
    ([], "0.1.0", "patch", "0.1.0"),                      # the first release takes params.yaml's version
    (["0.1.0"], "0.1.0", "patch", "0.1.1"),               # taken: bump the last release
    (["0.1.0", "0.1.3", "0.1.10"], "0.1.0", "patch", "0.1.11"),  # numeric order, not text order
    (["0.1.3"], "0.1.3", "minor", "0.2.0"),
    (["0.1.3"], "0.1.3", "major", "1.0.0"),
    (["0.1.3"], "0.2.0", "patch", "0.2.0"),               # raised by hand above every release: taken as is
    (["0.1.3"], "0.1.1", "patch", "0.1.4"),               # below the last release: never goes backwards
])
def test_next_version_follows_the_policy(released, configured, policy, expected):
    from flows.versions import next_version

    assert next_version(released, configured, policy) == expected


def test_next_version_rejects_an_unknown_policy():
    from flows.versions import next_version

    with pytest.raises(ReleaseError, match="version_policy must be one of patch, minor, major"):
        next_version(["0.1.0"], "0.1.0", "nightly")


def test_card_says_why_a_strategy_has_fewer_samples_than_the_minimum(tmp_path, inputs):
    from flows.lake_queries import strategy_coverage
    from flows.storage import write_shard

    params, samples, released, counters = inputs
    programs, steps, verifs = tables()
    lake = tmp_path / "lake"
    write_shard(lake, "steps", "all", steps.to_pylist())
    write_shard(lake, "verifications", "all", verifs.to_pylist())
    coverage = {c["strategy"]: c for c in strategy_coverage(lake, released)}
    made = steps.to_pylist()
    for name in {r["strategy"] for r in made}:
        assert coverage[name]["steps"] == sum(r["strategy"] == name for r in made)
        assert coverage[name]["released"] == released.column("strategy").to_pylist().count(name)
    assert len(coverage) == 43 and coverage["powsimp"]["steps"] == 0  # registered strategies without a site too
    out = release_of(lake, "0.1.0", samples, released, params, {"success": True}, [c.to_json() for c in counters],
                       coverage=list(coverage.values()))
    card = (out / "README.md").read_text()
    section = card[card.index("## Strategies with fewer than 100 samples"):]
    assert "| powsimp | 0 | 0 | 0 | 0 | no site in this profile's programs |" in section
    some = next(c for c in coverage.values() if c["steps"])
    assert f"| {some['strategy']} | {some['programs']} | {some['steps']} |" in section  # every strategy here is short
    enough = release_of(tmp_path / "l2", "0.1.0", samples, released, params.__class__(
        {**params.raw, "release": {**params.release, "min_samples_per_strategy": 0}}, params.profile_name), {"success": True},
        [], coverage=list(coverage.values()))
    assert "None: every strategy with a site has at least 0" in (enough / "README.md").read_text()


@pytest.mark.parametrize(("published", "earlier", "expected"), [
    ("0.1.0", ["0.1.0"], "0.1.1-dev+0123456789ab"),
    ("0.1.0", ["0.1.0", "0.1.4"], "0.1.5-dev+0123456789ab"),  # above every release made
    ("0.3.2", ["0.1.0"], "0.3.3-dev+0123456789ab"),
])
def test_a_development_version_leads_to_the_next_patch(published, earlier, expected):
    from flows.versions import DEV_VERSION, development_version, parse_version

    version = development_version(published, earlier, "0123456789abcdef" * 4)
    assert version == expected and DEV_VERSION.match(version)
    with pytest.raises(ReleaseError, match="semantic versioning"):
        parse_version(version)  # never taken for a published version
    assert parse_version(version, development=True) > parse_version(published)


def test_card_attributes_losses_to_the_rule_that_removed_them(tmp_path):
    """Steps of one program state that give one result: de-duplication keeps one of them; the card says
    so for the strategies it removed, not that their sites are rare; a cap that kept all says it did not bind."""
    from flows.lake_queries import strategy_coverage
    from flows.storage import write_shard

    params = load_params(overrides={"filter": {"multi_answer_fraction": 0.0, "test_fraction": 0.34}})
    programs, steps, verifs = tables()
    rows = steps.to_pylist()
    for r in rows:
        r["after_program_id"] = "same-" + r["program_id"]  # the four strategies of a program give one result
    steps = to_arrow("steps", rows)
    kept, counters = select_steps(programs, steps, verifs, params)
    rules = {c.key: c for c in counters}
    assert rules["unique"].after == 6 and sum(rules["unique"].per_strategy.values()) == 6
    assert rules["cap_per_strategy"].note.startswith("did not bind")  # 400 per strategy, at most 6 here
    samples, _ = assemble_samples(kept, programs, params, count_tokens=len)
    lake = tmp_path / "lake"
    write_shard(lake, "steps", "all", steps.to_pylist())
    write_shard(lake, "verifications", "all", verifs.to_pylist())
    released = kept.select(["step_id", "program_id", "strategy", "after_leir"])
    out = release_of(lake, "0.1.0", to_arrow("samples", samples), released, params, {"success": True},
                       [c.to_json() for c in counters], coverage=strategy_coverage(lake, released))
    card = (out / "README.md").read_text()
    section = card[card.index("## Strategies with fewer than 100 samples"):]
    for strategy, n in rules["verified"].per_strategy.items():
        lost = n - rules["unique"].per_strategy.get(strategy, 0)
        line = next(x for x in section.splitlines() if x.startswith(f"| {strategy} |"))
        assert "few sites: 6 steps made in 6 programs" in line
        assert (f"de-duplication removed {lost} " in line) == (lost > 0)
    assert "| cap per strategy (easy strategies down-weighted) | 6 | 6 | did not bind" in card


def test_card_names_the_test_families_limitations_and_pins_the_reports(tmp_path, inputs):
    params, samples, _, counters = inputs
    programs, steps, verifs = tables()
    kept, _ = select_steps(programs, steps, verifs, params)
    released = kept.select(["step_id", "program_id", "strategy", "after_leir"])
    reports = tmp_path / "reports"
    reports.mkdir()
    (reports / "filter.json").write_text(json.dumps([c.to_json() for c in counters]) + "\n")
    (reports / "splits.json").write_text('{"train": 1}\n')
    (reports / "cost_model.json").write_text('{"wall_s": 1.5}\n')  # timings: never pinned
    split = {"fam0": "train", "fam1": "test", "fam2": "train"}

    def release(lake):
        return release_of(lake, "0.1.0", samples, released, params, {"success": True},
                            [c.to_json() for c in counters], programs, splits=split, reports=reports)

    out = release(tmp_path / "lake")
    card = (out / "README.md").read_text()
    for section in ("## Test split", "## Limitations", "## Intended use"):
        assert section in card
    test_rows = [r for r in samples.to_pylist() if r["split"] == "test"]
    overlapping = sum(1 for r in test_rows if r["structural_overlap"])
    assert "Test families (1): `fam1`." in card
    assert f"{overlapping} of {len(test_rows)} test samples" in card
    assert f"The clean part of the test split is the other **{len(test_rows) - overlapping}** samples" in card
    assert "verified on the CPU too" in card or "No released step is of a GPU-only strategy" in card
    assert sorted(p.name for p in (out / "reports").iterdir()) == ["filter.json", "splits.json"]
    assert (out / "reports" / "splits.json").read_bytes() == (reports / "splits.json").read_bytes()
    listed = {d["contentUrl"] for d in json.loads((out / "croissant.json").read_text())["distribution"]}
    assert {"reports/filter.json", "reports/splits.json"} <= listed
    again = release(tmp_path / "again")
    files = sorted(p.relative_to(out) for p in out.rglob("*") if p.is_file())
    assert all((out / f).read_bytes() == (again / f).read_bytes() for f in files)  # byte-identical rebuild
