"""Macro actions (search.macros) and the program analysis behind them (search.analysis): each macro is
a chain of the registered strategies' own steps, its final state has the structure of a fast CPU
kernel, and the search verifies and records every step. Structure, not time: the timing callables
here are fakes (one test verifies the steps through TVM)."""
from __future__ import annotations

import pytest

from leir.analysis import statement_sites
from leir.ast import Call, Loop, Nest, Program, Stmt, walk_expr
from leir.parse import parse_program
from leir.printer import format_program
from leir.signature import Signature
from search.analysis import Machine, estimate_cycles, log2_speedup
from search.drivers import Budget, DriverConfig, Policy, run
from search.macros import (
    _heavy_row_nests,
    contractions,
    macro_proposals,
    micro_kernels,
    row_kernels,
    tile_shapes,
    vector_width,
    vector_widths,
)
from search.policies import macro_action
from strategies.analysis.legality import body_statements
from strategies.base import Context

AVX512 = Machine(cores=2, vector_bits=512, vector_registers=32)
AVX2 = Machine(cores=2, vector_bits=256, vector_registers=16)


def sig(**tensors) -> Signature:
    *inputs, out = tensors.items()
    return Signature.from_json({"tensors": [{"name": n, "shape": s, "dtype": "float32", "role": "input"}
                                            for n, s in inputs]
                                + [{"name": out[0], "shape": out[1], "dtype": "float32", "role": "output"}]})


MM_B = parse_program("B^{128}_{tx=0}L^{128}_{a=0}L^{128}_{c=0}"
                     "[D^{f32,g}_{tx,a}=D^{f32,g}_{tx,a}+A^{f32,g}_{tx,c}*C^{f32,g}_{c,a};];")
MM_L = parse_program("L^{128}_{d=0}L^{128}_{a=0}L^{128}_{c=0}"
                     "[D^{f32,g}_{d,a}=D^{f32,g}_{d,a}+A^{f32,g}_{d,c}*C^{f32,g}_{c,a};];")
MM_SIG = sig(A=[128, 128], C=[128, 128], D=[128, 128])
# D = A @ B^T: the operand reused across rows walks the vector axis with a stride of 64
MM_T = parse_program("B^{64}_{tx=0}L^{64}_{a=0}L^{32}_{c=0}"
                     "[D^{f32,g}_{tx,a}=D^{f32,g}_{tx,a}+A^{f32,g}_{tx,c}*C^{f32,g}_{a,c};];")
MM_T_SIG = sig(A=[64, 32], C=[64, 32], D=[64, 64])
CONV = parse_program("B^{1}_{tx=0}L^{16}_{a=0}L^{8}_{c=0}L^{8}_{d=0}L^{8}_{f=0}L^{3}_{g=0}L^{3}_{h=0}"
                     "[C^{f32,g}_{tx,a,c,d}=C^{f32,g}_{tx,a,c,d}+A^{f32,g}_{tx,f,c+g,d+h}*D^{f32,g}_{a,f,g,h};];")
CONV_SIG = sig(A=[1, 8, 10, 10], D=[16, 8, 3, 3], C=[1, 16, 8, 8])
SOFTMAX = parse_program(
    "B^{64}_{tx=0}L^{512}_{a=0}[D^{f32,g}_{tx}=max(D^{f32,g}_{tx},A^{f32,g}_{tx,a});];"
    "B^{64}_{tx=0}L^{512}_{a=0}[E^{f32,g}_{tx}=E^{f32,g}_{tx}+exp(A^{f32,g}_{tx,a}-D^{f32,g}_{tx});];"
    "B^{64}_{tx=0}L^{512}_{a=0}[C^{f32,g}_{tx,a}=exp(A^{f32,g}_{tx,a}-D^{f32,g}_{tx})/E^{f32,g}_{tx};];")
SOFTMAX_SIG = sig(A=[64, 512], C=[64, 512])


def kernel_nest(program):
    """The nest holding the accumulation (the last one that has a U loop)."""
    return [n for n in program.nests if any(lp.kind == "U" for lp in n.loops)][-1]


def assert_chained(macro, start):
    """Every step is one registered strategy's transformation of the previous step's result."""
    assert macro.steps[0].before == start
    for a, b in zip(macro.steps, macro.steps[1:], strict=False):
        assert b.before == a.after
    assert macro.after == macro.steps[-1].after


def assert_micro_kernel(program):
    nest = kernel_nest(program)
    kinds = [lp.kind for lp in nest.loops]
    stmt = nest.body[0]
    inner = nest.loops[-1]
    assert "P" in kinds and kinds[-1] == "V" and kinds[-2] == "U"
    p = kinds.index("P")
    assert nest.loops[p].extent >= 2
    # the vector loop walks the output's last (contiguous) subscript with stride 1
    assert stmt.lhs.indices[-1].rhs.name == inner.var if hasattr(stmt.lhs.indices[-1], "rhs") \
        else stmt.lhs.indices[-1].name == inner.var
    # the reduction loops stand above the tile's point loops
    spatial = {v.name for ix in stmt.lhs.indices for v in _vars(ix)}
    reductions = [k for k, lp in enumerate(nest.loops) if lp.var not in spatial]
    assert reductions and max(reductions) < len(kinds) - 2


def _vars(ix):
    from leir.ast import Var, walk_expr

    return [n for n in walk_expr(ix) if isinstance(n, Var)]


@pytest.mark.parametrize("program", [MM_B, MM_L], ids=["B-form", "L-form"])
def test_micro_kernel_on_matmul_is_a_chain_of_strategy_steps(program):
    macros = micro_kernels(Context(program, MM_SIG), AVX512)
    assert len(macros) == 3 and macros[0].params == {"tile": [4, 64], "pack": False}
    assert sum(m.params["pack"] for m in macros) == 1
    for m in macros:
        assert_chained(m, program)
        assert_micro_kernel(m.after)
        names = [t.strategy for t in m.steps]
        assert {"loop_parallelization", "loop_reorder", "loop_unrolling", "loop_vectorization"} <= set(names)
        assert ("layout_transformation" in names) == m.params["pack"]
    packed = next(m for m in macros if m.params["pack"])
    assert packed.after.nests[0].body[0].lhs.tensor != "D"   # the packed copy stands first


