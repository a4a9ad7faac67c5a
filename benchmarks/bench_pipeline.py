"""The pipeline's throughput on a profile: programs/s generated, steps/s transformed, verified steps/s,
next to the verification benchmark's pair rate (bench_verify.py), and the verify stage on a local Dask
cluster of 1 and of 2 workers (the scale-out ratio).

Each verify run starts from the same generated lake copied to a folder of its own, so no run reuses
another's verification rows; every stage runs as the pipeline runs it (`run_stage`, one Prefect
server for all). The Dask runs give each worker a verification pool of one process, so that the
number of verifying processes is the number of workers.

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

    from flows.pipeline import dask_runner
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
            single = load_params(profile=args.profile, overrides={**overrides, "verify": {"workers": 1}})
            rates = {n: verify_rate(single, base / "lake", Path(tmp) / f"dask{n}", dask_runner(None, n))[0]
                     for n in (1, 2)}
            lines.append(f"verify on a local Dask cluster: 1 worker {rates[1]:.2f} steps/s, 2 workers "
                         f"{rates[2]:.2f} steps/s, ratio {rates[2] / rates[1]:.2f}x")
    _, pair_rate, _ = bench_pool(load_pairs(), int(params.verify["workers"]))
    lines.append(f"verification benchmark (bench_verify.py pairs, small programs): {pair_rate:.1f} pairs/s; "
                 f"the pipeline's verify stage runs at {local / pair_rate:.2f}x that rate on this profile")
    print("\n".join(lines))
    print(json.dumps({"programs_per_s": gen["rows"] / gen["seconds"], "steps_per_s": trans["rows"] / trans["seconds"],
                      "verified_steps_per_s": local, "pair_rate": pair_rate}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
