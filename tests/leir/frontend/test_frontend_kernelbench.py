"""The KernelBench-style importer (--set, --max-elements) and `steptp translate` on the problem files
of tests/data/kernelbench/."""
from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from leir.frontend import UnsupportedOperator, translate
from leir.frontend.kernelbench import ProblemError, load_problem, parse_assignment, read_constants
from tests.leir.frontend.frontend_check import have_verifier, interpret_error

PROBLEMS = Path(__file__).parents[2] / "data" / "kernelbench"
# Every problem file but the one that uses an unsupported operator translates and verifies.
TRANSLATABLE = sorted(p.name for p in PROBLEMS.glob("*.py") if p.name != "99_unsupported_sort.py")


def test_constants_are_read_in_order_including_tuples_and_derived_values():
    consts = read_constants(PROBLEMS / "1_Conv2D_ReLU_BiasAdd.py")
    assert consts["batch_size"] == 128 and consts["height"] == 32 and consts["width"] == 32
    assert consts["bias_shape"] == (16, 1, 1)


def test_set_overrides_a_constant_and_derived_ones_follow():
    problem = load_problem(PROBLEMS / "1_Conv2D_ReLU_BiasAdd.py",
                           {"batch_size": 2, "out_channels": 4, "height": 6, "width": 5})
    assert tuple(problem.inputs[0].shape) == (2, 3, 6, 5)
    assert tuple(problem.model.bias.shape) == (4, 1, 1)  # bias_shape = (out_channels, 1, 1)


def test_set_rejects_unknown_names():
    with pytest.raises(ProblemError, match="no module-level constant"):
        load_problem(PROBLEMS / "19_ReLU.py", {"nonexistent": 3})


def test_parse_assignment():
    assert parse_assignment("N=64") == ("N", 64)
    assert parse_assignment("eps=1e-3") == ("eps", 0.001)
    with pytest.raises(ProblemError):
        parse_assignment("N")


def test_max_elements_shrinks_every_input_and_keeps_the_model_valid():
    problem = load_problem(PROBLEMS / "43_MinGPTCausalAttention.py", max_elements=4096)
    assert all(x.numel() <= 4096 for x in problem.inputs)
    n_embd, n_head = problem.constants["n_embd"], problem.constants["n_head"]
    assert n_embd % n_head == 0 and problem.shrunk
    with torch.no_grad():
        problem.model(*problem.inputs)


def test_max_elements_keeps_set_values():
    problem = load_problem(PROBLEMS / "63_conv_standard_2D.py", {"in_channels": 2}, max_elements=2048)
    assert problem.constants["in_channels"] == 2 and problem.inputs[0].shape[1] == 2
    assert problem.inputs[0].numel() <= 2048


def test_max_elements_reports_when_it_cannot():
    with pytest.raises(ProblemError, match="cannot shrink"):
        load_problem(PROBLEMS / "63_conv_standard_2D.py",
                     {"batch_size": 1, "in_channels": 3, "height": 8, "width": 8}, max_elements=10)


@pytest.mark.parametrize("name", TRANSLATABLE)
def test_problem_translates_and_matches_pytorch(name):
    problem = load_problem(PROBLEMS / name, max_elements=1024)
    t = translate(problem.model, problem.inputs, dtype="float64")
    if have_verifier():
        from gpu_tasks.verify import verify_against_reference

        v = verify_against_reference(t.program, t.signature, t.reference)
        assert v.status in ("exact", "close"), v
    else:
        assert interpret_error(t) < 1e-9


def test_unsupported_problem_names_the_operator_and_line():
    problem = load_problem(PROBLEMS / "99_unsupported_sort.py", max_elements=1024)
    with pytest.raises(UnsupportedOperator, match=r"torch\.sort.*99_unsupported_sort\.py:12"):
        translate(problem.model, problem.inputs)


@pytest.mark.skipif(not have_verifier(), reason="TVM lowering not available")
def test_cli_translate_prints_one_json_line_per_file_and_fails_on_any_failure():
    from typer.testing import CliRunner

    from cli.main import app

    files = [str(PROBLEMS / "19_ReLU.py"), str(PROBLEMS / "99_unsupported_sort.py")]
    result = CliRunner().invoke(app, ["translate", *files, "--set", "batch_size=4", "--max-elements", "256",
                                      "--dtype", "float64"])
    lines = [json.loads(line) for line in result.stdout.splitlines() if line.startswith("{")]
    assert result.exit_code == 1
    assert [r["ok"] for r in lines] == [True, False]
    good, bad = lines
    assert set(good) == {"file", "ok", "leir", "signature", "verification", "error"}
    assert good["verification"]["status"] == "exact" and good["leir"].startswith("B^{4}_{tx=0}")
    assert "torch.sort" in bad["error"] and bad["leir"] is None
