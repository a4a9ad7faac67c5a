"""The machine a timing was measured on: recorded with every timing row."""
from __future__ import annotations

import hashlib
import json
import os
import platform
from functools import cache

import tvm

from gpu_tasks.threads import tvm_threads


@cache
def cpu_model() -> str:
    try:
        with open("/proc/cpuinfo", encoding="utf-8") as f:
            for line in f:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine() or "unknown"


# A name for this machine where the CPU facts cannot tell machines apart: separate processes of one
# host that stand for the machines of a cluster (a rehearsal), or two hosts of the same model whose
# timings should stay apart. Unset: the facts alone (and the ids of every earlier timing) as before.
MACHINE_NAME_ENV = "STEPTP_MACHINE"


def machine_fingerprint(target: str) -> dict:
    """CPU model, logical CPUs, TVM threads, TVM version and target string (and the machine's name,
    `STEPTP_MACHINE`, where one is set), plus a short `id` (sha256 of the rest) to group rows
    measured under the same conditions."""
    facts = {
        "cpu_model": cpu_model(),
        "logical_cpus": os.cpu_count() or 1,
        "tvm_threads": tvm_threads(),
        "tvm_version": tvm.__version__,
        "target": target,
    }
    if os.environ.get(MACHINE_NAME_ENV):
        facts["machine"] = os.environ[MACHINE_NAME_ENV]
    digest = hashlib.sha256(json.dumps(facts, sort_keys=True).encode()).hexdigest()[:16]
    return {**facts, "id": digest}
