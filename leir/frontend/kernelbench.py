"""Importer of KernelBench-style problem files: module-level size constants, `class Model(nn.Module)`,
`get_inputs()` and `get_init_inputs()`.

The file is loaded from its path (importlib) after its top-level constant assignments were rewritten
(Python `ast`, so constants derived from others follow): `overrides` replace values (`--set N=64`),
and `shrink_to(max_elements)` halves size constants one at a time until every input has at most that
many elements, keeping only steps after which the model still builds and runs (shapes are checked on
the `meta` device, so huge defaults cost nothing). It reports when it cannot.
"""
from __future__ import annotations

import ast
import importlib.util
import math
from dataclasses import dataclass, field
from pathlib import Path

import torch

from leir.frontend.registry import TranslationError


class ProblemError(TranslationError):
    """A problem file that cannot be loaded, built or shrunk as asked."""


@dataclass
class Problem:
    path: Path
    constants: dict[str, int | float | tuple]   # module-level numeric constants (and int tuples), as used
    shrunk: dict[str, int | tuple] = field(default_factory=dict)  # constants changed by --max-elements
    model: torch.nn.Module | None = None
    inputs: list = field(default_factory=list)


def read_constants(path: Path) -> dict[str, int | float]:
    """Module-level `NAME = <number or arithmetic of earlier constants>` assignments, in order."""
    tree = _parse(path)
    values: dict[str, int | float] = {}
    for stmt in tree.body:
        name = _assigned_name(stmt)
        if name is None:
            continue
        value = _arithmetic(stmt.value, values)
        if isinstance(stmt.value, ast.Tuple):  # a shape such as `input_shape = (4096,)`
            parts = tuple(_arithmetic(e, values) for e in stmt.value.elts)
            value = parts if parts and all(isinstance(v, int) and not isinstance(v, bool) for v in parts) else None
        if isinstance(value, int | float | tuple) and not isinstance(value, bool):
            values[name] = value
    return values


_BINARY = {ast.Add: lambda a, b: a + b, ast.Sub: lambda a, b: a - b, ast.Mult: lambda a, b: a * b,
           ast.FloorDiv: lambda a, b: a // b, ast.Div: lambda a, b: a / b, ast.Pow: lambda a, b: a ** b,
           ast.Mod: lambda a, b: a % b}


def _arithmetic(node, known: dict):
    """The value of a constant expression of numbers and earlier constants, else None (no eval)."""
    if isinstance(node, ast.Constant) and isinstance(node.value, int | float):
        return node.value
    if isinstance(node, ast.Name):
        return known.get(node.id)
    if isinstance(node, ast.UnaryOp) and isinstance(node.op, ast.USub | ast.UAdd):
        v = _arithmetic(node.operand, known)
        return None if v is None else (-v if isinstance(node.op, ast.USub) else v)
    if isinstance(node, ast.BinOp) and type(node.op) in _BINARY:
        a, b = _arithmetic(node.left, known), _arithmetic(node.right, known)
        if a is None or b is None:
            return None
        try:
            return _BINARY[type(node.op)](a, b)
        except (ZeroDivisionError, OverflowError):
            return None
    return None


def _parse(path: Path) -> ast.Module:
    try:
        tree = ast.parse(path.read_text(), filename=str(path))
    except (OSError, SyntaxError) as e:
        raise ProblemError(f"{path}: cannot read the problem file: {e}") from None
    tree.body = [part for stmt in tree.body for part in _split_assignment(stmt)]
    return tree


def _split_assignment(stmt) -> list:
    """`h, w = 32, 32` and `h = w = 64` as one assignment per name, so each is a constant of its own."""
    if not isinstance(stmt, ast.Assign):
        return [stmt]
    if len(stmt.targets) > 1 and all(isinstance(t, ast.Name) for t in stmt.targets):
        return [ast.copy_location(ast.Assign([t], stmt.value), stmt) for t in stmt.targets]
    target = stmt.targets[0]
    if (len(stmt.targets) == 1 and isinstance(target, ast.Tuple) and isinstance(stmt.value, ast.Tuple)
            and len(target.elts) == len(stmt.value.elts) and all(isinstance(t, ast.Name) for t in target.elts)):
        return [ast.copy_location(ast.Assign([t], v), stmt) for t, v in zip(target.elts, stmt.value.elts,
                                                                           strict=True)]
    return [stmt]


def _assigned_name(stmt) -> str | None:
    if isinstance(stmt, ast.Assign) and len(stmt.targets) == 1 and isinstance(stmt.targets[0], ast.Name):
        return stmt.targets[0].id
    if isinstance(stmt, ast.AnnAssign) and isinstance(stmt.target, ast.Name) and stmt.value is not None:
        return stmt.target.id
    return None


