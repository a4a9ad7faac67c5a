"""Operator-level strategies: golden before/expected tests and refusals where illegal."""
from __future__ import annotations

import pytest
from strategy_cases import assert_golden, ctx, in_dtype, results, sig

from leir import parse_program
from strategies.base import Illegal, LoopAt, Site
from strategies.registry import get

M_SIG = sig(("A", [4, 6], "float64", "input"), ("C", [6, 8], "float64", "input"), ("D", [4, 8], "float64", "output"))
MM = "B^{4}_{tx=0}L^{8}_{a=0}L^{6}_{c=0}[D^{f64,g}_{tx,a}=D^{f64,g}_{tx,a}+A^{f64,g}_{tx,c}*C^{f64,g}_{c,a};];"
BODY = "[D^{f64,g}_{tx,a}=D^{f64,g}_{tx,a}+A^{f64,g}_{tx,c}*C^{f64,g}_{c,a};];"
S2 = sig(("A", [4, 8], "float64", "input"), ("C", [4, 8], "float64", "output"))
SOFT = ("B^{4}_{tx=0}L^{8}_{a=0}[D^{f64,g}_{tx}=max(D^{f64,g}_{tx},A^{f64,g}_{tx,a});];"
        "B^{4}_{tx=0}L^{8}_{a=0}[C^{f64,g}_{tx,a}=exp(A^{f64,g}_{tx,a}-D^{f64,g}_{tx});];")
CONV_SIG = sig(("A", [2, 6], "float64", "input"), ("C", [2, 3], "float64", "input"), ("D", [2, 4], "float64", "output"))
# Two reduction axes (g, h): their relative order is the order of the float updates.
TWO_RED_BODY = "[D^{f64,g}_{tx,a}=D^{f64,g}_{tx,a}+A^{f64,g}_{g,a+h}*C^{f64,g}_{g,h};];"
TWO_RED = "B^{2}_{tx=0}L^{4}_{a=0}L^{2}_{g=0}L^{3}_{h=0}" + TWO_RED_BODY
SCAN_SIG = sig(("A", [2, 6], "float64", "input"), ("C", [2, 6], "float64", "output"))
SCAN = "B^{2}_{tx=0}L^{6}_{a=0}[C^{f64,g}_{tx,a}=max(if_then_else(a-1<0,-inf,C^{f64,g}_{tx,a-1}),A^{f64,g}_{tx,a});];"


def test_loop_reorder_golden_moves_free_loops_around_the_reduction_axis():
    assert_golden("loop_reorder", MM, [
        "L^{8}_{a=0}L^{6}_{c=0}B^{4}_{tx=0}" + BODY,     # move tx to the inside (a rotation)
        "L^{8}_{a=0}B^{4}_{tx=0}L^{6}_{c=0}" + BODY,
        "L^{6}_{c=0}L^{8}_{a=0}B^{4}_{tx=0}" + BODY,
        "B^{4}_{tx=0}L^{6}_{c=0}L^{8}_{a=0}" + BODY,
        "L^{6}_{c=0}B^{4}_{tx=0}L^{8}_{a=0}" + BODY,     # move c to the outside
    ], M_SIG)


def test_loop_reorder_move_hoists_the_reduction_above_a_tiles_point_loops():
    tiled = ("L^{2}_{g=0}L^{2}_{h=0}B^{2}_{tx=0}L^{4}_{a=0}L^{6}_{c=0}"
             "[D^{f64,g}_{g*2+tx,h*4+a}=D^{f64,g}_{g*2+tx,h*4+a}+A^{f64,g}_{g*2+tx,c}*C^{f64,g}_{c,h*4+a};];")
    st, c = get("loop_reorder"), ctx(tiled, M_SIG)
    site = next(iter(st.sites(c)))
    t = st.apply(c, site, {"move": "c", "to": 2})
    assert t.after_text == ("L^{2}_{g=0}L^{2}_{h=0}L^{6}_{c=0}B^{2}_{tx=0}L^{4}_{a=0}"
                            "[D^{f64,g}_{g*2+tx,h*4+a}=D^{f64,g}_{g*2+tx,h*4+a}+A^{f64,g}_{g*2+tx,c}*C^{f64,g}_{c,h*4+a};];")
    assert {"move": "c", "to": 2} in list(st.parameters(c, site))
    with pytest.raises(Illegal):
        st.rewrite(c, site, {"move": "c", "to": 3})    # one place is a swap, not a move


