"""The two lowering forms (plain loops, TensorIR blocks) compute the same outputs, bitwise, in float64,
and TVM's scheduler accepts every TensorIR function: on every golden program, every strategy's golden
after-state, and the catalogue's workloads (a spread over the catalogue by default, every workload
in the slow test)."""
from __future__ import annotations

import importlib
import inspect
import sys
from pathlib import Path

import pytest
from forms_check import forms_disagree, schedule_rejects
from test_lower_oracle import golden_rows

from leir import Signature
from leir.lower import lower_to_primfunc

STRATEGY_TESTS = Path(__file__).resolve().parents[2] / "strategies"
STRATEGY_MODULES = sorted(p.stem for p in STRATEGY_TESTS.glob("test_*.py"))


def _agree(program, signature) -> None:
    assert forms_disagree(program, signature) == ""
    assert schedule_rejects(lower_to_primfunc(program, signature, form="tensorir")) == ""


@pytest.mark.parametrize("row", golden_rows(), ids=lambda r: r["name"])
def test_golden_programs(row):
    _agree(row["leir"], Signature.from_json(row["signature"]))


def strategy_goldens() -> list[tuple[str, str, Signature]]:
    """(test name, expected after-state, signature) of every `assert_golden` call of the strategy
    tests, gathered by running those tests with a recording `assert_golden` (a golden is only
    written down there, as arguments of that call)."""
    sys.path.insert(0, str(STRATEGY_TESTS))
    cases: list[tuple[str, str, Signature]] = []
    for name in STRATEGY_MODULES:
        module = importlib.import_module(name)
        if not hasattr(module, "assert_golden"):
            continue
        for test_name, test in inspect.getmembers(module, inspect.isfunction):
            if not test_name.startswith("test_") or "assert_golden" not in inspect.getsource(test):
                continue
            original = module.assert_golden
            module.assert_golden = (lambda strategy, before, expected, signature, target="llvm", _n=test_name:
                                    cases.extend((f"{_n}/{k}", after, signature) for k, after in enumerate(expected)))
            try:
                test()
            finally:
                module.assert_golden = original
    return cases


STRATEGY_GOLDENS = strategy_goldens()


def test_strategy_goldens_were_found():
    assert len(STRATEGY_GOLDENS) >= 60 and len({name.split("/")[0] for name, _, _ in STRATEGY_GOLDENS}) >= 30


@pytest.mark.parametrize("name, after, signature", STRATEGY_GOLDENS, ids=[c[0] for c in STRATEGY_GOLDENS])
def test_strategy_golden_after_states(name, after, signature):
    _agree(after, signature)


def _catalogue(names):
    from workloads.registry import all_workloads

    return [w.name for w in all_workloads() if names is None or w.name in names]


def _check_workload(name: str) -> None:
    from leir.frontend import translate
    from workloads.registry import get_workload
    from workloads.sampling import build, sample_instance

    w = get_workload(name)
    module, inputs = build(w, sample_instance(w, 0, 0))
    t = translate(module, inputs, "float64")
    _agree(t.program, t.signature)


ALL = _catalogue(None)


@pytest.mark.parametrize("name", ALL[5::23])
def test_catalogue_spread(name):
    _check_workload(name)


@pytest.mark.slow
@pytest.mark.parametrize("name", ALL)
def test_every_catalogue_workload(name):
    _check_workload(name)
