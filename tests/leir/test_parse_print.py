"""Golden tests: the parser and printer on every example of docs/leir.md and programs.jsonl."""
from __future__ import annotations

import math

import pytest

from leir import (
    Access,
    And,
    BinOp,
    Call,
    Compare,
    LeirSyntaxError,
    Loop,
    Neg,
    Nest,
    Num,
    Or,
    Program,
    Select,
    Stmt,
    Var,
    format_expr,
    format_program,
    parse_expr,
    parse_program,
)
from leir.parse import parse_with_spec

# The two programs of docs/leir.md §1, verbatim.
MATMUL_DOC = ("B^{16}_{tx=0}L^{32}_{a=0}L^{64}_{c=0}[D^{f32,g}_{tx,a}=D^{f32,g}_{tx,a}+A^{f32,g}_{tx,c}"
              "*C^{f32,g}_{c,a};];")
SOFTMAX_DOC = ("B^{4}_{tx=0}L^{8}_{a=0}[D^{f64,g}_{tx}=max(D^{f64,g}_{tx},A^{f64,g}_{tx,a});];B^{4}_{tx=0}"
               "L^{8}_{a=0}[E^{f64,g}_{tx}=E^{f64,g}_{tx}+exp(A^{f64,g}_{tx,a}-D^{f64,g}_{tx});];B^{4}_{tx=0}"
               "L^{8}_{a=0}[C^{f64,g}_{tx,a}=exp(A^{f64,g}_{tx,a}-D^{f64,g}_{tx})/E^{f64,g}_{tx};];")
# Forms of docs/leir.md §3/§6 beyond the translator's: other loop kinds, scopes, nested nests, index
# arrays, scans, bool conditions, two-letter names.
MORE = [
    "P^{4}_{a=0}V^{8}_{c=0}[C^{f32,g}_{a,c}=A^{f32,g}_{a,c}*2;];",
    "L^{4}_{g=0}B^{4}_{tx=0}[C^{f32,g}_{g*4+tx}=A^{f32,g}_{g*4+tx};];",
    "B^{32}_{bx=0}B^{32}_{tya=0}U^{4}_{a=0}[D^{f16,s}_{tya,a}=A^{f16,g}_{bx,tya*4+a};C^{f16,g}_{bx,tya*4+a}=D^{f16,s}"
    "_{tya,a};];",
    "B^{2}_{tx=0}L^{5}_{a=0}[H^{f64,l}_{tx,a}=max(if_then_else(a-1<0,-inf,H^{f64,l}_{tx,a-1}),D^{f64,g}_{tx,a});];",
    "B^{4}_{tx=0}[M^{f32,g}_{tx}=-inf;Q^{f32,g}_{tx}=0;L^{32}_{g=0}[O^{f32,g}_{tx,g}=O^{f32,g}_{tx,g}+1;];];",
    "B^{4}_{tx=0}L^{3}_{a=0}[C^{f32,g}_{tx,a}=E^{f32,g}_{tx,Fa^{i64,g}_{a}};];",
    "B^{4}_{tx=0}[C^{f32,g}_{tx}=if_then_else(K^{bool,g}_{tx},A^{f32,g}_{tx},0);];",
    "B^{4}_{tx=0}[C^{f32,g}_{tx}=if_then_else(A^{f32,g}_{tx}>0&A^{f32,g}_{tx}<1|A^{f32,g}_{tx}==2,1,0);];",
    "B^{1}_{tx=0}[C^{f64,g}=A^{f64,g}**2+-A^{f64,g}**2-(-A^{f64,g})**2+2**-3**2+(2**3)**2;];",
    "B^{8}_{tx=0}[C^{i64,g}_{tx}=tx//3%2-tx%3*(tx//2)+abs(tx-4);];",
    "B^{2}_{tx=0}[C^{f32,g}_{tx}=A^{f32,g}_{tx}*1e-05+2.5+25000000000.0+sqrt(erf(log(A^{f32,g}_{tx})));];",
    "B^{2}_{tx=0}[Aa^{bf16,g}_{tx}=min(A^{bf16,g}_{tx},inf);C^{bf16,g}_{tx}=Aa^{bf16,g}_{tx}/(A^{bf16,g}_{tx}*"
    "A^{bf16,g}_{tx});];",
]