def test_loop_reorder_move_keeps_the_order_of_two_reduction_axes():
    st, c = get("loop_reorder"), ctx(TWO_RED, CONV_SIG)
    site = next(iter(st.sites(c)))
    with pytest.raises(Illegal, match="carry dependences"):
        st.rewrite(c, site, {"move": "h", "to": 1})    # h before g: the updates' order would change
    # a moved inside both reduction axes is legal (the third variant)
    assert "B^{2}_{tx=0}L^{2}_{g=0}L^{3}_{h=0}L^{4}_{a=0}" + TWO_RED_BODY in results("loop_reorder", TWO_RED, CONV_SIG)


def test_loop_reorder_keeps_bound_loops_in_place_on_cuda():
    assert_golden("loop_reorder", MM, ["B^{4}_{tx=0}L^{6}_{c=0}L^{8}_{a=0}" + BODY], M_SIG, "cuda")


def test_loop_reorder_never_swaps_two_reduction_axes_or_a_scan():
    # every variant keeps g outside h (the order of the sum's updates)
    assert_golden("loop_reorder", TWO_RED, [
        "L^{4}_{a=0}L^{2}_{g=0}L^{3}_{h=0}B^{2}_{tx=0}" + TWO_RED_BODY,
        "B^{2}_{tx=0}L^{2}_{g=0}L^{3}_{h=0}L^{4}_{a=0}" + TWO_RED_BODY,
        "L^{4}_{a=0}B^{2}_{tx=0}L^{2}_{g=0}L^{3}_{h=0}" + TWO_RED_BODY,
        "L^{2}_{g=0}L^{4}_{a=0}B^{2}_{tx=0}L^{3}_{h=0}" + TWO_RED_BODY,
        "B^{2}_{tx=0}L^{2}_{g=0}L^{4}_{a=0}L^{3}_{h=0}" + TWO_RED_BODY,
        "L^{4}_{a=0}L^{2}_{g=0}B^{2}_{tx=0}L^{3}_{h=0}" + TWO_RED_BODY,
        "L^{2}_{g=0}B^{2}_{tx=0}L^{4}_{a=0}L^{3}_{h=0}" + TWO_RED_BODY,
    ], CONV_SIG)
    # tx is free, so it may move inside the scan loop a (the order of a's iterations is kept).
    assert_golden("loop_reorder", SCAN, [
        "L^{6}_{a=0}B^{2}_{tx=0}[C^{f64,g}_{tx,a}=max(if_then_else(a-1<0,-inf,C^{f64,g}_{tx,a-1}),A^{f64,g}_{tx,a});];"],
        SCAN_SIG)


def test_loop_split_golden():
    assert_golden("loop_split", "B^{4}_{tx=0}L^{6}_{c=0}[D^{f64,g}_{tx}=D^{f64,g}_{tx}+A^{f64,g}_{tx,c};];", [
        "L^{2}_{d=0}B^{2}_{tx=0}L^{6}_{c=0}[D^{f64,g}_{d*2+tx}=D^{f64,g}_{d*2+tx}+A^{f64,g}_{d*2+tx,c};];",
        "B^{4}_{tx=0}L^{3}_{d=0}L^{2}_{c=0}[D^{f64,g}_{tx}=D^{f64,g}_{tx}+A^{f64,g}_{tx,d*2+c};];",
        "B^{4}_{tx=0}L^{2}_{d=0}L^{3}_{c=0}[D^{f64,g}_{tx}=D^{f64,g}_{tx}+A^{f64,g}_{tx,d*3+c};];",
    ], sig(("A", [4, 6], "float64", "input"), ("D", [4], "float64", "output")))


