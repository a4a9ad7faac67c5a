"""The lake's storage layer: tables as folders of Parquet shards, plus a DuckDB catalog of views.

Every shard is sorted by its table's key, has the table's column order and types, and is written
atomically (temporary file in the same folder, fsync, rename): a killed run never leaves a
half-written shard, and the same rows always give the same bytes. `lake/catalog.duckdb` holds one
view per table over `<table>/*.parquet`, with paths relative to the lake so that the catalog does
not depend on where the lake lives.
"""
from __future__ import annotations

import json
import os
import tempfile
from dataclasses import dataclass
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq


@dataclass(frozen=True)
class TableSpec:
    name: str
    key: tuple[str, ...]
    schema: pa.Schema


def _schema(*fields: tuple[str, pa.DataType]) -> pa.Schema:
    return pa.schema([pa.field(n, t) for n, t in fields])


S, I64, F64, B = pa.string(), pa.int64(), pa.float64(), pa.bool_()

# A step's columns (the `steps` table, and the search's `trajectory_steps` in the same schema).
# `claim` is what its chain of thought claims (strategies.cot.CLAIMS: benefit, enabling, none), and
# `enables`, the strategies an `enabling` step makes legal next (JSON list).
STEP_FIELDS = (
    ("step_id", S), ("program_id", S), ("parent_step_id", S), ("depth", I64), ("strategy", S), ("level", S),
    ("site", S), ("params", S), ("before_leir", S), ("after_leir", S), ("after_program_id", S),
    ("exactness", S), ("cot", S), ("claim", S), ("enables", S))

