"""How steady this machine's CPU is, before trusting a timing taken on it:
`python benchmarks/bench_host.py [--seconds 30] [--cores 0 1]`.

A fixed pure-Python loop (no memory traffic, no threads, about 2 ms at full speed) is timed back to
back, pinned to each core in turn. On a machine of its own every sample is within a few percent of
the fastest. On a shared VM the host's other tenants show up as a second speed: a 2-core AMD EPYC VM
ran the loop at 9.3 ms or 17.5 ms (per 300,000 iterations) in stretches of a fraction of a second to
more than 10 s, and PyTorch's float32 exp followed it (720 or 960 µs). A figure timed in one stretch
and re-timed in another then differs by up to 1.4x, which is why gpu_tasks/torch_timing.py times each
figure in several windows spread over its process and keeps the fastest.

Prints, per core: the samples' quantiles over the fastest (the baseline), the share of samples slower
than SLOW x the fastest, and the longest run of such samples in seconds.
"""
from __future__ import annotations

import argparse
import os
import statistics
import time

SLOW = 1.3  # a sample this much slower than the fastest is in the slow speed
ITERATIONS = 60_000


def sample() -> float:
    """Seconds for ITERATIONS multiply-adds of Python integers."""
    start = time.perf_counter()
    total = 0
    for i in range(ITERATIONS):
        total += i * i
    return time.perf_counter() - start


def series(seconds: float) -> list[tuple[float, float]]:
    """(time since the start, the sample's seconds) for `seconds`."""
    out, t0 = [], time.perf_counter()
    while (now := time.perf_counter()) - t0 < seconds:
        out.append((now - t0, sample()))
    return out


def longest_slow(points: list[tuple[float, float]], limit: float) -> float:
    """The longest stretch, in seconds, of consecutive samples above `limit`."""
    best, start = 0.0, None
    for t, s in points:
        if s > limit:
            start = t if start is None else start
            best = max(best, t + s - start)
        else:
            start = None
    return best


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--seconds", type=float, default=30.0, help="seconds of samples per core (default 30)")
    ap.add_argument("--cores", type=int, nargs="*", help="the cores to pin to in turn (default: every core "
                    "this process may run on)")
    args = ap.parse_args()
    allowed = sorted(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else [None]
    cores = args.cores if args.cores else allowed
    print(f"{ITERATIONS:,} Python multiply-adds per sample, {args.seconds:g} s per core; "
          f"slow: above {SLOW}x the fastest sample")
    for core in cores:
        if core is not None:
            os.sched_setaffinity(0, {core})
        sample()  # warm-up
        points = series(args.seconds)
        times = [s for _, s in points]
        fastest = min(times)
        q = statistics.quantiles(times, n=20)
        slow = sum(s > SLOW * fastest for s in times) / len(times)
        print(f"core {core}: {len(times)} samples, fastest {fastest * 1e3:.2f} ms; over the fastest: "
              f"median {statistics.median(times) / fastest:.2f}x, p75 {q[14] / fastest:.2f}x, "
              f"p95 {q[18] / fastest:.2f}x; {slow:.0%} slow, longest slow stretch "
              f"{longest_slow(points, SLOW * fastest):.1f} s")
    if hasattr(os, "sched_setaffinity"):
        os.sched_setaffinity(0, allowed)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
