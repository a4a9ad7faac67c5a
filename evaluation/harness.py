"""The evaluation harness: score a model's responses to single-step optimisation prompts.

Input: predictions `{"id", "signature", "original_IR", "response"}` (optionally `"prompt"`, whose
wording says how many answers a multi-answer prompt asks for, or `"k"` directly). Output per line:

- `format_pass`: the response parses (`evaluation.response`: lenient layout, strict content);
- `different_pass`: the transformed IR is not alpha-equivalent to the original (`alpha_hash`);
- `build_pass`, `execute_pass`: it lowered and built / ran on every draw (`gpu_tasks.verify`);
- `equal_pass`: bitwise equal to the original's output on every draw; `close_pass`: exact or close;
- `speedup_pass`: different, close, and faster than the original by more than `speedup_margin`
  under the timing protocol (`gpu_tasks.timing`); `null` when timing is off (`--no-time`);
- `strategy_label_pass`: the answer verifies (exact or close), the named strategy is one of the 43,
  and the answer either is alpha-equivalent to applying it to the original or shows its structural
  effect in another spelling (`evaluation.label`, each rule's `recognizes`); `strategy_label_exact_pass`:
  the alpha-equivalent match alone (enumeration capped), whether or not the answer verifies;
- `require_num_pass`: the number of distinct (alpha-hash) answers that are different and close is
  the number asked for: `k`, or what the prompt's wording asks ("Propose K different" exactly,
  the published "at least K different" at least); a single-answer prompt asks for one; a list
  answered without prompt or `k` is taken to ask for as many as it holds (every item must count);
- `status` (`exact`, `close`, a verification failure, `rejected` by a guard, `format_error`,
  `input_error` for a malformed line, `missing` for a test sample without prediction) and `error`.

Multi-answer responses are scored per item; a line passes an item check when every item passes it
(`format_pass` and `require_num_pass` are line-level). The line's status is that of its first item
that is neither exact nor close, otherwise `close` if any item is close, else `exact`.

Every verification (and every label check) runs in the worker pool when one is given, so a build
that crashes or hangs costs one answer, never the run. Guards run before anything is built: response
size, code in the answer, JSON and IR nesting depth, IR size, and the iteration / buffer limits.
"""
from __future__ import annotations

import hashlib
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field

from evaluation.label import DEFAULT_BUDGET_S, DEFAULT_CAP, LabelRequest, LabelResult, label_job
from evaluation.response import (
    ParsedResponse,
    Requested,
    ResponseError,
    ir_text_problem,
    parse_response,
    requested_answers,
)
from gpu_tasks.guard import DEFAULT_LIMITS, Limits, limit_violation
from gpu_tasks.verification import Verification
from leir.canon import alpha_hash
from leir.errors import LeirError
from leir.parse import parse_program
from leir.printer import format_program
from leir.signature import Signature

CHECKS = ("format_pass", "different_pass", "build_pass", "execute_pass", "equal_pass", "close_pass",
          "speedup_pass", "strategy_label_pass", "strategy_label_exact_pass", "require_num_pass")
ITEM_CHECKS = CHECKS[1:9]
Progress = Callable[[str, int, int], None]  # (phase, done, total)


@dataclass(frozen=True)
class Prediction:
    """One line to score. `error` marks a line that cannot be scored (status `error_status`)."""

    id: object
    signature: object  # the JSON object (or text) of a signature
    original_ir: str
    response: str
    prompt: str | None = None
    k: int | None = None
    error: str = ""
    error_status: str = "input_error"


@dataclass(frozen=True)
class EvalOptions:
    target: str = "llvm"
    arch: str = "sm_90"
    draws: int = 3
    seed: int = 0
    time: bool = True
    speedup_margin: float = 0.05
    repeats: int = 7
    min_repeat_ms: int = 50
    label_cap: int = DEFAULT_CAP
    label_budget_s: float = DEFAULT_BUDGET_S
    bare_json: bool = False  # accept a response that is only the JSON (published labels)
    strategy_keys: tuple[str, ...] = ("applied_strategy",)
    tolerances: Mapping | None = None
    limits: Limits = DEFAULT_LIMITS


