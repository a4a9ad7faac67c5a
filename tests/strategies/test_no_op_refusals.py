"""Steps that cannot help are never proposed (issue 24): each refusal with its reason, and the same
step still made where it can help."""
from __future__ import annotations

import json
from dataclasses import replace

import pytest
from strategy_cases import ctx, results, sig

from strategies.base import Illegal, LoopAt, Site
from strategies.registry import get

MM_SIG = sig(("A", [1, 6], "float64", "input"), ("C", [6, 8], "float64", "input"), ("D", [1, 8], "float64", "output"))
# a row vector times a matrix: the bound loop over rows has extent 1
ROW = "B^{1}_{tx=0}L^{8}_{a=0}L^{6}_{c=0}[D^{f64,g}_{tx,a}=D^{f64,g}_{tx,a}+A^{f64,g}_{tx,c}*C^{f64,g}_{c,a};];"
ONE = "L^{1}_{d=0}L^{8}_{a=0}[D^{f64,g}_{d,a}=A^{f64,g}_{d,0}+C^{f64,g}_{0,a};];"
ONE_SIG = sig(("A", [1, 6], "float64", "input"), ("C", [6, 8], "float64", "input"), ("D", [1, 8], "float64", "output"))


def rewrite(strategy, text, signature, site, params, target="llvm"):
    return get(strategy).rewrite(ctx(text, signature, target), site, params)


@pytest.mark.parametrize("strategy, params, target, what", [
    ("loop_parallelization", {}, "llvm", "parallel"),
    ("loop_unrolling", {}, "llvm", "unrolled"),
    ("loop_vectorization", {}, "llvm", "vector"),
    ("loop_binding", {"axis": "ty"}, "cuda", "bound"),
])
def test_a_loop_of_one_iteration_is_never_scheduled(strategy, params, target, what):
    site = Site(0, loops=("d",), match=LoopAt(0))
    with pytest.raises(Illegal, match=f"d runs one iteration: a {what} loop of one iteration changes nothing"):
        rewrite(strategy, ONE, ONE_SIG, site, params, target)
    assert not [r for r in results(strategy, ONE, ONE_SIG, target) if not r.startswith("L^{1}_{d=0}")]


def test_the_extent_one_bound_loop_of_an_original_is_not_parallelised_but_its_other_loops_are():
    out = results("loop_parallelization", ROW, MM_SIG)
    assert out == ["B^{1}_{tx=0}P^{8}_{a=0}L^{6}_{c=0}[D^{f64,g}_{tx,a}=D^{f64,g}_{tx,a}+A^{f64,g}_{tx,c}*C^{f64,g}_{c,a};];"]


def test_reordering_only_loops_of_one_iteration_is_refused():
    site = Site(0, loops=("tx", "a", "c"))
    with pytest.raises(Illegal, match="only loops of one iteration change places"):
        rewrite("loop_reorder", ROW, MM_SIG, site, {"swap": ["tx", "a"]})
    with pytest.raises(Illegal, match="only loops of one iteration change places"):
        rewrite("loop_reorder", ROW, MM_SIG, site, {"move": "tx", "to": 2})
    moved = results("loop_reorder", ROW, MM_SIG)
    assert moved and all(r.index("_{c=0}") < r.index("_{a=0}") for r in moved)  # only a <-> c remains


@pytest.mark.parametrize("params", [{"factor": 1}, {"factor": 8}])
def test_a_split_by_one_or_by_the_whole_extent_is_refused(params):
    with pytest.raises(Illegal, match="is not a proper divisor of the extent 8"):
        rewrite("loop_split", ROW, MM_SIG, Site(0, loops=("a",), match=LoopAt(1)), params)


def test_a_tile_of_a_whole_extent_is_refused():
    with pytest.raises(Illegal, match="proper divisors"):
        rewrite("loop_tiling", ROW, MM_SIG, Site(0, loops=("a", "c"), match=LoopAt(1)), {"factors": [8, 2]})


CACHE_SIG = sig(("A", [4, 6], "float64", "input"), ("C", [4, 6], "float64", "output"))
NO_REUSE = "B^{4}_{tx=0}L^{1}_{c=0}L^{6}_{a=0}[C^{f64,g}_{tx,a}=A^{f64,g}_{tx,a}*2;];"