TABLES: dict[str, TableSpec] = {t.name: t for t in (
    TableSpec("programs", ("program_id",), _schema(
        ("program_id", S), ("workload", S), ("level", S), ("family", S), ("shape_params", S), ("dtype", S),
        ("signature", S), ("leir", S), ("n_nests", I64), ("source", S), ("seed", I64),
        ("verification_status", S), ("max_abs_err", F64),
        # where the shapes came from (workloads.shapes: model-dims, odd-extents, tiny-ranges)
        # and the instance's work units (the shape model's budget measure)
        ("shape_source", S), ("work", I64),
        # the share of the dtype's tolerance that rounding alone moves the original's
        # outputs by, against its float64 reference (strategies.analysis.numerics.ROUNDING_SHARE_LIMIT)
        ("rounding_share", F64),
        # the target the program is written for (`llvm` or `cuda`, seeded by its identity, the
        # profile's `gpu_share`): its steps are made, and its prompts asked, for that target only
        ("target", S))),
    TableSpec("steps", ("step_id",), _schema(*STEP_FIELDS)),
    TableSpec("verifications", ("step_id", "target"), _schema(
        ("step_id", S), ("target", S), ("status", S), ("max_abs_err", F64), ("max_rel_err", F64),
        ("rel_l2_err", F64), ("draws", I64), ("bitwise_equal", B), ("error_message", S), ("tvm_version", S))),
    # one row per program state, target, machine and unit (a measurement, not deterministic
    # data): the samples of one session (`session_id`: one original program's states, interleaved
    # rounds), their median and relative interquartile range, on the timing protocol of `protocol`
    # (JSON: rounds, spread target, sample length, the whole-state rule). `unit`: `nest` (the sum of the
    # state's top-level nests, each compiled once per program, gpu_tasks.nest_timing) or `state` (the
    # whole state as one function); a state may have both. Per-step effects are derived from two
    # states' rows (flows.measure) into `effects`.
    TableSpec("timings", ("state_id", "target", "machine_id", "unit"), _schema(
        ("state_id", S), ("target", S), ("machine_id", S), ("program_id", S), ("family", S), ("leir", S),
        ("status", S), ("time_us", F64), ("spread", F64), ("rounds", I64), ("samples_us", pa.list_(F64)),
        ("min_repeat_ms", I64), ("machine", S), ("run_id", S), ("error", S), ("unit", S), ("session_id", S),
        ("protocol", S), ("n_nests", I64))),
    # each released step's effect on one machine (`kind = 'step'`), and each passing follow-up's
    # chain effect (`kind = 'chain'`: the enabling step's before-state against the follow-up's after-state):
    # the speedup before/after with its bootstrap interval and class (gpu_tasks.effect), the unit compared
    TableSpec("effects", ("step_id", "target", "machine_id"), _schema(
        ("step_id", S), ("target", S), ("machine_id", S), ("kind", S), ("program_id", S), ("family", S),
        ("strategy", S), ("parent_step_id", S), ("before_state_id", S), ("after_state_id", S), ("before_us", F64),
        ("after_us", F64), ("speedup", F64), ("speedup_low", F64), ("speedup_high", F64), ("effect", S),
        ("timing_unit", S), ("paired", B), ("rounds", I64))),
    TableSpec("samples", ("sample_id",), _schema(
        ("sample_id", S), ("split", S), ("prompt", S), ("answer", S), ("step_ids", S), ("strategies", S),
        ("prompt_tokens", I64), ("answer_tokens", I64),
        # a test sample whose before-state's loop nests all have a twin (names and sizes
        # abstracted, leir.canon.structure_hashes) in the train split's states; a train sample
        # whose before-state's nests all have a twin in the test split's states
        ("structural_overlap", B))),
    # the split of each family (the unit of the split), chosen by the filter stage for coverage
    # (flows.filtering.split_families); every stage that holds families out reads it (`family_splits`)
    TableSpec("splits", ("family",), _schema(
        ("family", S), ("split", S), ("kept_steps", I64), ("strategies", S))),
    TableSpec("tokens", ("program_id",), _schema(
        ("program_id", S), ("family", S), ("leir_tokens", I64), ("tir_tokens", I64), ("tir_gpu_tokens", I64),
        ("cuda_tokens", I64), ("tokenizer", S),
        # what the state is, the CUDA kernels without TVM's fixed preamble, the LEIR tree's
        # sizes (they explain the ratios), and why a text is missing (null counts)
        ("kind", S), ("workload", S), ("strategy", S), ("cuda_kernel_tokens", I64), ("n_nests", I64),
        ("n_loops", I64), ("n_stmts", I64), ("n_accesses", I64), ("error", S),
        # the TensorIR (block) form for the CPU, the baseline of the published reduction
        ("tensorir_tokens", I64),
        # the program's dtype (the report compares mixed-precision programs apart)
        ("dtype", S))),
    # the steps an enabling released step makes legal (parent_step_id: that step), made on its
    # after-state and verified against the original program (flows.follow_ups)
    TableSpec("follow_ups", ("step_id",), _schema(
        *STEP_FIELDS, ("status", S), ("max_abs_err", F64), ("max_rel_err", F64), ("error_message", S))),
    # the steps of the best search trajectories (multi-step records: parent_step_id, depth),
    # kept apart from `steps`, which the transform stage owns and rewrites as a whole
    TableSpec("trajectory_steps", ("step_id",), _schema(*STEP_FIELDS)),
    # best trajectories of the search stage (steps: JSON list of step ids, root first). Each is
    # grounded after the search (search.grounding): per state (JSON lists, root excluded) its verification
    # against the original and max_abs_err, its time and speedup over the root with an interval, each
    # step's effect; the search's own best speedup and the states it verified; the machine
    TableSpec("trajectories", ("trajectory_id",), _schema(
        ("trajectory_id", S), ("program_id", S), ("driver", S), ("policy", S), ("seed", I64), ("steps", S),
        ("speedups", S), ("speedups_low", S), ("speedups_high", S), ("step_effects", S), ("best_speedup", F64),
        ("search_speedup", F64), ("search_states", I64), ("wall_s", F64), ("root_us", F64), ("times_us", S),
        ("verification", S), ("max_abs_err", S), ("machine", S))),
)}


# Logs beside the tables (never read by a stage): the nightly build's last run, for `steptp lake status`.
SCHEDULED_RUN_LOG = "last_scheduled_run.json"


class StorageError(Exception):
    pass


