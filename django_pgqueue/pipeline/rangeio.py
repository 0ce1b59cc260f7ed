"""Executor side of export: one id range -> Parquet files, read with psycopg COPY into Arrow.

Runs inside Spark's Python workers (one Spark partition per range), so it imports neither
Django nor pyspark: the driver hands it a libpq connection string and plain SQL.

Per range, one ``COPY`` statement reads the rows (CSV, timestamps as epoch microseconds).
The range's source checksum is the row hash (:mod:`rowhash`) of that text, read by Python's
CSV parser; pyarrow parses the same text and writes it as ``queue=/day=/id_range=`` Parquet
files, which are read back: their checksum is taken from what is on disk, and their ids are
compared one to one with the rows read. The hashing runs here, in the export's process,
so PostgreSQL's share of an export is reading the rows.
"""

from __future__ import annotations

import os
import uuid
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from typing import Any

from .committed import arrow_schema, directory_mode, file_sha256
from .rowhash import NULL_MARK, arrow_checksum, csv_checksum


@dataclass(frozen=True)
class RangeJob:
    """Everything a worker needs for one source table (picklable, no Django objects)."""

    dsn: str
    table: str
    columns: tuple[tuple[str, str], ...]  # (name, kind) as in columns.SourceTable
    time_column: str
    root: str  # local directory of this source's export
    file_mode: int = 0o600  # permissions of the files; directories get the matching 0700 form


@dataclass(frozen=True)
class RangeFigures:
    lo: int
    rows: int
    checksum: int  # of the rows as PostgreSQL sent them
    oldest_us: int | None
    newest_us: int | None
    parquet_rows: int
    parquet_checksum: int  # of the rows in the files, read back from disk
    ids_match: bool
    #: (path, rows, bytes, sha256) of each file written
    files: tuple[tuple[str, int, int, str], ...]


def select_list(columns: Iterable[tuple[str, str]]) -> str:
    parts = []
    for name, kind in columns:
        if kind == "ts":
            parts.append(f"(extract(epoch FROM {name}) * 1000000)::bigint")
        elif kind == "json":
            parts.append(f"{name}::text")
        else:
            parts.append(name)
    return ", ".join(parts)


def read_range(job: RangeJob, conn: Any, lo: int, hi: int) -> tuple[Any, tuple[Any, ...]]:
    """(Arrow table, (rows, checksum, oldest_us, newest_us)) of ``[lo, hi)``, one statement."""
    import pyarrow as pa
    import pyarrow.compute as pc
    import pyarrow.csv as pacsv

    buffer = bytearray()
    with conn.transaction():
        with conn.cursor().copy(
            f"COPY (SELECT {select_list(job.columns)} FROM {job.table} "
            f"WHERE id >= {int(lo)} AND id < {int(hi)}) TO STDOUT (FORMAT csv, NULL E'\\\\N')"
        ) as copy:
            for data in copy:
                buffer += data
    schema = arrow_schema(job.columns)
    if not buffer:  # an empty range is a normal state (pyarrow refuses an empty CSV)
        return schema.empty_table(), (0, 0, None, None)
    data = bytes(buffer)
    rows, checksum = csv_checksum(data)
    # Timestamps travel as epoch microseconds: no time zone or text format in between.
    wire = {f.name: (pa.int64() if pa.types.is_timestamp(f.type) else f.type) for f in schema}
    table = pacsv.read_csv(
        pa.BufferReader(data),
        read_options=pacsv.ReadOptions(column_names=[name for name, _ in job.columns]),
        # Text columns may hold newlines. NULL is an unquoted \N; PostgreSQL quotes a text
        # equal to \N, and writes an empty text as an empty field.
        parse_options=pacsv.ParseOptions(newlines_in_values=True),
        convert_options=pacsv.ConvertOptions(
            column_types=wire,
            null_values=[NULL_MARK],
            strings_can_be_null=True,
            quoted_strings_can_be_null=False,
        ),
    )
    bounds = pc.min_max(table[job.time_column])
    figures = (rows, checksum, bounds["min"].as_py(), bounds["max"].as_py())
    return table.cast(schema), figures


