"""Workloads whose arithmetic the mathematical and graph strategies work on: probabilistic losses,
explicit activations, temperature softmaxes, gated units that split or concatenate projections, and
computations with outputs a model does not use.

Each entry is a distinct module from a real model or library (the comment says where), written the
way such code is written, in a numerically stable form that holds in float16 (the verifier draws
values up to 10 in magnitude: formulas that overflow there, such as log(cosh(x)) through exp(x),
use the stable form libraries use instead).
"""
from __future__ import annotations

import math

import torch
import torch.nn as nn
import torch.nn.functional as F

from workloads.spec import Input, Param, Workload, op_module

B = Param("B", 1, 4, role="batch")
M = Param("M", 2, 8, role="tokens")
N = Param("N", 2, 16, role="features")
K = Param("K", 2, 16, role="features")
L = Param("L", 4, 12, role="sequence")
HD = Param("D", 2, 6, role="head_dim")


def _x(p):
    return (p["M"], p["N"])


def _gemm_in(p):
    return (p["M"], p["K"])


def _cls(name: str) -> str:
    return "".join(part.capitalize() for part in name.split("_"))


def _workload(name, family, params, inputs, forward, layers=None, constraint=lambda p: True, description=""):
    """A module of its own class: `layers(p)` builds its sub-modules, `forward(self, *xs)` computes."""
    return Workload(name, family, "composite", tuple(params), tuple(inputs),
                    lambda p, name=name: op_module(_cls(name), forward,
                                                   (lambda: layers(p)) if layers else None),
                    constraint=constraint, description=description)


# --- probabilistic losses ----------------------------------------------------------------------------

LOG2 = math.log(2.0)


def _losses() -> list[Workload]:
    two = [Input(_x), Input(_x)]
    return [
        # Keras' log_cosh: log(cosh(d)) = d + softplus(-2d) - log(2), stable where cosh overflows.
        _workload("log_cosh_loss", "probabilistic_loss", (M, N), two,
                  lambda self, y, t: (lambda d: (d + F.softplus(-2.0 * d) - LOG2).mean(dim=-1))(y - t),
                  description="log-cosh regression loss (Keras form)"),
        # torch.nn.GaussianNLLLoss without the clamp: 0.5 * (log var + (x - mu)^2 / var), mean.
        _workload("gaussian_nll_loss", "probabilistic_loss", (M, N), [Input(_x), Input(_x), Input(_x, "positive")],
                  lambda self, mu, x, var: (0.5 * (torch.log(var) + (x - mu) ** 2 / var)).mean(dim=-1),
                  description="Gaussian negative log-likelihood with a predicted variance"),
        # torch.nn.PoissonNLLLoss(log_input=True): exp(r) - t * r, mean.
        _workload("poisson_nll_loss", "probabilistic_loss", (M, N), [Input(_x), Input(_x, "positive")],
                  lambda self, r, t: (torch.exp(r) - t * r).mean(dim=-1),
                  description="Poisson negative log-likelihood of a log-rate"),
        # PoissonNLLLoss(log_input=True, full=True): plus Stirling's term t*log(t) - t + 0.5*log(2*pi*t).
        _workload("poisson_nll_loss_full", "probabilistic_loss", (M, N), [Input(_x), Input(_x, "positive")],
                  lambda self, r, t: (torch.exp(r) - t * r
                                      + t * torch.log(t) - t + 0.5 * torch.log(2 * math.pi * t)).mean(dim=-1),
                  description="Poisson negative log-likelihood with Stirling's approximation"),
        # The VAE's KL term (Kingma and Welling): -0.5 * sum(1 + logvar - mu^2 - exp(logvar)) per sample.
        _workload("vae_kl_divergence", "probabilistic_loss", (M, N), [Input(_x), Input(_x)],
                  lambda self, mu, logvar: (-0.5 * torch.sum(1 + logvar - mu ** 2 - logvar.exp(), dim=1)).mean(),
                  description="KL divergence of a diagonal Gaussian from the standard normal (VAE)"),
        # KL(N(m1, v1) || N(m2, v2)) of diagonal Gaussians, per sample (variances given).
        _workload("gaussian_kl_divergence", "probabilistic_loss", (M, N),
                  [Input(_x), Input(_x, "positive"), Input(_x), Input(_x, "positive")],
                  lambda self, m1, v1, m2, v2: (0.5 * (torch.log(v2) - torch.log(v1) + (v1 + (m1 - m2) ** 2) / v2
                                                       - 1)).sum(dim=1),
                  description="KL divergence between two diagonal Gaussians"),
        # torchvision.ops.sigmoid_focal_loss (RetinaNet), alpha 0.25, gamma 2, mean.
        _workload("sigmoid_focal_loss", "probabilistic_loss", (M, N), [Input(_x), Input(_x, "unit")],
                  lambda self, x, t: _focal(x, t), description="RetinaNet's sigmoid focal loss"),
        # Binary cross-entropy through an explicit log-sigmoid: -(t*logsig(x) + (1-t)*logsig(-x)).
        _workload("bce_explicit_log_sigmoid", "probabilistic_loss", (M, N), [Input(_x), Input(_x, "unit")],
                  lambda self, x, t: -(t * F.logsigmoid(x) + (1 - t) * F.logsigmoid(-x)).mean(dim=-1),
                  description="binary cross-entropy written with log-sigmoid"),
        # Knowledge distillation (Hinton et al.): T^2 * KL(softmax(t/T) || softmax(s/T)), T = 4.
        _workload("distillation_kl_loss", "probabilistic_loss", (M, N), [Input(_x), Input(_x)],
                  lambda self, s, t: F.kl_div(F.log_softmax(s / 4.0, dim=-1), F.softmax(t / 4.0, dim=-1),
                                              reduction="batchmean") * 16.0,
                  description="distillation loss between temperature-4 softmaxes"),
        # Entropy of a categorical distribution from logits (entropy bonus of policy-gradient methods).
        _workload("softmax_entropy", "probabilistic_loss", (M, N), [Input(_x)],
                  lambda self, x: -(F.softmax(x, dim=-1) * F.log_softmax(x, dim=-1)).sum(dim=-1),
                  description="entropy of softmax(x) per row"),
    ]


