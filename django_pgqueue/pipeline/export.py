"""export: archive and dead-letter rows -> Parquet, in verified, resumable id ranges.

Layout: ``<destination>/<archive|dead>/queue=<q>/day=<YYYY-MM-DD>/id_range=<lo>/part-*.parquet``
(hive-style; ``day`` is the UTC day of ``finished_at`` / ``died_at``). ``id_range`` is the
first id of the export range that wrote the files, so a retried range replaces exactly its own
files and nothing else: a crash at any point never leaves duplicates behind.

Each range is one Spark task: psycopg ``COPY`` of the range and PostgreSQL's count and
checksum of the same rows in one short REPEATABLE READ transaction, pyarrow writes the files
and the ids written are read back (:mod:`rangeio`). For URLs Python workers cannot write
(``s3a://``, ``hdfs://``...) ranges are read by Spark's JDBC source, one predicate each, and
written by Spark's writer, then verified by reading the files back through Spark. Either
way nothing holds a snapshot open for the whole export, so the primary's xmin is never pinned. See docs/how-to/pipeline.md for the safe-horizon rule that keeps late
committing transactions from being skipped.
"""

from __future__ import annotations

import json
import os
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from functools import partial
from typing import TYPE_CHECKING, Any
from urllib.parse import unquote, urlsplit

from django.db import connections
from django.db.models import Max, Q
from django.utils import timezone

from ..conf import get_settings
from .columns import SOURCES, SourceTable, spark_row_hash, sql_row_hash
from .errors import ForeignOutput, PipelineError
from .models import ExportRange, ExportRangeStatus, ExportRun, ExportRunStatus
from .progress import Progress
from .rangeio import RangeFigures, RangeJob, export_ranges
from .session import (
    JDBC_FETCHSIZE,
    default_parallelism,
    hadoop_fs,
    jdbc_target,
    psycopg_dsn,
)

if TYPE_CHECKING:
    from pyspark.sql import DataFrame, SparkSession

MARKER_NAME = "_PGQUEUE_EXPORT"
DEFAULT_RANGE_SIZE = 50_000
#: Verified ranges not yet pruned that each run checks again against the database.
RECHECK_RANGES = 2
_OWN_ENTRIES = {MARKER_NAME, "archive", "dead", "_SUCCESS"}


@dataclass
class ExportResult:
    run_id: int
    destination: str
    rows_exported: int = 0
    ranges_exported: int = 0
    ranges_verified: int = 0
    mismatched: list[str] = field(default_factory=list)
    horizons: dict[str, int] = field(default_factory=dict)
    waited_for: list[str] = field(default_factory=list)
    seconds: float = 0.0

    @property
    def rows_per_second(self) -> float:
        return self.rows_exported / self.seconds if self.seconds > 0 else 0.0


