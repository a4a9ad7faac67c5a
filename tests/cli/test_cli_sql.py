"""`steptp sql` can only read the lake (issue 28, finding 1): the attacks of the issue, each refused with
one line on stderr and exit 2, and nothing written anywhere."""
from __future__ import annotations

import json

import duckdb
import pytest
from typer.testing import CliRunner

from cli.main import app
from flows.storage import build_catalog, read_only_connection, write_shard


def _rows(n: int) -> list[dict]:
    return [{"program_id": f"p{i}", "workload": "matmul", "seed": i} for i in range(n)]


@pytest.fixture
def lake(tmp_path, monkeypatch):
    monkeypatch.setenv("HOME", str(tmp_path / "home"))  # where DuckDB would install extensions
    (tmp_path / "home").mkdir()
    monkeypatch.chdir(tmp_path)
    write_shard(tmp_path / "lake", "programs", "a", _rows(3))
    build_catalog(tmp_path / "lake")
    return tmp_path / "lake"


def _files(root) -> dict[str, bytes]:
    return {str(p.relative_to(root)): p.read_bytes() for p in sorted(root.rglob("*")) if p.is_file()}


def _sql(query: str, *args: str):
    return CliRunner().invoke(app, ["sql", query, *args])


def _refused(result, word: str) -> None:
    assert result.exit_code == 2, result.output
    lines = result.stderr.splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: ") and word in lines[0], lines
    assert "Traceback" not in result.output and result.stdout == ""


def test_queries_read_every_view(lake):
    result = _sql("SELECT program_id FROM programs ORDER BY seed", "--lake", str(lake), "--format", "json")
    assert result.exit_code == 0, result.output
    assert [json.loads(x)["program_id"] for x in result.stdout.splitlines()] == ["p0", "p1", "p2"]
    for query in ("SELECT count(*) AS n FROM steps_verified", "DESCRIBE programs", "SHOW TABLES",
                  "WITH x AS (SELECT 1 AS n) FROM x", "SELECT 1 AS a; SELECT 2 AS b"):
        result = _sql(query, "--lake", str(lake), "--format", "json")
        assert result.exit_code == 0, (query, result.output)
    assert json.loads(result.stdout) == {"b": 2}  # several queries: the last one's result


def test_the_attach_chain_cannot_replace_a_catalog_view(lake, tmp_path):
    before = _files(tmp_path)
    attack = ("ATTACH 'x.duckdb' AS e (READ_WRITE); USE e; DETACH catalog; ATTACH 'lake/catalog.duckdb' AS c2 "
              "(READ_WRITE); CREATE OR REPLACE VIEW c2.main.programs AS SELECT 'pwned' AS program_id")
    _refused(_sql(attack, "--lake", str(lake)), "ATTACH")
    assert _files(tmp_path) == before and not (tmp_path / "x.duckdb").exists()
    # every statement of the chain on its own is refused as well
    for statement, word in (("USE memory", "USE"), ("DETACH catalog", "DETACH"),
                            ("CREATE OR REPLACE VIEW programs AS SELECT 'pwned' AS program_id", "CREATE"),
                            ("SELECT 1; DETACH catalog", "DETACH")):
        _refused(_sql(statement, "--lake", str(lake)), word)
    result = _sql("SELECT min(program_id) AS p FROM programs", "--lake", str(lake), "--format", "json")
    assert json.loads(result.stdout) == {"p": "p0"}
    con = duckdb.connect(str(lake / "catalog.duckdb"), read_only=True)  # what other readers see
    con.execute(f"SET file_search_path = '{lake}'")
    assert con.execute("SELECT count(*) FROM programs WHERE program_id = 'pwned'").fetchone() == (0,)
    con.close()


@pytest.mark.parametrize("target", ["lake/programs/evil.parquet", "elsewhere.parquet", "/tmp/../tmp/steptp-x.csv"])
def test_copy_writes_no_file(lake, tmp_path, target):
    before = _files(tmp_path)
    _refused(_sql(f"COPY (SELECT 'pwned' AS program_id) TO '{target}'", "--lake", str(lake)), "COPY")
    assert _files(tmp_path) == before
    result = _sql("SELECT count(*) AS n FROM programs", "--lake", str(lake), "--format", "json")
    assert json.loads(result.stdout) == {"n": 3}


@pytest.mark.parametrize("statement,word", [("INSTALL httpfs", "INSTALL"), ("LOAD httpfs", "LOAD"),
                                            ("EXPORT DATABASE 'dump'", "EXPORT"), ("SET threads = 1", "SET"),
                                            ("SET enable_external_access = true", "SET"), ("RESET threads", "RESET"),
                                            ("CALL pragma_version()", "CALL"), ("PRAGMA show_tables", "PRAGMA"),
                                            ("EXPLAIN ANALYZE COPY (SELECT 1) TO 'x.csv'", "EXPLAIN")])
def test_extensions_exports_and_settings_are_refused(lake, tmp_path, statement, word):
    before = _files(tmp_path)
    _refused(_sql(statement, "--lake", str(lake)), word)
    assert _files(tmp_path) == before and list((tmp_path / "home").iterdir()) == []  # no ~/.duckdb


