"""params.yaml checked against its schema before any stage writes (flows.params_schema): each typo
that used to rewrite the lake silently is one line with the file, the position and the key path."""
from __future__ import annotations

import copy

import pytest
import yaml
from typer.testing import CliRunner

from flows.config import PARAMS, ParamsError, load_params
from flows.params_schema import check_params

TEXT = PARAMS.read_text()
BASE = yaml.safe_load(TEXT)


def problems_after(edit) -> list[str]:
    raw = copy.deepcopy(BASE)
    edit(raw)
    return check_params(raw, "params.yaml", yaml.safe_dump(raw, sort_keys=False))


def test_the_projects_own_params_are_valid():
    assert check_params(BASE, PARAMS, TEXT) == []


@pytest.mark.parametrize(("edit", "expected"), [
    (lambda r: r["verify"].update(draws=0), "verify.draws: Input should be greater than or equal to 1"),
    (lambda r: r["verify"]["tolerance"]["float32"].update(max_abs="abc"),
     "verify.tolerance.float32.max_abs: Input should be a valid number"),
    (lambda r: r["filter"].update(cap_per_strategy=-5), "filter.cap_per_strategy: Input should be greater than"),
    (lambda r: r["filter"].update(test_fraction=2.0), "filter.test_fraction: Input should be less than 1"),
    (lambda r: r["filter"]["cap_per_level"].update(grpah=5), "unknown level 'grpah'; did you mean 'graph'?"),
    (lambda r: r["filter"]["easy_strategies"].append("loop_unroling"),
     "unknown strategy 'loop_unroling'; did you mean 'loop_unrolling'?"),
    (lambda r: r["profiles"]["default"].update(instances_per_workload=0),
     "profiles.default.instances_per_workload: Input should be greater than or equal to 1"),
    (lambda r: r["profiles"]["default"].update(instances_per_workload=-1),
     "profiles.default.instances_per_workload: Input should be greater than or equal to 1"),
    (lambda r: r["profiles"]["default"].update(dtypes=["float8"]), "profiles.default.dtypes.0: Input should be"),
    (lambda r: r["profiles"]["default"].update(workloads="add"), "profiles.default.workloads: Input should be a valid list"),
    (lambda r: r["profiles"]["default"]["workloads"].append("matmull"), "unknown workload 'matmull'; did you mean 'matmul'?"),
    (lambda r: r["profiles"]["tiny"].update(families=["gemm", "sofmax"]), "unknown family 'sofmax'; did you mean 'softmax'?"),
    (lambda r: r["profiles"]["default"]["pinned"].append({"workload": "matmul", "params": {"M": 4, "K": 4}}),
     "workload 'matmul' takes the parameters M, K, N; missing N"),
    (lambda r: r["profiles"]["default"]["pinned"].append({"workload": "matmul", "params": {"M": 4, "K": 4, "N": 0}}),
     "Input should be greater than or equal to 1"),
    (lambda r: r.update(serach={}), "serach: unknown key; did you mean 'search'?"),
    (lambda r: r["profiles"]["default"].update(workload=["add"]), "profiles.default.workload: unknown key; did you mean 'workloads'?"),
    (lambda r: r["profiles"]["tiny"]["search"].update(budget=0), "profiles.tiny.search.budget: Input should be greater"),
    (lambda r: r["profiles"]["tiny"]["search"].update(drivrs=["beam"]), "profiles.tiny.search.drivrs: unknown key; did you mean 'drivers'?"),
    (lambda r: r["profiles"]["release"]["measure"].update(max_rounds=2), "max_rounds (2) is below min_rounds (5)"),
    (lambda r: r.update(profile="relase"), "profile: no profile 'relase' among default, tiny, release; did you mean 'release'?"),
    (lambda r: r["release"].update(version="1.0"), "release.version: version must be MAJOR.MINOR.PATCH"),
    (lambda r: r["search"].update(drivers=[]), "search.drivers: List should have at least 1 item"),
])
def test_each_typo_is_one_line_naming_the_key(edit, expected):
    found = problems_after(edit)
    assert len(found) == 1, found
    assert expected in found[0]
    assert found[0].startswith("params.yaml:")


def test_the_line_and_column_are_those_of_the_key_in_the_file():
    text = TEXT.replace("  draws: 3", "  draws: 0")
    assert text != TEXT
    (line,) = check_params(yaml.safe_load(text), "params.yaml", text)
    number = next(i for i, row in enumerate(text.splitlines(), 1) if row.startswith("  draws: 0"))
    assert line.startswith(f"params.yaml:{number}:3: verify.draws:")


def test_a_pinned_shape_too_big_to_build_is_refused_with_its_estimate_before_allocating():
    (line,) = problems_after(lambda r: r["profiles"]["default"]["pinned"].append(
        {"workload": "add", "params": {"M": 1_000_000, "N": 1000}}))
    assert "12,000,000,000 bytes of tensors (estimated, float32) exceed the limit of 1,073,741,824" in line


def test_load_params_raises_with_every_problem(tmp_path):
    path = tmp_path / "params.yaml"
    path.write_text(TEXT.replace("  draws: 3", "  draws: 0").replace("  workers: 2\n", "  workers: 0\n", 1))
    with pytest.raises(ParamsError) as bad:
        load_params(path)
    assert "verify.draws" in str(bad.value) and "verify.workers" in str(bad.value)


def test_a_stage_with_a_bad_params_file_exits_2_before_writing(tmp_path, monkeypatch):
    import cli.run
    from cli.main import app

    path = tmp_path / "params.yaml"
    path.write_text(TEXT.replace("  test_fraction: 0.2", "  test_fraction: 2.0"))
    monkeypatch.setattr(cli.run, "PARAMS", path)
    lake = tmp_path / "lake"
    result = CliRunner().invoke(app, ["stage", "generate", "--profile", "tiny", "--lake", str(lake)])
    assert result.exit_code == 2, result.output
    assert "is not valid (1 problem); nothing was run" in result.output
    assert "filter.test_fraction: Input should be less than 1" in result.output
    assert "Traceback" not in result.output
    assert not lake.exists()
