"""fx nodes as calls of registered operators: `OpCall(name, args, kwargs, inplace, where)`.

`torch.relu(x)`, `F.relu(x)`, `x.relu()`, `x.relu_()` and `nn.ReLU()` all become `relu`. The source
location comes from the stack trace the tracer records, for error messages.
"""
from __future__ import annotations

import operator
from dataclasses import dataclass

import torch.fx as fx

from leir.frontend.modules import MODULE_CONVERTERS
from leir.frontend.registry import UnsupportedForm, UnsupportedOperator, handler_for

# Python operator and method spellings that are another name of a registered operator.
ALIASES = {
    "truediv": "div", "floordiv": "floor_divide", "mod": "remainder", "fmod": "fmod",
    "and_": "logical_and", "or_": "logical_or", "invert": "logical_not", "xor": "logical_xor",
    "bitwise_and": "logical_and", "bitwise_or": "logical_or", "bitwise_not": "logical_not",
    "multiply": "mul", "divide": "div", "subtract": "sub", "true_divide": "div", "absolute": "abs",
    "greater": "gt", "greater_equal": "ge", "less": "lt", "less_equal": "le", "not_equal": "ne",
    "swapaxes": "transpose", "swapdims": "transpose", "concat": "cat", "concatenate": "cat",
    "clip": "clamp", "negative": "neg", "special_erf": "erf", "linalg_vector_norm": "vector_norm",
    "expit": "sigmoid", "log_sigmoid": "logsigmoid",
}
INPLACE_OPERATORS = {"iadd": "add", "isub": "sub", "imul": "mul", "itruediv": "div", "ifloordiv": "floor_divide",
                     "ipow": "pow", "imod": "remainder"}
TORCH_MODULE_PREFIXES = ("torch", "_operator", "operator", "math")


@dataclass
class OpCall:
    name: str
    args: tuple
    kwargs: dict
    inplace: bool
    pytorch: str  # how the operator is spelled in PyTorch, for messages
    where: str


def source_location(node: fx.Node) -> str:
    """`file.py:12 (x = F.foo(x))` from the node's recorded stack trace, or the node name."""
    trace = node.meta.get("stack_trace") or ""
    lines = [ln.strip() for ln in trace.strip().splitlines()]
    for i in range(len(lines) - 1, -1, -1):
        if lines[i].startswith("File ") and "/torch/" not in lines[i]:
            parts = lines[i].split(",")
            path = parts[0].removeprefix("File ").strip().strip('"')
            line = parts[1].strip().removeprefix("line ") if len(parts) > 1 else "?"
            code = lines[i + 1] if i + 1 < len(lines) else ""
            return f"{path}:{line} ({code}) [fx node {node.name}]"
    return f"fx node {node.name}"


def pytorch_spelling(node: fx.Node, root) -> str:
    if node.op == "call_function":
        mod = getattr(node.target, "__module__", None) or ""
        return f"{mod}.{getattr(node.target, '__name__', node.target)}".lstrip(".")
    if node.op == "call_method":
        return f"Tensor.{node.target}"
    if node.op == "call_module":
        m = root.get_submodule(node.target)
        return f"{type(m).__module__}.{type(m).__name__}"
    return str(node.target)


def normalise(node: fx.Node, root) -> OpCall:
    """The registered operator a call node stands for; raises UnsupportedOperator otherwise."""
    where, spelled = source_location(node), pytorch_spelling(node, root)
    args, kwargs, inplace = tuple(node.args), dict(node.kwargs), False
    if node.op == "call_module":
        module = root.get_submodule(node.target)
        convert = MODULE_CONVERTERS.get(type(module))
        if convert is None:
            raise UnsupportedOperator(spelled, where)
        try:
            name, args, kwargs = convert(module, args, kwargs)
        except UnsupportedForm as e:
            raise UnsupportedOperator(spelled, where, str(e)) from None
        inplace = getattr(module, "inplace", False) is True
    elif node.op == "call_function":
        name, inplace = _function_name(node.target)
        if name is None:
            raise UnsupportedOperator(spelled, where, "not a PyTorch operator")
    else:
        name, inplace = _method_name(node.target)
    if kwargs.pop("inplace", False) is True:
        inplace = True
    if handler_for(name) is None:
        raise UnsupportedOperator(spelled, where)
    return OpCall(name, args, kwargs, inplace, spelled, where)


def _function_name(target) -> tuple[str | None, bool]:
    if target is operator.getitem:
        return "getitem", False
    if target is getattr:
        return "getattr", False
    module = getattr(target, "__module__", None) or ""
    name = getattr(target, "__name__", None)
    if name is None or not module.startswith(TORCH_MODULE_PREFIXES):
        return None, False
    if name in INPLACE_OPERATORS:
        return INPLACE_OPERATORS[name], True
    return _method_name(name.lstrip("_"))


def _method_name(name: str) -> tuple[str, bool]:
    inplace = name.endswith("_") and not name.startswith("_")
    base = name[:-1] if inplace else name
    return ALIASES.get(base, base), inplace
