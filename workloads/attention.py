"""Attention, MLP and transformer-block workloads.

Attention varies the head layout (MHA: as many key/value heads as query heads; MQA: one; GQA: two),
the causal mask, the spelling (`scaled_dot_product_attention` or explicit matmul/softmax) and the
input/output projections.
"""
from __future__ import annotations

import torch
import torch.nn as nn
import torch.nn.functional as F

from workloads.spec import Input, Param, Workload, op_module

B = Param("B", 1, 2, role="batch")
L = Param("L", 3, 8, role="sequence")
D = Param("D", 2, 8, role="head_dim")  # the model dimension is HEADS * D
HEADS = 4
KV_HEADS = {"mha": HEADS, "mqa": 1, "gqa": 2}


def explicit_attention(q, k, v, causal: bool, kv_heads: int):
    """softmax(q k^T / sqrt(d) [+ causal mask]) v, key/value heads repeated for MQA/GQA."""
    b, h, n, d = q.shape
    if kv_heads != HEADS:
        k = k[:, :, None].expand(b, kv_heads, HEADS // kv_heads, n, d).reshape(b, HEADS, n, d)
        v = v[:, :, None].expand(b, kv_heads, HEADS // kv_heads, n, d).reshape(b, HEADS, n, d)
    scores = q @ k.transpose(-2, -1) / d ** 0.5
    if causal:
        mask = scores.new_ones(n, n).tril()
        scores = scores.masked_fill(mask == 0, float("-inf"))
    return torch.softmax(scores, dim=-1) @ v


def sdpa_attention(q, k, v, causal: bool, kv_heads: int):
    return F.scaled_dot_product_attention(q, k, v, is_causal=causal, enable_gqa=kv_heads != HEADS)


def _heads_input(kv_heads):
    return Input(lambda p, kv=kv_heads: (p["B"], kv, p["L"], p["D"]))


def _bare_attention(layout, causal, style):
    kv = KV_HEADS[layout]
    fn = explicit_attention if style == "explicit" else sdpa_attention
    name = f"attention_{layout}_{style}" + ("_causal" if causal else "")
    cls = "".join(part.capitalize() for part in name.split("_"))
    return Workload(name, f"attention_{layout}", "composite", (B, L, D),
                    (_heads_input(HEADS), _heads_input(kv), _heads_input(kv)),
                    lambda p: op_module(cls, lambda self, q, k, v: fn(q, k, v, causal, kv)),
                    description=f"{layout.upper()} attention ({style}), causal={causal}")


class ProjectedAttention(nn.Module):
    """Multi-head self-attention with q/k/v/o projections; `kv_heads` < heads gives MQA/GQA."""

    def __init__(self, dim: int, heads: int, kv_heads: int, causal: bool):
        super().__init__()
        self.heads, self.kv_heads, self.causal = heads, kv_heads, causal
        self.head_dim = dim // heads
        self.q = nn.Linear(dim, dim, bias=False)
        self.k = nn.Linear(dim, kv_heads * self.head_dim, bias=False)
        self.v = nn.Linear(dim, kv_heads * self.head_dim, bias=False)
        self.o = nn.Linear(dim, dim)

    def forward(self, x):
        b, n, _ = x.shape
        q = self.q(x).view(b, n, self.heads, self.head_dim).transpose(1, 2)
        k = self.k(x).view(b, n, self.kv_heads, self.head_dim).transpose(1, 2)
        v = self.v(x).view(b, n, self.kv_heads, self.head_dim).transpose(1, 2)
        y = sdpa_attention(q, k, v, self.causal, self.kv_heads)
        return self.o(y.transpose(1, 2).reshape(b, n, -1))


def _projected(layout, causal):
    name = f"self_attention_{layout}_projected" + ("_causal" if causal else "")
    return Workload(name, f"attention_{layout}", "composite", (B, L, D),
                    (Input(lambda p: (p["B"], p["L"], HEADS * p["D"])),),
                    lambda p: ProjectedAttention(HEADS * p["D"], HEADS, KV_HEADS[layout], causal),
                    description=f"{layout.upper()} self-attention with projections, causal={causal}")


class Mlp(nn.Module):
    def __init__(self, dim: int, hidden: int, act, layers: int = 2):
        super().__init__()
        sizes = [dim] + [hidden] * (layers - 1) + [dim]
        self.fcs = nn.ModuleList(nn.Linear(a, b) for a, b in zip(sizes, sizes[1:], strict=False))
        self.act = act

    def forward(self, x):
        for i, fc in enumerate(self.fcs):
            x = fc(x)
            if i < len(self.fcs) - 1:
                x = self.act(x)
        return x


class SwiGlu(nn.Module):
    def __init__(self, dim: int, hidden: int):
        super().__init__()
        self.gate = nn.Linear(dim, hidden, bias=False)
        self.up = nn.Linear(dim, hidden, bias=False)
        self.down = nn.Linear(hidden, dim, bias=False)

    def forward(self, x):
        return self.down(F.silu(self.gate(x)) * self.up(x))


class ResidualMlp(nn.Module):
    def __init__(self, dim: int, hidden: int):
        super().__init__()
        self.norm = nn.LayerNorm(dim)
        self.mlp = Mlp(dim, hidden, F.gelu)

    def forward(self, x):
        return x + self.mlp(self.norm(x))


class TransformerBlock(nn.Module):
    """Pre-norm (or post-norm) encoder/decoder block; `llama=True` uses RMSNorm, GQA and SwiGLU."""

    def __init__(self, dim: int, causal: bool, pre_norm: bool = True, llama: bool = False):
        super().__init__()
        norm = nn.RMSNorm if llama else nn.LayerNorm
        self.n1, self.n2 = norm(dim), norm(dim)
        self.attn = ProjectedAttention(dim, HEADS, 2 if llama else HEADS, causal)
        self.mlp = SwiGlu(dim, 2 * dim) if llama else Mlp(dim, 2 * dim, F.gelu)
        self.pre_norm = pre_norm

    def forward(self, x):
        if self.pre_norm:
            x = x + self.attn(self.n1(x))
            return x + self.mlp(self.n2(x))
        x = self.n1(x + self.attn(x))
        return self.n2(x + self.mlp(x))


def _seq(p):
    return (p["B"], p["L"], HEADS * p["D"])


def _block(name, family, make):
    return Workload(name, family, "composite", (B, L, D), (Input(_seq),), make)


def _mlp_workloads():
    dim = lambda p: HEADS * p["D"]  # noqa: E731
    return [
        _block("mlp2_relu", "mlp", lambda p: Mlp(dim(p), 2 * dim(p), torch.relu)),
        _block("mlp2_gelu", "mlp", lambda p: Mlp(dim(p), 2 * dim(p), F.gelu)),
        _block("mlp2_silu", "mlp", lambda p: Mlp(dim(p), 2 * dim(p), F.silu)),
        _block("mlp3_tanh", "mlp", lambda p: Mlp(dim(p), dim(p), torch.tanh, layers=3)),
        _block("mlp_swiglu", "mlp", lambda p: SwiGlu(dim(p), 2 * dim(p))),
        _block("mlp_residual_layernorm", "mlp", lambda p: ResidualMlp(dim(p), 2 * dim(p))),
        _block("transformer_prenorm", "transformer", lambda p: TransformerBlock(dim(p), False)),
        _block("transformer_prenorm_causal", "transformer", lambda p: TransformerBlock(dim(p), True)),
        _block("transformer_postnorm", "transformer", lambda p: TransformerBlock(dim(p), False, pre_norm=False)),
        _block("transformer_llama_causal", "transformer", lambda p: TransformerBlock(dim(p), True, llama=True)),
    ]


def attention_workloads() -> list[Workload]:
    found = [_bare_attention(layout, causal, style)
             for layout in KV_HEADS for causal in (False, True) for style in ("sdpa", "explicit")]
    found += [_projected(layout, causal) for layout in KV_HEADS for causal in (False, True)]
    return found + _mlp_workloads()
