"""Compile, run, compare and time LEIR programs on a target (CPU llvm by default, CUDA with a GPU).

Modules, from the public API down:
- `verify`: `verify_pair`, `verify_pairs`, `verify_against_reference` (the `Verification` of
  `verification`); `timing`: `time_pair`, `iter_time_pairs`;
- `pool`: worker processes with per-job time limits (crash and hang isolation);
- `jobs`: what a worker does for one request (parse, guard, build, run, compare);
- `inputs` (seeded draws), `compare` (metrics and verdict), `tolerances`, `guard` (size limits),
  `cache` (build cache), `runner` (tensors in, outputs out), `fingerprint`, `machine_lock`, `threads`,
  `worker_env` (fork server set-up), `testing` (misbehaving jobs for the pool tests).

Importing the package imports nothing heavy: TVM loads with the modules that need it.
"""
