"""The machine a timing was measured on: recorded with every timing row."""
from __future__ import annotations

import hashlib
import json
import os
import platform
from functools import cache


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


def machine_fingerprint(target: str, name: str | None = None) -> dict:
    """CPU model, logical CPUs, TVM threads, TVM version and target string (and the machine's name:
    `name`, else `STEPTP_MACHINE` where it is set), plus a short `id` (sha256 of the rest) to group
    rows measured under the same conditions."""
    import tvm

    from gpu_tasks.threads import tvm_threads

    facts = {
        "cpu_model": cpu_model(),
        "logical_cpus": os.cpu_count() or 1,
        "tvm_threads": tvm_threads(),
        "tvm_version": tvm.__version__,
        "target": target,
    }
    return with_name(facts, os.environ.get(MACHINE_NAME_ENV) if name is None else name)


def with_name(fingerprint: dict, name: str | None) -> dict:
    """The fingerprint as the machine `name` (none: the CPU facts alone), its `id` computed again: what
    a process that names its machine applies to what its workers report (they may have started
    before the name was set)."""
    facts = {k: v for k, v in fingerprint.items() if k not in ("id", "machine")}
    if name:
        facts["machine"] = name
    digest = hashlib.sha256(json.dumps(facts, sort_keys=True).encode()).hexdigest()[:16]
    return {**facts, "id": digest}
