"""The lowering API (leir.lower): the golden programs equal PyTorch, the contract others code against
(names, argument order, targets, errors), every dtype and scope, and deterministic TVMScript.
Semantics in depth: test_lower_semantics.py; CUDA: test_lower_cuda.py; CLI: test_lower_cli.py."""
from __future__ import annotations

import hashlib
import re
import subprocess
import sys
import textwrap
from pathlib import Path

import numpy as np
import pytest
import torch
from test_lower_oracle import golden_rows, interpret, np_dtype, random_inputs
from test_lower_semantics import check, sig

from leir import LeirError, Signature, parse_program
from leir.analysis import statement_sites, tensor_table
from leir.ast import Access, accesses
from leir.dtypes import CODE_TO_TORCH
from leir.lower import (
    LoweringError,
    build,
    lower_to_primfunc,
    lower_to_script,
    make_target,
    run_executable,
    run_numpy,
)

ROOT = Path(__file__).resolve().parents[3]
ROWS = golden_rows()


def class_counts(program, signature: Signature) -> dict[str, int]:
    """For each integer input used as a gather index, the size of the dimension it indexes (inputs are
    drawn below it: class indices below the class count)."""
    table = {name: info.shape for name, info in tensor_table(program, signature).items()}
    out: dict[str, int] = {}
    for site in statement_sites(program):
        for acc in [site.stmt.lhs, *accesses(site.stmt.rhs)]:
            for d, ix in enumerate(acc.indices):
                for g in accesses(ix):
                    if isinstance(g, Access):
                        out[g.tensor] = min(out.get(g.tensor, table[acc.tensor][d]), table[acc.tensor][d])
    return out


def golden_inputs(program, signature: Signature, seed: int) -> dict[str, np.ndarray]:
    inputs = random_inputs(signature, seed)
    rng = np.random.default_rng(1000 + seed)
    for name, n in class_counts(program, signature).items():
        spec = signature.get(name)
        inputs[name] = rng.integers(0, n, size=spec.shape).astype(spec.dtype)
    return inputs


@pytest.mark.parametrize("row", ROWS, ids=[r["name"] for r in ROWS])
def test_golden_program_matches_torch(row):
    signature = Signature.from_json(row["signature"])
    program = parse_program(row["leir"])
    ex = build(program, signature)
    for seed in (0, 1, 2):
        inputs = golden_inputs(program, signature, seed)
        got = run_executable(ex, signature, inputs)[signature.outputs[0].name]
        env = {"torch": torch, **{k: torch.from_numpy(np.asarray(v)) for k, v in inputs.items()}}
        want = eval(row["torch"], env).numpy()  # test only: the expression of the golden file
        assert got.shape == want.shape and got.dtype == want.dtype
        np.testing.assert_allclose(got, want, rtol=1e-9, atol=1e-9, err_msg=f"seed {seed}")


def test_cross_entropy_draws_class_indices_below_the_class_count():
    row = next(r for r in ROWS if r["name"] == "cross_entropy_mean")
    signature = Signature.from_json(row["signature"])
    assert class_counts(parse_program(row["leir"]), signature) == {"C": 5}


# --- the contract ----------------------------------------------------------------------------------

def test_primfunc_is_main_with_signature_order():
    row = next(r for r in ROWS if r["name"] == "linear_with_bias")
    func = lower_to_primfunc(parse_program(row["leir"]), Signature.from_json(row["signature"]))
    assert func.attrs["global_symbol"] == "main"
    assert [p.name for p in func.params] == ["A", "D", "E", "C"]
    assert lower_to_script(row["leir"], row["signature"]).count("def main(A: T.Buffer((4, 6), \"float64\"), "
                                                                "D: T.Buffer((5, 6)") == 1


def test_make_target():
    cpu = make_target()
    assert cpu.kind.name == "llvm" and str(cpu.attrs["mcpu"]) not in ("", "generic")
    gpu = make_target("cuda", "sm_80")
    assert gpu.kind.name == "cuda" and str(gpu.attrs["arch"]) == "sm_80"
    with pytest.raises(LoweringError, match="unknown target kind 'rocm'"):
        make_target("rocm")


