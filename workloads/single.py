"""Single-operator workloads, generated from compact tables (one distinct module each)."""
from __future__ import annotations

import torch
import torch.nn as nn
import torch.nn.functional as F

from workloads.spec import Input, Param, Workload, op_module

# Shape parameters shared by the tables: the tiny range (tests), then the role in the shape model.
B = Param("B", 1, 4, role="batch")
M = Param("M", 2, 8, role="tokens")
N = Param("N", 2, 16, role="features")
K = Param("K", 2, 16, role="features")
C = Param("C", 1, 4, role="channels")
C2 = Param("C2", 1, 4, role="channels")
H = Param("H", 4, 8, role="spatial")
W = Param("W", 4, 8, role="spatial", same_as="H")
L = Param("L", 4, 12, role="sequence")
D = Param("D", 2, 6, role="volume")        # the side of a 3-D volume
HD = Param("D", 2, 6, role="head_dim")     # an attention head's dimension


def _x2(p):
    return (p["M"], p["N"])


def _unary_workload(name, family, fn, kind="float"):
    return Workload(f"{name}", family, "single", (M, N), (Input(_x2, kind),),
                    lambda p, fn=fn, name=name: op_module(_cls(name), lambda self, x: fn(x)),
                    description=f"{name} of an (M, N) tensor")


def _cls(name: str) -> str:
    return "".join(part.capitalize() for part in name.split("_"))


ACTIVATIONS = {
    "relu": torch.relu, "relu6": F.relu6, "leaky_relu": lambda x: F.leaky_relu(x, 0.1),
    "gelu": F.gelu, "gelu_tanh": lambda x: F.gelu(x, approximate="tanh"), "silu": F.silu, "mish": F.mish,
    "tanh": torch.tanh, "sigmoid": torch.sigmoid, "softplus": F.softplus, "softsign": F.softsign,
    "elu": F.elu, "selu": F.selu, "celu": lambda x: F.celu(x, 0.5), "hardtanh": F.hardtanh,
    "hardswish": F.hardswish, "hardsigmoid": F.hardsigmoid, "logsigmoid": F.logsigmoid,
    "tanhshrink": F.tanhshrink, "hardshrink": F.hardshrink, "softshrink": F.softshrink,
    "threshold": lambda x: F.threshold(x, 0.1, 20.0), "swish_manual": lambda x: x * torch.sigmoid(x),
}
MATH = {
    "exp": (torch.exp, "float"), "log": (torch.log, "positive"), "sqrt": (torch.sqrt, "positive"),
    "rsqrt": (torch.rsqrt, "positive"), "reciprocal": (torch.reciprocal, "positive"), "abs": (torch.abs, "float"),
    "neg": (torch.neg, "float"), "square": (torch.square, "float"), "erf": (torch.erf, "float"),
    "sign": (torch.sign, "float"), "log1p": (torch.log1p, "positive"), "expm1": (torch.expm1, "float"),
    "pow_scalar": (lambda x: x ** 3, "float"), "clamp": (lambda x: torch.clamp(x, -0.5, 0.5), "float"),
    "scale_shift": (lambda x: x * 2.5 - 1.0, "float"),
}


def _binary(name, fn, shape_b, kind_b="float", family="elementwise_binary"):
    return Workload(name, family, "single", (M, N), (Input(_x2), Input(shape_b, kind_b)),
                    lambda p, fn=fn, name=name: op_module(_cls(name), lambda self, x, y: fn(x, y)),
                    description=f"{name} with broadcasting")


BINARY = [
    _binary("add", torch.add, _x2),
    _binary("add_row_broadcast", torch.add, lambda p: (p["N"],)),
    _binary("add_col_broadcast", torch.add, lambda p: (p["M"], 1)),
    _binary("sub", torch.sub, _x2),
    _binary("mul", torch.mul, _x2),
    _binary("mul_outer_broadcast", torch.mul, lambda p: (p["M"], 1)),
    _binary("div", torch.div, _x2, "positive"),
    _binary("maximum", torch.maximum, _x2),
    _binary("minimum", torch.minimum, _x2),
    _binary("pow_tensor", lambda x, y: torch.pow(x.abs() + 1, y), _x2),
    _binary("where_gt", lambda x, y: torch.where(x > y, x, y), _x2),
    _binary("masked_fill", lambda x, m: x.masked_fill(m, 0.0), _x2, "bool"),
    _binary("lerp_half", lambda x, y: torch.lerp(x, y, 0.5), _x2),
    _binary("add_alpha", lambda x, y: torch.add(x, y, alpha=0.5), _x2),
]