def test_tile_shapes_follow_the_vector_registers():
    assert tile_shapes(128, 128, 16, 32, 2)[:2] == [(4, 64, 16), (8, 32, 16)]   # AVX-512: 16 accumulators
    assert tile_shapes(128, 128, 8, 16, 2)[0] == (4, 16, 8)                     # AVX2: 8 of its 16 registers
    assert all(r * -(-c // w) <= 12 for r, c, w in tile_shapes(128, 128, 8, 16, 2))
    assert tile_shapes(4, 128, 16, 32, 2) == [(2, 64, 16), (2, 32, 16), (2, 16, 16)]  # two row tiles, two cores
    # 56 columns on 16 lanes: vectors of 14 (a masked register) first, then the whole axis in seven
    # vectors of 8, where 8 rows would take 56 accumulators and do not fit
    shapes = tile_shapes(64, 56, 16, 32, 2)
    assert shapes[:3] == [(4, 56, 14), (8, 28, 14), (4, 56, 8)]
    assert (8, 56, 8) not in shapes and all(r * (c // w) <= 28 for r, c, w in shapes)
    assert tile_shapes(64, 14, 16, 32, 2)[0] == (8, 14, 14)                      # one masked register
    assert tile_shapes(64, 54, 16, 32, 2) == []                                  # 54: no width fits


def test_vector_widths_a_whole_register_else_a_masked_one_and_the_widest_half_or_quarter():
    assert [vector_width(c, 16) for c in (64, 32, 56, 24, 12, 14, 7)] == [16, 16, 8, 8, 4, 0, 0]
    assert vector_width(6, 2) == 2   # float64 on SSE: two lanes
    assert [vector_widths(c, 16) for c in (64, 56, 26, 24, 14, 54, 7, 6, 5)] == [[16], [14, 8], [13], [12, 8], [14],
                                                                              [], [7], [6], []]
    assert vector_widths(56, 8) == [8] and vector_widths(14, 8) == [7]          # AVX2 float32


def test_a_masked_register_tile_is_offered_beside_the_half_register_one_and_every_step_verifies():
    """conv2d 64x56's 56 output columns: a tile in vectors of 14 lanes (one register, two lanes masked)
    and one in vectors of 8 are both proposed; the first verifies step by step."""
    from gpu_tasks.verify import verify_pair

    macros = micro_kernels(Context(CONV_56, CONV_56_SIG), AVX512)
    widths = [m.params.get("vector", 16) for m in macros if "tile" in m.params]
    assert widths[0] == 14 and 8 in widths
    nest = kernel_nest(macros[0].after)
    assert (nest.loops[-1].kind, nest.loops[-1].extent) == ("V", 14)
    assert_chained(macros[0], CONV_56)
    for state in {format_program(t.after): t.after for t in macros[0].steps}.values():
        assert verify_pair(CONV_56, state, CONV_56_SIG, "llvm", 2, 0).status == "exact", format_program(state)


# conv2d's 56 output columns (padded input, 3x3): no whole AVX-512 register divides them
CONV_56 = parse_program("B^{1}_{tx=0}L^{8}_{a=0}L^{2}_{c=0}L^{56}_{d=0}L^{4}_{f=0}L^{3}_{g=0}L^{3}_{h=0}"
                        "[C^{f32,g}_{tx,a,c,d}=C^{f32,g}_{tx,a,c,d}+A^{f32,g}_{tx,f,c+g,d+h}*D^{f32,g}_{a,f,g,h};];")
CONV_56_SIG = sig(A=[1, 4, 4, 58], D=[8, 4, 3, 3], C=[1, 8, 2, 56])


# A convolution whose 24 output columns are not a whole number of AVX-512 registers (16 lanes)
CONV_RAGGED = parse_program("B^{1}_{tx=0}L^{8}_{a=0}L^{4}_{c=0}L^{24}_{d=0}L^{4}_{f=0}L^{3}_{g=0}L^{3}_{h=0}"
                            "[C^{f32,g}_{tx,a,c,d}=C^{f32,g}_{tx,a,c,d}+A^{f32,g}_{tx,f,c+g,d+h}*D^{f32,g}_{a,f,g,h};];")
CONV_RAGGED_SIG = sig(A=[1, 4, 6, 26], D=[8, 4, 3, 3], C=[1, 8, 4, 24])


def test_a_ragged_column_tile_is_computed_in_narrower_vectors_and_every_step_verifies():
    """A vector loop of 24 lanes would be ragged on 16-lane registers (56 lanes made conv2d 64x56 six
    times slower than its serial loop): beside the tile in masked vectors of 12, one whose columns are
    3 unrolled vectors of 8."""
    from gpu_tasks.verify import verify_pair

    macros = micro_kernels(Context(CONV_RAGGED, CONV_RAGGED_SIG), AVX512)
    assert macros[0].params["vector"] == 12
    macro = next(m for m in macros if m.params.get("vector") == 8)
    assert_chained(macro, CONV_RAGGED)
    nest = kernel_nest(macro.after)
    assert [(lp.kind, lp.extent) for lp in nest.loops[-3:]] == [("U", 4), ("U", 3), ("V", 8)]
    assert macro.params["tile"] == [4, 24]
    for state in {format_program(t.after): t.after for t in macro.steps}.values():
        assert verify_pair(CONV_RAGGED, state, CONV_RAGGED_SIG, "llvm", 2, 0).status == "exact", format_program(state)


def test_micro_kernel_transposes_an_operand_that_walks_the_vector_axis_with_a_stride():
    (con,) = contractions(MM_T)
    assert con.reused == "C" and con.reused_stride == 32
    macro = micro_kernels(Context(MM_T, MM_T_SIG), AVX512)[0]
    assert macro.steps[0].strategy == "layout_transformation" and macro.steps[0].params["copy"] == "transposed"
    assert_chained(macro, MM_T)
    assert_micro_kernel(macro.after)
    copy = macro.after.nests[0].body[0].lhs.tensor
    reads = [a for a in _accesses(kernel_nest(macro.after).body[0].rhs) if a.tensor == copy]
    assert reads and reads[0].indices[-1] != reads[0].indices[0]


def _accesses(e):
    from leir.ast import accesses

    return list(accesses(e))


def test_micro_kernel_on_a_convolution_parallelises_channels_not_the_batch_of_one():
    macro = micro_kernels(Context(CONV, CONV_SIG), AVX512)[0]
    assert_chained(macro, CONV)
    assert_micro_kernel(macro.after)
    nest = kernel_nest(macro.after)
    assert nest.loops[0].kind == "B" and nest.loops[0].extent == 1   # the batch loop stays as it was
    assert [lp.extent for lp in nest.loops[-5:-2]] == [8, 3, 3]      # input channels, kernel rows, columns


def test_row_kernel_vectorises_and_parallelises_every_heavy_nest():
    fused, macro = row_kernels(Context(SOFTMAX, SOFTMAX_SIG), AVX512)   # the unfused one comes second
    assert "fused" not in macro.params and fused.steps[:len(macro.steps)] == macro.steps
    assert_chained(macro, SOFTMAX)
    params = [t.params for t in macro.steps if t.strategy == "loop_vectorization"]
    assert len(params) == 3 and sum(bool(p.get("partials")) for p in params) == 2
    # partial results one register wide: the serial chain that combines them is 16 long, not 32
    assert [p["width"] for p in params if p.get("partials")] == [16, 16]
    assert all(p.get("exp") == "fast" for p in params[:2])            # the two nests with exp
    heavy = [n for n in macro.after.nests if any(lp.kind == "V" for lp in n.loops)]
    assert len(heavy) == 3 and all(n.loops[0].kind == "P" for n in heavy)
    assert not micro_kernels(Context(SOFTMAX, SOFTMAX_SIG), AVX512)   # no contraction here


def test_row_kernel_fuses_the_rows_of_every_nest_into_one_parallel_loop_and_every_step_verifies():
    """The softmax's three nests, their partial results' combining nests made parallel too, become one
    parallel row loop (one fork/join, a row's data in cache from pass to pass)."""
    from gpu_tasks.verify import verify_pair

    fused, plain = row_kernels(Context(SOFTMAX, SOFTMAX_SIG), AVX512)
    assert_chained(fused, SOFTMAX)
    assert len(plain.after.nests) == 5          # three passes, two of them with a combining nest
    (nest,) = fused.after.nests
    assert [lp.kind for lp in nest.loops] == ["P"] and nest.loops[0].extent == 64
    assert len(nest.body) == 5 and fused.params["fused"] == 4
    added = [t.strategy for t in fused.steps[len(plain.steps):]]
    assert added.count("loop_fusion") == 4 and set(added) == {"loop_fusion", "loop_parallelization"}
    for t in fused.steps[len(plain.steps):]:
        assert verify_pair(SOFTMAX, t.after, SOFTMAX_SIG, "llvm", 2, 0).status in ("exact", "close")


def test_row_kernel_fusion_stops_at_its_step_limit(monkeypatch):
    import search.macros as macros

    monkeypatch.setattr(macros, "MAX_ROW_KERNEL_STEPS", 8)
    fused, plain = row_kernels(Context(SOFTMAX, SOFTMAX_SIG), AVX512)
    assert len(plain.steps) == 6 and len(fused.steps) <= 8 and fused.params["fused"] == 1
    monkeypatch.setattr(macros, "MAX_ROW_KERNEL_STEPS", 6)
    (only,) = row_kernels(Context(SOFTMAX, SOFTMAX_SIG), AVX512)
    assert only.steps == plain.steps


LAYERNORM = parse_program(
    "B^{16}_{tx=0}L^{256}_{a=0}[F^{f32,g}_{tx}=F^{f32,g}_{tx}+A^{f32,g}_{tx,a};];"
    "B^{16}_{tx=0}[G^{f32,g}_{tx}=F^{f32,g}_{tx}/256;];"
    "B^{16}_{tx=0}L^{256}_{a=0}[H^{f32,g}_{tx}=H^{f32,g}_{tx}+(A^{f32,g}_{tx,a}-G^{f32,g}_{tx})**2;];"
    "B^{16}_{tx=0}[I^{f32,g}_{tx}=H^{f32,g}_{tx}/256;];"
    "B^{16}_{tx=0}L^{256}_{a=0}[J^{f32,g}_{tx,a}=(A^{f32,g}_{tx,a}-G^{f32,g}_{tx})/sqrt(I^{f32,g}_{tx}+1e-05);];"
    "B^{16}_{tx=0}L^{256}_{a=0}[C^{f32,g}_{tx,a}=D^{f32,g}_{a}*J^{f32,g}_{tx,a}+E^{f32,g}_{a};];")
LAYERNORM_SIG = sig(A=[16, 256], D=[256], E=[256], C=[16, 256])


def test_row_kernel_inlines_an_elementwise_chain_but_no_statistic_and_every_step_verifies():
    """The normalised value J, read only by the affine nest over the same elements, is computed there
    (one pass, one vector loop); the per-row mean G and variance I, read per element, are not."""
    from gpu_tasks.verify import verify_pair

    fused, plain = row_kernels(Context(LAYERNORM, LAYERNORM_SIG), AVX512)
    assert_chained(fused, LAYERNORM)
    assert fused.steps[0].strategy == "compute_inline" and fused.steps[0].site.tensors == ("J",)
    assert plain.params == {"nests": 3, "inlined": 1} and fused.steps[:len(plain.steps)] == plain.steps
    assert [t.strategy for t in fused.steps].count("compute_inline") == 1
    (nest,) = fused.after.nests
    written = [s.lhs.tensor for s in nest.body if isinstance(s, Stmt)]
    assert "J" not in written and {"G", "I"} <= set(written)
    last = nest.body[-1]
    assert last.loops[-1].kind == "V" and last.body[0].lhs.tensor == "C"   # the chain, vectorised
    for t in fused.steps:
        assert verify_pair(LAYERNORM, t.after, LAYERNORM_SIG, "llvm", 2, 0).status in ("exact", "close")


@pytest.mark.parametrize("consumer, inlined", [("E^{f32,g}_{tx,a}*D^{f32,g}_{a}", True),
                                               ("E^{f32,g}_{tx,a}*E^{f32,g}_{tx,a}", False)])
def test_row_kernel_never_inlines_a_value_it_would_compute_twice(consumer, inlined):
    program = parse_program("B^{16}_{tx=0}L^{256}_{a=0}[E^{f32,g}_{tx,a}=exp(A^{f32,g}_{tx,a});];"
                            f"B^{{16}}_{{tx=0}}L^{{256}}_{{a=0}}[C^{{f32,g}}_{{tx,a}}={consumer};];")
    macros = row_kernels(Context(program, sig(A=[16, 256], D=[256], C=[16, 256])), AVX512)
    steps = [t.strategy for m in macros for t in m.steps]
    assert macros and ("compute_inline" in steps) == inlined
    assert all(m.params.get("inlined", 0) == int(inlined) for m in macros)


GELU = parse_program("B^{64}_{tx=0}L^{256}_{a=0}"
                     "[C^{f32,g}_{tx,a}=A^{f32,g}_{tx,a}*0.5*(1+erf(A^{f32,g}_{tx,a}/sqrt(2)));];")
MISH = parse_program("B^{64}_{tx=0}L^{256}_{a=0}[C^{f32,g}_{tx,a}=A^{f32,g}_{tx,a}*"
                     "(1-2/(exp(2*log(1+exp(A^{f32,g}_{tx,a})))+1));];")
LOG_SOFTMAX_TAIL = parse_program("B^{64}_{tx=0}L^{256}_{a=0}"
                                 "[C^{f32,g}_{tx,a}=A^{f32,g}_{tx,a}-log(D^{f32,g}_{tx});];")


@pytest.mark.parametrize("program, signature, fast", [
    (GELU, sig(A=[64, 256], C=[64, 256]), {"math": "fast"}),   # erf: 29 cycles a call, scalar
    (LOG_SOFTMAX_TAIL, sig(A=[64, 256], D=[64], C=[64, 256]), {"math": "fast"}),   # a log alone
    (MISH, sig(A=[64, 256], C=[64, 256]), {"math": "fast"}),   # fast_log nested in fast_exp
])
def test_row_kernel_computes_erf_and_log_in_their_fast_forms_and_every_step_verifies(
        program, signature, fast):
    """erf as one scalar library call per element made a GELU tail 17x slower than fast_erf in vector
    code; the row kernel asks for `math: fast` where a nest calls erf or log (mish's nest: 904 µs with
    fast_exp around the library's log, 571 µs all fast, benchmarks/bench_fast_forms.py)."""
    from gpu_tasks.verify import verify_pair

    macros = row_kernels(Context(program, signature), AVX512)
    (vector,) = {json_key(t.params): t for m in macros for t in m.steps
                 if t.strategy == "loop_vectorization"}.values()
    assert {k: vector.params.get(k) for k in ("math", "exp") if vector.params.get(k)} == fast
    fns = {"math": ("fast_erf", "fast_log"), "exp": ("fast_exp",)}[next(iter(fast))]
    text = format_program(vector.after)
    assert any(f in text for f in fns)
    assert verify_pair(program, vector.after, signature, "llvm", 2, 0).status == "close"


def json_key(params: dict) -> str:
    import json

    return json.dumps(params, sort_keys=True)


def test_no_macro_on_cuda_and_none_twice_on_a_finished_kernel():
    assert macro_proposals(Context(MM_B, MM_SIG, "cuda")) == []
    done = micro_kernels(Context(MM_B, MM_SIG), AVX512)[0].after
    assert micro_kernels(Context(done, MM_SIG), AVX512) == []


# --- the analysis ------------------------------------------------------------------------------------

def test_analysis_ranks_what_the_matmul_needs_before_partial_sums():
    reorder = parse_program("B^{128}_{tx=0}L^{128}_{c=0}L^{128}_{a=0}"
                            "[D^{f32,g}_{tx,a}=D^{f32,g}_{tx,a}+A^{f32,g}_{tx,c}*C^{f32,g}_{c,a};];")
    partials = parse_program("B^{128}_{tx=0}L^{128}_{a=0}L^{8}_{d=0}V^{16}_{c=0}"
                             "[E^{f32,g}_{tx,a,c}=E^{f32,g}_{tx,a,c}+A^{f32,g}_{tx,d*16+c}*C^{f32,g}_{d*16+c,a};];"
                             "B^{128}_{tx=0}L^{128}_{a=0}L^{16}_{c=0}[D^{f32,g}_{tx,a}=D^{f32,g}_{tx,a}+E^{f32,g}_{tx,a,c};];")
    kernel = micro_kernels(Context(MM_B, MM_SIG), AVX512)[0].after
    gains = [log2_speedup(MM_B, p, AVX512) for p in (partials, reorder, kernel)]
    assert 0 < gains[0] < gains[1] < gains[2]
    # a parallel loop under a serial one pays a fork/join per outer iteration
    inner_p = parse_program("L^{128}_{tx=0}P^{128}_{a=0}L^{128}_{c=0}"
                            "[D^{f32,g}_{tx,a}=D^{f32,g}_{tx,a}+A^{f32,g}_{tx,c}*C^{f32,g}_{c,a};];")
    outer_p = parse_program("P^{128}_{tx=0}L^{128}_{a=0}L^{128}_{c=0}"
                            "[D^{f32,g}_{tx,a}=D^{f32,g}_{tx,a}+A^{f32,g}_{tx,c}*C^{f32,g}_{c,a};];")
    assert estimate_cycles(outer_p, AVX512) < estimate_cycles(inner_p, AVX512) < estimate_cycles(MM_B, AVX512)


def test_machine_detect_reads_the_cpu():
    m = Machine.detect()
    assert m.cores >= 1 and m.vector_bits in (128, 256, 512) and m.lanes("f32") == m.vector_bits // 32
    assert AVX2.lanes("f64") == 4 and AVX2.lanes("f16") == 16


# --- in the search ------------------------------------------------------------------------------------

class MacroFirst(Policy):
    """Proposes the micro-kernels of the root, then nothing."""

    name = "macro-first"

    def actions(self, ctx, node, want):
        if node.depth == 0:
            yield from (macro_action(m) for m in micro_kernels(ctx, AVX512))


def test_search_verifies_and_records_every_step_and_times_the_last():
    verified, timed = [], []

    def verify(root, state):
        verified.append(format_program(state))
        return "exact"

    def measure(root, state):
        timed.append(format_program(state))
        return 1000.0, 10.0

    result = run(MM_B, MM_SIG, "bfs", MacroFirst(), verify, measure, budget=Budget(states=40),
                 config=DriverConfig(depth=12, branching=3))
    macros = micro_kernels(Context(MM_B, MM_SIG), AVX512)
    # the second and third macros start from states the first reached: shared steps are not repeated
    expected = {format_program(t.after) for m in macros for t in m.steps}
    assert set(verified) == expected and len(verified) == len(expected) == result.states_verified
    assert set(timed) == {format_program(m.after) for m in macros}
    best = result.best
    assert [n.action.strategy for n in result.trajectory] == [t.strategy for t in macros[0].steps]
    assert all(n.action.source == "macro:micro_kernel" for n in result.trajectory)
    assert [n.speedup for n in result.trajectory][:-1] == [None] * (len(macros[0].steps) - 1)
    assert best.origin is result.root and best in result.root.successors
    out = result.to_json()
    assert len(out["trajectory"]) == len(macros[0].steps)


def test_a_macro_that_does_not_fit_the_budget_is_not_started():
    result = run(MM_B, MM_SIG, "bfs", MacroFirst(), lambda r, s: "exact", lambda r, s: (1000.0, 10.0),
                 budget=Budget(states=3), config=DriverConfig(depth=12, branching=3))
    assert result.states_verified == 0 and result.best is result.root


def test_a_failing_step_stops_the_macro_there():
    def verify(root, state):
        return "mismatch" if any(lp.kind == "U" for n in state.nests for lp in n.loops) else "exact"

    result = run(MM_B, MM_SIG, "bfs", MacroFirst(), verify, lambda r, s: (1000.0, 10.0),
                 budget=Budget(states=40), config=DriverConfig(depth=12, branching=1))
    failed = [n for n in result.nodes if n.status == "mismatch"]
    assert len(failed) == 1 and failed[0].action.strategy == "loop_unrolling" and not failed[0].children
    assert result.best is result.root and not any(n.speedup for n in result.nodes[1:])


def test_every_macro_step_verifies_through_tvm():
    from gpu_tasks.verify import verify_pair

    program = parse_program("B^{32}_{tx=0}L^{64}_{a=0}L^{16}_{c=0}"
                            "[D^{f32,g}_{tx,a}=D^{f32,g}_{tx,a}+A^{f32,g}_{tx,c}*C^{f32,g}_{c,a};];")
    signature = sig(A=[32, 16], C=[16, 64], D=[32, 64])
    macros = micro_kernels(Context(program, signature), AVX2)
    assert macros
    states = {format_program(t.after): t.after for m in macros for t in m.steps}
    for state in states.values():
        assert verify_pair(program, state, signature, "llvm", 2, 0).status == "exact", format_program(state)
    sites = statement_sites(macros[0].after)
    assert sites and all(s.stmt for s in sites)


def test_a_program_with_several_contractions_gets_one_macro_for_all_of_them():
    mlp = parse_program("B^{32}_{tx=0}L^{128}_{a=0}L^{64}_{c=0}"
                        "[D^{f32,g}_{tx,a}=D^{f32,g}_{tx,a}+A^{f32,g}_{tx,c}*C^{f32,g}_{c,a};];"
                        "B^{32}_{tx=0}L^{64}_{a=0}L^{128}_{c=0}"
                        "[F^{f32,g}_{tx,a}=F^{f32,g}_{tx,a}+D^{f32,g}_{tx,c}*E^{f32,g}_{c,a};];")
    signature = sig(A=[32, 64], C=[64, 128], E=[128, 64], F=[32, 64])
    macros = micro_kernels(Context(mlp, signature), AVX512)
    every = [m for m in macros if "nests" in m.params]
    assert len(every) == 1 and every[0].params == {"nests": 2}
    assert_chained(every[0], mlp)
    kernels = [n for n in every[0].after.nests if any(lp.kind == "U" for lp in n.loops)]
    assert len(kernels) == 2


# a grouped-query attention's scores: two query heads (a) share one key head (a//2)
GQA_SCORES = parse_program("B^{1}_{tx=0}L^{4}_{a=0}L^{64}_{c=0}L^{64}_{d=0}L^{16}_{f=0}"
                           "[S^{f32,g}_{tx,a,c,d}=S^{f32,g}_{tx,a,c,d}+Q^{f32,g}_{tx,a,c,f}*K^{f32,g}_{tx,a//2,d,f};];")
GQA_SIG = sig(Q=[1, 4, 64, 16], K=[1, 2, 64, 16], S=[1, 4, 64, 64])


def test_a_grouped_head_subscript_does_not_hide_a_contraction():
    """`a//2` is not affine, but the tile's rows (c) and columns (d) do not walk it."""
    (con,) = contractions(GQA_SCORES)
    assert (con.rows, con.cols, con.reductions, con.reused) == ("c", "d", ("f",), "K")
    macro = micro_kernels(Context(GQA_SCORES, GQA_SIG), AVX512)[0]
    assert_chained(macro, GQA_SCORES)
    assert_micro_kernel(macro.after)


def test_one_macro_schedules_the_heavy_contractions_and_then_the_other_heavy_nests():
    """program_kernel: every heavy contraction's micro-kernel, then the row kernel of the rest; a
    contraction below HEAVY_SHARE of the static cost (here the 8x8x8 one) is left as it is."""
    program = parse_program("B^{32}_{tx=0}L^{128}_{a=0}L^{64}_{c=0}"
                            "[D^{f32,g}_{tx,a}=D^{f32,g}_{tx,a}+A^{f32,g}_{tx,c}*C^{f32,g}_{c,a};];"
                            "B^{32}_{tx=0}L^{128}_{a=0}[E^{f32,g}_{tx,a}=exp(D^{f32,g}_{tx,a})*D^{f32,g}_{tx,a};];"
                            "B^{32}_{tx=0}L^{64}_{a=0}L^{128}_{c=0}"
                            "[F^{f32,g}_{tx,a}=F^{f32,g}_{tx,a}+E^{f32,g}_{tx,c}*G^{f32,g}_{c,a};];"
                            "B^{8}_{tx=0}L^{8}_{a=0}L^{8}_{c=0}"
                            "[H^{f32,g}_{tx,a}=H^{f32,g}_{tx,a}+I^{f32,g}_{tx,c}*J^{f32,g}_{c,a};];")
    # H is an output too: a dead light contraction would be removed first (`_drop_dead`)
    signature = Signature.from_json({"tensors": [
        *({"name": n, "shape": shape, "dtype": "float32", "role": "input"}
          for n, shape in (("A", [32, 64]), ("C", [64, 128]), ("G", [128, 64]), ("I", [8, 8]), ("J", [8, 8]))),
        *({"name": n, "shape": shape, "dtype": "float32", "role": "output"} for n, shape in (("F", [32, 64]),
                                                                                            ("H", [8, 8])))]})
    ctx = Context(program, signature)
    assert len(contractions(program)) == 3
    proposals = macro_proposals(ctx, AVX512)
    (whole,) = [m for m in proposals if m.name == "program_kernel"]
    (every,) = [m for m in proposals if m.name == "micro_kernel" and "nests" in m.params]
    assert every.params == {"nests": 2} and whole.params == {"nests": 2, "row_nests": 1}
    assert_chained(whole, program)
    assert whole.steps[:len(every.steps)] == every.steps        # the micro-kernels first, then the rows
    rows = [t.strategy for t in whole.steps[len(every.steps):]]
    assert rows[:2] == ["loop_vectorization", "loop_parallelization"]
    assert whole.params["row_nests"] == 1 and set(rows[2:]) <= {"loop_fusion", "loop_parallelization"}
    small = next(n for n in whole.after.nests if isinstance(n.body[0], Stmt) and n.body[0].lhs.tensor == "H")
    assert [lp.kind for lp in small.loops] == ["B", "L", "L"]   # below HEAVY_SHARE: untouched
    (unfused,) = [m for m in proposals if m.name == "row_kernel" and "fused" not in m.params]
    act = next(n for n in unfused.after.nests if n.body[0].lhs.tensor == "E")
    assert act.loops[0].kind == "P" and act.loops[-1].kind == "V"


# KernelBench level 2, 95_Matmul_Add_Swish_Tanh_GELU_Hardtanh as translated: a matmul, its bias, and
# six element-wise nests; the whole program kernel is 18 steps
GEMM_TAIL = parse_program(
    "B^{128}_{tx=0}L^{128}_{a=0}L^{128}_{c=0}[C^{f32,g}_{tx,a}=C^{f32,g}_{tx,a}+A^{f32,g}_{tx,c}*J^{f32,g}_{a,c};];"
    "B^{128}_{tx=0}L^{128}_{a=0}[C^{f32,g}_{tx,a}=C^{f32,g}_{tx,a}+K^{f32,g}_{a};];"
    "B^{128}_{tx=0}L^{128}_{a=0}[D^{f32,g}_{tx,a}=C^{f32,g}_{tx,a}+M^{f32,g}_{a};];"
    "B^{128}_{tx=0}L^{128}_{a=0}[E^{f32,g}_{tx,a}=1/(1+exp(-D^{f32,g}_{tx,a}));];"
    "B^{128}_{tx=0}L^{128}_{a=0}[F^{f32,g}_{tx,a}=E^{f32,g}_{tx,a}*D^{f32,g}_{tx,a};];"
    "B^{128}_{tx=0}L^{128}_{a=0}[N^{f32,g}_{tx,a}=exp(min(max(F^{f32,g}_{tx,a},-20),20));"
    "O^{f32,g}_{tx,a}=exp(-min(max(F^{f32,g}_{tx,a},-20),20));"
    "G^{f32,g}_{tx,a}=(N^{f32,g}_{tx,a}-O^{f32,g}_{tx,a})/(N^{f32,g}_{tx,a}+O^{f32,g}_{tx,a});];"
    "B^{128}_{tx=0}L^{128}_{a=0}[H^{f32,g}_{tx,a}=G^{f32,g}_{tx,a}*0.5*(1+erf(G^{f32,g}_{tx,a}/sqrt(2)));];"
    "B^{128}_{tx=0}L^{128}_{a=0}[I^{f32,g}_{tx,a}=min(max(H^{f32,g}_{tx,a},-1),1);];")
GEMM_TAIL_SIG = sig(A=[128, 128], J=[128, 128], K=[128], M=[128], I=[128, 128])


def test_a_compact_program_kernel_fits_a_16_state_search_and_every_step_verifies():
    """Where the whole program kernel is longer than COMPACT_STEPS (a macro longer than the states left
    is never started), a second one takes the micro-kernel and the row kernel of the heaviest other
    nests that fit: here the GELU's erf nest, the heaviest, gets its vector and parallel loops."""
    from gpu_tasks.verify import verify_pair
    from search.macros import COMPACT_STEPS

    proposals = macro_proposals(Context(GEMM_TAIL, GEMM_TAIL_SIG), AVX512)
    whole, compact = [m for m in proposals if m.name == "program_kernel"]
    assert len(whole.steps) > COMPACT_STEPS >= len(compact.steps) and compact.params["compact"] is True
    assert_chained(compact, GEMM_TAIL)
    first = next(m for m in proposals if m.name == "micro_kernel")
    assert compact.steps[:len(first.steps)] == whole.steps[:len(first.steps)] == first.steps
    assert_micro_kernel(compact.after)
    gelu = next(n for n in compact.after.nests if any(
        isinstance(e, Call) and e.fn == "fast_erf" for st, _ in body_statements(n) for e in walk_expr(st.rhs)))
    assert gelu.loops[0].kind == "P" and any(lp.kind == "V" for lp in gelu.loops)
    assert verify_pair(GEMM_TAIL, compact.after, GEMM_TAIL_SIG, "llvm", 2, 0).status == "close"
    # where the whole program kernel fits, there is no second one
    small = [m for m in macro_proposals(Context(MM_B, MM_SIG), AVX512) if m.name == "program_kernel"]
    assert len(small) <= 1 and all("compact" not in m.params for m in small)


def test_a_16_state_search_reaches_the_compact_program_kernel():
    """Greedy with 16 states on GEMM_TAIL: the micro-kernel first (6 states), then the compact program
    kernel continues from it (its first 6 steps are states seen before, free) in the 10 left."""
    def measure(root, state):
        text = format_program(state)
        return 1000.0, 1000.0 / (1 + text.count("P^") + text.count("V^") + 4 * text.count("fast_erf"))

    result = run(GEMM_TAIL, GEMM_TAIL_SIG, "greedy", _library(), lambda r, s: "exact", measure,
                 budget=Budget(states=16))
    assert result.states_verified <= 16
    assert "fast_erf" in format_program(result.best.program)
    assert any(n.move == "program_kernel" for n in result.trajectory)


def _library():
    from search.policies import LibraryPolicy

    return LibraryPolicy(machine=AVX512)


# KernelBench level 2, 32_Conv2d_Scaling_Min as translated (16x16x16x16, the size the benchmark chose): the convolution, its bias, the
# scale, the minimum over channels, and the indices of that minimum (K, F), which nothing reads
CONV_MIN = parse_program(
    "B^{16}_{tx=0}L^{16}_{a=0}L^{14}_{c=0}L^{14}_{d=0}L^{16}_{f=0}L^{3}_{g=0}L^{3}_{h=0}"
    "[C^{f32,g}_{tx,a,c,d}=C^{f32,g}_{tx,a,c,d}+A^{f32,g}_{tx,f,c+g,d+h}*H^{f32,g}_{a,f,g,h};];"
    "B^{16}_{tx=0}L^{16}_{a=0}L^{14}_{c=0}L^{14}_{d=0}[C^{f32,g}_{tx,a,c,d}=C^{f32,g}_{tx,a,c,d}+I^{f32,g}_{a};];"
    "B^{16}_{tx=0}L^{16}_{a=0}L^{14}_{c=0}L^{14}_{d=0}[D^{f32,g}_{tx,a,c,d}=C^{f32,g}_{tx,a,c,d}*2.0;];"
    "B^{16}_{tx=0}L^{16}_{a=0}L^{14}_{c=0}L^{14}_{d=0}[J^{f32,g}_{tx,0,c,d}=min(J^{f32,g}_{tx,0,c,d},D^{f32,g}_{tx,a,c,d});];"
    "B^{16}_{tx=0}L^{1}_{a=0}L^{14}_{c=0}L^{14}_{d=0}[E^{f32,g}_{tx,a,c,d}=J^{f32,g}_{tx,a,c,d};];"
    "B^{16}_{tx=0}L^{16}_{a=0}L^{14}_{c=0}L^{14}_{d=0}[K^{f32,g}_{tx,0,c,d}=min(K^{f32,g}_{tx,0,c,d},D^{f32,g}_{tx,a,c,d});"
    "F^{i64,g}_{tx,0,c,d}=0;];"
    "B^{16}_{tx=0}L^{16}_{a=0}L^{14}_{c=0}L^{14}_{d=0}[F^{i64,g}_{tx,0,c,d}=if_then_else(D^{f32,g}_{tx,15-a,c,d}<="
    "K^{f32,g}_{tx,0,c,d},15-a,F^{i64,g}_{tx,0,c,d});];"
    "B^{16}_{tx=0}L^{1}_{a=0}L^{14}_{c=0}L^{14}_{d=0}[G^{f32,g}_{tx,a,c,d}=E^{f32,g}_{tx,a,c,d};];")
CONV_MIN_SIG = sig(A=[16, 16, 16, 16], H=[16, 16, 3, 3], I=[16], G=[16, 1, 14, 14])


def test_after_a_convolutions_micro_kernel_its_tails_are_scheduled_and_dead_code_goes_first():
    """The scheduled convolution is not counted among the row kernel's nests (it made every tail look
    light: no program kernel was offered, and KernelBench's conv + tail problems kept their tails
    serial and scalar); the dead indices are removed before anything is scheduled."""
    from gpu_tasks.verify import verify_pair

    proposals = macro_proposals(Context(CONV_MIN, CONV_MIN_SIG), AVX512)
    kernels = [m for m in proposals if m.name == "program_kernel"]
    assert kernels
    for macro in kernels:
        assert_chained(macro, CONV_MIN)
        strategies = [t.strategy for t in macro.steps]
        assert strategies.count("dead_code_elimination") == 1 and macro.params.get("row_nests", 0) >= 1
        assert strategies.index("dead_code_elimination") > strategies.index("loop_unrolling")  # after the micro-kernel
        written = {s.stmt.lhs.tensor for s in statement_sites(macro.after)}
        assert not written & {"K", "F"}
        # the bias and the minimum over channels (the heavy tails): under a parallel loop, vector innermost
        tails = [site for site in statement_sites(macro.after) if site.stmt.lhs.tensor == "J"
                 or "I" in {a.tensor for a in walk_expr(site.stmt.rhs) if hasattr(a, "tensor")}]
        assert len(tails) == 2 and all(t.loops[0].kind == "P" and t.loops[-1].kind == "V" for t in tails), \
            format_program(macro.after)
        assert verify_pair(CONV_MIN, macro.after, CONV_MIN_SIG, "llvm", 2, 0).status in ("exact", "close")
    rows = [m for m in proposals if m.name == "row_kernel"]
    assert rows and all(m.params["dead"] == 1 and m.steps[0].strategy == "dead_code_elimination" for m in rows)



# A 3D convolution's output rows are 6 wide (KernelBench level 2, 47_Conv3d_Mish_Tanh's, as translated)
CONV3D = parse_program(
    "B^{8}_{tx=0}L^{8}_{a=0}L^{6}_{c=0}L^{6}_{d=0}L^{6}_{f=0}L^{8}_{g=0}L^{3}_{h=0}L^{3}_{i=0}L^{3}_{j=0}"
    "[C^{f32,g}_{tx,a,c,d,f}=C^{f32,g}_{tx,a,c,d,f}+A^{f32,g}_{tx,g,c+h,d+i,f+j}*F^{f32,g}_{a,g,h,i,j};];")
CONV3D_SIG = sig(A=[8, 8, 8, 8, 8], F=[8, 8, 3, 3, 3], C=[8, 8, 6, 6, 6])


def test_a_3d_convolutions_six_columns_get_a_micro_kernel_in_one_masked_half_register():
    from gpu_tasks.verify import verify_pair

    macros = micro_kernels(Context(CONV3D, CONV3D_SIG), AVX512)
    assert macros and all(m.params["vector"] == 6 and m.params["tile"][1] == 6 for m in macros)
    macro = macros[0]
    assert_chained(macro, CONV3D)
    (site,) = statement_sites(macro.after)
    assert site.loops[0].kind == "P" and site.loops[-1].kind == "V" and site.loops[-1].extent == 6
    assert verify_pair(CONV3D, macro.after, CONV3D_SIG, "llvm", 2, 0).status == "exact"


# two elementwise nests over 64 x 768, the first vectorised by a single step and still serial
ROWS_ONE_VECTORISED = parse_program(
    "B^{64}_{tx=0}L^{48}_{a=0}V^{16}_{c=0}[D^{f32,g}_{tx,a*16+c}=exp(A^{f32,g}_{tx,a*16+c});];"
    "B^{64}_{tx=0}L^{768}_{a=0}[C^{f32,g}_{tx,a}=exp(D^{f32,g}_{tx,a});];")
ROWS_SIG = sig(A=[64, 768], C=[64, 768])


def test_a_nest_vectorised_but_serial_still_gets_the_row_kernels_parallel_loop():
    """Only what a micro-kernel leaves (a parallel loop and a vector or unrolled one) is left out of the
    row kernel: a nest one step vectorised is still the row kernel's to make parallel."""
    from gpu_tasks.verify import verify_pair

    assert set(_heavy_row_nests(ROWS_ONE_VECTORISED, AVX512)) == {0, 1}
    done = ROWS_ONE_VECTORISED.nests[0]
    parallel = Nest((Loop("P", 64, "tx"),) + done.loops[1:], done.body)
    assert _heavy_row_nests(Program((parallel,) + ROWS_ONE_VECTORISED.nests[1:]), AVX512).keys() == {1}
    macros = row_kernels(Context(ROWS_ONE_VECTORISED, ROWS_SIG), AVX512)
    assert macros
    first = macros[-1].after.nests[0]   # the plain kernel (no fusion): the first nest made parallel
    assert first.loops[0].kind == "P" and first.loops[-1].kind == "V", format_program(macros[-1].after)
    assert verify_pair(ROWS_ONE_VECTORISED, macros[-1].after, ROWS_SIG, "llvm", 2, 0).status in ("exact", "close")


def test_a_strided_transposed_convolution_as_translated_gets_a_micro_kernel_over_its_channels():
    """By phases, the multiply-accumulate writes a channels-last temporary that the re-laid kernel
    walks at unit stride: a micro-kernel tiles it with no copy, its vectors along the output channels
    (a 3D one's rows of 3 to 8 positions at KernelBench's sizes have no vector width of their own)."""
    import torch
    import torch.nn as nn

    from gpu_tasks.verify import verify_pair
    from leir.frontend import translate

    torch.manual_seed(0)
    t = translate(nn.ConvTranspose3d(8, 32, 3, stride=2, padding=1), [torch.randn(4, 8, 4, 4, 4)])
    (con,) = contractions(t.program)
    nest = t.program.nests[con.nest]
    assert con.cols == nest.loops[7].var and nest.loops[7].extent == 32 and con.reused_stride == 1
    # the batch (4) and the first positions (4) are equally long: the one beside the columns is the
    # rows: its tile needs no moves past the positions (with them: 14-16 steps, the search's budget)
    assert nest.loops[3].extent == nest.loops[6].extent == 4 and con.rows == nest.loops[6].var
    macros = micro_kernels(Context(t.program, t.signature), AVX512)
    assert macros
    macro = macros[0]
    assert len(macro.steps) <= 9 and macro.steps[0].site.loops == (con.rows,), [s.strategy for s in macro.steps]
    assert_chained(macro, t.program)
    assert not any(s.strategy == "layout_transformation" for s in macro.steps)
    scheduled = macro.after.nests[con.nest]
    assert any(lp.kind == "P" for lp in scheduled.loops), format_program(macro.after)
    assert verify_pair(t.program, macro.after, t.signature, "llvm", 2, 0).status in ("exact", "close")