def test_loop_split_needs_a_proper_divisor():
    assert results("loop_split", "B^{5}_{tx=0}L^{7}_{a=0}[C^{f64,g}_{tx,a}=A^{f64,g}_{tx,a};];",
                   sig(("A", [5, 7], "float64", "input"), ("C", [5, 7], "float64", "output"))) == []


def test_loop_tiling_golden_tiles_a_spatial_and_a_reduction_loop():
    # (tx, a): both spatial; (a, c): a spatial loop and the reduction axis. Tile loops d, f outside
    # the point loops; tile sizes in the preferred order (4 and 2 before 3), at most MAX_TILES.
    assert_golden("loop_tiling", MM, [
        "L^{2}_{d=0}L^{2}_{f=0}B^{2}_{tx=0}L^{4}_{a=0}L^{6}_{c=0}[D^{f64,g}_{d*2+tx,f*4+a}=D^{f64,g}_{d*2+tx,f*4+a}"
        "+A^{f64,g}_{d*2+tx,c}*C^{f64,g}_{c,f*4+a};];",
        "L^{2}_{d=0}L^{4}_{f=0}B^{2}_{tx=0}L^{2}_{a=0}L^{6}_{c=0}[D^{f64,g}_{d*2+tx,f*2+a}=D^{f64,g}_{d*2+tx,f*2+a}"
        "+A^{f64,g}_{d*2+tx,c}*C^{f64,g}_{c,f*2+a};];",
        "B^{4}_{tx=0}L^{2}_{d=0}L^{3}_{f=0}L^{4}_{a=0}L^{2}_{c=0}[D^{f64,g}_{tx,d*4+a}=D^{f64,g}_{tx,d*4+a}"
        "+A^{f64,g}_{tx,f*2+c}*C^{f64,g}_{f*2+c,d*4+a};];",
        "B^{4}_{tx=0}L^{4}_{d=0}L^{3}_{f=0}L^{2}_{a=0}L^{2}_{c=0}[D^{f64,g}_{tx,d*2+a}=D^{f64,g}_{tx,d*2+a}"
        "+A^{f64,g}_{tx,f*2+c}*C^{f64,g}_{f*2+c,d*2+a};];",
        "B^{4}_{tx=0}L^{2}_{d=0}L^{2}_{f=0}L^{4}_{a=0}L^{3}_{c=0}[D^{f64,g}_{tx,d*4+a}=D^{f64,g}_{tx,d*4+a}"
        "+A^{f64,g}_{tx,f*3+c}*C^{f64,g}_{f*3+c,d*4+a};];",
        "B^{4}_{tx=0}L^{4}_{d=0}L^{2}_{f=0}L^{2}_{a=0}L^{3}_{c=0}[D^{f64,g}_{tx,d*2+a}=D^{f64,g}_{tx,d*2+a}"
        "+A^{f64,g}_{tx,f*3+c}*C^{f64,g}_{f*3+c,d*2+a};];",
    ], M_SIG)


def test_loop_tiling_refuses_two_reduction_axes():
    prog = "B^{2}_{tx=0}L^{4}_{a=0}L^{4}_{g=0}L^{4}_{h=0}[D^{f64,g}_{tx,a}=D^{f64,g}_{tx,a}+A^{f64,g}_{g,h};];"
    got = results("loop_tiling", prog, sig(("A", [4, 4], "float64", "input"), ("D", [2, 4], "float64", "output")))
    # (a, g) is tiled; (g, h) would move h's tile loop outside g and change the order of the sum.
    assert got == ["B^{2}_{tx=0}L^{2}_{i=0}L^{2}_{j=0}L^{2}_{a=0}L^{2}_{g=0}L^{4}_{h=0}[D^{f64,g}_{tx,i*2+a}="
                   "D^{f64,g}_{tx,i*2+a}+A^{f64,g}_{j*2+g,h};];"]


