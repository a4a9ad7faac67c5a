"""The states of one original program as chains of units, each distinct unit compiled once.

A state is cut into its units (`leir.lower.units`: its top-level nests, a nest together with the fill
before it or with an earlier nest whose output it updates). The states of one program share most of
their units: a step rewrites one or two nests. Structurally equal unit functions are one distinct
unit; the distinct units of a group are compiled in one module per build thread (TVM's compiler
releases the GIL), so a group pays LLVM's fixed cost per module a few times instead of once per state.

Used by the measure stage's nest-by-nest timing (`gpu_tasks.nest_timing`, deployed builds) and by the
verification of a program's steps together (`gpu_tasks.group_verify`, verification builds).
"""
from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field

import tvm
import tvm_ffi

from gpu_tasks.verification import describe_error
from leir.analysis import program_depth
from leir.lower.emit import plan_index_dtype
from leir.lower.expr import storage_dtype
from leir.lower.planner import PLoop, plan_program
from leir.lower.stack import call_with_stack_for
from leir.lower.units import TimingUnit, timing_units, unit_primfunc


@dataclass
class Distinct:
    """A group's distinct unit functions (all of one signature): structurally equal functions share
    one index. A unit whose plan items, tensors and index type were seen before is not emitted again
    (emitting costs more than planning the whole state)."""

    funcs: list = field(default_factory=list)
    by_hash: dict = field(default_factory=dict)
    by_unit: dict = field(default_factory=dict)

    def unit_index(self, plan, signature, unit: TimingUnit, index_dtype: str) -> int:
        key = _unit_key(plan, unit, index_dtype)
        index = self.by_unit.get(key)
        if index is None:
            index = self.by_unit[key] = self.add(unit_primfunc(plan, signature, unit, "unit"))
        return index

    def add(self, func) -> int:
        key = tvm_ffi.structural_hash(func)
        for index in self.by_hash.get(key, ()):
            if tvm_ffi.structural_equal(self.funcs[index], func):
                return index
        self.funcs.append(func)
        self.by_hash.setdefault(key, []).append(len(self.funcs) - 1)
        return len(self.funcs) - 1


@dataclass(frozen=True)
class Chain:
    """One state as its units in program order: (distinct index, unit), and the plan's tensor table."""

    links: tuple[tuple[int, TimingUnit], ...]
    tensors: dict


def chain_of(program, signature, distinct: Distinct) -> Chain:
    """`program` (llvm plan) cut into units, each added to `distinct`; raises what lowering raises."""
    return call_with_stack_for(program_depth(program), _chain_of, program, signature, distinct)


def _chain_of(program, signature, distinct: Distinct) -> Chain:
    plan = plan_program(program, signature, "llvm")
    ix = plan_index_dtype(plan)
    links = tuple((distinct.unit_index(plan, signature, unit, ix), unit) for unit in timing_units(plan, signature))
    return Chain(links, plan.tensors)


def _unit_key(plan, unit: TimingUnit, index_dtype: str) -> tuple:
    """What the unit's function is made of: its plan items (their repr, which tells the literal 1 from
    1.0 where the trees' equality does not), its arguments and locals, every tensor it names with
    its type and scope, and the subscripts' dtype."""
    names = unit.args + unit.local + tuple(n for item in unit.items for n in _loop_allocs(item))
    return (repr(unit.items), unit.args, unit.local, index_dtype,
            tuple((n, plan.tensors.get(n), plan.scopes.get(n)) for n in names))


def _loop_allocs(item) -> tuple[str, ...]:
    if not isinstance(item, PLoop):
        return ()
    return item.allocs + tuple(n for inner in item.body for n in _loop_allocs(inner))


@dataclass(frozen=True)
class UnitFunction:
    executable: object
    name: str
    call: object

    def __call__(self, *args):
        return self.call(*args)


def compile_units(funcs: list, target, pass_config: dict, threads: int = 1, names: list[str] | None = None) -> list:
    """Each unit's callable `UnitFunction` (or its build error's text, `names[u]: why`, by default
    `nest unit u: why`): the units in one module per build thread, compiled side by side; a module
    that fails is compiled again unit by unit, so that one bad unit fails alone."""
    threads = max(1, min(threads, len(funcs)))
    chunks = [list(range(k, len(funcs), threads)) for k in range(threads)]

    def compile_chunk(chunk: list[int]) -> dict[int, object]:
        try:
            return _compile_module(funcs, chunk, target, pass_config)
        except Exception:
            out = {}
            for u in chunk:
                try:
                    out.update(_compile_module(funcs, [u], target, pass_config))
                except Exception as e:
                    out[u] = f"{names[u] if names else f'nest unit {u}'}: {describe_error(e)}"
            return out

    functions: dict[int, object] = {}
    if threads == 1:
        for chunk in chunks:
            functions.update(compile_chunk(chunk))
    else:
        with ThreadPoolExecutor(max_workers=threads) as ex:
            for part in ex.map(compile_chunk, chunks):
                functions.update(part)
    return [functions[u] for u in range(len(funcs))]


def _compile_module(funcs: list, chunk: list[int], target, pass_config: dict) -> dict[int, object]:
    module = tvm.IRModule({f"u{u}": funcs[u].with_attr("global_symbol", f"u{u}") for u in chunk})
    with tvm.transform.PassContext(config=pass_config):
        executable = tvm.compile(module, target=target)
    # looking a function up JIT-compiles the module: part of the build, done on this thread
    return {u: UnitFunction(executable, f"u{u}", executable[f"u{u}"]) for u in chunk}


def intermediate(chain: Chain, name: str, device):
    """An uninitialised array for the intermediate `name` of `chain`'s state (as the whole program's
    function allocates it)."""
    info = chain.tensors[name]
    return tvm.runtime.empty(info.shape, storage_dtype(info.dtype), device)
