"""Memory-level strategies: golden before/expected tests and refusals where illegal."""
from __future__ import annotations

from strategy_cases import assert_golden, ctx, results, sig

from strategies.registry import get

S2 = sig(("A", [4, 8], "float64", "input"), ("C", [4, 8], "float64", "output"))
ONE = ("B^{4}_{tx=0}[L^{8}_{a=0}[D^{f64,g}_{tx,a}=exp(A^{f64,g}_{tx,a});];"
       "L^{8}_{a=0}[C^{f64,g}_{tx,a}=D^{f64,g}_{tx,a}*2;];];")
TWO = ("B^{4}_{tx=0}L^{8}_{a=0}[D^{f64,g}_{tx,a}=exp(A^{f64,g}_{tx,a});];"
       "B^{4}_{tx=0}L^{8}_{a=0}[C^{f64,g}_{tx,a}=D^{f64,g}_{tx,a}*2;];")
M_SIG = sig(("A", [4, 6], "float64", "input"), ("C", [6, 8], "float64", "input"), ("D", [4, 8], "float64", "output"))
MM = "B^{4}_{tx=0}L^{8}_{a=0}L^{6}_{c=0}[D^{f64,g}_{tx,a}=D^{f64,g}_{tx,a}+A^{f64,g}_{tx,c}*C^{f64,g}_{c,a};];"


def test_set_storage_scope_golden():
    assert_golden("set_storage_scope", ONE, [ONE.replace("D^{f64,g}", "D^{f64,s}"),
                                             ONE.replace("D^{f64,g}", "D^{f64,l}")], S2, "cuda")


def test_set_storage_scope_never_moves_known_or_cross_kernel_tensors():
    assert results("set_storage_scope", TWO, S2, "cuda") == []   # D crosses nests (kernels)
    assert results("set_storage_scope", MM, M_SIG, "cuda") == []  # only known tensors
    shared_row = ONE.replace("D^{f64,g}_{tx,a}", "D^{f64,g}_{a}")
    # every thread writes the same D_{a}: only a private (local) copy per thread is correct
    assert results("set_storage_scope", shared_row, S2, "cuda") == [shared_row.replace("D^{f64,g}", "D^{f64,l}")]


def test_cache_read_write_golden():
    assert_golden("cache_read_write", MM, [
        "B^{4}_{tx=0}[L^{6}_{c=0}[E^{f64,l}_{c}=A^{f64,g}_{tx,c};];"
        "L^{8}_{a=0}L^{6}_{c=0}[D^{f64,g}_{tx,a}=D^{f64,g}_{tx,a}+E^{f64,l}_{c}*C^{f64,g}_{c,a};];];",
        "B^{4}_{tx=0}L^{8}_{a=0}[E^{f64,l}=0;L^{6}_{c=0}[E^{f64,l}=E^{f64,l}+A^{f64,g}_{tx,c}*C^{f64,g}_{c,a};];"
        "D^{f64,g}_{tx,a}=E^{f64,l};];",
    ], M_SIG)


def test_cache_write_refuses_an_accumulation_onto_earlier_values():
    lin = MM + "B^{4}_{tx=0}L^{8}_{a=0}[D^{f64,g}_{tx,a}=D^{f64,g}_{tx,a}+A^{f64,g}_{tx,0};];"
    got = results("cache_read_write", lin, M_SIG)
    assert not any("D^{f64,g}_{tx,a}=E" in r.split(";B")[-1] for r in got if r.count("=0;") == 0)
    assert sum("=0;" in r for r in got) == 1  # only the first nest (implicitly initialised) is cached


def test_layout_transformation_golden():
    assert_golden("layout_transformation", TWO, [TWO.replace("D^{f64,g}_{tx,a}", "D^{f64,g}_{a,tx}")], S2)
    assert results("layout_transformation", MM, M_SIG) == []  # known tensors keep their layout


def test_set_storage_layout_golden():
    assert_golden("set_storage_layout", TWO, [TWO.replace("D^{f64,g}_{tx,a}", "D^{f64,g}_{tx*8+a}"),
                                              TWO.replace("D^{f64,g}_{tx,a}", "D^{f64,g}_{a*4+tx}")], S2)


def test_precompute_indices_golden_and_plain_subscripts():
    shift_sig = sig(("A", [4, 8], "float64", "input"), ("C", [4, 7], "float64", "output"))
    shift = "B^{4}_{tx=0}L^{7}_{a=0}[C^{f64,g}_{tx,a}=A^{f64,g}_{tx,a+1}-A^{f64,g}_{tx,a};];"
    assert_golden("precompute_indices", shift, [
        "L^{7}_{c=0}[D^{i64,g}_{c}=c+1;];"
        "B^{4}_{tx=0}L^{7}_{a=0}[C^{f64,g}_{tx,a}=A^{f64,g}_{tx,D^{i64,g}_{a}}-A^{f64,g}_{tx,a};];"], shift_sig)
    assert results("precompute_indices", MM, M_SIG) == []


def test_cache_write_refuses_a_subscript_that_merges_iterations():
    """F_{tx,a//4}: a local accumulator per iteration of a would keep only the last of four channels
    (the survey found group norm off by a factor 4 after this cache)."""
    s = sig(("A", [2, 8, 3], "float64", "input"), ("F", [2, 2], "float64", "output"))
    group_sum = "B^{2}_{tx=0}L^{8}_{a=0}L^{3}_{c=0}[F^{f64,g}_{tx,a//4}=F^{f64,g}_{tx,a//4}+A^{f64,g}_{tx,a,c};];"
    assert not any("write" in str(t.params) for t in get("cache_read_write").transformations(ctx(group_sum, s)))
