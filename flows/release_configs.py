"""The configs of a release made of measurements (`measured`, `gpu_steps`, `sft`, `preference`,
`preference_chat`, `trajectories`): one Arrow schema and sort order per config, what the lake's
measurements give them (`Measured`), and the `chat` form of the samples."""
from __future__ import annotations

import json
import shutil
from dataclasses import dataclass, field
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq

from flows.lake_queries import family_splits
from flows.storage import read_table

SPLITS = ("train", "test")
F64, I64, STR, BOOL = pa.float64(), pa.int64(), pa.string(), pa.bool_()


MESSAGES = pa.list_(pa.struct([("role", pa.string()), ("content", pa.string())]))


# The configs made of measurements: never read by the deterministic ones.
MEASURED_SCHEMAS = {
    **{name: pa.schema([
        ("step_id", STR), ("program_id", STR), ("parent_step_id", STR), ("depth", I64), ("family", STR), ("split", STR),
        ("strategy", STR), ("level", STR), ("site", STR), ("params", STR), ("claim", STR), ("enables", STR),
        ("before_state_id", STR), ("after_state_id", STR), ("before_leir", STR), ("after_leir", STR),
        ("verification", STR), ("exactness", STR), ("before_us", F64), ("after_us", F64), ("speedup", F64),
        ("speedup_low", F64), ("speedup_high", F64), ("effect", STR), ("timing_unit", STR), ("paired", BOOL),
        ("rounds", I64), ("chain_speedup", F64), ("chain_speedup_low", F64), ("chain_speedup_high", F64),
        ("chain_effect", STR), ("chain_step_id", STR), ("chain_strategy", STR), ("chain_after_leir", STR),
        ("dead_end", BOOL), ("machine_id", STR)]) for name in ("measured", "gpu_steps")},
    "sft": pa.schema([
        ("messages", MESSAGES), ("sample_id", STR), ("split", STR), ("kind", STR), ("step_ids", STR),
        ("strategies", STR), ("claim", STR), ("effect", STR), ("speedup", F64), ("speedup_low", F64),
        ("speedup_high", F64), ("step_effect", STR), ("chain_effect", STR)]),
    "preference": pa.schema([
        ("prompt", STR), ("chosen", STR), ("rejected", STR), ("split", STR), ("chosen_step_id", STR),
        ("rejected_step_id", STR), ("chosen_strategy", STR), ("rejected_strategy", STR), ("chosen_effect", STR),
        ("rejected_effect", STR), ("chosen_speedup", F64), ("chosen_speedup_low", F64), ("rejected_speedup", F64),
        ("rejected_speedup_high", F64), ("chosen_us", F64), ("rejected_us", F64), ("margin", F64),
        ("before_us", F64)]),
    "preference_chat": pa.schema([
        ("prompt", MESSAGES), ("chosen", MESSAGES), ("rejected", MESSAGES), ("split", STR), ("chosen_step_id", STR),
        ("rejected_step_id", STR), ("margin", F64)]),
    **{name: pa.schema([
        ("trajectory_id", STR), ("program_id", STR), ("family", STR), ("workload", STR), ("dtype", STR),
        ("split", STR), ("driver", STR), ("policy", STR), ("seed", I64), ("states", pa.list_(STR)),
        ("strategies", pa.list_(STR)), ("sites", pa.list_(STR)), ("params", pa.list_(STR)),
        ("exactness", pa.list_(STR)), ("verification", pa.list_(STR)), ("max_abs_err", pa.list_(F64)),
        ("times_us", pa.list_(F64)), ("speedups", pa.list_(F64)), ("speedups_low", pa.list_(F64)),
        ("speedups_high", pa.list_(F64)), ("step_effects", pa.list_(STR)), ("best_speedup", F64), ("steps", I64),
        ("search_states", I64), ("search_speedup", F64), ("wall_s", F64), ("machine_id", STR), ("cpu", STR),
        ("format", STR)]) for name in ("trajectories", "trajectories_fast_exp")},
}


# How each config's rows are ordered (a rebuild gives the same bytes).
SORT_KEYS = {"measured": ("step_id", "machine_id"), "gpu_steps": ("step_id",), "sft": ("sample_id",),
             "preference": ("prompt", "chosen_step_id", "rejected_step_id"),
             "preference_chat": ("chosen_step_id", "rejected_step_id"), "trajectories": ("trajectory_id",),
             "trajectories_fast_exp": ("trajectory_id",)}


