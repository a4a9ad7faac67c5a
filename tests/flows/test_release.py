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
    from flows.release import next_version

    assert next_version(released, configured, policy) == expected


def test_next_version_rejects_an_unknown_policy():
    from flows.release import next_version

    with pytest.raises(ReleaseError, match="version_policy must be one of patch, minor, major"):
        next_version(["0.1.0"], "0.1.0", "nightly")
