"""The lowering of `fast_exp`, `fast_log` and `fast_erf` (our extensions): close to exp, log and erf
over float32's whole range, and vector code where each is one scalar library call per element."""
from __future__ import annotations

import re

import numpy as np
import pytest

pytest.importorskip("tvm")

N = 4096


def _program(fn: str, n: int = N) -> tuple[str, dict]:
    sig = {"tensors": [{"name": "A", "shape": [n], "dtype": "float32", "role": "input"},
                       {"name": "C", "shape": [n], "dtype": "float32", "role": "output"}]}
    return f"L^{{{n // 16}}}_{{a=0}}V^{{16}}_{{c=0}}[C^{{f32,g}}_{{a*16+c}}={fn}(A^{{f32,g}}_{{a*16+c}});];", sig


def test_fast_exp_is_close_to_exp_from_underflow_to_overflow():
    from leir.lower.api import run_numpy

    x = np.concatenate([np.linspace(-100, 100, N - 4, dtype=np.float32),
                        np.array([-np.inf, np.inf, 0.0, 88.0], dtype=np.float32)])
    got = run_numpy(*_program("fast_exp"), {"A": x})["C"]
    want = np.exp(x.astype(np.float64))
    normal = (want > 1.2e-38) & (want < 3.4e38)
    rel = np.abs(got[normal] - want[normal]) / want[normal]
    assert rel.max() < 5e-7                         # float32 rounding, not bitwise equal to expf
    assert got[x == -np.inf][0] == 0.0 and got[x == np.inf][0] == np.inf and got[x == 0.0][0] == 1.0
    assert np.all(got[want <= 1.2e-38] < 1.2e-38)   # underflow stays (almost) zero
    assert np.all(np.isinf(got[want >= 3.5e38]))    # overflow is inf, as exp's


def test_fast_exp_vector_loop_calls_no_expf():
    from leir.lower.api import build

    sources = {fn: build(*_program(fn, 64)).mod.inspect_source("ll") for fn in ("fast_exp", "exp")}
    assert "expf" in sources["exp"] or "llvm.exp" in sources["exp"]
    assert "expf" not in sources["fast_exp"] and "llvm.exp" not in sources["fast_exp"]


def test_nested_fast_exp_lowers_each_operand_once():
    """The operand, exponent and remainder are bound once (Let): three nested fast_exps lower to a
    function about three times one's size, not one with hundreds of copies of the innermost operand
    (mish's `exp(log(1+exp(x)))` took LLVM 6 s to compile that way), and compute the same values."""
    from leir.lower.api import lower_to_primfunc, run_numpy

    one, sig = _program("fast_exp", 64)
    three, _ = _program("fast_exp(fast_exp(fast_exp", 64)
    three = three.replace("(A^{f32,g}_{a*16+c})", "(A^{f32,g}_{a*16+c})))")
    sizes = [len(str(lower_to_primfunc(text, sig))) for text in (one, three)]
    assert sizes[1] < 4 * sizes[0]
    x = np.linspace(-3, 0.5, 64, dtype=np.float32)
    got = run_numpy(three, sig, {"A": x})["C"]
    np.testing.assert_allclose(got, np.exp(np.exp(np.exp(x.astype(np.float64)))), rtol=2e-6)


def _ulps(got, want):
    return np.abs(got.astype(np.float64) - want) / np.spacing(np.abs(want).astype(np.float32)).astype(np.float64)


