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
    assert set(good) == {"file", "ok", "leir", "signature", "verification", "error", "notes", "sizes",
                         "same_structure", "verified_at"}
    assert good["verified_at"] == "shrunk"
    assert good["verification"]["status"] == "exact" and good["leir"].startswith("B^{4}_{tx=0}L^{16384}_{a=0}")
    assert good["sizes"]["emitted"]["A"] == [4, 16384] and good["sizes"]["verified"]["A"] == [4, 64]
    assert good["sizes"]["constants_changed"] == {"dim": [16384, 64]} and good["same_structure"]
    assert "torch.sort" in bad["error"] and bad["leir"] is None and bad["exception"]["type"] == "UnsupportedOperator"


# --- issue 15: KernelBench at full coverage ---------------------------------------------------------

def _verified(problem, dtype="float64"):
    t = translate(problem.model, problem.inputs, dtype=dtype)
    if have_verifier():
        from gpu_tasks.verify import verify_against_reference

        v = verify_against_reference(t.program, t.signature, t.reference)
        assert v.status in ("exact", "close"), v
    else:
        assert interpret_error(t) < 1e-9
    return t


def test_a_scalar_argument_of_forward_becomes_a_constant_of_the_program():
    t = _verified(load_problem(PROBLEMS / "5_scalar_argument.py", max_elements=256))
    assert "*3.14;" in t.text and [s.name for s in t.signature.inputs] == ["A"]


def test_class_targets_are_redrawn_inside_the_shrunk_class_count():
    problem = load_problem(PROBLEMS / "95_targets_fixed_range.py", max_elements=16)
    predictions, targets = problem.inputs
    assert predictions.shape == (2, 8) and int(targets.max()) < 8
    assert any("redrawn in [0, 6)" in note for note in problem.notes)
    _verified(problem)
    again = load_problem(PROBLEMS / "95_targets_fixed_range.py", max_elements=16)
    assert torch.equal(again.inputs[1], targets)  # seeded by the file: the same draw every time


def test_a_file_written_for_a_gpu_builds_on_the_cpu():
    problem = load_problem(PROBLEMS / "97_written_for_gpu.py", max_elements=512)
    assert all(x.device.type == "cpu" for x in problem.inputs)
    _verified(problem)


def test_sizes_that_must_stay_equal_are_halved_together():
    problem = load_problem(PROBLEMS / "100_coupled_sizes.py", max_elements=4096)
    assert problem.shrunk == {"batch_size": 64, "input_shape": (64,)}
    _verified(problem)


def test_literal_sizes_in_get_inputs_shrink_and_dropout_is_the_identity():
    problem = load_problem(PROBLEMS / "50_literal_sizes.py", max_elements=1024)
    assert tuple(problem.inputs[0].shape) == (8, 3, 6, 6)  # largest first, equal ones together
    assert set(problem.shrunk) == {"batch_size", "get_inputs_literal_21_38", "get_inputs_literal_21_42"}
    assert problem.notes == ["dropout evaluated as the identity (eval mode): dropout"]
    _verified(problem)


def test_max_elements_shrinks_what_it_can_and_names_what_it_could_not():
    problem = load_problem(PROBLEMS / "63_conv_standard_2D.py",
                           {"batch_size": 1, "in_channels": 3, "height": 8, "width": 8}, max_elements=10,
                           strict=False)
    [note] = problem.notes
    assert "cannot shrink the inputs to at most 10 elements" in note and "kernel_size=3" in note
    with pytest.raises(ProblemError, match="could not shrink: .*kernel_size=3"):
        load_problem(PROBLEMS / "63_conv_standard_2D.py",
                     {"batch_size": 1, "in_channels": 3, "height": 8, "width": 8}, max_elements=10)


def test_meta_translation_gives_the_program_at_the_files_own_sizes():
    from leir.frontend.kernelbench import load_problem_meta
    from leir.frontend.sizes import same_structure

    full = load_problem_meta(PROBLEMS / "1_Conv2D_ReLU_BiasAdd.py")
    assert all(x.is_meta for x in full.inputs)
    big = translate(full.model, full.inputs)
    small = _verified(load_problem(PROBLEMS / "1_Conv2D_ReLU_BiasAdd.py", max_elements=1024), dtype=None)
    assert big.signature.inputs[0].shape == tuple(full.inputs[0].shape) and big.example_inputs == {}
    assert big.text != small.text and same_structure(big.program, small.program)


def test_structure_differs_when_shrinking_changes_more_than_sizes():
    from leir.frontend.sizes import same_structure
    from leir.parse import parse_program

    a = parse_program("B^{8}_{tx=0}L^{4}_{a=0}[C^{f32,g}_{tx,a}=A^{f32,g}_{tx,a}+E^{f32,g}_{a};];")
    b = parse_program("B^{2}_{tx=0}L^{2}_{a=0}[C^{f32,g}_{tx,a}=A^{f32,g}_{tx,a}+E^{f32,g}_{a};];")
    broadcast = parse_program("B^{2}_{tx=0}L^{2}_{a=0}[C^{f32,g}_{tx,a}=A^{f32,g}_{tx,a}+E^{f32,g}_{0};];")
    assert same_structure(a, b) and not same_structure(a, broadcast)


