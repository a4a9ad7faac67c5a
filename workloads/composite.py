"""Composite workloads: GEMM/conv followed by activations, norms, reductions and pooling, op pairs,
and KernelBench-level-2-style chains. Attention, MLP and transformer blocks live in
`workloads.attention`. Tables keep the generation honest: each entry is a distinct module."""
from __future__ import annotations

import torch
import torch.nn as nn
import torch.nn.functional as F

from workloads.attention import attention_workloads
from workloads.single import _cls
from workloads.spec import Input, Param, Workload, op_module

B = Param("B", 1, 4, role="batch")
M = Param("M", 2, 8, role="tokens")
K = Param("K", 2, 16, role="features")
N = Param("N", 2, 16, role="features")
C = Param("C", 1, 4, role="channels")
C2 = Param("C2", 2, 4, role="channels")
H = Param("H", 5, 8, role="spatial")
W = Param("W", 5, 8, role="spatial", same_as="H")
G = Param("G", choices=(1, 2))

ACTS = {
    "relu": torch.relu, "gelu": F.gelu, "silu": F.silu, "tanh": torch.tanh, "sigmoid": torch.sigmoid,
    "leaky_relu": lambda x: F.leaky_relu(x, 0.2), "mish": F.mish, "hardswish": F.hardswish, "elu": F.elu,
    "softplus": F.softplus, "relu6": F.relu6, "hardtanh": lambda x: F.hardtanh(x, -0.5, 0.5),
}


def _gemm_in(p):
    return (p["M"], p["K"])


def _img(p):
    return (p["B"], p["C"], p["H"], p["W"])


def _chain(name, family, params, inputs, layers, forward, constraint=lambda p: True, description=""):
    """A composite module: `layers(p)` builds its sub-modules, `forward(self, *xs)` chains them."""
    return Workload(name, family, "composite", params, tuple(inputs),
                    lambda p, name=name: op_module(_cls(name), forward, lambda: layers(p)),
                    constraint=constraint, description=description)


def _gemm_act(act_name, act):
    return _chain(f"linear_{act_name}", "gemm_activation", (M, K, N), [Input(_gemm_in)],
                  lambda p: {"fc": nn.Linear(p["K"], p["N"])}, lambda self, x: act(self.fc(x)),
                  description=f"Linear followed by {act_name}")


def _conv_act(act_name, act):
    return _chain(f"conv2d_{act_name}", "conv_activation", (B, C, C2, H, W), [Input(_img)],
                  lambda p: {"conv": nn.Conv2d(p["C"], p["C2"], 3)}, lambda self, x: act(self.conv(x)),
                  description=f"Conv2d 3x3 followed by {act_name}")


NORMS_1D = {
    "layer_norm": lambda p: nn.LayerNorm(p["N"]), "rms_norm": lambda p: nn.RMSNorm(p["N"]),
    "batch_norm": lambda p: nn.BatchNorm1d(p["N"]), "group_norm": lambda p: nn.GroupNorm(2, p["N"]),
}
NORMS_2D = {
    "batch_norm": lambda p: nn.BatchNorm2d(p["C2"]), "group_norm": lambda p: nn.GroupNorm(2, p["C2"]),
    "instance_norm": lambda p: nn.InstanceNorm2d(p["C2"], affine=True),
}
GEMM_REDUCTIONS = {
    "sum": lambda y: y.sum(dim=1), "mean": lambda y: y.mean(dim=1, keepdim=True), "max": lambda y: y.max(dim=1)[0],
    "logsumexp": lambda y: torch.logsumexp(y, dim=1), "softmax": lambda y: torch.softmax(y, dim=1),
    "log_softmax": lambda y: F.log_softmax(y, dim=-1),
}
CONV_REDUCTIONS = {
    "global_avg": lambda y: y.mean(dim=(2, 3)), "channel_max": lambda y: torch.amax(y, dim=1),
    "channel_softmax": lambda y: torch.softmax(y, dim=1), "spatial_sum": lambda y: y.sum(dim=[2, 3], keepdim=True),
    "channel_argmax": lambda y: torch.argmax(y, dim=1),
}
POOLS = {"maxpool": lambda: nn.MaxPool2d(2), "avgpool": lambda: nn.AvgPool2d(2)}
POOL_ACTS = {"relu": torch.relu, "tanh": torch.tanh, "gelu": F.gelu}
ACT_PAIRS = [("relu", "sigmoid"), ("tanh", "relu"), ("gelu", "tanh"), ("silu", "mish"), ("softplus", "tanh"),
             ("hardswish", "relu"), ("elu", "sigmoid"), ("leaky_relu", "gelu"), ("sigmoid", "relu6"),
             ("mish", "hardtanh")]


def _gemm_norm(name, make):
    return _chain(f"linear_{name}", "gemm_norm", (M, K, N), [Input(_gemm_in)],
                  lambda p: {"fc": nn.Linear(p["K"], p["N"]), "norm": make(p)}, lambda self, x: self.norm(self.fc(x)),
                  constraint=lambda p: p["N"] % 2 == 0 and p["M"] > 1)


