"""The release folder: files, Croissant metadata that mlcroissant loads, byte-identical rebuilds, versions."""
from __future__ import annotations

import hashlib
import json

import pytest
from test_filtering import tables

from flows.config import load_params
from flows.filtering import assemble_samples, select_steps
from flows.release import ReleaseError, make_release
from flows.storage import to_arrow


@pytest.fixture(scope="module")
def inputs():
    params = load_params(overrides={"filter": {"multi_answer_fraction": 1.0, "test_fraction": 0.34}})
    programs, steps, verifs = tables()
    kept, counters = select_steps(programs, steps, verifs, params)
    samples, _ = assemble_samples(kept, programs, params, count_tokens=len)
    return params, to_arrow("samples", samples), kept.select(["step_id", "strategy", "after_leir"]), counters


def build(lake, inputs, version="0.1.0"):
    params, samples, steps, counters = inputs
    return make_release(lake, version, samples, steps, params, {"success": True, "expectations_checked": 30},
                        [c.to_json() for c in counters])


def test_release_files_and_croissant(tmp_path, inputs):
    import mlcroissant as mlc

    out = build(tmp_path / "lake", inputs)
    names = sorted(p.relative_to(out).as_posix() for p in out.rglob("*") if p.is_file())
    assert names == ["CHANGELOG.md", "README.md", "chat/test.jsonl", "chat/train.jsonl", "croissant.json",
                     "data/steps.parquet", "data/test.parquet", "data/train.parquet"]
    card = (out / "README.md").read_text()
    assert card.startswith("---\nlicense: apache-2.0\n") and "num_examples" in card and "MAJOR" in card
    meta = json.loads((out / "croissant.json").read_text())
    listed = {d["contentUrl"]: d["sha256"] for d in meta["distribution"]}
    assert set(listed) == set(names) - {"croissant.json"}
    for name, digest in listed.items():
        assert hashlib.sha256((out / name).read_bytes()).hexdigest() == digest
    dataset = mlc.Dataset(jsonld=str(out / "croissant.json"))
    records = list(dataset.records("train"))
    n_train = sum(1 for _ in (out / "chat/train.jsonl").open())
    assert len(records) == n_train > 0
    line = json.loads((out / "chat/train.jsonl").read_text().splitlines()[0])
    assert [m["role"] for m in line["messages"]] == ["user", "assistant"]
    assert line["messages"][1]["content"].startswith("<think>")


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
    out = make_release(tmp_path / "lake", "0.1.0", samples, kept.select(["step_id", "program_id", "strategy",
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
    again = make_release(tmp_path / "again", "0.1.0", samples, kept.select(["step_id", "program_id", "strategy",
                                                                            "after_leir"]),
                         params, {"success": True, "expectations_checked": 30}, [c.to_json() for c in counters],
                         to_arrow("programs", rows))
    assert (again / "shapes.png").read_bytes() == (out / "shapes.png").read_bytes()  # deterministic plot
    assert (again / "README.md").read_text() == card
