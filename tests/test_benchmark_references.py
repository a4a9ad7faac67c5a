"""benchmarks/bench_references.py counts the figures the search stage's re-times would refuse, with the
stage's own rule (flows.search.checked_references): a benchmark that counted by an older rule would
report a protocol the stage no longer runs."""
from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "benchmarks"))

import bench_references  # noqa: E402


def test_refusals_are_counted_over_all_the_re_times_and_never_for_spread():
    first = {"a": {"torch_eager_us": 40.0, "torch_eager_spread": 0.1},
             "b": {"torch_eager_us": 40.0, "torch_eager_spread": 0.1},
             "c": {"torch_eager_us": 40.0, "torch_eager_spread": 0.9},    # its own spread: not the re-time's
             "d": {"torch_eager_us": 40.0, "torch_eager_spread": 0.1},
             "gone": "ValueError: no module"}
    slow, again = {"torch_eager_us": 60.0}, {"torch_eager_us": 42.0}
    retimes = {"a": [slow, again], "b": [slow, slow, slow], "c": [slow], "d": ["timing process: killed"]}
    assert bench_references.refused(first, retimes) == 2  # b (never confirmed) and d (no re-time)
    assert bench_references.refused(first, {pid: r[:1] for pid, r in retimes.items()}) == 3  # one re-time: a too
    assert bench_references.refused(first, {}) == 3  # nothing re-timed: every figure but c's