def test_duckdb_itself_allows_only_the_shard_files(lake, tmp_path):
    """Beyond the statement check: the connection's own settings refuse files other than the shards
    (for reading too), writing even inside the lake, extensions, and any configuration change."""
    (tmp_path / "secret.csv").write_text("a\n1\n")
    _refused(_sql(f"SELECT * FROM read_csv('{tmp_path / 'secret.csv'}')", "--lake", str(lake)), "Permission")
    con = read_only_connection(lake)
    try:
        assert con.execute("SELECT count(*) FROM programs").fetchone() == (3,)
        for statement in (f"COPY (SELECT 1) TO '{lake / 'programs' / 'new.parquet'}'",
                          f"ATTACH '{lake / 'new.duckdb'}' AS n", "LOAD httpfs"):
            with pytest.raises(duckdb.Error, match="disabled"):
                con.execute(statement)
        with pytest.raises(duckdb.Error, match="locked"):
            con.execute("SET enable_external_access = true")
        settings = dict(con.execute("SELECT name, value FROM duckdb_settings() WHERE name IN "
                                    "('enable_external_access', 'lock_configuration', 'autoinstall_known_extensions', "
                                    "'autoload_known_extensions')").fetchall())
        assert settings == {"enable_external_access": "false", "lock_configuration": "true",
                            "autoinstall_known_extensions": "false", "autoload_known_extensions": "false"}
    finally:
        con.close()
    assert sorted(p.name for p in (lake / "programs").iterdir()) == ["a.parquet"]
    assert not (lake / "new.duckdb").exists()


def test_a_folder_that_is_not_a_lake_is_an_error_and_nothing_is_created(tmp_path, lake):
    folder = tmp_path / "somewhere"
    folder.mkdir()
    (folder / "notes.txt").write_text("hello")
    result = _sql("SELECT 1", "--lake", str(folder))
    assert result.exit_code == 2 and "is not a lake" in result.stderr and "Traceback" not in result.output
    assert sorted(p.name for p in folder.iterdir()) == ["notes.txt"]
    result = _sql("SELECT 1", "--lake", str(tmp_path / "missing"))
    assert result.exit_code == 2 and "no lake" in result.stderr and not (tmp_path / "missing").exists()


def test_a_lake_without_a_catalog_is_queried_without_writing_one(tmp_path):
    lake = tmp_path / "lake"
    write_shard(lake, "programs", "a", _rows(2))
    result = _sql("SELECT count(*) AS n FROM programs", "--lake", str(lake), "--format", "json")
    assert result.exit_code == 0 and json.loads(result.stdout) == {"n": 2}
    assert not (lake / "catalog.duckdb").exists()


def test_symlinked_shards_are_read_where_they_point_inside_the_lake_or_its_dvc_cache(lake, tmp_path):
    """DVC's `cache.type symlink` leaves every shard a link into .dvc/cache: the views read them."""
    cache = tmp_path / ".dvc" / "cache" / "files" / "md5" / "ab"
    cache.mkdir(parents=True)
    shard = lake / "programs" / "a.parquet"
    target = cache / "cdef0123"
    shard.rename(target)
    shard.symlink_to(target)
    result = _sql("SELECT count(*) AS n FROM programs", "--lake", str(lake), "--format", "csv")
    assert result.exit_code == 0, result.output
    assert result.stdout.splitlines()[-1] == "3"


def test_a_shard_that_links_outside_the_lake_is_refused(lake, tmp_path):
    outside = tmp_path / "elsewhere.parquet"
    outside.write_text("root:x:0:0:root:/root:/bin/bash\n")
    (lake / "programs" / "b.parquet").symlink_to(outside)
    result = _sql("SELECT * FROM read_text('programs/b.parquet')", "--lake", str(lake))
    _refused(result, "links outside the lake and its DVC cache")


def test_cells_are_plain_text_never_markup(lake):
    result = _sql("SELECT '[red]x[/red]' AS a, '[/]' AS b", "--lake", str(lake))
    assert result.exit_code == 0, result.output
    assert "[red]x[/red]" in result.stdout and "[/]" in result.stdout


def test_output_inside_the_lake_or_in_a_missing_folder_is_refused(lake, tmp_path):
    before = _files(lake)
    _refused(_sql("SELECT 1", "--lake", str(lake), "--format", "csv", "--output", str(lake / "programs" / "a.parquet")),
             "is inside the lake")
    assert _files(lake) == before
    _refused(_sql("SELECT 1", "--lake", str(lake), "--output", str(tmp_path / "nope" / "x.csv"), "--format", "csv"),
             "there is no folder")


def test_a_query_that_never_ends_is_cancelled_at_the_timeout(lake):
    import time

    started = time.perf_counter()
    endless = "WITH RECURSIVE r(i) AS (SELECT 1 UNION ALL SELECT i + 1 FROM r) SELECT count(*) FROM r"
    result = _sql(endless, "--lake", str(lake), "--timeout", "1")
    _refused(result, "ran past --timeout 1 s and was cancelled")
    assert time.perf_counter() - started < 30


def test_json_output_is_written_batch_by_batch(lake, tmp_path):
    out = tmp_path / "rows.jsonl"
    result = _sql("SELECT range AS i FROM range(10000)", "--lake", str(lake), "--format", "json", "--output", str(out))
    assert result.exit_code == 0, result.output
    lines = out.read_text().splitlines()
    assert len(lines) == 10000 and json.loads(lines[-1]) == {"i": 9999}
