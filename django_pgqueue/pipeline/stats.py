"""stats: per queue, task and UTC hour, what was processed, what failed and how long it took.

Spark reads the window's archive and dead rows through JDBC (id-partitioned, each partition its
own short read), aggregates them with its own engine (exact percentiles) and the driver
replaces the window's rows of the stats table in one transaction, so readers never see a
half-written window.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import TYPE_CHECKING, Any

from django.db import connections, transaction

from ..conf import get_settings
from ..exceptions import PipelineError
from .columns import ARCHIVE, DEAD, SourceTable
from .models import QueueStatsHourly
from .progress import Progress, SparkJobWatch
from .session import JDBC_FETCHSIZE, default_parallelism, jdbc_target

if TYPE_CHECKING:
    from pyspark.sql import DataFrame, SparkSession

TOP_ERRORS = 5
SIGNATURE_LENGTH = 200
_ERRORS_SCHEMA = "array<struct<type:string,message:string>>"


@dataclass
class StatsResult:
    since: datetime
    until: datetime
    rows_read: int
    groups: int
    seconds: float


def stats(
    spark: SparkSession,
    *,
    hours: int = 24,
    since: datetime | None = None,
    until: datetime | None = None,
    report: Callable[[str], None] | None = None,
    using: str | None = None,
) -> StatsResult:
    """Recompute the hourly stats of ``[since, until)`` (default: the last ``hours`` hours,
    current hour included) and replace those hours in the stats table."""
    alias = using or get_settings().DATABASE_ALIAS
    started = time.monotonic()
    with connections[alias].cursor() as cursor:
        cursor.execute("SELECT date_trunc('hour', now()) + interval '1 hour'")
        next_hour = cursor.fetchone()[0]
    until = _hour(until) if until is not None else next_hour
    since = _hour(since) if since is not None else until - timedelta(hours=hours)
    if since >= until:
        raise PipelineError(f"Empty stats window: since {since} is not before until {until}.")
    progress = Progress("stats", 3, report)
    archive = _read(spark, ARCHIVE, since, until, alias).cache()
    dead = _read(spark, DEAD, since, until, alias).cache()
    try:
        with SparkJobWatch(spark, progress, "reading"):
            rows_read = archive.count() + dead.count()
        progress.advance(rows_read, note="read")
        with SparkJobWatch(spark, progress, "aggregating"):
            groups = aggregate(archive, dead)
        progress.advance(0, note=f"{len(groups)} queue/task/hour groups")
    finally:
        archive.unpersist()
        dead.unpersist()
    with transaction.atomic(using=alias):
        QueueStatsHourly.objects.using(alias).filter(hour__gte=since, hour__lt=until).delete()
        QueueStatsHourly.objects.using(alias).bulk_create(groups, batch_size=1000)
    progress.advance(0, note="written")
    return StatsResult(since, until, rows_read, len(groups), time.monotonic() - started)


def _hour(moment: datetime) -> datetime:
    if moment.tzinfo is None:
        raise PipelineError(f"Stats window bounds must be timezone-aware, got {moment!r}.")
    return moment.replace(minute=0, second=0, microsecond=0)


def _read(
    spark: SparkSession, source: SourceTable, since: datetime, until: datetime, alias: str
) -> DataFrame:
    extra = "started_at, " if source is ARCHIVE else "reason, "
    time_column = source.time_column
    with connections[alias].cursor() as cursor:
        cursor.execute(f"SELECT coalesce(min(id), 0), coalesce(max(id), 0) FROM {source.table}")
        low, high = cursor.fetchone()
    table = (
        f"(SELECT id, queue, task, enqueued_at, {extra}{time_column} AS at, attempts, "
        f"errors::text AS errors FROM {source.table} "
        f"WHERE {time_column} >= '{since.isoformat()}' AND {time_column} < '{until.isoformat()}'"
        ") AS window_rows"
    )
    target = jdbc_target(alias)
    return (
        spark.read.format("jdbc")
        .options(
            **target.options(
                dbtable=table,
                fetchsize=JDBC_FETCHSIZE,
                partitionColumn="id",
                lowerBound=low,
                upperBound=high + 1,
                numPartitions=default_parallelism(spark),
            )
        )
        .load()
    )


def aggregate(archive: DataFrame, dead: DataFrame) -> list[QueueStatsHourly]:
    """The stats rows for every (queue, task, hour) present in either frame."""
    from pyspark.sql import Window
    from pyspark.sql import functions as F

    key = ["queue", "task", "hour"]

    def prepared(frame: DataFrame) -> DataFrame:
        return frame.withColumn("hour", F.date_trunc("hour", "at")).withColumn(
            "errs", F.coalesce(F.from_json("errors", _ERRORS_SCHEMA), F.array())
        )

    a = prepared(archive)
    d = prepared(dead)
    seconds = lambda start, end: (F.unix_micros(end) - F.unix_micros(start)) / 1e6  # noqa: E731
    quantiles = F.array(F.lit(0.5), F.lit(0.95), F.lit(0.99))
    processed = (
        a.withColumn("wait", seconds(F.col("enqueued_at"), F.col("started_at")))
        .withColumn("run", seconds(F.col("started_at"), F.col("at")))
        .groupBy(*key)
        .agg(
            F.count(F.lit(1)).alias("processed"),
            F.sum(F.size("errs")).alias("failed"),
            F.percentile("wait", quantiles).alias("wait"),
            F.percentile("run", quantiles).alias("run"),
        )
        .collect()
    )
    died = (
        d.groupBy(*key, "reason")
        .agg(F.count(F.lit(1)).alias("n"), F.sum(F.size("errs")).alias("failed"))
        .collect()
    )
    attempts = (
        a.select(*key, "attempts")
        .unionByName(d.select(*key, "attempts"))
        .groupBy(*key, "attempts")
        .count()
        .collect()
    )
    signature = F.substring(
        F.concat_ws(
            ": ",
            F.coalesce(F.col("e.type"), F.lit("?")),
            F.regexp_replace(F.coalesce(F.col("e.message"), F.lit("")), "[0-9]+", "N"),
        ),
        1,
        SIGNATURE_LENGTH,
    )
    ranked = Window.partitionBy(*key).orderBy(F.desc("count"), F.asc("signature"))
    errors = (
        a.select(*key, "errs")
        .unionByName(d.select(*key, "errs"))
        .select(*key, F.explode("errs").alias("e"))
        .select(*key, signature.alias("signature"))
        .groupBy(*key, "signature")
        .count()
        .withColumn("rank", F.row_number().over(ranked))
        .where(F.col("rank") <= TOP_ERRORS)
        .orderBy(*key, "rank")
        .collect()
    )

    rows: dict[tuple[str, str, datetime], QueueStatsHourly] = {}

    def row_for(r: Any) -> QueueStatsHourly:
        hour = _utc(r["hour"])
        group = (r["queue"], r["task"], hour)
        if group not in rows:
            rows[group] = QueueStatsHourly(
                queue=r["queue"],
                task=r["task"],
                hour=hour,
                dead_by_reason={},
                attempts_histogram={},
                top_errors=[],
            )
        return rows[group]

    for r in processed:
        stat = row_for(r)
        stat.processed = int(r["processed"])
        stat.failed += int(r["failed"] or 0)
        stat.wait_p50, stat.wait_p95, stat.wait_p99 = r["wait"] or (None, None, None)
        stat.run_p50, stat.run_p95, stat.run_p99 = r["run"] or (None, None, None)
    for r in died:
        stat = row_for(r)
        stat.dead += int(r["n"])
        stat.failed += int(r["failed"] or 0)
        stat.dead_by_reason[r["reason"]] = int(r["n"])
    for r in attempts:
        stat = row_for(r)
        stat.attempts_histogram[str(r["attempts"])] = int(r["count"])
    for r in errors:
        row_for(r).top_errors.append({"signature": r["signature"], "count": int(r["count"])})
    return sorted(rows.values(), key=lambda s: (s.hour, s.queue, s.task))


def _utc(moment: datetime) -> datetime:
    """Spark hands back naive datetimes in the Python process's zone; make them aware UTC."""
    from datetime import UTC

    if moment.tzinfo is not None:
        return moment.astimezone(UTC)
    return moment.astimezone().astimezone(UTC)
