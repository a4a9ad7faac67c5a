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
