from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from deltalake import DeltaTable

from django_pgqueue.exceptions import ForeignOutput, PipelineError
from django_pgqueue.pipeline import export as export_module
from django_pgqueue.pipeline.commit import LocalCommitter
from django_pgqueue.pipeline.export import export, nothing_to_export, read_export
from django_pgqueue.pipeline.models import ExportRange, ExportRangeStatus, ExportRun

from .conftest import committed_files, fill_archive, fill_dead, run_sql

pytestmark = [pytest.mark.spark, pytest.mark.django_db(transaction=True)]

ARCHIVE_SQL = """
SELECT id, message_id, queue, task, payload::text, priority, tenant, dedup_key,
       (extract(epoch FROM enqueued_at) * 1000000)::bigint, attempts, max_attempts,
       errors::text, (extract(epoch FROM started_at) * 1000000)::bigint,
       (extract(epoch FROM finished_at) * 1000000)::bigint, worker_id, result::text,
       to_char(finished_at AT TIME ZONE 'UTC', 'YYYY-MM-DD')
FROM pgqueue_archive ORDER BY id
"""


def exported_archive(spark: Any, destination: str) -> list[tuple[Any, ...]]:
    from pyspark.sql import functions as F

    frame = read_export(spark, destination, "archive")
    columns = [
        "id", "message_id", "queue", "task", "payload", "priority", "tenant", "dedup_key",
        F.unix_micros("enqueued_at"), "attempts", "max_attempts", "errors",
        F.unix_micros("started_at"), F.unix_micros("finished_at"), "worker_id", "result", "day",
    ]  # fmt: skip
    return [tuple(row) for row in frame.select(*columns).orderBy("id").collect()]


def test_export_writes_parquet_equal_to_the_source_rows(spark: Any, tmp_path: Path) -> None:
    fill_archive(2_000)
    fill_dead(300)
    destination = str(tmp_path / "out")

    result = export(spark, destination, range_size=700)

    assert result.rows_exported == 2_300
    assert result.mismatched == []
    assert exported_archive(spark, destination) == [tuple(r) for r in run_sql(ARCHIVE_SQL)]
    dead = read_export(spark, destination, "dead")
    assert sorted(r["id"] for r in dead.select("id").collect()) == [
        r[0] for r in run_sql("SELECT id FROM pgqueue_dead ORDER BY id")
    ]
    # Partitioned by queue and UTC day, payload kept as JSON text.
    days = {p.name for p in (tmp_path / "out" / "archive" / "queue=q1").iterdir()}
    assert "day=2026-10-01" in days and "day=2026-10-02" in days
    assert all(r.status == ExportRangeStatus.VERIFIED for r in ExportRange.objects.all())
    assert ExportRun.objects.get().status == "completed"


def test_second_export_adds_nothing_and_new_rows_go_in_new_ranges(
    spark: Any, tmp_path: Path
) -> None:
    fill_archive(500)
    destination = f"file://{tmp_path / 'out'}"  # any Hadoop-compatible URL
    export(spark, destination, sources=["archive"], range_size=200)
    files_before = sorted(p for p in (tmp_path / "out").rglob("*.parquet"))

    again = export(spark, destination, sources=["archive"], range_size=200)

    assert again.rows_exported == 0 and again.ranges_exported == 0
    assert sorted(p for p in (tmp_path / "out").rglob("*.parquet")) == files_before
    fill_archive(100, start_day="2026-11-01")
    third = export(spark, destination, sources=["archive"], range_size=200)
    assert third.rows_exported == 100
    ids = [row[0] for row in exported_archive(spark, destination)]
    assert len(ids) == len(set(ids)) == 600


def test_a_row_committed_late_into_an_exported_range_is_exported_by_the_next_run(
    spark: Any, tmp_path: Path
) -> None:
    # A writer drew an id, then the rows after it committed and were exported first. The ids
    # straddle a range bound, so one range holds the late row and part of the others.
    run_sql(
        "SELECT setval(pg_get_serial_sequence('pgqueue_archive', 'id'),"
        " (nextval(pg_get_serial_sequence('pgqueue_archive', 'id')) / 1000 + 1) * 1000 + 849)"
    )
    late_id = run_sql("SELECT nextval(pg_get_serial_sequence('pgqueue_archive', 'id'))")[0][0]
    fill_archive(300)
    destination = str(tmp_path / "out")
    assert export(spark, destination, sources=["archive"], range_size=1_000).mismatched == []
    run_sql(
        "INSERT INTO pgqueue_archive (id, message_id, queue, task, payload, enqueued_at,"
        " attempts, max_attempts, errors, started_at, finished_at, worker_id)"
        " SELECT %s, 1, 'q1', 't', '{}', ts, 1, 3, '[]', ts, ts, 'w1'"
        " FROM (SELECT timestamptz '2026-10-01 12:00+00') AS t(ts)",
        [late_id],
    )
    assert not nothing_to_export(destination, ["archive"])

    again = export(spark, destination, sources=["archive"], range_size=1_000)

    # Only the range holding the late row is exported again, whole.
    late_range = ExportRange.objects.get(source="archive", lo__lte=late_id, hi__gt=late_id)
    in_late_range = run_sql(
        "SELECT count(*) FROM pgqueue_archive WHERE id >= %s AND id < %s",
        [late_range.lo, late_range.hi],
    )[0][0]
    assert in_late_range == 150
    assert again.mismatched == [] and again.rows_exported == in_late_range
    ids = [row[0] for row in exported_archive(spark, destination)]
    assert ids == sorted(ids) and len(ids) == 301 and late_id in ids