def test_loop_fusion_golden_respects_the_reduction_dependence():
    # D is complete only after the a loop: fusing tx is legal, fusing tx and a is not.
    assert_golden("loop_fusion", SOFT, [
        "B^{4}_{tx=0}[L^{8}_{a=0}[D^{f64,g}_{tx}=max(D^{f64,g}_{tx},A^{f64,g}_{tx,a});];"
        "L^{8}_{a=0}[C^{f64,g}_{tx,a}=exp(A^{f64,g}_{tx,a}-D^{f64,g}_{tx});];];"], S2)


def test_loop_fusion_full_depth_for_elementwise_and_none_for_shifted_reads():
    ew = ("B^{4}_{tx=0}L^{8}_{a=0}[D^{f64,g}_{tx,a}=A^{f64,g}_{tx,a}*2;];"
          "B^{4}_{tx=0}L^{8}_{a=0}[C^{f64,g}_{tx,a}=D^{f64,g}_{tx,a}+A^{f64,g}_{tx,a};];")
    assert_golden("loop_fusion", ew, [  # depth 1, then both loops
        "B^{4}_{tx=0}[L^{8}_{a=0}[D^{f64,g}_{tx,a}=A^{f64,g}_{tx,a}*2;];"
        "L^{8}_{a=0}[C^{f64,g}_{tx,a}=D^{f64,g}_{tx,a}+A^{f64,g}_{tx,a};];];",
        "B^{4}_{tx=0}L^{8}_{a=0}[D^{f64,g}_{tx,a}=A^{f64,g}_{tx,a}*2;C^{f64,g}_{tx,a}=D^{f64,g}_{tx,a}+A^{f64,g}_{tx,a};];",
    ], S2)
    shifted = ("B^{4}_{tx=0}L^{8}_{a=0}[D^{f64,g}_{tx,a}=A^{f64,g}_{tx,a}*2;];"
               "B^{4}_{tx=0}L^{8}_{a=0}[C^{f64,g}_{tx,a}=D^{f64,g}_{3-tx,a}+A^{f64,g}_{tx,a};];")
    assert results("loop_fusion", shifted, S2) == []  # reads a row a later tx iteration writes


def test_loop_unrolling_golden():
    assert_golden("loop_unrolling", MM, ["B^{4}_{tx=0}U^{8}_{a=0}L^{6}_{c=0}" + BODY,
                                         "B^{4}_{tx=0}L^{8}_{a=0}U^{6}_{c=0}" + BODY], M_SIG)


def test_loop_unrolling_skips_large_extents():
    big = sig(("A", [4, 100], "float64", "input"), ("C", [4, 100], "float64", "output"))
    assert results("loop_unrolling", "B^{4}_{tx=0}L^{100}_{a=0}[C^{f64,g}_{tx,a}=A^{f64,g}_{tx,a};];", big) == []


def test_loop_vectorization_only_innermost_spatial_on_cpu():
    assert_golden("loop_vectorization", SOFT, [
        "B^{4}_{tx=0}L^{8}_{a=0}[D^{f64,g}_{tx}=max(D^{f64,g}_{tx},A^{f64,g}_{tx,a});];"
        "B^{4}_{tx=0}V^{8}_{a=0}[C^{f64,g}_{tx,a}=exp(A^{f64,g}_{tx,a}-D^{f64,g}_{tx});];"], S2)
    assert results("loop_vectorization", MM, M_SIG) == []          # innermost loop is a reduction axis
    assert results("loop_vectorization", SOFT, S2, "cuda") == []   # no vector loops in a CUDA kernel


def test_loop_binding_golden_only_on_cuda_and_only_independent_loops():
    assert_golden("loop_binding", MM, [], M_SIG)
    # a is bound to each axis not taken yet (tx is); c is a reduction axis and stays serial
    assert_golden("loop_binding", MM, [
        f"B^{{4}}_{{tx=0}}B^{{8}}_{{{axis}=0}}L^{{6}}_{{c=0}}[D^{{f64,g}}_{{tx,{axis}}}=D^{{f64,g}}_{{tx,{axis}}}"
        f"+A^{{f64,g}}_{{tx,c}}*C^{{f64,g}}_{{c,{axis}}};];" for axis in ("ty", "tz", "bx", "by", "bz")], M_SIG, "cuda")


