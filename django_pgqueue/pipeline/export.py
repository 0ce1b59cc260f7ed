"""export: archive and dead-letter rows -> Delta Lake tables, in verified, resumable id ranges.

Layout: one Delta Lake table per source, ``<destination>/<archive|dead>``, partitioned by
``queue``, ``day`` (the UTC day of ``finished_at`` / ``died_at``) and ``id_range``; each range
becomes part of it through one Delta commit (:mod:`committed`, :mod:`commit`).

One run writes a destination at a time: it holds the destination's lease (:mod:`lease`).
Each range is one Spark task: one psycopg ``COPY`` of the range (one short statement), the
row hash of the text read, pyarrow writes the files and they are read back, hashed and their
ids compared with the rows read (:mod:`rangeio`); the driver then commits the verified range.
For URLs Python workers cannot write (``s3a://``, ``hdfs://``...) ranges are read by Spark's
JDBC source, one predicate each, and written by Spark's writer, then verified by reading the
files back through Spark. Either way nothing holds a snapshot open for the whole export, so
the primary's xmin is never pinned. See docs/how-to/pipeline.md for the safe-horizon rule that
keeps late committing transactions from being skipped.
"""

from __future__ import annotations

import json
import os
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from functools import partial
from typing import TYPE_CHECKING

from django.db import connections, transaction
from django.db.models import Max
from django.utils import timezone

from ..conf import get_settings
from ..exceptions import ForeignOutput, PipelineError
from .columns import SOURCES, SourceTable, sql_row_hash
from .commit import Committer, HadoopCommitter, LocalCommitter, StagedFile, WrittenFile
from .committed import (
    arrow_schema,
    check_file_mode,
    files_by_range,
    local_directory,
    open_table,
)
from .lease import DEFAULT_LEASE_SECONDS, Heartbeat, Lease, acquire, release
from .merged import finish_interrupted
from .models import (
    ExportRange,
    ExportRangeStatus,
    ExportRun,
    ExportRunStatus,
)
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
#: Owner-only: payloads are application data. Directories get the matching 0700.
DEFAULT_FILE_MODE = 0o600
#: Verified ranges not yet pruned whose row count each run checks again against the database.
RECHECK_RANGES = 2
_OWN_ENTRIES = {MARKER_NAME, "archive", "dead", "_SUCCESS"}


@dataclass
class ExportResult:
    run_id: int | None
    destination: str
    rows_exported: int = 0
    ranges_exported: int = 0
    ranges_verified: int = 0
    ids_left: int = 0  # ids below the safe horizon left for the next run by max_ranges
    mismatched: list[str] = field(default_factory=list)
    horizons: dict[str, int] = field(default_factory=dict)
    waited_for: list[str] = field(default_factory=list)
    took_over_from: int | None = None
    leftovers_removed: int = 0
    warnings: list[str] = field(default_factory=list)
    seconds: float = 0.0

    @property
    def rows_per_second(self) -> float:
        return self.rows_exported / self.seconds if self.seconds > 0 else 0.0


def check_max_ranges(max_ranges: int | None) -> int | None:
    if max_ranges is not None and max_ranges < 1:
        raise PipelineError(f"max_ranges must be >= 1 (or None for all), got {max_ranges}")
    return max_ranges


