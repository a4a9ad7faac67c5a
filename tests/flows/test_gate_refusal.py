"""A refusal reads as a refusal (issue 15): `steptp stage validate` on a lake that fails the Great
Expectations gate prints the failed expectations and exits 1, without a Python traceback and without
Prefect's "Error logging to API" from a server that went away; `reports/gate.json` says why.

Run as a user runs it: a subprocess that starts its own Prefect server."""
from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

from test_filtering import tables

from flows.config import ROOT, load_params
from flows.filtering import assemble_samples, select_steps
from flows.storage import write_shard


def _refused_lake(lake):
    """A lake whose release would hold one strategy only: the gate's share and coverage checks fail."""
    params = load_params(overrides={"filter": {"multi_answer_fraction": 0.0, "test_fraction": 0.34}})
    programs, steps, verifs = tables()
    kept, _ = select_steps(programs, steps, verifs, params)
    samples, _ = assemble_samples(kept, programs, params, count_tokens=len)
    one_strategy = [s for s in samples if json.loads(s["strategies"]) == ["loop_split"]]
    for name, rows in (("programs", programs.to_pylist()), ("steps", steps.to_pylist()),
                       ("verifications", verifs.to_pylist()), ("samples", one_strategy)):
        write_shard(lake, name, "all", rows)


def _stage_validate(lake: Path, reports: Path) -> subprocess.CompletedProcess:
    """`steptp stage validate` in its own process, without a Prefect API server."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("PREFECT_API")}
    return subprocess.run([str(Path(sys.executable).with_name("steptp")), "stage", "validate", "--lake", str(lake),
                           "--reports", str(reports)], cwd=ROOT, env=env, capture_output=True, text=True, timeout=300)


def test_stage_validate_refusal_prints_the_failed_expectations_and_exits_1(tmp_path):
    lake, reports = tmp_path / "lake", tmp_path / "reports"
    _refused_lake(lake)
    result = _stage_validate(lake, reports)
    out = result.stdout + result.stderr
    assert result.returncode == 1, out
    assert "Traceback" not in out and "Error logging to API" not in out and "connection" not in out.lower(), out
    assert "error: release refused by the gate:" in result.stderr
    gate = json.loads((reports / "gate.json").read_text())
    assert gate["success"] is False and gate["failures"]
    for failure in gate["failures"]:  # every failed expectation is printed
        assert failure.split(":")[0] in result.stderr


def test_a_steps_shard_that_schedules_a_loop_of_one_iteration_is_refused(tmp_path):
    """Issue 24: no released step parallelises, vectorises, unrolls or binds a loop of extent 1; the
    gate reads the lake's shards as the validate stage does and refuses such a shard."""
    from expectations.release_gate import check_release
    from flows.lake_queries import release_inputs
    from flows.storage import read_table

    lake = tmp_path / "lake"
    params = load_params(overrides={"filter": {"multi_answer_fraction": 0.0, "test_fraction": 0.34,
                                               "max_strategy_share": 1.0}})
    programs, steps, verifs = tables()
    rows = steps.to_pylist()
    from leir.ast import Loop, Nest, Program
    from leir.parse import parse_program
    from leir.printer import format_program

    after = parse_program(rows[0]["after_leir"])
    nest = after.nests[0]
    rows[0]["after_leir"] = format_program(Program((Nest((Loop("P", 1, "d"), *nest.loops), nest.body),
                                                    *after.nests[1:])))
    for name, table_rows in (("programs", programs.to_pylist()), ("steps", rows), ("verifications", verifs.to_pylist())):
        write_shard(lake, name, "all", table_rows)
    kept, _ = select_steps(programs, read_table(lake, "steps"), verifs, params)
    samples, _ = assemble_samples(kept, programs, params, count_tokens=len)
    write_shard(lake, "samples", "all", samples)
    released, producible = release_inputs(lake, params)
    assert rows[0]["step_id"] in released.column("step_id").to_pylist()
    report = check_release(read_table(lake, "samples").to_pandas(), released.to_pandas(), producible, params)
    assert not report.success
    assert any(f.startswith("steps.unit_loop_scheduled") for f in report.failures), report.failures


def test_a_shard_that_lost_a_column_is_refused_by_name_not_read_as_nulls(tmp_path):
    """Issue 43: a `steps` shard without its `after_leir` column was read as nulls (pyarrow fills a
    column the file lacks) and passed the gate with no LEIR; now the stage names the file and the
    columns and exits 1 (Prefect still logs the flow's traceback; the CLI's last word is the message)."""
    import pyarrow.parquet as pq

    lake, reports = tmp_path / "lake", tmp_path / "reports"
    _refused_lake(lake)
    shard = lake / "steps" / "all.parquet"
    table = pq.read_table(shard)
    pq.write_table(table.drop_columns(["after_leir"]), shard)
    result = _stage_validate(lake, reports)
    out = result.stdout + result.stderr
    assert result.returncode == 1, out
    assert f"{shard}: shard of table 'steps' lacks column(s) after_leir" in result.stderr, out
    assert not (reports / "gate.json").exists()