@pytest.mark.parametrize("text", [MATMUL_DOC, SOFTMAX_DOC, *MORE])
def test_canonical_text_round_trips_byte_for_byte(text):
    program = parse_program(text)
    assert format_program(program) == text
    assert parse_program(format_program(program)) == program
    assert parse_with_spec(text) == program


def test_examples_round_trip(example):
    program = parse_program(example["leir"])
    assert format_program(program) == example["leir"]
    assert parse_with_spec(example["leir"]) == program


def test_matmul_tree_is_what_the_text_says():
    program = parse_program(MATMUL_DOC)
    d = Access("D", "f32", "g", (Var("tx"), Var("a")))
    expected = Program((Nest(
        (Loop("B", 16, "tx"), Loop("L", 32, "a"), Loop("L", 64, "c")),
        (Stmt(d, BinOp("+", d, BinOp("*", Access("A", "f32", "g", (Var("tx"), Var("c"))),
                                      Access("C", "f32", "g", (Var("c"), Var("a")))))),),
    ),))
    assert program == expected
    assert hash(program) == hash(expected)


def test_whitespace_between_tokens_is_accepted():
    spaced = " B ^{16} _{ tx = 0 }\n L^{32}_{a=0}\tL^{64}_{c=0} [ D^{f32,g}_{tx,a} = D^{f32,g}_{tx,a} + " \
             "A^{f32,g}_{tx,c} * C^{f32,g}_{c,a} ; ] ;\n"
    assert format_program(parse_program(spaced)) == MATMUL_DOC
    inner = "B ^ { 4 } _ { tx = 0 } [ C ^ { f64 , g } _ { tx } = 1 ; ] ;"
    assert format_program(parse_program(inner)) == "B^{4}_{tx=0}[C^{f64,g}_{tx}=1;];"


@pytest.mark.parametrize("text, tree", [
    ("-x**2", Neg(BinOp("**", Var("x"), Num(2)))),
    ("(-x)**2", BinOp("**", Neg(Var("x")), Num(2))),
    ("2**3**2", BinOp("**", Num(2), BinOp("**", Num(3), Num(2)))),
    ("a-c-d", BinOp("-", BinOp("-", Var("a"), Var("c")), Var("d"))),
    ("a-(c-d)", BinOp("-", Var("a"), BinOp("-", Var("c"), Var("d")))),
    ("a/c*d", BinOp("*", BinOp("/", Var("a"), Var("c")), Var("d"))),
    ("-a*c", BinOp("*", Neg(Var("a")), Var("c"))),
    ("-(a*c)", Neg(BinOp("*", Var("a"), Var("c")))),
    ("a//c%d", BinOp("%", BinOp("//", Var("a"), Var("c")), Var("d"))),
    ("-inf", Neg(Num(math.inf))),
    ("1e-05", Num(1e-05)),
    ("2.5e+10", Num(2.5e10)),
    ("007", Num(7)),
    ("max(a,min(c,0.5))", Call("max", (Var("a"), Call("min", (Var("c"), Num(0.5)))))),
    ("if_then_else(1<=c<7,c,0)", Select(Compare((Num(1), Var("c"), Num(7)), ("<=", "<")), Var("c"), Num(0))),
    ("if_then_else(a<1&c>2|d==0,1,0)", Select(Or((And((Compare((Var("a"), Num(1)), ("<",)),
                                                       Compare((Var("c"), Num(2)), (">",)))),
                                                  Compare((Var("d"), Num(0)), ("==",)))), Num(1), Num(0))),
    ("info+inf", BinOp("+", Var("info"), Num(math.inf))),
])
def test_precedence_and_literals(text, tree):
    assert parse_expr(text) == tree


