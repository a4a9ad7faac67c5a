"""The schema of params.yaml: every key typed and ranged, unknown keys refused, names checked against
the catalogues (workloads, families, strategies, levels, dtypes), pinned shapes checked against their
workload and sized on the meta device before anything is allocated.

`check_params(raw, path)` returns the problems, one line each, as `FILE:LINE:COL: KEY.PATH: what is
wrong` (the position of the key in the YAML text), with the nearest known name for an unknown key or
name. The CLI runs it before any stage writes the lake, so a typo never rewrites the lake.
"""
from __future__ import annotations

import difflib
from pathlib import Path
from typing import Annotated, Any, Literal

import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator, model_validator

DTYPES = ("float32", "float16", "bfloat16", "float64")
Dtype = Literal["float32", "float16", "bfloat16", "float64"]
Share = Annotated[float, Field(ge=0, le=1)]
Positive = Annotated[float, Field(gt=0)]
Count = Annotated[int, Field(ge=1)]
NonNegative = Annotated[int, Field(ge=0)]


class Strict(BaseModel):
    model_config = ConfigDict(extra="forbid")


def _nearest(name: str, known) -> str:
    close = difflib.get_close_matches(str(name), list(known), n=1, cutoff=0.5)
    return f"; did you mean {close[0]!r}?" if close else ""


def _known(kind: str, names, known) -> None:
    unknown = [n for n in names if n not in known]
    if unknown:
        raise ValueError(f"unknown {kind} {unknown[0]!r}{_nearest(unknown[0], known)}")


def _workload_names() -> tuple[str, ...]:
    from workloads.registry import all_workloads

    return tuple(w.name for w in all_workloads())


def _family_names() -> tuple[str, ...]:
    from workloads.registry import all_workloads

    return tuple(sorted({w.family for w in all_workloads()}))


def _strategy_names() -> tuple[str, ...]:
    from strategies.registry import ALL_NAMES

    return ALL_NAMES


def _levels() -> tuple[str, ...]:
    from strategies.registry import STRATEGY_NAMES

    return tuple(STRATEGY_NAMES)


class Tolerance(Strict):
    max_abs: Annotated[float, Field(gt=0)]
    max_rel: Annotated[float, Field(gt=0)]
    rel_l2: Annotated[float, Field(gt=0)]


class Verify(Strict):
    target: Literal["llvm", "cuda"]
    draws: Count
    workers: Count
    timeout_s: Positive
    tolerance: dict[Dtype, Tolerance]
    pytorch_error_factor: Annotated[float, Field(ge=1)] = 2.0


class Filter(Strict):
    cap_per_strategy: Count
    cap_per_level: dict[str, NonNegative]
    easy_strategies: list[str] = []
    easy_weight: Annotated[float, Field(gt=0, le=1)] = 1.0
    max_strategy_share: Annotated[float, Field(gt=0, le=1)]
    multi_answer_k: Annotated[int, Field(ge=2)]
    multi_answer_fraction: Share
    test_fraction: Annotated[float, Field(gt=0, lt=1)]

    @field_validator("cap_per_level")
    @classmethod
    def _levels_known(cls, v):
        _known("level", list(v or {}), _levels())
        return v

    @field_validator("easy_strategies")
    @classmethod
    def _strategies_known(cls, v):
        _known("strategy", v or [], _strategy_names())
        return v


class FollowUps(Strict):
    per_strategy: NonNegative
    per_step: NonNegative


class Measure(Strict):
    min_rounds: Count
    max_rounds: Count
    target_spread: Positive
    min_repeat_ms: Positive
    max_measure_s: Positive
    timeout_s: Positive
    unit: Literal["nest", "state"]
    whole_below_us: Annotated[float, Field(ge=0)]
    whole_changed_below_us: Annotated[float, Field(ge=0)]
    agreement_states: NonNegative
    llvm_opt_level: Annotated[int, Field(ge=0, le=3)] | None = None

    @model_validator(mode="after")
    def _rounds(self):
        if self.min_rounds is not None and self.max_rounds is not None and self.max_rounds < self.min_rounds:
            raise ValueError(f"max_rounds ({self.max_rounds}) is below min_rounds ({self.min_rounds})")
        return self


