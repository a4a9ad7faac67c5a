"""LEIR, the Loop-Equation IR: syntax tree, parser, printer, validation, analysis, canonical hash.

This package imports nothing else of the project; only `leir.lower*` imports TVM.
"""
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
from leir.errors import LeirError, LeirSyntaxError, SignatureError
from leir.parse import parse_expr, parse_program
from leir.printer import format_expr, format_program
from leir.signature import Signature, TensorSpec

__all__ = [
    "Access", "And", "BinOp", "Call", "Compare", "Loop", "Neg", "Nest", "Num", "Or", "Program", "Select",
    "Stmt", "Var", "LeirError", "LeirSyntaxError", "SignatureError", "parse_expr", "parse_program",
    "format_expr", "format_program", "Signature", "TensorSpec",
]
