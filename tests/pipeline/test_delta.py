"""The export as Delta Lake tables: any Delta reader sees exactly what was committed, older
versions stay readable, and two writers racing a commit cannot both win (issue #61)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pyarrow
import pyarrow.parquet
import pytest
from deltalake import DeltaTable

from django_pgqueue.exceptions import LeaseLost, PipelineError
from django_pgqueue.pipeline.columns import ARCHIVE
from django_pgqueue.pipeline.commit import APP_ID, LocalCommitter, WrittenFile
from django_pgqueue.pipeline.committed import check_file_mode
from django_pgqueue.pipeline.export import export, read_export
from django_pgqueue.pipeline.models import ExportRange, ExportRun
from django_pgqueue.pipeline.prune import prune

from .conftest import fill_archive, fill_dead, run_sql

pytestmark = [pytest.mark.django_db(transaction=True)]


def db_ids(table: str = "pgqueue_archive") -> list[int]:
    return [r[0] for r in run_sql(f"SELECT id FROM {table} ORDER BY id")]


@pytest.mark.spark
def test_deltalake_polars_duckdb_and_spark_read_the_same_committed_rows(
    spark: Any, tmp_path: Path
) -> None:
    polars = pytest.importorskip("polars")
    duckdb = pytest.importorskip("duckdb")
    fill_archive(900)
    fill_dead(40)
    destination = str(tmp_path / "out")
    export(spark, destination, range_size=400)
    first_version = DeltaTable(f"{destination}/archive").version()
    first_ids = db_ids()
    fill_archive(300)
    export(spark, destination, range_size=400)
    archive = f"{destination}/archive"

    by_deltalake = DeltaTable(archive).to_pyarrow_table(columns=["id", "queue", "day"])
    by_polars = polars.read_delta(archive).select("id", "queue", "day").sort("id")
    dataset = DeltaTable(archive).to_pyarrow_dataset()  # noqa: F841 (read by DuckDB by name)
    by_duckdb = duckdb.sql("SELECT id, queue, day FROM dataset ORDER BY id").fetchall()
    by_spark = read_export(spark, destination, "archive").select("id", "queue", "day")

    expected = [
        (i, q, d)
        for i, q, d in run_sql(
            "SELECT id, queue, (finished_at AT TIME ZONE 'UTC')::date FROM pgqueue_archive "
            "ORDER BY id"
        )
    ]
    assert sorted(zip(*by_deltalake.to_pydict().values(), strict=True)) == expected
    assert list(by_polars.iter_rows()) == expected
    assert by_duckdb == expected
    assert sorted((r[0], r[1], str(r[2])) for r in by_spark.collect()) == [
        (i, q, str(d)) for i, q, d in expected
    ]
    dead = polars.read_delta(f"{destination}/dead").get_column("id").sort().to_list()
    assert dead == db_ids("pgqueue_dead")
    # Time travel: the version the first export left holds the rows it exported, no more.
    old = DeltaTable(archive, version=first_version).to_pyarrow_table(columns=["id"])
    assert sorted(old["id"].to_pylist()) == first_ids
    assert sorted(r["id"] for r in read_export(spark, destination, "archive", first_version)
                  .select("id").collect()) == first_ids  # fmt: skip
    # Each range's commit says which range it is, with its rows and checksum.
    infos = [c["pgqueue"] for c in DeltaTable(archive).history() if "pgqueue" in c]
    ranges = ExportRange.objects.filter(source="archive")
    assert sorted((i["lo"], i["hi"], i["rows"], i["checksum"]) for i in infos) == sorted(
        ranges.values_list("lo", "hi", "parquet_rows", "parquet_checksum")
    )
    assert DeltaTable(archive).transaction_version(APP_ID) == ExportRun.objects.last().pk


def _one_file(destination: Path, lo: int) -> WrittenFile:
    part = destination / "archive" / "queue=q0" / "day=2026-10-01" / f"id_range={lo}" / "p.parquet"
    part.parent.mkdir(parents=True, exist_ok=True)
    pyarrow.parquet.write_table(pyarrow.table({"id": [lo]}), part)
    return WrittenFile(str(part), 1, part.stat().st_size, "")


def test_two_writers_racing_a_commit_cannot_both_win(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    destination = tmp_path / "out"
    first, second = LocalCommitter(str(destination), 0o600), LocalCommitter(str(destination), 0o600)
    first.table(ARCHIVE)
    # The second writer read the table before the first committed (the race window).
    stale = DeltaTable(str(destination / "archive"))
    monkeypatch.setattr(second, "table", lambda source: stale)

    first.commit(ARCHIVE, 7, {"lo": 0}, [_one_file(destination, 0)], [])
    with pytest.raises(LeaseLost, match="lost the race to commit"):
        second.commit(ARCHIVE, 8, {"lo": 100}, [_one_file(destination, 100)], [])

    table = DeltaTable(str(destination / "archive"))
    assert [Path(p).parent.name for p in table.file_uris()] == ["id_range=0"]
    assert table.transaction_version(APP_ID) == 7


def test_a_run_older_than_the_last_committing_run_may_not_commit(tmp_path: Path) -> None:
    destination = tmp_path / "out"
    committer = LocalCommitter(str(destination), 0o600)
    committer.commit(ARCHIVE, 9, {}, [_one_file(destination, 0)], [])

    with pytest.raises(LeaseLost, match="run #9 has committed to it since"):
        committer.commit(ARCHIVE, 8, {}, [_one_file(destination, 100)], [])
    assert len(DeltaTable(str(destination / "archive")).file_uris()) == 1


@pytest.mark.parametrize("mode", [0o660, 0o602, 0o666])
def test_file_modes_letting_the_group_or_others_write_are_refused(mode: int) -> None:
    with pytest.raises(PipelineError, match="lets the group or others write"):
        check_file_mode(mode)


def test_leftover_cleaning_never_follows_a_symbolic_link_out_of_the_export(tmp_path: Path) -> None:
    destination = tmp_path / "out"
    committer = LocalCommitter(str(destination), 0o600)
    committer.commit(ARCHIVE, 1, {}, [_one_file(destination, 0)], [])
    outside = tmp_path / "elsewhere"
    outside.mkdir()
    (outside / "keep.parquet").write_bytes(b"not the export's")
    link = destination / "archive" / "queue=q0" / "day=2026-10-01" / "id_range=100"
    link.symlink_to(outside, target_is_directory=True)

    try:
        committer.remove_untracked(ARCHIVE, [100])
    except PipelineError as refused:
        assert "not a file of the export" in str(refused)

    assert (outside / "keep.parquet").read_bytes() == b"not the export's"


@pytest.mark.spark
def test_prune_refuses_a_range_the_tables_latest_version_no_longer_holds(
    spark: Any, tmp_path: Path
) -> None:
    fill_archive(300)
    destination = str(tmp_path / "out")
    export(spark, destination, sources=["archive"], range_size=100)
    ranges = list(ExportRange.objects.order_by("lo"))
    # Another Delta writer removes the first range's files: they stay on disk, for older
    # versions, but the latest version no longer holds them.
    DeltaTable(f"{destination}/archive").delete(f"id_range = {ranges[0].lo}")

    result = prune(destination=destination)

    assert len(result.refused) == 1 and "is not in version" in result.refused[0]
    assert result.rows == 300 - ranges[0].source_rows
    assert ExportRange.objects.get(pk=ranges[0].pk).status == "verified"
    kept = run_sql("SELECT count(*) FROM pgqueue_archive WHERE id < %s", [ranges[0].hi])[0][0]
    assert kept == ranges[0].source_rows


def test_a_file_the_export_never_writes_listed_by_the_table_is_refused(tmp_path: Path) -> None:
    from deltalake.transaction import AddAction

    destination = tmp_path / "out"
    LocalCommitter(str(destination), 0o600).commit(ARCHIVE, 1, {}, [_one_file(destination, 0)], [])
    secret = tmp_path / "secret.parquet"
    pyarrow.parquet.write_table(pyarrow.table({"id": [1]}), secret)
    table = DeltaTable(str(destination / "archive"))
    partition = {"queue": "q0", "day": "2026-10-01", "id_range": "0"}
    planted = AddAction("../../secret.parquet", 1, partition, 0, True, '{"numRecords": 1}')
    table.create_write_transaction([planted], "append", table.schema())
    (destination / "_PGQUEUE_EXPORT").write_text("{}")
    run = ExportRun.objects.create(destination=str(destination), status="completed")
    ExportRange.objects.create(
        run=run, destination=str(destination), source="archive", lo=0, hi=100,
        status="verified", source_rows=2, source_checksum=0, parquet_rows=2, parquet_checksum=0,
    )  # fmt: skip

    with pytest.raises(PipelineError, match=r"lists '\.\./\.\./secret\.parquet', not a file"):
        prune(destination=str(destination))
    with pytest.raises(PipelineError, match="not a file the export writes"):
        export(None, str(destination), sources=["archive"])  # refused before Spark is needed
    assert secret.exists()
