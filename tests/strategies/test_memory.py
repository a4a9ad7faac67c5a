"""Memory-level strategies: golden before/expected tests and refusals where illegal."""
from __future__ import annotations

from dataclasses import replace

import pytest
from strategy_cases import assert_golden, ctx, results, sig

from strategies.base import Illegal
from strategies.registry import get
from strategies.rules.memory.layout import LayoutParams, relaid_copy_problem

S2 = sig(("A", [4, 8], "float64", "input"), ("C", [4, 8], "float64", "output"))
ONE = ("B^{4}_{tx=0}[L^{8}_{a=0}[D^{f64,g}_{tx,a}=exp(A^{f64,g}_{tx,a});];"
       "L^{8}_{a=0}[C^{f64,g}_{tx,a}=D^{f64,g}_{tx,a}*2;];];")
TWO = ("B^{4}_{tx=0}L^{8}_{a=0}[D^{f64,g}_{tx,a}=exp(A^{f64,g}_{tx,a});];"
       "B^{4}_{tx=0}L^{8}_{a=0}[C^{f64,g}_{tx,a}=D^{f64,g}_{tx,a}*2;];")
M_SIG = sig(("A", [4, 6], "float64", "input"), ("C", [6, 8], "float64", "input"), ("D", [4, 8], "float64", "output"))
MM = "B^{4}_{tx=0}L^{8}_{a=0}L^{6}_{c=0}[D^{f64,g}_{tx,a}=D^{f64,g}_{tx,a}+A^{f64,g}_{tx,c}*C^{f64,g}_{c,a};];"


def test_set_storage_scope_golden():
    assert_golden("set_storage_scope", ONE, [
        "B^{4}_{tx=0}[L^{8}_{a=0}[D^{f64,s}_{tx,a}=exp(A^{f64,g}_{tx,a});];L^{8}_{a=0}[C^{f64,g}_{tx,a}=D^{f64,s}_{tx,a}*2;];];",
        "B^{4}_{tx=0}[L^{8}_{a=0}[D^{f64,l}_{tx,a}=exp(A^{f64,g}_{tx,a});];L^{8}_{a=0}[C^{f64,g}_{tx,a}=D^{f64,l}_{tx,a}*2;];];",
    ], S2, "cuda")


def test_set_storage_scope_never_moves_known_or_cross_kernel_tensors():
    assert results("set_storage_scope", TWO, S2, "cuda") == []   # D crosses nests (kernels)
    assert results("set_storage_scope", MM, M_SIG, "cuda") == []  # only known tensors
    shared_row = "B^{4}_{tx=0}[L^{8}_{a=0}[D^{f64,g}_{a}=exp(A^{f64,g}_{tx,a});];L^{8}_{a=0}[C^{f64,g}_{tx,a}=D^{f64,g}_{a}*2;];];"
    # every thread writes the same D_{a}: only a private (local) copy per thread is correct
    assert_golden("set_storage_scope", shared_row, [
        "B^{4}_{tx=0}[L^{8}_{a=0}[D^{f64,l}_{a}=exp(A^{f64,g}_{tx,a});];L^{8}_{a=0}[C^{f64,g}_{tx,a}=D^{f64,l}_{a}*2;];];"],
        S2, "cuda")


def test_cache_read_write_golden():
    assert_golden("cache_read_write", MM, [
        "B^{4}_{tx=0}[L^{6}_{c=0}[E^{f64,l}_{c}=A^{f64,g}_{tx,c};];"
        "L^{8}_{a=0}L^{6}_{c=0}[D^{f64,g}_{tx,a}=D^{f64,g}_{tx,a}+E^{f64,l}_{c}*C^{f64,g}_{c,a};];];",
        "B^{4}_{tx=0}L^{8}_{a=0}[E^{f64,l}=0;L^{6}_{c=0}[E^{f64,l}=E^{f64,l}+A^{f64,g}_{tx,c}*C^{f64,g}_{c,a};];"
        "D^{f64,g}_{tx,a}=E^{f64,l};];",
        # register blocking: the row of D that one tx writes, accumulated in a local tile
        "B^{4}_{tx=0}[L^{8}_{a=0}[E^{f64,l}_{a}=0;];L^{8}_{a=0}L^{6}_{c=0}[E^{f64,l}_{a}=E^{f64,l}_{a}"
        "+A^{f64,g}_{tx,c}*C^{f64,g}_{c,a};];L^{8}_{a=0}[D^{f64,g}_{tx,a}=E^{f64,l}_{a};];];",
    ], M_SIG)