def test_loop_parallelization_golden_and_refusals():
    assert_golden("loop_parallelization", MM, [
        # on the CPU a bound loop is serial: it becomes a parallel loop with an index name
        "P^{4}_{d=0}L^{8}_{a=0}L^{6}_{c=0}[D^{f64,g}_{d,a}=D^{f64,g}_{d,a}+A^{f64,g}_{d,c}*C^{f64,g}_{c,a};];",
        "B^{4}_{tx=0}P^{8}_{a=0}L^{6}_{c=0}" + BODY], M_SIG)
    # P loops are CPU cores: a program written for a GPU is never offered one (issue 25)
    assert results("loop_parallelization", MM, M_SIG, "cuda") == []
    # the rows of the scan are independent; its loop a carries the scan and is never parallel
    assert results("loop_parallelization", SCAN, SCAN_SIG) == [
        "P^{2}_{c=0}L^{6}_{a=0}[C^{f64,g}_{c,a}=max(if_then_else(a-1<0,-inf,C^{f64,g}_{c,a-1}),A^{f64,g}_{c,a});];"]
    assert results("loop_parallelization", SCAN, SCAN_SIG, "cuda") == []


def test_reduction_factorization_golden():
    # on a GPU target: on the CPU, partials in a global tensor inside serial loops are refused (issue 24)
    prog = "B^{4}_{tx=0}L^{6}_{c=0}[D^{f64,g}_{tx}=D^{f64,g}_{tx}+A^{f64,g}_{tx,c};];"
    assert_golden("reduction_factorization", prog, [
        "B^{4}_{tx=0}L^{3}_{d=0}L^{2}_{c=0}[E^{f64,g}_{tx,c}=E^{f64,g}_{tx,c}+A^{f64,g}_{tx,d*2+c};];"
        "B^{4}_{tx=0}L^{2}_{c=0}[D^{f64,g}_{tx}=D^{f64,g}_{tx}+E^{f64,g}_{tx,c};];",
        "B^{4}_{tx=0}L^{2}_{d=0}L^{3}_{c=0}[E^{f64,g}_{tx,c}=E^{f64,g}_{tx,c}+A^{f64,g}_{tx,d*3+c};];"
        "B^{4}_{tx=0}L^{3}_{c=0}[D^{f64,g}_{tx}=D^{f64,g}_{tx}+E^{f64,g}_{tx,c};];",
    ], sig(("A", [4, 6], "float64", "input"), ("D", [4], "float64", "output")), "cuda")


def test_reduction_factorization_needs_a_reduction():
    assert results("reduction_factorization", SCAN, SCAN_SIG) == []


# A group norm's statistics: F_{tx,a//4} sums A over a (4 channels per group), c and d. `a` is in the
# subscript, yet four of its iterations accumulate into one element (the survey found rfactor 16x off).
GROUP_SIG = sig(("A", [2, 8, 4, 2], "float64", "input"), ("F", [2, 2], "float64", "output"))
GROUP_SUM = "B^{2}_{tx=0}L^{8}_{a=0}L^{4}_{c=0}L^{2}_{d=0}[F^{f64,g}_{tx,a//4}=F^{f64,g}_{tx,a//4}+A^{f64,g}_{tx,a,c,d};];"


def test_reduction_factorization_refuses_a_subscript_that_merges_iterations():
    assert results("reduction_factorization", GROUP_SUM, GROUP_SIG, "cuda") == []
    s = get("reduction_factorization")
    site = Site(0, loops=("c",), stmts=(0,), tensors=("F",), match=LoopAt(2))
    with pytest.raises(Illegal, match="a appears in F's subscript but several of its iterations accumulate"):
        s.rewrite(ctx(GROUP_SUM, GROUP_SIG, "cuda"), site, {"factor": 2})


