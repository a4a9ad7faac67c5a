"""Search drivers against TVM's MetaSchedule on medium-sized programs (issue 8).

For each program (a PyTorch module translated to LEIR): the library policy's search with each
driver (speedup = naive time / best state time, both measured in the same session by our timing
protocol), then TVM's MetaSchedule-tuned kernels of the same module (`gpu_tasks/metaschedule.py`,
each tuned kernel timed alone, the comparable figure) and PyTorch eager.

Baseline named: MetaSchedule with `--trials` trials. The ratio printed is MetaSchedule's kernel time
over our best state's time (> 1: the search beat MetaSchedule). There is no goal: the published
paper reports search reaching a share of the tuned limit, and this prints where we stand.
Slow: about 3 minutes per program on 2 cores with the defaults.
"""
from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

import torch  # noqa: E402


class Matmul(torch.nn.Module):
    def forward(self, a, b):
        return a @ b


class Softmax(torch.nn.Module):
    def forward(self, x):
        return torch.softmax(x, dim=-1)


class LinearRelu(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.fc = torch.nn.Linear(128, 64)

    def forward(self, x):
        return torch.relu(self.fc(x))


def programs() -> dict[str, tuple[torch.nn.Module, list[torch.Tensor]]]:
    g = torch.Generator().manual_seed(0)
    torch.manual_seed(0)
    return {"matmul_128": (Matmul(), [torch.randn(128, 128, generator=g), torch.randn(128, 128, generator=g)]),
            "softmax_64x512": (Softmax(), [torch.randn(64, 512, generator=g)]),
            "linear_relu_64x128x64": (LinearRelu().eval(), [torch.randn(64, 128, generator=g)])}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--programs", nargs="*", default=["matmul_128", "softmax_64x512"],
                    help=f"some of {', '.join(programs())}")
    ap.add_argument("--drivers", nargs="*", default=["greedy", "beam", "mcts"])
    ap.add_argument("--budget", type=int, default=16, help="states verified per search")
    ap.add_argument("--trials", type=int, default=64, help="MetaSchedule trials per program")
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args()

    from flows.search import torch_eager_us
    from gpu_tasks.metaschedule import metaschedule_times
    from leir.frontend import translate
    from search.drivers import Budget, DriverConfig
    from search.runner import Pools, run_search

    rows = []
    with Pools() as pools:
        for name in args.programs:
            module, inputs = programs()[name]
            tr = translate(module, inputs)
            row = {"program": name, "drivers": {}}
            for driver in args.drivers:
                t0 = time.perf_counter()
                r = run_search(tr.program, tr.signature, driver, "library", Budget(args.budget, 900.0), 0,
                               config=DriverConfig(iterations=args.budget * 2), pools=pools, as_result=True)
                row["drivers"][driver] = {"speedup": round(r.best.speedup, 3), "naive_us": r.best.root_us,
                                          "best_us": r.best.root_us / r.best.speedup,
                                          "strategies": r.strategies(), "wall_s": round(time.perf_counter() - t0, 1)}
            row["naive_us"] = statistics.median(d["naive_us"] for d in row["drivers"].values())
            row["best_search_us"] = min(d["best_us"] for d in row["drivers"].values())
            row["torch_eager_us"] = torch_eager_us(module, inputs)
            t0 = time.perf_counter()
            row.update(metaschedule_times(module, inputs, args.trials))
            row["metaschedule_wall_s"] = round(time.perf_counter() - t0, 1)
            row["metaschedule_over_best_search"] = row["metaschedule_us"] / row["best_search_us"]
            row["metaschedule_over_naive"] = row["metaschedule_us"] / row["naive_us"]
            rows.append(row)
            if not args.json:
                speedups = ", ".join(f"{d} {v['speedup']:.2f}x" for d, v in row["drivers"].items())
                print(f"{name}: search speedup over naive: {speedups}; naive {row['naive_us']:.1f} us, "
                      f"best {row['best_search_us']:.1f} us; MetaSchedule ({args.trials} trials) "
                      f"{row['metaschedule_us']:.1f} us per kernel sum, {row['metaschedule_vm_us']:.1f} us via VM; "
                      f"PyTorch eager {row['torch_eager_us']:.1f} us; ratio MetaSchedule/best search "
                      f"{row['metaschedule_over_best_search']:.3f} (naive: {row['metaschedule_over_naive']:.3f})",
                      flush=True)
    if args.json:
        print(json.dumps(rows, indent=1, default=str))
    return 0


if __name__ == "__main__":
    sys.exit(main())