def write_range(job: RangeJob, table: Any, lo: int) -> list[tuple[str, int]]:
    """Write ``table`` under ``root/queue=/day=/id_range=lo``; returns (path, rows) per file.
    They are part of the export once the driver commits them to the table."""
    import pyarrow as pa
    import pyarrow.compute as pc

    days = pc.cast(pc.cast(table[job.time_column], pa.date32()), pa.string())
    return write_partitioned(table.append_column("day", days), job.root, lo)


def write_partitioned(table: Any, root: str, lo: int) -> list[tuple[str, int]]:
    """``table`` (with its ``queue`` and ``day`` columns) as zstd Parquet files under
    ``root/queue=/day=/id_range=lo``; (path, rows) of each file."""
    import pyarrow as pa
    import pyarrow.dataset as ds

    table = table.append_column("id_range", pa.array([str(lo)] * table.num_rows, pa.string()))
    written: list[tuple[str, int]] = []

    def visit(written_file: Any) -> None:
        written.append((written_file.path, written_file.metadata.num_rows))

    ds.write_dataset(
        table,
        root,
        format="parquet",
        partitioning=["queue", "day", "id_range"],
        partitioning_flavor="hive",
        basename_template=f"part-{uuid.uuid4().hex}-{{i}}.zstd.parquet",
        existing_data_behavior="overwrite_or_ignore",
        max_partitions=1 << 20,
        file_options=ds.ParquetFileFormat().make_write_options(compression="zstd"),
        file_visitor=visit,
    )
    return written


def read_back(paths: list[str], root: str, schema: Any) -> Any:
    """The rows of the files as readers see them: read back from disk, ``queue`` from the
    files' directories."""
    import pyarrow as pa
    import pyarrow.dataset as ds

    if not paths:
        return schema.empty_table()
    partitioning = ds.partitioning(pa.schema([("queue", pa.string())]), flavor="hive")
    files = ds.dataset(paths, format="parquet", partitioning=partitioning, partition_base_dir=root)
    return files.to_table(columns=schema.names)


def _sorted(values: Any) -> Any:
    import pyarrow.compute as pc

    return pc.take(values, pc.array_sort_indices(values))


def export_range(job: RangeJob, conn: Any, lo: int, hi: int) -> RangeFigures:
    table, (rows, checksum, oldest, newest) = read_range(job, conn, lo, hi)
    written = write_range(job, table, lo) if table.num_rows else []
    paths = [path for path, _ in written]
    back = read_back(paths, job.root, table.schema)
    parquet_rows, parquet_checksum = arrow_checksum(back, job.columns)
    ids_match = back.num_rows == table.num_rows and _sorted(back["id"].combine_chunks()).equals(
        _sorted(table["id"].combine_chunks())
    )
    return RangeFigures(
        lo=lo,
        rows=int(rows),
        checksum=int(checksum),
        oldest_us=None if oldest is None else int(oldest),
        newest_us=None if newest is None else int(newest),
        parquet_rows=int(parquet_rows),
        parquet_checksum=int(parquet_checksum),
        ids_match=bool(ids_match),
        files=tuple((path, n, os.path.getsize(path), file_sha256(path)) for path, n in written),
    )


def export_ranges(job: RangeJob, ranges: Iterable[tuple[int, int]]) -> Iterator[RangeFigures]:
    """The body of one Spark partition: its ranges, one connection, one statement each."""
    import psycopg

    ranges = list(ranges)
    if not ranges:
        return
    # A Python worker runs one task at a time, so the umask is this task's for its length.
    previous = os.umask(0o777 & ~directory_mode(job.file_mode))
    try:
        with psycopg.connect(job.dsn) as conn:
            conn.read_only = True
            for lo, hi in ranges:
                yield export_range(job, conn, lo, hi)
    finally:
        os.umask(previous)
