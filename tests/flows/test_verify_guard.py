"""The verify stage never replaces a verdict the lake holds with a row it could not compute (a dead
worker, a timeout, a run that failed): it refuses before writing."""
from __future__ import annotations

import pytest

from flows.storage import StorageError, read_table, write_shard
from flows.verify import UncomputedVerifications, refuse_uncomputed


def row(step: str, status: str, target: str = "llvm") -> dict:
    return {"step_id": step, "target": target, "status": status, "max_abs_err": 0.0, "max_rel_err": 0.0,
            "rel_l2_err": 0.0, "draws": 3, "bitwise_equal": status == "exact",
            "error_message": "worker died (signal 9)" if status == "crash" else None, "tvm_version": "0.27"}


def test_a_failure_where_the_lake_holds_a_verdict_is_refused_before_anything_is_written(tmp_path):
    lake = tmp_path / "lake"
    write_shard(lake, "verifications", "fam", [row("s1", "exact"), row("s2", "mismatch")])
    before = (lake / "verifications" / "fam.parquet").read_bytes()
    with pytest.raises(UncomputedVerifications) as refused:
        refuse_uncomputed(lake, [row("s1", "crash"), row("s2", "mismatch")])
    assert isinstance(refused.value, StorageError)  # run/stage report it in one line, exit 1
    message = str(refused.value)
    assert "1 of 2 verifications could not be computed" in message and "step s1 on llvm: crash" in message
    assert "worker died" in message and "nothing was written" in message
    assert (lake / "verifications" / "fam.parquet").read_bytes() == before


@pytest.mark.parametrize("fresh", [
    [row("s3", "crash")],                      # a step the lake has no verdict for: reported as its row
    [row("s1", "crash", target="cuda")],       # another target than the verdict's
    [row("s1", "close"), row("s2", "exact")],  # verdicts replace verdicts
])
def test_new_failures_and_new_verdicts_pass(tmp_path, fresh):
    lake = tmp_path / "lake"
    write_shard(lake, "verifications", "fam", [row("s1", "exact"), row("s2", "mismatch")])
    refuse_uncomputed(lake, fresh)
    assert len(read_table(lake, "verifications")) == 2


def test_an_empty_lake_takes_any_rows(tmp_path):
    refuse_uncomputed(tmp_path / "lake", [row("s1", "crash"), row("s2", "timeout"), row("s3", "runtime_error")])
    assert not (tmp_path / "lake").exists()  # the check reads, it never writes