def test_fast_log_is_within_one_ulp_of_log_and_keeps_its_special_values():
    from leir.lower.api import run_numpy

    rng = np.random.default_rng(0)
    x = np.concatenate([np.exp(rng.uniform(-87, 88, N - 8)),          # normal numbers over the whole range
                        [1e-40, 1e-45, 1.0, 0.5, 0.0, -1.0, np.inf, np.nan]]).astype(np.float32)
    got = run_numpy(*_program("fast_log"), {"A": x})["C"]
    with np.errstate(divide="ignore", invalid="ignore"):
        want = np.log(x.astype(np.float64))
    finite = np.isfinite(want)
    assert _ulps(got[finite], want[finite]).max() < 1.0      # subnormal inputs included
    assert got[x == 1.0][0] == 0.0 and got[x == 0.0][0] == -np.inf and got[x == np.inf][0] == np.inf
    assert np.isnan(got[x == -1.0][0]) and np.isnan(got[-1])


def test_fast_erf_is_within_a_few_ulp_of_erf():
    import math

    from leir.lower.api import run_numpy

    x = np.concatenate([np.linspace(-6, 6, N - 4), [0.0, 1e-30, 40.0, np.nan]]).astype(np.float32)
    got = run_numpy(*_program("fast_erf"), {"A": x})["C"]
    want = np.array([math.erf(v) if not math.isnan(v) else math.nan for v in x.astype(np.float64)])
    finite = ~np.isnan(want) & (want != 0)
    assert _ulps(got[finite], want[finite]).max() < 8 and np.abs(got[finite] - want[finite]).max() < 5e-7
    assert got[x == 0.0][0] == 0.0 and got[x == 40.0][0] == 1.0 and np.isnan(got[-1])


@pytest.mark.parametrize("fn,call", [("fast_log", "log"), ("fast_erf", "erf")])
def test_fast_log_and_fast_erf_vector_loops_call_no_library(fn, call):
    from leir.lower.api import build

    sources = {f: build(*_program(f, 64)).mod.inspect_source("ll") for f in (fn, call)}
    assert f"{call}f" in sources[call] or f"llvm.{call}" in sources[call]
    assert f"{call}f" not in sources[fn] and f"llvm.{call}" not in sources[fn]
    assert re.search(r"<(4|8|16) x float>", sources[fn])   # the lanes stay vector code


@pytest.mark.timeout(120)
def test_mish_with_every_fast_form_lowers_without_the_ieee_check_and_stays_close():
    """mish with `math: fast` nests fast_exp in fast_log in fast_exp: a statement holding a fast form is
    emitted as it is (the IEEE check substitutes every Let, and the checked tree grew exponentially:
    209 s to lower this statement), and it still computes mish within float32 rounding."""
    from tvm import tirx

    from leir.lower.api import run_numpy
    from leir.lower.expr import fast_log_f32
    from leir.lower.ieee import _has_fast_form

    assert _has_fast_form(fast_log_f32(tirx.Var("x", "float32")) + tirx.const(1.0, "float32"))
    assert not _has_fast_form(tirx.Var("x", "float32") * tirx.const(2.0, "float32"))
    sig = {"tensors": [{"name": "C", "shape": [64], "dtype": "float32", "role": "input"},
                       {"name": "D", "shape": [64], "dtype": "float32", "role": "output"}]}
    sp = "min(max(fast_log(1+fast_exp(C^{f32,g}_{a*16+c})),-20),20)"
    text = (f"L^{{4}}_{{a=0}}V^{{16}}_{{c=0}}[H^{{f32,g}}_{{a*16+c}}=fast_exp({sp});I^{{f32,g}}_{{a*16+c}}=fast_exp(-{sp});"
            "D^{f32,g}_{a*16+c}=C^{f32,g}_{a*16+c}*((H^{f32,g}_{a*16+c}-I^{f32,g}_{a*16+c})/"
            "(H^{f32,g}_{a*16+c}+I^{f32,g}_{a*16+c}));];")
    x = np.linspace(-8, 8, 64, dtype=np.float32)
    got = run_numpy(text, sig, {"C": x})["D"]
    want = x * np.tanh(np.log1p(np.exp(x.astype(np.float64))))
    np.testing.assert_allclose(got, want, rtol=2e-6, atol=1e-6)


