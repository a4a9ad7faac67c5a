"""The translator beyond the golden cases: errors, tracing fallbacks, naming, dtypes, tuple results."""
from __future__ import annotations

import pytest
import torch
import torch.nn as nn
import torch.nn.functional as F

from leir.frontend import UnsupportedOperator, supported_operators, translate
from leir.validate import validate
from tests.leir.frontend.frontend_check import interpret_error


class Fn(nn.Module):
    def __init__(self, fn):
        super().__init__()
        self.fn = fn

    def forward(self, x):
        return self.fn(x)


def _x(*shape):
    return torch.randn(*shape, dtype=torch.float64)


def test_unsupported_operator_names_operator_location_and_supported_list():
    class Sorts(nn.Module):
        def forward(self, x):
            y = torch.relu(x)
            return torch.sort(y, dim=1).values

    with pytest.raises(UnsupportedOperator) as info:
        translate(Sorts(), [_x(3, 4)])
    message = str(info.value)
    assert "'torch.sort'" in message
    assert "test_frontend_ops.py" in message and "torch.sort(y, dim=1)" in message
    assert "supported operators:" in message and "relu" in message and "conv2d" in message
    assert info.value.operator == "torch.sort"


def test_supported_operators_cover_the_issue_list():
    ops = set(supported_operators())
    for name in ("matmul", "bmm", "einsum", "linear", "conv1d", "conv2d", "conv3d", "conv_transpose2d",
                 "max_pool2d", "avg_pool3d", "adaptive_avg_pool2d", "batch_norm", "layer_norm", "group_norm",
                 "instance_norm", "rms_norm", "gelu", "silu", "mish", "softplus", "selu", "hardswish", "softmax",
                 "log_softmax", "logsumexp", "argmax", "argmin", "norm", "cumsum", "cumprod", "clamp", "where",
                 "masked_fill", "pow", "cat", "split", "chunk", "mse_loss", "cross_entropy", "nll_loss",
                 "kl_div", "cosine_similarity", "triplet_margin_loss", "scaled_dot_product_attention"):
        assert name in ops, name


def test_shape_dependent_python_falls_back_to_concrete_tracing():
    class Branchy(nn.Module):
        def forward(self, x):
            if x.shape[0] > 2:
                x = x * 2
            for _ in range(x.size(1) % 3):
                x = x + 1
            return torch.tanh(x)

    t = translate(Branchy(), [_x(3, 4)])
    assert interpret_error(t) < 1e-12


def test_naming_order_inputs_intermediates_output_then_parameters():
    t = translate(nn.Sequential(nn.Linear(4, 3), nn.ReLU()), [_x(2, 4)])
    names = [s.name for s in t.signature.tensors]
    # input A, the linear's result C (traced intermediate), output D, parameters E (weight) F (bias)
    assert names == ["A", "E", "F", "D"]
    assert t.text.startswith("B^{2}_{tx=0}L^{3}_{a=0}L^{4}_{c=0}[C^{f64,g}_{tx,a}=C^{f64,g}_{tx,a}+A^{f64,g}_{tx,c}"
                             "*E^{f64,g}_{a,c};];")
    assert interpret_error(t) < 1e-12


@pytest.mark.parametrize("dtype,code", [("float32", "f32"), ("float16", "f16"), ("bfloat16", "bf16"),
                                        ("float64", "f64")])
def test_dtype_codes_follow_the_requested_dtype(dtype, code):
    t = translate(Fn(torch.sigmoid), [_x(2, 3)], dtype=dtype)
    if code in ("f16", "bf16"):  # PyTorch's sigmoid computes in float32 for half inputs: so does the program
        assert t.text == (f"B^{{2}}_{{tx=0}}L^{{3}}_{{a=0}}[D^{{f32,l}}_{{tx,a}}=1/(1+exp(-A^{{{code},g}}_{{tx,a}}));];"
                          f"B^{{2}}_{{tx=0}}L^{{3}}_{{a=0}}[C^{{{code},g}}_{{tx,a}}=D^{{f32,l}}_{{tx,a}};];")
    else:
        assert t.text == f"B^{{2}}_{{tx=0}}L^{{3}}_{{a=0}}[C^{{{code},g}}_{{tx,a}}=1/(1+exp(-A^{{{code},g}}_{{tx,a}}));];"
    assert [s.dtype for s in t.signature.tensors] == [dtype, dtype]


def test_tuple_result_is_stacked_on_a_leading_index():
    t = translate(Fn(lambda x: x.chunk(2, dim=1)), [_x(3, 4)])
    out = t.signature.outputs[0]
    assert out.shape == (2, 3, 2)
    assert "C^{f64,g}_{0,tx,a}" in t.text and "C^{f64,g}_{1,tx,a}" in t.text
    assert interpret_error(t) < 1e-12


def test_inplace_operators_update_later_uses():
    class InPlace(nn.Module):
        def forward(self, x):
            y = x * 2
            y.add_(1)
            torch.relu_(y)
            return y - x

    assert interpret_error(translate(InPlace(), [_x(3, 4)])) < 1e-12


def test_argmax_is_the_first_maximal_index():
    x = torch.tensor([[1.0, 3.0, 3.0, 0.0]], dtype=torch.float64)
    t = translate(Fn(lambda a: torch.argmax(a, dim=1)), [x])
    from tests.leir._interp import run_program

    assert run_program(t.program, t.signature, {"A": x.numpy()}).tolist() == [1]


@pytest.mark.parametrize("fn,shape", [
    (lambda x: F.conv2d(x, torch.ones(2, 3, 2, 2, dtype=torch.float64), stride=2, padding=1), (1, 3, 5, 5)),
    (lambda x: F.avg_pool2d(x, 3, 2, padding=1, ceil_mode=True, count_include_pad=False), (1, 2, 6, 7)),
    (lambda x: F.adaptive_avg_pool2d(x, (3, 2)), (2, 2, 7, 5)),
    (lambda x: F.max_pool1d(x, 3, 2, padding=1, ceil_mode=True), (1, 2, 8)),
    (lambda x: x.view(2, 3, 4).permute(2, 0, 1).reshape(4, 6), (6, 4)),
    (lambda x: torch.cat([x, x * 2], dim=0)[1:, ::2], (3, 4)),
    (lambda x: F.pad(x, (1, 1, 2, 0), value=-1.0), (2, 3)),
    (lambda x: torch.einsum("ij,kj->ik", x, x), (3, 4)),
    (lambda x: x.var(dim=0, keepdim=True) + x.std(), (5, 3)),
    (lambda x: torch.where(x > 0, x, torch.zeros_like(x)).cumprod(dim=1), (2, 4)),
    (lambda x: F.group_norm(x, 2), (2, 4, 3)),
    (lambda x: F.scaled_dot_product_attention(x, x, x, is_causal=True), (1, 2, 4, 3)),
])
def test_operator_numerics(fn, shape):
    t = translate(Fn(fn), [_x(*shape)])
    assert interpret_error(t) < 1e-10
    assert [p for p in validate(t.program, t.signature) if p.code != "uninitialised-read"] == []


def test_conv_transpose_with_groups_and_dilation():
    layer = nn.ConvTranspose2d(4, 6, 3, stride=2, padding=2, output_padding=1, groups=2, dilation=2).double()
    t = translate(layer, [_x(1, 4, 4, 3)])
    assert interpret_error(t) < 1e-10


def test_random_dropout_is_refused():
    with pytest.raises(UnsupportedOperator, match="random dropout"):
        translate(nn.Dropout(0.5), [_x(2, 3)])
