"""The pipeline's throughput on a profile: programs/s generated, steps/s transformed, verified steps/s,
next to the verification benchmark's pair rate (bench_verify.py), and the verify stage on a local Dask
cluster of 1 and of 2 workers against the local runner with as many verifying processes (the scale-out
ratio, and what a Dask worker keeps of a local one's rate).

Each verify run starts from the same generated lake copied to a folder of its own, so no run reuses
another's verification rows; every stage runs as the pipeline runs it (`run_stage`, one Prefect
server for all). The Dask runs give each worker a verification pool of one process, so that the
number of verifying processes is the number of workers; each cluster is started, and its workers'
pools too, before the stage is timed, as the local runner's pool is warm from the stages before.

    .venv/bin/python benchmarks/bench_pipeline.py                    # default profile
    .venv/bin/python benchmarks/bench_pipeline.py --no-dask --families gemm,softmax
"""
from __future__ import annotations

import argparse
import json
import shutil
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "benchmarks"))

from flows.config import load_params  # noqa: E402


def run(stage: str, params, lake: Path, reports: Path, task_runner=None) -> dict:
    from flows.pipeline import run_stage

    return run_stage(stage, params, lake, reports, task_runner=task_runner)


def verify_rate(params, source: Path, folder: Path, task_runner=None) -> tuple[float, dict]:
    """Verified steps per second of the verify stage on a fresh copy of `source` (programs + steps)."""
    lake = folder / "lake"
    shutil.copytree(source, lake, ignore=shutil.ignore_patterns(".cache", ".prefect-results", "verifications"))
    result = run("verify", params, lake, folder / "reports", task_runner)
    return result["verified"] / result["seconds"], result


def dask_lines(params, overrides: dict, profile: str, source: Path, tmp: Path, local_pool: float) -> list[str]:
    """The verify stage with one verifying process per worker: the local runner (a pool of 1) against
    a standing Dask cluster of 1 and of 2 workers on this machine. Every pool is started before the
    stage is timed (the local runner's pool is warm from the stages before it; a cluster's workers
    are started once and serve every stage), so the rates compare verification, not start-up; the
    cluster's start-up is reported apart."""
    import time

    from distributed import Client

    from flows.cluster import dask_runner, local_cluster
    from flows.tasks import shared_pool
    from flows.verify import start_verify_pool

    single = load_params(profile=profile, overrides={**overrides, "verify": {"workers": 1}})
    shared_pool(single)
    local1, _ = verify_rate(single, source, tmp / "local1")
    rates, starts = {}, {}
    for n in (1, 2):
        begin = time.perf_counter()
        with local_cluster(n) as address:
            with Client(address) as client:
                sizes = client.run(start_verify_pool, single.raw, single.profile_name)
            starts[n] = time.perf_counter() - begin
            assert all(size == 1 for size in sizes.values()), sizes
            rates[n] = verify_rate(single, source, tmp / f"dask{n}", dask_runner(address))[0]
    return [f"verify, one verifying process per worker: local runner {local1:.2f} steps/s (its pool of "
            f"{params.verify['workers']}: {local_pool:.2f}); a local Dask cluster of 1 worker {rates[1]:.2f} steps/s, "
            f"of 2 workers {rates[2]:.2f} steps/s",
            f"  Dask worker / local worker: {rates[1] / local1:.2f} (goal >= 0.8); 2 workers / 1 worker: "
            f"{rates[2] / rates[1]:.2f}x (goal >= 1.8); cluster start-up with warm pools: "
            f"{starts[1]:.1f} s (1 worker), {starts[2]:.1f} s (2 workers), not counted in the rates"]


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--profile", default="default")
    parser.add_argument("--families", help="comma-separated families instead of the profile's selection")
    parser.add_argument("--no-dask", action="store_true", help="skip the Dask 1- and 2-worker runs")
    args = parser.parse_args()

    overrides = {}
    if args.families:
        overrides = {"profiles": {args.profile: {"families": args.families.split(","), "workloads": None,
                                                 "max_workloads_per_family": 2}}}
    params = load_params(profile=args.profile, overrides=overrides)

    from bench_verify import bench_pool, load_pairs

    from flows.prefect_env import local_server

    with tempfile.TemporaryDirectory(prefix="bench-pipeline-") as tmp, local_server():
        base = Path(tmp) / "base"
        gen = run("generate", params, base / "lake", base / "reports")
        trans = run("transform", params, base / "lake", base / "reports")
        local, result = verify_rate(params, base / "lake", Path(tmp) / "local")
        lines = [
            f"profile {args.profile}: {gen['rows']} programs in {gen['seconds']:.1f} s "
            f"({gen['rows'] / gen['seconds']:.2f} programs/s, translated and verified against PyTorch)",
            f"transform: {trans['rows']} steps in {trans['seconds']:.1f} s "
            f"({trans['rows'] / trans['seconds']:.1f} steps/s)",
            f"verify (local runner, pool of {params.verify['workers']}): {result['verified']} steps in "
            f"{result['seconds']:.1f} s = {local:.2f} verified steps/s",
        ]
        if not args.no_dask:
            lines += dask_lines(params, overrides, args.profile, base / "lake", Path(tmp), local)
    _, pair_rate, _ = bench_pool(load_pairs(), int(params.verify["workers"]))
    lines.append(f"verification benchmark (bench_verify.py pairs, small programs): {pair_rate:.1f} pairs/s; "
                 f"the pipeline's verify stage runs at {local / pair_rate:.2f}x that rate on this profile")
    print("\n".join(lines))
    print(json.dumps({"programs_per_s": gen["rows"] / gen["seconds"], "steps_per_s": trans["rows"] / trans["seconds"],
                      "verified_steps_per_s": local, "pair_rate": pair_rate}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
