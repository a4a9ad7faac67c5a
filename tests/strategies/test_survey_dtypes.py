"""The strategy survey per dtype (issue 18): on catalogue programs in float16, float32 and float64 every
application verifies as its strategy declares; where a step would overflow, drift or lose its max
shift in the dtype, the strategy refuses it instead (fewer applications in float16, none failing).

"float16" is the one-dtype form of the published format (every access float16: the translator's
float32 program retyped), whose sums and exps run in float16. The translator's own float16 programs
accumulate in float32 (docs/leir.md §4.5, issue 26): "float16-mixed", where the same steps as in float32
are proposed, and verify."""
from __future__ import annotations

import pytest

from leir.ast import Access, Nest, Program, Stmt, map_stmt
from leir.frontend import translate
from leir.signature import Signature
from strategies.base import Context
from strategies.survey import SurveyProgram, survey
from workloads.registry import get_workload
from workloads.sampling import Instance, build

# Modest shapes that every dtype verifies against PyTorch (float16 sums stay short), each chosen for a
# rule: the softmaxes lose their max shift in float16 (the NaN), the layer norm's variance
# factors into (64*A-I)**2 (beyond 65504), the mean sums 1024 terms (float16 drift), and the group
# norm's statistics merge channels in their subscript (a//4).
PINS = [("softmax_last", {"B": 1, "M": 16, "N": 256}), ("log_softmax", {"B": 1, "M": 16, "N": 256}),
        ("layer_norm", {"B": 1, "M": 8, "N": 64}), ("mean_dim", {"B": 1, "M": 16, "N": 1024}),
        ("group_norm", {"B": 1, "C": 4, "H": 7, "W": 7, "G": 1}), ("logsumexp", {"B": 1, "M": 16, "N": 256})]
STRATEGIES = ["partially_equivalent_then_correct", "exponential_split", "expand_powsimp", "factorization", "together",
              "expand_factorization", "cancellation", "loop_vectorization", "online_softmax", "additive_split",
              "cache_read_write"]
# (reduction_factorization is refused on the CPU, where its partials would sit in global memory inside serial
# loops (issue 24); loop_vectorization's `partials` variant is the CPU's reduction split, with the same guards)


def one_dtype(program: Program, code: str) -> Program:
    """Every float32 access of `program` retyped to `code` (a program in one dtype, as published)."""
    def retype(node):
        return Access(node.tensor, code, node.scope, node.indices) if isinstance(node, Access) and \
            node.dtype == "f32" else node

    def nest(n: Nest) -> Nest:
        return Nest(n.loops, tuple(map_stmt(i, retype) if isinstance(i, Stmt) else nest(i) for i in n.body))
    return Program(tuple(nest(n) for n in program.nests))


def originals(dtype: str) -> list[tuple[SurveyProgram, object]]:
    out = []
    single = dtype == "float16"
    dtype = {"float16": "float32", "float16-mixed": "float16"}.get(dtype, dtype)
    for name, params in PINS:
        w = get_workload(name)
        module, inputs = build(w, Instance(name, 0, -1, "default", params, dtype, "pinned"))
        tr = translate(module, inputs, dtype=dtype)
        if single:
            sig = tr.signature.to_json()
            sig["tensors"] = [{**t, "dtype": "float16" if t["dtype"] == "float32" else t["dtype"]}
                              for t in sig["tensors"]]
            tr.program, tr.signature = one_dtype(tr.program, "f16"), Signature.from_json(sig)
        out.append((SurveyProgram(name, Context(tr.program, tr.signature)), tr))
    return out


def real_verifier(items):
    from gpu_tasks.verify import pair_request, verify_pairs

    return verify_pairs([pair_request(t.before, t.after, sig) for t, sig in items])


def run(dtype: str):
    from gpu_tasks.verify import verify_against_reference

    found = originals(dtype)
    for program, tr in found:  # the originals themselves are right in this dtype: a fair test
        v = verify_against_reference(tr.program, tr.signature, tr.reference)
        assert v.status in ("exact", "close"), (program.name, dtype, v)
    return survey([p for p, _ in found], real_verifier, STRATEGIES, cap=2, per_site=1, inline_cap=1)


@pytest.fixture(scope="module")
def surveys():
    pytest.importorskip("tvm")
    return {dtype: {r.strategy: r for r in run(dtype).rows} for dtype in DTYPES}


DTYPES = ("float16", "float16-mixed", "float32", "float64")


@pytest.mark.parametrize("dtype", DTYPES)
def test_every_application_verifies_in_each_dtype(surveys, dtype):
    rows = surveys[dtype]
    failing = {n: (r.statuses, r.failures) for n, r in rows.items() if r.applications and r.pass_rate != 1.0}
    assert not failing, failing
    assert sum(r.applications for r in rows.values()) >= 20


def test_float16_refuses_what_float32_keeps(surveys):
    f16, f32 = surveys["float16"], surveys["float32"]
    for name in ("partially_equivalent_then_correct", "exponential_split", "expand_powsimp", "loop_vectorization"):
        assert f32[name].applications > f16[name].applications, name
    assert f16["partially_equivalent_then_correct"].applications == 0


def test_translated_float16_programs_accumulate_in_float32_and_keep_what_float32_keeps(surveys):
    mixed, f32 = surveys["float16-mixed"], surveys["float32"]
    for name in ("partially_equivalent_then_correct", "exponential_split", "expand_powsimp"):
        assert mixed[name].applications == f32[name].applications > 0, name