def _reduction(name, fn, family="reduction", shape=lambda p: (p["B"], p["M"], p["N"]), kind="float"):
    return Workload(name, family, "single", (B, M, N), (Input(shape, kind),),
                    lambda p, fn=fn, name=name: op_module(_cls(name), lambda self, x: fn(x)),
                    description=f"{name} of a (B, M, N) tensor")


REDUCTIONS = [
    _reduction("sum_dim", lambda x: x.sum(dim=1)),
    _reduction("sum_keepdim", lambda x: x.sum(dim=-1, keepdim=True)),
    _reduction("sum_all", lambda x: x.sum()),
    _reduction("mean_dim", lambda x: x.mean(dim=2)),
    _reduction("mean_two_dims", lambda x: x.mean(dim=(1, 2))),
    _reduction("max_dim_values", lambda x: torch.max(x, dim=1)[0]),
    _reduction("max_dim_indices", lambda x: torch.max(x, dim=2).indices),
    _reduction("min_dim_values", lambda x: torch.min(x, dim=1).values),
    _reduction("amax", lambda x: torch.amax(x, dim=-1)),
    _reduction("amin_keepdim", lambda x: torch.amin(x, dim=1, keepdim=True)),
    _reduction("prod_dim", lambda x: torch.prod(x, dim=2)),
    _reduction("argmax_dim", lambda x: torch.argmax(x, dim=2)),
    _reduction("argmin_dim", lambda x: torch.argmin(x, dim=1)),
    _reduction("argmax_flat", lambda x: torch.argmax(x)),
    _reduction("norm_dim", lambda x: torch.norm(x, dim=-1)),
    _reduction("norm_l1", lambda x: torch.linalg.vector_norm(x, ord=1, dim=1)),
    _reduction("frobenius_norm", lambda x: torch.norm(x)),
    _reduction("var_dim", lambda x: torch.var(x, dim=-1)),
    _reduction("std_unbiased_false", lambda x: torch.std(x, dim=1, unbiased=False)),
    _reduction("logsumexp", lambda x: torch.logsumexp(x, dim=-1)),
    _reduction("softmax_last", lambda x: torch.softmax(x, dim=-1), "softmax"),
    _reduction("softmax_mid", lambda x: F.softmax(x, dim=1), "softmax"),
    _reduction("log_softmax", lambda x: F.log_softmax(x, dim=-1), "softmax"),
    _reduction("softmin", lambda x: F.softmin(x, dim=-1), "softmax"),
    _reduction("cumsum", lambda x: torch.cumsum(x, dim=2), "scan"),
    _reduction("cumprod", lambda x: torch.cumprod(x, dim=1), "scan"),
    _reduction("cumsum_reverse", lambda x: torch.cumsum(x.flip(2), dim=2).flip(2), "scan"),
    _reduction("cumsum_exclusive",
               lambda x: torch.cumsum(torch.cat([torch.zeros_like(x[:, :, :1]), x], dim=2), dim=2)[:, :, :-1],
               "scan"),
]


def _masked_cumsum():
    return Workload("cumsum_masked", "scan", "single", (B, M, N),
                    (Input(lambda p: (p["B"], p["M"], p["N"])), Input(lambda p: (p["B"], p["M"], p["N"]), "bool")),
                    lambda p: op_module("CumsumMasked", lambda self, x, m: torch.cumsum(x * m, dim=2)),
                    description="cumulative sum of the masked elements")


def _layer(name, family, params, shape, make_layer, constraint=lambda p: True, description=""):
    return Workload(name, family, "single", params, (Input(shape),),
                    lambda p, name=name: op_module(_cls(name), lambda self, x: self.layer(x),
                                                   lambda: {"layer": make_layer(p)}),
                    constraint=constraint, description=description)


def _img(p):
    return (p["B"], p["C"], p["H"], p["W"])