def test_a_cache_read_whose_copy_is_read_once_is_refused():
    with pytest.raises(Illegal, match="each element copied from A would be read once"):
        rewrite("cache_read_write", NO_REUSE, CACHE_SIG, Site(0, loops=("tx", "c", "a")), {"read": "A", "depth": 1})


RED_SIG = sig(("A", [4, 6], "float64", "input"), ("D", [4], "float64", "output"))
RED = "B^{4}_{tx=0}L^{6}_{c=0}[D^{f64,g}_{tx}=D^{f64,g}_{tx}+A^{f64,g}_{tx,c};];"


def test_rfactor_into_global_partials_inside_serial_loops_is_refused_on_the_cpu_only():
    site = Site(0, loops=("c",), stmts=(0,), tensors=("D",), match=LoopAt(1))
    with pytest.raises(Illegal, match="global tensor of 8 elements inside serial loops"):
        rewrite("reduction_factorization", RED, RED_SIG, site, {"factor": 2})
    assert results("reduction_factorization", RED, RED_SIG) == []
    assert len(results("reduction_factorization", RED, RED_SIG, "cuda")) == 2
    # with a parallel spatial loop the partials of different rows are written side by side in parallel
    parallel = "P^{4}_{d=0}L^{6}_{c=0}[D^{f64,g}_{d}=D^{f64,g}_{d}+A^{f64,g}_{d,c};];"
    assert len(results("reduction_factorization", parallel, RED_SIG)) == 2


def test_a_relaid_copy_of_an_input_read_once_per_element_is_refused():
    sig2 = sig(("A", [4, 6], "float64", "input"), ("C", [6, 4], "float64", "output"))
    once = "B^{6}_{tx=0}L^{4}_{a=0}[C^{f64,g}_{tx,a}=A^{f64,g}_{a,tx};];"
    from strategies.rules.memory.layout import InputCopy

    with pytest.raises(Illegal, match="each element copied from A would be read once"):
        rewrite("layout_transformation", once, sig2, Site(0, tensors=("A",), match=InputCopy()), {"copy": "transposed"})


# A row-wise softmax-sized nest: 64 rows of 256 columns, and the same rows in a batch of 4 starts.
WIDE_SIG = sig(("A", [4, 64, 256], "float64", "input"), ("D", [4, 64, 256], "float64", "output"))
WIDE = "L^{4}_{b=0}L^{64}_{a=0}L^{256}_{c=0}[D^{f64,g}_{b,a,c}=A^{f64,g}_{b,a,c}*2;];"


def parallel_loops(text: str, signature, minimum: int) -> list[str]:
    context = replace(ctx(text, signature), min_parallel_work=minimum)
    return [t.site.loops[0] for t in get("loop_parallelization").transformations(context)]


def test_a_parallel_loop_whose_start_shares_too_little_work_is_refused_under_the_pipelines_bound():
    # b shares 4*64*256 = 65,536 iterations in one start; a 64*256 = 16,384 in each of 4 starts;
    # c only 256 in each of 256 starts
    assert parallel_loops(WIDE, WIDE_SIG, 0) == ["b", "a", "c"]  # the toolchain's contexts: no bound
    assert parallel_loops(WIDE, WIDE_SIG, 8192) == ["b", "a"]
    assert parallel_loops(WIDE, WIDE_SIG, 20000) == ["b"]
    site = Site(0, loops=("c",), match=LoopAt(2))
    with pytest.raises(Illegal, match="c would be a parallel loop started 256 times inside serial loops, each "
                                      "start sharing only 256 innermost iterations among the cores: below 8192"):
        get("loop_parallelization").rewrite(replace(ctx(WIDE, WIDE_SIG), min_parallel_work=8192), site, {})


def test_the_default_and_release_profiles_bound_parallel_work_and_the_transform_reads_it():
    from flows.config import load_params
    from flows.transform import transform_shard
    from strategies.analysis.legality import MIN_PARALLEL_WORK

    for profile in ("default", "release"):
        assert load_params(profile=profile).profile["min_parallel_work"] == MIN_PARALLEL_WORK
    program = {"program_id": "p", "leir": WIDE, "signature": WIDE_SIG.dumps(), "verification_status": "exact",
               "target": "llvm"}
    steps = transform_shard([program], load_params(profile="default"))
    parallel = sorted(json.loads(s["site"])["loops"][0] for s in steps if s["strategy"] == "loop_parallelization")
    assert parallel == ["a", "b"]