@pytest.mark.parametrize("text, canonical", [
    ("2.5e+10", "25000000000.0"), ("1E-5", "1e-05"), ("((a))", "a"), ("(a*c)+d", "a*c+d"),
    ("0.50", "0.5"), ("1e16", "1e+16"),
])
def test_numbers_and_parentheses_print_canonically(text, canonical):
    assert format_expr(parse_expr(text)) == canonical


@pytest.mark.parametrize("text, line, column, found, expected_part", [
    ("B^{4}_{tx=0}[C^{f64,g}_{tx}=;];", 1, 29, "';'", "a tensor name"),
    ("B^{4}_{tx=0}[C^{f64,g}_{tx}=1;]", 1, 32, "end of input", "';'"),
    ("B^{4}_{tx=}[C^{f64,g}_{tx}=1;];", 1, 11, "'}'", "an integer"),
    ("B^{4}_{tx=0}[C^{f65,g}_{tx}=1;];", 1, 17, "'f65'", "'f64'"),
    ("B^{4}_{tx=0}[C^{f64,q}_{tx}=1;];", 1, 21, "'q'", "'g'"),
    ("B^{4}_{tx=0}[C^{f64,g}_{tx}=A^{f64,g}_{1.5};];", 1, 41, "'.'", "'}'"),
    ("B^{4}_{tx=0}[C^{f64,g}_{tx}=$;];", 1, 29, "'$'", "'exp'"),
    ("B^{4}_{tx=0}\n[T^{f64,g}_{tx}=1;];", 2, 2, "'T'", "a tensor name"),
    ("", 1, 1, "end of input", "a loop kind"),
    ("B^{4}_{tx=0}[];", 1, 14, "']'", "a tensor name"),
])
def test_syntax_errors_carry_position_found_and_expected(text, line, column, found, expected_part):
    with pytest.raises(LeirSyntaxError) as info:
        parse_program(text)
    err = info.value
    assert (err.line, err.column, err.found) == (line, column, found)
    assert any(expected_part in e for e in err.expected), err.expected
    assert str(err).startswith(f"{line}:{column}: error: ")


def test_printer_rejects_nodes_without_text():
    from leir.printer import UnprintableError

    cond_in_sum = BinOp("+", Compare((Var("a"), Num(1)), ("<",)), Num(1))
    with pytest.raises(UnprintableError):
        format_expr(cond_in_sum)


def test_num_rejects_negative_and_nan():
    with pytest.raises(ValueError):
        Num(-1)
    with pytest.raises(ValueError):
        Num(float("nan"))
    with pytest.raises(TypeError):
        Num(True)


def test_fast_exp_extension_parses_with_both_parsers_and_prints_back():
    """`fast_exp` (our extension, leir/ast.py) is a keyword: never an index name, same tree either way."""
    text = "B^{2}_{tx=0}V^{8}_{a=0}[C^{f32,g}_{tx,a}=fast_exp(A^{f32,g}_{tx,a}-1)+exp(A^{f32,g}_{tx,a});];"
    tree = parse_program(text)
    assert parse_with_spec(text) == tree
    assert format_program(tree) == text
    assert parse_expr("fast_exp(a)") == Call("fast_exp", (Var("a"),))
    with pytest.raises(LeirSyntaxError):
        parse_program("B^{2}_{tx=0}[C^{f32,g}_{tx}=fast_exp;];")


@pytest.mark.parametrize("fn", ["fast_log", "fast_erf"])
def test_fast_log_and_fast_erf_parse_with_both_parsers_and_print_back(fn):
    text = f"B^{{2}}_{{tx=0}}V^{{8}}_{{a=0}}[C^{{f32,g}}_{{tx,a}}={fn}(A^{{f32,g}}_{{tx,a}}+1)*2;];"
    tree = parse_program(text)
    assert parse_with_spec(text) == tree and format_program(tree) == text
    assert parse_expr(f"{fn}(a)") == Call(fn, (Var("a"),))
    with pytest.raises(LeirSyntaxError):
        parse_program(f"B^{{2}}_{{tx=0}}[C^{{f32,g}}_{{tx}}={fn};];")
