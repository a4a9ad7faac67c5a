"""The PyTorch -> LEIR translator (docs/leir.md §5): `translate(module, inputs) -> Translation`.

The module is traced with torch.fx (`trace`), every call node becomes a registered operator
(`graph`), tensors are named in the order of §5 (`naming`) and each operator emits its
nests (`ops`). Tracing and the reference run in float64; the program's floating tensors take
the requested dtype. Nothing partial is returned: any unsupported operator raises before the program
is built.

    t = translate(model, [torch.randn(4, 8)], dtype="float32")
    t.text            # canonical LEIR
    t.signature       # leir.signature.Signature
    t.reference(ins)  # PyTorch eager (float64) on a dict name -> numpy array
"""
from __future__ import annotations

import copy
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

import numpy as np
import torch
import torch.fx as fx

from leir.ast import Program
from leir.dtypes import code_of, torch_name
from leir.frontend.emit import Emitter, Ref, copy_nest
from leir.frontend.graph import INPLACE_OPERATORS, OpCall, normalise
from leir.frontend.naming import NamePlan, fetch_attr, is_tensor_tuple, plan_names
from leir.frontend.reference import make_reference
from leir.frontend.registry import (
    TranslationError,
    UnsupportedForm,
    UnsupportedOperator,
    computes_in_float32,
    handler_for,
    supported_operators,
)
from leir.frontend.trace import record_values, trace_module, wrap_leaf
from leir.printer import format_program
from leir.signature import Signature, TensorSpec

__all__ = ["Translation", "translate", "TranslationError", "UnsupportedOperator", "supported_operators"]


@dataclass
class Translation:
    program: Program
    signature: Signature
    reference: Callable[[dict[str, np.ndarray]], np.ndarray]
    example_inputs: dict[str, np.ndarray]
    # PyTorch eager in the program's own floating dtype (None for float64 programs): its distance from
    # `reference` is what that dtype achieves on the inputs (gpu_tasks.verify, the originals' rule)
    reference_in_dtype: Callable[[dict[str, np.ndarray]], np.ndarray] | None = None
    # tensors the module builds in `forward` (`torch.tensor([...])`, a tensor attribute that is neither a
    # parameter nor a buffer): inputs of the program after the forward inputs (the published order:
    # inputs, constants, parameters), here with the values the module gives them (empty on `meta`)
    constants: dict[str, np.ndarray] = field(default_factory=dict)
    # the size-dependent choices of the emission (per sum that may go in two stages, in order, whether it
    # does): what `translate(..., cascades=)` repeats at other sizes
    cascades: tuple[bool, ...] = ()
    # float literals of the program computed from sizes (attention's 1/sqrt(E)): where a shrunk instance
    # may differ from the own-size program beyond its integers (`leir.frontend.sizes.same_structure`)
    size_constants: tuple[float, ...] = ()

    @property
    def text(self) -> str:
        return format_program(self.program)


def translate(module: torch.nn.Module, inputs: Sequence, dtype: str | None = None,
              cascades: Sequence[bool] | None = None) -> Translation:
    """Translate `module` called on `inputs` (tensors; other values are baked in as constants). A module
    and inputs on the `meta` device translate too (only shapes are needed): the program at sizes too
    large to run, whose `reference` cannot be called and whose `example_inputs` are empty. `cascades`
    makes the size-dependent choices of another translation of the module (its `cascades`): a shrunk
    instance then has the program of the own-size one, modulo sizes."""
    float_code = code_of(dtype or _input_float_dtype(inputs))
    module64 = wrap_leaf(_as_float64(module), len(inputs))
    inputs64 = [_tensor_float64(x) for x in inputs]
    gm = trace_module(module64, inputs64)
    gm.graph.eliminate_dead_code(is_impure_node=_mutates)
    values = record_values(gm, inputs64)
    calls = {n: normalise(n, gm) for n in gm.graph.nodes if _is_tensor_call(n, values)}
    plan = plan_names(gm, values, calls, module64, float_code)
    program, chosen, size_constants = _emit(gm, values, calls, plan, cascades)
    signature = _signature(plan)
    reference = make_reference(module64, gm, plan, inputs64)
    own = getattr(torch, torch_name(float_code))
    in_dtype = None if own == torch.float64 else make_reference(module64, gm, plan, inputs64, own)
    tensors = [x for x in inputs64 if torch.is_tensor(x)]
    # on the meta device (a model at its own, possibly huge, sizes) there are shapes but no values
    on_meta = any(x.is_meta for x in tensors)
    examples = {} if on_meta else {r.name: _numpy(x) for r, x in zip(plan.inputs, tensors, strict=True)}
    constants = {} if on_meta else \
        {r.name: _numpy(t.to(torch.float64) if t.dtype.is_floating_point else t) for r, t in plan.constants}
    return Translation(program, signature, reference, examples, in_dtype, constants, chosen, size_constants)


def _mutates(node: fx.Node) -> bool:
    """In-place operators stay even when their result is unused (their effect is the point)."""
    if node.op in ("placeholder", "output"):
        return True
    name = node.target if node.op == "call_method" else getattr(node.target, "__name__", "")
    if node.op == "call_module":
        return False
    return isinstance(name, str) and ((name.endswith("_") and not name.startswith("_"))
                                      or name in INPLACE_OPERATORS) or node.is_impure()


def _input_float_dtype(inputs) -> str:
    for x in inputs:
        if isinstance(x, torch.Tensor) and x.dtype.is_floating_point:
            return str(x.dtype).removeprefix("torch.")
    return "float32"


def _as_float64(module: torch.nn.Module) -> torch.nn.Module:
    return copy.deepcopy(module).to(torch.float64)