def table_dir(lake: Path, table: str) -> Path:
    if table not in TABLES:
        raise StorageError(f"unknown table {table!r}; tables: {', '.join(TABLES)}")
    return Path(lake) / table


def to_arrow(table: str, rows: list[dict]) -> pa.Table:
    """Rows (dicts) as an Arrow table in the table's schema, sorted by its key."""
    spec = TABLES[table]
    missing = [c for c in spec.key if any(r.get(c) is None for r in rows)]
    if missing:
        raise StorageError(f"{table}: key column(s) {', '.join(missing)} must not be null")
    unknown = sorted({k for r in rows for k in r} - set(spec.schema.names))
    if unknown:
        raise StorageError(f"{table}: unknown column(s) {', '.join(unknown)}")
    rows = sorted(rows, key=lambda r: tuple(r[c] for c in spec.key))
    keys = [tuple(r[c] for c in spec.key) for r in rows]
    dup = next((a for a, b in zip(keys, keys[1:], strict=False) if a == b), None)
    if dup is not None:
        raise StorageError(f"{table}: duplicate key {dup}")
    columns = {n: [r.get(n) for r in rows] for n in spec.schema.names}
    return pa.table(columns, schema=spec.schema)


def write_atomically(target: Path, write) -> Path:
    """`write(f)` into a temporary file beside `target` (binary), synced, then renamed over it: a
    reader sees the old file or the whole new one, and a failure leaves no partial file."""
    target.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=target.parent, prefix=f".{target.stem}.", suffix=".tmp")
    try:
        with os.fdopen(fd, "wb") as f:
            write(f)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, target)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
    return target


def write_shard(lake: Path, table: str, shard: str, rows: list[dict]) -> Path:
    """Write one shard atomically; the same rows always produce the same file bytes."""
    folder = table_dir(lake, table)
    folder.mkdir(parents=True, exist_ok=True)
    data = to_arrow(table, rows)
    return write_atomically(folder / f"{shard}.parquet", lambda f: pq.write_table(
        data, f, compression="zstd", use_dictionary=True, write_statistics=True, row_group_size=50_000))


def shards(lake: Path, table: str) -> list[Path]:
    return sorted(table_dir(lake, table).glob("*.parquet"))


def read_table(lake: Path, table: str) -> pa.Table:
    """All shards of a table as one Arrow table (empty, with the schema, when there are none)."""
    schema = TABLES[table].schema
    parts = []
    for path in shards(lake, table):
        try:
            found = pq.read_schema(path)
        except (OSError, pa.ArrowException) as exc:
            raise StorageError(f"{path}: not a readable parquet shard of table {table!r}: {exc}") from exc
        missing = [n for n in schema.names if n not in found.names]
        if missing:  # pyarrow would read them as nulls: a shard that lost its LEIR would pass as empty LEIR
            raise StorageError(f"{path}: shard of table {table!r} lacks column(s) {', '.join(missing)}; "
                               "rebuild it with the stage that writes it")
        parts.append(pq.read_table(path, schema=schema))
    return pa.concat_tables(parts) if parts else schema.empty_table()


def build_catalog(lake: Path) -> Path:
    """(Re)create `catalog.duckdb` with a view per table (relative paths) and convenience views."""
    import duckdb

    lake = Path(lake)
    lake.mkdir(parents=True, exist_ok=True)
    path = lake / "catalog.duckdb"
    tmp = lake / ".catalog.duckdb.tmp"
    tmp.unlink(missing_ok=True)
    con = duckdb.connect(str(tmp))
    try:
        _search_lake(con, lake)
        for name, select in catalog_views(lake):
            con.execute(f"CREATE VIEW {name} AS {select}")
    finally:
        con.close()
    os.replace(tmp, path)
    return path


