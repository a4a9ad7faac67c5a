"""`steptp lower`: TVMScript or CUDA source of one program; errors on stderr with exit 2, never a
traceback."""
from __future__ import annotations

import json

import pytest
from typer.testing import CliRunner

from cli.main import app
from leir.lower import cuda_source, lower_to_script

PROGRAM = "B^{4}_{tx=0}L^{6}_{c=0}[C^{f64,g}_{tx}=C^{f64,g}_{tx}+A^{f64,g}_{tx,c};];"
SIG = {"tensors": [{"name": "A", "shape": [4, 6], "dtype": "float64", "role": "input"},
                   {"name": "C", "shape": [4], "dtype": "float64", "role": "output"}]}


@pytest.fixture
def files(tmp_path):
    sig, prog = tmp_path / "sig.json", tmp_path / "p.leir"
    sig.write_text(json.dumps(SIG))
    prog.write_text(PROGRAM + "\n")
    return sig, prog


def run(*args, input=None):
    result = CliRunner().invoke(app, ["lower", *map(str, args)], input=input)
    assert "Traceback" not in result.output
    return result


def test_prints_the_tvmscript(files):
    sig, prog = files
    result = run("--signature", sig, prog)
    assert result.exit_code == 0
    assert result.stdout == lower_to_script(PROGRAM, SIG) + "\n"
    assert "def main(A: T.Buffer((4, 6), \"float64\"), C: T.Buffer((4,), \"float64\")):" in result.stdout


def test_reads_stdin_and_emits_cuda(files):
    sig, _ = files
    result = run("-s", sig, "--emit", "cuda", "-", input=" " + PROGRAM.replace(";", ";\n"))
    assert result.exit_code == 0
    assert result.stdout == cuda_source(PROGRAM, SIG)
    assert "__global__" in result.stdout


def test_cuda_target_prints_its_tir(files):
    sig, prog = files
    result = run("-s", sig, "--target", "cuda", prog)
    assert result.exit_code == 0 and 'thread="threadIdx.x"' in result.stdout


def test_syntax_error_has_file_line_and_column(files, tmp_path):
    sig, _ = files
    bad = tmp_path / "bad.leir"
    bad.write_text("B^{4}_{tx=0}L^{6}_{c=0}\n[C^{f64,g}_{tx}=;];\n")
    result = run("-s", sig, bad)
    assert result.exit_code == 2 and result.stdout == ""
    assert result.stderr.startswith(f"{bad}:2:17: error: unexpected ';'")


def test_lowering_error_is_one_line_on_stderr(files):
    sig, _ = files
    result = run("-s", sig, "-", input="L^{4}_{a=0}[C^{f64,g}_{a}=A^{f64,g}_{a};];")
    assert result.exit_code == 2
    assert result.stderr == ("error: nest 1, statement 1 `C^{f64,g}_{a}=A^{f64,g}_{a}`: A has 2 dimensions "
                             "but is accessed with 1 subscripts\n")


@pytest.mark.parametrize("args, message", [
    (["--target", "llvm", "--emit", "cuda"], "error: --emit cuda needs --target cuda"),
    (["--signature", "missing.json"], "error: cannot read missing.json: No such file or directory"),
])
def test_bad_options(files, args, message):
    _, prog = files
    if "--signature" not in args:
        args = ["-s", str(files[0]), *args]
    result = run(*args, prog)
    assert result.exit_code == 2 and result.stderr.startswith(message)


def test_unreadable_program_file(files, tmp_path):
    result = run("-s", files[0], tmp_path / "nope.leir")
    assert result.exit_code == 2 and "cannot read" in result.stderr


def test_tensorir_form_prints_block_form_that_tvm_parses_schedules_and_builds(files):
    import numpy as np
    import tvm

    sig, prog = files
    result = run("--signature", sig, "--form", "tensorir", prog)
    assert result.exit_code == 0, result.output
    assert result.stdout == lower_to_script(PROGRAM, SIG, form="tensorir") + "\n"
    assert "@T.prim_func(s_tir=True)" in result.stdout and 'T.axis.remap("SR", [tx, c])' in result.stdout
    func = tvm.script.from_source(result.stdout)
    tvm.s_tir.Schedule(func).get_sblock("C")
    a = np.random.default_rng(0).standard_normal((4, 6))
    outs = []
    for text in (result.stdout, run("--signature", sig, prog).stdout):
        ex = tvm.compile(tvm.IRModule({"main": tvm.script.from_source(text)}), target="llvm")
        c = tvm.runtime.tensor(np.zeros(4))
        ex["main"](tvm.runtime.tensor(a), c)
        outs.append(c.numpy())
    np.testing.assert_array_equal(outs[0], outs[1])
    np.testing.assert_allclose(outs[0], a.sum(axis=1))
    assert run("--signature", sig, "--form", "blocks", prog).exit_code == 2
