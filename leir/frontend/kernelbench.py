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
    notes: list[str] = field(default_factory=list)  # what was done to make it translatable (said in the record)


def read_constants(path: Path, overrides: dict | None = None) -> dict[str, int | float]:
    """Module-level `NAME = <number or arithmetic of earlier constants>` assignments, in order (with
    `overrides` replacing the values of some; constants derived from them follow)."""
    tree = _parse(path)
    values: dict[str, int | float] = {}
    overrides = overrides or {}
    for stmt in tree.body:
        name = _assigned_name(stmt)
        if name is None:
            continue
        if name in overrides:
            values[name] = overrides[name]
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
        tree = ast.parse(path.read_text(encoding="utf-8"), filename=str(path))
    except UnicodeDecodeError as e:
        raise ProblemError(f"cannot read {path}: not UTF-8 text (offset {e.start})") from None
    except (OSError, SyntaxError) as e:
        raise ProblemError(f"{path}: cannot read the problem file: {e}") from None
    tree.body = [part for stmt in tree.body for part in _split_assignment(stmt)]
    tree.body = [part for stmt in tree.body for part in _lift_input_literals(stmt)]
    return ast.fix_missing_locations(tree)


def root_constants(path: Path) -> set[str]:
    """Constants whose value is written out (`N = 2048 * 2`, `kernel = (3, 5)`), not derived from
    others (`shape = (N, 1)`): the ones to shrink, so that derived ones follow."""
    roots = set()
    for stmt in _parse(path).body:
        name = _assigned_name(stmt)
        if name is not None and not any(isinstance(n, ast.Name) for n in ast.walk(stmt.value)):
            roots.add(name)
    return roots


LITERAL_PREFIX = "get_inputs_literal_"


def _lift_input_literals(stmt) -> list:
    """`torch.rand(batch_size, 3, 224, 224)` in `get_inputs()`: each integer literal (>= 2) given to a
    call becomes a module-level constant `get_inputs_literal_<line>_<column>` assigned just before the
    function, so that --set and --max-elements can size it like any named constant."""
    if not (isinstance(stmt, ast.FunctionDef) and stmt.name == "get_inputs"):
        return [stmt]
    lifted = []

    class Lift(ast.NodeTransformer):
        def visit_Call(self, call):
            self.generic_visit(call)
            for k, arg in enumerate(call.args):
                if isinstance(arg, ast.Constant) and type(arg.value) is int and arg.value >= 2:
                    name = f"{LITERAL_PREFIX}{arg.lineno}_{arg.col_offset}"
                    lifted.append(ast.copy_location(ast.Assign([ast.Name(name, ast.Store())], arg), stmt))
                    call.args[k] = ast.copy_location(ast.Name(name, ast.Load()), arg)
            return call

    Lift().visit(stmt)
    return [*lifted, stmt]


def constant_label(name: str) -> str:
    """How a constant is named in messages (a lifted literal by its place in the file)."""
    if name.startswith(LITERAL_PREFIX):
        line, column = name.removeprefix(LITERAL_PREFIX).split("_")
        return f"the literal at line {line}, column {int(column) + 1} of get_inputs()"
    return name


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
    except MemoryError:  # the file's memory limit: its record says so (cli/translate.py)
        raise
    except Exception as e:
        raise ProblemError(f"{path}: the problem file fails to load: {type(e).__name__}: {e}") from None
    for required in ("Model", "get_inputs", "get_init_inputs"):
        if not hasattr(module, required):
            raise ProblemError(f"{path}: a KernelBench problem defines Model, get_inputs and get_init_inputs; "
                               f"{required} is missing")
    return module


def _instantiate(module, device: str | None = None):
    ctx = torch.device(device) if device else _NoDevice()
    with ctx, DeviceRedirect(device or "cpu"):
        init = list(module.get_init_inputs())
        model = module.Model(*init)
        inputs = list(module.get_inputs())
    return model, inputs


class _NoDevice:
    def __enter__(self):
        return self

    def __exit__(self, *exc):
        return False


class DeviceRedirect(torch.overrides.TorchFunctionMode):
    """Problem files written for a GPU (`torch.rand(..., device='cuda')`, `x.cuda()`) build their tensors
    on `device` (the CPU, or `meta` while probing sizes): the program is the same wherever it runs."""

    def __init__(self, device: str):
        super().__init__()
        self.device = torch.device(device)

    def __torch_function__(self, func, types, args=(), kwargs=None):
        kwargs = dict(kwargs or {})
        if _is_gpu(kwargs.get("device")):
            kwargs["device"] = self.device
        if func in (torch.Tensor.cuda,):
            return args[0]
        if func is torch.Tensor.to:
            args = tuple(self.device if _is_gpu(a) else a for a in args)
        return func(*args, **kwargs)


