"""LEIR parser: the Lark LALR grammar of `grammar.lark`, with an inline transformer building the AST.

Two parsers share the grammar and the transformer:
- the *spec* parser is `grammar.lark` as written, with Lark's contextual lexer; it is the definition
  of the language and produces the error messages (line, column, found, expected);
- the *fast* parser is the same grammar with three rules read as single tokens (a loop header
  `L^{4}_{a=0}`, an access type `^{f64,g}`, a subscript opener `_{`), fed by a one-regex lexer. It
  makes about half as many tokens, which is where LALR parsing in Python spends its time.
Text is parsed by the fast parser; whenever it fails, the spec parser parses it again and reports.
"""
from __future__ import annotations

import math
import re
from functools import cache
from importlib.resources import files

from lark import Lark, Token, Transformer
from lark.exceptions import UnexpectedCharacters, UnexpectedEOF, UnexpectedInput, UnexpectedToken
from lark.lexer import Lexer
from lark.parsers.lalr_analysis import Shift

from leir.ast import (
    Access,
    And,
    BinOp,
    Call,
    Compare,
    Loop,
    Neg,
    Nest,
    Num,
    Or,
    Program,
    Select,
    Stmt,
    Var,
)
from leir.dtypes import DTYPE_CODES
from leir.errors import LeirSyntaxError

# Readable names for the grammar's named terminals (anonymous ones print their literal text).
_TERMINAL_NAMES = {
    "KIND": "a loop kind (L, P, V, U or B)", "TNAME": "a tensor name", "LNAME": "an index name",
    "INT": "an integer", "DECIMAL": "a number", "RELOP": "a comparison", "INF": "'inf'",
    "SELECT": "'if_then_else'", "FAST_EXP": "'fast_exp'", "FAST_LOG": "'fast_log'", "FAST_ERF": "'fast_erf'",
    "POW": "'**'", "FDIV": "'//'", "ADD": "'+'", "SUB": "'-'",
    "MUL": "'*'", "DIV": "'/'", "MOD": "'%'", "$END": "end of input",
    **{fn.upper(): repr(fn) for fn in ("exp", "log", "sqrt", "abs", "erf", "max", "min")},
}
_SCOPES = ("g", "s", "l")


class _Build(Transformer):
    """Runs inside the LALR parser (no intermediate parse tree)."""

    def start(self, nests):
        return Program(tuple(nests))

    def nest(self, items):
        loops = tuple(i for i in items if isinstance(i, Loop))
        return Nest(loops, tuple(items[len(loops):]))

    def loop(self, c):
        if len(c) == 1:  # fast path: the lexer already made the Loop
            return c[0]
        kind, extent, var, start = c
        return Loop(str(kind), int(extent), str(var), int(start))

    def stmt(self, c):
        return Stmt(c[0], c[1])

    def access(self, c):
        head = c[0]
        if isinstance(head, tuple):  # fast path: `A^{f64,g}` or `A^{f64,g}_{` was one token
            name, dtype, scope = head
            return Access(name, dtype, scope, tuple(c[1:]))
        dtype, scope, rest = c[1], c[2], c[3:]
        _check_type(dtype, scope)
        return Access(str(head), str(dtype), str(scope), rest[0] if rest else ())

    def subscript(self, c):
        return tuple(c)

    def binop(self, c):
        return BinOp(str(c[1]), c[0], c[2])

    def neg(self, c):
        return Neg(c[1])

    def int_lit(self, c):
        return Num(int(c[0]))

    def float_lit(self, c):
        return Num(float(c[0]))

    def inf_lit(self, c):
        return Num(math.inf)

    def var(self, c):
        return Var(str(c[0]))

    def fn1(self, c):
        return str(c[0])

    fn2 = fn1

    def call1(self, c):
        return Call(c[0], (c[1],))

    def call2(self, c):
        return Call(c[0], (c[1], c[2]))

    def select(self, c):
        return Select(c[1], c[2], c[3])

    def or_(self, c):
        return Or(_flatten(Or, c))

    def and_(self, c):
        return And(_flatten(And, c))

    def compare(self, c):
        return Compare(tuple(c[0::2]), tuple(str(t) for t in c[1::2]))


def _flatten(cls, terms):
    out = []
    for t in terms:
        out.extend(t.terms if isinstance(t, cls) else (t,))
    return tuple(out)


def _check_type(dtype, scope):
    if dtype not in DTYPE_CODES:
        raise _PositionedError(dtype, f"unknown dtype code {str(dtype)!r}", [repr(d) for d in DTYPE_CODES])
    if scope not in _SCOPES:
        raise _PositionedError(scope, f"unknown scope code {str(scope)!r}", [repr(s) for s in _SCOPES])


class _PositionedError(Exception):
    def __init__(self, token: Token, detail: str, expected: list[str]):
        self.token, self.detail, self.expected = token, detail, expected


