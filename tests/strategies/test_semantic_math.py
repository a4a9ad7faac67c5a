"""Semantic test of the 20 mathematical strategies: every application, on the catalogue examples and
on programs written so that each strategy has sites, verifies through the verifier as `exact` or
`close` (an `exact` strategy must stay bitwise identical), and every one of the 20 has a site."""
from __future__ import annotations

import json
from collections import Counter
from pathlib import Path

import pytest
from strategy_cases import ctx

from leir import Signature
from strategies.registry import STRATEGY_NAMES, get

MATH = STRATEGY_NAMES["mathematical"]
DATA = Path(__file__).parent.parent / "data" / "programs.jsonl"


def _sig(*tensors) -> dict:
    return {"tensors": [{"name": n, "shape": s, "dtype": d, "role": r} for n, s, d, r in tensors]}


def _pointwise(rhs: str, dtype: str = "float64") -> dict:
    """One statement D_{tx,a} = rhs; in `rhs`, A and C stand for A_{tx,a}, C_{tx,a}, and B for A_{tx,a+1}."""
    code = {"float64": "f64", "float32": "f32"}[dtype]
    rhs = "".join({"A": f"A^{{{code},g}}_{{tx,a}}", "B": f"A^{{{code},g}}_{{tx,a+1}}",
                   "C": f"C^{{{code},g}}_{{tx,a}}"}.get(ch, ch) for ch in rhs)
    return {"leir": f"B^{{4}}_{{tx=0}}L^{{7}}_{{a=0}}[D^{{{code},g}}_{{tx,a}}={rhs};];",
            "signature": _sig(("A", [4, 8], dtype, "input"), ("C", [4, 7], dtype, "input"),
                              ("D", [4, 7], dtype, "output"))}


ATTENTION = {
    "leir": ("B^{4}_{tx=0}L^{6}_{a=0}L^{3}_{c=0}[E^{f64,g}_{tx,a}=E^{f64,g}_{tx,a}+A^{f64,g}_{tx,c}*C^{f64,g}_{a,c};];"
             "B^{4}_{tx=0}L^{6}_{a=0}[F^{f64,g}_{tx}=max(F^{f64,g}_{tx},E^{f64,g}_{tx,a});];"
             "B^{4}_{tx=0}L^{6}_{a=0}[G^{f64,g}_{tx}=G^{f64,g}_{tx}+exp(E^{f64,g}_{tx,a}-F^{f64,g}_{tx});];"
             "B^{4}_{tx=0}L^{6}_{a=0}[H^{f64,g}_{tx,a}=exp(E^{f64,g}_{tx,a}-F^{f64,g}_{tx})/G^{f64,g}_{tx};];"
             "B^{4}_{tx=0}L^{5}_{c=0}L^{6}_{a=0}[I^{f64,g}_{tx,c}=I^{f64,g}_{tx,c}+H^{f64,g}_{tx,a}*D^{f64,g}_{a,c};];"),
    "signature": _sig(("A", [4, 3], "float64", "input"), ("C", [6, 3], "float64", "input"),
                      ("D", [6, 5], "float64", "input"), ("I", [4, 5], "float64", "output")),
}
# Softmax after a cache step: the max reads a copy F of A, the sum reads A itself.
CACHED_SOFTMAX = {
    "leir": ("B^{4}_{tx=0}L^{8}_{a=0}[F^{f32,g}_{tx,a}=A^{f32,g}_{tx,a};];"
             "B^{4}_{tx=0}L^{8}_{a=0}[D^{f32,g}_{tx}=max(D^{f32,g}_{tx},F^{f32,g}_{tx,a});];"
             "B^{4}_{tx=0}L^{8}_{a=0}[E^{f32,g}_{tx}=E^{f32,g}_{tx}+exp(A^{f32,g}_{tx,a}-D^{f32,g}_{tx});];"
             "B^{4}_{tx=0}L^{8}_{a=0}[C^{f32,g}_{tx,a}=exp(A^{f32,g}_{tx,a}-D^{f32,g}_{tx})/E^{f32,g}_{tx};];"),
    "signature": _sig(("A", [4, 8], "float32", "input"), ("C", [4, 8], "float32", "output")),
}
# Sums with an invariant factor and an invariant term (the splits).
ROW_SUMS = {
    "leir": ("B^{4}_{tx=0}L^{8}_{a=0}[D^{f64,g}_{tx}=D^{f64,g}_{tx}+C^{f64,g}_{tx}*A^{f64,g}_{tx,a};];"
             "B^{4}_{tx=0}L^{8}_{a=0}[E^{f64,g}_{tx}=E^{f64,g}_{tx}+(A^{f64,g}_{tx,a}*A^{f64,g}_{tx,a}+C^{f64,g}_{tx});];"
             "B^{4}_{tx=0}[F^{f64,g}_{tx}=D^{f64,g}_{tx}*E^{f64,g}_{tx};];"),
    "signature": _sig(("A", [4, 8], "float64", "input"), ("C", [4], "float64", "input"),
                      ("F", [4], "float64", "output")),
}

