"""The pipeline's bookkeeping: export runs, per-range export records and hourly queue stats.

These models belong to the ``django_pgqueue.pipeline`` app (label ``django_pgqueue_pipeline``):
its own migration creates their tables, and importing them needs no pyspark.
"""

from __future__ import annotations

from typing import Any

from django.db import models
from django.db.models import Q
from django.db.models.functions import Now

from ..core._validation import QUEUE_NAME_MAX_LENGTH, TASK_NAME_MAX_LENGTH

EXPORT_RUN_TABLE = "pgqueue_export_run"
EXPORT_RANGE_TABLE = "pgqueue_export_range"
EXPORT_LEASE_TABLE = "pgqueue_export_lease"
STATS_TABLE = "pgqueue_stats_hourly"


class ExportSource(models.TextChoices):
    ARCHIVE = "archive", "archive (pgqueue_archive)"
    DEAD = "dead", "dead letters (pgqueue_dead)"


class ExportRunStatus(models.TextChoices):
    RUNNING = "running", "running"
    COMPLETED = "completed", "completed"
    FAILED = "failed", "failed"


class ExportRangeStatus(models.TextChoices):
    PENDING = "pending", "pending (planned, not written yet)"
    WRITTEN = "written", "written (Parquet files in place, not verified yet)"
    VERIFIED = "verified", "verified (Parquet counts and checksums match the database)"
    MISMATCH = "mismatch", "mismatch (will be exported again)"
    PRUNED = "pruned", "pruned (rows deleted from the database after verification)"


class ExportRun(models.Model):
    """One ``pgq_pipeline export`` invocation towards one destination."""

    id = models.BigAutoField(primary_key=True)
    destination = models.TextField(help_text="Local path or Hadoop-compatible URL of the export.")
    status = models.CharField(
        max_length=16, choices=ExportRunStatus.choices, default=ExportRunStatus.RUNNING
    )
    started_at = models.DateTimeField(db_default=Now())
    finished_at = models.DateTimeField(null=True, blank=True)
    master = models.CharField(max_length=255, blank=True, default="")
    archive_horizon = models.BigIntegerField(
        null=True, blank=True, help_text="Archive ids below this were safe to export."
    )
    dead_horizon = models.BigIntegerField(
        null=True, blank=True, help_text="Dead-letter ids below this were safe to export."
    )
    ranges_total = models.IntegerField(default=0)
    ranges_done = models.IntegerField(default=0)
    rows_exported = models.BigIntegerField(default=0)
    error = models.TextField(blank=True, default="")

    class Meta:
        db_table = EXPORT_RUN_TABLE
        verbose_name = "export run"
        constraints = [
            models.CheckConstraint(
                condition=Q(status__in=ExportRunStatus.values), name="pgq_export_run_status"
            )
        ]

    def __str__(self) -> str:
        return f"export #{self.pk} to {self.destination} ({self.status})"


class ExportRange(models.Model):
    """One bounded id range ``[lo, hi)`` of one source table, exported to one destination.

    ``source_rows``/``source_checksum`` are of the rows as the database sent them,
    ``parquet_rows``/``parquet_checksum`` of the files written, read back (:mod:`rowhash`);
    the range is verified only when both pairs agree, and only verified ranges may be pruned.
    """

    id = models.BigAutoField(primary_key=True)
    run = models.ForeignKey(ExportRun, on_delete=models.PROTECT, related_name="ranges")
    destination = models.TextField()
    source = models.CharField(max_length=16, choices=ExportSource.choices)
    lo = models.BigIntegerField(help_text="First id of the range (inclusive).")
    hi = models.BigIntegerField(help_text="End of the range (exclusive).")
    status = models.CharField(
        max_length=16, choices=ExportRangeStatus.choices, default=ExportRangeStatus.PENDING
    )
    source_rows = models.BigIntegerField(null=True, blank=True)
    source_checksum = models.BigIntegerField(null=True, blank=True)
    parquet_rows = models.BigIntegerField(null=True, blank=True)
    parquet_checksum = models.BigIntegerField(null=True, blank=True)
    min_at = models.DateTimeField(
        null=True, blank=True, help_text="Oldest finished_at / died_at in the range."
    )
    max_at = models.DateTimeField(
        null=True, blank=True, help_text="Newest finished_at / died_at in the range."
    )
    attempts = models.IntegerField(default=0)
    exported_at = models.DateTimeField(null=True, blank=True)
    verified_at = models.DateTimeField(null=True, blank=True)
    pruned_at = models.DateTimeField(null=True, blank=True)
    pruned_rows = models.BigIntegerField(null=True, blank=True)
    pruned_bytes = models.BigIntegerField(null=True, blank=True)
    files = models.JSONField(
        default=list,
        blank=True,
        help_text="The committed files (path in the table, rows, bytes, SHA-256) prune re-verifies.",
    )

    class Meta:
        db_table = EXPORT_RANGE_TABLE
        verbose_name = "export range"
        constraints = [
            models.UniqueConstraint(
                fields=["destination", "source", "lo"], name="pgq_export_range_unique"
            ),
            models.CheckConstraint(condition=Q(hi__gt=models.F("lo")), name="pgq_export_range_hi"),
            models.CheckConstraint(
                condition=Q(source__in=ExportSource.values), name="pgq_export_range_source"
            ),
            models.CheckConstraint(
                condition=Q(status__in=ExportRangeStatus.values), name="pgq_export_range_status"
            ),
        ]
        indexes = [
            models.Index(fields=["source", "status", "lo"], name="pgq_export_range_status_lo")
        ]

    def __str__(self) -> str:
        return f"{self.source} [{self.lo}, {self.hi}) -> {self.destination} ({self.status})"


