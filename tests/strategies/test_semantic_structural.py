"""Semantic tests of the graph, loop and memory strategies: every application on the example programs
(tests/data/programs.jsonl plus a few of our own) validates clean and verifies through TVM as its
strategy declares (`exact`: bitwise equal; `reassociating`: exact or close).

The default run checks a representative subset (the first applications per strategy and program);
`-m slow` checks every application. Each strategy must also have a site on the originals or on the
output of one earlier step (issue 5)."""
from __future__ import annotations

import json
from functools import cache
from pathlib import Path

import pytest

from leir import Signature, parse_program
from leir.validate import validate
from strategies.base import Context
from strategies.registry import get

GRAPH = ("operator_fusion", "operator_fission", "compute_inline", "expression_splitting",
         "common_subexpression_elimination", "dead_code_elimination", "expression_reorder")
OPERATOR = ("loop_reorder", "loop_tiling", "loop_split", "loop_fusion", "loop_unrolling", "loop_parallelization",
            "loop_vectorization", "loop_binding", "reduction_factorization")
MEMORY = ("cache_read_write", "layout_transformation", "set_storage_scope", "set_storage_layout",
          "precompute_indices")
STRATEGIES = GRAPH + OPERATOR + MEMORY
DATA = Path(__file__).resolve().parents[1] / "data" / "programs.jsonl"

OWN = [
    {"name": "elementwise_chain", "leir":
        "B^{4}_{tx=0}L^{8}_{a=0}[D^{f64,g}_{tx,a}=A^{f64,g}_{tx,a}-1;];"
        "B^{4}_{tx=0}L^{8}_{a=0}[C^{f64,g}_{tx,a}=D^{f64,g}_{tx,a}+exp(D^{f64,g}_{tx,a});];",
     "signature": {"tensors": [{"name": "A", "shape": [4, 8], "dtype": "float64", "role": "input"},
                               {"name": "C", "shape": [4, 8], "dtype": "float64", "role": "output"}]}},
    {"name": "two_reduction_axes", "leir":
        "B^{2}_{tx=0}L^{4}_{a=0}L^{2}_{g=0}L^{3}_{h=0}[D^{f32,g}_{tx,a}=D^{f32,g}_{tx,a}+A^{f32,g}_{g,a+h}*C^{f32,g}_{g,h};];",
     "signature": {"tensors": [{"name": "A", "shape": [2, 6], "dtype": "float32", "role": "input"},
                               {"name": "C", "shape": [2, 3], "dtype": "float32", "role": "input"},
                               {"name": "D", "shape": [2, 4], "dtype": "float32", "role": "output"}]}},
    {"name": "nested_rows", "leir":
        "B^{4}_{tx=0}[L^{8}_{a=0}[D^{f32,g}_{tx}=D^{f32,g}_{tx}+A^{f32,g}_{tx,a};];"
        "L^{8}_{a=0}[C^{f32,g}_{tx,a}=A^{f32,g}_{tx,a}-D^{f32,g}_{tx}/8;];];",
     "signature": {"tensors": [{"name": "A", "shape": [4, 8], "dtype": "float32", "role": "input"},
                               {"name": "C", "shape": [4, 8], "dtype": "float32", "role": "output"}]}},
]


@cache
def programs() -> list[dict]:
    return [json.loads(line) for line in DATA.read_text().splitlines() if line.strip()] + OWN


def contexts(target: str = "llvm") -> list[tuple[str, Context]]:
    return [(p["name"], Context(parse_program(p["leir"]), Signature.from_json(p["signature"]), target))
            for p in programs()]


def check(strategy: str, per_program: int | None) -> tuple[int, list[str]]:
    """(applications verified, failures) for one strategy over every program."""
    from gpu_tasks.verify import verify_pair

    st = get(strategy)
    target = "cuda" if strategy == "loop_binding" else "llvm"   # binding applies only to GPU programs;
    done, bad = 0, []                                           # B loops run serially on the CPU
    for name, ctx in contexts(target):
        for t in list(st.transformations(ctx))[:per_program]:
            problems = validate(t.after, ctx.signature)
            if problems:
                bad.append(f"{name} {t.params}: invalid: {problems[0]}")
                continue
            r = verify_pair(t.before, t.after, ctx.signature)
            allowed = ("exact",) if t.exactness == "exact" else ("exact", "close")  # per variant (fast_exp)
            if r.status not in allowed:
                bad.append(f"{name} {t.params}: {r.status} {r.error_message or ''}: {t.after_text}")
            done += 1
    return done, bad


@pytest.mark.parametrize("strategy", STRATEGIES)
def test_applications_verify_as_declared_subset(strategy):
    pytest.importorskip("tvm")
    done, bad = check(strategy, per_program=1)
    assert not bad, "\n".join(bad)


@pytest.mark.slow
@pytest.mark.parametrize("strategy", STRATEGIES)
def test_every_application_verifies_as_declared(strategy):
    pytest.importorskip("tvm")
    done, bad = check(strategy, per_program=None)
    assert not bad, "\n".join(bad)


@pytest.mark.parametrize("strategy", STRATEGIES)
def test_every_strategy_has_a_site_on_the_examples_or_after_one_step(strategy):
    st = get(strategy)
    target = "cuda" if strategy == "loop_binding" else "llvm"
    examples = contexts(target)[:12]
    if any(st.legal_sites(ctx) for _, ctx in examples):
        return
    for _, ctx in examples:
        for first in STRATEGIES:
            for t in list(get(first).transformations(ctx))[:4]:
                if st.legal_sites(ctx.with_program(t.after)):
                    return
    pytest.fail(f"{strategy} has no site on the 12 examples, nor after one step")


@pytest.mark.parametrize("strategy", STRATEGIES)
def test_enumeration_is_deterministic_and_every_record_has_facts_and_summary(strategy):
    st = get(strategy)
    for _, ctx in contexts("cuda" if strategy == "loop_binding" else "llvm"):
        first = [(t.site, t.params_json(), t.after_text) for t in st.transformations(ctx)]
        again = [(t.site, t.params_json(), t.after_text) for t in st.transformations(ctx.with_program(ctx.program))]
        assert first == again
        for t in st.transformations(ctx):
            assert t.facts and t.summary, (strategy, t.params)
