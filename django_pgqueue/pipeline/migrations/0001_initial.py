# The whole schema of the pipeline app; until 0.1 is released, schema changes fold into it.

import django.db.models.deletion
import django.db.models.functions.datetime
from django.db import migrations, models


class Migration(migrations.Migration):
    initial = True

    # The pipeline exports, prunes and enqueues into the queue's tables.
    dependencies = [("django_pgqueue", "0001_initial")]

    operations = [
        migrations.CreateModel(
            name="BulkEnqueueVote",
            fields=[
                ("id", models.BigAutoField(primary_key=True, serialize=False)),
                ("run_id", models.CharField(help_text="One enqueue_frame call.", max_length=32)),
                ("part", models.IntegerField()),
                ("bad_rows", models.BigIntegerField()),
                (
                    "voted_at",
                    models.DateTimeField(db_default=django.db.models.functions.datetime.Now()),
                ),
            ],
            options={
                "verbose_name": "bulk enqueue vote",
                "db_table": "pgqueue_bulk_vote",
                "constraints": [
                    models.UniqueConstraint(fields=("run_id", "part"), name="pgq_bulk_vote_unique")
                ],
            },
        ),
        migrations.CreateModel(
            name="ExportRun",
            fields=[
                ("id", models.BigAutoField(primary_key=True, serialize=False)),
                (
                    "destination",
                    models.TextField(
                        help_text="Local path or Hadoop-compatible URL of the export."
                    ),
                ),
                (
                    "status",
                    models.CharField(
                        choices=[
                            ("running", "running"),
                            ("completed", "completed"),
                            ("failed", "failed"),
                        ],
                        default="running",
                        max_length=16,
                    ),
                ),
                (
                    "started_at",
                    models.DateTimeField(db_default=django.db.models.functions.datetime.Now()),
                ),
                ("finished_at", models.DateTimeField(blank=True, null=True)),
                ("master", models.CharField(blank=True, default="", max_length=255)),
                (
                    "archive_horizon",
                    models.BigIntegerField(
                        blank=True,
                        help_text="Archive ids below this were safe to export.",
                        null=True,
                    ),
                ),
                (
                    "dead_horizon",
                    models.BigIntegerField(
                        blank=True,
                        help_text="Dead-letter ids below this were safe to export.",
                        null=True,
                    ),
                ),
                ("ranges_total", models.IntegerField(default=0)),
                ("ranges_done", models.IntegerField(default=0)),
                ("rows_exported", models.BigIntegerField(default=0)),
                ("error", models.TextField(blank=True, default="")),
            ],
            options={
                "verbose_name": "export run",
                "db_table": "pgqueue_export_run",
                "constraints": [
                    models.CheckConstraint(
                        condition=models.Q(("status__in", ["running", "completed", "failed"])),
                        name="pgq_export_run_status",
                    )
                ],
            },
        ),
        migrations.CreateModel(
            name="ExportLease",
            fields=[
                ("destination", models.TextField(primary_key=True, serialize=False)),
                ("holder", models.TextField(help_text="host, process id and run of the writer.")),
                (
                    "acquired_at",
                    models.DateTimeField(db_default=django.db.models.functions.datetime.Now()),
                ),
                ("expires_at", models.DateTimeField()),
                (
                    "run",
                    models.ForeignKey(
                        on_delete=django.db.models.deletion.PROTECT,
                        related_name="+",
                        to="django_pgqueue_pipeline.exportrun",
                    ),
                ),
            ],
            options={
                "verbose_name": "export lease",
                "db_table": "pgqueue_export_lease",
            },
        ),
        migrations.CreateModel(
            name="QueueStatsHourly",
            fields=[
                ("id", models.BigAutoField(primary_key=True, serialize=False)),
                ("queue", models.CharField(max_length=48)),
                ("task", models.CharField(max_length=255)),
                ("hour", models.DateTimeField(help_text="Start of the UTC hour.")),
                (
                    "processed",
                    models.BigIntegerField(default=0, help_text="Messages that succeeded."),
                ),
                (
                    "failed",
                    models.BigIntegerField(default=0, help_text="Failed attempts recorded."),
                ),
                ("dead", models.BigIntegerField(default=0, help_text="Messages that died.")),
                ("dead_by_reason", models.JSONField(blank=True, default=dict)),
                ("wait_p50", models.FloatField(blank=True, null=True)),
                ("wait_p95", models.FloatField(blank=True, null=True)),
                ("wait_p99", models.FloatField(blank=True, null=True)),
                ("run_p50", models.FloatField(blank=True, null=True)),
                ("run_p95", models.FloatField(blank=True, null=True)),
                ("run_p99", models.FloatField(blank=True, null=True)),
                (
                    "attempts_histogram",
                    models.JSONField(
                        blank=True,
                        default=dict,
                        help_text='{"attempts": messages} over processed and dead.',
                    ),
                ),
                (
                    "top_errors",
                    models.JSONField(
                        blank=True,
                        default=list,
                        help_text='[{"signature": ..., "count": ...}], most first.',
                    ),
                ),
                (
                    "computed_at",
                    models.DateTimeField(db_default=django.db.models.functions.datetime.Now()),
                ),
            ],
            options={
                "verbose_name": "hourly queue stats",
                "verbose_name_plural": "hourly queue stats",
                "db_table": "pgqueue_stats_hourly",
                "indexes": [models.Index(fields=["hour"], name="pgq_stats_hour")],
                "constraints": [
                    models.UniqueConstraint(
                        fields=("queue", "task", "hour"), name="pgq_stats_hour_unique"
                    )
                ],
            },
        ),
        migrations.CreateModel(
            name="ExportRange",
            fields=[
                ("id", models.BigAutoField(primary_key=True, serialize=False)),
                ("destination", models.TextField()),
                (
                    "source",
                    models.CharField(
                        choices=[
                            ("archive", "archive (pgqueue_archive)"),
                            ("dead", "dead letters (pgqueue_dead)"),
                        ],
                        max_length=16,
                    ),
                ),
                ("lo", models.BigIntegerField(help_text="First id of the range (inclusive).")),
                ("hi", models.BigIntegerField(help_text="End of the range (exclusive).")),
                (
                    "status",
                    models.CharField(
                        choices=[
                            ("pending", "pending (planned, not written yet)"),
                            ("written", "written (Parquet files in place, not verified yet)"),
                            (
                                "verified",
                                "verified (Parquet counts and checksums match the database)",
                            ),
                            ("mismatch", "mismatch (will be exported again)"),
                            (
                                "pruned",
                                "pruned (rows deleted from the database after verification)",
                            ),
                        ],
                        default="pending",
                        max_length=16,
                    ),
                ),
                ("source_rows", models.BigIntegerField(blank=True, null=True)),
                ("source_checksum", models.BigIntegerField(blank=True, null=True)),
                ("parquet_rows", models.BigIntegerField(blank=True, null=True)),
                ("parquet_checksum", models.BigIntegerField(blank=True, null=True)),
                (
                    "min_at",
                    models.DateTimeField(
                        blank=True,
                        help_text="Oldest finished_at / died_at in the range.",
                        null=True,
                    ),
                ),
                (
                    "max_at",
                    models.DateTimeField(
                        blank=True,
                        help_text="Newest finished_at / died_at in the range.",
                        null=True,
                    ),
                ),
                ("attempts", models.IntegerField(default=0)),
                ("exported_at", models.DateTimeField(blank=True, null=True)),
                ("verified_at", models.DateTimeField(blank=True, null=True)),
                ("pruned_at", models.DateTimeField(blank=True, null=True)),
                ("pruned_rows", models.BigIntegerField(blank=True, null=True)),
                ("pruned_bytes", models.BigIntegerField(blank=True, null=True)),
                (
                    "run",
                    models.ForeignKey(
                        on_delete=django.db.models.deletion.PROTECT,
                        related_name="ranges",
                        to="django_pgqueue_pipeline.exportrun",
                    ),
                ),
            ],
            options={
                "verbose_name": "export range",
                "db_table": "pgqueue_export_range",
                "indexes": [
                    models.Index(
                        fields=["source", "status", "lo"], name="pgq_export_range_status_lo"
                    )
                ],
                "constraints": [
                    models.UniqueConstraint(
                        fields=("destination", "source", "lo"), name="pgq_export_range_unique"
                    ),
                    models.CheckConstraint(
                        condition=models.Q(("hi__gt", models.F("lo"))), name="pgq_export_range_hi"
                    ),
                    models.CheckConstraint(
                        condition=models.Q(("source__in", ["archive", "dead"])),
                        name="pgq_export_range_source",
                    ),
                    models.CheckConstraint(
                        condition=models.Q(
                            ("status__in", ["pending", "written", "verified", "mismatch", "pruned"])
                        ),
                        name="pgq_export_range_status",
                    ),
                ],
            },
        ),
    ]
