"""The layout rules of the project (docs/index.md, Layout), checked on the source with `ast`.

- a folder is one sub-system: no folder holds three or more modules whose names share a prefix word
  (`frontend_`, `lower_`, `cli_`, ...): those want a package;
- no import circle between project modules (imports inside functions count: they are dependencies);
- dependencies point one way: cli -> flows, evaluation, search -> strategies, gpu_tasks, workloads ->
  leir; only `gpu_tasks` and `leir.lower` import TVM; only `flows`, `cli` and `expectations` import
  the orchestration and table libraries;
- `flows` stays the pipeline and the lake: at most 22 modules (one per stage, 12 with
  follow_ups, the lake's storage and the helpers the stages share);
- `strategies` is a protocol (base, registry, catalog, cot, survey), the analyses the rules share
  (`strategies.analysis`) and the rules by level (`strategies.rules.<level>`): a rule module imports
  analyses and the protocol, never another rule module; no analysis imports a rule module; only the
  catalog imports the rule modules (all of them); no function or method of a rule module is longer
  than 50 lines.
"""
from __future__ import annotations

import ast
from collections import Counter, defaultdict
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
PACKAGES = ("leir", "workloads", "strategies", "gpu_tasks", "search", "evaluation", "flows", "cli", "expectations")
# package -> project packages it must never import
FORBIDDEN = {
    "leir": {"workloads", "strategies", "gpu_tasks", "search", "evaluation", "flows", "cli", "expectations"},
    "workloads": {"strategies", "gpu_tasks", "search", "evaluation", "flows", "cli", "expectations"},
    "strategies": {"gpu_tasks", "search", "evaluation", "flows", "cli", "workloads"},
    "gpu_tasks": {"strategies", "search", "evaluation", "flows", "cli", "workloads"},
    "search": {"flows", "cli"},
    "evaluation": {"search", "flows", "cli"},
    "flows": {"cli"},
    "expectations": {"flows", "cli", "search", "evaluation"},
}
ORCHESTRATION = ("prefect", "prefect_dask", "dvc", "duckdb", "polars", "great_expectations")


def module_files() -> dict[str, Path]:
    mods = {}
    for pkg in PACKAGES:
        for path in sorted((ROOT / pkg).rglob("*.py")):
            parts = path.relative_to(ROOT).with_suffix("").parts
            name = ".".join(parts[:-1] if parts[-1] == "__init__" else parts)
            mods[name] = path
    return mods


MODULES = module_files()


def imports_of(name: str, path: Path) -> tuple[set[str], set[str]]:
    """(project modules, top-level third-party names) that the module imports anywhere in its body."""
    project, external = set(), set()

    def add(target: str) -> None:
        if target.split(".")[0] in PACKAGES:
            # the deepest project module the dotted name denotes
            while target not in MODULES and "." in target:
                target = target.rsplit(".", 1)[0]
            if target in MODULES and target != name:
                project.add(target)
        else:
            external.add(target.split(".")[0])

    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.Import):
            for alias in node.names:
                add(alias.name)
        elif isinstance(node, ast.ImportFrom):
            assert node.level == 0, f"{path}: relative import; the project uses absolute imports"
            for alias in node.names:  # `from pkg import module` imports the module
                add(f"{node.module}.{alias.name}" if f"{node.module}.{alias.name}" in MODULES else node.module)
    return project, external


GRAPH = {name: imports_of(name, path) for name, path in MODULES.items()}


def test_the_packages_exist_and_hold_their_modules():
    for pkg in PACKAGES + ("leir.frontend", "leir.frontend.ops", "leir.lower"):
        assert pkg in MODULES, f"{pkg} is not a package"
    assert "search.drivers" in MODULES and "search.runner" in MODULES
    assert not any(n.startswith("flows.cli") or n.startswith("flows.eval") for n in MODULES)


def test_no_folder_has_three_modules_sharing_a_prefix_word():
    by_prefix: Counter = Counter()
    for path in MODULES.values():
        stem = path.stem
        if stem != "__init__" and "_" in stem.strip("_"):
            by_prefix[(path.parent.relative_to(ROOT).as_posix(), stem.strip("_").split("_")[0])] += 1
    crowded = {f"{folder}/{prefix}_*": n for (folder, prefix), n in by_prefix.items() if n >= 3}
    assert not crowded, f"modules sharing a prefix want a package: {crowded}"