TILED = ("L^{2}_{g=0}L^{2}_{h=0}L^{6}_{c=0}L^{2}_{tx=0}V^{4}_{a=0}"
         "[D^{f64,g}_{g*2+tx,h*4+a}=D^{f64,g}_{g*2+tx,h*4+a}+A^{f64,g}_{g*2+tx,c}*C^{f64,g}_{c,h*4+a};];")


def test_cache_write_tile_golden_register_blocking():
    st, c = get("cache_read_write"), ctx(TILED, M_SIG)
    t = st.apply(c, next(iter(st.sites(c))), {"write": "D", "depth": 2})
    assert t.after_text == (
        "L^{2}_{g=0}L^{2}_{h=0}[L^{2}_{tx=0}V^{4}_{a=0}[E^{f64,l}_{tx,a}=0;];"
        "L^{6}_{c=0}L^{2}_{tx=0}V^{4}_{a=0}[E^{f64,l}_{tx,a}=E^{f64,l}_{tx,a}+A^{f64,g}_{g*2+tx,c}*C^{f64,g}_{c,h*4+a};];"
        "L^{2}_{tx=0}V^{4}_{a=0}[D^{f64,g}_{g*2+tx,h*4+a}=E^{f64,l}_{tx,a};];];")
    assert "register blocking" in t.summary and t.exactness == "exact"


def test_cache_write_tile_refusals():
    st = get("cache_read_write")
    c = ctx(TILED, M_SIG)
    site = next(iter(st.sites(c)))
    assert st.apply(c, site, {"write": "D", "depth": 3}) is None      # c (a reduction) above the tile
    parallel = ctx("P^{2}_{g=0}L^{2}_{h=0}L^{6}_{c=0}L^{2}_{tx=0}V^{4}_{a=0}"
                   "[D^{f64,g}_{g*2+tx,h*4+a}=D^{f64,g}_{g*2+tx,h*4+a}+A^{f64,g}_{g*2+tx,c}*C^{f64,g}_{c,h*4+a};];", M_SIG)
    assert st.apply(parallel, next(iter(st.sites(parallel))), {"write": "D", "depth": 2}) is None  # shared tile
    onto = MM + "B^{4}_{tx=0}L^{8}_{a=0}[D^{f64,g}_{tx,a}=D^{f64,g}_{tx,a}+A^{f64,g}_{tx,0};];"
    c2 = ctx(onto, M_SIG)
    second = [s for s in st.sites(c2) if s.nest == 1]
    assert all(st.apply(c2, s, {"write": "D", "depth": 1}) is None for s in second)  # accumulates onto D


def test_cache_write_tile_verifies_exactly():
    pytest.importorskip("tvm")
    from gpu_tasks.verify import verify_pair

    st, c = get("cache_read_write"), ctx(TILED, M_SIG)
    ts = [t for t in st.transformations(c) if "depth" in t.params and "write" in t.params]
    assert len(ts) == 2
    for t in ts:
        assert verify_pair(t.before, t.after, M_SIG).status == "exact", t.after_text