def _conv_norm(name, make):
    return _chain(f"conv2d_{name}_relu", "conv_norm", (B, C, C2, H, W), [Input(_img)],
                  lambda p: {"conv": nn.Conv2d(p["C"], p["C2"], 3, padding=1), "norm": make(p)},
                  lambda self, x: torch.relu(self.norm(self.conv(x))), constraint=lambda p: p["C2"] % 2 == 0)


def _gemm_reduce(name, fn):
    return _chain(f"linear_{name}", "gemm_reduction", (M, K, N), [Input(_gemm_in)],
                  lambda p: {"fc": nn.Linear(p["K"], p["N"])}, lambda self, x: fn(self.fc(x)))


def _conv_reduce(name, fn):
    return _chain(f"conv2d_{name}", "conv_reduction", (B, C, C2, H, W), [Input(_img)],
                  lambda p: {"conv": nn.Conv2d(p["C"], p["C2"], 3)}, lambda self, x: fn(self.conv(x)))


def _conv_pool_act(pool_name, make_pool, act_name, act):
    return _chain(f"conv2d_{pool_name}_{act_name}", "conv_pool", (B, C, C2, H, W), [Input(_img)],
                  lambda p: {"conv": nn.Conv2d(p["C"], p["C2"], 3, padding=1), "pool": make_pool()},
                  lambda self, x: act(self.pool(self.conv(x))))


def _act_pair(first, second):
    a, b = ACTS[first], ACTS[second]
    return _chain(f"{first}_then_{second}", "activation_pair", (M, N), [Input(lambda p: (p["M"], p["N"]))],
                  lambda p: {}, lambda self, x: b(a(x)))


def _conv_transpose_act(name, act):
    return _chain(f"conv_transpose2d_bias_{name}", "conv_transpose_chain", (B, C, C2, H, W), [Input(_img)],
                  lambda p: {"deconv": nn.ConvTranspose2d(p["C"], p["C2"], 3, stride=2, padding=1),
                             "bias": nn.Parameter(torch.randn(p["C2"], 1, 1))},
                  lambda self, x: act(self.deconv(x) + self.bias))