def test_no_import_circles():
    # Tarjan's strongly connected components over the project's import graph
    index, low, stack, on_stack, circles = {}, {}, [], set(), []
    counter = [0]

    def visit(v: str) -> None:
        index[v] = low[v] = counter[0]
        counter[0] += 1
        stack.append(v)
        on_stack.add(v)
        for w in sorted(GRAPH[v][0]):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                component.append(w)
                if w == v:
                    break
            if len(component) > 1:
                circles.append(sorted(component))

    for v in sorted(GRAPH):
        if v not in index:
            visit(v)
    assert not circles, f"modules that import each other: {circles}"


@pytest.mark.parametrize("pkg", sorted(FORBIDDEN))
def test_dependencies_point_one_way(pkg):
    wrong = sorted((name, target) for name, (project, _) in GRAPH.items() if name.split(".")[0] == pkg
                   for target in project if target.split(".")[0] in FORBIDDEN[pkg])
    assert not wrong, f"{pkg} imports what it must not: {wrong}"


def test_nothing_imports_the_command_line():
    users = sorted(name for name, (project, _) in GRAPH.items()
                   if not name.startswith("cli") and any(t.startswith("cli") for t in project))
    assert not users, users


def test_only_gpu_tasks_and_the_lowering_import_tvm():
    users = sorted(name for name, (_, external) in GRAPH.items() if "tvm" in external
                   and not (name.startswith("gpu_tasks") or name.startswith("leir.lower")))
    assert not users, f"TVM imported outside gpu_tasks and leir.lower: {users}"


def test_only_the_pipeline_side_imports_orchestration_and_table_libraries():
    users = defaultdict(list)
    for name, (_, external) in GRAPH.items():
        if name.split(".")[0] not in ("flows", "cli", "expectations"):
            for lib in ORCHESTRATION:
                if lib in external:
                    users[lib].append(name)
    assert not users, dict(users)


def test_flows_is_the_pipeline_and_the_lake_only():
    flows = [n for n in MODULES if n == "flows" or n.startswith("flows.")]
    # 29: the schema of params.yaml (flows.params_schema) and the lake's writers (flows.lake_guard) are
    # pipeline and lake concerns of their own, each imported by the CLI without Prefect; the release
    # stage is five (the stage, its card template's filler, Croissant, version rules, the measured
    # configs' schemas) where it was one module of 800 lines; the lake's domain queries are apart from
    # its storage (flows.lake_queries); 30: the Dask cluster a build spreads over (flows.cluster: the runner, a
    # cluster of named worker machines, what a flow asks of its workers)
    assert len(flows) <= 30, f"flows has {len(flows)} modules: {flows}"


def test_tests_mirror_the_packages():
    tests = {p.parent.relative_to(ROOT / "tests").as_posix() for p in (ROOT / "tests").rglob("test_*.py")}
    for pkg in ("leir", "leir/frontend", "leir/lower", "strategies", "gpu_tasks", "search", "evaluation", "flows",
                "cli", "workloads"):
        assert pkg in tests, f"tests/{pkg}/ has no tests"


# --- strategies: protocol, analyses, rules ---------------------------------------------------

RULES = sorted(n for n, p in MODULES.items() if n.startswith("strategies.rules.") and p.stem != "__init__")
ANALYSES = sorted(n for n, p in MODULES.items() if n.startswith("strategies.analysis.") and p.stem != "__init__")
MAX_RULE_FUNCTION_LINES = 50


def test_strategies_are_a_protocol_analyses_and_rules_by_level():
    top = sorted(n for n in MODULES if n.startswith("strategies.") and n.count(".") == 1)
    assert top == ["strategies.analysis", "strategies.base", "strategies.catalog", "strategies.cot",
                   "strategies.registry", "strategies.rules", "strategies.survey"], top
    levels = sorted({n.split(".")[2] for n in RULES})
    assert levels == ["graph", "mathematical", "memory", "operator"], levels
    assert all(n.count(".") == 3 for n in RULES), "a rule module sits in its level's package"
    assert len(RULES) >= 4 and len(ANALYSES) >= 4


def test_no_rule_module_imports_another_rule_module():
    wrong = sorted((name, target) for name in RULES for target in GRAPH[name][0] if target.startswith("strategies.rules"))
    assert not wrong, f"rule modules import each other (move what they share to strategies.analysis): {wrong}"


def test_analyses_and_the_protocol_import_no_rule_module():
    wrong = sorted((name, target) for name, (project, _) in GRAPH.items()
                   if name.startswith("strategies") and not name.startswith("strategies.rules")
                   and name != "strategies.catalog" for target in project if target.startswith("strategies.rules"))
    assert not wrong, wrong
    # outside strategies, no one reaches into the rules either (they register; use the registry)
    outside = sorted((name, target) for name, (project, _) in GRAPH.items() if not name.startswith("strategies")
                     for target in project if target.startswith("strategies.rules"))
    assert not outside, outside


