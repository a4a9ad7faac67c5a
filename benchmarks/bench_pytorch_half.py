"""Where PyTorch's CPU kernels round in float16 and bfloat16 (docs/cli.md, "Half precision").

For each operator, PyTorch's half-precision result is compared with candidate computations done in
float64 on the same (half-precision) inputs and rounded where the candidate says; the figure is the
share of elements that differ. A candidate at 0 (or a few near-ties of float32's order) is what the
kernel computes. `R(x)` rounds to the half dtype; "once" is the exact result rounded once.

    .venv/bin/python benchmarks/bench_pytorch_half.py [--dtype float16] [--dtype bfloat16]
"""
from __future__ import annotations

import argparse

import torch
import torch.nn.functional as F

D = torch.float64


def share(result: torch.Tensor, candidate: torch.Tensor, dt) -> float:
    """The share of elements where PyTorch's `result` differs from `candidate` rounded to `dt`."""
    return float((result.double() != candidate.to(dt).double()).double().mean())


def rows(dt):
    def R(x):
        return x.to(dt).to(D)

    g = torch.Generator().manual_seed(0)

    def randn(*shape, scale=1.0):
        return (torch.randn(*shape, generator=g, dtype=D) * scale).to(dt)

    a, b, bias = randn(64, 512), randn(512, 64), randn(64)
    a6, b6, bias6 = a.double(), b.double(), bias.double()
    yield "matmul", {"once": share(a @ b, a6 @ b6, dt)}
    yield "addmm (bias)", {"bias in float32, once": share(torch.addmm(bias, a, b), bias6 + a6 @ b6, dt),
                           "rounded, then bias": share(torch.addmm(bias, a, b), R(a6 @ b6) + bias6, dt)}
    x, w, cb = randn(2, 32, 16, 16), randn(16, 32, 3, 3), randn(16)
    conv = F.conv2d(x, w, cb, padding=1)
    exact = F.conv2d(x.double(), w.double(), cb.double(), padding=1)
    yield "conv2d (bias)", {"once": share(conv, exact, dt),
                            "rounded, then bias": share(conv, R(exact - cb.double().view(1, -1, 1, 1))
                                                        + cb.double().view(1, -1, 1, 1), dt)}
    s = randn(64, 1000)
    yield "mean over 1000", {"once": share(s.mean(-1), s.double().mean(-1), dt),
                             "sum rounded, then /n": share(s.mean(-1), R(s.double().sum(-1)) / 1000, dt)}
    z = randn(64, 1000, scale=3.0)
    z6 = z.double()
    m = z6.amax(-1, keepdim=True)
    e = torch.exp(z6 - m)
    yield "softmax, last dim", {"once": share(torch.softmax(z, -1), e / e.sum(-1, keepdim=True), dt),
                                "exp rounded before the sum": share(torch.softmax(z, -1),
                                                                    R(e) / R(e).sum(-1, keepdim=True), dt)}
    z = randn(8, 300, 20, scale=3.0)
    z6 = z.double()
    m = z6.amax(1, keepdim=True)
    e = torch.exp(z6 - m)
    yield "softmax, middle dim", {"once": share(torch.softmax(z, 1), e / e.sum(1, keepdim=True), dt),
                                  "R(exp) / sum of exp": share(torch.softmax(z, 1), R(e) / e.sum(1, keepdim=True), dt)}
    x, w, b = randn(64, 768), randn(768), randn(768)
    x6, w6, b6 = x.double(), w.double(), b.double()
    mu, var = x6.mean(-1, keepdim=True), x6.var(-1, unbiased=False, keepdim=True)
    ln = F.layer_norm(x, (768,), w, b)
    yield "layer_norm", {"once": share(ln, F.layer_norm(x6, (768,), w6, b6), dt),
                         "statistics rounded": share(ln, (x6 - R(mu)) / torch.sqrt(R(var) + 1e-5) * w6 + b6, dt)}
    rms = F.rms_norm(x, (768,), w)
    yield "rms_norm (eps=None)", {
        "once, float32's eps": share(rms, F.rms_norm(x6, (768,), w6, torch.finfo(torch.float32).eps), dt),
        "once, the half dtype's eps": share(rms, F.rms_norm(x6, (768,), w6, torch.finfo(dt).eps), dt)}
    xg, wg, bg = randn(4, 32, 14, 14), randn(32), randn(32)
    x6 = xg.double()
    mu, var = x6.mean((2, 3), keepdim=True), x6.var((2, 3), unbiased=False, keepdim=True)
    w6, b6 = wg.double().view(1, -1, 1, 1), bg.double().view(1, -1, 1, 1)
    out = F.instance_norm(xg, weight=wg, bias=bg)
    inv = 1 / torch.sqrt(var + 1e-5)
    yield "instance_norm", {"once": share(out, (x6 - mu) * inv * w6 + b6, dt),
                            "mean and 1/std rounded": share(out, (x6 - R(mu)) * R(inv) * w6 + b6, dt)}
    x6 = x.double()
    m = x6.amax(-1, keepdim=True)
    yield "logsumexp", {"once": share(torch.logsumexp(x, -1), torch.logsumexp(x6, -1), dt),
                        "each op rounded": share(torch.logsumexp(x, -1),
                                                 R(torch.log(R(R(torch.exp(R(x6 - m))).sum(-1)))) + m.squeeze(-1), dt)}
    q, k, v = randn(2, 4, 128, 64), randn(2, 4, 128, 64), randn(2, 4, 128, 64)
    att = F.scaled_dot_product_attention(q, k, v)
    ref = F.scaled_dot_product_attention(q.double(), k.double(), v.double())
    yield "scaled_dot_product_attention", {"once": share(att, ref, dt),
                                           "max abs error vs float64": float((att.double() - ref).abs().max())}
    hits = {"once": 0, "each term rounded": 0}
    for _ in range(200):
        p, t = randn(37, 53), randn(37, 53)
        got = F.mse_loss(p, t).double()
        terms = F.mse_loss(p.double(), t.double(), reduction="none")
        hits["once"] += int(bool(got == R(terms.mean())))
        hits["each term rounded"] += int(bool(got == R(R(terms).mean())))
    yield "mse_loss (200 draws, share equal)", {k_: n / 200 for k_, n in hits.items()}


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--dtype", action="append", help="float16 and/or bfloat16 (both by default)")
    args = ap.parse_args(argv)
    torch.set_num_threads(1)
    for name in args.dtype or ["float16", "bfloat16"]:
        dt = getattr(torch, name)
        print(f"== {name} (torch {torch.__version__}, share of elements that differ from each candidate)")
        for op, figures in rows(dt):
            print(f"  {op:36s} " + "; ".join(f"{k}: {val:.4g}" for k, val in figures.items()))


if __name__ == "__main__":
    main()