class ExportLease(models.Model):
    """The one export run allowed to write a destination, until ``expires_at`` (database time).

    The holder renews it while it works; a killed or stalled run stops renewing, and the next
    run takes the lease over once it has expired and marks that run failed (``commit.py``).
    """

    destination = models.TextField(primary_key=True)
    run = models.ForeignKey(ExportRun, on_delete=models.PROTECT, related_name="+")
    holder = models.TextField(help_text="host, process id and run of the writer.")
    acquired_at = models.DateTimeField(db_default=Now())
    expires_at = models.DateTimeField()

    class Meta:
        db_table = EXPORT_LEASE_TABLE
        verbose_name = "export lease"

    def __str__(self) -> str:
        return f"{self.destination} held by {self.holder} until {self.expires_at}"


class QueueStatsHourly(models.Model):
    """What happened on one queue, for one task, in one UTC hour (by finished_at / died_at).

    Durations are in seconds. ``failed`` counts failed attempts (entries of ``errors``),
    ``dead`` the messages that died that hour, ``dead_by_reason`` splits them by reason.
    """

    id = models.BigAutoField(primary_key=True)
    queue = models.CharField(max_length=QUEUE_NAME_MAX_LENGTH)
    task = models.CharField(max_length=TASK_NAME_MAX_LENGTH)
    hour = models.DateTimeField(help_text="Start of the UTC hour.")
    processed = models.BigIntegerField(default=0, help_text="Messages that succeeded.")
    failed = models.BigIntegerField(default=0, help_text="Failed attempts recorded.")
    dead = models.BigIntegerField(default=0, help_text="Messages that died.")
    dead_by_reason: models.JSONField[Any] = models.JSONField(default=dict, blank=True)
    wait_p50 = models.FloatField(null=True, blank=True)
    wait_p95 = models.FloatField(null=True, blank=True)
    wait_p99 = models.FloatField(null=True, blank=True)
    run_p50 = models.FloatField(null=True, blank=True)
    run_p95 = models.FloatField(null=True, blank=True)
    run_p99 = models.FloatField(null=True, blank=True)
    attempts_histogram: models.JSONField[Any] = models.JSONField(
        default=dict, blank=True, help_text='{"attempts": messages} over processed and dead.'
    )
    top_errors: models.JSONField[Any] = models.JSONField(
        default=list, blank=True, help_text='[{"signature": ..., "count": ...}], most first.'
    )
    computed_at = models.DateTimeField(db_default=Now())

    class Meta:
        db_table = STATS_TABLE
        verbose_name = "hourly queue stats"
        verbose_name_plural = "hourly queue stats"
        constraints = [
            models.UniqueConstraint(fields=["queue", "task", "hour"], name="pgq_stats_hour_unique")
        ]
        indexes = [models.Index(fields=["hour"], name="pgq_stats_hour")]

    def __str__(self) -> str:
        return f"{self.queue}/{self.task} @ {self.hour:%Y-%m-%d %H:00}"


BULK_VOTE_TABLE = "pgqueue_bulk_vote"


class BulkEnqueueVote(models.Model):
    """One partition's verdict in a one-pass all-or-nothing bulk enqueue (``bulkrows.py``).

    The partitions of a barrier stage run at once; each records how many bad rows it found
    and writes only once every partition has voted and none found any. Rows live for the
    length of one ``enqueue_frame`` call (the driver deletes them). A retried stage votes
    again over its earlier votes: the input is read again, so the verdicts are the same.
    """

    id = models.BigAutoField(primary_key=True)
    run_id = models.CharField(max_length=32, help_text="One enqueue_frame call.")
    part = models.IntegerField()
    bad_rows = models.BigIntegerField()
    voted_at = models.DateTimeField(db_default=Now())

    class Meta:
        db_table = BULK_VOTE_TABLE
        verbose_name = "bulk enqueue vote"
        constraints = [
            models.UniqueConstraint(fields=["run_id", "part"], name="pgq_bulk_vote_unique")
        ]

    def __str__(self) -> str:
        return f"{self.run_id} part {self.part}: {self.bad_rows} bad"