def _tensor_float64(x):
    if isinstance(x, torch.Tensor) and x.dtype.is_floating_point:
        return x.detach().to(torch.float64)
    return x.detach() if isinstance(x, torch.Tensor) else x


def _numpy(x: torch.Tensor) -> np.ndarray:
    return x.detach().cpu().numpy().copy()


def _is_tensor_call(node: fx.Node, values) -> bool:
    if node.op not in ("call_function", "call_method", "call_module"):
        return False
    if _tuple_element(node, values) is not None:
        return False  # an element of a tuple result: a slot of its name, not an operator
    value = values.get(node)
    return isinstance(value, torch.Tensor) or is_tensor_tuple(value)


def _emit(gm: fx.GraphModule, values, calls: dict[fx.Node, OpCall], plan: NamePlan,
          cascades: Sequence[bool] | None) -> tuple[Program, tuple[bool, ...], tuple[float, ...]]:
    em = Emitter(plan.used_names(), cascades)
    env: dict[fx.Node, object] = dict(plan.nodes)
    for node in gm.graph.nodes:
        if node.op == "placeholder" and node not in env:
            env[node] = _scalar_argument(node, values)
        elif node.op == "get_attr":
            attr = fetch_attr(gm, node.target)
            env[node] = plan.tensors.get(id(attr), attr)
        elif node in calls:
            _emit_call(em, node, calls[node], env, plan)
        elif node.op in ("call_function", "call_method", "call_module"):
            env[node] = _python_value(node, values, env)
        elif node.op == "output":
            _emit_output(em, node.args[0], env, plan)
    return em.program(), tuple(em.cascades), tuple(em.size_constants)


def _scalar_argument(node: fx.Node, values):
    """A forward argument that is not a tensor (`s` in `A * s`, from `get_inputs()`) is baked into the
    program as the constant it was called with; the reference is called with the same value."""
    value = values.get(node)
    if isinstance(value, bool | int | float) or value is None:
        return value
    if isinstance(value, tuple | list) and all(isinstance(v, bool | int | float) for v in value):
        return value
    raise TranslationError(f"forward argument {node.name!r} is a {type(value).__name__}; the translator takes "
                           "tensors and numbers")


def _tuple_element(node: fx.Node, values) -> int | None:
    """The position `k` when `node` is `t[k]` or `t.values`/`t.indices` of a tuple of tensors."""
    if node.op != "call_function" or not node.args or not isinstance(node.args[0], fx.Node):
        return None
    base = values.get(node.args[0])
    if not is_tensor_tuple(base):
        return None
    name = getattr(node.target, "__name__", "")
    if name == "getitem" and isinstance(node.args[1], int):
        return node.args[1]
    fields = getattr(type(base), "__match_args__", None) or getattr(base, "_fields", ())
    if name == "getattr" and node.args[1] in fields:
        return list(fields).index(node.args[1])
    return None


def _python_value(node, values, env):
    k = _tuple_element(node, values)
    if k is not None:
        return env[node.args[0]][k]
    return values[node]


def _emit_call(em: Emitter, node: fx.Node, call: OpCall, env, plan: NamePlan) -> None:
    out = plan.nodes[node]
    args = _resolve(call.args, env, plan)
    kwargs = _resolve(call.kwargs, env, plan)
    if kwargs.pop("out", None) is not None:
        raise UnsupportedOperator(call.pytorch, call.where, "an out= argument")
    try:
        if computes_in_float32(call.name) and isinstance(out, Ref):
            with em.widens(out) as target:
                handler_for(call.name)(em, target, *args, **kwargs)
        else:
            handler_for(call.name)(em, out, *args, **kwargs)
    except UnsupportedForm as e:
        raise UnsupportedOperator(call.pytorch, call.where, str(e)) from None
    except (TypeError, ValueError, IndexError, KeyError) as e:
        raise UnsupportedOperator(call.pytorch, call.where, f"{type(e).__name__}: {e}") from None
    if call.inplace and call.args and isinstance(call.args[0], fx.Node):
        env[call.args[0]] = out  # later uses of the mutated tensor read the result
    env[node] = out


def _resolve(a, env, plan: NamePlan):
    if isinstance(a, fx.Node):
        return env[a]
    if isinstance(a, torch.Tensor):
        if id(a) not in plan.tensors:
            raise TranslationError("a module tensor has no name in the signature")
        return plan.tensors[id(a)]
    if isinstance(a, tuple | list):
        return type(a)(_resolve(x, env, plan) for x in a)
    if isinstance(a, dict):
        return {k: _resolve(v, env, plan) for k, v in a.items()}
    if isinstance(a, slice):
        return slice(_resolve(a.start, env, plan), _resolve(a.stop, env, plan), _resolve(a.step, env, plan))
    return a


def _emit_output(em: Emitter, out_arg, env, plan: NamePlan) -> None:
    if not plan.output_needs_copy:
        return
    out = plan.output
    result = _resolve(out_arg, env, plan)
    parts = result if isinstance(result, tuple | list) else None
    if parts is None:
        copy_nest(em, out, lambda *v: result.at(*v))
        return
    for k, part in enumerate(parts):
        slot = out.slot(k)
        if not isinstance(part, Ref):
            raise TranslationError("a tuple result must hold tensors only")
        copy_nest(em, slot, lambda *v, p=part: p.at(*v))


def _signature(plan: NamePlan) -> Signature:
    def spec(ref: Ref, role: str) -> TensorSpec:
        from leir.dtypes import torch_name

        return TensorSpec(ref.name, ref.shape, torch_name(ref.code), role)

    known = plan.inputs + [r for r, _ in plan.constants] + [r for r, _ in plan.parameters]
    return Signature(tuple(spec(r, "input") for r in known) + (spec(plan.output, "output"),))