class Creator(Strict):
    name: str
    url: str | None = None


class Release(Strict):
    version: str
    date: str | None = None
    version_policy: Literal["patch", "minor", "major"] = "patch"
    min_samples_per_strategy: NonNegative = 100
    license: str
    remote: str
    creator: Creator | None = None
    url: str | None = None
    cite_as: str | None = None
    preference_pairs_per_prompt: Count | None = None

    @field_validator("version")
    @classmethod
    def _semver(cls, v):
        from flows.lake_guard import SEMVER

        if not SEMVER.match(v):
            raise ValueError(f"version must be MAJOR.MINOR.PATCH (semantic versioning), got {v!r}")
        return v

    @field_validator("date")
    @classmethod
    def _iso_date(cls, v):
        import datetime

        if v is not None:
            try:
                datetime.date.fromisoformat(v)
            except ValueError:
                raise ValueError(f"{v!r} is not a date YYYY-MM-DD") from None
        return v


Driver = Literal["chain", "greedy", "beam", "bfs", "dfs", "mcts"]
ProgramSource = Literal["pinned", "by_family"]
CompileMode = Literal["default", "reduce-overhead", "max-autotune", "max-autotune-no-cudagraphs"]


class Search(Strict):
    drivers: Annotated[list[Driver], Field(min_length=1)]
    policy: Literal["library", "random", "llm"]
    cost_model: bool
    programs: ProgramSource | Annotated[list[ProgramSource], Field(min_length=1)]
    families: Literal["all"] | list[str]
    programs_per_family: Count
    budget: Count
    wall_s: Positive
    depth: Count
    branching: Count
    width: Count
    ucb_c: Annotated[float, Field(ge=0)]
    iterations: Count
    widen: Count
    time_macro_steps: bool
    seed: int
    repeats: Count
    min_repeat_ms: Positive
    reference_programs: NonNegative
    metaschedule_trials: NonNegative
    metaschedule_relax: bool
    torch_compile_modes: list[CompileMode]

    @field_validator("families")
    @classmethod
    def _families_known(cls, v):
        if v not in (None, "all"):
            _known("family", v, _family_names())
        return v


class Pinned(Strict):
    workload: str
    params: dict[str, Annotated[int, Field(ge=1)]]

    @model_validator(mode="after")
    def _fits(self):
        problem = pinned_problem(self.workload, self.params)
        if problem:
            raise ValueError(problem)
        return self


def pinned_problem(workload: str, params: dict[str, int]) -> str | None:
    """Why a pinned instance cannot be generated (None when it can): an unknown workload, parameter
    names that are not the workload's, a value outside its choices, a broken constraint, or a size
    beyond what the verifier builds (gpu_tasks.guard: statement executions and bytes of tensors),
    estimated on the meta device before anything is allocated."""
    from gpu_tasks.guard import DEFAULT_LIMITS
    from workloads.registry import get_workload
    from workloads.shapes import estimate_bytes, estimate_work

    names = _workload_names()
    if workload not in names:
        return f"unknown workload {workload!r}{_nearest(workload, names)}"
    w = get_workload(workload)
    wanted = [p.name for p in w.params]
    if sorted(params) != sorted(wanted):
        missing, extra = [n for n in wanted if n not in params], [n for n in params if n not in wanted]
        return (f"workload {workload!r} takes the parameters {', '.join(wanted)}"
                + (f"; missing {', '.join(missing)}" if missing else "")
                + (f"; unknown {', '.join(extra)}" if extra else ""))
    for p in w.params:
        if p.choices and params[p.name] not in p.choices:
            return f"{p.name} must be one of {', '.join(map(str, p.choices))}, got {params[p.name]}"
    if not w.constraint(dict(params)):
        return f"the sizes {params} break the constraint of workload {workload!r} ({w.description or 'see its code'})"
    try:
        work, nbytes = estimate_work(w, params), estimate_bytes(w, params)
    except Exception as e:  # noqa: BLE001 - the module refuses these sizes: say how
        return f"workload {workload!r} cannot be built at {params}: {type(e).__name__}: {e}"
    if nbytes > DEFAULT_LIMITS.max_buffer_bytes:
        return (f"{nbytes:,} bytes of tensors (estimated, float32) exceed the limit of "
                f"{DEFAULT_LIMITS.max_buffer_bytes:,}; pick smaller sizes")
    if work > DEFAULT_LIMITS.max_iterations:
        return (f"{work:,} units of work (estimated) exceed the limit of {DEFAULT_LIMITS.max_iterations:,} "
                "statement executions; pick smaller sizes")
    return None


