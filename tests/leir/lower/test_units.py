"""Timing units (leir.lower.units): a program cut at its top-level nests, each piece a function that
can be run again and again alone, and that together compute what the whole program computes."""
from __future__ import annotations

import numpy as np
import pytest

from leir import Signature, parse_program
from leir.lower.planner import plan_program
from leir.lower.units import timing_units, unit_primfunc

tvm = pytest.importorskip("tvm")

SOFTMAX = ("B^{4}_{tx=0}L^{8}_{a=0}[D^{f64,g}_{tx}=max(D^{f64,g}_{tx},A^{f64,g}_{tx,a});];"
           "B^{4}_{tx=0}L^{8}_{a=0}[E^{f64,g}_{tx}=E^{f64,g}_{tx}+exp(A^{f64,g}_{tx,a}-D^{f64,g}_{tx});];"
           "B^{4}_{tx=0}L^{8}_{a=0}[C^{f64,g}_{tx,a}=exp(A^{f64,g}_{tx,a}-D^{f64,g}_{tx})/E^{f64,g}_{tx};];")
SOFTMAX_SIG = Signature.from_json({"tensors": [{"name": "A", "shape": [4, 8], "dtype": "float64", "role": "input"},
                                               {"name": "C", "shape": [4, 8], "dtype": "float64", "role": "output"}]})
# a row sum split in two halves (additive_split): the second nest adds to what the first wrote
SPLIT_SUM = ("L^{4}_{a=0}L^{3}_{c=0}[D^{f32,g}_{a}=D^{f32,g}_{a}+A^{f32,g}_{a,c};];"
             "L^{4}_{a=0}L^{3}_{c=3}[D^{f32,g}_{a}=D^{f32,g}_{a}+A^{f32,g}_{a,c};];"
             "L^{4}_{a=0}[C^{f32,g}_{a}=D^{f32,g}_{a}*2;];")
SPLIT_SIG = Signature.from_json({"tensors": [{"name": "A", "shape": [4, 6], "dtype": "float32", "role": "input"},
                                             {"name": "C", "shape": [4], "dtype": "float32", "role": "output"}]})
# F lives in one nest (allocated inside its unit); G crosses two
LOCALS = ("L^{4}_{a=0}[F^{f32,l}_{a}=A^{f32,g}_{a,0}*2;G^{f32,g}_{a}=F^{f32,l}_{a}+1;];"
          "L^{4}_{a=0}[C^{f32,g}_{a}=G^{f32,g}_{a}*A^{f32,g}_{a,1};];")


def _units(text, sig):
    plan = plan_program(parse_program(text), sig, "llvm")
    return plan, timing_units(plan, sig)


def test_each_nest_is_a_unit_with_the_intermediates_it_shares_as_arguments():
    _, units = _units(SOFTMAX, SOFTMAX_SIG)
    assert [(u.args, u.local, u.writes) for u in units] == [
        (("A", "D"), (), ("D",)),
        (("A", "D", "E"), (), ("E",)),
        (("A", "C", "D", "E"), (), ("C",)),
    ]


def test_a_nest_that_adds_to_an_earlier_nests_output_joins_its_unit():
    _, units = _units(SPLIT_SUM, SPLIT_SIG)
    assert [len(u.items) for u in units] == [2, 1]
    assert [(u.args, u.writes) for u in units] == [(("A", "D"), ("D",)), (("C", "D"), ("C",))]


def test_an_intermediate_of_one_nest_is_allocated_inside_its_unit():
    _, units = _units(LOCALS, SPLIT_SIG)
    assert [(u.args, u.local) for u in units] == [(("A", "G"), ("F",)), (("A", "C", "G"), ())]


@pytest.mark.parametrize("text, sig", [(SOFTMAX, SOFTMAX_SIG), (SPLIT_SUM, SPLIT_SIG), (LOCALS, SPLIT_SIG)])
def test_the_units_run_in_order_compute_what_the_program_computes(text, sig):
    from leir.lower import run_numpy
    from leir.lower.expr import storage_dtype

    rng = np.random.default_rng(0)
    inputs = {t.name: rng.standard_normal(t.shape).astype(t.dtype) for t in sig.inputs}
    expected = run_numpy(parse_program(text), sig, inputs)
    plan, units = _units(text, sig)
    dev = tvm.cpu()
    arrays = {t.name: tvm.runtime.tensor(inputs[t.name] if t.role == "input" else np.zeros(t.shape, t.dtype), dev)
              for t in sig.tensors}
    for unit in units:
        for name in unit.args:
            if name not in arrays:
                info = plan.tensors[name]
                arrays[name] = tvm.runtime.empty(info.shape, storage_dtype(info.dtype), dev)
        ex = tvm.compile(tvm.IRModule({"main": unit_primfunc(plan, sig, unit, "main")}), target="llvm")
        for _ in range(2):  # a unit run twice leaves what it leaves once
            ex["main"](*(arrays[n] for n in unit.args))
    for t in sig.outputs:
        np.testing.assert_allclose(arrays[t.name].numpy(), expected[t.name], rtol=1e-6)


def test_a_unit_that_touches_no_known_or_shared_tensor_still_takes_one_argument():
    # nest 1 writes a scratch tensor nobody reads (a release state of `scan` had one): without an
    # argument TVM cannot place the function on a device ("Unknown device id in current IR")
    text = "L^{4}_{a=0}[F^{f32,g}_{a}=0;];L^{4}_{a=0}[C^{f32,g}_{a}=A^{f32,g}_{a,0};];"
    plan, units = _units(text, SPLIT_SIG)
    assert [(u.args, u.local) for u in units] == [(("A",), ("F",)), (("A", "C"), ())]
    tvm.compile(tvm.IRModule({"main": unit_primfunc(plan, SPLIT_SIG, units[0], "main")}), target="llvm")
