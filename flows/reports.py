"""The report stage: JSON metrics (DVC metrics) and PNG plots (DVC plots) under `reports/`.

- strategies.json: steps per strategy generated, verified and released (before/after filtering);
- verification.json: outcomes per strategy and overall pass rate;
- errors.json: error taxonomy (status x first words of the message);
- splits.json: samples and families per split, the strategies the test split covers, its structural
  overlap with the train split (flows.filtering); summary.json: the headline numbers;
- cot_templates.json: per strategy, the released CoTs and their distinct templates once numbers and
  names are abstracted (`template`), and the median over strategies.
- prompt_lines.json: per prompt line kind, how far one line lifts a strategy above its base rate
  (`line_leakage`).
"""
from __future__ import annotations

import hashlib
import json
import re
from collections import Counter, OrderedDict
from pathlib import Path

import pyarrow as pa
from prefect import flow
from prefect.task_runners import ThreadPoolTaskRunner

from flows.lake_queries import family_splits, release_inputs
from flows.storage import build_catalog, read_table
from strategies.registry import ALL_NAMES


def build_reports(lake: Path, params, filter_counters: list[dict], out: Path) -> dict:
    """The deterministic reports of `lake` under `out` (JSON figures and their plots)."""
    programs, steps = read_table(lake, "programs"), read_table(lake, "steps")
    verifications, samples = read_table(lake, "verifications"), read_table(lake, "samples")
    splits, released_steps = family_splits(lake), release_inputs(lake, params)[0]
    target = params.verify["target"]
    out.mkdir(parents=True, exist_ok=True)
    # the verify stage's target (a GPU program's step may also have a CUDA row)
    status_of = {r["step_id"]: r["status"] for r in verifications.select(["step_id", "target", "status"]).to_pylist()
                 if r["target"] == target}
    step_rows = steps.select(["step_id", "strategy"]).to_pylist()
    released = Counter(s for row in samples.column("strategies").to_pylist() for s in json.loads(row))
    generated = Counter(r["strategy"] for r in step_rows)
    outcomes: dict[str, Counter] = {}
    for r in step_rows:
        outcomes.setdefault(r["strategy"], Counter())[status_of.get(r["step_id"], "unverified")] += 1
    strategies = {name: {"generated": generated.get(name, 0),
                         "verified": outcomes.get(name, Counter())["exact"] + outcomes.get(name, Counter())["close"],
                         "in_samples": released.get(name, 0)} for name in ALL_NAMES}
    verification = {name: dict(sorted(outcomes[name].items())) for name in ALL_NAMES if name in outcomes}
    passed = sum(v["verified"] for v in strategies.values())
    errors = Counter()
    for row in verifications.select(["status", "error_message"]).to_pylist():
        if row["status"] not in ("exact", "close"):
            words = " ".join((row["error_message"] or "").split()[:6])
            errors[f"{row['status']}: {words}".strip()] += 1
    family_split = splits or {}
    splits = Counter(samples.column("split").to_pylist())
    program_status = programs.column("verification_status").to_pylist()
    summary = {
        "programs": programs.num_rows,
        "programs_verified": sum(1 for s in program_status if s in ("exact", "close")),
        "steps": steps.num_rows, "steps_verified": passed,
        "verification_pass_rate": round(passed / steps.num_rows, 4) if steps.num_rows else 0.0,
        "samples": samples.num_rows, "train_samples": splits.get("train", 0), "test_samples": splits.get("test", 0),
        "strategies_with_steps": sum(1 for v in strategies.values() if v["generated"]),
        "strategies_released": sum(1 for v in strategies.values() if v["in_samples"]),
        **shape_figures(program_shapes(programs)),
    }
    templates = cot_templates(samples)
    summary["cot_templates_median"] = templates["median_templates"]
    _dump(out / "strategies.json", strategies)
    _dump(out / "verification.json", verification)
    _dump(out / "errors.json", dict(errors.most_common()))
    _dump(out / "splits.json", split_figures(samples, family_split, released_steps))
    leakage = line_leakage(samples.select(["prompt", "strategies"]).to_pylist())
    summary["prompt_line_excess"] = {kind: v["excess"] for kind, v in leakage.items()}
    _dump(out / "prompt_lines.json", leakage)
    _dump(out / "summary.json", summary)
    _dump(out / "cot_templates.json", templates)
    _plot_strategies(strategies, out / "strategy_distribution.png")
    _plot_outcomes(verification, out / "verification_outcomes.png")
    plot_shapes(program_shapes(programs), out / "shapes.png")
    return summary