def _preference_losses() -> list[Workload]:
    return [
        # Laplace negative log-likelihood with a predicted scale b: log(2b) + |x - mu| / b.
        _workload("laplace_nll_loss", "probabilistic_loss", (M, N), [Input(_x), Input(_x), Input(_x, "positive")],
                  lambda self, mu, x, b: torch.log(2 * b) + (x - mu).abs() / b,
                  description="Laplace negative log-likelihood"),
        # Bayesian personalised ranking (Rendle et al.): -log(sigmoid(positive - negative score)).
        _workload("bpr_loss", "preference_loss", (M, N), [Input(_x), Input(_x)],
                  lambda self, pos, neg: -torch.log(torch.sigmoid(pos - neg)).mean(dim=-1),
                  description="BPR pairwise ranking loss per user"),
        # The GAN discriminator loss -(log D(x) + log(1 - D(G(z)))), D = sigmoid of a logit, with
        # 1 - sigmoid(f) written as sigmoid(-f) (1 - 0.99995 cancels in float32).
        _workload("gan_discriminator_loss", "preference_loss", (M, N), [Input(_x), Input(_x)],
                  lambda self, real, fake: -(torch.log(torch.sigmoid(real)) + torch.log(torch.sigmoid(-fake))),
                  description="minimax GAN discriminator loss"),
        # The non-saturating generator loss: -log D(G(z)).
        _workload("gan_generator_loss", "preference_loss", (M, N), [Input(_x)],
                  lambda self, fake: -torch.log(torch.sigmoid(fake)), description="non-saturating GAN generator loss"),
        # word2vec skip-gram with negative sampling: log sigma(u.v) + sum_k log sigma(-u.v_k).
        _workload("word2vec_negative_sampling", "preference_loss", (M, N),
                  [Input(lambda p: (p["M"], 1)), Input(_x)],
                  lambda self, pos, neg: -(torch.log(torch.sigmoid(pos)) + torch.log(torch.sigmoid(-neg)).sum(-1,
                                                                                                         keepdim=True)),
                  description="skip-gram negative-sampling loss (scores given)"),
        _workload("log_softmax_explicit", "preference_loss", (M, N), [Input(_x)],
                  lambda self, x: torch.log(torch.softmax(x, dim=-1)), description="log of softmax written out"),
        # AugMix's Jensen-Shannon consistency between a clean and two augmented predictions.
        _workload("augmix_jsd_loss", "preference_loss", (M, N), [Input(_x)] * 3,
                  lambda self, c, a1, a2: _augmix_jsd(c, a1, a2), description="AugMix Jensen-Shannon consistency"),
        # UDA / consistency regularisation: KL(p(clean) || p(augmented)).
        _workload("consistency_kl_loss", "preference_loss", (M, N), [Input(_x), Input(_x)],
                  lambda self, clean, aug: F.kl_div(F.log_softmax(aug, dim=-1), F.softmax(clean, dim=-1),
                                                    reduction="none").sum(dim=-1),
                  description="unsupervised consistency loss (UDA)"),
    ]