def test_run_numpy_returns_outputs_by_name():
    s = sig({"A": ((3,), "float32")}, {"C": ((3,), "float32"), "D": ((), "int32")})
    out = run_numpy("L^{3}_{a=0}[C^{f32,g}_{a}=A^{f32,g}_{a}*2;D^{i32,g}=D^{i32,g}+a;];", s,
                    {"A": np.array([1.0, 2.0, 3.0])})
    np.testing.assert_array_equal(out["C"], np.array([2, 4, 6], np.float32))
    assert out["C"].dtype == np.float32 and out["D"].shape == () and out["D"] == 3


def test_run_numpy_checks_its_inputs():
    s = sig({"A": ((3,), "float32")}, {"C": ((3,), "float32")})
    p = "L^{3}_{a=0}[C^{f32,g}_{a}=A^{f32,g}_{a};];"
    with pytest.raises(LoweringError, match="no value for input A"):
        run_numpy(p, s, {})
    with pytest.raises(LoweringError, match=r"shape \(4,\)"):
        run_numpy(p, s, {"A": np.zeros(4)})


def test_lowering_error_is_a_leir_error():
    assert issubclass(LoweringError, LeirError)


# --- dtypes and scopes -----------------------------------------------------------------------------

INT_CODES = ("i64", "i32", "i16", "i8", "u8", "u16", "u32", "u64")


@pytest.mark.parametrize("code", ["f64", "f32", "f16", "bf16", *INT_CODES])
def test_every_numeric_dtype(code):
    name = CODE_TO_TORCH[code]
    s = sig({"A": ((4, 6), name)}, {"C": ((4,), name), "M": ((), name)})
    p = (f"L^{{4}}_{{a=0}}L^{{6}}_{{c=0}}[C^{{{code},g}}_{{a}}=C^{{{code},g}}_{{a}}+A^{{{code},g}}_{{a,c}}*2+1;];"
         f"L^{{4}}_{{a=0}}[M^{{{code},g}}=max(M^{{{code},g}},C^{{{code},g}}_{{a}}//3-abs(C^{{{code},g}}_{{a}}%5));];")
    tol = {"f16": 2e-2, "bf16": 1e-1}.get(code, 1e-6 if code == "f32" else 0)
    check(p, s, rtol=tol, atol=tol)
    out = run_numpy(p, s, random_inputs(s, 0))
    assert out["C"].dtype == np_dtype(name)


def test_float16_and_bfloat16_math_functions_compute_in_float32():
    for code in ("f16", "bf16"):
        name = CODE_TO_TORCH[code]
        s = sig({"A": ((16,), name)}, {"C": ((16,), name)})
        p = (f"L^{{16}}_{{a=0}}[C^{{{code},g}}_{{a}}=exp(A^{{{code},g}}_{{a}})+erf(A^{{{code},g}}_{{a}})"
             f"+sqrt(abs(A^{{{code},g}}_{{a}}))+log(abs(A^{{{code},g}}_{{a}})+1)+abs(A^{{{code},g}}_{{a}})**1.5;];")
        a = torch.linspace(-2, 2, 16, dtype=getattr(torch, name))
        want = (a.exp() + torch.special.erf(a) + a.abs().sqrt() + (a.abs() + 1).log() + a.abs() ** 1.5).double()
        got = run_numpy(p, s, {"A": a.float().numpy()})["C"].astype(np.float64)
        np.testing.assert_allclose(got, want.numpy(), rtol=5e-2)


def test_bool_dtype():
    s = sig({"A": ((4, 6), "bool"), "D": ((4, 6), "bool")}, {"C": ((4,), "bool"), "E": ((4,), "bool")})
    check("L^{4}_{a=0}L^{6}_{c=0}[C^{bool,g}_{a}=max(C^{bool,g}_{a},if_then_else(A^{bool,g}_{a,c}&"
          "D^{bool,g}_{a,c},1,0));E^{bool,g}_{a}=min(E^{bool,g}_{a},A^{bool,g}_{a,c}|D^{bool,g}_{a,c});];"
          .replace("min(E^{bool,g}_{a},A^{bool,g}_{a,c}|D^{bool,g}_{a,c})",
                   "min(E^{bool,g}_{a},if_then_else(A^{bool,g}_{a,c}|D^{bool,g}_{a,c},1,0))"), s)


