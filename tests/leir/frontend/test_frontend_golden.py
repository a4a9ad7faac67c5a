"""Golden tests of the PyTorch translator: every program of tests/data/programs.jsonl is reproduced
byte for byte (text and signature) from its PyTorch module, and agrees with PyTorch numerically."""
from __future__ import annotations

import pytest
import torch

from leir.frontend import translate
from tests.conftest import EXAMPLES
from tests.leir.frontend.frontend_check import have_verifier, interpret_error
from tests.leir.frontend.frontend_golden_modules import GOLDEN


def _translation(name):
    module, make_inputs = GOLDEN[name]
    torch.manual_seed(0)
    return translate(module, make_inputs())


def test_every_golden_example_has_a_module():
    assert sorted(GOLDEN) == sorted(e["name"] for e in EXAMPLES)


def test_golden_text_and_signature(example):
    t = _translation(example["name"])
    assert t.text == example["leir"]
    assert t.signature.to_json() == example["signature"]


def test_golden_numerics_interpreted(example):
    assert interpret_error(_translation(example["name"])) < 1e-12


@pytest.mark.skipif(not have_verifier(), reason="TVM lowering not available")
def test_golden_numerics_verified(example):
    from gpu_tasks.verify import verify_against_reference

    t = _translation(example["name"])
    v = verify_against_reference(t.program, t.signature, t.reference)
    assert v.status in ("exact", "close"), v