# Reductions over a kept dimension (M_{tx,0}), as the translator writes x.sum(dim=1) and logsumexp.
KEPT_DIM = {
    "leir": ("B^{4}_{tx=0}L^{8}_{a=0}[M^{f64,g}_{tx,0}=M^{f64,g}_{tx,0}+(1+A^{f64,g}_{tx,a}-exp(A^{f64,g}_{tx,a}));];"
             "B^{4}_{tx=0}L^{8}_{a=0}[E^{f64,g}_{tx,0}=max(E^{f64,g}_{tx,0},A^{f64,g}_{tx,a});];"
             "B^{4}_{tx=0}L^{8}_{a=0}[F^{f64,g}_{tx,0}=F^{f64,g}_{tx,0}+exp(A^{f64,g}_{tx,a}-E^{f64,g}_{tx,0});];"
             "B^{4}_{tx=0}[D^{f64,g}_{tx}=log(F^{f64,g}_{tx,0})+E^{f64,g}_{tx,0}-0.5*M^{f64,g}_{tx,0};];"),
    "signature": _sig(("A", [4, 8], "float64", "input"), ("D", [4], "float64", "output")),
}

OWN_PROGRAMS = {
    "factor": _pointwise("A*A+A*C"),
    "square": _pointwise("A**2+2*A*C+C**2"),
    "neighbours": _pointwise("A*B+A*A-C*B"),
    "product": _pointwise("(A+C)*(B-C)"),
    "fraction": _pointwise("(A*A-C*C)/(A+C+10)"),
    "split_fraction": _pointwise("(A+C)/(1+C*C)"),
    "partial": _pointwise("(A*A+1)/(A*A+3)"),
    "sum_of_fractions": _pointwise("A/(C*C+1)+C/(A*A+2)"),
    "powers": _pointwise("exp(A)*exp(C)+A**2*A**3"),
    "exp_sum": _pointwise("exp(A+C)/(1+exp(-A))"),
    "logs": _pointwise("log(exp(A)*(C*C+1))+log(2*exp(C))"),
    "log_sum": _pointwise("log(A*A+1)+log(C*C+1)"),
    "collect": _pointwise("A*C+A*B+C*B"),
    "attention": ATTENTION,
    "cached_softmax": CACHED_SOFTMAX,
    "row_sums": ROW_SUMS,
    "kept_dim": KEPT_DIM,
}


def programs() -> dict[str, dict]:
    out = {}
    for line in DATA.read_text().splitlines():
        if line.strip():
            d = json.loads(line)
            out[d["name"]] = {"leir": d["leir"], "signature": d["signature"]}
    out.update(OWN_PROGRAMS)
    return out


def applications(limit: int | None = None):
    """(strategy, program name, transformation) for every application, in a fixed order."""
    for prog_name, d in programs().items():
        c = ctx(d["leir"], Signature.from_json(d["signature"]))
        for name in MATH:
            for t in get(name).transformations(c, limit=limit):
                yield name, prog_name, d, t


def _verify_all(limit: int | None, draws: int):
    from gpu_tasks.verify import verify_pair

    sites, applied, passed, failures = Counter(), Counter(), Counter(), []
    for name, prog_name, d, t in applications(limit):
        applied[name] += 1
        v = verify_pair(d["leir"], t.after_text, d["signature"], draws=draws)
        ok = v.status == "exact" if t.exactness == "exact" else v.status in ("exact", "close")
        if ok:
            passed[name] += 1
        else:
            failures.append(f"{name} on {prog_name}: {v.status} {v.error} {t.after_text}")
    for d in programs().values():
        c = ctx(d["leir"], Signature.from_json(d["signature"]))
        for name in MATH:
            sites[name] += len(get(name).legal_sites(c))
    return sites, applied, passed, failures


def test_every_mathematical_strategy_applies_and_verifies():
    pytest.importorskip("tvm")
    sites, applied, passed, failures = _verify_all(limit=2, draws=3)
    assert not failures, "\n".join(failures)
    assert [n for n in MATH if not applied[n]] == []


@pytest.mark.slow
def test_every_application_verifies_exhaustively():
    pytest.importorskip("tvm")
    sites, applied, passed, failures = _verify_all(limit=None, draws=6)
    report = {n: {"sites": sites[n], "applications": applied[n], "verified": passed[n]} for n in MATH}
    print(json.dumps(report, indent=1))
    assert not failures, "\n".join(failures)