@dataclass
class ItemResult:
    """One answer of a response, with what was found out about it."""

    idx: int | None
    strategy: str
    ir: str
    status: str = ""
    error: str = ""
    alpha: str = ""
    different: bool = False
    verification: Verification | None = None
    label: LabelResult | None = None
    speedup: float | None = None
    faster: bool | None = None

    @property
    def parsed(self) -> bool:
        return bool(self.alpha)

    @property
    def correct(self) -> bool:
        return self.status in ("exact", "close")

    def checks(self) -> dict[str, bool | None]:
        v = self.verification
        ran = v is not None and (v.status in ("exact", "close", "mismatch") or (v.status == "invalid" and v.draws > 0))
        built = ran or (v is not None and v.status == "runtime_error")
        return {"different_pass": self.different, "build_pass": built, "execute_pass": ran,
                "equal_pass": self.status == "exact", "close_pass": self.correct, "speedup_pass": self.faster,
                "strategy_label_pass": self.correct and bool(self.label and self.label.passed),
                "strategy_label_exact_pass": bool(self.label and self.label.exact)}

    def to_json(self) -> dict:
        out = {"idx": self.idx, "strategy": self.strategy, "status": self.status, "error": self.error,
               **self.checks(), "speedup": self.speedup}
        if self.verification is not None:
            out["max_abs_err"] = self.verification.to_json()["max_abs_err"]
        if self.label is not None and self.label.error:
            out["label_error"] = self.label.error
        if self.label is not None and self.label.by:
            out["label_by"] = self.label.by
        return out


@dataclass
class LineResult:
    id: object
    checks: dict[str, bool | None]
    status: str
    error: str = ""
    items: list[ItemResult] = field(default_factory=list)
    requested: Requested | None = None
    exception: dict | None = None

    def to_json(self) -> dict:
        detail: dict = {"items": [i.to_json() for i in self.items]}
        if self.requested is not None:
            detail["requested"] = {"count": self.requested.count, "at_least": self.requested.at_least}
        out = {"id": self.id, **self.checks, "status": self.status, "error": self.error, "detail": detail}
        return out | ({"exception": self.exception} if self.exception else {})


@dataclass
class _Line:
    """A prediction being scored: what was parsed, or the line-level failure."""

    prediction: Prediction
    signature: Signature | None = None
    original: str = ""
    original_alpha: str = ""
    response: ParsedResponse | None = None
    requested: Requested | None = None
    status: str = ""
    error: str = ""
    items: list[ItemResult] = field(default_factory=list)
    exception: dict | None = None  # {"type", "message", "file", "line"} when scoring it raised


# --- the harness --------------------------------------------------------------------------------

def evaluate(predictions: Iterable[Prediction], options: EvalOptions = EvalOptions(), pool=None, timer=None,
             progress: Progress | None = None) -> list[LineResult]:
    """Score every prediction, results in input order. `pool` (a `WorkerPool`) runs verifications
    and label checks; `timer` (a one-worker pool, `gpu_tasks.timing.timing_pool()`) the timings;
    without them both run in this process. A pool is never shared between the two phases."""
    lines = [_isolated(prepare, p, options, fallback=p) for p in predictions]
    run_checks(lines, options, pool, progress)
    if options.time:
        run_timings(lines, options, timer if timer is not None or pool is None else "new", progress)
    return [_isolated(finish, line, options, fallback=line) for line in lines]


def _isolated(step, subject, options: EvalOptions, fallback):
    """`step(subject, options)`; when it raises (a bug met by one line), that line alone fails with
    status `internal_error` and the exception, and the others are scored."""
    try:
        return step(subject, options)
    except Exception as e:
        line = fallback if isinstance(fallback, _Line) else _Line(fallback)
        _fail_line(line, e)
        return finish(line, options) if step is finish else line


def _fail_line(line: _Line, error: Exception) -> None:
    from leir.errors import describe_exception

    line.exception = describe_exception(error)
    line.status, line.error = "internal_error", f"{line.exception['type']}: {line.exception['message']}"
    line.items = []


def prepare(prediction: Prediction, options: EvalOptions) -> _Line:
    """Parse and guard everything that is text: the line, the original, the response, each IR."""
    line = _Line(prediction)
    if prediction.error:
        line.status, line.error = prediction.error_status, prediction.error
        return line
    try:
        line.signature = Signature.from_json(prediction.signature)
        line.original, original = _load_program(prediction.original_ir, line.signature, options.limits)
    except (LeirError, ValueError) as e:
        line.status, line.error = "input_error", f"original: {e}" if line.signature else f"signature: {e}"
        return line
    line.original_alpha = alpha_hash(original, line.signature)
    line.requested = Requested(prediction.k) if prediction.k else requested_answers(prediction.prompt)
    try:
        line.response = parse_response(prediction.response, bare_json=options.bare_json,
                                       strategy_keys=options.strategy_keys)
    except ResponseError as e:
        line.status, line.error = e.kind, str(e)
        return line
    if line.requested is not None and not line.response.multi:
        line.status, line.error = "format_error", "the prompt asks for a list of answers, got one object"
        return line
    if line.requested is None and prediction.prompt and line.response.multi:
        line.status, line.error = "format_error", "the prompt asks for one answer, got a list"
        return line
    line.items = [_prepare_item(item.idx, item.strategy, item.transformed_ir, line, options)
                  for item in line.response.items]
    return line


