import torch
import torch.nn as nn


class Model(nn.Module):
    """Python that branches on a shape (needs concrete tracing): residual only when shapes agree."""

    def __init__(self, in_features, out_features):
        super().__init__()
        self.fc = nn.Linear(in_features, out_features)

    def forward(self, x):
        y = torch.tanh(self.fc(x))
        if y.shape[-1] == x.shape[-1]:
            y = y + x
        for _ in range(x.size(0) % 3):
            y = y * 0.5
        return y


batch_size = 64
in_features = 256
out_features = 256


def get_inputs():
    return [torch.randn(batch_size, in_features)]


def get_init_inputs():
    return [in_features, out_features]
