"""nn.Module leaves as calls of PyTorch's functional form: `(op name, args, kwargs)`.

A converter receives the module and the node's arguments and returns the functional call with the
module's parameters and attributes filled in. Parameters appear as the module's own tensors; the
driver turns them into signature inputs. Running statistics are passed only when they are used.
"""
from __future__ import annotations

import torch.nn as nn

from leir.frontend.registry import UnsupportedForm


def _act(name, *attrs):
    def convert(m, args, kwargs):
        return name, tuple(args) + tuple(getattr(m, a) for a in attrs), dict(kwargs)
    return convert


def _conv(name):
    def convert(m, args, kwargs):
        if m.padding_mode != "zeros":
            raise UnsupportedForm(f"padding_mode={m.padding_mode!r} (only 'zeros')")
        return name, (args[0], m.weight, m.bias, m.stride, m.padding, m.dilation, m.groups), {}
    return convert


def _conv_transpose(name):
    def convert(m, args, kwargs):
        if len(args) > 1 or kwargs:
            raise UnsupportedForm("an explicit output_size")
        return name, (args[0], m.weight, m.bias, m.stride, m.padding, m.output_padding, m.groups,
                      m.dilation), {}
    return convert


def _max_pool(name):
    def convert(m, args, kwargs):
        return name, (args[0], m.kernel_size, m.stride, m.padding, m.dilation, m.ceil_mode,
                      m.return_indices), {}
    return convert


def _avg_pool(name, has_divisor=True):
    def convert(m, args, kwargs):
        extra = (m.divisor_override,) if has_divisor else ()
        return name, (args[0], m.kernel_size, m.stride, m.padding, m.ceil_mode,
                      m.count_include_pad) + extra, {}
    return convert


def _batch_norm(m, args, kwargs):
    training = m.training or m.running_mean is None
    stats = (None, None) if training else (m.running_mean, m.running_var)
    return "batch_norm", (args[0], *stats, m.weight, m.bias, training, m.momentum or 0.0, m.eps), {}


def _instance_norm(m, args, kwargs):
    use_input_stats = m.training or not m.track_running_stats
    stats = (None, None) if use_input_stats else (m.running_mean, m.running_var)
    return "instance_norm", (args[0], *stats, m.weight, m.bias, use_input_stats, m.momentum or 0.0,
                             m.eps), {}


def _loss(name, *attrs):
    def convert(m, args, kwargs):
        extra = {a: getattr(m, a) for a in attrs}
        return name, tuple(args), {**extra, "reduction": m.reduction, **kwargs}
    return convert


def _cross_entropy(m, args, kwargs):
    return "cross_entropy", tuple(args), {"weight": m.weight, "ignore_index": m.ignore_index,
                                          "reduction": m.reduction, "label_smoothing": m.label_smoothing}


def _nll(m, args, kwargs):
    return "nll_loss", tuple(args), {"weight": m.weight, "ignore_index": m.ignore_index,
                                     "reduction": m.reduction}