def test_max_ranges_exports_the_oldest_ranges_of_each_source_and_leaves_the_rest(
    spark: Any, tmp_path: Path
) -> None:
    fill_archive(1_000)
    fill_dead(300)
    destination = str(tmp_path / "out")

    first = export(spark, destination, range_size=200, max_ranges=2)

    def ranges(name: str) -> list[ExportRange]:
        return list(ExportRange.objects.filter(source=name).order_by("lo"))

    # Only what the run exported is planned: the rest waits below the horizon.
    for name in ("archive", "dead"):
        assert [r.status for r in ranges(name)] == [ExportRangeStatus.VERIFIED] * 2, name
    assert first.ranges_exported == 4 and first.mismatched == []
    assert first.ids_left == sum(
        first.horizons[name] - ranges(name)[-1].hi for name in ("archive", "dead")
    )
    assert first.ids_left > 0
    assert first.rows_exported == sum(
        run_sql(f"SELECT count(*) FROM pgqueue_{name} WHERE id < %s", [ranges(name)[-1].hi])[0][0]
        for name in ("archive", "dead")
    )
    assert not nothing_to_export(destination, ["archive", "dead"])

    runs = 1
    while export(spark, destination, range_size=200, max_ranges=2).ids_left:
        runs += 1
    runs += 1  # the last run, which left nothing

    assert runs == max(-(-len(ranges(name)) // 2) for name in ("archive", "dead"))
    # Aligned, full ranges between the first and the last (the dead rows may span only two).
    assert {r.hi - r.lo for r in ranges("archive")[1:-1]} == {200}
    assert {r.hi - r.lo for r in ranges("dead")[1:-1]} <= {200}
    assert exported_archive(spark, destination) == [tuple(r) for r in run_sql(ARCHIVE_SQL)]
    assert nothing_to_export(destination, ["archive", "dead"])
    with pytest.raises(PipelineError, match="max_ranges must be >= 1"):
        export(spark, destination, max_ranges=0)


def test_crash_mid_commit_leaves_readers_the_committed_ranges_and_resumes_cleanly(
    spark: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    fill_archive(1_200)
    destination = str(tmp_path / "out")
    real_commit = LocalCommitter.commit
    calls = {"n": 0}

    def crash_on_third_range(self: Any, *args: Any, **kwargs: Any) -> int:
        calls["n"] += 1
        if calls["n"] == 3:  # files written, not committed yet
            raise RuntimeError("injected crash")
        return real_commit(self, *args, **kwargs)

    monkeypatch.setattr(LocalCommitter, "commit", crash_on_third_range)
    with pytest.raises(RuntimeError, match="injected crash"):
        export(spark, destination, sources=["archive"], range_size=200, ranges_per_job=2)
    assert ExportRun.objects.get().status == "failed"
    statuses = list(ExportRange.objects.order_by("lo").values_list("status", flat=True))
    assert statuses[:2] == ["verified", "verified"] and "verified" not in statuses[2:]
    crashed = ExportRange.objects.order_by("lo")[2]
    assert list((tmp_path / "out").rglob(f"id_range={crashed.lo}/part-*"))  # uncommitted files
    # Readers of the committed files see exactly the two committed ranges.
    committed = DeltaTable(str(tmp_path / "out" / "archive")).to_pyarrow_table()
    first_two = ExportRange.objects.order_by("lo")[:2]
    assert sorted(committed["id"].to_pylist()) == [
        r[0]
        for r in run_sql(
            "SELECT id FROM pgqueue_archive WHERE id >= %s AND id < %s ORDER BY id",
            [first_two[0].lo, first_two[1].hi],
        )
    ]
    monkeypatch.setattr(LocalCommitter, "commit", real_commit)

    resumed = export(spark, destination, sources=["archive"], range_size=200, ranges_per_job=2)

    assert resumed.ranges_exported == len(statuses) - 2
    assert resumed.leftovers_removed >= 1
    assert exported_archive(spark, destination) == [tuple(r) for r in run_sql(ARCHIVE_SQL)]
    on_disk = sorted(p.name for p in (tmp_path / "out" / "archive").rglob("*.parquet"))
    # Nothing else left but what older versions hold (the crashed attempt's files are gone).
    assert len(on_disk) == len(committed_files(destination, "archive"))


def test_urls_python_workers_cannot_write_go_through_spark_writer(
    spark: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # s3a://, hdfs://...: JDBC read and Spark's writer, verified by reading the files back.
    monkeypatch.setattr(export_module, "local_directory", lambda url: None)
    fill_archive(600)
    fill_dead(50)
    destination = f"file://{tmp_path / 'out'}"

    result = export(spark, destination, range_size=250)

    assert (result.rows_exported, result.mismatched) == (650, [])
    assert exported_archive(spark, destination) == [tuple(r) for r in run_sql(ARCHIVE_SQL)]
    assert all(r.status == ExportRangeStatus.VERIFIED for r in ExportRange.objects.all())


def test_destination_with_foreign_files_is_refused(spark: Any, tmp_path: Path) -> None:
    fill_archive(10)
    (tmp_path / "holiday.jpg").write_bytes(b"\xff\xd8")
    with pytest.raises(ForeignOutput, match=r"holiday\.jpg"):
        export(spark, str(tmp_path))
    assert not ExportRun.objects.exists()
    assert [p.name for p in tmp_path.iterdir()] == ["holiday.jpg"]
