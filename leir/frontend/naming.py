"""Tensor names of a translated program, in the order of docs/leir.md §5: inputs, traced intermediates,
the output, constants, parameters (fresh temporaries follow, handed out by the emitter).

A node whose value is a tuple of tensors of one shape and dtype (split, chunk, qkv) gets one name,
stacked on a leading literal index; `getitem` on it is a slot of that name, not a new tensor.
"""
from __future__ import annotations

from dataclasses import dataclass, field

import torch
import torch.fx as fx

from leir.dtypes import code_of
from leir.frontend.emit import Ref
from leir.frontend.graph import OpCall
from leir.frontend.registry import TranslationError
from leir.names import tensor_name


@dataclass
class NamePlan:
    inputs: list[Ref] = field(default_factory=list)
    output: Ref | None = None
    output_needs_copy: bool = False
    constants: list[tuple[Ref, torch.Tensor]] = field(default_factory=list)
    parameters: list[tuple[Ref, torch.Tensor]] = field(default_factory=list)
    nodes: dict[fx.Node, Ref | list[Ref]] = field(default_factory=dict)
    tensors: dict[int, Ref] = field(default_factory=dict)  # id(module tensor) -> its name

    def used_names(self) -> list[str]:
        refs = self.inputs + [r for r, _ in self.constants] + [r for r, _ in self.parameters]
        for value in self.nodes.values():
            refs.extend(value if isinstance(value, list) else [value])
        if self.output is not None:
            refs.append(self.output)
        return [r.name for r in refs]


class _Allocator:
    def __init__(self, float_code: str):
        self.count = 0
        self.float_code = float_code

    def ref(self, value: torch.Tensor, lead: tuple[int, ...] = ()) -> Ref:
        name = tensor_name(self.count)
        self.count += 1
        return Ref(name, self.code(value.dtype), lead + tuple(value.shape))

    def code(self, dtype: torch.dtype) -> str:
        # Tracing runs in float64; floating tensors take the dtype the program is translated for.
        return self.float_code if dtype.is_floating_point else code_of(str(dtype))


def is_tensor_tuple(value) -> bool:
    return isinstance(value, tuple | list) and bool(value) and all(isinstance(v, torch.Tensor) for v in value)


def stackable(values) -> bool:
    return all(v.shape == values[0].shape and v.dtype == values[0].dtype for v in values)


def plan_names(gm: fx.GraphModule, values: dict, calls: dict[fx.Node, OpCall], module, float_code: str
               ) -> NamePlan:
    """Names for `gm`, traced from `module` (whose parameters and buffers are the parameters)."""
    graph = gm.graph
    plan, alloc = NamePlan(), _Allocator(float_code)
    out_node = _output_arg(graph)
    for node in graph.nodes:
        if node.op == "placeholder" and isinstance(values[node], torch.Tensor):
            ref = alloc.ref(values[node])
            plan.inputs.append(ref)
            plan.nodes[node] = ref
    for node in calls:
        if node is not out_node:
            _name_call(node, values[node], alloc, plan)
    _name_output(out_node, values, calls, alloc, plan)
    module_tensors = _module_tensors(gm, calls)
    owned = {id(t) for t in module.parameters()} | {id(t) for t in module.buffers()}
    for kind in ("constant", "parameter"):
        for tensor in module_tensors:
            if (id(tensor) in owned) == (kind == "parameter") and id(tensor) not in plan.tensors:
                ref = alloc.ref(tensor)
                plan.tensors[id(tensor)] = ref
                (plan.parameters if kind == "parameter" else plan.constants).append((ref, tensor))
    return plan


def _output_arg(graph: fx.Graph):
    for node in graph.nodes:
        if node.op == "output":
            return node.args[0]
    raise TranslationError("the traced graph has no output")


def _name_call(node, value, alloc: _Allocator, plan: NamePlan) -> None:
    if isinstance(value, torch.Tensor):
        plan.nodes[node] = alloc.ref(value)
    elif is_tensor_tuple(value):
        if stackable(value):
            base = alloc.ref(value[0], lead=(len(value),))
            plan.nodes[node] = [base.slot(k) for k in range(len(value))]
        else:
            plan.nodes[node] = [alloc.ref(v) for v in value]


def _name_output(out_node, values, calls, alloc: _Allocator, plan: NamePlan) -> None:
    if isinstance(out_node, fx.Node) and out_node in calls:
        _name_call(out_node, values[out_node], alloc, plan)
        named = plan.nodes.get(out_node)
        if isinstance(named, Ref):
            plan.output = named
            return
        if isinstance(named, list) and named and named[0].lead:
            plan.output = Ref(named[0].name, named[0].code, (len(named),) + named[0].shape)
            return
    result = _output_value(out_node, values)
    if isinstance(result, torch.Tensor):
        plan.output = alloc.ref(result)
    elif is_tensor_tuple(result) and stackable(result):
        plan.output = alloc.ref(result[0], lead=(len(result),))
    else:
        raise TranslationError("the module must return a tensor or a tuple of tensors of one shape and dtype "
                               f"(got {type(result).__name__})")
    plan.output_needs_copy = True


def _output_value(out_node, values):
    if isinstance(out_node, fx.Node):
        return values[out_node]
    if isinstance(out_node, tuple | list):
        return type(out_node)(_output_value(a, values) for a in out_node)
    return out_node


def fetch_attr(root, target: str):
    obj = root
    for part in target.split("."):
        obj = getattr(obj, part)
    return obj


def _module_tensors(gm, calls) -> list[torch.Tensor]:
    """Tensors that come from the module (get_attr nodes, leaf-module parameters), in order of use."""
    found: list[torch.Tensor] = []
    seen: set[int] = set()

    def visit(a):
        if isinstance(a, torch.Tensor) and id(a) not in seen:
            seen.add(id(a))
            found.append(a)
        elif isinstance(a, tuple | list):
            for x in a:
                visit(x)
        elif isinstance(a, dict):
            for x in a.values():
                visit(x)

    for node in gm.graph.nodes:
        if node.op == "get_attr":
            visit(fetch_attr(gm, node.target))
        elif node in calls:
            visit(calls[node].args)
            visit(calls[node].kwargs)
    return found