S2_F32 = sig(("A", [4, 64], "float32", "input"), ("C", [4, 64], "float32", "output"))
SOFT_F32 = ("B^{4}_{tx=0}L^{64}_{a=0}[D^{f32,g}_{tx}=max(D^{f32,g}_{tx},A^{f32,g}_{tx,a});];"
            "B^{4}_{tx=0}L^{64}_{a=0}[C^{f32,g}_{tx,a}=exp(A^{f32,g}_{tx,a}-D^{f32,g}_{tx});];")


def test_loop_vectorization_splits_a_long_innermost_loop_golden():
    s = sig(("A", [2, 128], "float32", "input"), ("C", [2, 128], "float32", "output"))
    before = "B^{2}_{tx=0}L^{128}_{a=0}[C^{f32,g}_{tx,a}=A^{f32,g}_{tx,a}*2;];"
    assert_golden("loop_vectorization", before, [
        f"B^{{2}}_{{tx=0}}L^{{{128 // w}}}_{{c=0}}V^{{{w}}}_{{a=0}}[C^{{f32,g}}_{{tx,c*{w}+a}}=A^{{f32,g}}_{{tx,c*{w}+a}}*2;];"
        for w in (16, 8, 32)], s)


def test_loop_vectorization_fast_exp_golden_and_reassociating():
    fast = [t for t in get("loop_vectorization").transformations(ctx(SOFT_F32, S2_F32))
            if t.params.get("exp") and not t.params.get("partials")]
    assert [t.params for t in fast] == [{"exp": "fast"}, {"width": 16, "exp": "fast"}, {"width": 8, "exp": "fast"},
                                        {"width": 32, "exp": "fast"}]
    assert fast[0].after_text == ("B^{4}_{tx=0}L^{64}_{a=0}[D^{f32,g}_{tx}=max(D^{f32,g}_{tx},A^{f32,g}_{tx,a});];"
                                  "B^{4}_{tx=0}V^{64}_{a=0}[C^{f32,g}_{tx,a}=fast_exp(A^{f32,g}_{tx,a}-D^{f32,g}_{tx});];")
    assert fast[1].after_text == ("B^{4}_{tx=0}L^{64}_{a=0}[D^{f32,g}_{tx}=max(D^{f32,g}_{tx},A^{f32,g}_{tx,a});];"
                                  "B^{4}_{tx=0}L^{4}_{c=0}V^{16}_{a=0}"
                                  "[C^{f32,g}_{tx,c*16+a}=fast_exp(A^{f32,g}_{tx,c*16+a}-D^{f32,g}_{tx});];")
    assert all(t.exactness == "reassociating" for t in fast)
    plain = [t for t in get("loop_vectorization").transformations(ctx(SOFT_F32, S2_F32))
             if not t.params.get("exp") and not t.params.get("partials")]
    assert plain and all(t.exactness == "exact" and "fast_exp" not in t.after_text for t in plain)


def test_fast_exp_is_refused_where_a_close_result_is_not_enough():
    st = get("loop_vectorization")
    c = ctx(in_dtype(SOFT_F32, "f64"), sig(("A", [4, 64], "float64", "input"), ("C", [4, 64], "float64", "output")))
    assert [t.params for t in st.transformations(c) if not t.params.get("partials")] == [
        {}, {"width": 16}, {"width": 8}, {"width": 32}]
    site = list(st.sites(c))[-1]    # the exp nest (the max nest's loop is a reduction axis)
    with pytest.raises(Illegal, match="float64"):
        st.rewrite(c, site, {"exp": "fast"})
    select = ("B^{4}_{tx=0}L^{64}_{a=0}[C^{f32,g}_{tx,a}=if_then_else(exp(A^{f32,g}_{tx,a})>2,1.0,0.0);];")
    assert not [t for t in st.transformations(ctx(select, S2_F32)) if t.params.get("exp")]  # exp decides a branch