def _prepare_item(idx, strategy: str, ir: str, line: _Line, options: EvalOptions) -> ItemResult:
    item = ItemResult(idx, strategy, ir)
    problem = ir_text_problem(ir)
    if problem:
        item.status, item.error = "rejected", f"rejected before parsing: {problem}"
        return item
    try:
        program = parse_program(ir)
    except LeirError as e:
        item.status, item.error = "invalid", f"transformed_IR is not LEIR: {e}"
        return item
    except RecursionError:
        item.status, item.error = "rejected", "transformed_IR nests too deeply to parse"
        return item
    too_big = limit_violation(program, line.signature, options.limits)
    if too_big:
        item.status, item.error = "rejected", f"rejected before building: {too_big}"
        return item
    item.ir = format_program(program)
    item.alpha = alpha_hash(program, line.signature)
    item.different = item.alpha != line.original_alpha
    return item


def run_checks(lines: list[_Line], options: EvalOptions, pool=None, progress: Progress | None = None) -> None:
    """Verify every parsed answer against its original and check its strategy label."""
    from gpu_tasks.verify import as_verification

    jobs, sinks = [], []
    for line in lines:
        try:
            line_jobs, line_sinks = _line_jobs(line, options)
        except Exception as e:  # one line's bug fails that line; the others are scored
            _fail_line(line, e)
            continue
        jobs += line_jobs
        sinks += line_sinks
    results = ((i, job.fn(*job.args)) for i, job in enumerate(jobs)) if pool is None else pool.imap(jobs)
    for done, (index, result) in enumerate(results, start=1):
        item, kind = sinks[index]
        if kind == "verification":
            item.verification = as_verification(result)
            item.status, item.error = item.verification.status, item.verification.error
        else:
            item.label = result if isinstance(result, LabelResult) else \
                LabelResult(False, f"the label check failed: {getattr(result, 'message', result)}")
        if progress:
            progress("verifying", done, len(jobs))


def _line_jobs(line: _Line, options: EvalOptions) -> tuple[list, list]:
    """The verification and label-check jobs of every parsed answer of `line`, and where each result goes."""
    from gpu_tasks.jobs import verify_pair_job
    from gpu_tasks.pool import Job
    from gpu_tasks.verify import pair_request
    from strategies.registry import ALL_NAMES

    jobs, sinks = [], []
    sig = line.signature.dumps() if line.signature else ""
    key = hashlib.sha256(f"{line.original}\0{sig}\0{options.target}".encode()).hexdigest()
    for item in line.items:
        if not item.parsed:
            continue
        request = pair_request(line.original, item.ir, sig, target=options.target, arch=options.arch,
                               draws=options.draws, seed=options.seed, tolerances=options.tolerances,
                               limits=options.limits)
        jobs.append(Job(verify_pair_job, (request,), affinity=key))
        sinks.append((item, "verification"))
        if item.strategy not in ALL_NAMES:
            item.label = LabelResult(False, f"{item.strategy!r} is not one of the 43 strategies")
            continue
        if not item.different:  # a strategy never yields a program alpha-equivalent to its input
            item.label = LabelResult(False, f"{item.strategy} changes the program; the answer does not")
            continue
        label = LabelRequest(line.original, sig, options.target, item.strategy, item.alpha,
                             options.label_cap, options.label_budget_s, item.ir)
        jobs.append(Job(label_job, (label,), affinity=key))
        sinks.append((item, "label"))
    return jobs, sinks


