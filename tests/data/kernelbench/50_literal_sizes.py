"""Input sizes written as literals inside get_inputs() (KernelBench level 1, problem 50's form),
and a dropout layer that is random in training mode."""
import torch
import torch.nn as nn


class Model(nn.Module):
    def __init__(self):
        super().__init__()
        self.conv = nn.Conv2d(3, 8, kernel_size=5, stride=2, padding=1)
        self.dropout = nn.Dropout(0.2)

    def forward(self, x):
        return self.dropout(torch.relu(self.conv(x)))


batch_size = 16


def get_inputs():
    return [torch.rand(batch_size, 3, 96, 96)]


def get_init_inputs():
    return []