def test_mixed_dtypes_compute_in_the_lhs_dtype():
    """docs/leir.md §4.5: reads of other dtypes are converted to the statement's dtype, then it computes:
    float64 addition of a float32 and an int64 value; an int32 statement truncates A before doubling."""
    s = sig({"A": ((8,), "float32"), "I": ((8,), "int64")}, {"C": ((8,), "float64"), "K": ((8,), "int32")})
    a = np.linspace(-3.7, 3.7, 8)
    big = np.arange(8) + 2 ** 40  # not a float32 value: float32 arithmetic would round it
    out = run_numpy("L^{8}_{a=0}[C^{f64,g}_{a}=A^{f32,g}_{a}+I^{i64,g}_{a};K^{i32,g}_{a}=A^{f32,g}_{a}*2;];",
                    s, {"A": a, "I": big})
    np.testing.assert_array_equal(out["C"], a.astype(np.float32).astype(np.float64) + big)
    np.testing.assert_array_equal(out["K"], np.trunc(a.astype(np.float32)).astype(np.int32) * 2)


@pytest.mark.parametrize("scope", ["g", "s", "l"])
def test_each_scope_of_an_intermediate(scope):
    s = sig({"A": ((4, 6), "float64")}, {"C": ((4,), "float64")})
    p = (f"B^{{4}}_{{tx=0}}L^{{6}}_{{c=0}}[F^{{f64,{scope}}}_{{tx}}=F^{{f64,{scope}}}_{{tx}}+A^{{f64,g}}_{{tx,c}};];"
         f"B^{{4}}_{{tx=0}}[C^{{f64,g}}_{{tx}}=F^{{f64,{scope}}}_{{tx}}*2;];")
    check(p, s)
    expected = {"g": "T.alloc_buffer((4,)", "s": "T.alloc_shared((4,)", "l": "T.alloc_local((4,)"}[scope]
    assert expected in lower_to_script(p, s)


@pytest.mark.parametrize("code", ["c64", "c128", "f8e4m3fn", "f8e5m2", "i4", "u4"])
def test_unsupported_dtype_is_reported_with_its_code(code):
    s = sig({"A": ((4,), "float32")}, {"C": ((4,), "float32")})
    with pytest.raises(LoweringError, match=f"nest 1, statement 1 .*dtype {code} of F cannot be lowered"):
        lower_to_script(f"L^{{4}}_{{a=0}}[F^{{{code},g}}_{{a}}=A^{{f32,g}}_{{a}};"
                        f"C^{{f32,g}}_{{a}}=F^{{{code},g}}_{{a}};];", s)


def test_unsupported_signature_dtype():
    s = sig({"A": ((4,), "complex64")}, {"C": ((4,), "float32")})
    with pytest.raises(LoweringError, match=r"signature tensor A: dtype complex64 \(c64\)"):
        lower_to_script("L^{4}_{a=0}[C^{f32,g}_{a}=1;];", s)


# --- errors name the nest and the statement --------------------------------------------------------

S46 = sig({"A": ((4, 6), "float64")}, {"C": ((4,), "float64")})


@pytest.mark.parametrize("program, message", [
    ("L^{4}_{a=0}[C^{f64,g}_{a}=1;];L^{4}_{a=0}[C^{f64,g}_{a}=A^{f64,g}_{a,c};];",
     re.escape("nest 2, statement 1 `C^{f64,g}_{a}=A^{f64,g}_{a,c}`: index c is not bound")),
    ("L^{4}_{a=0}[A^{f64,g}_{a,0}=1;];", "writes the input tensor A"),
    ("L^{5}_{a=0}[C^{f64,g}_{a}=1;];", r"writes C out of bounds: subscript 1 ranges over \[0, 4\]"),
    ("L^{4}_{a=0}[C^{f64,g}_{a}=A^{f64,g}_{a,a+3};];", r"reads A out of bounds: subscript 2 ranges over \[3, 6\]"),
    ("L^{4}_{a=0}[C^{f64,g}_{a}=A^{f64,g}_{a};];", "A has 2 dimensions but is accessed with 1 subscripts"),
    ("L^{4}_{a=0}[C^{f32,g}_{a}=A^{f64,g}_{a,0};];", "C is accessed as f32 but the signature says f64"),
    ("L^{4}_{a=0}[C^{f64,g}_{a}=F^{f64,g}_{a};];", "cannot infer the shape of intermediate F: never written"),
    ("L^{4}_{a=0}[F^{f64,g}_{a}=1;C^{f64,g}_{a}=F^{f32,g}_{a};];", "F is accessed as f32 but its first access"),
])
def test_lowering_errors(program, message):
    with pytest.raises(LoweringError, match=message):
        lower_to_primfunc(program, S46)


