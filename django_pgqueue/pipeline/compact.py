"""compact: merge the small files of consecutive committed ranges, in one Delta commit each.

Each export range writes one file per (queue, day) it touches, so many queues and small ranges
make many small files. Compaction merges runs of consecutive committed ranges (same state,
verified or pruned, up to ``target_rows`` rows) into one range with one file per
(queue, day): under the destination's lease, the new files are written into the first
range's partition and checked (the ids read back equal the ids of the files they replace),
then one Delta commit removes the replaced files and adds the new ones (``dataChange`` false:
the same rows). Readers of the latest version see the new files, readers of older versions the
old ones, until a vacuum past the table's retention deletes them. Then the merged range
replaces its parts in PostgreSQL, in one transaction. A crash in between is finished by the
next export or compaction: the table's latest commit says which ranges it merged.

A local destination is merged by the driver with pyarrow, no Spark needed. Any other URL Spark
can write (``s3a://``, ``hdfs://``...) is merged by Spark: one file per (queue, day) written
aside, each file read back through Spark (rows and row checksum must add up to the merged
ranges'), then moved next to the files it replaces.
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from django.db import transaction
from django.utils import timezone

from ..conf import get_settings
from ..exceptions import PipelineError
from .columns import SOURCES, SourceTable
from .commit import Committer, HadoopCommitter, LocalCommitter, WrittenFile
from .committed import check_file_mode, file_mode_umask, file_sha256, local_directory, open_table
from .export import DEFAULT_FILE_MODE, range_info, recorded_files
from .lease import DEFAULT_LEASE_SECONDS, Heartbeat, acquire, release
from .merged import finish_interrupted, merge_records
from .models import ExportRange, ExportRangeStatus, ExportRun, ExportRunStatus
from .rangeio import write_partitioned

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

DEFAULT_TARGET_ROWS = 1_000_000
_DONE = [ExportRangeStatus.VERIFIED, ExportRangeStatus.PRUNED]


@dataclass
class CompactResult:
    run_id: int
    ranges_merged: int = 0
    ranges_written: int = 0
    files_before: int = 0
    files_after: int = 0
    files_vacuumed: int = 0
    skipped: list[str] = field(default_factory=list)
    seconds: float = 0.0


def compact(
    destination: str,
    *,
    spark: SparkSession | None = None,
    sources: Iterable[str] = ("archive", "dead"),
    target_rows: int = DEFAULT_TARGET_ROWS,
    retain_hours: int | None = None,
    file_mode: int = DEFAULT_FILE_MODE,
    lease_seconds: float = DEFAULT_LEASE_SECONDS,
    report: Callable[[str], None] | None = None,
    using: str | None = None,
) -> CompactResult:
    """Merge runs of consecutive committed ranges of ``destination`` into fewer, larger files,
    then vacuum each table: files no version younger than ``retain_hours`` (default: the
    table's ``delta.deletedFileRetentionDuration``, 7 days) holds are deleted.

    ``spark`` is needed for a destination that is not a local path (or ``file://`` URL).
    """
    if target_rows < 1:
        raise PipelineError(f"target_rows must be >= 1, got {target_rows}")
    if retain_hours is not None and retain_hours < 0:
        raise PipelineError(f"retain_hours must be >= 0, got {retain_hours}")
    check_file_mode(file_mode)
    alias = using or get_settings().DATABASE_ALIAS
    destination = destination.rstrip("/")
    committer = _committer(spark, destination, file_mode)
    if not committer.exists(committer.destination):
        raise PipelineError(f"Export destination {destination} does not exist.")
    started = time.monotonic()
    with transaction.atomic(using=alias):
        run = ExportRun.objects.using(alias).create(destination=destination, master="compact")
        lease = acquire(destination, run, lease_seconds, alias)
    result = CompactResult(run_id=run.pk)
    try:
        with Heartbeat(lease) as heartbeat:
            for name in sources:
                source = SOURCES[name]
                if open_table(destination, name) is None:
                    continue  # nothing exported from this source yet
                finish_interrupted(committer, source, destination, alias)
                for group in _groups(destination, name, target_rows, alias):
                    heartbeat.check()
                    _merge(committer, source, group, run, alias, result)
                    if report is not None:
                        report(
                            f"compact: {name} [{group[0].lo}, {group[-1].hi}): "
                            f"{len(group)} ranges merged"
                        )
                result.files_vacuumed += _vacuum(committer, source, retain_hours)
        run.status = ExportRunStatus.COMPLETED
    except BaseException as exc:
        run.status = ExportRunStatus.FAILED
        run.error = f"{type(exc).__name__}: {exc}"[:10_000]
        raise
    finally:
        run.finished_at = timezone.now()
        run.save(using=alias)
        try:
            release(lease)
        except Exception:  # an unreleased lease expires by itself
            pass
        result.seconds = time.monotonic() - started
    return result


def _committer(spark: SparkSession | None, destination: str, file_mode: int) -> Committer:
    if local_directory(destination) is not None:
        return LocalCommitter(destination, file_mode)
    if spark is None:
        raise PipelineError(
            f"{destination} is not a local path: compacting it needs a SparkSession "
            "(pgq_pipeline compact starts one for such URLs)."
        )
    return HadoopCommitter(spark, destination, file_mode)


def _vacuum(committer: Committer, source: SourceTable, retain_hours: int | None) -> int:
    """Delta's vacuum: delete the files that only versions older than the retention hold."""
    table = committer.table(source)
    with file_mode_umask(committer.file_mode):
        if retain_hours is None:
            deleted = table.vacuum(dry_run=False)
        else:
            deleted = table.vacuum(
                retention_hours=retain_hours, dry_run=False, enforce_retention_duration=False
            )
    return len(deleted)


def _groups(destination: str, source: str, target_rows: int, alias: str) -> list[list[ExportRange]]:
    """Runs of >= 2 consecutive committed ranges in one state, up to ``target_rows`` rows."""
    groups: list[list[ExportRange]] = []
    current: list[ExportRange] = []
    rows = 0
    ranges = ExportRange.objects.using(alias).filter(
        destination=destination, source=source, status__in=_DONE
    )
    for record in ranges.order_by("lo"):
        size = record.parquet_rows or 0
        joins = (
            current
            and current[-1].hi == record.lo
            and current[-1].status == record.status
            and rows + size <= target_rows
        )
        if not joins:
            if len(current) > 1:
                groups.append(current)
            current, rows = [], 0
        current.append(record)
        rows += size
    if len(current) > 1:
        groups.append(current)
    return groups


def _merge(
    committer: Committer,
    source: SourceTable,
    group: list[ExportRange],
    run: ExportRun,
    alias: str,
    result: CompactResult,
) -> None:
    lo, hi = group[0].lo, group[-1].hi
    where = f"{source.name} [{lo}, {hi})"
    old = committer.files_of(source, [r.lo for r in group])
    rows = sum(r.parquet_rows or 0 for r in group)
    checksum = sum(r.parquet_checksum or 0 for r in group)
    if any(f.rows is None for f in old) or sum(f.rows or 0 for f in old) != rows:
        result.skipped.append(f"{where}: the table's files do not hold the ranges' rows")
        return
    root = committer.source_root(source.name)
    old_paths = [f"{root}/{f.path}" for f in old]
    written: list[WrittenFile] | None
    if not old:
        written = []
    elif isinstance(committer, LocalCommitter):
        written = _write_with_arrow(committer, root, old_paths, lo, rows)
    else:
        assert isinstance(committer, HadoopCommitter)
        written = _write_with_spark(committer, source, old_paths, lo, rows, checksum)
    if written is None:
        result.skipped.append(f"{where}: merged files did not read back")
        return
    files = recorded_files(committer, source, written)
    info = {
        **range_info("compact", source, group[0], run.pk),
        "hi": hi,
        "rows": rows,
        "checksum": checksum,
        "files": files,
    }
    committer.commit(source, run.pk, info, written, old, data_change=False)
    merge_records(group, files, alias)
    result.ranges_merged += len(group)
    result.ranges_written += 1
    result.files_before += len(old)
    result.files_after += len(written)


def _write_with_arrow(
    committer: LocalCommitter, root: str, old_files: list[str], lo: int, rows: int
) -> list[WrittenFile] | None:
    """The merged files; None (and nothing left behind) when their ids do not read back
    equal to the replaced files'."""
    import pyarrow as pa
    import pyarrow.compute as pc
    import pyarrow.dataset as ds

    text = pa.string()
    partitioning = ds.partitioning(
        pa.schema([("queue", text), ("day", text), ("id_range", text)]), flavor="hive"
    )
    table = (
        ds.dataset(old_files, format="parquet", partitioning=partitioning, partition_base_dir=root)
        .to_table()
        .drop_columns(["id_range"])
    )
    with file_mode_umask(committer.file_mode):
        written = write_partitioned(table, root, lo)
    back = ds.dataset([p for p, _ in written], format="parquet").to_table(columns=["id"])
    before, after = table["id"].combine_chunks(), back["id"].combine_chunks()
    if not (
        len(after) == rows
        and pc.take(before, pc.sort_indices(before)).equals(pc.take(after, pc.sort_indices(after)))
    ):
        for path, _ in written:
            os.remove(path)
        return None
    return [WrittenFile(path, n, os.path.getsize(path), file_sha256(path)) for path, n in written]


def _write_with_spark(
    committer: HadoopCommitter,
    source: SourceTable,
    old_files: list[str],
    lo: int,
    rows: int,
    checksum: int,
) -> list[WrittenFile] | None:
    """As :func:`_write_with_arrow`, through Spark: one file per (queue, day), accepted when
    the rows and row checksum read back from the new files equal the replaced ranges'."""
    from pyspark.sql import functions as F

    spark = committer.spark
    written_root = f"{committer.qualified}/_temporary_compact/{source.name}"
    spark.conf.set("spark.sql.sources.partitionColumnTypeInference.enabled", "false")
    (
        spark.read.option("basePath", committer.source_root(source.name))
        .parquet(*old_files)
        .withColumn("id_range", F.lit(str(lo)))
        .repartition("queue", "day")
        .sortWithinPartitions("queue", "day", "id")
        .write.mode("overwrite")
        .partitionBy("queue", "day", "id_range")
        .option("compression", "zstd")
        .parquet(written_root)
    )
    staged = committer.stage(source, written_root)
    if (sum(f.rows for f in staged), sum(f.checksum for f in staged)) != (rows, checksum):
        for f in staged:
            committer.delete(f.path)
        return None
    return [WrittenFile(f.path, f.rows, f.bytes, f.sha256) for f in staged]