def export(
    spark: SparkSession,
    destination: str,
    *,
    sources: Iterable[str] = ("archive", "dead"),
    range_size: int = DEFAULT_RANGE_SIZE,
    ranges_per_job: int | None = None,
    horizon_wait: float = 30.0,
    report: Callable[[str], None] | None = None,
    using: str | None = None,
    master: str = "",
) -> ExportResult:
    """Export every archive / dead row below the safe horizon that is not exported yet.

    Re-running adds nothing; after a crash the next run re-does only the ranges that were not
    verified. Raises :class:`ForeignOutput` when ``destination`` holds files not written here.
    """
    if range_size < 1:
        raise PipelineError(f"range_size must be >= 1, got {range_size}")
    alias = using or get_settings().DATABASE_ALIAS
    destination = destination.rstrip("/")
    chosen = [_source(name) for name in sources]
    claim_destination(spark, destination, alias)
    started = time.monotonic()
    run = ExportRun.objects.using(alias).create(destination=destination, master=master)
    result = ExportResult(run_id=run.pk, destination=destination)
    try:
        todo: list[tuple[SourceTable, list[ExportRange]]] = []
        for source in chosen:
            horizon, waited = safe_horizon(source, alias, horizon_wait)
            result.horizons[source.name] = horizon
            result.waited_for += waited
            plan_ranges(run, source, horizon, range_size, alias)
            recheck_recent(source, destination, alias)
            pending = list(
                ExportRange.objects.using(alias)
                .filter(destination=destination, source=source.name)
                .exclude(status__in=[ExportRangeStatus.VERIFIED, ExportRangeStatus.PRUNED])
                .order_by("lo")
            )
            todo.append((source, pending))
        run.archive_horizon = result.horizons.get("archive")
        run.dead_horizon = result.horizons.get("dead")
        run.ranges_total = sum(len(ranges) for _, ranges in todo)
        run.save(using=alias)
        progress = Progress("export", run.ranges_total, report)
        # A few ranges per core per Spark job: job start-up costs more than a range on small
        # ranges, and a failed job redoes at most this many ranges.
        per_job = ranges_per_job or 4 * default_parallelism(spark)
        for source, ranges in todo:
            for start in range(0, len(ranges), per_job):
                batch = ranges[start : start + per_job]
                rows = export_batch(spark, run, source, destination, batch, alias)
                result.ranges_exported += len(batch)
                result.rows_exported += rows
                verified = [r for r in batch if r.status == ExportRangeStatus.VERIFIED]
                result.ranges_verified += len(verified)
                result.mismatched += [str(r) for r in batch if r not in verified]
                run.ranges_done = result.ranges_exported
                run.rows_exported = result.rows_exported
                run.save(using=alias, update_fields=["ranges_done", "rows_exported"])
                progress.advance(rows, len(batch), f"{source.name} ids < {batch[-1].hi}")
        run.status = ExportRunStatus.COMPLETED if not result.mismatched else ExportRunStatus.FAILED
        if result.mismatched:
            run.error = "ranges changed while exported (re-run to export them again): " + (
                ", ".join(result.mismatched)
            )
    except BaseException as exc:
        run.status = ExportRunStatus.FAILED
        run.error = f"{type(exc).__name__}: {exc}"[:10_000]
        raise
    finally:
        run.finished_at = timezone.now()
        run.save(using=alias)
        result.seconds = time.monotonic() - started
    return result


def _source(name: str) -> SourceTable:
    try:
        return SOURCES[name]
    except KeyError:
        raise PipelineError(f"Unknown export source {name!r}; use archive and/or dead.") from None


def claim_destination(spark: SparkSession, destination: str, alias: str) -> None:
    """Refuse a destination holding foreign files; mark an empty one as ours."""
    fs, root = hadoop_fs(spark, destination)
    jvm = spark.sparkContext._jvm
    assert jvm is not None
    marker = jvm.org.apache.hadoop.fs.Path(root, MARKER_NAME)
    if fs.exists(root):
        if not fs.getFileStatus(root).isDirectory():
            raise ForeignOutput(f"Export destination {destination} is a file, not a directory.")
        names = sorted(status.getPath().getName() for status in fs.listStatus(root))
        foreign = [n for n in names if n not in _OWN_ENTRIES and not n.startswith((".", "_"))]
        if foreign or (names and not fs.exists(marker)):
            shown = ", ".join((foreign or names)[:5])
            raise ForeignOutput(
                f"Export destination {destination} holds files pgq_pipeline did not write "
                f"({shown}). Choose an empty or new directory; the export never deletes or "
                "mixes with foreign data."
            )
        if fs.exists(marker):
            return
    fs.mkdirs(root)
    stream = fs.create(marker, False)
    name = connections[alias].settings_dict.get("NAME")
    text = json.dumps({"written_by": "django_pgqueue pgq_pipeline export", "database": name})
    stream.write(bytearray(text.encode()))
    stream.close()


