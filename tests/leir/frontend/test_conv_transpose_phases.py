"""A transposed convolution of stride s > 1 is translated by phases (leir/frontend/ops/conv.py): the
multiply-accumulate does PyTorch's work, not s^n times it over a zero-stuffed input, and it is a
contraction the search's micro-kernel tiles."""
from __future__ import annotations

import math

import pytest
import torch
import torch.nn as nn

from leir.analysis import is_update, statement_sites
from leir.frontend import translate
from leir.frontend.sizes import same_structure
from leir.printer import format_program
from tests.leir.frontend.frontend_check import interpret_error

CASES = [
    # (module, input shape): strides 2 and 3, kernels shorter than, equal to and longer than the
    # stride, paddings whose phases are linear in the phase and those that are not, output padding,
    # groups, no bias, a stride of 1 in one dimension beside one of 2
    (lambda: nn.ConvTranspose1d(3, 4, 3, stride=2, padding=1, output_padding=1), (2, 3, 5)),
    (lambda: nn.ConvTranspose1d(3, 4, 3, stride=2), (2, 3, 5)),
    (lambda: nn.ConvTranspose1d(3, 4, 4, stride=2, padding=1), (1, 3, 6)),
    (lambda: nn.ConvTranspose1d(3, 4, 3, stride=3, padding=1), (1, 3, 6)),
    (lambda: nn.ConvTranspose1d(3, 4, 7, stride=3, padding=2, output_padding=2), (1, 3, 6)),
    (lambda: nn.ConvTranspose1d(3, 4, 2, stride=3), (1, 3, 6)),
    (lambda: nn.ConvTranspose2d(4, 6, 3, stride=2, padding=1, output_padding=1, groups=2), (1, 4, 4, 3)),
    (lambda: nn.ConvTranspose2d(4, 6, (3, 5), stride=(2, 1), padding=(1, 2)), (1, 4, 4, 5)),
    (lambda: nn.ConvTranspose2d(4, 8, (3, 5), stride=(2, 3), padding=(1, 2), groups=4, bias=False), (1, 4, 4, 5)),
    (lambda: nn.ConvTranspose3d(2, 3, 3, stride=2, padding=1), (1, 2, 3, 4, 3)),
    (lambda: nn.ConvTranspose3d(2, 3, 5, stride=2, padding=2), (1, 2, 3, 2, 3)),
]


@pytest.mark.parametrize("case", range(len(CASES)))
def test_a_strided_transposed_convolution_by_phases_equals_pytorch(case):
    make, shape = CASES[case]
    torch.manual_seed(case)
    t = translate(make().double(), [torch.randn(*shape, dtype=torch.float64)])
    assert interpret_error(t) < 1e-10, format_program(t.program)


def _accumulation(program):
    """The multiply-accumulate: the update under the most loops."""
    return max((s for s in statement_sites(program) if is_update(s.stmt)), key=lambda s: len(s.loops))


@pytest.mark.parametrize("kernel, expected", [(4, 1.0), (3, (4 / 3) ** 3)])
def test_its_multiply_accumulate_does_pytorchs_work(kernel, expected):
    """PyTorch multiplies each input element by each tap once: N*Cin*Cout*I^3*k^3 multiply-adds. The
    phases do as many where the stride divides the kernel, and (s*ceil(k/s)/k)^n as many where it
    does not (zero taps past the kernel); the zero-stuffed input did s^n = 8 times as many."""
    layer = nn.ConvTranspose3d(4, 8, kernel, stride=2, padding=1)
    n, cin, size = 2, 4, 5
    t = translate(layer, [torch.randn(n, cin, size, size, size)])
    site = _accumulation(t.program)
    work = math.prod(lp.extent for lp in site.loops)
    pytorch = n * cin * 8 * size ** 3 * kernel ** 3
    assert work == pytest.approx(expected * pytorch, rel=0.25), format_program(t.program)
    # and its unit stride is the output channel, which the input does not depend on
    assert site.stmt.lhs.indices[-1].name == site.loops[len(site.loops) - 5].var


def test_the_phases_have_the_same_structure_at_every_size():
    """The shrunk instance the translator verifies must equal the own-size program modulo sizes."""
    layer = nn.ConvTranspose2d(4, 6, 3, stride=2, padding=1, output_padding=1)
    small = translate(layer, [torch.randn(1, 4, 4, 5)])
    large = translate(layer, [torch.randn(2, 4, 9, 12)])
    assert same_structure(small.program, large.program)
    assert format_program(small.program) != format_program(large.program)