def test_cache_write_refuses_an_accumulation_onto_earlier_values():
    # a linear layer: the matmul into D, then the bias added onto it
    bias = "B^{4}_{tx=0}L^{8}_{a=0}[D^{f64,g}_{tx,a}=D^{f64,g}_{tx,a}+A^{f64,g}_{tx,0};];"
    assert_golden("cache_read_write", MM + bias, [
        "B^{4}_{tx=0}[L^{6}_{c=0}[E^{f64,l}_{c}=A^{f64,g}_{tx,c};];"                       # a cache read of A
        "L^{8}_{a=0}L^{6}_{c=0}[D^{f64,g}_{tx,a}=D^{f64,g}_{tx,a}+E^{f64,l}_{c}*C^{f64,g}_{c,a};];];" + bias,
        # only the first nest (implicitly initialised) is cached for writing, as a scalar and as a row tile
        "B^{4}_{tx=0}L^{8}_{a=0}[E^{f64,l}=0;L^{6}_{c=0}[E^{f64,l}=E^{f64,l}+A^{f64,g}_{tx,c}*C^{f64,g}_{c,a};];"
        "D^{f64,g}_{tx,a}=E^{f64,l};];" + bias,
        "B^{4}_{tx=0}[L^{8}_{a=0}[E^{f64,l}_{a}=0;];L^{8}_{a=0}L^{6}_{c=0}[E^{f64,l}_{a}=E^{f64,l}_{a}"
        "+A^{f64,g}_{tx,c}*C^{f64,g}_{c,a};];L^{8}_{a=0}[D^{f64,g}_{tx,a}=E^{f64,l}_{a};];];" + bias,
        # the bias nest: A_{tx,0} read once per tx; D accumulates onto the matmul, so no cache write
        MM + "B^{4}_{tx=0}[E^{f64,l}=A^{f64,g}_{tx,0};L^{8}_{a=0}[D^{f64,g}_{tx,a}=D^{f64,g}_{tx,a}+E^{f64,l};];];",
    ], M_SIG)


def test_layout_transformation_golden():
    assert_golden("layout_transformation", TWO, [
        "B^{4}_{tx=0}L^{8}_{a=0}[D^{f64,g}_{a,tx}=exp(A^{f64,g}_{tx,a});];"
        "B^{4}_{tx=0}L^{8}_{a=0}[C^{f64,g}_{tx,a}=D^{f64,g}_{a,tx}*2;];"], S2)
    # known tensors keep their layout; only copies of the inputs are offered (D is the output)
    assert all(r.startswith("L^") and "D^{f64,g}_{tx,a}=D^{f64,g}_{tx,a}" in r
               for r in results("layout_transformation", MM, M_SIG))


def test_layout_transformation_copies_a_known_input_golden():
    """The published strategy: `Y = X` in another layout, read by every later statement instead of X."""
    assert_golden("layout_transformation", MM, [
        "L^{6}_{d=0}L^{4}_{f=0}[E^{f64,g}_{d,f}=A^{f64,g}_{f,d};];"
        "B^{4}_{tx=0}L^{8}_{a=0}L^{6}_{c=0}[D^{f64,g}_{tx,a}=D^{f64,g}_{tx,a}+E^{f64,g}_{c,tx}*C^{f64,g}_{c,a};];",
        "L^{2}_{d=0}L^{6}_{f=0}L^{4}_{g=0}[E^{f64,g}_{d,f,g}=C^{f64,g}_{f,d*4+g};];"
        "B^{4}_{tx=0}L^{8}_{a=0}L^{6}_{c=0}[D^{f64,g}_{tx,a}=D^{f64,g}_{tx,a}+A^{f64,g}_{tx,c}*E^{f64,g}_{a//4,c,a%4};];",
        "L^{8}_{d=0}L^{6}_{f=0}[E^{f64,g}_{d,f}=C^{f64,g}_{f,d};];"
        "B^{4}_{tx=0}L^{8}_{a=0}L^{6}_{c=0}[D^{f64,g}_{tx,a}=D^{f64,g}_{tx,a}+A^{f64,g}_{tx,c}*E^{f64,g}_{a,c};];",
    ], M_SIG)


def test_layout_transformation_packs_a_split_subscript_without_division():
    """After a split (a -> g*4+a), the packed copy is read at (g, c, a): no // or % is left."""
    split = "B^{4}_{tx=0}L^{2}_{g=0}L^{4}_{a=0}L^{6}_{c=0}[D^{f64,g}_{tx,g*4+a}=D^{f64,g}_{tx,g*4+a}+A^{f64,g}_{tx,c}*C^{f64,g}_{c,g*4+a};];"
    got = [r for r in results("layout_transformation", split, M_SIG) if "E^{f64,g}_{h,i,j}=C" in r]
    assert got == ["L^{2}_{h=0}L^{6}_{i=0}L^{4}_{j=0}[E^{f64,g}_{h,i,j}=C^{f64,g}_{i,h*4+j};];"
                   "B^{4}_{tx=0}L^{2}_{g=0}L^{4}_{a=0}L^{6}_{c=0}[D^{f64,g}_{tx,g*4+a}=D^{f64,g}_{tx,g*4+a}"
                   "+A^{f64,g}_{tx,c}*E^{f64,g}_{g,c,a};];"]