class Profile(Strict):
    workload_profile: Literal["tiny", "default", "release"]
    workloads: Annotated[list[str], Field(min_length=1)] | None = None
    families: Literal["all"] | Annotated[list[str], Field(min_length=1)] | None = None
    max_workloads_per_family: Count | None = None
    pinned: list[Pinned] = []
    instances_per_workload: Count
    gpu_share: Share = 0.0
    dtypes: Annotated[list[Dtype], Field(min_length=1)]
    extra_dtypes: dict[Dtype, list[str]] = {}
    max_variants_per_site: Count
    max_steps_per_program_strategy: Count
    inline_depth: NonNegative
    inline_branches: Count | None = None
    shard_workers: Count = 1
    leir_extensions: list[Literal["fast_exp", "fast_log", "fast_erf"]] = []
    min_parallel_work: NonNegative = 8192  # 0: no bound
    token_states_per_family: NonNegative = 20
    steps_per_strategy: Count | None = None
    # Overrides of the sections of the same name: checked merged with them (check_params).
    search: dict[str, Any] | None = None
    filter: dict[str, Any] | None = None
    measure: dict[str, Any] | None = None
    follow_ups: dict[str, Any] | None = None

    @field_validator("workloads")
    @classmethod
    def _workloads_known(cls, v):
        if v is not None:
            _known("workload", v, _workload_names())
        return v

    @field_validator("families")
    @classmethod
    def _families_known(cls, v):
        if v not in (None, "all"):
            _known("family", v, _family_names())
        return v

    @field_validator("extra_dtypes")
    @classmethod
    def _extra_known(cls, v):
        for names in v.values():
            _known("workload", names, _workload_names())
        return v

    @model_validator(mode="after")
    def _selects(self):
        if self.workloads is None and self.families is None:
            raise ValueError("a profile selects `workloads` (a list) or `families` (a list or all)")
        return self


class Params(Strict):
    seed: int
    profile: str = "default"
    profiles: Annotated[dict[str, Profile], Field(min_length=1)]
    verify: Verify
    filter: Filter
    follow_ups: FollowUps
    measure: Measure
    release: Release
    search: Search

    @model_validator(mode="after")
    def _tolerances(self):
        for name, prof in self.profiles.items():
            missing = [d for d in prof.dtypes if d not in self.verify.tolerance]
            if missing:
                raise ValueError(f"profile {name!r} builds {', '.join(missing)} but verify.tolerance has no entry "
                                 "for it")
        return self


SECTIONS = {"search": Search, "filter": Filter, "measure": Measure, "follow_ups": FollowUps}