def _augmix_jsd(c, a1, a2):
    pc, p1, p2 = F.softmax(c, dim=-1), F.softmax(a1, dim=-1), F.softmax(a2, dim=-1)
    mixture = torch.clamp((pc + p1 + p2) / 3.0, 1e-7, 1).log()
    kl = lambda p: F.kl_div(mixture, p, reduction="none").sum(dim=-1)  # noqa: E731  (per sample)
    return (kl(pc) + kl(p1) + kl(p2)) / 3.0


def _bias_gelu(x):
    return x * 0.5 * (1.0 + torch.tanh(0.79788456 * x * (1 + 0.044715 * x * x)))


def _focal(x, t, alpha=0.25, gamma=2):
    p = torch.sigmoid(x)
    ce = F.binary_cross_entropy_with_logits(x, t, reduction="none")
    p_t = p * t + (1 - p) * (1 - t)
    loss = ce * ((1 - p_t) ** gamma)
    alpha_t = alpha * t + (1 - alpha) * (1 - t)
    return alpha_t * loss  # torchvision's default reduction is "none"


# --- activations written out -------------------------------------------------------------------------

def _activations() -> list[Workload]:
    one = [Input(_x)]
    return [
        _workload("log_sigmoid_explicit", "explicit_activation", (M, N), one,
                  lambda self, x: torch.log(torch.sigmoid(x)), description="log(sigmoid(x)) written out"),
        # Megatron-LM's bias_gelu: the bias add and the tanh GELU in one function.
        _workload("megatron_bias_gelu", "explicit_activation", (M, N), [Input(_x), Input(lambda p: (p["N"],))],
                  lambda self, y, bias: _bias_gelu(bias + y), description="Megatron's fused bias-GELU (tanh form)"),
        # Safe Padé activation unit (Molina et al.), degrees (3, 2).
        _workload("pade_activation", "explicit_activation", (M, N), one,
                  lambda self, x: (0.02 + 0.5 * x + 0.3 * x ** 2 + 0.05 * x ** 3)
                  / (1 + (0.1 * x).abs() + (0.02 * x ** 2).abs()),
                  description="rational (Padé) activation unit"),
        _workload("log_softmax_temperature", "explicit_activation", (M, N), one,
                  lambda self, x: F.log_softmax(x / 2.0, dim=-1), description="log_softmax(x / 2)"),
        _workload("softmax_from_log_softmax", "explicit_activation", (M, N), one,
                  lambda self, x: F.log_softmax(x, dim=-1).exp(), description="probabilities as exp(log_softmax(x))"),
        _workload("smooth_max_logsumexp", "explicit_activation", (M, N), one,
                  lambda self, x: 0.5 * torch.logsumexp(x / 0.5, dim=-1),
                  description="smooth maximum T*logsumexp(x/T), T = 0.5"),
    ]


# --- gated units: projections split or concatenated -------------------------------------------------

