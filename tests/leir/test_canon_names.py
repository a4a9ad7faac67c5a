"""Alpha-equivalence hash, canonical renaming, and the name sequences of docs/leir.md §2."""
from __future__ import annotations

from leir import Signature, format_program, parse_program
from leir.canon import alpha_hash, canonical_text, known_tensors, program_id
from leir.names import (
    IndexNames,
    TensorNames,
    bind_name,
    index_name,
    index_name_index,
    index_names,
    tensor_name,
    tensor_name_index,
)

SOFTMAX = ("B^{4}_{tx=0}L^{8}_{a=0}[D^{f64,g}_{tx}=max(D^{f64,g}_{tx},A^{f64,g}_{tx,a});];B^{4}_{tx=0}L^{8}_{a=0}"
           "[E^{f64,g}_{tx}=E^{f64,g}_{tx}+exp(A^{f64,g}_{tx,a}-D^{f64,g}_{tx});];B^{4}_{tx=0}L^{8}_{a=0}"
           "[C^{f64,g}_{tx,a}=exp(A^{f64,g}_{tx,a}-D^{f64,g}_{tx})/E^{f64,g}_{tx};];")
SIG = Signature.from_json({"tensors": [{"name": "A", "shape": [4, 8], "dtype": "float64", "role": "input"},
                                       {"name": "C", "shape": [4, 8], "dtype": "float64", "role": "output"}]})


def rename(text, mapping):
    """Rename tensors/indices through the tree (never the text)."""
    from leir.ast import Access, Loop, Nest, Program, Stmt, Var, map_stmt

    def node(n):
        if isinstance(n, Var):
            return Var(mapping.get(n.name, n.name))
        if isinstance(n, Access):
            return Access(mapping.get(n.tensor, n.tensor), n.dtype, n.scope, n.indices)
        return n

    def nest(n):
        loops = tuple(Loop(lp.kind, lp.extent, mapping.get(lp.var, lp.var), lp.start) for lp in n.loops)
        return Nest(loops, tuple(map_stmt(i, node) if isinstance(i, Stmt) else nest(i) for i in n.body))

    return Program(tuple(nest(n) for n in parse_program(text).nests))


def test_renaming_intermediates_and_indices_keeps_the_hash():
    original = parse_program(SOFTMAX)
    renamed = rename(SOFTMAX, {"D": "Q", "E": "Ac", "a": "k"})
    assert format_program(renamed) != SOFTMAX
    assert alpha_hash(renamed, SIG) == alpha_hash(original, SIG)
    assert canonical_text(renamed, SIG) == SOFTMAX
    assert program_id(renamed, SIG) == program_id(original, SIG)


def test_renaming_a_known_tensor_or_changing_a_value_changes_the_hash():
    original = alpha_hash(parse_program(SOFTMAX), SIG)
    assert alpha_hash(rename(SOFTMAX, {"A": "Q"}), SIG) != original
    changed = parse_program(SOFTMAX.replace("L^{8}_{a=0}[C", "L^{7}_{a=0}[C"))
    assert alpha_hash(changed, SIG) != original


def test_binding_suffixes_are_renumbered_but_axes_kept():
    a = parse_program("B^{4}_{txc=0}B^{2}_{by=0}[C^{f32,g}_{txc,by}=1;];")
    b = parse_program("B^{4}_{tx=0}B^{2}_{bya=0}[C^{f32,g}_{tx,bya}=1;];")
    c = parse_program("B^{4}_{ty=0}B^{2}_{by=0}[C^{f32,g}_{ty,by}=1;];")
    assert alpha_hash(a) == alpha_hash(b) != alpha_hash(c)


def test_known_tensors_inferred_without_signature():
    assert known_tensors(parse_program(SOFTMAX)) == ["A", "C"]


def test_name_sequences_match_the_spec():
    assert [tensor_name(i) for i in range(22)] == list("ACDEFGHIJKMNOQRSWXYZ") + ["Aa", "Ac"]
    assert [index_name(i) for i in range(21)] == list("acdfghijklmnopqrsuw") + ["aa", "ac"]
    for i in range(0, 9000, 7):
        assert tensor_name_index(tensor_name(i)) == i
        assert index_name_index(index_name(i)) == i
    assert tensor_name_index("Lx") is None and index_name_index("tx") is None
    assert "log" not in [n for _, n in zip(range(9000), index_names(), strict=False)]


def test_fresh_names_continue_past_the_largest_in_use():
    names = TensorNames(["A", "C", "F", "Q"])
    assert [names.fresh() for _ in range(3)] == ["R", "S", "W"]
    assert IndexNames(["tx", "a", "c"]).fresh() == "d"
    assert bind_name("tx", ["tx", "txa"]) == "txc"


def test_a_program_equal_as_a_tree_but_not_as_text_gets_its_own_canonical_text():
    """canonical_text keeps the texts of the programs it saw last: the very objects, since trees that
    differ only in a literal's type (1 against 1.0) are equal as trees and differ as text."""
    as_int = parse_program("L^{4}_{a=0}[Y^{f32,g}_{a}=X^{f32,g}_{a}*2;];")
    as_float = parse_program("L^{4}_{a=0}[Y^{f32,g}_{a}=X^{f32,g}_{a}*2.0;];")
    assert as_int == as_float  # the trees' equality does not tell the literals apart
    first, second = canonical_text(as_int), canonical_text(as_float)
    assert "*2;" in first and "*2.0;" in second
    assert canonical_text(as_int) == first and canonical_text(parse_program(format_program(as_float))) == second