def test_tensor_constants_made_in_forward_and_diag_translate():
    class Clip(torch.nn.Module):
        def forward(self, x, v):
            return torch.min(x, torch.tensor(0.25, device=x.device)) + torch.diag(v) @ x

    t = translate(Clip(), [torch.randn(6, 6), torch.randn(6)], dtype="float64")
    assert interpret_error(t) < 1e-9


@pytest.mark.skipif(not have_verifier(), reason="TVM lowering not available")
def test_translate_record_falls_back_to_the_verified_instance_when_meta_tracing_fails():
    from cli.translate import translate_one

    record = translate_one(PROBLEMS / "9_value_dependent_branch.py", [], 256, "float64")
    assert record["ok"] and record["same_structure"]
    assert record["sizes"]["emitted"] == record["sizes"]["verified"] == {"A": [16, 16], "C": [16, 16]}
    assert "could not be traced on the meta device" in record["notes"][-1]
    original = translate_one(PROBLEMS / "19_ReLU.py", ["batch_size=4"], 256, "float64")
    shrunk = translate_one(PROBLEMS / "19_ReLU.py", ["batch_size=4"], 256, "float64", at_size="shrunk")
    assert original["leir"].startswith("B^{4}_{tx=0}L^{16384}") and shrunk["leir"].startswith("B^{4}_{tx=0}L^{64}")
    assert "sizes" not in shrunk


# --- issue 28: own-size translation works by default ---------------------------------------------------

@pytest.mark.skipif(not have_verifier(), reason="TVM lowering not available")
def test_a_program_too_large_to_verify_at_its_own_sizes_is_verified_shrunk_by_default():
    """KernelBench level 1 problem 1 (`N = 2048 * 2`: 4096^3 multiply-adds, past the verifier's limit):
    with the default options the record has the program at 4096 and was verified on a shrunk instance."""
    from cli.translate import AUTO_MAX_ELEMENTS, translate_one

    record = translate_one(PROBLEMS / "1_Square_matrix_multiplication_4096.py", [], None, None)
    assert record["ok"] and record["verification"]["status"] in ("exact", "close"), record
    assert record["leir"].startswith("B^{4096}_{tx=0}L^{4096}_{a=0}L^{4096}_{c=0}")
    assert record["sizes"]["emitted"]["A"] == [4096, 4096]
    verified = record["sizes"]["verified"]["A"]
    assert verified[0] * verified[1] <= AUTO_MAX_ELEMENTS and verified[0] < 4096
    assert record["sizes"]["constants_changed"]["N"][0] == 4096 and record["same_structure"]
    assert "too large to verify (68,719,476,736 statement executions" in record["notes"][0]
    # the same with the size given by --set (shrinking on its own accord may shrink it for the instance)
    pinned = translate_one(PROBLEMS / "1_Square_matrix_multiplication.py", ["N=4096"], None, None)
    assert pinned["ok"] and pinned["sizes"]["emitted"]["A"] == [4096, 4096]
    assert pinned["sizes"]["constants_changed"]["N"][0] == 4096


@pytest.mark.skipif(not have_verifier(), reason="TVM lowering not available")
def test_a_program_small_enough_is_still_verified_at_its_own_sizes():
    from cli.translate import translate_one

    record = translate_one(PROBLEMS / "19_ReLU.py", ["batch_size=2", "dim=64"], None, "float64")
    assert record["ok"] and "sizes" not in record and record["notes"] == []
    assert record["signature"]["tensors"][0]["shape"] == [2, 64]


def test_attentions_scale_is_a_size_constant_the_comparison_of_sizes_allows():
    """scaled_dot_product_attention scales by 1/sqrt(E), a float computed from a size: KernelBench's
    97_ScaledDotProductAttention (E 1024 at its own sizes, 8 shrunk) was refused as "differs in more
    than sizes". The translation names the literals it computed from sizes, and only those may differ."""
    from leir.frontend.sizes import same_structure

    class Attention(torch.nn.Module):
        def forward(self, q, k, v):
            return torch.nn.functional.scaled_dot_product_attention(q, k, v)

    big = translate(Attention(), [torch.empty(2, 64, 1024, device="meta")] * 3)
    small = translate(Attention(), [torch.randn(2, 4, 8)] * 3)
    assert big.size_constants == (1 / 32,) and small.size_constants == (1 / 8 ** 0.5,)
    assert not same_structure(big.program, small.program)
    assert same_structure(big.program, small.program, big.size_constants + small.size_constants)

    class Scaled(torch.nn.Module):  # a scale the model gives is its own literal, not a size's
        def forward(self, q, k, v):
            return torch.nn.functional.scaled_dot_product_attention(q, k, v, scale=0.5)

    given = translate(Scaled(), [torch.randn(2, 4, 8)] * 3)
    assert given.size_constants == ()
    assert not same_structure(given.program, small.program, small.size_constants)