def _gated() -> list[Workload]:
    gemm = [Input(_gemm_in)]
    return [
        # LLaMA's feed-forward: w2(silu(w1 x) * w3 x).
        _workload("swiglu_ffn", "gated_unit", (M, K, N), gemm,
                  lambda self, x: self.w2(F.silu(self.w1(x)) * self.w3(x)),
                  lambda p: {"w1": nn.Linear(p["K"], p["N"], bias=False), "w3": nn.Linear(p["K"], p["N"], bias=False),
                             "w2": nn.Linear(p["N"], p["K"], bias=False)},
                  description="SwiGLU feed-forward (LLaMA)"),
        # One fused projection split in two (GEGLU of T5 v1.1 and diffusion transformers).
        _workload("geglu_fused_projection", "gated_unit", (M, K, N), gemm,
                  lambda self, x: (lambda a, g: a * F.gelu(g))(*self.proj(x).chunk(2, dim=-1)),
                  lambda p: {"proj": nn.Linear(p["K"], 2 * p["N"])}, description="GEGLU with a fused projection"),
        _workload("reglu", "gated_unit", (M, K, N), gemm,
                  lambda self, x: torch.relu(self.w(x)) * self.v(x),
                  lambda p: {"w": nn.Linear(p["K"], p["N"]), "v": nn.Linear(p["K"], p["N"])}, description="ReGLU"),
        # The gated linear unit of convolutional seq2seq: a * sigmoid(b) from one projection.
        _workload("glu_projection", "gated_unit", (M, K, N), gemm,
                  lambda self, x: (lambda a, b: a * torch.sigmoid(b))(*self.proj(x).chunk(2, dim=-1)),
                  lambda p: {"proj": nn.Linear(p["K"], 2 * p["N"])}, description="GLU after a projection"),
        # Highway layer (Srivastava et al.): t * relu(W_h x) + (1 - t) * x, t = sigmoid(W_t x).
        _workload("highway_layer", "gated_unit", (M, K), [Input(lambda p: (p["M"], p["K"]))],
                  lambda self, x: (lambda t: t * torch.relu(self.h(x)) + (1 - t) * x)(torch.sigmoid(self.t(x))),
                  lambda p: {"h": nn.Linear(p["K"], p["K"]), "t": nn.Linear(p["K"], p["K"])},
                  description="highway layer"),
        _workload("lstm_cell", "gated_unit", (M, K, N), [Input(_gemm_in), Input(_x), Input(_x)],
                  lambda self, x, h, c: _lstm(self, x, h, c),
                  lambda p: {"wi": nn.Linear(p["K"], 4 * p["N"]), "wh": nn.Linear(p["N"], 4 * p["N"])},
                  description="LSTM cell, returns h and c"),
        _workload("gru_cell", "gated_unit", (M, K, N), [Input(_gemm_in), Input(_x)],
                  lambda self, x, h: _gru(self, x, h),
                  lambda p: {"wi": nn.Linear(p["K"], 3 * p["N"]), "wh": nn.Linear(p["N"], 3 * p["N"])},
                  description="GRU cell"),
        _workload("swiglu_fused_projection", "gated_unit", (M, K, N), gemm,
                  lambda self, x: (lambda a, b: F.silu(a) * b)(*self.proj(x).chunk(2, dim=-1)),
                  lambda p: {"proj": nn.Linear(p["K"], 2 * p["N"], bias=False)},
                  description="SwiGLU with one fused projection"),
        _workload("bilinear_glu", "gated_unit", (M, K, N), gemm,
                  lambda self, x: (lambda a, b: a * b)(*self.proj(x).chunk(2, dim=-1)),
                  lambda p: {"proj": nn.Linear(p["K"], 2 * p["N"])},
                  description="bilinear GLU (Shazeer's GLU variants)"),
        # FiLM (Perez et al.): gamma, beta from the conditioning vector modulate the features.
        _workload("film_modulation", "gated_unit", (M, K, N), [Input(_x), Input(_gemm_in)],
                  lambda self, x, c: (lambda g, b: x * g + b)(*self.cond(c).chunk(2, dim=-1)),
                  lambda p: {"cond": nn.Linear(p["K"], 2 * p["N"])}, description="FiLM conditioning"),
        # DiT's final layer: shift, scale = adaLN(c); linear(modulate(norm(x), shift, scale)).
        _workload("dit_final_layer", "gated_unit", (M, K, N), [Input(_x), Input(_x)],
                  lambda self, x, c: _dit_final(self, x, c),
                  lambda p: {"ada": nn.Linear(p["N"], 2 * p["N"]), "norm": _plain_norm(p),
                             "out": nn.Linear(p["N"], p["K"])},
                  description="DiT final layer with adaLN modulation"),
        # DiT block's MLP half with adaLN-Zero: shift, scale, gate from the conditioning.
        _workload("dit_adaln_zero_mlp", "gated_unit", (M, N), [Input(_x), Input(_x)],
                  lambda self, x, c: _dit_mlp(self, x, c),
                  lambda p: {"ada": nn.Linear(p["N"], 3 * p["N"]), "norm": _plain_norm(p),
                             "fc": nn.Linear(p["N"], p["N"])},
                  description="DiT adaLN-Zero gated MLP branch"),
        # RealNVP affine coupling: x1 passes, x2 is scaled and shifted by a network of x1.
        _workload("realnvp_coupling", "gated_unit", (M, N), [Input(lambda p: (p["M"], 2 * p["N"]))],
                  lambda self, x: _coupling(self, x),
                  lambda p: {"net": nn.Linear(p["N"], 2 * p["N"])}, description="RealNVP affine coupling layer"),
        # Rotary position embedding, GPT-NeoX's rotate_half form.
        _workload("rotary_embedding", "gated_unit", (M, N),
                  [Input(lambda p: (p["M"], 2 * p["N"])), Input(lambda p: (p["M"], 2 * p["N"])),
                   Input(lambda p: (p["M"], 2 * p["N"]))],
                  lambda self, x, cos, sin: x * cos + _rotate_half(x) * sin, description="rotary embedding"),
        # A mixture density network's head: mixture logits, means and scales from one projection.
        _workload("mixture_density_head", "gated_unit", (M, K, N), [Input(_gemm_in)],
                  lambda self, x: _mdn(self, x),
                  lambda p: {"proj": nn.Linear(p["K"], 3 * p["N"])}, description="mixture density network head"),
        # timm's ViT attention: fused qkv unbound into q, k, v; q scaled before the product. Multi-head
        # self-attention, so of the attention_mha family (the family is the split's unit, and
        # as gated units the fused-QKV attentions left tensor_split's test share to one family's fate)
        _workload("vit_attention_timm", "attention_mha", (B, L, HD), [Input(lambda p: (p["B"], p["L"], 2 * p["D"]))],
                  lambda self, x: _timm_attention(self, x),
                  lambda p: {"qkv": nn.Linear(2 * p["D"], 6 * p["D"]), "proj": nn.Linear(2 * p["D"], 2 * p["D"])},
                  description="ViT self-attention as timm writes it (2 heads)"),
        # CLIP's logits: cosine similarities of normalised features times a learned temperature.
        _workload("clip_logits", "gated_unit", (M, N), [Input(_x), Input(_x)],
                  lambda self, a, b: self.scale.exp() * (a / a.norm(dim=-1, keepdim=True))
                  @ (b / b.norm(dim=-1, keepdim=True)).t(),
                  lambda p: {"scale": nn.Parameter(torch.tensor(math.log(1 / 0.07)))},
                  description="CLIP image-text logits"),
        # Self-attention with one fused QKV projection split into q, k, v (GPT-2's c_attn): attention_mha.
        _workload("attention_fused_qkv_split", "attention_mha", (B, L, HD),
                  [Input(lambda p: (p["B"], p["L"], 2 * p["D"]))],
                  lambda self, x: _qkv(self, x),
                  lambda p: {"qkv": nn.Linear(2 * p["D"], 6 * p["D"])},
                  description="self-attention with a fused QKV projection (2 heads)"),
    ]


