"""`steptp translate` judges a translation as the generate stage judges an original (docs/cli.md,
"Originals against PyTorch"): against PyTorch in float64, each bound raised to twice PyTorch's own
error in the program's dtype where that is larger. A float32 program that computes what PyTorch
computes in float32 is not refused for float32's rounding; a wrong one still is."""
from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

STEPTP = Path(sys.executable).parent / "steptp"

# (x + 1e4) - 1e4 in float32 loses about 5e-4 of x: PyTorch's own float32 run is off float64 by more
# than the float32 tolerance (1e-4 per unit of output scale), and so is the program, by as much.
PROBLEM = """import torch
class Model(torch.nn.Module):
    def forward(self, x):
        return (x + 10000.0) - 10000.0{wrong}
def get_inputs():
    return [torch.randn(32, 32)]
def get_init_inputs():
    return []
"""


def _translate(tmp_path: Path, text: str) -> dict:
    path = tmp_path / "cancel.py"
    path.write_text(text)
    done = subprocess.run([str(STEPTP), "translate", str(path)], capture_output=True, text=True, timeout=600)
    return json.loads(done.stdout.splitlines()[0])


def test_float32_rounding_that_pytorch_shares_is_no_fault_of_the_translation(tmp_path):
    record = _translate(tmp_path, PROBLEM.format(wrong=""))
    assert record["ok"], record["error"]
    assert record["verification"]["status"] == "close"
    assert record["verification"]["max_abs_err"] > 1e-4  # above the plain float32 bound


def test_the_same_translation_fails_the_plain_bounds_and_a_wrong_reference_fails_the_raised_ones():
    import torch

    from gpu_tasks.verify import verify_against_reference
    from leir.frontend.translator import translate

    class Model(torch.nn.Module):
        def forward(self, x):
            return (x + 10000.0) - 10000.0

    tr = translate(Model(), [torch.randn(32, 32)])
    assert verify_against_reference(tr.program, tr.signature, tr.reference).status == "mismatch"
    # against x * 1.001, whose float32 run is within float32's rounding of float64: no raised bound
    scaled = lambda inputs: inputs["A"] * 1.001  # noqa: E731
    own = lambda inputs: (torch.as_tensor(inputs["A"]).float() * 1.001).double().numpy()  # noqa: E731
    assert verify_against_reference(tr.program, tr.signature, scaled, own_fn=own).status == "mismatch"
