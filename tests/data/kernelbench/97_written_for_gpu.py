"""A problem file written for a GPU (inputs made on 'cuda'): built on the CPU instead."""
import torch
import torch.nn as nn


class Model(nn.Module):
    def forward(self, q, k, v):
        return torch.nn.functional.scaled_dot_product_attention(q, k, v)


batch_size = 4
heads = 8
length = 64
dim = 32


def get_inputs():
    q = torch.rand(batch_size, heads, length, dim, device="cuda")
    k = torch.rand(batch_size, heads, length, dim, device="cuda")
    v = torch.rand(batch_size, heads, length, dim).cuda()
    return [q, k, v]


def get_init_inputs():
    return []
