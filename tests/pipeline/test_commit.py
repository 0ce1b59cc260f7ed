"""The export's Delta commits: one writer per destination, committed ranges only for readers,
empty ranges committed, prune re-verifying the destination it was told (issues #30, #61)."""

from __future__ import annotations

import os
import shutil
import signal
import stat
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

import pyarrow.parquet
import pytest
from deltalake import DeltaTable
from django.db import connections

from django_pgqueue.exceptions import PipelineError
from django_pgqueue.models import ArchivedMessage, DeadMessage
from django_pgqueue.pipeline import compact as compact_module
from django_pgqueue.pipeline import export as export_module
from django_pgqueue.pipeline.compact import compact
from django_pgqueue.pipeline.export import export, read_export
from django_pgqueue.pipeline.models import ExportRange, ExportRun
from django_pgqueue.pipeline.prune import prune

from .conftest import committed_files, committed_ids_arrow, fill_archive, fill_dead, run_sql

pytestmark = [pytest.mark.spark, pytest.mark.django_db(transaction=True)]


def committed_ids(spark: Any, destination: str, source: str = "archive") -> list[int]:
    return sorted(r["id"] for r in read_export(spark, destination, source).select("id").collect())


def db_ids(table: str = "pgqueue_archive") -> list[int]:
    return [r[0] for r in run_sql(f"SELECT id FROM {table} ORDER BY id")]


