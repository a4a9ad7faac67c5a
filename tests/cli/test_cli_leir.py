"""The `steptp leir` contract: fmt, check and hash over files of one program per line."""
from __future__ import annotations

import json

import pytest
from typer.testing import CliRunner

from cli.main import app

GOOD = "B ^{4}_{tx=0} [ C^{f64,g}_{tx} = ( A^{f64,g}_{tx} ) ; ] ;"
GOOD_CANON = "B^{4}_{tx=0}[C^{f64,g}_{tx}=A^{f64,g}_{tx};];"
BAD = "B^{4}_{tx=0}[C^{f64,g}_{tx}=;];"
SIG = {"tensors": [{"name": "A", "shape": [4], "dtype": "float64", "role": "input"},
                   {"name": "C", "shape": [4], "dtype": "float64", "role": "output"}]}


@pytest.fixture
def runner():
    return CliRunner()


@pytest.fixture
def programs(tmp_path):
    path = tmp_path / "progs.leir"
    path.write_text(f"{GOOD}\n{BAD}\n\n{GOOD_CANON}\n")
    return path


def test_fmt_prints_canonical_lines_and_reports_errors_with_position(runner, programs):
    result = runner.invoke(app, ["leir", "fmt", str(programs)])
    assert result.exit_code == 2
    assert result.stdout.splitlines() == [GOOD_CANON, GOOD_CANON]
    assert result.stderr.strip() == (f"{programs}:2:29: error: unexpected ';', expected one of '(', '-', 'abs', "
                                     "'erf', 'exp', 'fast_erf', 'fast_exp', 'fast_log', 'if_then_else', 'inf', 'log', "
                                     "'max', 'min', 'sqrt', a number, a tensor name, an index name, an integer")
    assert "Traceback" not in result.output


def test_fmt_reads_stdin_and_exits_zero_when_all_parse(runner):
    result = runner.invoke(app, ["leir", "fmt", "-"], input=GOOD + "\n")
    assert (result.exit_code, result.stdout) == (0, GOOD_CANON + "\n")


def test_check_prints_one_json_object_per_program(runner, programs, tmp_path):
    sig = tmp_path / "sig.json"
    sig.write_text(json.dumps(SIG))
    bad_sig_use = tmp_path / "more.leir"
    bad_sig_use.write_text(GOOD_CANON.replace("A^{f64,g}", "A^{f32,g}") + "\n" + GOOD_CANON + "\n")
    result = runner.invoke(app, ["leir", "check", "--signature", str(sig), str(bad_sig_use)])
    assert result.exit_code == 1
    first, second = (json.loads(line) for line in result.stdout.splitlines())
    assert first["ok"] is False and first["errors"][0]["code"] == "type-conflict"
    assert second == {"ok": True, "intermediates": {}, "nests": 1}
    result = runner.invoke(app, ["leir", "check", "-s", str(sig), str(programs)])
    lines = [json.loads(line) for line in result.stdout.splitlines()]
    assert [x["ok"] for x in lines] == [True, False, True]
    assert lines[1]["errors"][0] | {"message": ""} == {"code": "syntax", "message": "", "line": 2, "column": 29}


def test_check_reports_intermediates(runner, tmp_path):
    sig = tmp_path / "sig.json"
    sig.write_text(json.dumps(SIG))
    prog = "B^{4}_{tx=0}[E^{f32,l}_{tx}=A^{f64,g}_{tx};C^{f64,g}_{tx}=E^{f32,l}_{tx};];"
    result = runner.invoke(app, ["leir", "check", "-s", str(sig), "-"], input=prog)
    assert json.loads(result.stdout) == {"ok": True, "nests": 1,
                                         "intermediates": {"E": {"shape": [4], "dtype": "float32", "scope": "l"}}}


def test_check_with_a_broken_signature_is_a_clear_error(runner, tmp_path, programs):
    sig = tmp_path / "sig.json"
    sig.write_text('{"tensors": [{"name": "a", "shape": [4], "dtype": "float64", "role": "input"}]}')
    result = runner.invoke(app, ["leir", "check", "-s", str(sig), str(programs)])
    assert result.exit_code == 2
    assert "is not a LEIR tensor name" in result.stderr and "Traceback" not in result.output


def test_hash_is_alpha_equivalence_aware(runner):
    a = "B^{4}_{tx=0}[E^{f64,g}_{tx}=A^{f64,g}_{tx};C^{f64,g}_{tx}=E^{f64,g}_{tx};];"
    b = "B^{4}_{tx=0}[Q^{f64,g}_{tx}=A^{f64,g}_{tx};C^{f64,g}_{tx}=Q^{f64,g}_{tx};];"
    c = "B^{4}_{tx=0}[Q^{f64,g}_{tx}=A^{f64,g}_{tx};C^{f64,g}_{tx}=Q^{f64,g}_{tx}*2;];"
    result = runner.invoke(app, ["leir", "hash", "-"], input="\n".join([a, b, c]))
    h = result.stdout.split()
    assert result.exit_code == 0 and len(h) == 3 and h[0] == h[1] != h[2] and len(h[0]) == 64


def test_missing_file_is_a_clear_error(runner, tmp_path):
    result = runner.invoke(app, ["leir", "fmt", str(tmp_path / "nope.leir")])
    assert result.exit_code == 2 and "cannot read" in result.stderr