def run_timings(lines: list[_Line], options: EvalOptions, timer=None, progress: Progress | None = None) -> None:
    """Time every answer that is different and correct (others cannot be faster in any useful sense);
    `timer="new"` starts a one-worker timing pool for the duration."""
    from gpu_tasks.timing import iter_time_pairs, timing_pool, timing_request

    todo = [(line, item) for line in lines for item in line.items if item.different and item.correct]
    for _, item in ((line, item) for line in lines for item in line.items):
        item.faster = False
    if not todo:
        return
    requests, timed = [], []
    for line, item in todo:
        try:
            requests.append(timing_request(line.original, item.ir, line.signature, target=options.target,
                                           arch=options.arch, repeats=options.repeats,
                                           min_repeat_ms=options.min_repeat_ms, seed=options.seed,
                                           limits=options.limits))
            timed.append((line, item))
        except Exception as e:  # this answer is not timed (speedup_pass false); the others are
            item.error = item.error or f"timing: {type(e).__name__}: {e}"
    todo = timed
    own = timing_pool() if timer == "new" else None
    try:
        for done, ((_, item), timing) in enumerate(zip(todo, iter_time_pairs(requests, own or timer), strict=True),
                                                   start=1):
            if timing.status == "ok":
                item.speedup = timing.to_json()["speedup"]  # null when not finite
                item.faster = item.speedup is not None and item.speedup > 1.0 + options.speedup_margin
            else:
                item.error = item.error or f"timing: {timing.status}: {timing.error}"
            if progress:
                progress("timing", done, len(todo))
    finally:
        if own is not None:
            own.close()


def finish(line: _Line, options: EvalOptions) -> LineResult:
    """The line's checks, status and error from its items."""
    p = line.prediction
    if line.status or not line.items:
        checks = dict.fromkeys(CHECKS, False)
        if not options.time:
            checks["speedup_pass"] = None
        return LineResult(p.id, checks, line.status or "format_error", line.error, line.items, line.requested,
                          line.exception)
    per_item = [item.checks() for item in line.items]
    checks: dict[str, bool | None] = {"format_pass": True}
    for name in ITEM_CHECKS:
        values = [c[name] for c in per_item]
        checks[name] = None if any(v is None for v in values) else all(values)
    valid = {item.alpha for item in line.items if item.different and item.correct}
    wanted = line.requested or Requested(len(line.items) if line.response.multi else 1)
    checks["require_num_pass"] = wanted.satisfied_by(len(valid))
    checks = {name: checks[name] for name in CHECKS}
    status, error = _line_status(line.items, line.response.multi)
    if not checks["require_num_pass"] and not error and line.response.multi:
        error = f"{len(valid)} distinct valid answers, {'at least ' if wanted.at_least else ''}{wanted.count} asked for"
    return LineResult(p.id, checks, status, error, line.items, line.requested)


def _line_status(items: list[ItemResult], multi: bool) -> tuple[str, str]:
    for n, item in enumerate(items, start=1):
        if not item.correct:
            return item.status, (f"answer {n}: " if multi else "") + item.error
    label_errors = [(n, i.label.error) for n, i in enumerate(items, start=1) if i.label and not i.label.passed]
    not_different = [n for n, i in enumerate(items, start=1) if not i.different]
    error = ""
    if not_different:
        error = "identical to the original up to renaming" if not multi else \
            f"answer {not_different[0]}: identical to the original up to renaming"
    elif label_errors:
        n, message = label_errors[0]
        error = (f"answer {n}: " if multi else "") + message
    return ("close" if any(i.status == "close" for i in items) else "exact"), error


def _load_program(text: str, signature: Signature, limits: Limits):
    if not isinstance(text, str):
        raise ValueError("original_IR must be LEIR text")
    problem = ir_text_problem(text)
    if problem:
        raise ValueError(problem)
    program = parse_program(text)
    too_big = limit_violation(program, signature, limits)
    if too_big:
        raise ValueError(too_big)
    return format_program(program), program


# --- aggregates -----------------------------------------------------------------------------------

def summarize(results: list[LineResult]) -> dict:
    """The rate of each check over the lines where it was measured (null when it never was), and n."""
    out: dict = {}
    for name in CHECKS:
        values = [r.checks[name] for r in results if r.checks[name] is not None]
        out[name] = round(sum(values) / len(values), 6) if values else None
    out["n"] = len(results)
    return out


def by_strategy(results: list[LineResult]) -> dict[str, dict[str, int]]:
    """Per named strategy, how many answers are exact, close or wrong (anything else); answers of a
    response that could not be read count under `(unreadable)`."""
    table: dict[str, dict[str, int]] = {}
    for r in results:
        outcomes = [(i.strategy or "(none)", i.status) for i in r.items] or [("(unreadable)", r.status)]
        for strategy, status in outcomes:
            row = table.setdefault(strategy, {"exact": 0, "close": 0, "wrong": 0, "total": 0})
            row[status if status in ("exact", "close") else "wrong"] += 1
            row["total"] += 1
    return dict(sorted(table.items()))
