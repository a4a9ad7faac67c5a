"""Build cache: each distinct lowered function is compiled once per process and target.

Verifying N transformations of one program builds the original once, not N times. Entries are keyed
by (structural hash of the lowered PrimFunc, target): two programs that differ only in names lower to
the same function and share an executable; a structural-equality check on every hash hit guards
against hash collisions. A second, cheaper key (canonical LEIR text, signature, target, lowering
form) skips even the lowering when the very same program comes back. Least recently used entries are dropped past
`capacity`, so that a long-lived worker does not grow without bound.
"""
from __future__ import annotations

from collections import OrderedDict
from dataclasses import dataclass

import tvm
import tvm_ffi

from leir.analysis import program_depth
from leir.ast import Program
from leir.lower import lower_to_primfunc, make_target
from leir.lower.stack import call_with_stack_for
from leir.printer import format_program
from leir.signature import Signature

# Verification builds are made for build speed, timing builds as a program would be deployed:
# - TVM's argument checks (ndim, dtype, shape of every tensor passed in) roughly double the code that
#   LLVM compiles and JITs; the runner always passes tensors made from the signature, so verification
#   leaves them out;
# - LLVM's IR optimisation level 0 halves the build time again. It changes no result: LLVM does not
#   reassociate floating point without fast-math flags, and FMA contraction happens in the JIT's code
#   generation, which is the same at every level (outputs of the example programs at levels 0 and 3
#   are bitwise identical, float32 and float64).
VERIFY_PASS_CONFIG = {"tirx.disable_assert": True}
VERIFY_LLVM_OPT_LEVEL = 0
# Timing builds leave the argument checks out too (measure stage, the search's pairs and
# MetaSchedule's same-session comparison alike): they run once per call, outside the loops, a constant
# of well under a microsecond that no state's time depends on, while they add a fifth to a state's
# build. The states are always called with tensors made from their signature.
TIMING_PASS_CONFIG = {"tirx.disable_assert": True}


@dataclass(frozen=True, slots=True)
class Built:
    """A compiled program: `function(*tensors)` in signature order; `executable.mod` for timing."""

    executable: object
    function: object
    target: str


@dataclass(slots=True)
class CacheStats:
    builds: int = 0           # compilations
    text_hits: int = 0        # the same program text came back
    structural_hits: int = 0  # a different text lowered to an identical function

    @property
    def hits(self) -> int:
        return self.text_hits + self.structural_hits

    def to_json(self) -> dict:
        return {"builds": self.builds, "hits": self.hits, "text_hits": self.text_hits,
                "structural_hits": self.structural_hits}


class BuildCache:
    """`pass_config` goes to TVM's PassContext; `llvm_opt_level` (None: TVM's default) to llvm targets."""

    def __init__(self, capacity: int = 256, pass_config: dict | None = None, llvm_opt_level: int | None = None):
        self.capacity = capacity
        self.pass_config = dict(pass_config or {})
        self.llvm_opt_level = llvm_opt_level
        self.stats = CacheStats()
        self._by_text: OrderedDict[tuple, Built] = OrderedDict()
        self._by_hash: OrderedDict[tuple, tuple[object, Built]] = OrderedDict()

    def build(self, program: Program, signature: Signature, target_kind: str = "llvm",
              arch: str = "sm_90", text: str | None = None, form: str = "plain") -> Built:
        """The executable of `program` (whose LEIR text is `text` when the caller has it at hand) in
        the lowering `form` (plain or tensorir); raises what lowering or compilation raises."""
        text_key = (text or format_program(program), signature.dumps(), target_kind, arch, form)
        built = _lookup(self._by_text, text_key)
        if built is not None:
            self.stats.text_hits += 1
            return built
        # TVM hashes, compares and compiles the function with recursive C++ passes: a deep expression
        # gets a thread with a stack for its depth (leir.lower.stack), here as in leir.lower's own API.
        return call_with_stack_for(program_depth(program), self._lower_and_compile, program, signature,
                                   target_kind, arch, form, text_key)

    def _lower_and_compile(self, program: Program, signature: Signature, target_kind: str, arch: str, form: str,
                           text_key: tuple) -> Built:
        func = lower_to_primfunc(program, signature, target_kind=target_kind, form=form)
        target = self.target(target_kind, arch)
        hash_key = (tvm_ffi.structural_hash(func), str(target))
        entry = _lookup(self._by_hash, hash_key)
        if entry is not None and tvm_ffi.structural_equal(entry[0], func):
            self.stats.structural_hits += 1
            built = entry[1]
        else:
            built = self._compile(func, target)
            self.stats.builds += 1
            _store(self._by_hash, hash_key, (func, built), self.capacity)
        _store(self._by_text, text_key, built, self.capacity)
        return built

    def target(self, kind: str, arch: str):
        target = make_target(kind, arch)
        if kind != "llvm" or self.llvm_opt_level is None:
            return target
        return tvm.target.Target({**target.export(), "opt-level": self.llvm_opt_level})

    def _compile(self, func, target) -> Built:
        with tvm.transform.PassContext(config=self.pass_config):
            executable = tvm.compile(tvm.IRModule({"main": func}), target=target)
        # Looking the function up JIT-compiles it: part of the build, so it is cached too.
        return Built(executable, executable["main"], str(target))

    def clear(self) -> None:
        self._by_text.clear()
        self._by_hash.clear()
        self.stats = CacheStats()


def _lookup(entries: OrderedDict, key):
    value = entries.get(key)
    if value is not None:
        entries.move_to_end(key)
    return value


def _store(entries: OrderedDict, key, value, capacity: int) -> None:
    entries[key] = value
    entries.move_to_end(key)
    while len(entries) > capacity:
        entries.popitem(last=False)


# One cache of each kind per process: each worker keeps its own (executables cannot cross processes).
BUILD_CACHE = BuildCache(pass_config=VERIFY_PASS_CONFIG, llvm_opt_level=VERIFY_LLVM_OPT_LEVEL)
TIMING_CACHE = BuildCache(capacity=32, pass_config=TIMING_PASS_CONFIG)


def cache_stats() -> dict:
    """Statistics of this process's verification build cache."""
    return BUILD_CACHE.stats.to_json()