def test_the_catalog_imports_every_rule_module():
    from strategies.catalog import RULE_MODULES

    assert sorted(RULE_MODULES) == RULES


def _long_functions(path: Path) -> list[str]:
    out = []
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
            length = node.end_lineno - node.lineno + 1
            if length > MAX_RULE_FUNCTION_LINES:
                out.append(f"{path.relative_to(ROOT)}:{node.lineno} {node.name} ({length} lines)")
    return out


def test_no_function_in_a_rule_module_is_longer_than_50_lines():
    long = [f for name in RULES for f in _long_functions(MODULES[name])]
    assert not long, long


def test_no_table_keyed_by_strategy_name_outside_the_rules():
    """What a strategy knows (its sign, what it enables, its prior in the search) lives in its rule
    class; a dict literal keyed by strategy names elsewhere restates it (the registry's published
    order aside)."""
    from strategies.registry import ALL_NAMES

    names = set(ALL_NAMES)
    tables = []
    for name, path in MODULES.items():
        if name.startswith("strategies.rules") or name == "strategies.registry":
            continue
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Dict):
                keys = [k.value for k in node.keys if isinstance(k, ast.Constant) and isinstance(k.value, str)]
                if sum(k in names for k in keys) >= 2:
                    tables.append(f"{name}:{node.lineno}")
    assert not tables, tables


MAX_FLOW_PARAMETERS = 6


def test_no_function_in_flows_takes_more_than_six_parameters():
    """What several values describe together is one dataclass (ReleaseInputs, MeasureRun, Timed,
    ReleasedSteps, Origin), not a long positional list a caller can misorder."""
    long = []
    for name, path in MODULES.items():
        if not name.startswith("flows"):
            continue
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                a = node.args
                names = [x.arg for x in (*a.posonlyargs, *a.args, *a.kwonlyargs)]
                count = len(names) - (names[:1] in (["self"], ["cls"])) + bool(a.vararg) + bool(a.kwarg)
                if count > MAX_FLOW_PARAMETERS:
                    long.append(f"{name}.{node.name}: {count}")
    assert not long, long


def _methods(path: Path) -> dict[str, ast.FunctionDef]:
    """Every method of every class of a module, as `Class.method`."""
    out = {}
    for node in ast.parse(path.read_text(encoding="utf-8")).body:
        if isinstance(node, ast.ClassDef):
            for item in node.body:
                if isinstance(item, ast.FunctionDef):
                    out[f"{node.name}.{item.name}"] = item
    return out


def _refuses(fn: ast.FunctionDef) -> bool:
    """The function raises `Illegal` or calls `refuse` (a legality decision)."""
    for node in ast.walk(fn):
        if isinstance(node, ast.Raise) and node.exc is not None and "Illegal" in ast.unparse(node.exc):
            return True
        if isinstance(node, ast.Call) and ast.unparse(node.func) in ("refuse", "refuse_unhelpful"):
            return True
    return False


def test_every_strategy_checks_before_it_builds():
    """Each registered strategy states its legality in `check` (reasons, never exceptions) and its
    surgery in `build`; `rewrite` is the base class's check-build-gate and no rule overrides it; no
    rule module raises `Illegal` or calls `refuse` (the base class turns a reason into the refusal)."""
    from strategies.base import Strategy
    from strategies.registry import registered

    for strategy in registered():
        cls = type(strategy)
        assert cls.rewrite is Strategy.rewrite, f"{cls.__name__} overrides rewrite"
        assert cls.check is not Strategy.check, f"{cls.__name__} states no check"
        assert cls.build is not Strategy.build, f"{cls.__name__} builds nothing"
    refusing = sorted(f"{name}:{fn.lineno} {qual}" for name in RULES
                      for qual, fn in _methods(MODULES[name]).items() if _refuses(fn))
    assert not refusing, refusing


def test_a_process_that_sends_verification_work_imports_neither_tvm_nor_torch():
    """The verify stage's tasks (in the flow's process, or on a Dask worker) send their pairs to the
    pool's workers, which import TVM once in their fork server; the sender itself needs neither TVM
    nor PyTorch (some 5 s and hundreds of MB per process)."""
    import subprocess
    import sys

    code = ("import sys, flows.verify, gpu_tasks.verify, gpu_tasks.pair_groups; "
            "print(sorted(m for m in ('tvm', 'torch') if m in sys.modules))")
    out = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr[-2000:]
    assert out.stdout.strip() == "[]"
