"""The storage layer: atomic sorted shards, byte-identical rewrites, the DuckDB catalog, `steptp sql`."""
from __future__ import annotations

import json

import pytest
from typer.testing import CliRunner

from cli.main import app
from flows.storage import StorageError, build_catalog, connect, read_table, write_shard


def program_rows(n):
    return [{"program_id": f"p{i:03d}", "workload": "matmul", "level": "single", "family": "gemm",
             "shape_params": json.dumps({"m": i}), "dtype": "float32", "signature": "{}", "leir": "x",
             "n_nests": 1, "source": "catalogue", "seed": i} for i in range(n)]


def test_shards_are_sorted_by_key_and_byte_identical_on_rewrite(tmp_path):
    rows = program_rows(5)
    first = write_shard(tmp_path, "programs", "gemm", list(reversed(rows))).read_bytes()
    second = write_shard(tmp_path, "programs", "gemm", rows).read_bytes()
    assert first == second
    table = read_table(tmp_path, "programs")
    assert table.column("program_id").to_pylist() == [f"p{i:03d}" for i in range(5)]
    assert table.column_names[:3] == ["program_id", "workload", "level"]
    assert not list((tmp_path / "programs").glob("*.tmp"))


def test_bad_rows_are_refused_and_nothing_is_left_behind(tmp_path):
    with pytest.raises(StorageError, match="duplicate key"):
        write_shard(tmp_path, "programs", "x", program_rows(2) + program_rows(1))
    with pytest.raises(StorageError, match="must not be null"):
        write_shard(tmp_path, "programs", "x", [{"program_id": None}])
    with pytest.raises(StorageError, match="unknown column"):
        write_shard(tmp_path, "programs", "x", [{"program_id": "a", "colour": "red"}])
    with pytest.raises(StorageError, match="unknown table"):
        write_shard(tmp_path, "nope", "x", [])
    assert list((tmp_path / "programs").iterdir()) == []


def test_catalog_views_work_from_anywhere(tmp_path, monkeypatch):
    lake = tmp_path / "lake"
    write_shard(lake, "programs", "a", program_rows(3))
    write_shard(lake, "programs", "b", [r | {"program_id": "q" + r["program_id"]} for r in program_rows(2)])
    build_catalog(lake)
    monkeypatch.chdir(tmp_path.parent)  # relative view paths must not depend on the working directory
    con = connect(lake)
    assert con.execute("SELECT count(*) FROM programs").fetchone() == (5,)
    assert con.execute("SELECT count(*) FROM steps").fetchone() == (0,)  # empty view, typed columns
    assert con.execute("SELECT count(*) FROM steps_verified").fetchone() == (0,)
    con.close()


def test_steps_all_holds_single_steps_and_trajectory_steps(tmp_path):
    def step(step_id, parent, depth):
        return {"step_id": step_id, "program_id": "p0", "parent_step_id": parent, "depth": depth,
                "strategy": "loop_split", "level": "operator"}

    lake = tmp_path / "lake"
    write_shard(lake, "steps", "gemm", [step("s1", None, 1)])
    write_shard(lake, "trajectory_steps", "gemm", [step("t1", None, 1), step("t2", "t1", 2)])
    build_catalog(lake)
    con = connect(lake)
    rows = con.execute("SELECT step_id, parent_step_id, depth FROM steps_all ORDER BY step_id").fetchall()
    assert rows == [("s1", None, 1), ("t1", None, 1), ("t2", "t1", 2)]
    assert con.execute("SELECT count(*) FROM steps").fetchone() == (1,)
    con.close()


def test_sql_command_formats(tmp_path):
    lake = tmp_path / "lake"
    write_shard(lake, "programs", "a", program_rows(3))
    build_catalog(lake)
    runner = CliRunner()
    q = "SELECT program_id, seed FROM programs ORDER BY seed DESC LIMIT 2"
    result = runner.invoke(app, ["sql", q, "--lake", str(lake), "--format", "json"])
    assert result.exit_code == 0, result.output
    assert [json.loads(x) for x in result.stdout.splitlines()] == [{"program_id": "p002", "seed": 2},
                                                                  {"program_id": "p001", "seed": 1}]
    result = runner.invoke(app, ["sql", q, "--lake", str(lake), "--format", "csv"])
    assert result.stdout.splitlines()[0] == '"program_id","seed"'
    result = runner.invoke(app, ["sql", "SELEC nonsense", "--lake", str(lake)])
    assert result.exit_code == 2 and "error" in result.stderr and "Traceback" not in result.output
    result = runner.invoke(app, ["lake", "status", "--lake", str(lake), "--json"])
    assert json.loads(result.stdout)["tables"]["programs"] == {"shards": 1, "rows": 3}
