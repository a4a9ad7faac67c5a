"""The machine's float32 multiply-add peak, measured (the ceiling a matmul or conv2d kernel can reach).

A C loop of 12 independent vector FMA chains per thread (the register width of the host, `-march=native`:
512 bits with AVX-512, else 256), compiled by gcc with OpenMP and run in its own process, best of five
runs. No load, no store, no dependence between chains: what the FMA units retire per second, which is
what `bench_search` compares the best matmul and conv2d kernels against. Needs gcc; without it the
peak is unknown (None) and the benchmark reports no share of it.

    python benchmarks/fma_peak.py          # G float multiply-adds per second on 1 thread and every core
"""
from __future__ import annotations

import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

SOURCE = r"""
#include <omp.h>
#include <stdio.h>
#ifdef __AVX512F__
#define BYTES 64
#else
#define BYTES 32
#endif
typedef float vec __attribute__((vector_size(BYTES)));
#define LANES (BYTES / 4)
int main(void) {
  const long iters = 20000000L;
  double best = 0;
  for (int rep = 0; rep < 5; rep++) {
    double t0 = omp_get_wtime();
    float sink = 0;
#pragma omp parallel reduction(+:sink)
    {
      vec a[12], b, c;
      for (int l = 0; l < LANES; l++) { b[l] = 1.0000001f; c[l] = 1e-7f; }
      for (int i = 0; i < 12; i++) for (int l = 0; l < LANES; l++) a[i][l] = (float)i;
      for (long n = 0; n < iters; n++) {
#pragma GCC unroll 12
        for (int i = 0; i < 12; i++) a[i] = a[i] * b + c;
      }
      for (int i = 0; i < 12; i++) for (int l = 0; l < LANES; l++) sink += a[i][l];
    }
    double macs = (double)omp_get_max_threads() * iters * 12.0 * LANES;
    double rate = macs / (omp_get_wtime() - t0) / 1e9;
    if (rate > best) best = rate;
    if (sink == 12345.0f) printf("#");
  }
  printf("%.3f\n", best);
  return 0;
}
"""


def measure_gmacs(threads: int) -> float | None:
    """Float32 multiply-adds per second (G) on `threads` OpenMP threads; None without gcc or if it fails."""
    gcc = shutil.which("gcc")
    if gcc is None:
        return None
    with tempfile.TemporaryDirectory() as tmp:
        src, exe = Path(tmp) / "peak.c", Path(tmp) / "peak"
        src.write_text(SOURCE)
        built = subprocess.run([gcc, "-O2", "-march=native", "-ffp-contract=fast", "-fopenmp", str(src),
                                "-o", str(exe)], capture_output=True, text=True)
        if built.returncode != 0:
            return None
        env = {**os.environ, "OMP_NUM_THREADS": str(threads), "OMP_PROC_BIND": "spread"}
        ran = subprocess.run([str(exe)], capture_output=True, text=True, env=env, timeout=120)
        if ran.returncode != 0:
            return None
        return float(ran.stdout.split()[-1])


def main() -> int:
    cores = os.cpu_count() or 1
    one, every = measure_gmacs(1), measure_gmacs(cores)
    if one is None or every is None:
        print("fma_peak: no gcc with OpenMP here; the peak is unknown")
        return 0
    print(f"float32 multiply-add peak: {one:.1f} G/s on 1 thread, {every:.1f} G/s on {cores} threads "
          f"(ratio {every / one:.2f})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