def load_module(path: Path, overrides: dict[str, int | float]):
    """The problem file executed as a module, with `overrides` replacing its top-level constants."""
    tree = _parse(path)
    unknown = set(overrides) - {_assigned_name(s) for s in tree.body}
    if unknown:
        raise ProblemError(f"{path}: --set names no module-level constant: {', '.join(sorted(unknown))}")
    for stmt in tree.body:
        name = _assigned_name(stmt)
        if name in overrides:
            stmt.value = ast.copy_location(ast.Constant(overrides[name]), stmt.value)
    spec = importlib.util.spec_from_file_location(f"kernelbench_problem_{path.stem}", path)
    module = importlib.util.module_from_spec(spec)
    try:
        exec(compile(tree, str(path), "exec"), module.__dict__)  # noqa: S102 - the user's own problem file
    except Exception as e:
        raise ProblemError(f"{path}: the problem file fails to load: {type(e).__name__}: {e}") from None
    for required in ("Model", "get_inputs", "get_init_inputs"):
        if not hasattr(module, required):
            raise ProblemError(f"{path}: a KernelBench problem defines Model, get_inputs and get_init_inputs; "
                               f"{required} is missing")
    return module


def _instantiate(module, device: str | None = None):
    ctx = torch.device(device) if device else _NoDevice()
    with ctx:
        init = list(module.get_init_inputs())
        model = module.Model(*init)
        inputs = list(module.get_inputs())
    return model, inputs


class _NoDevice:
    def __enter__(self):
        return self

    def __exit__(self, *exc):
        return False


def _probe(path: Path, values: dict) -> list[int]:
    """Element counts of the inputs; raises when the model does not build or run (meta device)."""
    module = load_module(path, values)
    model, inputs = _instantiate(module, "meta")
    with torch.no_grad():
        model(*inputs)
    return [x.numel() for x in inputs if isinstance(x, torch.Tensor)]


def _excess(sizes: list[int], limit: int) -> int:
    return sum(max(0, s - limit) for s in sizes)


def shrink_constants(path: Path, values: dict, fixed: set[str], limit: int) -> dict[str, int]:
    """Halve integer constants (largest first) until every input has at most `limit` elements."""
    values = dict(values)
    try:
        sizes = _probe(path, values)
    except ProblemError:
        raise
    except Exception as e:
        raise ProblemError(f"{path}: the model does not run with these constants: {type(e).__name__}: {e}") from None
    frozen = set(fixed)
    while _excess(sizes, limit) > 0:
        step = _shrink_step(path, values, frozen, sizes, limit)
        if step is None:
            raise ProblemError(f"{path}: cannot shrink the inputs to at most {limit} elements (now "
                               f"{max(sizes)}); constants kept: {_describe(values, frozen)}")
        values, sizes = step
    return {k: v for k, v in values.items() if v != read_constants(path).get(k)}


def _shrink_step(path, values, frozen, sizes, limit):
    """One halving that reduces the inputs' excess over `limit`; `frozen` learns the constants that
    must keep their value or do not size the inputs. Candidates: int constants and tuple elements."""
    for key, _ in sorted(_candidates(values, frozen), key=lambda c: (-c[1], c[0])):
        trial = {**values, key[0]: _halved(values[key[0]], key[1])}
        try:
            trial_sizes = _probe(path, trial)
        except Exception:
            frozen.add(key)  # the model needs this value (kernel size, divisibility, head count ...)
            continue
        if _excess(trial_sizes, limit) < _excess(sizes, limit):
            return trial, trial_sizes
        frozen.add(key)  # does not size the inputs
    return None


def _candidates(values, frozen):
    for name, v in values.items():
        if name in frozen:
            continue
        if isinstance(v, int) and v >= 2 and (name, None) not in frozen:
            yield (name, None), v
        elif isinstance(v, tuple):
            yield from (((name, i), e) for i, e in enumerate(v) if e >= 2 and (name, i) not in frozen)


def _halved(value, index):
    if index is None:
        return value // 2
    return value[:index] + (value[index] // 2,) + value[index + 1:]


def _describe(values, frozen) -> str:
    names = sorted({k if isinstance(k, str) else k[0] for k in frozen})
    return ", ".join(f"{k}={values[k]}" for k in names if k in values) or "none"


def load_problem(path: str | Path, overrides: dict[str, int | float] | None = None,
                 max_elements: int | None = None) -> Problem:
    """Load, override, optionally shrink, then build the model and its example inputs (CPU)."""
    path = Path(path)
    overrides = dict(overrides or {})
    constants = {**read_constants(path), **overrides}
    shrunk: dict[str, int] = {}
    if max_elements is not None:
        shrunk = shrink_constants(path, constants, set(overrides), max_elements)
        shrunk = {k: v for k, v in shrunk.items() if k not in overrides}
        constants.update(shrunk)
    module = load_module(path, {k: v for k, v in constants.items() if k in overrides or k in shrunk})
    torch.manual_seed(0)
    try:
        model, inputs = _instantiate(module)
    except Exception as e:
        raise ProblemError(f"{path}: building the model fails: {type(e).__name__}: {e}") from None
    return Problem(path, constants, shrunk, model, inputs)


def parse_assignment(text: str) -> tuple[str, int | float]:
    """`NAME=VALUE` of `--set` (VALUE an int or a float)."""
    name, sep, value = text.partition("=")
    if not sep or not name.strip().isidentifier():
        raise ProblemError(f"--set expects NAME=VALUE, got {text!r}")
    try:
        number = int(value)
    except ValueError:
        try:
            number = float(value)
        except ValueError:
            raise ProblemError(f"--set {name}: {value!r} is not a number") from None
    if isinstance(number, float) and not math.isfinite(number):
        raise ProblemError(f"--set {name}: {value!r} is not finite")
    return name.strip(), number