MODULE_CONVERTERS = {
    nn.Linear: lambda m, a, k: ("linear", (a[0], m.weight, m.bias), {}),
    nn.Bilinear: lambda m, a, k: ("bilinear", (a[0], a[1], m.weight, m.bias), {}),
    nn.Conv1d: _conv("conv1d"), nn.Conv2d: _conv("conv2d"), nn.Conv3d: _conv("conv3d"),
    nn.ConvTranspose1d: _conv_transpose("conv_transpose1d"),
    nn.ConvTranspose2d: _conv_transpose("conv_transpose2d"),
    nn.ConvTranspose3d: _conv_transpose("conv_transpose3d"),
    nn.MaxPool1d: _max_pool("max_pool1d"), nn.MaxPool2d: _max_pool("max_pool2d"),
    nn.MaxPool3d: _max_pool("max_pool3d"),
    nn.AvgPool1d: _avg_pool("avg_pool1d", has_divisor=False), nn.AvgPool2d: _avg_pool("avg_pool2d"),
    nn.AvgPool3d: _avg_pool("avg_pool3d"),
    nn.AdaptiveAvgPool1d: _act("adaptive_avg_pool1d", "output_size"),
    nn.AdaptiveAvgPool2d: _act("adaptive_avg_pool2d", "output_size"),
    nn.AdaptiveAvgPool3d: _act("adaptive_avg_pool3d", "output_size"),
    nn.AdaptiveMaxPool1d: _act("adaptive_max_pool1d", "output_size"),
    nn.AdaptiveMaxPool2d: _act("adaptive_max_pool2d", "output_size"),
    nn.AdaptiveMaxPool3d: _act("adaptive_max_pool3d", "output_size"),
    nn.BatchNorm1d: _batch_norm, nn.BatchNorm2d: _batch_norm, nn.BatchNorm3d: _batch_norm,
    nn.InstanceNorm1d: _instance_norm, nn.InstanceNorm2d: _instance_norm, nn.InstanceNorm3d: _instance_norm,
    nn.LayerNorm: lambda m, a, k: ("layer_norm", (a[0], m.normalized_shape, m.weight, m.bias, m.eps), {}),
    nn.GroupNorm: lambda m, a, k: ("group_norm", (a[0], m.num_groups, m.weight, m.bias, m.eps), {}),
    nn.RMSNorm: lambda m, a, k: ("rms_norm", (a[0], m.normalized_shape, m.weight, m.eps), {}),
    nn.ReLU: _act("relu"), nn.ReLU6: _act("relu6"), nn.Sigmoid: _act("sigmoid"), nn.Tanh: _act("tanh"),
    nn.SiLU: _act("silu"), nn.Mish: _act("mish"), nn.Softsign: _act("softsign"), nn.SELU: _act("selu"),
    nn.Hardswish: _act("hardswish"), nn.Hardsigmoid: _act("hardsigmoid"), nn.LogSigmoid: _act("logsigmoid"),
    nn.Tanhshrink: _act("tanhshrink"),
    nn.GELU: lambda m, a, k: ("gelu", tuple(a), {"approximate": m.approximate}),
    nn.LeakyReLU: _act("leaky_relu", "negative_slope"), nn.ELU: _act("elu", "alpha"),
    nn.CELU: _act("celu", "alpha"), nn.Softplus: _act("softplus", "beta", "threshold"),
    nn.Hardtanh: _act("hardtanh", "min_val", "max_val"), nn.Hardshrink: _act("hardshrink", "lambd"),
    nn.Softshrink: _act("softshrink", "lambd"), nn.Threshold: _act("threshold", "threshold", "value"),
    nn.PReLU: lambda m, a, k: ("prelu", (a[0], m.weight), {}),
    nn.GLU: _act("glu", "dim"),
    nn.Softmax: _act("softmax", "dim"), nn.LogSoftmax: _act("log_softmax", "dim"),
    nn.Softmin: _act("softmin", "dim"),
    nn.Identity: lambda m, a, k: ("clone", (a[0],), {}),
    nn.Dropout: lambda m, a, k: ("dropout", (a[0], m.p, m.training), {}),
    nn.Dropout1d: lambda m, a, k: ("dropout", (a[0], m.p, m.training), {}),
    nn.Dropout2d: lambda m, a, k: ("dropout", (a[0], m.p, m.training), {}),
    nn.Dropout3d: lambda m, a, k: ("dropout", (a[0], m.p, m.training), {}),
    nn.Flatten: _act("flatten", "start_dim", "end_dim"),
    nn.Unflatten: _act("unflatten", "dim", "unflattened_size"),
    nn.MSELoss: _loss("mse_loss"), nn.L1Loss: _loss("l1_loss"),
    nn.SmoothL1Loss: _loss("smooth_l1_loss", "beta"), nn.HuberLoss: _loss("huber_loss", "delta"),
    nn.CrossEntropyLoss: _cross_entropy, nn.NLLLoss: _nll,
    nn.KLDivLoss: _loss("kl_div", "log_target"),
    nn.HingeEmbeddingLoss: _loss("hinge_embedding_loss", "margin"),
    nn.MarginRankingLoss: _loss("margin_ranking_loss", "margin"),
    nn.SoftMarginLoss: _loss("soft_margin_loss"),
    nn.BCELoss: lambda m, a, k: ("binary_cross_entropy", tuple(a), {"weight": m.weight,
                                                                    "reduction": m.reduction}),
    nn.BCEWithLogitsLoss: lambda m, a, k: ("binary_cross_entropy_with_logits", tuple(a),
                                           {"weight": m.weight, "pos_weight": m.pos_weight,
                                            "reduction": m.reduction}),
    nn.CosineEmbeddingLoss: _loss("cosine_embedding_loss", "margin"),
    nn.TripletMarginLoss: lambda m, a, k: ("triplet_margin_loss", tuple(a),
                                           {"margin": m.margin, "p": m.p, "eps": m.eps, "swap": m.swap,
                                            "reduction": m.reduction}),
    nn.CosineSimilarity: lambda m, a, k: ("cosine_similarity", tuple(a), {"dim": m.dim, "eps": m.eps}),
    nn.PairwiseDistance: lambda m, a, k: ("pairwise_distance", tuple(a),
                                          {"p": m.norm, "eps": m.eps, "keepdim": m.keepdim}),
}
