import torch
import torch.nn as nn


class Model(nn.Module):
    """Single square matrix multiplication (C = A * B), at KernelBench level 1 problem 1's own size (4096)."""

    def __init__(self):
        super().__init__()

    def forward(self, A: torch.Tensor, B: torch.Tensor) -> torch.Tensor:
        return torch.matmul(A, B)


N = 2048 * 2


def get_inputs():
    A = torch.randn(N, N)
    B = torch.randn(N, N)
    return [A, B]


def get_init_inputs():
    return []