def export(
    spark: SparkSession,
    destination: str,
    *,
    sources: Iterable[str] = ("archive", "dead"),
    range_size: int = DEFAULT_RANGE_SIZE,
    ranges_per_job: int | None = None,
    max_ranges: int | None = None,
    horizon_wait: float = 30.0,
    report: Callable[[str], None] | None = None,
    using: str | None = None,
    master: str = "",
    file_mode: int = DEFAULT_FILE_MODE,
    lease_seconds: float = DEFAULT_LEASE_SECONDS,
) -> ExportResult:
    """Export every archive / dead row below the safe horizon that is not exported yet.

    Re-running adds nothing; after a crash the next run re-does only the ranges that were not
    committed, after deleting what the crashed run left. ``max_ranges`` bounds how many
    ranges of each source one run exports, oldest first; the rest waits for the next run.
    Raises :class:`ForeignOutput` when ``destination`` holds files not written here and
    :class:`DestinationBusy` when another run holds its lease.
    """
    if range_size < 1:
        raise PipelineError(f"range_size must be >= 1, got {range_size}")
    check_max_ranges(max_ranges)
    check_file_mode(file_mode)
    alias = using or get_settings().DATABASE_ALIAS
    destination = destination.rstrip("/")
    chosen = [_source(name) for name in sources]
    check_destination(spark, destination)
    with transaction.atomic(using=alias):
        run = ExportRun.objects.using(alias).create(destination=destination, master=master)
        lease = acquire(destination, run, lease_seconds, alias)
    started = time.monotonic()
    result = ExportResult(
        run_id=run.pk, destination=destination, took_over_from=lease.taken_over_from
    )
    try:
        with Heartbeat(lease) as heartbeat:
            committer = _committer(spark, destination, file_mode)
            create_destination(spark, committer, alias)
            todo: list[tuple[SourceTable, list[ExportRange]]] = []
            cleanup = _needs_cleanup(lease, run, alias)
            for source in chosen:
                horizon, waited = safe_horizon(source, alias, horizon_wait)
                result.horizons[source.name] = horizon
                result.waited_for += waited
                unfinished = (
                    ExportRange.objects.using(alias)
                    .filter(destination=destination, source=source.name)
                    .exclude(status__in=[ExportRangeStatus.VERIFIED, ExportRangeStatus.PRUNED])
                )
                # A bounded run plans only the ranges it exports: a run's last range ends at
                # its horizon, so ranges planned and left would make later ranges short.
                limit = None if max_ranges is None else max(0, max_ranges - unfinished.count())
                planned_to = plan_ranges(run, source, horizon, range_size, alias, limit)
                result.warnings += reconcile_table(committer, source, destination, alias)
                recheck_recent(source, destination, alias)
                pending = list(unfinished.order_by("lo"))
                if cleanup or any(
                    r.attempts or r.status != ExportRangeStatus.PENDING for r in pending
                ):
                    result.leftovers_removed += remove_leftovers(committer, source, pending)
                taken = pending if max_ranges is None else pending[:max_ranges]
                left = pending[len(taken) :]
                result.ids_left += max(0, horizon - planned_to) + sum(r.hi - r.lo for r in left)
                todo.append((source, taken))
            run.archive_horizon = result.horizons.get("archive")
            run.dead_horizon = result.horizons.get("dead")
            run.ranges_total = sum(len(ranges) for _, ranges in todo)
            run.save(using=alias)
            progress = Progress("export", run.ranges_total, report)
            # A few ranges per core per Spark job: job start-up costs more than a range on
            # small ranges, and a failed job redoes at most this many ranges.
            per_job = ranges_per_job or 4 * default_parallelism(spark)
            for source, ranges in todo:
                for start in range(0, len(ranges), per_job):
                    batch = ranges[start : start + per_job]
                    rows = export_batch(spark, run, source, committer, batch, alias, heartbeat)
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
        _release_quietly(lease)
        result.seconds = time.monotonic() - started
    return result


def _release_quietly(lease: Lease) -> None:
    try:
        release(lease)
    except Exception:  # an unreleased lease expires by itself
        pass


def _committer(spark: SparkSession, destination: str, file_mode: int) -> Committer:
    if local_directory(destination) is not None:
        return LocalCommitter(destination, file_mode)
    return HadoopCommitter(spark, destination, file_mode)


def _needs_cleanup(lease: Lease, run: ExportRun, alias: str) -> bool:
    """Whether an earlier run may have left files: it was taken over, failed or killed."""
    if lease.taken_over_from is not None:
        return True
    previous = (
        ExportRun.objects.using(alias)
        .filter(destination=run.destination, pk__lt=run.pk)
        .order_by("-pk")
        .first()
    )
    return previous is not None and previous.status != ExportRunStatus.COMPLETED


def _source(name: str) -> SourceTable:
    try:
        return SOURCES[name]
    except KeyError:
        raise PipelineError(f"Unknown export source {name!r}; use archive and/or dead.") from None


