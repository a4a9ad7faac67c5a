"""The optional `measure` stage: before/after timings of released steps into the `timings` table.

Timings are measurements, not deterministic data: each run appends one shard named by its run id
(machine fingerprint and time), and nothing else in the lake depends on them. One timing at a time
on the machine (gpu_tasks' machine lock), before and after interleaved (DESIGN.md).
"""
from __future__ import annotations

import datetime
import json
from pathlib import Path

from flows.prefect_env import configure

configure()

from prefect import flow  # noqa: E402

from flows.config import Params  # noqa: E402
from flows.keys import stable_id  # noqa: E402
from flows.storage import read_table, release_inputs, write_shard  # noqa: E402

DEFAULT_MAX_STEPS = 40


def timing_rows(steps: list[dict], signatures: dict[str, str], target: str, run_id: str, pool=None) -> list[dict]:
    from gpu_tasks.timing import iter_time_pairs, timing_request

    requests = [timing_request(s["before_leir"], s["after_leir"], signatures[s["program_id"]], target=target)
                for s in steps]
    rows = []
    for s, t in zip(steps, iter_time_pairs(requests, pool), strict=True):
        if t.status != "ok":
            continue
        rows.append({"step_id": s["step_id"], "target": target, "run_id": run_id, "before_us": t.before_us,
                     "after_us": t.after_us, "speedup": t.speedup, "repeats": t.repeats, "spread": t.spread,
                     "machine": json.dumps(t.fingerprint, sort_keys=True)})
    return rows


@flow(name="measure")
def measure_flow(raw: dict, profile: str, lake: str, reports: str) -> dict:
    from gpu_tasks.fingerprint import machine_fingerprint
    from gpu_tasks.timing import timing_pool

    params, lake = Params(raw, profile), Path(lake)
    target = params.verify["target"]
    limit = int(raw.get("measure", {}).get("max_steps", DEFAULT_MAX_STEPS))
    released, _ = release_inputs(lake, params)
    wanted = set(released.column("step_id").to_pylist())
    steps = [s for s in read_table(lake, "steps").to_pylist() if s["step_id"] in wanted][:limit]
    signatures = {p["program_id"]: p["signature"] for p in read_table(lake, "programs").to_pylist()}
    stamp = datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds")
    run_id = stable_id("timing-run", machine_fingerprint(target), stamp, length=12)
    with timing_pool() as pool:
        rows = timing_rows(steps, signatures, target, run_id, pool)
    if rows:
        write_shard(lake, "timings", run_id, rows)
    return {"stage": "measure", "run_id": run_id, "rows": len(rows)}

