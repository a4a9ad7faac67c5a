"""A `steptp translate` batch of 200 KernelBench-style problem files with four hostile ones among them:
a file that hangs, one that calls `os._exit(3)`, one that segfaults (ctypes) and one that
allocates 50 x 1 GiB. The batch must end with 204 records, in order, the four naming their causes
(timeout, exit, signal, memory), within the files' time limits.

The 200 files: the problem files of tests/data/kernelbench (one copy each) and KernelBench-style files
made from templates (an operator of a model family, at batch and feature sizes of a grid), written to
a temporary folder; the hostile ones go at fixed places among them.

Baseline: the time limit. Every file runs under `--timeout`: the hanging file costs one limit and
holds nothing else up (the other worker goes on), the others take seconds; the wall time is printed
in limits. `--strict` exits 1 when a record is missing, out of order, or a cause is wrong.
"""
from __future__ import annotations

import argparse
import itertools
import json
import random
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
PROBLEMS = ROOT / "tests" / "data" / "kernelbench"
STEPTP = Path(sys.executable).parent / "steptp"

TEMPLATE = '''import torch
import torch.nn as nn


class Model(nn.Module):
    """{title}"""

    def __init__(self):
        super().__init__()

    def forward(self, x, y):
        return {expression}


batch_size = {batch}
dim = {dim}


def get_inputs():
    x = torch.randn(batch_size, dim)
    y = torch.randn(dim, dim)
    return [x, y]


def get_init_inputs():
    return []
'''

OPERATORS = {
    "relu": "torch.relu(x)", "sigmoid": "torch.sigmoid(x)", "tanh": "torch.tanh(x)",
    "softmax": "torch.softmax(x, dim=1)", "log_softmax": "torch.log_softmax(x, dim=1)",
    "sum": "x.sum(dim=1)", "mean": "x.mean(dim=1)", "max": "x.max(dim=1).values", "gelu": "nn.functional.gelu(x)",
    "affine": "x * 2.0 + 1.0", "exp": "torch.exp(x)", "abs": "torch.abs(x)", "cumsum": "torch.cumsum(x, dim=1)",
    "matmul": "x @ y", "matmul_relu": "torch.relu(x @ y)", "residual": "x + x @ y",
}
BATCHES = (2, 4, 8, 16)
DIMS = (8, 16, 32, 64, 128)

HOSTILE = {
    "hang": ("while True:\n    pass\n", "timeout"),
    "exit": ("import os\nos._exit(3)\n", "exit"),
    "segfault": ("import ctypes\nctypes.string_at(0)\n", "signal"),
    "memory": ("import torch\nblocks = [torch.ones(1 << 28) for _ in range(50)]\n", "memory"),
}


def make_batch(folder: Path, n_good: int = 200, seed: int = 0) -> tuple[list[Path], dict[str, str]]:
    """The files of the batch (the good ones, with the hostile ones among them) and the cause each
    hostile file's record must name, by file name."""
    good = []
    for src in sorted(PROBLEMS.glob("*.py")):
        if len(good) < n_good:
            path = folder / f"kb_{src.name}"
            path.write_text(src.read_text())
            good.append(path)
    grid = list(itertools.product(sorted(OPERATORS), BATCHES, DIMS))
    random.Random(seed).shuffle(grid)
    for name, batch, dim in grid[:max(0, n_good - len(good))]:
        path = folder / f"gen_{name}_{batch}x{dim}.py"
        path.write_text(TEMPLATE.format(title=f"{name} of a {batch}x{dim} input", expression=OPERATORS[name],
                                        batch=batch, dim=dim))
        good.append(path)
    files, causes = list(good), {}
    for k, (name, (code, cause)) in enumerate(HOSTILE.items()):
        path = folder / f"hostile_{name}.py"
        path.write_text(code)
        files.insert((k + 1) * len(good) // (len(HOSTILE) + 1) + k, path)
        causes[path.name] = cause
    return files, causes


def run_batch(files: list[Path], timeout: float, memory: int, workers: int) -> tuple[list[dict], float, int]:
    start = time.monotonic()
    done = subprocess.run([str(STEPTP), "translate", *map(str, files), "--timeout", str(timeout), "--memory",
                           str(memory), "--workers", str(workers)], capture_output=True, text=True)
    wall = time.monotonic() - start
    records = [json.loads(line) for line in done.stdout.splitlines()]
    return records, wall, done.returncode


def check(files: list[Path], causes: dict[str, str], records: list[dict]) -> list[str]:
    """What is wrong with the batch's records (nothing: [])."""
    problems = []
    if [r["file"] for r in records] != [str(f) for f in files]:
        problems.append(f"{len(records)} records for {len(files)} files, or out of order")
    for r in records:
        name = Path(r["file"]).name
        if name in causes and r.get("cause") != causes[name]:
            problems.append(f"{name}: cause {r.get('cause')!r}, expected {causes[name]!r} ({r['error']})")
    return problems


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--files", type=int, default=200, help="good problem files (the hostile four come on top)")
    ap.add_argument("--timeout", type=float, default=60.0, help="--timeout of each file")
    ap.add_argument("--memory", type=int, default=2048, help="--memory of each file (MiB)")
    ap.add_argument("--workers", type=int, default=2)
    ap.add_argument("--strict", action="store_true")
    args = ap.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        files, causes = make_batch(Path(tmp), args.files)
        records, wall, code = run_batch(files, args.timeout, args.memory, args.workers)
    problems = check(files, causes, records)
    ok = sum(r["ok"] for r in records)
    print(f"files: {len(files)} ({args.files} good + {len(causes)} hostile), records: {len(records)}, exit {code}")
    print(f"ok: {ok}; failed good files: {len(records) - ok - len(causes)}; hostile causes: "
          + ", ".join(f"{Path(r['file']).stem.removeprefix('hostile_')}={r.get('cause')}" for r in records
                      if Path(r["file"]).name in causes))
    print(f"wall: {wall:.1f} s with {args.workers} workers ({wall / len(files):.2f} s per file); --timeout "
          f"{args.timeout:g} s per file: the hanging file cost its limit, the batch {wall / args.timeout:.1f} limits")
    for p in problems:
        print(f"PROBLEM: {p}")
    return 1 if args.strict and problems else 0


if __name__ == "__main__":
    sys.exit(main())