def check_destination(spark: SparkSession | None, destination: str) -> None:
    """Refuse a destination holding foreign files. Creates nothing."""
    directory = local_directory(destination)
    if directory is not None:
        if not os.path.exists(directory):
            return
        if not os.path.isdir(directory):
            raise ForeignOutput(f"Export destination {destination} is a file, not a directory.")
        names = sorted(os.listdir(directory))
        has_marker = MARKER_NAME in names
    else:
        assert spark is not None
        fs, root = hadoop_fs(spark, destination)
        if not fs.exists(root):
            return
        if not fs.getFileStatus(root).isDirectory():
            raise ForeignOutput(f"Export destination {destination} is a file, not a directory.")
        names = sorted(status.getPath().getName() for status in fs.listStatus(root))
        has_marker = MARKER_NAME in names
    foreign = [n for n in names if n not in _OWN_ENTRIES and not n.startswith((".", "_"))]
    if foreign or (names and not has_marker):
        shown = ", ".join((foreign or names)[:5])
        raise ForeignOutput(
            f"Export destination {destination} holds files pgq_pipeline did not write "
            f"({shown}). Choose an empty or new directory; the export never deletes or "
            "mixes with foreign data."
        )


def create_destination(spark: SparkSession, committer: Committer, alias: str) -> None:
    """Create the destination (owner-only by default) and mark it as an export's."""
    name = connections[alias].settings_dict.get("NAME")
    text = json.dumps({"written_by": "django_pgqueue pgq_pipeline export", "database": name})
    marker = f"{committer.destination}/{MARKER_NAME}"
    if isinstance(committer, LocalCommitter):
        committer.create_root()
        if not os.path.exists(marker):
            descriptor = os.open(marker, os.O_WRONLY | os.O_CREAT | os.O_EXCL, committer.file_mode)
            with os.fdopen(descriptor, "w") as stream:
                stream.write(text)
        return
    fs, root = hadoop_fs(spark, committer.destination)
    jvm = spark.sparkContext._jvm
    assert jvm is not None
    path = jvm.org.apache.hadoop.fs.Path(root, MARKER_NAME)
    if not fs.exists(path):
        fs.mkdirs(root)
        stream = fs.create(path, False)
        stream.write(bytearray(text.encode()))
        stream.close()


def reconcile_table(
    committer: Committer, source: SourceTable, destination: str, alias: str
) -> list[str]:
    """Verified ranges whose files the table no longer holds (deleted by hand) are exported
    again. Pruned ranges cannot be: their rows left the database. Those are reported."""
    finish_interrupted(committer, source, destination, alias)
    present = files_by_range(committer.table(source))
    done = ExportRange.objects.using(alias).filter(
        destination=destination,
        source=source.name,
        status__in=[ExportRangeStatus.VERIFIED, ExportRangeStatus.PRUNED],
        parquet_rows__gt=0,
    )
    missing_verified, missing_pruned = [], []
    for record in done.only("pk", "lo", "hi", "status"):
        if record.lo in present:
            continue
        if record.status == ExportRangeStatus.VERIFIED:
            missing_verified.append(record.pk)
        else:
            missing_pruned.append(record)
    if missing_verified:
        ExportRange.objects.using(alias).filter(pk__in=missing_verified).update(
            status=ExportRangeStatus.MISMATCH
        )
    if not missing_pruned:
        return []
    shown = ", ".join(f"[{r.lo}, {r.hi})" for r in missing_pruned[:5])
    return [
        f"{len(missing_pruned)} pruned {source.name} ranges are no longer in the table at "
        f"{destination} ({shown}...): their rows were deleted from the database after export, "
        "so only a backup of the files (or an older table version) can bring them back."
    ]


#: Transactions running *in this database*, other than this session's: each holds the lock on
#: its own transaction id, and pg_stat_activity says which database its backend is in;
#: prepared transactions name their database. Transactions of other databases on the same
#: server cannot write this table, so they are never waited for.
RUNNING_HERE_SQL = """
    SELECT l.transactionid::text FROM pg_locks AS l JOIN pg_stat_activity AS a ON a.pid = l.pid
    WHERE l.locktype = 'transactionid' AND l.mode = 'ExclusiveLock' AND l.granted
      AND a.datname = current_database() AND l.pid <> pg_backend_pid()
    UNION
    SELECT p.transaction::text FROM pg_prepared_xacts AS p WHERE p.database = current_database()
"""


