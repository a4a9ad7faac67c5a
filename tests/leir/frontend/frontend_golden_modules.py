"""The PyTorch modules behind tests/data/programs.jsonl, with their input shapes (float64)."""
from __future__ import annotations

import torch
import torch.nn as nn
import torch.nn.functional as F


class Fn(nn.Module):
    """A module computing `fn(*inputs)`."""

    def __init__(self, fn):
        super().__init__()
        self.fn = fn

    def forward(self, *xs):
        return self.fn(*xs)


class Matmul(nn.Module):
    def forward(self, a, c):
        return a @ c


class Relu(nn.Module):
    def forward(self, a):
        return torch.relu(a)


class Softmax(nn.Module):
    def forward(self, a):
        return torch.softmax(a, dim=1)


class Gelu(nn.Module):
    def forward(self, a):
        return F.gelu(a)


class ArgmaxDim1(nn.Module):
    def forward(self, a):
        return torch.argmax(a, dim=1)


class CumsumDim1(nn.Module):
    def forward(self, a):
        return torch.cumsum(a, dim=1)


class SumKeepdim(nn.Module):
    def forward(self, a):
        return a.sum(dim=1, keepdim=True)


class MaxPool(nn.Module):
    def forward(self, a):
        return F.max_pool2d(a, 2, 2)


class CrossEntropy(nn.Module):
    def forward(self, a, c):
        return F.cross_entropy(a, c)


def _f64(*shape):
    return torch.randn(*shape, dtype=torch.float64)


GOLDEN = {
    "matmul": (Matmul(), lambda: [_f64(4, 6), _f64(6, 5)]),
    "relu": (Relu(), lambda: [_f64(4, 8)]),
    "softmax": (Softmax(), lambda: [_f64(4, 8)]),
    "linear_with_bias": (nn.Linear(6, 5), lambda: [_f64(4, 6)]),
    "layer_norm_last_dim": (nn.LayerNorm(4), lambda: [_f64(2, 3, 4)]),
    "conv2d_pad1_bias": (nn.Conv2d(2, 3, 3, padding=1), lambda: [_f64(1, 2, 4, 4)]),
    "max_pool2d_k2_s2": (MaxPool(), lambda: [_f64(1, 2, 4, 4)]),
    "argmax_first": (ArgmaxDim1(), lambda: [_f64(3, 5)]),
    "cumsum": (CumsumDim1(), lambda: [_f64(2, 5)]),
    "gelu_erf": (Gelu(), lambda: [_f64(4, 8)]),
    "sum_dim1_keepdim": (SumKeepdim(), lambda: [_f64(2, 3, 4)]),
    "cross_entropy_mean": (CrossEntropy(), lambda: [_f64(4, 5), torch.randint(0, 5, (4,))]),
}