def _chain(loops: str, body: str = "fast_exp(1+fast_log(1+fast_exp(A^{f32,g}_{a*16+c})))") -> tuple[str, dict]:
    sig = {"tensors": [{"name": "A", "shape": [256], "dtype": "float32", "role": "input"},
                       {"name": "C", "shape": [256], "dtype": "float32", "role": "output"}]}
    return f"{loops}[C^{{f32,g}}_{{a*16+c}}={body};];", sig


@pytest.mark.parametrize("loops", ["L^{16}_{a=0}V^{16}_{c=0}", "L^{16}_{a=0}L^{16}_{c=0}", "P^{16}_{a=0}V^{16}_{c=0}",
                                   "V^{16}_{c=0}L^{16}_{a=0}"])
def test_a_fast_operand_holding_a_fast_call_is_kept_in_a_cell_of_its_lane(loops):
    """fast_exp(1+fast_log(1+fast_exp(x))): each operand that holds a fast form is stored in a local
    cell and read back, so that the code generator does not simplify the inner polynomial into the
    outer one's every use (three levels took 16 s to build at -O3 and ran 8x slower). In a vector loop
    the cells are allocated before it with an element per lane (allocated inside, every lane read the
    last lane's value); elsewhere a one-element cell in the statement's loop. The values are the same
    in every loop form and within float32 rounding of the exact function."""
    from leir.lower.api import lower_to_script, run_numpy

    text, sig = _chain(loops)
    script = lower_to_script(text, sig)
    assert ("T.vectorized" in script) == loops.endswith("V^{16}_{c=0}")  # a vector loop must be innermost
    if "T.vectorized" in script:  # two cells of 16 elements, before the vector loop
        assert script.count("T.alloc_local(") == script.count("T.alloc_local((16,))") == 2
        assert script.rindex("T.alloc_local((16,))") < script.index("T.vectorized(16)")
    else:  # two one-element cells (printed as local scalars) in the loop
        assert "T.alloc_local(" not in script and script.count(": T.float32 = ") == 2
    x = np.linspace(-3, 3, 256, dtype=np.float32)
    got = run_numpy(text, sig, {"A": x})["C"]
    want = np.exp(1 + np.log(1 + np.exp(x.astype(np.float64))))
    np.testing.assert_allclose(got, want, rtol=3e-6)
    serial = run_numpy(*_chain("L^{16}_{a=0}L^{16}_{c=0}"), {"A": x})["C"]
    np.testing.assert_array_equal(got, serial)


def test_a_fast_call_in_a_select_branch_keeps_its_operand_inline():
    """A branch of a select runs only when it is chosen: a store of its operand before the select would
    compute it for every element (a branch may read what only its condition makes valid), so such an
    operand stays in the expression; the one in the condition, which always runs, is kept in a cell."""
    from leir.lower.api import lower_to_script, run_numpy
    from leir.lower.expr import fast_cells
    from leir.parse import parse_program

    nested = "fast_exp(1+fast_exp(A^{f32,g}_{a*16+c}))"
    branch = f"if_then_else(A^{{f32,g}}_{{a*16+c}}>0,{nested},0)"
    cond = f"if_then_else({nested}>3,1,0)"
    for body, cells in ((branch, 0), (cond, 1), (f"{nested}+{branch}", 1)):
        text, sig = _chain("L^{16}_{a=0}V^{16}_{c=0}", body)
        assert fast_cells(parse_program(text).nests[0].body[0].rhs) == cells
        assert lower_to_script(text, sig).count("T.alloc_local((16,))") == cells
    text, sig = _chain("L^{16}_{a=0}V^{16}_{c=0}", branch)
    x = np.linspace(-3, 3, 256, dtype=np.float32)
    want = np.where(x > 0, np.exp(1 + np.exp(x.astype(np.float64))), 0.0)
    np.testing.assert_allclose(run_numpy(text, sig, {"A": x})["C"], want, rtol=3e-6)