def safe_horizon(source: SourceTable, alias: str, wait: float) -> tuple[int, list[str]]:
    """The id below which every row of ``source`` is committed (or never will be).

    Ids come from a sequence taken in insertion order, so a transaction that took id 10 may
    commit after one that took id 11. The horizon is ``max(id) + 1`` as seen now, but only
    once every transaction of this database that was running at that moment has ended: rows
    they were still writing below that id are then visible or gone for good. Moves into the
    archive delete the live row first, so each writer has its transaction id before it draws
    an archive id. Waiting is bounded by ``wait`` seconds; past it the horizon is used anyway
    and the late rows are caught by the re-check of recent ranges and by prune's exact
    verification.
    """
    with connections[alias].cursor() as cursor:
        cursor.execute(
            f"SELECT coalesce(max(id), 0), ARRAY({RUNNING_HERE_SQL}) FROM {source.table}"
        )
        max_id, running = cursor.fetchone()
        deadline = time.monotonic() + wait
        while running and time.monotonic() < deadline:
            time.sleep(0.1)
            # Still running: a transaction id keeps its lock until the transaction ends.
            cursor.execute(
                f"SELECT * FROM ({RUNNING_HERE_SQL}) AS running(xid) WHERE xid = ANY(%s)",
                [running],
            )
            running = [row[0] for row in cursor.fetchall()]
    waited = [f"{source.name}: transaction {xid} still running" for xid in running]
    return int(max_id) + 1, waited


def plan_ranges(
    run: ExportRun,
    source: SourceTable,
    horizon: int,
    range_size: int,
    alias: str,
    limit: int | None = None,
) -> int:
    """Create pending ranges (at most ``limit``) from the watermark towards ``horizon``;
    returns the id up to which ranges are now planned."""
    ranges = ExportRange.objects.using(alias).filter(
        destination=run.destination, source=source.name
    )
    watermark = ranges.aggregate(m=Max("hi"))["m"]
    first_range = watermark is None
    if first_range:
        with connections[alias].cursor() as cursor:
            cursor.execute(f"SELECT min(id) FROM {source.table} WHERE id < %s", [horizon])
            first = cursor.fetchone()[0]
        if first is None:
            return horizon
        watermark = int(first)
    planned: list[ExportRange] = []
    lo = watermark
    while lo < horizon and (limit is None or len(planned) < limit):
        # Aligned bounds: ranges stay the same size whatever the first id was.
        hi = min((lo // range_size + 1) * range_size, horizon)
        # The very first range starts at 0: a row committed late with an id below the first
        # one seen (see safe_horizon) still falls in a range.
        start = 0 if first_range and not planned else lo
        planned.append(
            ExportRange(run=run, destination=run.destination, source=source.name, lo=start, hi=hi)
        )
        lo = hi
    ExportRange.objects.using(alias).bulk_create(planned, batch_size=1000)
    return lo


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


def source_count(source: SourceTable, lo: int, hi: int, alias: str) -> int:
    """Rows of ``[lo, hi)`` in the database: an index-only count, no row is read or hashed."""
    with connections[alias].cursor() as cursor:
        cursor.execute(f"SELECT count(*) FROM {source.table} WHERE id >= %s AND id < %s", [lo, hi])
        return int(cursor.fetchone()[0])


def recheck_recent(source: SourceTable, destination: str, alias: str) -> None:
    """Count the rows of the newest unpruned verified ranges in the database again.

    A row committed late into an already exported range (see :func:`safe_horizon`), or a
    dead letter retried out of one, changes that range's row count; the range then goes back
    to ``mismatch`` and is exported again. The count is enough here: the product only ever
    adds or deletes archived and dead rows, and prune verifies every row's hash before it
    deletes, so a row changed in place is refused there. Counting reads the id index only,
    where hashing every row again would cost each pass as much as exporting it.
    A range whose rows were pruned through another destination is left as it is: its files
    here are the copy of rows the database no longer has.
    """
    for record in changed_recent_ranges(source, destination, alias):
        record.status = ExportRangeStatus.MISMATCH
        record.save(using=alias, update_fields=["status"])


def changed_recent_ranges(source: SourceTable, destination: str, alias: str) -> list[ExportRange]:
    """The newest unpruned verified ranges whose row count in the database has changed."""
    recent = (
        ExportRange.objects.using(alias)
        .filter(destination=destination, source=source.name, status=ExportRangeStatus.VERIFIED)
        .order_by("-lo")[:RECHECK_RANGES]
    )
    return [
        record
        for record in recent
        if not pruned_elsewhere(record, alias)
        and source_count(source, record.lo, record.hi, alias) != record.source_rows
    ]


def pruned_elsewhere(record: ExportRange, alias: str) -> bool:
    """Whether another destination pruned ids of this range (they left the database)."""
    return (
        ExportRange.objects.using(alias)
        .filter(
            source=record.source,
            status=ExportRangeStatus.PRUNED,
            lo__lt=record.hi,
            hi__gt=record.lo,
        )
        .exclude(destination=record.destination)
        .exists()
    )


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
    committer: Committer,
    batch: list[ExportRange],
    alias: str,
    heartbeat: Heartbeat,
) -> int:
    """Write a few ranges in one Spark job, verify each one, commit the verified ones."""
    if isinstance(committer, LocalCommitter):
        figures = write_ranges_direct(
            spark, source, committer.source_root(source.name), batch, alias, committer.file_mode
        )
    else:
        assert isinstance(committer, HadoopCommitter)
        figures = write_ranges_with_spark(spark, source, committer, batch, alias)
    now = timezone.now()
    for record in batch:
        record.status = ExportRangeStatus.WRITTEN
        record.run = run
        record.attempts += 1
        record.exported_at = now
    ExportRange.objects.using(alias).bulk_update(
        batch, ["status", "run", "attempts", "exported_at"]
    )
    rows_total = 0
    heartbeat.check()
    for record in batch:
        got = figures[record.lo]
        record.source_rows, record.source_checksum = got.rows, got.checksum
        record.min_at, record.max_at = _from_micros(got.oldest_us), _from_micros(got.newest_us)
        # Verified: the files, read back, hold as many rows with the same checksum as the
        # database sent, and (direct writes) exactly the ids read.
        record.parquet_rows = got.parquet_rows
        record.parquet_checksum = got.parquet_checksum if got.ids_match else -1
        written = [WrittenFile(*f) for f in got.files]
        if (got.rows, got.checksum) == (record.parquet_rows, record.parquet_checksum):
            info = range_info("export", source, record, run.pk)
            committer.commit(source, run.pk, info, written, committer.files_of(source, [record.lo]))
            record.files = recorded_files(committer, source, written)
            record.status = ExportRangeStatus.VERIFIED
            record.verified_at = timezone.now()
        else:
            # Keep what was committed before (if anything); drop this attempt's files.
            for f in written:
                committer.delete(f.path)
            record.status = ExportRangeStatus.MISMATCH
        rows_total += record.parquet_rows
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
            "files",
        ],
    )
    return rows_total


