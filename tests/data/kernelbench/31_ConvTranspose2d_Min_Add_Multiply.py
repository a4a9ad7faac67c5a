import torch
import torch.nn as nn


class Model(nn.Module):
    """Transposed convolution, min with a constant, bias add, scale."""

    def __init__(self, in_channels, out_channels, kernel_size, stride, padding, constant_value, bias_shape,
                 scaling_factor):
        super().__init__()
        self.conv_transpose = nn.ConvTranspose2d(in_channels, out_channels, kernel_size, stride=stride,
                                                 padding=padding)
        self.constant_value = constant_value
        self.bias = nn.Parameter(torch.randn(bias_shape))
        self.scaling_factor = scaling_factor

    def forward(self, x):
        x = self.conv_transpose(x)
        x = torch.min(x, torch.tensor(self.constant_value))
        x = x + self.bias
        x = x * self.scaling_factor
        return x


batch_size = 64
in_channels = 16
out_channels = 32
height, width = 32, 32
kernel_size = 3
stride = 2
padding = 1
constant_value = 0.5
bias_shape = (out_channels, 1, 1)
scaling_factor = 2.0


def get_inputs():
    return [torch.randn(batch_size, in_channels, height, width)]


def get_init_inputs():
    return [in_channels, out_channels, kernel_size, stride, padding, constant_value, bias_shape, scaling_factor]
