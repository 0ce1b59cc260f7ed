"""One export range read with COPY, hashed, written as Parquet and read back: the Spark task's
body, run here in-process against the test database."""

from __future__ import annotations

import json
import shutil
from pathlib import Path
from typing import Any

import psycopg
import pytest

from django_pgqueue.pipeline import rangeio
from django_pgqueue.pipeline.columns import ARCHIVE
from django_pgqueue.pipeline.export import source_figures
from django_pgqueue.pipeline.rangeio import RangeJob, export_range
from django_pgqueue.pipeline.session import psycopg_dsn

from .conftest import fill_archive, run_sql

pytestmark = pytest.mark.django_db(transaction=True)

#: Texts CSV and the canonical row text must keep apart: empty vs NULL, a literal \N,
#: the separator, quotes, commas, line breaks, non-ASCII.
AWKWARD = ["", None, "\\N", "a|b", 'say "hi", then\nleave', "\r\n", "é✓ 漢字", " padded "]


def fill_awkward() -> None:
    for n, text in enumerate(AWKWARD):
        run_sql(
            """
            INSERT INTO pgqueue_archive
                (message_id, queue, task, payload, priority, tenant, dedup_key, enqueued_at,
                 attempts, max_attempts, errors, started_at, finished_at, worker_id, result)
            VALUES (%s, 'q', %s, %s::jsonb, %s, %s, %s,
                    '1969-12-31 23:59:59.999999+00'::timestamptz, 1, 3, '[]', NULL,
                    '2026-10-01 12:00:00.000001+00'::timestamptz + %s * interval '1 second', %s, %s::jsonb)
            """,
            [
                9_000 + n,
                f"tasks.{text}",
                json.dumps({"text": text, "n": -n}),
                -n,
                text,
                text,
                n,
                text,
                None if text is None else f'{{"v": "{n}"}}',
            ],
        )


def job_for(root: Path) -> RangeJob:
    return RangeJob(
        dsn=psycopg_dsn("default"),
        table=ARCHIVE.table,
        columns=tuple(ARCHIVE.columns),
        time_column=ARCHIVE.time_column,
        root=str(root),
    )


def all_ids() -> tuple[int, int]:
    lo, hi = run_sql("SELECT min(id), max(id) + 1 FROM pgqueue_archive")[0]
    return int(lo), int(hi)


def test_range_keeps_every_text_and_both_checksums_equal_postgresqls(tmp_path: Path) -> None:
    fill_awkward()
    fill_archive(500)
    lo, hi = all_ids()

    with psycopg.connect(psycopg_dsn("default")) as conn:
        table, _ = rangeio.read_range(job_for(tmp_path), conn, lo, hi)
        figures = export_range(job_for(tmp_path), conn, lo, hi)

    rows, checksum, _, _ = source_figures(ARCHIVE, lo, hi, "default")
    assert (figures.rows, figures.checksum) == (rows, checksum) == (508, checksum)
    assert (figures.parquet_rows, figures.parquet_checksum) == (rows, checksum)
    assert figures.ids_match
    read = {row["message_id"]: row for row in table.to_pylist()}
    for n, text in enumerate(AWKWARD):
        row = read[9_000 + n]
        assert (row["tenant"], row["dedup_key"], row["worker_id"]) == (text, text, text)
        assert row["task"] == f"tasks.{text}"
        assert row["started_at"] is None and (row["result"] is None) == (text is None)


def test_a_value_changed_on_its_way_to_the_files_is_a_mismatch(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    fill_archive(300)
    lo, hi = all_ids()
    write = rangeio.write_range

    def write_one_value_wrong(job: RangeJob, table: Any, lo: int) -> Any:
        import pyarrow as pa

        tasks = table["task"].to_pylist()
        tasks[7] = tasks[7] + "!"
        index = table.schema.get_field_index("task")
        return write(job, table.set_column(index, "task", pa.array(tasks, pa.string())), lo)

    monkeypatch.setattr(rangeio, "write_range", write_one_value_wrong)
    with psycopg.connect(psycopg_dsn("default")) as conn:
        figures = export_range(job_for(tmp_path), conn, lo, hi)

    # Same ids, same count: only the files' checksum tells the range is not what was read.
    assert figures.ids_match and figures.parquet_rows == figures.rows == 300
    assert figures.parquet_checksum != figures.checksum
    assert figures.checksum == source_figures(ARCHIVE, lo, hi, "default")[1]


@pytest.mark.spark
def test_spark_hashes_the_files_as_the_task_did(spark: Any, tmp_path: Path) -> None:
    from pyspark.sql import functions as F

    from django_pgqueue.pipeline.columns import spark_row_hash

    fill_awkward()
    fill_archive(200)
    lo, hi = all_ids()
    with psycopg.connect(psycopg_dsn("default")) as conn:
        figures = export_range(job_for(tmp_path / "out"), conn, lo, hi)
    visible = tmp_path / "visible"  # Spark skips the files' temporary (hidden) names
    for n, (path, *_) in enumerate(figures.files):
        directory = visible / Path(path).parent.relative_to(tmp_path / "out")
        directory.mkdir(parents=True, exist_ok=True)
        shutil.copy(path, directory / f"part-{n}.parquet")

    got = (
        spark.read.parquet(str(visible))
        .agg(F.count(F.lit(1)).alias("rows"), F.sum(spark_row_hash(ARCHIVE)).alias("sum"))
        .first()
    )
    assert (got["rows"], got["sum"]) == (figures.parquet_rows, figures.parquet_checksum)
    assert figures.parquet_checksum == figures.checksum
