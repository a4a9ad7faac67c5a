"""The strategy framework: registry, records, alpha-equivalence rejection, CoT format."""
from __future__ import annotations

import json
import re

import pytest
from strategy_cases import assert_golden, ctx, sig

from strategies.base import Illegal, Rewrite, Site, Strategy
from strategies.cot import answer, multi_answer, prompt
from strategies.registry import ALL_NAMES, LEVEL_OF, STRATEGY_NAMES, get, register

MATMUL_SIG = sig(("A", [4, 6], "float64", "input"), ("C", [6, 5], "float64", "input"), ("D", [4, 5], "float64", "output"))
MATMUL = "B^{4}_{tx=0}L^{5}_{a=0}L^{6}_{c=0}[D^{f64,g}_{tx,a}=D^{f64,g}_{tx,a}+A^{f64,g}_{tx,c}*C^{f64,g}_{c,a};];"


def test_the_43_published_names_by_level():
    assert [len(STRATEGY_NAMES[lv]) for lv in ("graph", "operator", "memory", "mathematical")] == [9, 9, 5, 20]
    assert len(set(ALL_NAMES)) == 43 and LEVEL_OF["online_softmax"] == "mathematical"


def test_register_rejects_unknown_names_and_wrong_levels():
    class Bogus(Strategy):
        name, level, exactness, description = "loop_magic", "operator", "exact", ""

    class WrongLevel(Strategy):
        name, level, exactness, description = "loop_split", "graph", "exact", ""

    with pytest.raises(ValueError, match="not one of the 43"):
        register(Bogus)
    with pytest.raises(ValueError, match="the published data says 'operator'"):
        register(WrongLevel)
    with pytest.raises(KeyError, match="unknown strategy"):
        get("loop_magic")


def test_alpha_equivalent_results_are_not_transformations():
    class Renamer(Strategy):  # not registered: renames the loop index only
        name, level, exactness, description = "loop_split", "operator", "exact", ""

        def sites(self, c):
            yield Site(0)

        def rewrite(self, c, site, params):
            from strategies.analysis.tree import rename_vars_in_nest
            return Rewrite(c.program.__class__((rename_vars_in_nest(c.program.nests[0], {"c": "k"}),)))

    assert list(Renamer().transformations(ctx(MATMUL, MATMUL_SIG))) == []


def test_the_target_belongs_to_the_program_never_to_the_strategy():
    """Issue 25: binding only on a GPU program, P and V loops only on a CPU program, every other
    strategy on both; no strategy switches the program's target."""
    from strategies.registry import registered

    only = {s.name: s.targets for s in registered() if s.targets != ("llvm", "cuda")}
    assert only == {"loop_parallelization": ("llvm",), "loop_vectorization": ("llvm",), "loop_binding": ("cuda",)}
    assert get("loop_binding").needs_gpu and not get("loop_split").needs_gpu
    cpu, gpu = ctx(MATMUL, MATMUL_SIG), ctx(MATMUL, MATMUL_SIG, "cuda")
    # a is independent: bound on the GPU program, parallel on the CPU one, never the other way round
    assert list(get("loop_binding").transformations(cpu)) == [] and get("loop_binding").legal_sites(cpu) == []
    assert list(get("loop_binding").transformations(gpu))
    assert list(get("loop_parallelization").transformations(cpu))
    assert list(get("loop_parallelization").transformations(gpu)) == []
    assert get("loop_parallelization").legal_sites(gpu) == []
    site = next(iter(get("loop_binding").sites(gpu)))
    assert get("loop_binding").apply(cpu, site, {"axis": "ty"}) is None
    assert get("loop_binding").apply(gpu, site, {"axis": "ty"}) is not None
    # the others are offered on both targets
    assert list(get("loop_split").transformations(cpu)) and list(get("loop_split").transformations(gpu))


def test_illegal_rewrites_are_skipped():
    class Never(Strategy):
        name, level, exactness, description = "loop_split", "operator", "exact", ""

        def sites(self, c):
            yield Site(0)

        def rewrite(self, c, site, params):
            raise Illegal("never")

    assert list(Never().transformations(ctx(MATMUL, MATMUL_SIG))) == []