def test_guarded_read_may_leave_the_tensor():
    # padding: the out-of-range read only happens in the branch the condition excludes
    check("L^{4}_{a=0}[C^{f64,g}_{a}=if_then_else(a<3,A^{f64,g}_{a,a+3},0);];", S46)


# --- determinism -----------------------------------------------------------------------------------

SCRIPTS_OF_GOLDEN = textwrap.dedent("""
    import json
    from leir.lower import lower_to_script
    rows = [json.loads(line) for line in open("tests/data/programs.jsonl") if line.strip()]
    text = "".join(lower_to_script(r["leir"], r["signature"], t) for r in rows for t in ("llvm", "cuda"))
""")


def all_scripts() -> str:
    scope: dict = {}
    exec(SCRIPTS_OF_GOLDEN, scope)  # the very code the fresh process runs
    return scope["text"]


def test_script_is_identical_on_every_call():
    assert all_scripts() == all_scripts()


def test_script_is_identical_in_a_fresh_process():
    code = SCRIPTS_OF_GOLDEN + "import hashlib; print(hashlib.sha256(text.encode()).hexdigest())\n"
    fresh = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, check=True,
                           env={"PYTHONHASHSEED": "12345", "PATH": ""}).stdout.strip()
    assert fresh == hashlib.sha256(all_scripts().encode()).hexdigest()


def test_leir_imports_without_tvm():
    code = "import sys, leir, leir.analysis, leir.lower.planner; assert 'tvm' not in sys.modules"
    subprocess.run([sys.executable, "-c", code], cwd=ROOT, check=True)


def test_oracle_agrees_on_golden_programs_in_float32():
    # the same programs in float32 (dtype codes and signature changed on the tree, not the text)
    from leir.ast import map_stmt
    from leir.printer import format_program

    row = next(r for r in ROWS if r["name"] == "softmax")
    prog = parse_program(row["leir"])
    nests = tuple(_map_nest(n, lambda st: map_stmt(st, _to_f32)) for n in prog.nests)
    text = format_program(type(prog)(nests))
    s = sig({"A": ((4, 8), "float32")}, {"C": ((4, 8), "float32")})
    inputs = random_inputs(s, 3)
    np.testing.assert_allclose(run_numpy(text, s, inputs)["C"], interpret(text, s, inputs)["C"], rtol=1e-5)


def _to_f32(node):
    return Access(node.tensor, "f32", node.scope, node.indices) if isinstance(node, Access) else node


def _map_nest(nest, fn):
    from leir.ast import Nest, Stmt

    return Nest(nest.loops, tuple(fn(i) if isinstance(i, Stmt) else _map_nest(i, fn) for i in nest.body))


@pytest.mark.parametrize("form", ["plain", "tensorir"])
def test_a_tensor_of_more_than_2_31_elements_gets_int64_subscripts_and_others_keep_int32(form):
    # a 65536 x 65536 tensor's flattened offset a*65536+b wraps in int32: its loops, shapes and subscripts
    # (a gather's index too) are int64; a program of ordinary tensors keeps TVM's int32
    big = ("L^{65536}_{a=0}L^{65536}_{b=0}[C^{f32,g}_{a,b}=A^{f32,g}_{a,b}*2;];"
           "L^{4}_{a=0}[D^{f32,g}_{a}=C^{f32,g}_{I^{i32,g}_{a},a};];")
    signature = {"tensors": [{"name": "A", "shape": [65536, 65536], "dtype": "float32", "role": "input"},
                             {"name": "I", "shape": [4], "dtype": "int32", "role": "input"},
                             {"name": "D", "shape": [4], "dtype": "float32", "role": "output"}]}
    script = lower_to_script(big, signature, form=form)
    assert 'A: T.Buffer((T.int64(65536), T.int64(65536)), "float32")' in script
    assert "T.grid(T.int64(65536), T.int64(65536))" in script and "T.int64(4)" in script
    assert "T.Cast(\"int64\", I_1" in script  # the int32 gather index widened
    build(big, signature, form=form)  # compiles: no int32/int64 mix left for TVM to refuse
    small = "L^{64}_{a=0}L^{64}_{b=0}[C^{f32,g}_{a,b}=A^{f32,g}_{a,b}*2;];"
    small_sig = {"tensors": [{"name": "A", "shape": [64, 64], "dtype": "float32", "role": "input"},
                             {"name": "C", "shape": [64, 64], "dtype": "float32", "role": "output"}]}
    assert "int64" not in lower_to_script(small, small_sig, form=form)
