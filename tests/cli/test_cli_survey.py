"""`steptp strategies survey` per dtype: the sampled originals in the chosen dtype, the ones that are
already wrong there left out and listed, bad options refused."""
from __future__ import annotations

import json

import pytest
from typer.testing import CliRunner

from cli.main import app


def survey(*args):
    return CliRunner().invoke(app, ["strategies", "survey", *map(str, args)])


def test_float16_survey_in_json_leaves_out_wrong_originals():
    pytest.importorskip("tvm")
    result = survey("--programs", 6, "--dtype", "float16", "--strategy", "loop_split", "--cap", 1, "--json")
    assert result.exit_code == 0, result.output
    report = json.loads(result.stdout[result.stdout.index("{"):])
    assert report["dtype"] == "float16" and report["shapes"] == "default"
    assert len(report["programs"]) + len(report["left_out"]) == 6
    assert all(row["status"] not in ("exact", "close") and row["program"] not in report["programs"]
               for row in report["left_out"])
    (row,) = report["strategies"]
    assert row["strategy"] == "loop_split" and row["applications"] == row["passed"]


@pytest.mark.parametrize("args,message", [(["--dtype", "int8"], "--dtype must be"),
                                          (["--shapes", "huge"], "--shapes must be")])
def test_bad_options(args, message):
    result = survey("--programs", 1, *args)
    assert result.exit_code != 0 and message in result.output