def _step_effects_sql() -> str:
    """Each step's effect on every machine that timed it (the `effects` rows of kind `step`, made by the
    measure stage with the interval rule of gpu_tasks.effect), with its strategy, level and claim."""
    return """
        SELECT e.step_id, s.program_id, s.strategy, s.level, s.claim, e.machine_id, e.target, e.before_state_id,
               e.after_state_id, e.before_us, e.after_us, e.speedup, e.speedup_low, e.speedup_high, e.effect,
               e.timing_unit, e.paired, e.rounds
        FROM effects e JOIN steps s USING (step_id) WHERE e.kind = 'step'"""


def catalog_views(lake: Path, files: dict[str, list[Path]] | None = None) -> list[tuple[str, str]]:
    """(view name, SELECT) of the catalog: one view per table, then `steps_verified`, `steps_all` and
    `step_effects`.
    A table reads `<table>/*.parquet` relative to the lake, or, when `files` is given, exactly its
    files there (table -> absolute paths, a symlinked shard's target: what `read_only_connection`
    allows)."""
    views = []
    for name, spec in TABLES.items():
        if files is None:
            source = f"'{name}/*.parquet'" if shards(lake, name) else None
        else:
            own = [_sql_string(p.as_posix()) for p in files.get(name, [])]
            source = "[" + ", ".join(own) + "]" if own else None
        views.append((name, f"SELECT * FROM read_parquet({source})" if source else _empty_view(spec)))
    views.append(("steps_verified", "SELECT s.*, v.status, v.target FROM steps s JOIN verifications v "
                                    "USING (step_id) WHERE v.status IN ('exact', 'close')"))
    # Single steps and the multi-step records of the search trajectories, in one steps schema.
    views.append(("steps_all", "SELECT * FROM steps UNION ALL BY NAME SELECT * FROM trajectory_steps"))
    views.append(("step_effects", _step_effects_sql()))
    return views


def _empty_view(spec: TableSpec) -> str:
    """No shard yet: an empty view with the right columns and types."""
    cols = ", ".join(f"CAST(NULL AS {_duck_type(f.type)}) AS {f.name}" for f in spec.schema)
    return f"SELECT {cols} WHERE false"


def _sql_string(text: str) -> str:
    return "'" + text.replace("'", "''") + "'"


def _duck_type(t: pa.DataType) -> str:
    if pa.types.is_list(t):
        return _duck_type(t.value_type) + "[]"
    return {pa.string(): "VARCHAR", pa.int64(): "BIGINT", pa.float64(): "DOUBLE", pa.bool_(): "BOOLEAN"}[t]


def connect(lake: Path, read_only: bool = True):
    """A DuckDB connection on the catalog whose relative view paths resolve inside the lake."""
    import duckdb

    lake = Path(lake).resolve()
    catalog = lake / "catalog.duckdb"
    if not catalog.exists():
        build_catalog(lake)
    con = duckdb.connect(str(catalog), read_only=read_only)
    _search_lake(con, lake)
    return con


def _search_lake(con, lake: Path) -> None:
    """Relative paths in the views resolve against the lake folder (DuckDB's file_search_path)."""
    con.execute("SET file_search_path = " + _sql_string(Path(lake).resolve().as_posix()))


def is_lake(folder: Path) -> bool:
    """A folder that holds a catalog or at least one table folder."""
    folder = Path(folder)
    return folder.is_dir() and ((folder / "catalog.duckdb").is_file() or any((folder / t).is_dir() for t in TABLES))


# The only statements `read_only_connection` runs: queries (SELECT, FROM ..., WITH, VALUES, DESCRIBE,
# SHOW and SUMMARIZE are all of DuckDB's statement type SELECT). ATTACH, DETACH, COPY, INSTALL, LOAD,
# EXPORT, SET, USE, CALL, PRAGMA, EXPLAIN (ANALYZE runs its statement) and every DDL/DML are refused.
READ_STATEMENTS = ("SELECT",)


class RefusedStatement(StorageError):
    """A statement that a read-only connection to the lake does not run."""


