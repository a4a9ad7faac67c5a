"""One answer per bad input (issue 28, finding 4): every command reads its files through one helper,
so a file that is not UTF-8 (or cannot be read) gives `error: cannot read FILE: ...` and exit 2, never
a traceback; option values are checked where they come in."""
from __future__ import annotations

import json

import pytest
from typer.testing import CliRunner

from cli.main import app
from tests.gpu_tasks.conftest import MATMUL, MATMUL_SIG

BAD_BYTES = b"B^{4}_{tx=0}[C^{f32,g}_{tx}=\xff\xfeA^{f32,g}_{tx};];\n"


@pytest.fixture
def files(tmp_path):
    """Good inputs of every kind, and one file that is not UTF-8."""
    sig = tmp_path / "sig.json"
    sig.write_text(json.dumps(MATMUL_SIG.to_json()))
    prog = tmp_path / "prog.leir"
    prog.write_text(MATMUL + "\n")
    batch = tmp_path / "programs.jsonl"
    batch.write_text(json.dumps({"id": 1, "signature": MATMUL_SIG.to_json(), "leir": MATMUL}) + "\n")
    bad = tmp_path / "latin1.txt"
    bad.write_bytes(BAD_BYTES)
    return {"sig": str(sig), "prog": str(prog), "batch": str(batch), "bad": str(bad), "dir": str(tmp_path)}


# Each command with the bad file in each place it reads a file.
COMMANDS = [
    ["leir", "fmt", "{bad}"],
    ["leir", "check", "--signature", "{sig}", "{bad}"],
    ["leir", "check", "--signature", "{bad}", "{prog}"],
    ["leir", "hash", "{bad}"],
    ["leir", "hash", "--signature", "{bad}", "{prog}"],
    ["apply", "loop_reorder", "{bad}", "--signature", "{sig}"],
    ["apply", "loop_reorder", "{prog}", "--signature", "{bad}"],
    ["apply", "all", "--batch", "{bad}"],
    ["sites", "{bad}", "--signature", "{sig}"],
    ["sites", "{prog}", "--signature", "{bad}"],
    ["lower", "{bad}", "--signature", "{sig}"],
    ["lower", "{prog}", "--signature", "{bad}"],
    ["lower", "--batch", "{bad}"],
    ["verify", "--signature", "{sig}", "{bad}", "{prog}"],
    ["verify", "--signature", "{sig}", "{prog}", "{bad}"],
    ["verify", "--signature", "{bad}", "{prog}", "{prog}"],
    ["verify", "--batch", "{bad}"],
    ["verify", "--signature", "{sig}", "{prog}", "{prog}", "--tolerances", "{bad}"],
    ["time", "--batch", "{bad}"],
    ["tokens", "{bad}", "--signature", "{sig}"],
    ["tokens", "--batch", "{bad}"],
    ["search", "{bad}", "--signature", "{sig}"],
    ["eval", "{bad}"],
    ["eval", "--published", "{bad}"],
]


@pytest.mark.parametrize("args", COMMANDS, ids=[" ".join(a[:2]) + f" #{i}" for i, a in enumerate(COMMANDS)])
def test_a_file_that_is_not_utf8_gives_one_error_line(files, args):
    result = CliRunner().invoke(app, [a.format(**files) for a in args])
    assert result.exit_code == 2, result.output
    assert result.stderr.splitlines() == [f"error: cannot read {files['bad']}: not UTF-8 text "
                                          "(byte 0xff on line 1, offset 28)"], result.stderr
    assert result.exception is None or isinstance(result.exception, SystemExit)


@pytest.mark.parametrize("args", [["leir", "fmt", "{dir}/missing.leir"], ["sites", "{dir}", "--signature", "{sig}"],
                                  ["lower", "{prog}", "--signature", "{dir}/nope.json"]])
def test_a_file_that_cannot_be_read_gives_one_error_line(files, args):
    result = CliRunner().invoke(app, [a.format(**files) for a in args])
    assert result.exit_code == 2 and len(result.stderr.splitlines()) == 1
    assert result.stderr.startswith("error: cannot read ") and "Traceback" not in result.output


def test_standard_input_that_is_not_utf8_gives_one_error_line():
    result = CliRunner().invoke(app, ["leir", "fmt", "-"], input=BAD_BYTES)
    assert result.exit_code == 2 and result.stderr.startswith("error: cannot read <stdin>: not UTF-8 text")


def test_a_problem_file_that_is_not_utf8_is_its_own_record(files):
    result = CliRunner().invoke(app, ["translate", files["bad"], "--timeout", "60"])
    [record] = [json.loads(line) for line in result.stdout.splitlines()]
    assert result.exit_code == 1 and not record["ok"]
    assert record["error"] == f"cannot read {files['bad']}: not UTF-8 text (offset 28)"


@pytest.mark.parametrize("args", [
    ["translate", "{prog}", "--max-elements", "-5"], ["translate", "{prog}", "--draws", "0"],
    ["apply", "loop_reorder", "{prog}", "--signature", "{sig}", "--max", "0"],
    ["apply", "all", "{prog}", "--signature", "{sig}", "--rounding-share", "-1"],
    ["verify", "--batch", "{batch}", "--draws", "0"], ["verify", "--batch", "{batch}", "--timeout", "nan"],
    ["eval", "{batch}", "--draws", "0"], ["eval", "{batch}", "--speedup-margin", "inf"],
    ["tokens", "--batch", "{batch}", "--workers", "0"], ["search", "{prog}", "--signature", "{sig}", "--budget", "0"],
    ["strategies", "survey", "--programs", "0"], ["workloads", "sample", "matmul", "--count", "0"],
    ["run", "--workers", "0"], ["stage", "generate", "--profile", "no-such-profile"],
])
def test_option_values_are_checked_where_they_come_in(files, args):
    result = CliRunner().invoke(app, [a.format(**files) for a in args])
    assert result.exit_code == 2, result.output
    assert result.stdout.strip() == "" and "Traceback" not in result.output


def test_search_refuses_an_original_that_leir_check_refuses(tmp_path):
    """It used to say "best 1.00x, 4 states verified" and exit 0 for a program that writes its input."""
    sig = tmp_path / "sig.json"
    sig.write_text(json.dumps({"tensors": [{"name": "A", "shape": [64], "dtype": "float32", "role": "input"},
                                           {"name": "C", "shape": [64], "dtype": "float32", "role": "output"}]}))
    prog = tmp_path / "writes_input.leir"
    prog.write_text("L^{64}_{a=0}[A^{f32,g}_{a}=A^{f32,g}_{a}*2;C^{f32,g}_{a}=A^{f32,g}_{a};];\n")
    result = CliRunner().invoke(app, ["search", str(prog), "--signature", str(sig), "--budget", "2"])
    assert result.exit_code == 2, result.output
    assert "not a valid program for this signature (write-to-input" in result.output
