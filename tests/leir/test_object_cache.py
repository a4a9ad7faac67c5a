"""Results kept by the identity of the tree they were computed from (leir/object_cache.py)."""
from __future__ import annotations

from leir.object_cache import MISSING, ObjectCache
from leir.parse import parse_program

TEXT = "L^{4}_{a=0}[C^{f32,g}_{a}=A^{f32,g}_{a}*2;];"


def test_a_result_is_kept_for_the_same_object_under_an_equal_guard_only():
    cache = ObjectCache(8)
    program, twin = parse_program(TEXT), parse_program(TEXT)
    cache.put(program, "text", guard=("sig",), key="llvm")
    assert cache.get(program, ("sig",), "llvm") == "text"
    assert cache.get(twin, ("sig",), "llvm") is MISSING       # equal as a value, another object
    assert cache.get(program, ("other",), "llvm") is MISSING  # another guard
    assert cache.get(program, ("sig",), "cuda") is MISSING    # another key
    assert cache.holds(program) and not cache.holds(twin)


def test_the_least_recently_used_entry_goes_first():
    cache = ObjectCache(2)
    a, b, c = (parse_program(TEXT) for _ in range(3))
    cache.put(a, 1)
    cache.put(b, 2)
    assert cache.get(a) == 1   # a used: b is now the oldest
    cache.put(c, 3)
    assert len(cache) == 2 and cache.get(b) is MISSING and cache.get(a) == 1 and cache.get(c) == 3


TWO = "L^{4}_{a=0}[C^{f32,g}_{a}=A^{f32,g}_{a}*2;];L^{4}_{a=0}[D^{f32,g}_{a}=C^{f32,g}_{a}+{rhs};];"


def test_states_parsed_apart_share_the_nests_they_print_alike():
    from leir.object_cache import share_nests
    from leir.printer import format_program

    texts = [TWO.replace("{rhs}", r) for r in ("1", "3", "1")]
    parsed = [parse_program(t) for t in texts]
    shared = share_nests(parsed)
    assert [format_program(p) for p in shared] == [format_program(p) for p in parsed]
    assert shared[0].nests[0] is shared[1].nests[0] is shared[2].nests[0]   # the unchanged first nest
    assert shared[0].nests[1] is not shared[1].nests[1]                     # the rewritten one
    assert shared[2].nests[1] is shared[0].nests[1] and shared[0] is parsed[0]


def test_structure_hashes_of_many_states_are_each_states_own():
    """The split's overlap check hashes every released state with each distinct nest hashed once; the
    hashes are those of each state parsed and hashed alone."""
    from leir.canon import structure_hashes, structure_hashes_of

    texts = [TWO.replace("{rhs}", r) for r in ("1", "3", "1", "A^{f32,g}_{a}")]
    texts.append(texts[1].replace("L^{4}", "L^{16}"))   # the same structures at another size
    got = structure_hashes_of(texts)
    assert list(got) == list(dict.fromkeys(texts))
    assert all(got[t] == structure_hashes(parse_program(t)) for t in texts)
    assert got[texts[4]] == got[texts[1]] and got[texts[0]][0] == got[texts[3]][0] != got[texts[3]][1]