KS = Param("KS", choices=(1, 3))
KS3 = Param("KS", choices=(2, 3))
G = Param("G", choices=(1, 2))

LAYERS = [
    _layer("linear", "gemm", (M, K, N), lambda p: (p["M"], p["K"]), lambda p: nn.Linear(p["K"], p["N"])),
    _layer("linear_no_bias", "gemm", (M, K, N), lambda p: (p["M"], p["K"]),
           lambda p: nn.Linear(p["K"], p["N"], bias=False)),
    _layer("linear_3d", "gemm", (B, M, K, N), lambda p: (p["B"], p["M"], p["K"]), lambda p: nn.Linear(p["K"], p["N"])),
    _layer("conv1d", "conv", (B, C, C2, L, KS), lambda p: (p["B"], p["C"], p["L"]),
           lambda p: nn.Conv1d(p["C"], p["C2"], p["KS"], padding=p["KS"] // 2)),
    _layer("conv2d", "conv", (B, C, C2, H, W, KS), _img, lambda p: nn.Conv2d(p["C"], p["C2"], p["KS"])),
    _layer("conv2d_stride2_pad", "conv", (B, C, C2, H, W), _img,
           lambda p: nn.Conv2d(p["C"], p["C2"], 3, stride=2, padding=1)),
    _layer("conv2d_dilated", "conv", (B, C, C2, H, W), _img,
           lambda p: nn.Conv2d(p["C"], p["C2"], 3, dilation=2, padding=2, bias=False)),
    _layer("conv2d_groups", "conv", (B, C, C2, H, W, G), lambda p: (p["B"], p["C"] * p["G"], p["H"], p["W"]),
           lambda p: nn.Conv2d(p["C"] * p["G"], p["C2"] * p["G"], 3, groups=p["G"], padding=1),
           description="grouped convolution (C*G -> C2*G channels)"),
    _layer("conv2d_depthwise", "conv", (B, C, H, W), _img,
           lambda p: nn.Conv2d(p["C"], p["C"], 3, groups=p["C"], padding=1)),
    _layer("conv2d_same", "conv", (B, C, C2, H, W), _img, lambda p: nn.Conv2d(p["C"], p["C2"], 4, padding="same")),
    _layer("conv3d", "conv", (B, C, C2, D), lambda p: (p["B"], p["C"], p["D"] + 2, p["D"] + 2, p["D"] + 2),
           lambda p: nn.Conv3d(p["C"], p["C2"], 3)),
    _layer("conv_transpose1d", "conv_transpose", (B, C, C2, L), lambda p: (p["B"], p["C"], p["L"]),
           lambda p: nn.ConvTranspose1d(p["C"], p["C2"], 3, stride=2, padding=1, output_padding=1)),
    _layer("conv_transpose2d", "conv_transpose", (B, C, C2, H, W), _img,
           lambda p: nn.ConvTranspose2d(p["C"], p["C2"], 3, stride=2)),
    _layer("conv_transpose2d_groups", "conv_transpose", (B, C, C2, H, W),
           lambda p: (p["B"], 2 * p["C"], p["H"], p["W"]),
           lambda p: nn.ConvTranspose2d(2 * p["C"], 2 * p["C2"], 2, stride=2, groups=2)),
    _layer("conv_transpose3d", "conv_transpose", (B, C, C2, D), lambda p: (p["B"], p["C"], p["D"], p["D"], p["D"]),
           lambda p: nn.ConvTranspose3d(p["C"], p["C2"], 3, stride=2, padding=1)),
    _layer("max_pool1d", "pool", (B, C, L), lambda p: (p["B"], p["C"], p["L"]), lambda p: nn.MaxPool1d(3, 2)),
    _layer("max_pool2d", "pool", (B, C, H, W), _img, lambda p: nn.MaxPool2d(2)),
    _layer("max_pool2d_padded", "pool", (B, C, H, W), _img, lambda p: nn.MaxPool2d(3, 2, padding=1)),
    _layer("max_pool2d_ceil_dilated", "pool", (B, C, H, W), _img,
           lambda p: nn.MaxPool2d(2, 2, dilation=2, ceil_mode=True)),
    _layer("max_pool3d", "pool", (B, C, D), lambda p: (p["B"], p["C"], p["D"] + 1, p["D"] + 1, p["D"] + 1),
           lambda p: nn.MaxPool3d(2)),
    _layer("avg_pool1d", "pool", (B, C, L), lambda p: (p["B"], p["C"], p["L"]), lambda p: nn.AvgPool1d(2)),
    _layer("avg_pool2d", "pool", (B, C, H, W), _img, lambda p: nn.AvgPool2d(2)),
    _layer("avg_pool2d_padded_exclude", "pool", (B, C, H, W), _img,
           lambda p: nn.AvgPool2d(3, 2, padding=1, count_include_pad=False)),
    _layer("avg_pool2d_ceil", "pool", (B, C, H, W), _img, lambda p: nn.AvgPool2d(3, 2, ceil_mode=True)),
    _layer("avg_pool3d", "pool", (B, C, D), lambda p: (p["B"], p["C"], p["D"] + 1, p["D"] + 1, p["D"] + 1),
           lambda p: nn.AvgPool3d(2)),
    _layer("adaptive_avg_pool2d", "pool", (B, C, H, W), _img, lambda p: nn.AdaptiveAvgPool2d((3, 3))),
    _layer("adaptive_avg_pool1d_global", "pool", (B, C, L), lambda p: (p["B"], p["C"], p["L"]),
           lambda p: nn.AdaptiveAvgPool1d(1)),
    _layer("adaptive_max_pool2d", "pool", (B, C, H, W), _img, lambda p: nn.AdaptiveMaxPool2d(3)),
    _layer("batch_norm1d", "norm", (B, C), lambda p: (p["B"] + 1, p["C"]),
           lambda p: nn.BatchNorm1d(p["C"])),
    _layer("batch_norm2d", "norm", (B, C, H, W), _img, lambda p: nn.BatchNorm2d(p["C"])),
    _layer("layer_norm", "norm", (B, M, N), lambda p: (p["B"], p["M"], p["N"]), lambda p: nn.LayerNorm(p["N"])),
    _layer("layer_norm_2d", "norm", (B, M, N), lambda p: (p["B"], p["M"], p["N"]),
           lambda p: nn.LayerNorm((p["M"], p["N"]))),
    _layer("layer_norm_no_affine", "norm", (M, N), _x2,
           lambda p: nn.LayerNorm(p["N"], elementwise_affine=False)),
    _layer("group_norm", "norm", (B, C, H, W, G), lambda p: (p["B"], p["C"] * p["G"], p["H"], p["W"]),
           lambda p: nn.GroupNorm(p["G"], p["C"] * p["G"])),
    _layer("instance_norm2d", "norm", (B, C, H, W), _img, lambda p: nn.InstanceNorm2d(p["C"])),
    _layer("rms_norm", "norm", (B, M, N), lambda p: (p["B"], p["M"], p["N"]), lambda p: nn.RMSNorm(p["N"])),
    _layer("prelu", "activation", (B, C, H, W), _img, lambda p: nn.PReLU(p["C"])),
    _layer("glu", "activation", (M, N), lambda p: (p["M"], 2 * p["N"]), lambda p: nn.GLU()),
]


def _fn(name, family, params, inputs, fn, constraint=lambda p: True, description=""):
    n_in = len(inputs)
    forward = {1: lambda self, a: fn(a), 2: lambda self, a, b: fn(a, b),
               3: lambda self, a, b, c: fn(a, b, c)}[n_in]
    return Workload(name, family, "single", params, tuple(inputs),
                    lambda p, name=name: op_module(_cls(name), forward), constraint=constraint,
                    description=description)


def _bmn(p):
    return (p["B"], p["M"], p["N"])


def _vec(p):
    return (p["M"], p["N"])


SHAPE_AND_MISC = [
    _fn("matmul", "gemm", (M, K, N), [Input(lambda p: (p["M"], p["K"])), Input(lambda p: (p["K"], p["N"]))],
        torch.matmul),
    _fn("bmm", "gemm", (B, M, K, N), [Input(lambda p: (p["B"], p["M"], p["K"])),
                                      Input(lambda p: (p["B"], p["K"], p["N"]))], torch.bmm),
    _fn("matmul_broadcast_batch", "gemm", (B, M, K, N),
        [Input(lambda p: (p["B"], 1, p["M"], p["K"])), Input(lambda p: (2, p["K"], p["N"]))], torch.matmul),
    _fn("matvec", "gemm", (M, K), [Input(lambda p: (p["M"], p["K"])), Input(lambda p: (p["K"],))], torch.matmul),
    _fn("addmm", "gemm", (M, K, N), [Input(lambda p: (p["N"],)), Input(lambda p: (p["M"], p["K"])),
                                     Input(lambda p: (p["K"], p["N"]))],
        lambda b, x, y: torch.addmm(b, x, y, beta=0.5, alpha=2.0)),
    _fn("baddbmm", "gemm", (B, M, K, N), [Input(lambda p: (p["B"], p["M"], p["N"])),
                                          Input(lambda p: (p["B"], p["M"], p["K"])),
                                          Input(lambda p: (p["B"], p["K"], p["N"]))], torch.baddbmm),
    _fn("einsum_bilinear_form", "gemm", (B, M, N), [Input(_bmn), Input(lambda p: (p["N"], p["N"]))],
        lambda x, w: torch.einsum("bmi,ij,bmj->bm", x, w, x)),
    _fn("einsum_outer", "gemm", (M, N), [Input(lambda p: (p["M"],)), Input(lambda p: (p["N"],))],
        lambda a, b: torch.einsum("i,j->ij", a, b)),
    _fn("reshape", "layout", (B, M, N), [Input(_bmn)], lambda x: x.reshape(x.shape[0], -1)),
    _fn("view_split_heads", "layout", (B, M, N), [Input(lambda p: (p["B"], p["M"], 2 * p["N"]))],
        lambda x: x.view(x.shape[0], x.shape[1], 2, -1)),
    _fn("permute", "layout", (B, M, N), [Input(_bmn)], lambda x: x.permute(2, 0, 1)),
    _fn("transpose_contiguous", "layout", (B, M, N), [Input(_bmn)], lambda x: x.transpose(1, 2).contiguous()),
    _fn("expand", "layout", (B, M, N), [Input(lambda p: (p["M"], 1))], lambda x: x.expand(3, -1, 5)),
    _fn("repeat", "layout", (M, N), [Input(_vec)], lambda x: x.repeat(2, 3)),
    _fn("flip", "layout", (B, M, N), [Input(_bmn)], lambda x: torch.flip(x, dims=(0, 2))),
    _fn("cat", "layout", (M, N), [Input(_vec), Input(lambda p: (p["M"], 3))], lambda a, b: torch.cat([a, b], dim=1)),
    _fn("stack", "layout", (M, N), [Input(_vec), Input(_vec)], lambda a, b: torch.stack([a, b], dim=1)),
    _fn("chunk", "layout", (M, N), [Input(lambda p: (p["M"], 2 * p["N"]))], lambda x: x.chunk(2, dim=1)),
    _fn("split_sum", "layout", (M, N), [Input(lambda p: (p["M"], 3 * p["N"]))],
        lambda x: sum(x.split(x.shape[1] // 3, dim=1))),
    _fn("slice_step", "layout", (B, M, N), [Input(_bmn)], lambda x: x[:, 1:, ::2]),
    _fn("narrow_select", "layout", (B, M, N), [Input(_bmn)], lambda x: x.narrow(2, 1, 1).select(0, -1)),
    _fn("squeeze_unsqueeze", "layout", (M, N), [Input(lambda p: (p["M"], 1, p["N"]))],
        lambda x: x.squeeze(1).unsqueeze(0)),
    _fn("flatten", "layout", (B, C, H, W), [Input(_img)], lambda x: torch.flatten(x, 1)),
    _fn("pad_constant", "layout", (B, M, N), [Input(_bmn)], lambda x: F.pad(x, (1, 2, 0, 1), value=0.5)),
    _fn("triu", "layout", (M, N), [Input(_vec)], lambda x: torch.triu(x, diagonal=1)),
    _fn("tril", "layout", (M, N), [Input(_vec)], torch.tril),
    _fn("gather", "indexing", (M, N), [Input(_vec), Input(lambda p: (p["M"], 2), "index", lambda p: p["N"])],
        lambda x, i: torch.gather(x, 1, i)),
    _fn("index_select", "indexing", (M, N), [Input(_vec), Input(lambda p: (3,), "index", lambda p: p["M"])],
        lambda x, i: torch.index_select(x, 0, i)),
    _fn("embedding_lookup", "indexing", (M, N), [Input(lambda p: (p["M"],), "index", lambda p: 7),
                                                 Input(lambda p: (7, p["N"]))],
        lambda i, w: F.embedding(i, w)),
    _fn("sdpa", "attention", (B, L, HD), [Input(lambda p: (p["B"], 2, p["L"], p["D"]))] * 3,
        F.scaled_dot_product_attention),
    _fn("sdpa_causal", "attention", (B, L, HD), [Input(lambda p: (p["B"], 2, p["L"], p["D"]))] * 3,
        lambda q, k, v: F.scaled_dot_product_attention(q, k, v, is_causal=True)),
    _fn("normalize", "norm", (M, N), [Input(_vec)], lambda x: F.normalize(x, dim=1)),
    _masked_cumsum(),
]


def _loss(name, inputs, fn, family="loss"):
    return _fn(name, family, (M, N), inputs, fn)


_TARGET = Input(lambda p: (p["M"],), "index", lambda p: p["N"])
LOSSES = [
    _loss("mse_loss", [Input(_vec), Input(_vec)], F.mse_loss),
    _loss("l1_loss_sum", [Input(_vec), Input(_vec)], lambda a, b: F.l1_loss(a, b, reduction="sum")),
    _loss("smooth_l1_loss", [Input(_vec), Input(_vec)], F.smooth_l1_loss),
    _loss("huber_loss_none", [Input(_vec), Input(_vec)], lambda a, b: F.huber_loss(a, b, reduction="none",
                                                                                   delta=0.5)),
    _loss("cross_entropy", [Input(_vec), _TARGET], F.cross_entropy),
    _loss("cross_entropy_sum", [Input(_vec), _TARGET], lambda x, t: F.cross_entropy(x, t, reduction="sum")),
    _loss("cross_entropy_probs", [Input(_vec), Input(_vec, "unit")], F.cross_entropy),
    _loss("nll_loss", [Input(_vec), _TARGET], lambda x, t: F.nll_loss(F.log_softmax(x, dim=1), t)),
    _loss("kl_div_batchmean", [Input(_vec), Input(_vec, "unit")],
          lambda x, t: F.kl_div(F.log_softmax(x, dim=1), t, reduction="batchmean")),
    _loss("cosine_similarity", [Input(_vec), Input(_vec)], lambda a, b: F.cosine_similarity(a, b, dim=1)),
    _loss("hinge_embedding_loss", [Input(_vec), Input(_vec, "sign")], F.hinge_embedding_loss),
    _loss("margin_ranking_loss", [Input(lambda p: (p["M"],)), Input(lambda p: (p["M"],)),
                                  Input(lambda p: (p["M"],), "sign")],
          lambda a, b, y: F.margin_ranking_loss(a, b, y, margin=0.1)),
    _loss("triplet_margin_loss", [Input(_vec)] * 3, F.triplet_margin_loss),
    _loss("bce_loss", [Input(_vec, "unit"), Input(_vec, "unit")],
          lambda p, t: F.binary_cross_entropy(torch.sigmoid(p), torch.sigmoid(t))),
    _loss("bce_with_logits", [Input(_vec), Input(_vec, "unit")], F.binary_cross_entropy_with_logits),
    _loss("soft_margin_loss", [Input(_vec), Input(_vec, "sign")], F.soft_margin_loss),
    _loss("cosine_embedding_loss", [Input(_vec), Input(_vec), Input(lambda p: (p["M"],), "sign")],
          lambda a, b, y: F.cosine_embedding_loss(a, b, torch.sign(y))),
    _loss("pairwise_distance", [Input(_vec), Input(_vec)], F.pairwise_distance),
]


def single_workloads() -> list[Workload]:
    found = [_unary_workload(n, "activation", fn) for n, fn in ACTIVATIONS.items()]
    found += [_unary_workload(n, "elementwise_math", fn, kind) for n, (fn, kind) in MATH.items()]
    return found + BINARY + REDUCTIONS + LAYERS + SHAPE_AND_MISC + LOSSES