class _FastPathFailed(Exception):
    """The fast lexer met something it does not handle; the spec parser will say what."""


# --- the fast parser -------------------------------------------------------------------------------

_FAST_RULES = {
    'loop: KIND "^" "{" INT "}" "_" "{" LNAME "=" INT "}"': "loop: LOOP",
    'access: TNAME "^" "{" LNAME "," LNAME "}" subscript?':
        'access: ACCESS | ACCESS_OPEN iexpr ("," iexpr)* "}"',
    'subscript: "_" "{" iexpr ("," iexpr)* "}"': "",
}
_FAST_TERMINALS = "\n%declare LOOP ACCESS ACCESS_OPEN\n"

# Alternatives ordered by how often they occur in canonical text; overlapping prefixes (DECIMAL/INT,
# '**'/'*', '//'/'/', '<='/'<') are ordered longest first.
_TOKEN_RE = re.compile(r"""
    (?P<ACCESS>(?P<an>[ACD-KM-OQ-SW-Z][a-z]*)\s*\^\s*\{\s*(?P<ad>[a-z][a-z0-9]*)\s*,\s*(?P<as>[a-z][a-z0-9]*)\s*\}(?P<ao>\s*_\s*\{)?)
  | (?P<OP>\*\*|//|[-+*/%()\[\]{}=,;&|])
  | (?P<WORD>if_then_else(?![a-z0-9_])|fast_(?:exp|log|erf)(?![a-z0-9_])|[a-z][a-z0-9]*)
  | (?P<DECIMAL>\d+\.\d+(?:[eE][+-]?\d+)?|\d+[eE][+-]?\d+)
  | (?P<INT>\d+)
  | (?P<LOOP>(?P<lk>[LPVUB])\s*\^\s*\{\s*(?P<le>\d+)\s*\}\s*_\s*\{\s*(?P<lv>[a-z][a-z0-9]*)\s*=\s*(?P<ls>\d+)\s*\})
  | (?P<RELOP><=|>=|==|!=|<|>)
  | (?P<WS>\s+)
""", re.VERBOSE)


class _UnusedLexer(Lexer):
    """Lark needs a lexer to build the fast grammar's tables; `_FastTables.parse` lexes itself."""

    __future_interface__ = 1

    def __init__(self, lexer_conf):
        pass

    def lex(self, lexer_state, parser_state):
        raise NotImplementedError


def _grammar_text() -> str:
    return files("leir").joinpath("grammar.lark").read_text()


class _FastTables:
    """Lark's LALR table for the fast grammar, flattened so that the driver loop does only str-keyed
    dict look-ups (Lark's own loop hashes Rule objects at every reduction). Unit reductions of
    inlined `?rule`s (expr -> term -> factor -> ...) pass their value through without a call."""

    def __init__(self, lark: Lark, start: str):
        inner = lark.parser.parser.parser
        table, callbacks = inner.parse_table, inner.callbacks
        literals = {t.pattern.value: t.name for t in lark.terminals if t.pattern.type == "str"}
        self.words = {w: literals[w] for w in ("exp", "log", "sqrt", "abs", "erf", "fast_exp", "fast_log",
                                                "fast_erf", "max", "min", "inf", "if_then_else") if w in literals}
        self.ops = {op: literals[op] for op in ("-", "+", "*", "/", "%", "(", ")", "[", "]", "}", "=", ",",
                                                ";", "&", "|", "**", "//") if op in literals}
        self.start_state, self.end_state = table.start_states[start], table.end_states[start]
        reductions: dict[int, tuple] = {}
        self.states: dict[int, dict[str, tuple]] = {}
        for state, actions in table.states.items():
            row = {}
            for symbol, (action, rule) in actions.items():
                if action is Shift:
                    row[str(symbol)] = (True, rule)
                    continue
                if id(rule) not in reductions:
                    unit = len(rule.expansion) == 1 and rule.options.expand1 and rule.alias is None
                    reductions[id(rule)] = (len(rule.expansion), str(rule.origin.name),
                                            None if unit else callbacks[rule])
                row[str(symbol)] = (False, reductions[id(rule)])
            self.states[state] = row

    def parse(self, text: str):
        """Lex and parse in one loop. Token values are plain str, except a loop header (a Loop) and
        an access head (a (tensor, dtype, scope) tuple), which the transformer recognises."""
        states, stack, values = self.states, [self.start_state], []
        words, ops, match, n, pos = self.words, self.ops, _TOKEN_RE.match, len(text), 0
        while True:
            if pos < n:
                m = match(text, pos)
                if m is None:
                    raise _FastPathFailed
                kind, pos = m.lastgroup, m.end()
                if kind == "OP":
                    value = m.group()
                    kind = ops.get(value)
                    if kind is None:  # '{' outside a loop header or an access: the spec parser explains
                        raise _FastPathFailed
                elif kind == "ACCESS":
                    value = m.group("an", "ad", "as")
                    if value[1] not in DTYPE_CODES or value[2] not in _SCOPES:
                        raise _FastPathFailed
                    if m.group("ao") is not None:
                        kind = "ACCESS_OPEN"
                elif kind == "WORD":
                    value = m.group()
                    kind = words.get(value, "LNAME")
                elif kind == "LOOP":
                    value = Loop(m.group("lk"), int(m.group("le")), m.group("lv"), int(m.group("ls")))
                elif kind == "WS":
                    continue
                else:
                    value = m.group()
            else:
                kind = value = "$END"
            while True:
                entry = states[stack[-1]].get(kind)
                if entry is None:
                    raise _FastPathFailed
                if entry[0]:
                    if kind == "$END":
                        raise _FastPathFailed
                    stack.append(entry[1])
                    values.append(value)
                    break
                size, origin, callback = entry[1]
                if callback is None:  # unit pass-through: the value stays, only the state changes
                    stack[-1] = states[stack[-2]][origin][1]
                else:
                    if size:
                        args = values[-size:]
                        del stack[-size:]
                        del values[-size:]
                    else:
                        args = []
                    values.append(callback(args))
                    stack.append(states[stack[-1]][origin][1])
                if kind == "$END" and stack[-1] == self.end_state:
                    return values[-1]