def _kernelbench_style() -> list[Workload]:
    img, gemm = [Input(_img)], [Input(_gemm_in)]
    conv = lambda p: {"conv": nn.Conv2d(p["C"], p["C2"], 3)}  # noqa: E731
    fc = lambda p: {"fc": nn.Linear(p["K"], p["N"])}  # noqa: E731
    return [
        _chain("gemm_scale_residual", "gemm_chain", (M, K, N), gemm, fc,
               lambda self, x: (lambda y: y * 0.5 + y)(self.fc(x))),
        _chain("gemm_sigmoid_sum_logsumexp", "gemm_chain", (M, K, N), gemm, fc,
               lambda self, x: torch.logsumexp(torch.sigmoid(self.fc(x)).sum(dim=1, keepdim=True), dim=0)),
        _chain("matmul_divide_sum_scale", "gemm_chain", (M, K, N), gemm,
               lambda p: {"weight": nn.Parameter(torch.randn(p["N"], p["K"]))},
               lambda self, x: (torch.matmul(x, self.weight.T) / 2).sum(dim=1, keepdim=True) * 1.5),
        _chain("gemm_max_subtract_gelu", "gemm_chain", (M, K, N), gemm, fc,
               lambda self, x: (lambda y: F.gelu(y - torch.max(y, dim=1, keepdim=True).values))(self.fc(x))),
        _chain("gemm_groupnorm_swish_multiply", "gemm_chain", (M, K, N), gemm,
               lambda p: {"fc": nn.Linear(p["K"], p["N"]), "gn": nn.GroupNorm(2, p["N"]),
                          "w": nn.Parameter(torch.randn(p["N"]))},
               lambda self, x: (lambda y: y * torch.sigmoid(y) * self.w)(self.gn(self.fc(x))),
               constraint=lambda p: p["N"] % 2 == 0),
        _chain("gemm_batchnorm_scale_softmax", "gemm_chain", (M, K, N), gemm,
               lambda p: {"fc": nn.Linear(p["K"], p["N"]), "bn": nn.BatchNorm1d(p["N"]),
                          "scale": nn.Parameter(torch.ones(1))},
               lambda self, x: torch.softmax(self.scale * self.bn(self.fc(x)), dim=1),
               constraint=lambda p: p["M"] > 1),
        _chain("conv2d_bias_add_relu", "conv_chain", (B, C, C2, H, W), img,
               lambda p: {**conv(p), "bias": nn.Parameter(torch.randn(p["C2"], 1, 1))},
               lambda self, x: torch.relu(self.conv(x) + self.bias)),
        _chain("conv2d_hardswish_relu", "conv_chain", (B, C, C2, H, W), img, conv,
               lambda self, x: torch.relu(F.hardswish(self.conv(x)))),
        _chain("conv2d_min_tanh_tanh", "conv_chain", (B, C, C2, H, W), img, conv,
               lambda self, x: torch.tanh(torch.tanh(torch.min(self.conv(x), dim=1, keepdim=True)[0]))),
        _chain("conv2d_subtract_tanh_subtract_avgpool", "conv_chain", (B, C, C2, H, W), img,
               lambda p: {**conv(p), "pool": nn.AvgPool2d(2)},
               lambda self, x: self.pool(torch.tanh(self.conv(x) - 0.5) - 0.2)),
        _chain("conv2d_scale_clamp_mean", "conv_chain", (B, C, C2, H, W), img, conv,
               lambda self, x: torch.clamp(self.conv(x) * 2.0, min=-1.0, max=1.0).mean(dim=[1, 2, 3])),
        _chain("conv2d_groupnorm_scale_maxpool_clamp", "conv_chain", (B, C, C2, H, W), img,
               lambda p: {"conv": nn.Conv2d(p["C"], p["C2"], 3), "gn": nn.GroupNorm(2, p["C2"]),
                          "pool": nn.MaxPool2d(2)},
               lambda self, x: torch.clamp(self.pool(self.gn(self.conv(x)) * 1.5), 0.0, 1.0),
               constraint=lambda p: p["C2"] % 2 == 0),
        _chain("residual_add_layernorm", "norm_chain", (M, N), [Input(lambda p: (p["M"], p["N"]))] * 2,
               lambda p: {"ln": nn.LayerNorm(p["N"])}, lambda self, x, y: self.ln(x + y)),
        _chain("layernorm_linear", "norm_chain", (M, K, N), gemm,
               lambda p: {"ln": nn.LayerNorm(p["K"]), "fc": nn.Linear(p["K"], p["N"])},
               lambda self, x: self.fc(self.ln(x))),
        _chain("softmax_matmul", "gemm_chain", (M, K, N), [Input(_gemm_in), Input(lambda p: (p["K"], p["N"]))],
               lambda p: {}, lambda self, s, v: torch.softmax(s, dim=-1) @ v),
        _chain("l2_distance", "reduction_chain", (M, N), [Input(lambda p: (p["M"], p["N"]))] * 2,
               lambda p: {}, lambda self, a, b: torch.sqrt(((a - b) ** 2).sum(dim=-1))),
        _chain("conv_transpose2d_maxpool_hardtanh_mean_tanh", "conv_transpose_chain", (B, C, C2, H, W), img,
               lambda p: {"deconv": nn.ConvTranspose2d(p["C"], p["C2"], 2, stride=2), "pool": nn.MaxPool2d(2)},
               lambda self, x: torch.tanh(F.hardtanh(self.pool(self.deconv(x)), -1, 1).mean(dim=(2, 3), keepdim=True))),
        _chain("conv3d_relu_global_avg", "conv_chain", (B, C, C2), [Input(lambda p: (p["B"], p["C"], 4, 4, 4))],
               lambda p: {"conv": nn.Conv3d(p["C"], p["C2"], 3)},
               lambda self, x: torch.flatten(F.adaptive_avg_pool3d(torch.relu(self.conv(x)), 1), 1)),
        _chain("conv1d_gelu_maxpool", "conv_chain", (B, C, C2, H), [Input(lambda p: (p["B"], p["C"], 2 * p["H"]))],
               lambda p: {"conv": nn.Conv1d(p["C"], p["C2"], 3, padding=1), "pool": nn.MaxPool1d(2)},
               lambda self, x: self.pool(F.gelu(self.conv(x)))),
        _chain("bmm_softmax_bmm", "gemm_chain", (B, M, K), [Input(lambda p: (p["B"], p["M"], p["K"]))] * 2,
               lambda p: {}, lambda self, a, b: torch.bmm(torch.softmax(torch.bmm(a, b.transpose(1, 2)), dim=-1), b)),
        _chain("resnet_basic_block", "conv_chain", (B, C, H, W), img,
               lambda p: {"c1": nn.Conv2d(p["C"], p["C"], 3, padding=1, bias=False), "b1": nn.BatchNorm2d(p["C"]),
                          "c2": nn.Conv2d(p["C"], p["C"], 3, padding=1, bias=False), "b2": nn.BatchNorm2d(p["C"])},
               lambda self, x: torch.relu(self.b2(self.c2(torch.relu(self.b1(self.c1(x))))) + x)),
    ]


def composite_workloads() -> list[Workload]:
    found = [_gemm_act(n, a) for n, a in ACTS.items()]
    found += [_conv_act(n, a) for n, a in ACTS.items()]
    found += [_gemm_norm(n, m) for n, m in NORMS_1D.items()]
    found += [_conv_norm(n, m) for n, m in NORMS_2D.items()]
    found += [_gemm_reduce(n, f) for n, f in GEMM_REDUCTIONS.items()]
    found += [_conv_reduce(n, f) for n, f in CONV_REDUCTIONS.items()]
    found += [_conv_pool_act(pn, pm, an, a) for pn, pm in POOLS.items() for an, a in POOL_ACTS.items()]
    found += [_act_pair(a, b) for a, b in ACT_PAIRS]
    found += [_conv_transpose_act(n, ACTS[n]) for n in ("relu", "sigmoid", "tanh", "gelu")]
    found += _kernelbench_style()
    found += attention_workloads()
    return found