def safe_horizon(source: SourceTable, alias: str, wait: float) -> tuple[int, list[str]]:
    """The id below which every row of ``source`` is committed (or never will be).

    Ids come from a sequence taken in insertion order, so a transaction that took id 10 may
    commit after one that took id 11. The horizon is ``max(id) + 1`` as seen now, but only
    once every transaction that was running at that moment has ended: rows they were still
    writing below that id are then visible or gone for good. Moves into the archive delete the
    live row first, so each writer has its transaction id before it draws an archive id.
    Waiting is bounded by ``wait`` seconds; past it the horizon is used anyway and the late
    rows are caught by the re-check of recent ranges and by prune's exact verification.
    """
    with connections[alias].cursor() as cursor:
        cursor.execute(
            f"SELECT pg_current_snapshot()::text, coalesce(max(id), 0) FROM {source.table}"
        )
        snapshot, max_id = cursor.fetchone()
        deadline = time.monotonic() + wait
        running: list[str] = []
        while True:
            cursor.execute(
                "SELECT x::text FROM pg_snapshot_xip(%s::pg_snapshot) AS x "
                "WHERE pg_xact_status(x) = 'in progress'",
                [snapshot],
            )
            running = [row[0] for row in cursor.fetchall()]
            if not running or time.monotonic() >= deadline:
                break
            time.sleep(0.1)
    waited = [f"{source.name}: transaction {xid} still running" for xid in running]
    return int(max_id) + 1, waited


