"""compact: merge the small files of consecutive committed ranges, inside the commit protocol.

Each export range writes one file per (queue, day) it touches, so many queues and small ranges
make many small files. Compaction merges runs of consecutive committed ranges (same state,
verified or pruned, up to ``target_rows`` rows) into one range with one file per
(queue, day): under the destination's lease, the new files are written under temporary
names, checked (the ids read back equal the ids of the files they replace), renamed, and
committed by one manifest covering the merged ranges. Readers ignore a manifest whose ids
another manifest covers (:func:`committed.committed_manifests`), so they see the old files
or the new ones, never both. Then the merged range replaces its parts in PostgreSQL, in one
transaction, and the replaced manifests and files are deleted. A crash in between is
finished by the next compaction (the covering manifest is there: the database follows it).

A local destination is merged by the driver with pyarrow, no Spark needed. Any other URL Spark
can write (``s3a://``, ``hdfs://``...) is merged by Spark: one file per (queue, day) written
aside, each file read back through Spark (rows and row checksum must add up to the merged
manifests'), then moved under a temporary name next to the files it replaces.
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
from .columns import SOURCES
from .commit import Committer, HadoopCommitter, LocalCommitter, final_name
from .committed import (
    Manifest,
    committed_manifests,
    directory_mode,
    file_sha256,
    local_directory,
)
from .export import DEFAULT_FILE_MODE, check_file_mode
from .lease import DEFAULT_LEASE_SECONDS, Heartbeat, acquire, release
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
    skipped: list[str] = field(default_factory=list)
    seconds: float = 0.0


def compact(
    destination: str,
    *,
    spark: SparkSession | None = None,
    sources: Iterable[str] = ("archive", "dead"),
    target_rows: int = DEFAULT_TARGET_ROWS,
    file_mode: int = DEFAULT_FILE_MODE,
    lease_seconds: float = DEFAULT_LEASE_SECONDS,
    report: Callable[[str], None] | None = None,
    using: str | None = None,
) -> CompactResult:
    """Merge runs of consecutive committed ranges of ``destination`` into fewer, larger files.

    ``spark`` is needed for a destination that is not a local path (or ``file://`` URL).
    """
    if target_rows < 1:
        raise PipelineError(f"target_rows must be >= 1, got {target_rows}")
    check_file_mode(file_mode)
    sources = tuple(sources)
    alias = using or get_settings().DATABASE_ALIAS
    destination = destination.rstrip("/")
    committer = _committer(spark, destination, file_mode)
    if not committer.exists(committer.destination):
        raise PipelineError(f"Export destination {destination} does not exist.")
    for source in sources:  # every manifest checked (BadManifest) before any file is touched
        committed_manifests(committer, source, include_covered=True)
    started = time.monotonic()
    with transaction.atomic(using=alias):
        run = ExportRun.objects.using(alias).create(destination=destination, master="compact")
        lease = acquire(destination, run, lease_seconds, alias)
    result = CompactResult(run_id=run.pk)
    try:
        with Heartbeat(lease) as heartbeat:
            for source in sources:
                finish_interrupted(committer, source, destination, alias)
                for group in _groups(destination, source, target_rows, alias):
                    heartbeat.check()
                    _merge(committer, source, group, run, alias, result)
                    if report is not None:
                        report(
                            f"compact: {source} [{group[0].lo}, {group[-1].hi}): "
                            f"{len(group)} ranges merged"
                        )
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
    source: str,
    group: list[ExportRange],
    run: ExportRun,
    alias: str,
    result: CompactResult,
) -> None:
    parts = [committer.manifest(source, r.lo, r.hi) for r in group]
    if any(p is None for p in parts):
        result.skipped.append(f"{source} [{group[0].lo}, {group[-1].hi}): a manifest is missing")
        return
    manifests = [p for p in parts if p is not None]
    root = committer.source_root(source)
    old_files = [f"{root}/{f.path}" for m in manifests for f in m.files]
    lo, hi = group[0].lo, group[-1].hi
    rows = sum(m.rows for m in manifests)
    checksum = sum(m.checksum for m in manifests)
    if not old_files:
        written: list[tuple[str, int, int, str]] | None = []
    elif isinstance(committer, LocalCommitter):
        written = _write_with_arrow(committer, root, old_files, lo, rows)
    else:
        assert isinstance(committer, HadoopCommitter)
        written = _write_with_spark(committer, source, old_files, lo, rows, checksum)
    if written is None:
        result.skipped.append(f"{source} [{lo}, {hi}): merged files did not read back")
        return
    merged = Manifest(
        source=source,
        lo=lo,
        hi=hi,
        rows=rows,
        checksum=checksum,
        run=run.pk,
        files=tuple(
            committer.committed_file(source, final_name(path), n, size, sha)
            for path, n, size, sha in written
        ),
    )
    committer.commit(merged, [(path, final_name(path)) for path, *_ in written])
    _merge_records(group, alias)
    _drop_replaced(committer, source, merged, manifests)
    result.ranges_merged += len(group)
    result.ranges_written += 1
    result.files_before += len(old_files)
    result.files_after += len(written)


def _write_with_arrow(
    committer: LocalCommitter, root: str, old_files: list[str], lo: int, rows: int
) -> list[tuple[str, int, int, str]] | None:
    """The merged files under temporary names, (path, rows, bytes, sha256) each; None (and
    nothing left behind) when their ids do not read back equal to the replaced files'."""
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
    previous = os.umask(0o777 & ~directory_mode(committer.file_mode))
    try:
        written = write_partitioned(table, root, lo)
    finally:
        os.umask(previous)
    back = ds.dataset([p for p, _ in written], format="parquet").to_table(columns=["id"])
    before, after = table["id"].combine_chunks(), back["id"].combine_chunks()
    if not (
        len(after) == rows
        and pc.take(before, pc.sort_indices(before)).equals(pc.take(after, pc.sort_indices(after)))
    ):
        for path, _ in written:
            os.remove(path)
        return None
    return [(path, n, os.path.getsize(path), file_sha256(path)) for path, n in written]


def _write_with_spark(
    committer: HadoopCommitter,
    source: str,
    old_files: list[str],
    lo: int,
    rows: int,
    checksum: int,
) -> list[tuple[str, int, int, str]] | None:
    """As :func:`_write_with_arrow`, through Spark: one file per (queue, day), accepted when
    the rows and row checksum read back from the new files equal the replaced manifests'."""
    from pyspark.sql import functions as F

    spark = committer.spark
    written_root = f"{committer.destination}/_temporary_compact/{source}"
    spark.conf.set("spark.sql.sources.partitionColumnTypeInference.enabled", "false")
    (
        spark.read.option("basePath", committer.source_root(source))
        .parquet(*old_files)
        .withColumn("id_range", F.lit(str(lo)))
        .repartition("queue", "day")
        .sortWithinPartitions("queue", "day", "id")
        .write.mode("overwrite")
        .partitionBy("queue", "day", "id_range")
        .option("compression", "zstd")
        .parquet(written_root)
    )
    staged = committer.stage(SOURCES[source], written_root)
    if (sum(f.rows for f in staged), sum(f.checksum for f in staged)) != (rows, checksum):
        for f in staged:
            committer.delete(f.path)
        return None
    return [(f.path, f.rows, f.bytes, f.sha256) for f in staged]


def _merge_records(group: list[ExportRange], alias: str) -> None:
    """The merged range replaces its parts in PostgreSQL, in one transaction."""
    first = group[0]
    with transaction.atomic(using=alias):
        ExportRange.objects.using(alias).filter(pk__in=[r.pk for r in group[1:]]).delete()
        first.hi = group[-1].hi
        for name in ("source_rows", "source_checksum", "parquet_rows", "parquet_checksum"):
            setattr(first, name, sum(getattr(r, name) or 0 for r in group))
        for name in ("pruned_rows", "pruned_bytes"):
            if first.status == ExportRangeStatus.PRUNED:
                setattr(first, name, sum(getattr(r, name) or 0 for r in group))
        times = [r.min_at for r in group if r.min_at] + [r.max_at for r in group if r.max_at]
        first.min_at = min(times) if times else None
        first.max_at = max(times) if times else None
        first.save(using=alias)


def _drop_replaced(
    committer: Committer, source: str, merged: Manifest, replaced: list[Manifest]
) -> None:
    kept = {f.path for f in merged.files}
    root = committer.source_root(source)
    for manifest in replaced:
        if (manifest.lo, manifest.hi) == (merged.lo, merged.hi):
            continue
        committer.delete(committer.manifest_path(source, manifest.lo, manifest.hi))
        for old in manifest.files:
            if old.path not in kept:
                committer.delete(f"{root}/{old.path}")


def finish_interrupted(committer: Committer, source: str, destination: str, alias: str) -> None:
    """Finish a compaction that committed its manifest but not the database (or the deletes)."""
    every = committed_manifests(committer, source, include_covered=True)
    covering = [m for m in every if any(_covers(m, other) for other in every)]
    for merged in covering:
        parts = [m for m in every if _covers(merged, m)]
        records = list(
            ExportRange.objects.using(alias)
            .filter(destination=destination, source=source, lo__gte=merged.lo, hi__lte=merged.hi)
            .order_by("lo")
        )
        if len(records) > 1 and sum(r.parquet_rows or 0 for r in records) == merged.rows:
            _merge_records(records, alias)
        _drop_replaced(committer, source, merged, parts)


def _covers(outer: Manifest, inner: Manifest) -> bool:
    return (outer.lo, outer.hi) != (inner.lo, inner.hi) and (
        outer.lo <= inner.lo and inner.hi <= outer.hi
    )
