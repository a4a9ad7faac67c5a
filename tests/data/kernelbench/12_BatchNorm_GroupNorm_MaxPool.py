import torch
import torch.nn as nn


class Model(nn.Module):
    """Conv, BatchNorm (training statistics), GroupNorm, max pooling, then a mean over space."""

    def __init__(self, in_channels, out_channels, kernel_size, num_groups):
        super().__init__()
        self.conv = nn.Conv2d(in_channels, out_channels, kernel_size, padding=kernel_size // 2)
        self.bn = nn.BatchNorm2d(out_channels)
        self.gn = nn.GroupNorm(num_groups, out_channels)
        self.pool = nn.MaxPool2d(kernel_size=2)

    def forward(self, x):
        x = self.pool(self.gn(self.bn(self.conv(x))))
        return x.mean(dim=[2, 3])


batch_size = 32
in_channels = 8
out_channels = 32
height = width = 64
kernel_size = 3
num_groups = 8


def get_inputs():
    return [torch.randn(batch_size, in_channels, height, width)]


def get_init_inputs():
    return [in_channels, out_channels, kernel_size, num_groups]