def test_cot_answer_has_the_published_format_and_quotes_the_transition():
    t = next(get("loop_parallelization").transformations(ctx(MATMUL, MATMUL_SIG)))
    text = answer(t)
    m = re.fullmatch(r"<think>(.*)</think><answer>(.*)</answer>", text, re.S)
    assert m
    body = json.loads(m.group(2))
    assert body == {"transformed_IR": t.after_text, "applied_strategy": "loop_parallelization"}
    think = m.group(1)
    assert "Legality checked:" in think and "nest 1: " + MATMUL in think and "nest 1: " + t.after_text in think
    multi = multi_answer([t, t])
    items = json.loads(re.search(r"<answer>(.*)</answer>", multi, re.S).group(1))
    assert [i["idx"] for i in items] == [1, 2]
    p = prompt(t.before, MATMUL_SIG)
    assert "'A' with the dtype torch.float64 and shape torch.Size([4, 6])" in p and MATMUL in p


def test_loop_parallelization_golden():
    assert_golden("loop_parallelization", MATMUL,
                  ["P^{4}_{d=0}L^{5}_{a=0}L^{6}_{c=0}[D^{f64,g}_{d,a}=D^{f64,g}_{d,a}+A^{f64,g}_{d,c}*C^{f64,g}_{c,a};];",
                   "B^{4}_{tx=0}P^{5}_{a=0}L^{6}_{c=0}[D^{f64,g}_{tx,a}=D^{f64,g}_{tx,a}+A^{f64,g}_{tx,c}*C^{f64,g}_{c,a};];"],
                  MATMUL_SIG)


def test_loop_parallelization_refuses_reductions_scans_and_nested_parallelism():
    scan_sig = sig(("A", [2, 5], "float64", "input"), ("C", [2, 5], "float64", "output"))
    scan = "B^{2}_{tx=0}L^{5}_{a=0}[C^{f64,g}_{tx,a}=max(if_then_else(a-1<0,-inf,C^{f64,g}_{tx,a-1}),A^{f64,g}_{tx,a});];"
    # a carries the scan; the rows (tx, serial on the CPU) are independent
    assert_golden("loop_parallelization", scan, [
        "P^{2}_{c=0}L^{5}_{a=0}[C^{f64,g}_{c,a}=max(if_then_else(a-1<0,-inf,C^{f64,g}_{c,a-1}),A^{f64,g}_{c,a});];"],
        scan_sig)
    assert_golden("loop_parallelization", scan, [], scan_sig, "cuda")
    nested = "B^{4}_{tx=0}P^{5}_{a=0}L^{6}_{c=0}[D^{f64,g}_{tx,a}=D^{f64,g}_{tx,a}+A^{f64,g}_{tx,c}*C^{f64,g}_{c,a};];"
    assert_golden("loop_parallelization", nested, [], MATMUL_SIG)  # c is a reduction axis; a already P


def test_sites_are_hashable_typed_matches_with_the_published_json():
    """A site carries what its strategy found (`Site.match`, frozen and hashable); its JSON keeps the
    keys of the released steps: the position, then the match's own keys."""
    from strategies.base import LoopAt, Nests

    c = ctx(MATMUL, MATMUL_SIG)
    for strategy in ("loop_split", "operator_fission", "reduction_factorization", "cache_read_write"):
        for site in get(strategy).sites(c):
            assert hash(site) == hash(Site(**{f: getattr(site, f) for f in Site.__slots__}))
    split = next(iter(get("loop_split").sites(c)))
    assert split.match == LoopAt(0)
    assert json.dumps(split.to_json()) == '{"nest": 0, "loops": ["tx"], "loop_index": 0}'
    fused = Site(1, tensors=("D",), match=Nests((1, 2)))
    assert json.dumps(fused.to_json()) == '{"nest": 1, "tensors": ["D"], "nests": [1, 2]}'
    assert len({split, split, fused}) == 2
