import torch
import torch.nn as nn


class Model(nn.Module):
    """Reverse cumulative sum along a dimension."""

    def __init__(self, dim):
        super(Model, self).__init__()
        self.dim = dim

    def forward(self, x):
        return torch.cumsum(x.flip(self.dim), self.dim).flip(self.dim)


batch_size = 128
input_shape = (4000,)
dim = 1


def get_inputs():
    return [torch.randn(batch_size, *input_shape)]


def get_init_inputs():
    return [dim]