# --- CoT templates: how varied the released reasoning is -------------------------------------

def cot_templates(samples: pa.Table) -> dict:
    """Distinct CoT templates per strategy over the released samples (each option of a multi-answer
    sample counts for its strategy), and their median over the 43 strategies (0 for one without CoTs)."""
    rows = []
    for answer, strategies in zip(samples.column("answer").to_pylist(), samples.column("strategies").to_pylist(),
                                  strict=True):
        rows.extend(thoughts(answer, json.loads(strategies)))
    found = template_counts(rows)
    per = {name: found.get(name, {"cots": 0, "templates": 0}) for name in ALL_NAMES}  # a strategy without CoTs: 0
    counts = sorted(v["templates"] for v in per.values())
    median = (counts[(len(counts) - 1) // 2] + counts[len(counts) // 2]) / 2 if counts else 0
    return {"median_templates": median, "cots": len(rows),
            "templates": sum(counts),
            "strategies": per}


_NUMBER = re.compile(r"\d+(?:[.,]\d+)*(?:e[+-]?\d+)?")
_OPTION = re.compile(r"^Option \d+:$", re.M)


def thoughts(answer_text: str, strategies: list[str]) -> list[tuple[str, str]]:
    """(strategy, think text) per option of a released answer (one for a single-answer sample)."""
    from strategies.cot import split_answer

    text, _ = split_answer(answer_text)
    parts = [p.strip("\n") for p in _OPTION.split(text)] if len(strategies) > 1 else [text]
    parts = [p for p in parts if p]
    return list(zip(strategies, parts, strict=False))


def template(think_text: str) -> str:
    """The think text with the quoted nests dropped, every LEIR superscript and subscript removed,
    the quoted programs' tensor and loop names replaced by `<name>` and numbers by `N`."""
    from leir.analysis import iter_nests, tensor_order
    from leir.errors import LeirError
    from leir.parse import parse_program

    names: set[str] = set()
    kept = []
    for line in think_text.splitlines():
        if line.startswith("  nest ") and ": " in line:
            try:
                program = parse_program(line.split(": ", 1)[1])
            except (LeirError, ValueError):
                continue
            names.update(tensor_order(program))
            names.update(lp.var for nest, _ in iter_nests(program) for lp in nest.loops)
            continue
        kept.append(line)
    text = _without_scripts("\n".join(kept))
    if names:
        words = "|".join(re.escape(n) for n in sorted(names, key=lambda n: (-len(n), n)))
        text = re.sub(rf"\b(?:{words})\b", "<name>", text)
    return _NUMBER.sub("N", text)


def _without_scripts(text: str) -> str:
    """`text` without the `^{...}` and `_{...}` groups of LEIR accesses (braces balanced)."""
    out, i = [], 0
    while i < len(text):
        if text.startswith(("^{", "_{"), i):
            depth, i = 1, i + 2
            while i < len(text) and depth:
                depth += {"{": 1, "}": -1}.get(text[i], 0)
                i += 1
            continue
        out.append(text[i])
        i += 1
    return "".join(out)


def template_counts(rows: list[tuple[str, str]]) -> dict[str, dict[str, int]]:
    """{strategy: {"cots", "templates"}} over (strategy, think text) pairs, strategies sorted."""
    seen: dict[str, set[str]] = {}
    cots: Counter = Counter()
    for strategy, text in rows:
        seen.setdefault(strategy, set()).add(template(text))
        cots[strategy] += 1
    return {s: {"cots": cots[s], "templates": len(seen[s])} for s in sorted(seen)}


# --- the split: what the test split covers and how much of it the train split has seen ----

def nest_overlap(steps: pa.Table, splits: dict[str, str]) -> dict:
    """Nest by nest: of the loop nests of the test split's distinct states (the released test steps'
    before-states), how many have a twin in a train state (a released train step's before- or
    after-state) with names and sizes abstracted (leir.canon.structure_hashes): the partial overlap
    that a sample's `structural_overlap` flag (every nest seen) does not show."""
    from leir.canon import structure_hashes_of

    rows = steps.select(["family", "before_leir", "after_leir"]).to_pylist()
    train = sorted({t for r in rows if splits.get(r["family"], "train") == "train" for t in (r["before_leir"],
                                                                                             r["after_leir"])})
    test = sorted({r["before_leir"] for r in rows if splits.get(r["family"]) == "test"})
    digest = hashlib.sha256()
    for text in (*train, "\0split\0", *test):
        digest.update(text.encode() + b"\0")
    key = digest.hexdigest()
    if key not in _OVERLAP:
        hashes = structure_hashes_of([*train, *test])
        seen = {h for text in train for h in hashes[text]}
        nests = [h for text in test for h in hashes[text]]
        _OVERLAP[key] = {"test_states": len(test), "test_nests": len(nests),
                         "test_nests_seen": sum(1 for h in nests if h in seen)}
        while len(_OVERLAP) > 4:
            _OVERLAP.popitem(last=False)
    return dict(_OVERLAP[key])


# nest_overlap's figures by a digest of the states it compares: the card asks for them in two sections,
# and the release stage writes a release twice (the second to compare its bytes); each computation
# parses every released state (~40 s at release scale)
_OVERLAP: OrderedDict[str, dict] = OrderedDict()


def split_figures(samples: pa.Table, splits: dict[str, str], steps: pa.Table | None = None) -> dict:
    """Samples per split, the families of each split, the strategies the test split covers (and those
    it cannot: train only), samples per strategy in each split (a multi-answer sample counts for each
    of its strategies), and the test split's structural overlap: test samples whose before-state's
    nests all have a twin in the train split (names and sizes abstracted), and the clean rest; with the
    released `steps` (family, before_leir, after_leir), the overlap nest by nest (`nest_overlap`)."""
    rows = samples.select(["split", "strategies", "structural_overlap"]).to_pylist()
    per: dict[str, Counter] = {"train": Counter(), "test": Counter()}
    for r in rows:
        per.setdefault(r["split"], Counter()).update(json.loads(r["strategies"]))
    test = [r for r in rows if r["split"] == "test"]
    overlapping = sum(1 for r in test if r["structural_overlap"])
    train_overlapping = sum(1 for r in rows if r["split"] == "train" and r["structural_overlap"])
    released = sorted(set(per["train"]) | set(per["test"]))
    counts = Counter(r["split"] for r in rows)
    return {
        "train": counts.get("train", 0), "test": counts.get("test", 0),
        "families": {s: sorted(f for f, v in splits.items() if v == s) for s in ("train", "test")},
        "strategies_released": len(released),
        "strategies_in_test": sum(1 for k in released if per["test"][k]),
        "train_only": [k for k in released if not per["test"][k]],
        "test_only": [k for k in released if not per["train"][k]],
        "samples_per_strategy": {k: {"train": per["train"][k], "test": per["test"][k]} for k in released},
        "overlap": {"test_samples": len(test), "overlapping": overlapping, "train_overlapping": train_overlapping,
                    "share": round(overlapping / len(test), 4) if test else 0.0, "clean": len(test) - overlapping,
                    **(nest_overlap(steps, splits) if steps is not None and {"family", "before_leir", "after_leir"}
                       <= set(steps.column_names) else {})},
    }


# --- shapes: what the programs' tensors look like -----------------------------------------

def program_shapes(programs: pa.Table) -> list[dict]:
    """Per program: family, dtype, shape source and the extents of its known tensors."""
    rows = []
    for p in programs.select(["program_id", "family", "dtype", "signature", "shape_source"]).to_pylist():
        dims = sorted({d for t in json.loads(p["signature"])["tensors"] for d in t["shape"]})
        rows.append({"program_id": p["program_id"], "family": p["family"], "dtype": p["dtype"],
                     "shape_source": p["shape_source"] or "unknown", "largest_dim": max(dims, default=1),
                     "prime_dims": [d for d in dims if d > 7 and is_prime(d)]})
    return rows


def is_prime(n: int) -> bool:
    return n > 1 and all(n % d for d in range(2, int(n ** 0.5) + 1))


def shape_figures(rows: list[dict]) -> dict:
    """The headline figures of the shapes: median largest extent, share of programs with a prime
    extent above 7 (remainder handling), programs per shape source and dtype."""
    largest = sorted(r["largest_dim"] for r in rows)
    return {
        "median_largest_dim": largest[(len(largest) - 1) // 2] if largest else 0,
        "prime_dim_share": round(sum(1 for r in rows if r["prime_dims"]) / len(rows), 4) if rows else 0.0,
        "programs_by_shape_source": dict(sorted(Counter(r["shape_source"] for r in rows).items())),
        "programs_by_dtype": dict(sorted(Counter(r["dtype"] for r in rows).items())),
    }


def plot_shapes(rows: list[dict], path: Path) -> None:
    """Histogram of each program's largest extent (log2 bins), stacked by dtype; deterministic bytes."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(8, 3.5))
    top = max((r["largest_dim"] for r in rows), default=1)
    edges = [2 ** e for e in range(0, max(top, 2).bit_length() + 1)]
    dtypes = sorted({r["dtype"] for r in rows})
    values = [[r["largest_dim"] for r in rows if r["dtype"] == d] for d in dtypes]
    if rows:
        ax.hist(values, bins=edges, stacked=True, label=dtypes)
        ax.legend(title="dtype", fontsize=8)
    ax.set_xscale("log", base=2)
    ax.set_xlabel("largest tensor extent of the program")
    ax.set_ylabel("programs")
    ax.set_title(f"Shapes of {len(rows)} programs")
    fig.tight_layout()
    fig.savefig(path, dpi=100, metadata={"Software": None})
    plt.close(fig)


def _dump(path: Path, obj) -> None:
    path.write_text(json.dumps(obj, indent=1, sort_keys=False) + "\n")


def _plot_strategies(strategies: dict, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    names = [n for n in ALL_NAMES if strategies[n]["generated"]]
    fig, ax = plt.subplots(figsize=(10, max(3, 0.28 * len(names) + 1)))
    ys = range(len(names))
    ax.barh([y + 0.2 for y in ys], [strategies[n]["generated"] for n in names], height=0.4, label="generated")
    ax.barh([y - 0.2 for y in ys], [strategies[n]["in_samples"] for n in names], height=0.4, label="released")
    ax.set_yticks(list(ys), names, fontsize=8)
    ax.invert_yaxis()
    ax.set_xlabel("steps")
    ax.set_title("Strategy distribution before and after filtering")
    ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=100, metadata={"Software": None})
    plt.close(fig)


def _plot_outcomes(verification: dict, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    names = sorted(verification)
    statuses = sorted({s for v in verification.values() for s in v})
    fig, ax = plt.subplots(figsize=(10, max(3, 0.28 * len(names) + 1)))
    left = [0] * len(names)
    for status in statuses:
        values = [verification[n].get(status, 0) for n in names]
        ax.barh(names, values, left=left, label=status)
        left = [a + b for a, b in zip(left, values, strict=True)]
    ax.invert_yaxis()
    ax.tick_params(axis="y", labelsize=8)
    ax.set_xlabel("steps")
    ax.set_title("Verification outcomes per strategy")
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=100, metadata={"Software": None})
    plt.close(fig)


# --- what a prompt line says about the label ---------------------------------------------------

PROMPT_LINE_KINDS = ("target", "known tensors", "instruction")
KNOWN_TENSORS = "The known tensors are "


def prompt_lines(prompt: str) -> dict[str, str]:
    """A prompt's lines by kind (strategies.cot.prompt): the target line (first), the known-tensors
    line, and the instruction (everything after the known tensors). The program line is not one of
    them: it is what the strategy is chosen for."""
    lines = prompt.split("\n")
    known = next((i for i, line in enumerate(lines) if line.startswith(KNOWN_TENSORS)), None)
    if known is None:
        raise ValueError("not a prompt of this project: no known-tensors line")
    return {"target": lines[0], "known tensors": lines[known], "instruction": "\n".join(lines[known + 1:])}


def line_leakage(samples: list[dict], min_share: float = 0.05) -> dict[str, dict]:
    """Per prompt line kind: how much better than its base rate one line predicts a strategy.

    A sample's strategies (one, or the k of a multi-answer sample, each weighing 1/k) are its label.
    For every line that at least `min_share` of the prompts carry (a line unique to a few prompts
    names one program, as the program line does, and its shares are noise), and every strategy: its
    share among the prompts with that line minus its share among all prompts. The kind's figure is the
    largest such excess, with the line, the strategy and both shares; `top` is, for the line where
    one strategy has the largest share, that strategy and its excess. The goal:
    every kind's `excess` is at most 0.10."""
    overall: Counter = Counter()
    by_line: dict[str, dict[str, list]] = {k: {} for k in PROMPT_LINE_KINDS}
    for s in samples:
        names = json.loads(s["strategies"]) if isinstance(s["strategies"], str) else list(s["strategies"])
        label: Counter = Counter()
        for name in names:
            label[name] += 1 / len(names)
        overall.update(label)
        for kind, line in prompt_lines(s["prompt"]).items():
            group = by_line[kind].setdefault(line, [0, Counter()])
            group[0] += 1
            group[1].update(label)
    n = len(samples)
    out: dict[str, dict] = {}
    for kind in PROMPT_LINE_KINDS:
        worst = top = None
        lines = {line: g for line, g in by_line[kind].items() if n and g[0] >= min_share * n}
        for line in sorted(lines):
            count, shares = lines[line]
            for strategy in sorted(shares):
                inside, base = shares[strategy] / count, overall[strategy] / n
                row = {"line": line, "prompts": count, "strategy": strategy, "share_in_line": round(inside, 4),
                       "share_overall": round(base, 4), "excess": round(inside - base, 4)}
                if worst is None or row["excess"] > worst["excess"]:
                    worst = row
                if top is None or row["share_in_line"] > top["share_in_line"]:
                    top = row
        out[kind] = {"lines": len(by_line[kind]), "lines_measured": len(lines),
                     "prompts_measured": sum(g[0] for g in lines.values()),
                     "excess": worst["excess"] if worst else 0.0, "worst": worst, "top": top}
    return out


@flow(name="report", task_runner=ThreadPoolTaskRunner(max_workers=1))
def report_flow(raw: dict, profile: str, lake: str, reports: str) -> dict:
    from flows.config import Params

    params, lake, out = Params(raw, profile), Path(lake), Path(reports)
    counters = json.loads((out / "filter.json").read_text()) if (out / "filter.json").exists() else []
    summary = build_reports(lake, params, counters, out)
    build_catalog(lake)
    return {"stage": "report", **summary}