def check_params(raw: Any, path: Path | str = "params.yaml", text: str | None = None) -> list[str]:
    """The problems of params.yaml's contents `raw` (empty when it is valid), one line each:
    `FILE:LINE:COL: key.path: message` (the position where `text`, the file's YAML, holds the key).
    A profile's `search`, `filter`, `measure` and `follow_ups` are checked merged into their sections."""
    if not isinstance(raw, dict):
        return [f"{path}: expected a mapping of sections (seed, profiles, verify, ...), got {type(raw).__name__}"]
    marks = _marks(text) if text is not None else {}
    errors = []
    try:
        Params.model_validate(raw)
    except ValidationError as e:
        errors += [(tuple(str(p) for p in err["loc"] if not _is_union_tag(p)), err) for err in e.errors()]
    profiles = raw.get("profiles") if isinstance(raw.get("profiles"), dict) else {}
    name = raw.get("profile", "default")
    if profiles and name not in profiles:
        errors.append((("profile",), {"type": "value_error", "msg": f"no profile {name!r} among "
                                      f"{', '.join(map(str, profiles))}{_nearest(name, profiles)}"}))
    for prof_name, prof in profiles.items():
        for section, model in SECTIONS.items():
            override, base = (prof or {}).get(section) if isinstance(prof, dict) else None, raw.get(section)
            if not isinstance(override, dict) or not isinstance(base, dict):
                continue
            try:
                model.model_validate({**base, **override})
            except ValidationError as e:
                for err in e.errors():
                    loc = tuple(str(p) for p in err["loc"] if not _is_union_tag(p))
                    if loc and loc[0] in override:  # a base key's error is reported once, at the base
                        errors.append((("profiles", str(prof_name), section, *loc), err))
                    elif not loc:
                        errors.append((("profiles", str(prof_name), section), err))
    return [_line(path, loc, err, marks) for loc, err in errors]


def _line(path, loc: tuple[str, ...], err: dict, marks: dict) -> str:
    key = ".".join(loc) or "(top level)"
    message = err["msg"].removeprefix("Value error, ")
    if err["type"] == "extra_forbidden":
        message = f"unknown key{_nearest(loc[-1], _siblings(loc))}"
    elif err["type"] == "missing":
        message = "missing key"
    where = _position(marks, loc)
    return f"{path}:{where}: {key}: {message}" if where else f"{path}: {key}: {message}"


def _is_union_tag(part) -> bool:
    """The branch names pydantic puts into the location of a union's error (`literal['all']`,
    `list[str]`, `function-after[...]`)."""
    return isinstance(part, str) and ("[" in part or part in {"str", "int", "float", "bool"})


def _siblings(loc: tuple[str, ...]) -> list[str]:
    """The known keys beside an unknown one: the fields of the model whose input held it."""
    models = {**SECTIONS, "verify": Verify, "release": Release, "tolerance": Tolerance, "creator": Creator}
    if len(loc) == 1:
        return list(Params.model_fields)
    if loc[0] == "profiles" and len(loc) == 3:
        return list(Profile.model_fields)
    if loc[0] == "profiles" and len(loc) >= 4 and loc[2] == "pinned":
        return list(Pinned.model_fields)
    parent = "tolerance" if loc[0] == "verify" and len(loc) == 4 else loc[-2]
    model = models.get(parent)
    return list(model.model_fields) if model else []


def _marks(text: str) -> dict[tuple[str, ...], tuple[int, int]]:
    """(line, column) of every key and list item of the YAML text, by its path."""
    try:
        root = yaml.compose(text)
    except yaml.YAMLError:
        return {}
    marks: dict[tuple[str, ...], tuple[int, int]] = {}

    def walk(node, loc):
        if isinstance(node, yaml.MappingNode):
            for k, v in node.value:
                here = (*loc, str(k.value))
                marks[here] = (k.start_mark.line + 1, k.start_mark.column + 1)
                walk(v, here)
        elif isinstance(node, yaml.SequenceNode):
            for i, item in enumerate(node.value):
                here = (*loc, str(i))
                marks[here] = (item.start_mark.line + 1, item.start_mark.column + 1)
                walk(item, here)

    walk(root, ())
    return marks


def _position(marks: dict, loc: tuple[str, ...]) -> str:
    """The nearest position of `loc` the file has (a missing key: its section's)."""
    for n in range(len(loc), 0, -1):
        if loc[:n] in marks:
            line, col = marks[loc[:n]]
            return f"{line}:{col}"
    return ""