def test_fast_exp_verifies_close_never_exact():
    pytest.importorskip("tvm")
    from gpu_tasks.verify import verify_pair

    fast = [t for t in get("loop_vectorization").transformations(ctx(SOFT_F32, S2_F32)) if t.params.get("exp")]
    assert len(fast) == 4   # no partials with fast_exp here: the exp nest is no reduction
    for t in fast[:2]:
        assert verify_pair(t.before, t.after, S2_F32).status == "close", t.after_text
    # the same substitution in float64 is a mismatch: why the strategy refuses it there
    f64 = parse_program(in_dtype(SOFT_F32, "f64"))
    fast64 = parse_program(in_dtype(fast[0].after_text, "f64"))
    s64 = sig(("A", [4, 64], "float64", "input"), ("C", [4, 64], "float64", "output"))
    assert verify_pair(f64, fast64, s64).status == "mismatch"


GELU_F32 = "B^{4}_{tx=0}L^{64}_{a=0}[C^{f32,g}_{tx,a}=A^{f32,g}_{tx,a}*0.5*(1+erf(A^{f32,g}_{tx,a}*0.7071067811865476));];"
SOFTPLUS_F32 = "B^{4}_{tx=0}L^{64}_{a=0}[C^{f32,g}_{tx,a}=log(1+exp(A^{f32,g}_{tx,a}));];"
EW_SIG = sig(("A", [4, 64], "float32", "input"), ("C", [4, 64], "float32", "output"))


def test_loop_vectorization_math_fast_golden_for_erf_and_log():
    """With log or erf below the loop the fast variant is `math: fast`: exp, log and erf all become
    their vectorisable forms; the facts name the functions the nest calls."""
    st = get("loop_vectorization")
    gelu = [t for t in st.transformations(ctx(GELU_F32, EW_SIG)) if t.params.get("math")]
    assert [t.params for t in gelu][:2] == [{"math": "fast"}, {"width": 16, "math": "fast"}]
    assert gelu[0].after_text == ("B^{4}_{tx=0}V^{64}_{a=0}[C^{f32,g}_{tx,a}=A^{f32,g}_{tx,a}*0.5*(1+fast_erf("
                                  "A^{f32,g}_{tx,a}*0.7071067811865476));];")
    assert gelu[0].exactness == "reassociating" and "every erf below the vector loop" in gelu[0].facts[-2]
    softplus = [t for t in st.transformations(ctx(SOFTPLUS_F32, EW_SIG)) if t.params.get("math")]
    assert softplus[0].after_text == ("B^{4}_{tx=0}V^{64}_{a=0}[C^{f32,g}_{tx,a}=fast_log(1+fast_exp("
                                      "A^{f32,g}_{tx,a}));];")
    assert not [t for t in st.transformations(ctx(SOFTPLUS_F32, EW_SIG)) if t.params.get("exp")]
    # the exp-only variant of a nest with exp alone keeps its spelling and its wording
    assert all("math" not in t.params for t in st.transformations(ctx(SOFT_F32, S2_F32)))


def test_math_fast_verifies_close_and_is_refused_in_float64():
    pytest.importorskip("tvm")
    from gpu_tasks.verify import verify_pair

    st = get("loop_vectorization")
    for program in (GELU_F32, SOFTPLUS_F32):
        fast = [t for t in st.transformations(ctx(program, EW_SIG)) if t.params.get("math")]
        assert fast and verify_pair(fast[0].before, fast[0].after, EW_SIG).status == "close", fast[0].after_text
    s64 = sig(("A", [4, 64], "float64", "input"), ("C", [4, 64], "float64", "output"))
    c64 = ctx(in_dtype(GELU_F32, "f64"), s64)
    assert not [t for t in st.transformations(c64) if t.params.get("math")]
    with pytest.raises(Illegal, match="fast_erf carries float32's error"):
        st.rewrite(c64, list(st.sites(c64))[0], {"math": "fast"})


