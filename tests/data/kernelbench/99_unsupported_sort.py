import torch
import torch.nn as nn


class Model(nn.Module):
    """Uses an operator the translator does not support (torch.sort)."""

    def __init__(self):
        super().__init__()

    def forward(self, x):
        return torch.sort(x, dim=1).values * 2


batch_size = 16
dim = 128


def get_inputs():
    return [torch.randn(batch_size, dim)]


def get_init_inputs():
    return []