def range_info(operation: str, source: SourceTable, record: ExportRange, run: int) -> dict:
    """What a commit says about its range (``pgqueue`` in the Delta commit info)."""
    return {
        "operation": operation,
        "source": source.name,
        "lo": record.lo,
        "hi": record.hi,
        "rows": record.parquet_rows,
        "checksum": record.parquet_checksum,
        "run": run,
    }


def recorded_files(
    committer: Committer, source: SourceTable, written: Iterable[WrittenFile]
) -> list[dict]:
    """The files of a committed range as prune re-verifies them (path relative to the table)."""
    return [
        {
            "path": committer.relative(source.name, f.path),
            "rows": f.rows,
            "bytes": f.bytes,
            "sha256": f.sha256,
        }
        for f in written
    ]


def remove_leftovers(committer: Committer, source: SourceTable, pending: list[ExportRange]) -> int:
    """Delete what interrupted runs left: files of the ranges to redo that no version of the
    table holds. Runs under the lease, before anything is written."""
    if isinstance(committer, HadoopCommitter):
        committer.delete_tree(f"{committer.qualified}/_temporary_ranges/{source.name}")
    return committer.remove_untracked(source, [r.lo for r in pending])


def write_ranges_direct(
    spark: SparkSession,
    source: SourceTable,
    directory: str,
    batch: list[ExportRange],
    alias: str,
    file_mode: int,
) -> dict[int, RangeFigures]:
    """One Spark task per range: psycopg COPY -> Arrow -> Parquet, written by the task itself.

    Rather than the JDBC source plus Spark's partitioned writer: no JVM row conversion, no
    partitionBy sort, and the rows are hashed by the task (what the database sent and what
    the files hold) rather than by PostgreSQL or by reading the files back through Spark.
    """
    job = RangeJob(
        dsn=psycopg_dsn(alias),
        table=source.table,
        columns=tuple(source.columns),
        time_column=source.time_column,
        root=directory,
        file_mode=file_mode,
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
    spark: SparkSession,
    source: SourceTable,
    committer: HadoopCommitter,
    batch: list[ExportRange],
    alias: str,
) -> dict[int, RangeFigures]:
    """For a URL Python workers cannot write (s3a://, hdfs://...): JDBC -> Spark's writer,
    then the files read back through Spark (rows and checksum per file, SHA-256 of each)."""
    temp_root = f"{committer.qualified}/_temporary_ranges/{source.name}"
    frame = read_ranges(spark, source, batch, alias)
    # Written aside, then each file moved to a temporary name in its final directory.
    (
        frame.write.mode("overwrite")
        .partitionBy("queue", "day", "id_range")
        .option("compression", "zstd")
        .parquet(temp_root)
    )
    moved: dict[int, list[StagedFile]] = {r.lo: [] for r in batch}
    for staged in committer.stage(source, temp_root):
        moved[staged.lo].append(staged)
    figures: dict[int, RangeFigures] = {}
    for record in batch:
        rows, checksum, oldest, newest = source_figures(source, record.lo, record.hi, alias)
        files = moved[record.lo]
        figures[record.lo] = RangeFigures(
            lo=record.lo,
            rows=rows,
            checksum=checksum,
            oldest_us=_to_micros(oldest),
            newest_us=_to_micros(newest),
            parquet_rows=sum(f.rows for f in files),
            parquet_checksum=sum(f.checksum for f in files),
            ids_match=True,  # Spark's writer's files are checked by count and checksum only
            files=tuple((f.path, f.rows, f.bytes, f.sha256) for f in files),
        )
    return figures


