"""TVM's MetaSchedule reference of the search report: tuned end to end and checked against PyTorch.
Slow (~2 min on 2 cores: tuning starts builder processes and imports TVM's schedule rules)."""
from __future__ import annotations

import math

import pytest
import torch

from gpu_tasks.metaschedule import _check_outputs, metaschedule_times


class MatmulRelu(torch.nn.Module):
    def forward(self, a, b):
        return torch.relu(a @ b)


@pytest.mark.slow
def test_metaschedule_tunes_and_times_a_fused_matmul_relu():
    torch.manual_seed(0)
    inputs = [torch.randn(32, 48), torch.randn(48, 16)]
    got = metaschedule_times(MatmulRelu(), inputs, trials=4)
    assert got["kernels"] == 1  # matmul and relu fuse into one tuned kernel
    assert all(math.isfinite(got[k]) and 0 < got[k] < 1e6 for k in ("metaschedule_us", "metaschedule_vm_us"))


def test_a_reference_that_computes_something_else_is_refused():
    import tvm

    inputs = [torch.randn(4, 3), torch.randn(3, 2)]
    right = torch.relu(inputs[0] @ inputs[1]).numpy()
    _check_outputs([tvm.runtime.tensor(right)], MatmulRelu(), inputs)
    with pytest.raises(ValueError, match="differs from PyTorch"):
        _check_outputs([tvm.runtime.tensor(right + 1)], MatmulRelu(), inputs)
    with pytest.raises(ValueError, match="outputs"):
        _check_outputs([tvm.runtime.tensor(right)] * 2, MatmulRelu(), inputs)
