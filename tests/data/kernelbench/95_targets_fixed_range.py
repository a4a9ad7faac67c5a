"""Class targets drawn from a written-out range that shrinking the class count does not follow:
they must be redrawn below the shrunk class count."""
import torch
import torch.nn as nn


class Model(nn.Module):
    def forward(self, predictions, targets):
        return torch.nn.functional.cross_entropy(predictions, targets)


batch_size = 2
num_classes = 1024


def get_inputs():
    return [torch.rand(batch_size, num_classes), torch.randint(10, 12, (batch_size,))]


def get_init_inputs():
    return []