def _to_micros(moment: datetime | None) -> int | None:
    if moment is None:
        return None
    return (moment - datetime(1970, 1, 1, tzinfo=UTC)) // timedelta(microseconds=1)


def _from_micros(micros: int | None) -> datetime | None:
    if micros is None:
        return None
    return datetime(1970, 1, 1, tzinfo=UTC) + timedelta(microseconds=micros)


def read_export(
    spark: SparkSession, destination: str, source: str, version: int | None = None
) -> DataFrame:
    """The rows of a version of ``source``'s table (the latest by default) as Spark without
    the Delta connector reads them: the version's file list; partition values as text."""
    table = open_table(destination, source, version)
    files = table.file_uris() if table is not None else []
    if table is None or not files:
        import pyarrow as pa
        from pyspark.sql.pandas.types import from_arrow_schema

        text = [pa.field("day", pa.string()), pa.field("id_range", pa.string())]
        schema = pa.schema([*arrow_schema(SOURCES[source].columns), *text])
        return spark.createDataFrame([], from_arrow_schema(schema))
    spark.conf.set("spark.sql.sources.partitionColumnTypeInference.enabled", "false")
    return spark.read.option("basePath", table.table_uri).parquet(*files)


def nothing_to_export(destination: str, sources: Iterable[str], using: str | None = None) -> bool:
    """Whether an export to ``destination`` would find nothing to do, decided from PostgreSQL
    and the local destination's Delta tables, without starting Spark.

    True only when every source has no row past its watermark, no range left to (re)do, the
    ranges a run re-checks are unchanged, no run is left shown running, and every verified
    range holding rows has its files in the latest version of the table.
    """
    alias = using or get_settings().DATABASE_ALIAS
    destination = destination.rstrip("/")
    directory = local_directory(destination)
    if directory is None or not os.path.isdir(directory):
        return False
    runs = ExportRun.objects.using(alias).filter(destination=destination)
    if runs.filter(status=ExportRunStatus.RUNNING).exists():
        return False  # a run to take over (or a live one, which the export will name)
    for name in sources:
        source = _source(name)
        ranges = ExportRange.objects.using(alias).filter(
            destination=destination, source=source.name
        )
        if ranges.exclude(
            status__in=[ExportRangeStatus.VERIFIED, ExportRangeStatus.PRUNED]
        ).exists():
            return False
        watermark = ranges.aggregate(m=Max("hi"))["m"]
        with connections[alias].cursor() as cursor:
            cursor.execute(f"SELECT max(id) FROM {source.table}")
            newest = cursor.fetchone()[0]
        if newest is not None and (watermark is None or newest >= watermark):
            return False
        verified = ranges.filter(status=ExportRangeStatus.VERIFIED, parquet_rows__gt=0)
        table = open_table(destination, source.name)
        if table is None:
            return False
        present = files_by_range(table)
        if any(lo not in present for lo in verified.values_list("lo", flat=True)):
            return False
        if changed_recent_ranges(source, destination, alias):
            return False
    return True