def read_only_connection(lake: Path):
    """An in-memory DuckDB connection with the catalog's views over the lake's shard files, locked
    so that it can only read them: external access is off except for exactly those files (no other
    file, directory or extension can be read or written, nothing new can be created even inside the
    lake), extensions are neither installed nor loaded, and the configuration is locked. Nothing is
    written: the lake's catalog file is not opened (its views are made here from the same
    definitions, with absolute paths). Run statements through `read_only_query`, which also refuses
    every statement that is not a query."""
    import duckdb

    lake = Path(lake).resolve()
    if not is_lake(lake):
        raise StorageError(f"{lake} is not a lake (no catalog.duckdb and no table folder such as programs/)")
    files = {name: [shard_file(p, lake) for p in shards(lake, name)] for name in TABLES if (lake / name).is_dir()}
    allowed = [p for paths in files.values() for p in paths]
    con = duckdb.connect(":memory:", config={"autoinstall_known_extensions": False,
                                             "autoload_known_extensions": False})
    try:
        for name, select in catalog_views(lake, files):
            con.execute(f"CREATE VIEW {name} AS {select}")
        con.execute("SET allowed_paths = [" + ", ".join(_sql_string(p.as_posix()) for p in allowed) + "]")
        con.execute("SET temp_directory = ''")  # no spill files anywhere
        con.execute("SET enable_external_access = false")
        con.execute("SET lock_configuration = true")
    except BaseException:
        con.close()
        raise
    return con


def shard_file(path: Path, lake: Path) -> Path:
    """The file a shard is: itself, or what its symlink points to when that lies inside the lake or in
    the DVC cache of the repository holding the lake (`cache.type symlink`). StorageError for a link
    that leads anywhere else: a query must not read /etc/passwd through a shard name."""
    target = path.resolve()
    homes = [lake] + [d / ".dvc" / "cache" for d in (lake, *lake.parents) if (d / ".dvc").is_dir()]
    if not any(target.is_relative_to(home) for home in homes):
        raise StorageError(f"shard {path} links outside the lake and its DVC cache (to {target}): refused")
    if not target.is_file():
        raise StorageError(f"shard {path} is a broken link (to {target})")
    return target


def read_only_query(con, query: str):
    """The result of `query` (its last statement's relation, or None) on a `read_only_connection`;
    RefusedStatement, before anything runs, when one of its statements is not a query."""
    statements = con.extract_statements(query)
    for statement in statements:
        kind = statement.type.name
        if kind not in READ_STATEMENTS:
            text = " ".join(statement.query.split()).rstrip(";")
            word = text.split(" ", 1)[0].upper()  # INSTALL rather than DuckDB's type name LOAD
            shown = text if len(text) <= 60 else text[:57] + "..."
            raise RefusedStatement(f"steptp sql only reads the lake: {word if word.isalpha() else kind} "
                                   f"statements are refused ({shown})")
    result = None
    for statement in statements:
        result = con.sql(statement.query)
    return result


class RowCache:
    """Rows computed before, by content key, under `lake/.cache/<name>/<shard>.parquet` (not a DVC
    output: an optimisation that a fresh clone rebuilds). A stage looks its items up before it submits
    work, so that adding a strategy verifies only the new steps; each shard file keeps exactly the
    entries of the shard's current items, so the cache never outgrows the lake."""

    def __init__(self, lake: Path, name: str):
        self.folder = Path(lake) / ".cache" / name

    def load(self, shard: str) -> dict[str, dict]:
        path = self.folder / f"{shard}.parquet"
        if not path.exists():
            return {}
        try:
            table = pq.read_table(path)
        except (OSError, pa.ArrowInvalid):
            return {}  # a damaged cache file is only a lost optimisation
        return {k: json.loads(v) for k, v in zip(table.column("key").to_pylist(), table.column("row").to_pylist(),
                                                 strict=True)}

    def save(self, shard: str, entries: dict[str, dict]) -> None:
        self.folder.mkdir(parents=True, exist_ok=True)
        keys = sorted(entries)
        data = pa.table({"key": keys, "row": [json.dumps(entries[k], sort_keys=True) for k in keys]})
        write_atomically(self.folder / f"{shard}.parquet", lambda f: pq.write_table(data, f, compression="zstd"))