def _is_gpu(device) -> bool:
    if isinstance(device, str):
        return device.split(":")[0] == "cuda"
    return isinstance(device, torch.device) and device.type == "cuda"


CPU_PROBE_ELEMENTS = 1 << 22  # inputs small enough to run for real when the meta device cannot


def _probe(path: Path, values: dict) -> list[int]:
    """Element counts of the inputs; raises when the model does not build or run (on the meta device;
    a model whose Python needs values, `if x.mean() > 0`, runs on the CPU once its inputs are small,
    and is taken as running while they are larger)."""
    module = load_module(path, values)
    model, inputs = _instantiate(module, "meta")
    sizes = [x.numel() for x in inputs if isinstance(x, torch.Tensor)]
    try:
        with torch.no_grad():
            model(*inputs)
    except MemoryError:  # the file's memory limit: its record says so (cli/translate.py)
        raise
    except Exception as e:
        if "meta" not in str(e):
            raise
        if sum(sizes) <= CPU_PROBE_ELEMENTS:
            model, inputs = _instantiate(module)
            with torch.no_grad():
                model(*inputs)
    return sizes


def _excess(sizes: list[int], limit: int) -> int:
    return sum(max(0, s - limit) for s in sizes)


@dataclass
class Shrink:
    """What `shrink_constants` did: the root constants it changed, and those it had to keep."""

    changed: dict
    kept: list[str]
    reached: bool
    largest: int


def shrink_constants(path: Path, values: dict, fixed: set[str], limit: int, start: dict | None = None) -> Shrink:
    """Halve written-out integer constants (largest first; equal ones together, e.g. a batch size and
    a length that must stay equal) until every input has at most `limit` elements, or nothing more
    can be halved. `values` are the constants to start from; those named in `fixed` keep their
    value, and `start` gives values that differ from the file's and may shrink (e.g. `--set N=4096`
    when the file is verified on a shrunk instance of its own accord)."""
    overrides = {k: v for k, v in values.items() if k in fixed} | dict(start or {})
    try:
        sizes = _probe(path, overrides)
    except ProblemError:
        raise
    except MemoryError:  # the file's memory limit: its record says so (cli/translate.py)
        raise
    except Exception as e:
        raise ProblemError(f"{path}: the model does not run with these constants: {type(e).__name__}: {e}") from None
    roots = root_constants(path) - set(fixed)
    current = dict(values)
    frozen: set = set()
    while _excess(sizes, limit) > 0:
        step = _shrink_step(path, current, roots, overrides, frozen, sizes, limit)
        if step is None:
            break
        current, overrides, sizes = step
    changed = {k: v for k, v in overrides.items() if k not in fixed and v != values.get(k)}
    kept = sorted({k if isinstance(k, str) else k[0] for k in frozen} - set(changed))
    return Shrink(changed, kept, _excess(sizes, limit) == 0, max(sizes, default=0))


def _shrink_step(path, values, roots, overrides, frozen, sizes, limit):
    """One halving that reduces the inputs' excess over `limit`: all candidates of the largest value
    together first, then one at a time; `frozen` learns the ones that must keep their value or do
    not size the inputs. Candidates: int root constants and tuple elements."""
    candidates = sorted(_candidates(values, roots, frozen), key=lambda c: (-c[1], c[0]))
    for value in sorted({v for _, v in candidates}, reverse=True):
        group = [key for key, v in candidates if v == value]
        trials = ([group] if len(group) > 1 else []) + [[key] for key in group]
        for keys in trials:
            trial = dict(overrides)
            for name, index in keys:
                trial[name] = _halved(trial.get(name, values[name]), index)
            try:
                trial_sizes = _probe(path, trial)
            except MemoryError:  # the file's memory limit: its record says so (cli/translate.py)
                raise
            except Exception:
                if len(keys) == 1:
                    frozen.add(keys[0])  # the model needs this value (kernel size, divisibility, heads ...)
                continue
            if _excess(trial_sizes, limit) < _excess(sizes, limit):
                return read_constants(path, trial), trial, trial_sizes
            if len(keys) == 1:
                frozen.add(keys[0])  # does not size the inputs
    return None


def _candidates(values, roots, frozen):
    for name in sorted(roots):
        v = values.get(name)
        if isinstance(v, bool):
            continue
        if isinstance(v, int) and v >= 2 and (name, None) not in frozen:
            yield (name, None), v
        elif isinstance(v, tuple):
            yield from (((name, i), e) for i, e in enumerate(v) if e >= 2 and (name, i) not in frozen)