SUM_EXP = "B^{4}_{tx=0}L^{64}_{a=0}[C^{f32,g}_{tx}=C^{f32,g}_{tx}+exp(A^{f32,g}_{tx,a});];"
SUM_SIG = sig(("A", [4, 64], "float32", "input"), ("C", [4], "float32", "output"))


def test_loop_vectorization_of_a_reduction_keeps_partials_per_lane_golden():
    """A reduction axis is vectorised through partial results per lane (rfactor + V), then combined."""
    ts = list(get("loop_vectorization").transformations(ctx(SUM_EXP, SUM_SIG)))
    assert [t.params for t in ts] == [{"width": w, "partials": True, **e} for w in (16, 8, 32)
                                      for e in ({}, {"exp": "fast"})]
    assert ts[0].after_text == ("B^{4}_{tx=0}L^{4}_{c=0}V^{16}_{a=0}[D^{f32,g}_{tx,a}=D^{f32,g}_{tx,a}"
                                "+exp(A^{f32,g}_{tx,c*16+a});];B^{4}_{tx=0}L^{16}_{a=0}[C^{f32,g}_{tx}="
                                "C^{f32,g}_{tx}+D^{f32,g}_{tx,a};];")
    assert ts[1].after_text == ("B^{4}_{tx=0}L^{4}_{c=0}V^{16}_{a=0}[D^{f32,g}_{tx,a}=D^{f32,g}_{tx,a}"
                                "+fast_exp(A^{f32,g}_{tx,c*16+a});];B^{4}_{tx=0}L^{16}_{a=0}[C^{f32,g}_{tx}="
                                "C^{f32,g}_{tx}+D^{f32,g}_{tx,a};];")
    assert all(t.exactness == "reassociating" for t in ts)
    # float16 cannot hold a reassociated 64-term sum (the rfactor legality is reused)
    assert list(get("loop_vectorization").transformations(
        ctx(in_dtype(SUM_EXP, "f16"), sig(("A", [4, 64], "float16", "input"), ("C", [4], "float16", "output"))))) == []


def test_loop_vectorization_partials_verify():
    pytest.importorskip("tvm")
    from gpu_tasks.verify import verify_pair

    for t in get("loop_vectorization").transformations(ctx(SUM_EXP, SUM_SIG)):
        assert verify_pair(t.before, t.after, SUM_SIG).status in ("exact", "close"), t.after_text


def test_new_loop_moves_verify_exactly():
    """A loop moved several places, a long loop split and vectorised, a bound loop made parallel."""
    pytest.importorskip("tvm")
    from gpu_tasks.verify import verify_pair

    s = sig(("A", [8, 16], "float32", "input"), ("C", [16, 128], "float32", "input"), ("D", [8, 128], "float32", "output"))
    mm = "B^{8}_{tx=0}L^{16}_{c=0}L^{128}_{a=0}[D^{f32,g}_{tx,a}=D^{f32,g}_{tx,a}+A^{f32,g}_{tx,c}*C^{f32,g}_{c,a};];"
    c = ctx(mm, s)
    chosen = [next(t for t in get("loop_reorder").transformations(c) if "move" in t.params),
              next(t for t in get("loop_vectorization").transformations(c) if t.params == {"width": 16}),
              next(t for t in get("loop_parallelization").transformations(c) if t.after.nests[0].loops[0].kind == "P")]
    assert [t.after_text[:2] for t in chosen] == ["L^", "B^", "P^"]
    for t in chosen:
        assert t.exactness == "exact"
        assert verify_pair(t.before, t.after, s).status == "exact", t.after_text


def test_divisors_of_a_huge_extent_come_from_pairs_up_to_the_square_root():
    # a fuzzed program with a loop of extent 2^40 kept `steptp sites` busy for half an hour (make test)
    from strategies.analysis.loops import divisors

    assert divisors(2 ** 40) == [2 ** k for k in range(1, 40)]
    assert divisors(36) == [2, 3, 4, 6, 9, 12, 18] and divisors(7) == [] and divisors(4) == [2] and divisors(1) == []
