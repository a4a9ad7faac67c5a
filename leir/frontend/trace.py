"""Tracing a module into a torch.fx graph with the concrete value of every node.

`symbolic_trace` first; when the module runs Python that needs a value (`if x.size(0) > 1`,
`range(x.shape[1])`), trace again with `ConcreteTracer`, whose proxies carry the real value so that
shapes, lengths and truth values are known during tracing. Then every node is run once on the
example inputs (`record_values`) so that the emitter knows shapes, dtypes and Python results.
"""
from __future__ import annotations

from collections.abc import Sequence

import torch
import torch.fx as fx
import torch.nn as nn

from leir.frontend.modules import MODULE_CONVERTERS
from leir.frontend.registry import TranslationError


class LeafTracer(fx.Tracer):
    """Keeps the modules the translator knows as single nodes; traces through all others."""

    def __init__(self):
        super().__init__()
        self.record_stack_traces = True
        self.proxy_buffer_attributes = True  # buffers are signature inputs, like parameters

    def is_leaf_module(self, m: torch.nn.Module, qualname: str) -> bool:
        return type(m) in MODULE_CONVERTERS


class ConcreteProxy(fx.Proxy):
    """A proxy that also knows the value of its node, for Python that branches on shapes."""

    def __init__(self, node, tracer, value):
        super().__init__(node, tracer)
        self.value = value

    def __bool__(self):
        return bool(self.value)

    def __int__(self):
        return int(self.value)

    def __index__(self):
        return int(self.value)

    def __float__(self):
        return float(self.value)

    def __len__(self):
        return len(self.value)

    def __iter__(self):
        if isinstance(self.value, torch.Tensor | tuple | list):
            return (self[i] for i in range(len(self.value)))
        return iter(self.value)

    @property
    def shape(self):
        return self.value.shape

    @property
    def ndim(self):
        return self.value.ndim

    @property
    def dtype(self):
        return self.value.dtype

    @property
    def device(self):
        return self.value.device

    def size(self, dim=None):
        return self.value.size() if dim is None else self.value.size(dim)

    def dim(self):
        return self.value.dim()

    def numel(self):
        return self.value.numel()


class ConcreteTracer(LeafTracer):
    """A tracer whose proxies carry values computed on the example inputs as tracing goes."""

    def __init__(self, example_inputs: Sequence):
        super().__init__()
        self._inputs = list(example_inputs)
        self._next_input = 0

    def proxy(self, node):
        # While a value is computed, module attributes are values, not proxies (see `getattr`).
        self._computing = True
        try:
            value = self._value_of(node)
        finally:
            self._computing = False
        return ConcreteProxy(node, self, value)

    def getattr(self, attr, attr_val, parameter_proxy_cache):
        if getattr(self, "_computing", False):
            return attr_val
        return super().getattr(attr, attr_val, parameter_proxy_cache)

    def _value_of(self, node):
        def value(a):
            return a.value if isinstance(a, ConcreteProxy) else a

        args = fx.node.map_aggregate(node.args, lambda a: value(self._proxy_of(a)))
        kwargs = fx.node.map_aggregate(node.kwargs, lambda a: value(self._proxy_of(a)))
        if node.op == "placeholder":
            v = self._inputs[self._next_input]
            self._next_input += 1
            return v
        if node.op == "get_attr":
            return _fetch_attr(self.root, node.target)
        if node.op == "call_function":
            return node.target(*args, **kwargs)
        if node.op == "call_method":
            return getattr(args[0], node.target)(*args[1:], **kwargs)
        if node.op == "call_module":
            # forward, not __call__: the tracer patches Module.__call__ while it runs
            return self.root.get_submodule(node.target).forward(*args, **kwargs)
        return None

    def _proxy_of(self, a):
        if isinstance(a, fx.Node) and a not in self._values and a.op == "get_attr":
            return _fetch_attr(self.root, a.target)  # a tensor constant made during tracing
        return self._values.get(a, a) if isinstance(a, fx.Node) else a

    def trace(self, root, concrete_args=None):
        self._values: dict = {}
        return super().trace(root, concrete_args)

    def create_proxy(self, kind, target, args, kwargs, name=None, type_expr=None, proxy_factory_fn=None):
        p = super().create_proxy(kind, target, args, kwargs, name, type_expr, proxy_factory_fn)
        self._values[p.node] = p
        return p


def _fetch_attr(root, target: str):
    obj = root
    for part in target.split("."):
        obj = getattr(obj, part)
    return obj


class _Wrapped(nn.Module):
    """Holds a known layer given as the root, so that it is traced as one leaf call."""

    def __init__(self, layer: nn.Module):
        super().__init__()
        self.layer = layer


def wrap_leaf(module: nn.Module, n_inputs: int) -> nn.Module:
    if type(module) not in MODULE_CONVERTERS:
        return module
    forwards = {1: lambda self, a: self.layer(a), 2: lambda self, a, b: self.layer(a, b),
                3: lambda self, a, b, c: self.layer(a, b, c)}
    if n_inputs not in forwards:
        return module
    cls = type(type(module).__name__, (_Wrapped,), {"forward": forwards[n_inputs]})
    return cls(module)


def trace_module(module: torch.nn.Module, example_inputs: Sequence) -> fx.GraphModule:
    """A GraphModule equal to `module` on inputs shaped like `example_inputs`."""
    try:
        return _symbolic(module)
    except Exception as first:  # data-dependent Python: retry with concrete values
        try:
            return _concrete(module, example_inputs)
        except Exception as second:
            raise TranslationError(f"cannot trace the module: {first}; with concrete values: "
                                   f"{type(second).__name__}: {second}") from None


def _symbolic(module) -> fx.GraphModule:
    tracer = LeafTracer()
    graph = tracer.trace(module)
    return fx.GraphModule(tracer.root, graph, type(module).__name__)


def _concrete(module, example_inputs) -> fx.GraphModule:
    tracer = ConcreteTracer([_clone(x) for x in example_inputs])
    graph = tracer.trace(module)
    return fx.GraphModule(tracer.root, graph, type(module).__name__)


def _clone(x):
    return x.clone() if isinstance(x, torch.Tensor) else x


class _Recorder(fx.Interpreter):
    def __init__(self, gm):
        super().__init__(gm)
        self.values: dict[fx.Node, object] = {}

    def run_node(self, n):
        result = super().run_node(n)
        self.values[n] = _snapshot(result)
        return result


def _snapshot(value):
    # In-place operators change earlier results later on; keep each node's value as it was.
    if isinstance(value, torch.Tensor):
        return value.detach().clone()
    if isinstance(value, tuple | list):
        return type(value)(_snapshot(v) for v in value)
    return value


def record_values(gm: fx.GraphModule, example_inputs: Sequence) -> dict[fx.Node, object]:
    """The value of every node when the graph runs on (copies of) the example inputs."""
    recorder = _Recorder(gm)
    with torch.no_grad():
        recorder.run(*[_clone(x) for x in example_inputs])
    return recorder.values