@dataclass(frozen=True)
class Measured:
    """What a release says about speed, from the lake's measurements: per released step (`effects`,
    the `measured` rows), the `sft` rows, preference pairs in both forms, the search's trajectories,
    the machine that measured them and how (`timing`: protocol, rounds, units, the nest/whole
    agreement), the offline cost model (its file and held-out quality)."""

    effects: list[dict]
    preference: list[dict]
    trajectories: list[dict]
    machine: dict | None
    cost_model: Path | None = None
    cost_model_quality: dict | None = None
    sft: list[dict] = field(default_factory=list)
    preference_chat: list[dict] = field(default_factory=list)
    timing: dict = field(default_factory=dict)
    trajectories_left_out: dict = field(default_factory=dict)  # reason -> trajectories not released
    gpu_steps: list[dict] = field(default_factory=list)  # the records of steps of GPU programs: never timed
    preference_per_prompt: int = 4  # the bound on pairs per prompt (`release.preference_pairs_per_prompt`)
    verified_on_cuda: int = 0  # released steps of GPU programs also verified on CUDA (a GPU in the build)
    # the `measured` rows that do not decide (other machines' rows of steps timed on several), and every
    # timing machine's fingerprint by id, most states first (where there are such rows)
    other_effects: list[dict] = field(default_factory=list)
    other_machines: dict = field(default_factory=dict)

    def rows(self, config: str) -> list[dict]:
        published = [t for t in self.trajectories if t["format"] == "published"]
        return {"measured": self.effects + self.other_effects, "gpu_steps": self.gpu_steps, "sft": self.sft,
                "preference": self.preference,
                "preference_chat": self.preference_chat, "trajectories": published,
                "trajectories_fast_exp": [t for t in self.trajectories if t["format"] != "published"]}[config]


def measured_inputs(lake: Path, params, reports: Path | None = None) -> Measured:
    """The release's measured parts, from the `timings`, `effects`, `follow_ups`, `trajectories` and
    cost model of `lake`."""
    from flows.cost_model import MODEL_PATH
    from flows.measured import (
        measured_rows,
        preference_chat_rows,
        preference_pairs,
        release_trajectories,
        sft_rows,
    )

    target = params.verify["target"]
    found = measured_rows(lake, target)
    rows, others, machine, timing = found.deciding, found.others, found.machine, found.timing
    chain_prompt, chain_answer = found.chain_prompt, found.chain_answer
    # `measured` holds what this build can time: the steps of programs written for its target; the
    # records of the others (programs written for a GPU) are `gpu_steps`, with the same columns
    effects = [r for r in rows if r["program_target"] == target]
    gpu_steps = [r for r in rows if r["program_target"] != target]
    samples = read_table(lake, "samples").to_pylist()
    per_prompt = int(params.release.get("preference_pairs_per_prompt", 4))
    pairs = preference_pairs(samples, effects, per_prompt)
    split_of = family_splits(lake)  # the samples' split (flows.filtering.split_families)
    model = Path(lake) / MODEL_PATH
    quality = None
    if reports is not None and (Path(reports) / "cost_model.json").exists():
        quality = json.loads((Path(reports) / "cost_model.json").read_text()).get("quality")
    trajectories, left_out = release_trajectories(lake, split_of)
    return Measured(effects, pairs, trajectories, machine, model if model.exists() else None, quality,
                    sft_rows(samples, effects, chain_prompt, chain_answer), preference_chat_rows(pairs), timing,
                    left_out, gpu_steps, per_prompt, _verified_on_cuda(lake, gpu_steps),
                    [r for r in others if r["program_target"] == target], found.machines if others else {})


def _verified_on_cuda(lake: Path, steps: list[dict]) -> int:
    """How many of `steps` have a verification on CUDA in `lake` (a GPU was present when they were verified)."""
    ids = {r["step_id"] for r in steps}
    table = read_table(lake, "verifications")
    return sum(1 for s, t in zip(table.column("step_id").to_pylist(), table.column("target").to_pylist(), strict=True)
               if t == "cuda" and s in ids)


def write_measured(folder: Path, measured: Measured, tables: dict) -> None:
    """`measured/`, `preference/`, `trajectories/` (a Parquet file per split that has rows) and the
    offline cost model (`cost_model.json`)."""
    for config, schema in MEASURED_SCHEMAS.items():
        rows = measured.rows(config)
        for split in SPLITS:
            part = [r for r in rows if r.get("split") == split]
            if not part:
                continue
            table = pa.Table.from_pylist([{k: r.get(k) for k in schema.names} for r in part], schema=schema)
            table = table.sort_by([(k, "ascending") for k in SORT_KEYS[config]])
            (folder / config).mkdir(exist_ok=True)
            pq.write_table(table, folder / config / f"{split}.parquet", compression="zstd")
            tables.setdefault(config, {})[split] = table
    if measured.cost_model is not None:
        shutil.copyfile(measured.cost_model, folder / "cost_model.json")


CHAT_SCHEMA = pa.schema([("messages", pa.list_(pa.struct([("role", pa.string()), ("content", pa.string())])))])


def chat_table(part: pa.Table) -> pa.Table:
    """The `chat` config: one `messages` list (user prompt, assistant answer) per sample, for SFT."""
    rows = part.select(["prompt", "answer"]).to_pylist()
    messages = [[{"role": "user", "content": r["prompt"]}, {"role": "assistant", "content": r["answer"]}] for r in rows]
    return pa.table({"messages": pa.array(messages, type=CHAT_SCHEMA.field("messages").type)}, schema=CHAT_SCHEMA)