def _plain_norm(p):
    return nn.LayerNorm(p["N"], elementwise_affine=False)


def _dit_final(self, x, c):
    shift, scale = self.ada(F.silu(c)).chunk(2, dim=-1)
    return self.out(self.norm(x) * (1 + scale) + shift)


def _dit_mlp(self, x, c):
    shift, scale, gate = self.ada(F.silu(c)).chunk(3, dim=-1)
    return x + gate * F.gelu(self.fc(self.norm(x) * (1 + scale) + shift), approximate="tanh")


def _coupling(self, x):
    x1, x2 = x.chunk(2, dim=-1)
    s, t = self.net(x1).chunk(2, dim=-1)
    return torch.cat([x1, x2 * torch.exp(torch.tanh(s)) + t], dim=-1)


def _rotate_half(x):
    x1, x2 = x.chunk(2, dim=-1)
    return torch.cat([-x2, x1], dim=-1)


def _mdn(self, x):
    logits, mu, log_sigma = self.proj(x).chunk(3, dim=-1)
    return F.log_softmax(logits, dim=-1), mu, torch.exp(log_sigma.clamp(-5.0, 5.0))


def _timm_attention(self, x):
    b, n, c = x.shape
    q, k, v = self.qkv(x).reshape(b, n, 3, 2, c // 2).permute(2, 0, 3, 1, 4).unbind(0)
    q = q * (c // 2) ** -0.5
    attn = (q @ k.transpose(-2, -1)).softmax(dim=-1)
    return self.proj((attn @ v).transpose(1, 2).reshape(b, n, c))


def _lstm(self, x, h, c):
    i, f, g, o = (self.wi(x) + self.wh(h)).chunk(4, dim=-1)
    c2 = torch.sigmoid(f) * c + torch.sigmoid(i) * torch.tanh(g)
    return torch.sigmoid(o) * torch.tanh(c2), c2


def _gru(self, x, h):
    ir, iz, inn = self.wi(x).chunk(3, dim=-1)
    hr, hz, hn = self.wh(h).chunk(3, dim=-1)
    r, z = torch.sigmoid(ir + hr), torch.sigmoid(iz + hz)
    n = torch.tanh(inn + r * hn)
    return (1 - z) * n + z * h


def _qkv(self, x):
    b, l, d = x.shape
    q, k, v = self.qkv(x).split(d, dim=-1)
    heads = lambda t: t.view(b, l, 2, d // 2).transpose(1, 2)  # noqa: E731
    y = F.scaled_dot_product_attention(heads(q), heads(k), heads(v))
    return y.transpose(1, 2).reshape(b, l, d)


# --- outputs a model computes but does not use ----------------------------------------------------------

def _unused() -> list[Workload]:
    return [
        # Maxout (Goodfellow et al.): the max over k=2 pieces; torch.max also finds the indices.
        _workload("maxout", "unused_outputs", (M, N), [Input(lambda p: (p["M"], 2 * p["N"]))],
                  lambda self, x: x.view(x.shape[0], -1, 2).max(dim=-1)[0], description="maxout over 2 pieces"),
        # Min-max feature scaling per row: the values of min and max, never their positions.
        _workload("min_max_scaling", "unused_outputs", (M, N), [Input(_x)],
                  lambda self, x: (lambda lo, hi: (x - lo) / (hi - lo + 1e-5))(
                      x.min(dim=-1, keepdim=True)[0], x.max(dim=-1, keepdim=True)[0]),
                  description="min-max scaling of each row"),
        # Classifier confidence: the top softmax probability; its class index is not used.
        _workload("softmax_confidence", "unused_outputs", (M, N), [Input(_x)],
                  lambda self, x: torch.softmax(x, dim=-1).max(dim=-1)[0], description="top-1 softmax probability"),
        # TextCNN head: conv1d, relu, max over time (values only), linear.
        _workload("textcnn_max_over_time", "unused_outputs", (B, L, N), [Input(lambda p: (p["B"], p["N"], p["L"]))],
                  lambda self, x: self.fc(torch.relu(self.conv(x)).max(dim=-1)[0]),
                  lambda p: {"conv": nn.Conv1d(p["N"], p["N"], 3, padding=1), "fc": nn.Linear(p["N"], 2)},
                  description="convolution and max-over-time pooling"),
    ]


def _dce_more() -> list[Workload]:
    pts = Param("P", 2, 8, role="tokens")
    return [
        # PointNet's global feature: a shared MLP per point, then the max over the points.
        _workload("pointnet_global_max", "unused_outputs", (B, pts, N), [Input(lambda p: (p["B"], p["P"], 3))],
                  lambda self, x: torch.relu(self.mlp(x)).max(dim=1)[0],
                  lambda p: {"mlp": nn.Linear(3, p["N"])}, description="PointNet max-pooled global feature"),
        # Chamfer distance between two point sets (nearest neighbours both ways, values only).
        _workload("chamfer_distance", "unused_outputs", (B, pts), [Input(lambda p: (p["B"], p["P"], 3))] * 2,
                  lambda self, a, b: (lambda d: d.min(dim=2)[0].mean() + d.min(dim=1)[0].mean())(
                      ((a.unsqueeze(2) - b.unsqueeze(1)) ** 2).sum(-1)),
                  description="symmetric Chamfer distance"),
        # Crammer-Singer multi-class hinge: the largest wrong-class score against the true one.
        _workload("multiclass_hinge_loss", "unused_outputs", (M, N), [Input(_x), Input(_x, "bool")],
                  lambda self, x, onehot: torch.relu(1 + x.masked_fill(onehot, -1e4).max(dim=-1)[0]
                                                     - (x * onehot).sum(-1)).mean(),
                  description="Crammer-Singer multi-class hinge loss"),
    ]


def mathematical_workloads() -> list[Workload]:
    return _losses() + _preference_losses() + _activations() + _gated() + _unused() + _dce_more()