def plan_ranges(
    run: ExportRun, source: SourceTable, horizon: int, range_size: int, alias: str
) -> int:
    """Create pending ranges from the watermark up to ``horizon``; returns how many."""
    ranges = ExportRange.objects.using(alias).filter(
        destination=run.destination, source=source.name
    )
    watermark = ranges.aggregate(m=Max("hi"))["m"]
    if watermark is None:
        with connections[alias].cursor() as cursor:
            cursor.execute(f"SELECT min(id) FROM {source.table} WHERE id < %s", [horizon])
            first = cursor.fetchone()[0]
        if first is None:
            return 0
        watermark = int(first)
    planned = []
    lo = watermark
    while lo < horizon:
        # Aligned bounds: ranges stay the same size whatever the first id was.
        hi = min((lo // range_size + 1) * range_size, horizon)
        planned.append(
            ExportRange(run=run, destination=run.destination, source=source.name, lo=lo, hi=hi)
        )
        lo = hi
    ExportRange.objects.using(alias).bulk_create(planned, batch_size=1000)
    return len(planned)


def source_figures(
    source: SourceTable, lo: int, hi: int, alias: str
) -> tuple[int, int, datetime | None, datetime | None]:
    """(rows, checksum, oldest, newest time) of ``[lo, hi)`` in the database: one short read."""
    with connections[alias].cursor() as cursor:
        cursor.execute(
            f"SELECT count(*), coalesce(sum({sql_row_hash(source)}), 0)::bigint, "
            f"min({source.time_column}), max({source.time_column}) "
            f"FROM {source.table} WHERE id >= %s AND id < %s",
            [lo, hi],
        )
        rows, checksum, oldest, newest = cursor.fetchone()
    return int(rows), int(checksum), oldest, newest


def recheck_recent(source: SourceTable, destination: str, alias: str) -> None:
    """Re-verify the newest unpruned verified ranges against the database.

    A row committed late into an already exported range (see :func:`safe_horizon`) changes
    that range's figures; the range then goes back to ``mismatch`` and is exported again.
    """
    recent = (
        ExportRange.objects.using(alias)
        .filter(destination=destination, source=source.name, status=ExportRangeStatus.VERIFIED)
        .order_by("-lo")[:RECHECK_RANGES]
    )
    for record in recent:
        rows, checksum, _, _ = source_figures(source, record.lo, record.hi, alias)
        if (rows, checksum) != (record.source_rows, record.source_checksum):
            record.status = ExportRangeStatus.MISMATCH
            record.save(using=alias, update_fields=["status"])


def read_ranges(
    spark: SparkSession, source: SourceTable, ranges: list[ExportRange], alias: str
) -> DataFrame:
    """One JDBC partition per range; each is its own connection and its own short read."""
    from pyspark.sql import functions as F

    target = jdbc_target(alias)
    predicates = [f"id >= {r.lo} AND id < {r.hi}" for r in ranges]
    table = f"(SELECT {source.select_list} FROM {source.table}) AS src"
    properties = target.options(fetchsize=JDBC_FETCHSIZE)
    properties.pop("url")
    frame = spark.read.jdbc(target.url, table, predicates=predicates, properties=properties)
    range_of = F.lit(None).cast("bigint")
    for r in reversed(ranges):
        range_of = F.when((F.col("id") >= r.lo) & (F.col("id") < r.hi), F.lit(r.lo)).otherwise(
            range_of
        )
    return frame.withColumn("day", F.to_date(F.col(source.time_column))).withColumn(
        "id_range", range_of
    )


def export_batch(
    spark: SparkSession,
    run: ExportRun,
    source: SourceTable,
    destination: str,
    batch: list[ExportRange],
    alias: str,
) -> int:
    """Write a few ranges in one Spark job, then verify each one; returns rows written."""
    root = f"{destination}/{source.name}"
    _remove_range_dirs(spark, root, [r.lo for r in batch])
    directory = local_directory(root)
    figures = None
    if directory is not None:
        figures = write_ranges_direct(spark, source, directory, batch, alias)
    else:
        write_ranges_with_spark(spark, source, root, batch, alias)
    now = timezone.now()
    for record in batch:
        record.status = ExportRangeStatus.WRITTEN
        record.run = run
        record.attempts += 1
        record.exported_at = now
    ExportRange.objects.using(alias).bulk_update(
        batch, ["status", "run", "attempts", "exported_at"]
    )
    return _verify_batch(spark, source, root, batch, alias, figures)


def local_directory(url: str) -> str | None:
    """The local directory ``url`` names (a plain path or ``file://``), else None."""
    parts = urlsplit(url)
    if parts.scheme == "file":
        return os.path.abspath(unquote(parts.path))
    if parts.scheme == "" or (len(parts.scheme) == 1 and os.name == "nt"):
        return os.path.abspath(url)
    return None


def write_ranges_direct(
    spark: SparkSession, source: SourceTable, directory: str, batch: list[ExportRange], alias: str
) -> dict[int, RangeFigures]:
    """One Spark task per range: psycopg COPY -> Arrow -> Parquet, written by the task itself.

    Measured faster than the JDBC source plus Spark's partitioned writer (see the how-to):
    no JVM row conversion, no partitionBy sort, and the checksum is computed by PostgreSQL
    in the read's own snapshot instead of by reading the files back through Spark.
    """
    job = RangeJob(
        dsn=psycopg_dsn(alias),
        table=source.table,
        columns=tuple(source.columns),
        time_column=source.time_column,
        checksum_sql=sql_row_hash(source),
        root=directory,
    )
    specs = [(r.lo, r.hi) for r in batch]
    context = spark.sparkContext
    context.setJobDescription(f"pgq_pipeline export {source.name} ids {specs[0][0]}..")
    try:
        rdd = context.parallelize(specs, len(specs))
        figures = rdd.mapPartitions(partial(export_ranges, job)).collect()
    finally:
        context.setJobDescription(None)  # type: ignore[arg-type]
    return {f.lo: f for f in figures}


def write_ranges_with_spark(
    spark: SparkSession, source: SourceTable, root: str, batch: list[ExportRange], alias: str
) -> None:
    """For a URL Python workers cannot write (s3a://, hdfs://...): JDBC -> Spark's writer."""
    frame = read_ranges(spark, source, batch, alias)
    (
        frame.write.mode("append")
        .partitionBy("queue", "day", "id_range")
        .option("compression", "zstd")
        .parquet(root)
    )


def _verify_batch(
    spark: SparkSession,
    source: SourceTable,
    root: str,
    batch: list[ExportRange],
    alias: str,
    figures: dict[int, RangeFigures] | None,
) -> int:
    """Compare each range's database figures with its files; mark verified or mismatch."""
    written = _read_back(spark, source, root, [r.lo for r in batch]) if figures is None else {}
    rows_total = 0
    for record in batch:
        if figures is None:
            rows, checksum, oldest, newest = source_figures(source, record.lo, record.hi, alias)
            parquet_rows, parquet_checksum = written.get(record.lo, (0, 0))
        else:
            got = figures[record.lo]
            rows, checksum = got.rows, got.checksum
            oldest, newest = _from_micros(got.oldest_us), _from_micros(got.newest_us)
            # The files hold exactly the rows read (ids read back one to one), and those
            # rows' checksum is PostgreSQL's, taken in the same snapshot as the read.
            parquet_rows = got.parquet_rows
            parquet_checksum = got.checksum if got.ids_match else -1
        record.source_rows, record.source_checksum = rows, checksum
        record.parquet_rows, record.parquet_checksum = parquet_rows, parquet_checksum
        record.min_at, record.max_at = oldest, newest
        if (rows, checksum) == (parquet_rows, parquet_checksum):
            record.status = ExportRangeStatus.VERIFIED
            record.verified_at = timezone.now()
        else:
            record.status = ExportRangeStatus.MISMATCH
        rows_total += parquet_rows
    ExportRange.objects.using(alias).bulk_update(
        batch,
        [
            "status",
            "source_rows",
            "source_checksum",
            "parquet_rows",
            "parquet_checksum",
            "min_at",
            "max_at",
            "verified_at",
        ],
    )
    return rows_total


def _from_micros(micros: int | None) -> datetime | None:
    if micros is None:
        return None
    return datetime(1970, 1, 1, tzinfo=UTC) + timedelta(microseconds=micros)


def read_export(spark: SparkSession, destination: str, source: str) -> DataFrame:
    """The exported rows of ``source`` as Spark reads them back (partition values as text)."""
    spark.conf.set("spark.sql.sources.partitionColumnTypeInference.enabled", "false")
    root = f"{destination.rstrip('/')}/{source}"
    return spark.read.option("basePath", root).parquet(root)


def _read_back(
    spark: SparkSession, source: SourceTable, root: str, los: list[int]
) -> dict[int, tuple[int, int]]:
    """Per range: (rows, checksum) of the Parquet files on disk, computed by Spark."""
    from pyspark.sql import functions as F

    fs, _ = hadoop_fs(spark, root)
    jvm = spark.sparkContext._jvm
    assert jvm is not None
    # Only the directories of these ranges: listing the whole export would grow with it.
    paths = []
    for lo in los:
        pattern = f"{root}/queue=*/day=*/id_range={lo}"
        if fs.globStatus(jvm.org.apache.hadoop.fs.Path(pattern)):
            paths.append(pattern)
    if not paths:
        return {}
    spark.conf.set("spark.sql.sources.partitionColumnTypeInference.enabled", "false")
    frame = spark.read.option("basePath", root).parquet(*paths)
    figures = (
        frame.groupBy("id_range")
        .agg(F.count(F.lit(1)).alias("rows"), F.sum(spark_row_hash(source)).alias("checksum"))
        .collect()
    )
    return {int(row["id_range"]): (int(row["rows"]), int(row["checksum"] or 0)) for row in figures}


def _remove_range_dirs(spark: SparkSession, root: str, los: list[int]) -> None:
    """Delete what an earlier, interrupted attempt of these ranges may have left."""
    fs, base = hadoop_fs(spark, root)
    if not fs.exists(base):
        return
    jvm = spark.sparkContext._jvm
    assert jvm is not None
    for lo in los:
        pattern = jvm.org.apache.hadoop.fs.Path(f"{root}/queue=*/day=*/id_range={lo}")
        for status in fs.globStatus(pattern) or []:
            fs.delete(status.getPath(), True)


def verified_ranges(destination: str | None, source: str, alias: str) -> Any:
    """Verified, not yet pruned ranges (of one destination, or of any when None)."""
    query = Q(source=source, status=ExportRangeStatus.VERIFIED)
    if destination is not None:
        query &= Q(destination=destination.rstrip("/"))
    return ExportRange.objects.using(alias).filter(query).order_by("lo")
