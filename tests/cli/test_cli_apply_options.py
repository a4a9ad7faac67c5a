"""`steptp apply` offers what the pipeline offers: `--no-extensions` keeps results in the published LEIR
format (no fast_exp), `--rounding-share` refuses reassociating steps where the program's own rounding
leaves no room for them (issue 18)."""
from __future__ import annotations

import json

from typer.testing import CliRunner

from cli.main import app

SIG = {"tensors": [{"name": "A", "shape": [4, 16], "dtype": "float32", "role": "input"},
                   {"name": "C", "shape": [4, 16], "dtype": "float32", "role": "output"}]}
SOFTMAX = ("B^{4}_{tx=0}L^{16}_{a=0}[D^{f32,g}_{tx}=max(D^{f32,g}_{tx},A^{f32,g}_{tx,a});];"
           "B^{4}_{tx=0}L^{16}_{a=0}[E^{f32,g}_{tx}=E^{f32,g}_{tx}+exp(A^{f32,g}_{tx,a}-D^{f32,g}_{tx});];"
           "B^{4}_{tx=0}L^{16}_{a=0}[C^{f32,g}_{tx,a}=exp(A^{f32,g}_{tx,a}-D^{f32,g}_{tx})/E^{f32,g}_{tx};];")


def _apply(tmp_path, *options) -> list[dict]:
    (tmp_path / "p.leir").write_text(SOFTMAX)
    (tmp_path / "sig.json").write_text(json.dumps(SIG))
    result = CliRunner().invoke(app, ["apply", "loop_vectorization", str(tmp_path / "p.leir"), "-s",
                                      str(tmp_path / "sig.json"), "--no-cot", *options])
    assert result.exit_code == 0, result.output
    return [json.loads(line) for line in result.stdout.splitlines()]


def test_no_extensions_keeps_the_published_format(tmp_path):
    every = _apply(tmp_path)
    published = _apply(tmp_path, "--no-extensions")
    assert any("fast_exp" in r["after"] for r in every)
    assert published and not any("fast_exp" in r["after"] for r in published)


def test_rounding_share_refuses_reassociating_variants(tmp_path):
    healthy = _apply(tmp_path, "--rounding-share", "0.01")
    touchy = _apply(tmp_path, "--rounding-share", "0.9")
    reordering = [r for r in healthy if r["params"].get("partials") or r["params"].get("exp")]
    assert reordering
    assert [r for r in healthy if r not in reordering] == touchy


def test_recorded_params_of_the_wrong_type_are_refused_with_the_field(tmp_path):
    (tmp_path / "p.leir").write_text(SOFTMAX)
    (tmp_path / "sig.json").write_text(json.dumps(SIG))
    base = ["apply", "loop_vectorization", str(tmp_path / "p.leir"), "-s", str(tmp_path / "sig.json"), "--no-cot",
            "--site", json.dumps({"nest": 0, "loops": ["a"], "loop_index": 1})]
    wrong = CliRunner().invoke(app, [*base, "--params", json.dumps({"width": "8"})])
    assert wrong.exit_code == 2
    assert "--params: loop_vectorization bad parameters (width: Input should be a valid integer" in wrong.output
    unknown = CliRunner().invoke(app, [*base, "--params", json.dumps({"lanes": 8})])
    assert unknown.exit_code == 2 and "lanes: Unexpected keyword argument" in unknown.output
    right = CliRunner().invoke(app, [*base, "--params", "{}"])
    assert right.exit_code in (0, 1) and "bad parameters" not in right.output