def _halved(value, index):
    if index is None:
        return value // 2
    return value[:index] + (value[index] // 2,) + value[index + 1:]


def load_problem(path: str | Path, overrides: dict[str, int | float] | None = None,
                 max_elements: int | None = None, strict: bool = True, shrink_overrides: bool = False) -> Problem:
    """Load, override, optionally shrink, then build the model and its example inputs (CPU).

    When the inputs cannot be shrunk to `max_elements`, `strict` raises ProblemError; otherwise the
    problem is built at the smallest size found and `notes` says which constants could not shrink.
    Overridden constants keep their values unless `shrink_overrides`."""
    path = Path(path)
    overrides = dict(overrides or {})
    constants = read_constants(path, overrides)
    shrunk: dict = {}
    notes: list[str] = []
    if max_elements is not None:
        fixed, start = (set(), overrides) if shrink_overrides else (set(overrides), None)
        result = shrink_constants(path, constants, fixed, max_elements, start)
        shrunk = result.changed
        if not result.reached:
            kept = ", ".join(f"{constant_label(k)}={constants[k]}" for k in result.kept if k in constants) or "none"
            message = (f"cannot shrink the inputs to at most {max_elements} elements (largest input now "
                       f"{result.largest}); constants that could not shrink: {kept}")
            if strict:
                raise ProblemError(f"{path}: {message}")
            notes.append(message)
        constants = read_constants(path, {**overrides, **shrunk})
    module = load_module(path, {**overrides, **shrunk})
    torch.manual_seed(0)
    try:
        model, inputs = _instantiate(module)
    except MemoryError:  # the file's memory limit: its record says so (cli/translate.py)
        raise
    except Exception as e:
        raise ProblemError(f"{path}: building the model fails: {type(e).__name__}: {e}") from None
    notes += _deterministic(model)
    if shrunk:
        inputs, redrawn = _indices_in_range(path, model, inputs)
        notes += redrawn
    return Problem(path, constants, shrunk, model, inputs, notes)


def load_problem_meta(path: str | Path, overrides: dict[str, int | float] | None = None) -> Problem:
    """The problem at its own sizes (with `overrides`) on the `meta` device: shapes without storage,
    so that a 4096-wide matmul is traced for its program without allocating it."""
    path = Path(path)
    overrides = dict(overrides or {})
    module = load_module(path, overrides)
    try:
        model, inputs = _instantiate(module, "meta")
    except MemoryError:  # the file's memory limit: its record says so (cli/translate.py)
        raise
    except Exception as e:
        raise ProblemError(f"{path}: building the model fails: {type(e).__name__}: {e}") from None
    notes = _deterministic(model)
    return Problem(path, read_constants(path, overrides), {}, model, inputs, notes)


def _deterministic(model: torch.nn.Module) -> list[str]:
    """Dropout layers in eval mode (the identity): a random mask has no deterministic program."""
    dropouts = [name for name, m in model.named_modules() if isinstance(m, torch.nn.modules.dropout._DropoutNd)
                and m.training and m.p > 0]
    for name in dropouts:
        model.get_submodule(name).eval()
    return [f"dropout evaluated as the identity (eval mode): {', '.join(dropouts)}"] if dropouts else []


def _indices_in_range(path: Path, model, inputs: list) -> tuple[list, list[str]]:
    """Integer inputs drawn with the original sizes (class targets, gather indices) may point past a
    shrunk dimension: when the model rejects them, redraw them below ever smaller bounds (the
    original range halved again and again, as the dimensions were), seeded by the file's name."""
    if _runs(model, inputs):
        return inputs, []
    positions = [i for i, x in enumerate(inputs) if isinstance(x, torch.Tensor) and not x.is_floating_point()
                 and x.dtype != torch.bool and x.numel() and int(x.min()) >= 0]
    if not positions:
        return inputs, []
    top = max(int(inputs[i].max()) + 1 for i in positions)
    generator = torch.Generator().manual_seed(int.from_bytes(path.name.encode()[:8].ljust(8, b"\0"), "little"))
    bound = top
    while bound > 1:
        bound = (bound + 1) // 2
        trial = list(inputs)
        for i in positions:
            trial[i] = torch.randint(0, bound, tuple(inputs[i].shape), dtype=inputs[i].dtype, generator=generator)
        if _runs(model, trial):
            return trial, [f"integer inputs redrawn in [0, {bound}) to index the shrunk dimensions"]
    return inputs, []


def _runs(model, inputs) -> bool:
    try:
        with torch.no_grad():
            model(*inputs)
        return True
    except (IndexError, RuntimeError):
        return False


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