def test_a_second_export_to_the_same_destination_is_refused_naming_the_first(
    spark: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    fill_archive(900)
    destination = str(tmp_path / "out")
    first_is_writing, go_on = threading.Event(), threading.Event()
    real_batch = export_module.export_batch

    def slow_batch(*args: Any, **kwargs: Any) -> int:
        first_is_writing.set()
        go_on.wait(60)
        return real_batch(*args, **kwargs)

    monkeypatch.setattr(export_module, "export_batch", slow_batch)
    outcome: dict[str, Any] = {}

    def first() -> None:
        try:
            outcome["first"] = export(spark, destination, sources=["archive"], range_size=300)
        except BaseException as exc:  # reported by the assertions below
            outcome["first"] = exc
        finally:
            connections.close_all()

    thread = threading.Thread(target=first)
    thread.start()
    try:
        assert first_is_writing.wait(120)
        first_run = ExportRun.objects.get()
        with pytest.raises(PipelineError, match=rf"being written by export run #{first_run.pk}"):
            export(spark, destination, sources=["archive"], range_size=300)
    finally:
        go_on.set()
        thread.join(120)

    assert outcome["first"].rows_exported == 900
    assert ExportRun.objects.count() == 1  # the refused run left no row behind
    assert committed_ids(spark, destination) == db_ids()  # every row exactly once


def test_a_range_emptied_by_retried_dead_letters_is_committed_empty(
    spark: Any, tmp_path: Path
) -> None:
    fill_archive(100)
    fill_dead(40)
    destination = str(tmp_path / "out")
    export(spark, destination, range_size=1_000)
    DeadMessage.objects.all().delete()  # every dead letter retried (back to the live queue)

    again = export(spark, destination, range_size=1_000)

    assert again.mismatched == [] and again.ranges_exported == 1
    dead_range = ExportRange.objects.get(source="dead")
    assert (dead_range.status, dead_range.parquet_rows) == ("verified", 0)
    assert committed_files(destination, "dead") == []
    assert read_export(spark, destination, "dead").count() == 0
    assert committed_ids(spark, destination) == db_ids()
    # And the next export does not trip over it either.
    assert export(spark, destination, range_size=1_000).mismatched == []


def test_prune_after_the_export_was_deleted_deletes_nothing_and_says_why(
    spark: Any, tmp_path: Path
) -> None:
    fill_archive(300)
    destination = str(tmp_path / "out")
    export(spark, destination, sources=["archive"], range_size=100)
    shutil.rmtree(destination)

    with pytest.raises(PipelineError, match=r"does not exist.*nothing was pruned"):
        prune(destination=destination)

    assert ArchivedMessage.objects.count() == 300
    assert set(ExportRange.objects.values_list("status", flat=True)) == {"verified"}


def test_prune_refuses_ranges_whose_files_changed_or_went_missing(
    spark: Any, tmp_path: Path
) -> None:
    fill_archive(300)
    destination = str(tmp_path / "out")
    export(spark, destination, sources=["archive"], range_size=100)
    files = committed_files(destination, "archive")
    ranges = list(ExportRange.objects.order_by("lo"))
    missing = next(f for f in files if f"id_range={ranges[0].lo}/" in f)
    os.remove(missing)
    changed = next(f for f in files if f"id_range={ranges[1].lo}/" in f)
    with open(changed, "r+b") as stream:
        stream.seek(8)
        stream.write(b"\0\0\0\0")

    result = prune(destination=destination)

    assert len(result.refused) == 2
    assert "is missing" in result.refused[0] and "SHA-256" in result.refused[1]
    kept = run_sql(
        "SELECT count(*) FROM pgqueue_archive WHERE id >= %s AND id < %s",
        [ranges[0].lo, ranges[1].hi],
    )[0][0]
    assert kept == ranges[0].source_rows + ranges[1].source_rows
    assert result.rows == 300 - kept
    assert [r.status for r in ExportRange.objects.order_by("lo")] == [
        "verified",
        "verified",
        *["pruned"] * (len(ranges) - 2),
    ]


def test_pruning_one_destination_leaves_another_destinations_export_whole(
    spark: Any, tmp_path: Path
) -> None:
    fill_archive(400)
    first, second = str(tmp_path / "a"), str(tmp_path / "b")
    export(spark, first, sources=["archive"], range_size=150)
    export(spark, second, sources=["archive"], range_size=150)
    everything = db_ids()

    pruned = prune(destination=first)
    assert pruned.rows == 400 and not ArchivedMessage.objects.exists()
    assert set(ExportRange.objects.filter(destination=second).values_list("status", flat=True)) == {
        "verified"
    }

    # The second export must not "mirror" rows the database no longer has: it keeps them.
    again = export(spark, second, sources=["archive"], range_size=150)
    assert again.rows_exported == 0 and again.mismatched == []
    assert committed_ids(spark, second) == everything
    after = prune(destination=second)
    assert after.rows == 0 and committed_ids(spark, second) == everything
    assert set(ExportRange.objects.values_list("status", flat=True)) == {"pruned"}


def test_export_files_are_owner_only_by_default_and_as_chosen(spark: Any, tmp_path: Path) -> None:
    fill_archive(200)
    fill_dead(20)
    private, shared = tmp_path / "private", tmp_path / "shared"

    export(spark, str(private), range_size=100)
    export(spark, str(shared), range_size=100, file_mode=0o640)

    for root, file_mode, dir_mode in ((private, 0o600, 0o700), (shared, 0o640, 0o750)):
        entries = [root, *root.rglob("*")]
        files = [p for p in entries if p.is_file()]
        assert files and {stat.S_IMODE(p.stat().st_mode) for p in files} == {file_mode}
        dirs = [p for p in entries if p.is_dir()]
        assert {stat.S_IMODE(p.stat().st_mode) for p in dirs} == {dir_mode}
    with pytest.raises(PipelineError, match="file mode 755"):
        export(spark, str(tmp_path / "x"), file_mode=0o755)


@pytest.mark.slow  # a second Spark process, killed
def test_a_killed_export_leaves_readers_committed_data_and_the_next_run_takes_over(
    spark: Any, tmp_path: Path
) -> None:
    from django.conf import settings
    from django.db import connection

    fill_archive(3_000)
    destination = str(tmp_path / "out")
    repo = Path(settings.REPO_DIR)
    s = connection.settings_dict
    env = {
        **os.environ,
        "DJANGO_SETTINGS_MODULE": os.environ.get("DJANGO_SETTINGS_MODULE", "tests.settings"),
        "DATABASE_URL": f"postgres://{s['USER']}@{s['HOST'] or '127.0.0.1'}:{s['PORT'] or 5432}/{s['NAME']}",
        "PYTHONPATH": os.pathsep.join([str(repo), str(repo / "example_project"), *sys.path]),
    }
    writer = subprocess.Popen(
        [sys.executable, "-m", "django_pgqueue.pipeline", "--master", "local[1]", "export",
         destination, "--source", "archive", "--range-size", "100", "--ranges-per-job", "1",
         "--lease-seconds", "4"],
        cwd=repo, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
    )  # fmt: skip
    try:
        deadline = time.monotonic() + 180
        while ExportRange.objects.filter(status="verified").count() < 3:
            assert writer.poll() is None and time.monotonic() < deadline
            time.sleep(0.05)
        writer.send_signal(signal.SIGKILL)
    finally:
        writer.kill()
        writer.wait()
    killed = ExportRun.objects.get()
    assert killed.status == "running"  # nobody could tell it yet

    # Readers: every committed file is whole, and holds rows of committed ranges only.
    files = committed_files(destination, "archive")
    ids = committed_ids_arrow(destination, "archive")
    assert files and len(ids) == len(set(ids)) and set(ids) <= set(db_ids())
    assert sum(pyarrow.parquet.ParquetFile(f).metadata.num_rows for f in files) == len(ids)

    deadline = time.monotonic() + 30
    while True:  # the killed run's lease runs out within its 4 seconds
        try:
            resumed = export(spark, destination, sources=["archive"], range_size=100)
            break
        except PipelineError as exc:
            assert "being written by" in str(exc) and time.monotonic() < deadline
            time.sleep(0.5)

    killed.refresh_from_db()
    assert killed.status == "failed" and "lease expired" in killed.error
    assert resumed.took_over_from == killed.pk
    assert committed_ids(spark, destination) == db_ids()
    on_disk = {str(p) for p in Path(destination, "archive").rglob("*.parquet")}
    assert on_disk == set(committed_files(destination, "archive"))


def test_compact_merges_small_files_and_readers_and_prune_see_the_same_rows(
    spark: Any, tmp_path: Path
) -> None:
    fill_archive(1_200)
    destination = str(tmp_path / "out")
    export(spark, destination, sources=["archive"], range_size=100)
    files_before = len(committed_files(destination, "archive"))
    ranges_before = ExportRange.objects.count()
    table = DeltaTable(f"{destination}/archive")
    version_before = table.version()

    result = compact(destination, sources=["archive"], target_rows=700)

    assert result.ranges_merged == ranges_before and result.files_after < files_before
    assert ExportRange.objects.count() == result.ranges_written < ranges_before
    assert committed_ids(spark, destination) == db_ids()
    # One commit per merged range replaced its files; readers of the version before still
    # read it whole.
    table.update_incremental()
    assert table.version() == version_before + result.ranges_written
    assert table.history(1)[0]["pgqueue"]["operation"] == "compact"
    old = DeltaTable(f"{destination}/archive", version=version_before)
    assert sorted(old.to_pyarrow_table(columns=["id"])["id"].to_pylist()) == db_ids()
    on_disk = {str(p) for p in Path(destination, "archive").rglob("*.parquet")}
    assert len(on_disk) == files_before + result.files_after  # kept for older versions
    # Vacuum past the retention deletes the replaced files.
    vacuumed = compact(destination, sources=["archive"], target_rows=700, retain_hours=0)
    assert vacuumed.files_vacuumed == files_before and vacuumed.ranges_merged == 0
    on_disk = {str(p) for p in Path(destination, "archive").rglob("*.parquet")}
    assert on_disk == set(committed_files(destination, "archive"))
    assert export(spark, destination, sources=["archive"], range_size=100).rows_exported == 0
    pruned = prune(destination=destination)
    assert pruned.rows == 1_200 and pruned.refused == [] and pruned.skipped == []


def test_compact_of_a_url_only_spark_can_write_goes_through_spark_inside_the_protocol(
    spark: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # s3a://, hdfs://...: export and compaction both through Spark and Hadoop's FileSystem.
    monkeypatch.setattr(export_module, "local_directory", lambda url: None)
    monkeypatch.setattr(compact_module, "local_directory", lambda url: None)
    fill_archive(1_200)
    fill_dead(60)
    destination = f"file://{tmp_path / 'out'}"
    export(spark, destination, range_size=100)
    files_before = len(committed_files(destination, "archive"))
    ranges_before = ExportRange.objects.filter(source="archive").count()
    with pytest.raises(PipelineError, match="needs a SparkSession"):
        compact(destination)

    result = compact(destination, spark=spark, target_rows=700, retain_hours=0)

    assert result.skipped == [] and result.files_after < result.files_before
    archive = ExportRange.objects.filter(source="archive")
    assert archive.count() < ranges_before
    assert len(committed_files(destination, "archive")) < files_before
    assert committed_ids(spark, destination) == db_ids()
    assert committed_ids(spark, destination, "dead") == db_ids("pgqueue_dead")
    out = tmp_path / "out"
    on_disk = {str(p) for p in (out / "archive").rglob("*.parquet")}
    assert on_disk == set(committed_files(destination, "archive"))  # replaced files deleted
    leftovers = [str(p) for p in out.rglob("*") if p.is_file()]
    assert not [p for p in leftovers if "/_temporary" in p]
    assert export(spark, destination, range_size=100).rows_exported == 0
    pruned = prune(destination=destination)  # re-verifies every file's size and SHA-256
    assert pruned.rows == 1_260 and pruned.refused == [] and pruned.skipped == []


def test_a_compaction_killed_after_its_commit_is_read_once_and_finished_next_time(
    tmp_path: Path, spark: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    fill_archive(600)
    destination = str(tmp_path / "out")
    export(spark, destination, sources=["archive"], range_size=100)

    def killed(*args: Any, **kwargs: Any) -> None:
        raise RuntimeError("killed after the manifest was committed")

    monkeypatch.setattr(compact_module, "merge_records", killed)
    with pytest.raises(RuntimeError, match="killed"):
        compact(destination, sources=["archive"])
    assert committed_ids_arrow(destination) == db_ids()  # the merged files only: read once
    monkeypatch.undo()

    compact(destination, sources=["archive"])

    assert ExportRange.objects.count() == 1
    assert committed_ids(spark, destination) == db_ids()
    assert prune(destination=destination).rows == 600