@pytest.mark.skipif(not have_verifier(), reason="TVM lowering not available")
def test_the_own_sizes_are_verified_only_when_the_verification_fits_in_the_memory_limit():
    """A verification holds about VERIFY_MEMORY_FACTOR times the program's buffers: KernelBench's
    40_LayerNorm (802 MiB of buffers, within the guard's 1 GiB) was verified at its own sizes and
    killed at the default 4 GiB. Beyond --memory / factor the file is verified on a shrunk instance."""
    from cli.translate import VERIFY_MEMORY_FACTOR, translate_one

    sizes = ["batch_size=16", "dim=65536"]  # two float32 tensors of 4 MiB
    roomy = translate_one(PROBLEMS / "19_ReLU.py", sizes, None, "float32")
    assert roomy["ok"] and roomy["verified_at"] == "own_size"
    tight = translate_one(PROBLEMS / "19_ReLU.py", sizes, None, "float32", memory_mb=64)
    assert tight["ok"] and tight["verified_at"] == "shrunk", tight
    assert any(f"64 MiB of --memory / {VERIFY_MEMORY_FACTOR}" in n for n in tight["notes"]), tight["notes"]
    assert tight["signature"]["tensors"][0]["shape"] == [16, 65536]  # the program is the file's own


# --- issue 43: tensors built in forward are said to be inputs, with their values -----------------------

@pytest.mark.skipif(not have_verifier(), reason="TVM lowering not available")
def test_a_tensor_built_in_forward_is_an_input_the_record_names_with_its_values(tmp_path):
    """`torch.ones(n)` in forward is computed by the program (a constant 1); `torch.tensor([...])` cannot
    be written in LEIR and becomes an input after the forward inputs (the published order: inputs,
    constants, parameters). It was silent: the record now says so and gives the values to call it with."""
    from cli.translate import translate_one

    problem = tmp_path / "built_in_forward.py"
    problem.write_text("import torch\n\nclass Model(torch.nn.Module):\n    def forward(self, x):\n"
                       "        return x * torch.ones(x.shape[0]) + torch.tensor([1.0, 2.0, 3.0, 4.0])\n\n"
                       "def get_inputs():\n    return [torch.randn(4)]\n\ndef get_init_inputs():\n    return []\n")
    record = translate_one(problem, [], None, "float32")
    assert record["ok"], record
    inputs = [t["name"] for t in record["signature"]["tensors"] if t["role"] == "input"]
    assert len(inputs) == 2  # x, then the constant; torch.ones is no input
    assert "=1;" in record["leir"].replace(" ", "")
    assert record["constants"] == {inputs[1]: [1.0, 2.0, 3.0, 4.0]}
    assert any(n.startswith(f"input {inputs[1]} is the [4] tensor the module builds in forward") for n in record["notes"])
    plain = translate_one(PROBLEMS / "19_ReLU.py", ["batch_size=2", "dim=64"], None, "float64")
    assert "constants" not in plain


# --- a shrunk instance makes the own-size program's size-dependent choices ------------------------------

@pytest.mark.skipif(not have_verifier(), reason="TVM lowering not available")
def test_a_shrunk_instance_sums_in_two_stages_where_the_own_size_program_does():
    """At its own sizes the mean has 32768 terms per element and is summed in two stages; the instance
    verified in its place (every input at most 4096 elements) had a one-stage sum, so the two programs
    differed in more than sizes and the record was refused (16 of KernelBench's level 2: group, batch
    and instance norms, global pools). The instance now follows the own-size program's choices."""
    from cli.translate import translate_one
    from leir.parse import parse_program

    record = translate_one(PROBLEMS / "24_long_mean_own_size.py", [], None, "float32")
    assert record["ok"] and record["same_structure"], record
    assert record["verified_at"] == "shrunk"
    assert record["sizes"]["emitted"]["A"] == [65536, 128, 256]
    assert any("run in two stages" in n for n in record["notes"])
    assert len(parse_program(record["leir"]).nests) == 4  # relu, partial sums, their sum, the mean
    small = translate_one(PROBLEMS / "19_ReLU.py", ["batch_size=2", "dim=64"], None, "float64")
    assert small["verified_at"] == "own_size"


def test_the_translation_records_and_repeats_its_size_dependent_choices():
    class Mean(torch.nn.Module):
        def forward(self, x):
            return x.sum(dim=(1, 2))

    big = translate(Mean(), [torch.empty(2, 128, 256, device="meta")])
    small = translate(Mean(), [torch.randn(2, 4, 8)])
    assert big.cascades == (True,) and small.cascades == (False,)
    followed = translate(Mean(), [torch.randn(2, 4, 8)], cascades=big.cascades)
    from leir.frontend.sizes import same_structure
    assert followed.cascades == (True,) and same_structure(followed.program, big.program)
    assert not same_structure(small.program, big.program)
    assert interpret_error(followed) < 1e-6