def test_layout_transformation_refuses_bad_copies():
    st, c = get("layout_transformation"), ctx(MM, M_SIG)
    site = next(s for s in st.sites(c) if s.tensors == ("C",))
    assert st.apply(c, site, {"copy": "packed", "dim": 1, "factor": 3}) is None     # 3 does not divide 8
    assert st.apply(c, site, {"copy": "packed", "dim": 1, "factor": 8}) is None     # one block: no packing
    assert st.apply(c, site, {"copy": "transposed", "order": [0, 1]}) is None       # the same layout
    assert "not a known input" in relaid_copy_problem(c, "D", LayoutParams(copy="transposed", order=[1, 0]))
    with pytest.raises(Illegal, match="not a known input"):                          # the output is written
        st.rewrite(c, replace(site, tensors=("D",)), {"copy": "transposed", "order": [1, 0]})
    assert not any(s.tensors == ("D",) for s in st.sites(c))


def test_layout_transformation_copies_verify_exactly():
    pytest.importorskip("tvm")
    from gpu_tasks.verify import verify_pair

    s = sig(("A", [8, 16], "float32", "input"), ("C", [16, 32], "float32", "input"),
            ("D", [8, 32], "float32", "output"))
    mm = "B^{8}_{tx=0}L^{32}_{a=0}L^{16}_{c=0}[D^{f32,g}_{tx,a}=D^{f32,g}_{tx,a}+A^{f32,g}_{tx,c}*C^{f32,g}_{c,a};];"
    ts = [t for t in get("layout_transformation").transformations(ctx(mm, s)) if t.params.get("copy")]
    assert {t.params["copy"] for t in ts} == {"packed", "transposed"}
    assert any(t.site.tensors == ("C",) and t.params["copy"] == "packed" for t in ts)  # the matmul's right operand
    for t in ts:
        assert verify_pair(t.before, t.after, s).status == "exact", t.after_text


def test_set_storage_layout_golden():
    assert_golden("set_storage_layout", TWO, [
        "B^{4}_{tx=0}L^{8}_{a=0}[D^{f64,g}_{tx*8+a}=exp(A^{f64,g}_{tx,a});];"          # row-major
        "B^{4}_{tx=0}L^{8}_{a=0}[C^{f64,g}_{tx,a}=D^{f64,g}_{tx*8+a}*2;];",
        "B^{4}_{tx=0}L^{8}_{a=0}[D^{f64,g}_{a*4+tx}=exp(A^{f64,g}_{tx,a});];"          # column-major
        "B^{4}_{tx=0}L^{8}_{a=0}[C^{f64,g}_{tx,a}=D^{f64,g}_{a*4+tx}*2;];"], S2)


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


def test_packed_copy_refuses_a_decreasing_subscript_that_tvm_miscompiles():
    """TVM 0.27 folds A[(15-c)//4*4 + (15-c)%4] to A[12-c]: a packed copy read through a reversed
    index (argmax's `2047-c`) verified as a mismatch. The dimension read in increasing order is packed."""
    from strategy_cases import ctx, sig

    from gpu_tasks.verify import verify_pair
    from strategies.registry import get

    s = sig(("A", [8, 16], "float32", "input"), ("C", [8, 16], "float32", "output"))
    reversed_read = "B^{8}_{tx=0}L^{16}_{a=0}[C^{f32,g}_{tx,a}=A^{f32,g}_{tx,15-a}*A^{f32,g}_{tx,a};];"
    packed = [t for t in get("layout_transformation").transformations(ctx(reversed_read, s))
              if t.params.get("copy") == "packed"]
    assert packed and {t.params["dim"] for t in packed} == {0}  # dimension 1 is read reversed
    for t in packed:
        assert verify_pair(t.before, t.after, s).status == "exact", t.after_text
