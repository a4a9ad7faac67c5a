"""The fast-math forms of a vector loop, built and timed in one process: mish's nest (256x768 float32,
one core) with the library's exp and log, with `fast_exp` around the library's log (`exp: fast`), and
with `fast_log` nested in `fast_exp` (`math: fast`, what the search's row kernel asks for where a nest
calls log or erf); then the build time of nested fast forms by depth.

    .venv/bin/python benchmarks/bench_fast_forms.py [--rounds 15]

Prints each variant's build seconds, its largest absolute error against float64 mish, its median µs per call
over interleaved rounds, and the ratio against the library's exp and log (the baseline)."""
from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

SIG = {"tensors": [{"name": "A", "shape": [256, 768], "dtype": "float32", "role": "input"},
                   {"name": "C", "shape": [256, 768], "dtype": "float32", "role": "output"}]}
A = "A^{f32,g}_{tx,c*16+a}"


def mish(exp: str, log: str) -> str:
    """Mish as the translation writes it (softplus clamped to [-20, 20], tanh from two exps into the
    intermediates E and F) in a vector loop of 16 lanes."""
    sp = f"min(max({log}(1+{exp}({A})),-20),20)"
    e, f = A.replace("A^", "E^"), A.replace("A^", "F^")
    return (f"B^{{256}}_{{tx=0}}L^{{48}}_{{c=0}}V^{{16}}_{{a=0}}[{e}={exp}({sp});{f}={exp}(-{sp});"
            f"C^{{f32,g}}_{{tx,c*16+a}}={A}*(({e}-{f})/({e}+{f}));];")


def nested(depth: int) -> str:
    """`fast_exp(1+fast_log(1+fast_exp(...)))`, `depth` fast forms deep, in a loop of 16 lanes."""
    e = A
    for k in reversed(range(depth)):
        e = f"{'fast_exp' if k % 2 == 0 else 'fast_log'}(1+{e})"
    return f"B^{{256}}_{{tx=0}}L^{{48}}_{{c=0}}V^{{16}}_{{a=0}}[C^{{f32,g}}_{{tx,c*16+a}}={e};];"


def build(text: str):
    from gpu_tasks.cache import TIMING_PASS_CONFIG, BuildCache
    from leir.parse import parse_program
    from leir.signature import Signature

    start = time.perf_counter()
    built = BuildCache(pass_config=TIMING_PASS_CONFIG).build(parse_program(text), Signature.from_json(SIG))
    return built, time.perf_counter() - start


def main() -> None:
    import tvm

    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=15, help="interleaved timing rounds (default 15)")
    args = parser.parse_args()
    from gpu_tasks.fingerprint import machine_fingerprint

    print(f"machine: {machine_fingerprint('llvm').get('cpu_model')}, one core")
    variants = {"library exp, log": mish("exp", "log"), "exp: fast": mish("fast_exp", "log"),
                "math: fast": mish("fast_exp", "fast_log")}
    x = np.linspace(-8, 8, 256 * 768, dtype=np.float32).reshape(256, 768)
    want = x * np.tanh(np.log1p(np.exp(x.astype(np.float64))))
    timers = {}
    from leir.lower.api import lower_to_script

    for name, text in variants.items():
        assert "T.vectorized(16)" in lower_to_script(text, SIG), "the loop should stay a vector loop"
        built, seconds = build(text)
        a, c = tvm.runtime.tensor(x), tvm.runtime.empty((256, 768), "float32")
        built.executable["main"](a, c)
        err = float(np.max(np.abs(c.numpy() - want)))
        timers[name] = (built.executable.mod.time_evaluator("main", tvm.cpu(), number=10, repeat=1,
                                                             min_repeat_ms=20), a, c)
        print(f"{name:17s} build {seconds:6.2f} s, largest absolute error {err:.1e} (mish is within [-0.31, 8])")
    samples: dict[str, list[float]] = {k: [] for k in timers}
    for r in range(args.rounds):
        for name in (list(timers) if r % 2 == 0 else list(timers)[::-1]):
            evaluate, a, c = timers[name]
            samples[name].append(evaluate(a, c).mean * 1e6)
    base = float(np.median(samples["library exp, log"]))
    for name, s in samples.items():
        median = float(np.median(s))
        print(f"{name:17s} {median:9.1f} µs per call, {base / median:5.2f}x the library's exp and log")
    for depth in (1, 2, 3, 4):
        _, seconds = build(nested(depth))
        print(f"nested fast forms, depth {depth}: build {seconds:.3f} s")


if __name__ == "__main__":
    main()