@cache
def _fast_parser(start: str) -> _FastTables:
    grammar = _grammar_text()
    for rule, fast in _FAST_RULES.items():
        if rule not in grammar:
            raise AssertionError(f"grammar.lark no longer has the rule {rule!r}")
        grammar = grammar.replace(rule, fast)
    lark = Lark(grammar + _FAST_TERMINALS, parser="lalr", lexer=_UnusedLexer, start=start,
                transformer=_Build(), maybe_placeholders=False)
    return _FastTables(lark, start)


@cache
def spec_parser(start: str = "start") -> Lark:
    """The grammar exactly as written, with Lark's own lexer (the language's definition)."""
    return Lark(_grammar_text(), parser="lalr", lexer="contextual", start=start, transformer=_Build(),
                maybe_placeholders=False)


# --- entry points ----------------------------------------------------------------------------------

def parse_program(text: str) -> Program:
    """Parse LEIR text (whitespace allowed between tokens); raises LeirSyntaxError."""
    return _parse(text, "start")


def parse_expr(text: str):
    """Parse one value expression (for tests and tools)."""
    return _parse(text, "expr")


def _parse(text: str, start: str):
    if not isinstance(text, str):
        raise TypeError(f"LEIR text must be a str, got {type(text).__name__}")
    try:
        return _fast_parser(start).parse(text)
    except (_FastPathFailed, UnexpectedInput):
        pass
    return parse_with_spec(text, start)


def parse_with_spec(text: str, start: str = "start"):
    """Parse with the spec parser; its errors carry the position and what was expected."""
    parser = spec_parser(start)
    try:
        return parser.parse(text)
    except _PositionedError as e:
        raise LeirSyntaxError(e.token.line, e.token.column, repr(str(e.token)), e.expected, e.detail) from None
    except UnexpectedInput as e:
        raise _syntax_error(parser, text, e) from None


def _syntax_error(parser: Lark, text: str, e: UnexpectedInput) -> LeirSyntaxError:
    if isinstance(e, UnexpectedToken) and e.token.type != "$END":
        return LeirSyntaxError(e.line, e.column, repr(str(e.token)), _describe(parser, _accepted(e)))
    if isinstance(e, UnexpectedCharacters):
        return LeirSyntaxError(e.line, e.column, repr(e.char), _describe(parser, _accepted(e)))
    if isinstance(e, UnexpectedToken | UnexpectedEOF):
        lines = text.split("\n")
        return LeirSyntaxError(len(lines), len(lines[-1]) + 1, "end of input", _describe(parser, _accepted(e)))
    return LeirSyntaxError(getattr(e, "line", 1), getattr(e, "column", 1), "input", [], str(e))


def _accepted(e: UnexpectedInput):
    """Every terminal the parser state accepts (Lark's own list folds keywords into LNAME)."""
    state = getattr(e, "state", None)
    try:
        return [k for k in state.parse_conf.states[state.position] if k.isupper()]
    except AttributeError:
        return getattr(e, "expected", None) or getattr(e, "allowed", None) or ()


def _describe(parser: Lark, names) -> list[str]:
    out = set()
    for name in names:
        if name in _TERMINAL_NAMES:
            out.add(_TERMINAL_NAMES[name])
            continue
        try:
            pattern = parser.get_terminal(name).pattern
        except KeyError:
            continue  # a nonterminal
        out.add(repr(pattern.value) if pattern.type == "str" else name)
    return sorted(out)
