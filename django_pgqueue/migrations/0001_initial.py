# The whole schema of django_pgqueue; until 0.1 is released, schema changes fold into it.

import django.db.models.deletion
import django.db.models.functions.datetime
from django.db import migrations, models

from django_pgqueue.core import _composition_sql, _flow_sql
from django_pgqueue.core._partitions import create_archive_partitions
from django_pgqueue.core._retention_sql import CREATE_ARCHIVE_TABLE


class Migration(migrations.Migration):
    initial = True

    dependencies = []

    operations = [
        migrations.CreateModel(
            name="FlowAllowance",
            fields=[
                (
                    "pk",
                    models.CompositePrimaryKey(
                        "queue",
                        "holder",
                        blank=True,
                        editable=False,
                        primary_key=True,
                        serialize=False,
                    ),
                ),
                ("queue", models.CharField(max_length=48)),
                ("holder", models.IntegerField()),
                ("units", models.IntegerField()),
                ("until", models.DateTimeField()),
            ],
            options={
                "verbose_name": "flow-control allowance",
                "db_table": "pgqueue_flow_allowance",
            },
        ),
        migrations.CreateModel(
            name="FlowRate",
            fields=[
                (
                    "pk",
                    models.CompositePrimaryKey(
                        "queue",
                        "key",
                        blank=True,
                        editable=False,
                        primary_key=True,
                        serialize=False,
                    ),
                ),
                ("queue", models.CharField(max_length=48)),
                ("key", models.CharField(max_length=255)),
                ("tat", models.DateTimeField()),
            ],
            options={
                "verbose_name": "flow-control rate",
                "db_table": "pgqueue_flow_rate",
            },
        ),
        migrations.CreateModel(
            name="MaintenanceState",
            fields=[
                ("name", models.CharField(max_length=64, primary_key=True, serialize=False)),
                (
                    "next_run_at",
                    models.DateTimeField(
                        help_text="When a worker does the job next (database time)."
                    ),
                ),
                ("last_started_at", models.DateTimeField(blank=True, null=True)),
                ("last_finished_at", models.DateTimeField(blank=True, null=True)),
                ("last_worker", models.CharField(blank=True, default="", max_length=255)),
                (
                    "last_report",
                    models.JSONField(
                        blank=True,
                        default=dict,
                        help_text="What the last run did, as pgq_prune prints it.",
                    ),
                ),
            ],
            options={
                "verbose_name": "maintenance job",
                "db_table": "pgqueue_maintenance",
            },
        ),
        migrations.CreateModel(
            name="PeriodicSchedule",
            fields=[
                ("name", models.CharField(max_length=255, primary_key=True, serialize=False)),
                ("task", models.CharField(max_length=255)),
                ("queue", models.CharField(max_length=48)),
                (
                    "spec",
                    models.CharField(
                        help_text="What the code declares: cron or interval, and time zone.",
                        max_length=300,
                    ),
                ),
                (
                    "next_run_at",
                    models.DateTimeField(help_text="The next slot to enqueue (database time)."),
                ),
                (
                    "last_run_at",
                    models.DateTimeField(
                        blank=True, help_text="The last slot enqueued.", null=True
                    ),
                ),
                ("last_message_id", models.BigIntegerField(blank=True, null=True)),
                ("paused", models.BooleanField(db_default=False, default=False)),
                (
                    "updated_at",
                    models.DateTimeField(db_default=django.db.models.functions.datetime.Now()),
                ),
            ],
            options={
                "verbose_name": "periodic schedule",
                "db_table": "pgqueue_periodic",
                "permissions": [
                    ("pause_periodicschedule", "Can pause and resume a periodic schedule"),
                    ("run_periodicschedule", "Can run a periodic schedule now"),
                ],
            },
        ),
        migrations.CreateModel(
            name="WorkerHeartbeat",
            fields=[
                ("worker_id", models.CharField(max_length=255, primary_key=True, serialize=False)),
                ("hostname", models.CharField(blank=True, default="", max_length=255)),
                ("pid", models.IntegerField(blank=True, null=True)),
                ("queues", models.JSONField(blank=True, default=list)),
                ("concurrency", models.IntegerField(default=1)),
                (
                    "started_at",
                    models.DateTimeField(db_default=django.db.models.functions.datetime.Now()),
                ),
                (
                    "last_seen_at",
                    models.DateTimeField(db_default=django.db.models.functions.datetime.Now()),
                ),
                ("stats", models.JSONField(blank=True, default=dict)),
            ],
            options={
                "verbose_name": "worker",
                "db_table": "pgqueue_worker",
            },
        ),
        # The archive is partitioned by day of finished_at (core/_retention.py drops expired
        # days whole). PostgreSQL wants the partition key in every unique constraint, so the
        # table's primary key is (id, finished_at) while Django's state keeps ``id``: ids come
        # from one sequence, so ``id`` alone still names one row.
        migrations.SeparateDatabaseAndState(
            state_operations=[
                migrations.CreateModel(
                    name="ArchivedMessage",
                    fields=[
                        ("queue", models.CharField(max_length=48)),
                        ("task", models.CharField(max_length=255)),
                        ("payload", models.JSONField(blank=True, null=True)),
                        ("priority", models.SmallIntegerField(db_default=0, default=0)),
                        (
                            "tenant",
                            models.CharField(
                                blank=True,
                                help_text="Tenant / ordering key for fairness and per-key concurrency limits.",
                                max_length=255,
                                null=True,
                            ),
                        ),
                        ("dedup_key", models.CharField(blank=True, max_length=255, null=True)),
                        (
                            "enqueued_at",
                            models.DateTimeField(
                                db_default=django.db.models.functions.datetime.Now()
                            ),
                        ),
                        ("attempts", models.IntegerField(db_default=0, default=0)),
                        ("max_attempts", models.IntegerField(db_default=3, default=3)),
                        (
                            "errors",
                            models.JSONField(
                                blank=True,
                                db_default=models.Value([], output_field=models.JSONField()),
                                default=list,
                                help_text="One entry per failed attempt: attempt, at, worker, type, message, traceback.",
                            ),
                        ),
                        ("id", models.BigAutoField(primary_key=True, serialize=False)),
                        ("message_id", models.BigIntegerField()),
                        ("started_at", models.DateTimeField(blank=True, null=True)),
                        (
                            "finished_at",
                            models.DateTimeField(
                                db_default=django.db.models.functions.datetime.Now()
                            ),
                        ),
                        ("worker_id", models.CharField(blank=True, max_length=255, null=True)),
                        ("result", models.JSONField(blank=True, null=True)),
                    ],
                    options={
                        "verbose_name": "archived message",
                        "db_table": "pgqueue_archive",
                        "permissions": [
                            ("requeue_archivedmessage", "Can requeue an archived message")
                        ],
                        "indexes": [
                            models.Index(
                                fields=["queue", "finished_at"], name="pgq_archive_finished"
                            ),
                            models.Index(fields=["message_id"], name="pgq_archive_message_id"),
                            models.Index(
                                condition=models.Q(("errors", []), _negated=True),
                                fields=["queue", "finished_at"],
                                name="pgq_archive_failed",
                            ),
                        ],
                        "constraints": [
                            models.CheckConstraint(
                                condition=models.Q(("priority__gte", -100), ("priority__lte", 100)),
                                name="pgq_archive_priority_range",
                            ),
                            models.CheckConstraint(
                                condition=models.Q(("attempts__gte", 0)),
                                name="pgq_archive_attempts_gte_0",
                            ),
                            models.CheckConstraint(
                                condition=models.Q(("max_attempts__gte", 1)),
                                name="pgq_archive_max_attempts_gte_1",
                            ),
                        ],
                    },
                ),
            ],
            database_operations=[
                migrations.RunSQL(
                    sql=CREATE_ARCHIVE_TABLE, reverse_sql="DROP TABLE pgqueue_archive"
                ),
                migrations.RunPython(create_archive_partitions, migrations.RunPython.noop),
            ],
        ),
        migrations.CreateModel(
            name="DeadMessage",
            fields=[
                ("queue", models.CharField(max_length=48)),
                ("task", models.CharField(max_length=255)),
                ("payload", models.JSONField(blank=True, null=True)),
                ("priority", models.SmallIntegerField(db_default=0, default=0)),
                (
                    "tenant",
                    models.CharField(
                        blank=True,
                        help_text="Tenant / ordering key for fairness and per-key concurrency limits.",
                        max_length=255,
                        null=True,
                    ),
                ),
                ("dedup_key", models.CharField(blank=True, max_length=255, null=True)),
                (
                    "enqueued_at",
                    models.DateTimeField(db_default=django.db.models.functions.datetime.Now()),
                ),
                ("attempts", models.IntegerField(db_default=0, default=0)),
                ("max_attempts", models.IntegerField(db_default=3, default=3)),
                (
                    "errors",
                    models.JSONField(
                        blank=True,
                        db_default=models.Value([], output_field=models.JSONField()),
                        default=list,
                        help_text="One entry per failed attempt: attempt, at, worker, type, message, traceback.",
                    ),
                ),
                ("id", models.BigAutoField(primary_key=True, serialize=False)),
                ("message_id", models.BigIntegerField(unique=True)),
                (
                    "reason",
                    models.CharField(
                        choices=[
                            ("rejected", "rejected (unknown task or undecodable payload)"),
                            ("error", "error (handler raised on its last attempt)"),
                            ("timeout", "timeout"),
                            ("lease_expired", "lease expired on its last attempt"),
                            ("discarded", "discarded by an operator"),
                            ("cancelled", "cancelled (django_pgqueue.cancel)"),
                            ("dependency_failed", "a message it depends on failed"),
                        ],
                        max_length=32,
                    ),
                ),
                (
                    "details",
                    models.JSONField(
                        blank=True,
                        default=dict,
                        help_text="type, message and traceback of the final failure.",
                    ),
                ),
                ("worker_id", models.CharField(blank=True, max_length=255, null=True)),
                (
                    "died_at",
                    models.DateTimeField(db_default=django.db.models.functions.datetime.Now()),
                ),
            ],
            options={
                "verbose_name": "dead message",
                "db_table": "pgqueue_dead",
                "permissions": [("retry_deadmessage", "Can retry a dead message")],
                "indexes": [models.Index(fields=["queue", "died_at"], name="pgq_dead_died")],
                "constraints": [
                    models.CheckConstraint(
                        condition=models.Q(("priority__gte", -100), ("priority__lte", 100)),
                        name="pgq_dead_priority_range",
                    ),
                    models.CheckConstraint(
                        condition=models.Q(("attempts__gte", 0)), name="pgq_dead_attempts_gte_0"
                    ),
                    models.CheckConstraint(
                        condition=models.Q(("max_attempts__gte", 1)),
                        name="pgq_dead_max_attempts_gte_1",
                    ),
                    models.CheckConstraint(
                        condition=models.Q(
                            (
                                "reason__in",
                                [
                                    "rejected",
                                    "error",
                                    "timeout",
                                    "lease_expired",
                                    "discarded",
                                    "cancelled",
                                    "dependency_failed",
                                ],
                            )
                        ),
                        name="pgq_dead_reason_valid",
                    ),
                ],
            },
        ),
        migrations.CreateModel(
            name="Message",
            fields=[
                ("queue", models.CharField(max_length=48)),
                ("task", models.CharField(max_length=255)),
                ("payload", models.JSONField(blank=True, null=True)),
                ("priority", models.SmallIntegerField(db_default=0, default=0)),
                (
                    "tenant",
                    models.CharField(
                        blank=True,
                        help_text="Tenant / ordering key for fairness and per-key concurrency limits.",
                        max_length=255,
                        null=True,
                    ),
                ),
                ("dedup_key", models.CharField(blank=True, max_length=255, null=True)),
                (
                    "enqueued_at",
                    models.DateTimeField(db_default=django.db.models.functions.datetime.Now()),
                ),
                ("attempts", models.IntegerField(db_default=0, default=0)),
                ("max_attempts", models.IntegerField(db_default=3, default=3)),
                (
                    "errors",
                    models.JSONField(
                        blank=True,
                        db_default=models.Value([], output_field=models.JSONField()),
                        default=list,
                        help_text="One entry per failed attempt: attempt, at, worker, type, message, traceback.",
                    ),
                ),
                ("id", models.BigAutoField(primary_key=True, serialize=False)),
                (
                    "available_at",
                    models.DateTimeField(db_default=django.db.models.functions.datetime.Now()),
                ),
                ("lease_token", models.UUIDField(blank=True, null=True)),
                ("leased_by", models.CharField(blank=True, max_length=255, null=True)),
                ("leased_at", models.DateTimeField(blank=True, null=True)),
                ("last_error", models.JSONField(blank=True, null=True)),
                (
                    "refund_on_expiry",
                    models.BooleanField(
                        db_default=False,
                        default=False,
                        help_text="Whether the current lease gives its attempt back if it expires: set when a worker leases the message (a worker runs a message whose lease expired alone, and records that start first); cleared by that start. See docs/explanation/guarantees.md, 'Attempts and failures'.",
                    ),
                ),
                (
                    "fair_order",
                    models.FloatField(
                        blank=True,
                        help_text="Fair queues only: the message's place in its queue's fair order (virtual time, set at enqueue); -1 while it is outside that order (scheduled, leased, backing off). NULL in queues without fairness.",
                        null=True,
                    ),
                ),
                (
                    "cancel_requested_at",
                    models.DateTimeField(
                        blank=True,
                        help_text="When cancel() flagged this message while a worker held it; its handler sees context.cancel_requested after the worker's next lease extension.",
                        null=True,
                    ),
                ),
            ],
            options={
                "verbose_name": "live message",
                "db_table": "pgqueue_message",
                "permissions": [
                    ("retry_now_message", "Can make a waiting live message available now"),
                    ("release_message", "Can release a live message's lease"),
                    ("discard_message", "Can discard a live message to the dead table"),
                    ("purge_queue", "Can purge all live messages of a queue"),
                    ("cancel_message", "Can cancel a live message"),
                ],
                "indexes": [
                    models.Index(
                        models.F("queue"),
                        models.OrderBy(models.F("priority"), descending=True),
                        models.F("available_at"),
                        models.F("id"),
                        condition=models.Q(("attempts__lt", models.F("max_attempts"))),
                        name="pgq_message_claim",
                    ),
                    models.Index(
                        models.F("queue"),
                        models.OrderBy(models.F("priority"), descending=True),
                        models.F("fair_order"),
                        models.F("id"),
                        condition=models.Q(("fair_order__gte", 0)),
                        name="pgq_message_fair",
                    ),
                    models.Index(
                        condition=models.Q(("fair_order__gte", 0)),
                        fields=["queue", "tenant", "priority", "fair_order"],
                        name="pgq_message_fair_tenant",
                    ),
                    models.Index(
                        condition=models.Q(
                            ("fair_order__lt", 0),
                            ("lease_token__isnull", True),
                            ("attempts__lt", models.F("max_attempts")),
                        ),
                        fields=["queue", "available_at", "id"],
                        name="pgq_message_fair_due",
                    ),
                    models.Index(
                        condition=models.Q(("lease_token__isnull", False), ("fair_order__lt", 0)),
                        fields=["queue", "available_at"],
                        name="pgq_message_leased",
                    ),
                    models.Index(
                        condition=models.Q(("attempts__gte", models.F("max_attempts"))),
                        fields=["queue", "available_at"],
                        name="pgq_message_exhausted",
                    ),
                    models.Index(
                        condition=models.Q(("errors", []), _negated=True),
                        fields=["queue"],
                        name="pgq_message_failed",
                    ),
                ],
                "constraints": [
                    models.CheckConstraint(
                        condition=models.Q(("priority__gte", -100), ("priority__lte", 100)),
                        name="pgq_message_priority_range",
                    ),
                    models.CheckConstraint(
                        condition=models.Q(("attempts__gte", 0)), name="pgq_message_attempts_gte_0"
                    ),
                    models.CheckConstraint(
                        condition=models.Q(("max_attempts__gte", 1)),
                        name="pgq_message_max_attempts_gte_1",
                    ),
                    models.CheckConstraint(
                        condition=models.Q(("queue__regex", "^[a-z0-9][a-z0-9_-]*$")),
                        name="pgq_message_queue_name",
                    ),
                    models.UniqueConstraint(
                        condition=models.Q(("dedup_key__isnull", False)),
                        fields=("queue", "dedup_key"),
                        name="pgq_message_dedup_key",
                    ),
                ],
            },
        ),
        migrations.CreateModel(
            name="QueueState",
            fields=[
                ("name", models.CharField(max_length=48, primary_key=True, serialize=False)),
                ("paused", models.BooleanField(db_default=False, default=False)),
                (
                    "updated_at",
                    models.DateTimeField(db_default=django.db.models.functions.datetime.Now()),
                ),
            ],
            options={
                "verbose_name": "queue",
                "db_table": "pgqueue_queue",
                "permissions": [("pause_queue", "Can pause and resume a queue")],
                "constraints": [
                    models.CheckConstraint(
                        condition=models.Q(("name__regex", "^[a-z0-9][a-z0-9_-]*$")),
                        name="pgq_queue_name_valid",
                    )
                ],
            },
        ),
        # The live table churns (every message is inserted, updated at claim and deleted):
        # vacuum it after ~100 dead rows, not after 20% of the table, so the claim index
        # never has to walk a long tail of dead entries.
        migrations.RunSQL(
            sql="""
                ALTER TABLE pgqueue_message SET (
                    autovacuum_vacuum_scale_factor = 0,
                    autovacuum_vacuum_threshold = 100,
                    autovacuum_vacuum_insert_scale_factor = 0,
                    autovacuum_vacuum_insert_threshold = 1000,
                    autovacuum_analyze_scale_factor = 0,
                    autovacuum_analyze_threshold = 1000,
                    autovacuum_vacuum_cost_delay = 0
                )
            """,
            reverse_sql=migrations.RunSQL.noop,
        ),
        # Claims rewrite the allowance and rate rows: leave room for HOT updates and vacuum
        # these small tables early.
        migrations.RunSQL(
            sql="""
                ALTER TABLE pgqueue_flow_allowance SET (
                    fillfactor = 50,
                    autovacuum_vacuum_scale_factor = 0,
                    autovacuum_vacuum_threshold = 100
                );
                ALTER TABLE pgqueue_flow_rate SET (
                    fillfactor = 50,
                    autovacuum_vacuum_scale_factor = 0,
                    autovacuum_vacuum_threshold = 100
                );
            """,
            reverse_sql=migrations.RunSQL.noop,
        ),
        # The flow-controlled claim's candidates (core/_flow_sql.py).
        migrations.RunSQL(
            sql=list(_flow_sql.DEFINITIONS.values()),
            reverse_sql=list(_flow_sql.DROP),
        ),
        # Job control: unique windows, progress, debounce keys, snoozes.
        migrations.CreateModel(
            name="MessageProgress",
            fields=[
                ("message_id", models.BigIntegerField(primary_key=True, serialize=False)),
                ("done", models.BigIntegerField()),
                ("total", models.BigIntegerField(blank=True, null=True)),
                ("note", models.CharField(blank=True, default="", max_length=200)),
                (
                    "updated_at",
                    models.DateTimeField(db_default=django.db.models.functions.datetime.Now()),
                ),
            ],
            options={
                "verbose_name": "message progress",
                "verbose_name_plural": "message progress",
                "db_table": "pgqueue_progress",
            },
        ),
        migrations.CreateModel(
            name="UniqueWindow",
            fields=[
                (
                    "pk",
                    models.CompositePrimaryKey(
                        "queue",
                        "key",
                        blank=True,
                        editable=False,
                        primary_key=True,
                        serialize=False,
                    ),
                ),
                ("queue", models.CharField(max_length=48)),
                ("key", models.CharField(max_length=255)),
                ("expires_at", models.DateTimeField()),
                ("message_id", models.BigIntegerField(blank=True, null=True)),
                ("task", models.CharField(blank=True, max_length=255, null=True)),
                ("enqueued_at", models.DateTimeField(blank=True, null=True)),
                ("available_at", models.DateTimeField(blank=True, null=True)),
            ],
            options={
                "verbose_name": "unique window",
                "db_table": "pgqueue_unique_window",
            },
        ),
        migrations.AddField(
            model_name="message",
            name="debounce_key",
            field=models.CharField(
                blank=True,
                help_text="Debounced messages only (enqueue(..., dedup_key=..., debounce=...)): the key a later debounced enqueue finds this message by while it has not started.",
                max_length=255,
                null=True,
            ),
        ),
        migrations.AddField(
            model_name="message",
            name="snoozes",
            field=models.IntegerField(
                db_default=0,
                default=0,
                help_text="How many times its handler snoozed it (raise Snooze); bounded by MAX_SNOOZES.",
            ),
        ),
        migrations.AddIndex(
            model_name="message",
            index=models.Index(
                condition=models.Q(("debounce_key__isnull", False)),
                fields=["queue", "debounce_key"],
                name="pgq_message_debounce",
            ),
        ),
        migrations.AddIndex(
            model_name="uniquewindow",
            index=models.Index(fields=["expires_at"], name="pgq_unique_window_expires"),
        ),
        # Composition: waiting messages, dependencies, batches.
        migrations.CreateModel(
            name="Batch",
            fields=[
                ("id", models.BigAutoField(primary_key=True, serialize=False)),
                ("label", models.CharField(blank=True, default="", max_length=200)),
                ("total", models.IntegerField()),
                ("succeeded", models.IntegerField(db_default=0, default=0)),
                ("failed", models.IntegerField(db_default=0, default=0)),
                (
                    "created_at",
                    models.DateTimeField(db_default=django.db.models.functions.datetime.Now()),
                ),
                (
                    "completed_at",
                    models.DateTimeField(
                        blank=True,
                        help_text="When every member had finished or died, first.",
                        null=True,
                    ),
                ),
                (
                    "succeeded_at",
                    models.DateTimeField(
                        blank=True,
                        help_text="When every member had finished successfully.",
                        null=True,
                    ),
                ),
                ("on_complete_id", models.BigIntegerField(blank=True, null=True)),
                ("on_success_id", models.BigIntegerField(blank=True, null=True)),
                ("on_failure_id", models.BigIntegerField(blank=True, null=True)),
            ],
            options={
                "verbose_name": "batch",
                "verbose_name_plural": "batches",
                "db_table": "pgqueue_batch",
            },
        ),
        migrations.CreateModel(
            name="BatchMember",
            fields=[
                ("message_id", models.BigIntegerField(primary_key=True, serialize=False)),
            ],
            options={
                "verbose_name": "batch member",
                "db_table": "pgqueue_batch_member",
            },
        ),
        migrations.CreateModel(
            name="Dependency",
            fields=[
                (
                    "pk",
                    models.CompositePrimaryKey(
                        "prerequisite_id",
                        "dependent_id",
                        blank=True,
                        editable=False,
                        primary_key=True,
                        serialize=False,
                    ),
                ),
                ("prerequisite_id", models.BigIntegerField()),
                ("dependent_id", models.BigIntegerField()),
            ],
            options={
                "verbose_name": "dependency",
                "db_table": "pgqueue_dependency",
            },
        ),
        migrations.CreateModel(
            name="WaitingMessage",
            fields=[
                ("id", models.BigIntegerField(primary_key=True, serialize=False)),
                ("queue", models.CharField(max_length=48)),
                ("task", models.CharField(max_length=255)),
                ("payload", models.JSONField(blank=True, null=True)),
                ("priority", models.SmallIntegerField(default=0)),
                ("tenant", models.CharField(blank=True, max_length=255, null=True)),
                (
                    "enqueued_at",
                    models.DateTimeField(db_default=django.db.models.functions.datetime.Now()),
                ),
                ("max_attempts", models.IntegerField(default=3)),
                (
                    "pending",
                    models.IntegerField(
                        help_text="Dependencies not finished yet; released into the live table at 0. A batch's callback waits on its batch instead (1), which releases it."
                    ),
                ),
                (
                    "run_at",
                    models.DateTimeField(
                        blank=True,
                        help_text="Not available before this time, once released.",
                        null=True,
                    ),
                ),
                (
                    "delay",
                    models.FloatField(
                        default=0, help_text="Seconds after its release before it is available."
                    ),
                ),
                (
                    "fair",
                    models.BooleanField(
                        default=False,
                        help_text="Its queue is fair: it enters the fair order once due.",
                    ),
                ),
                (
                    "wake_channel",
                    models.TextField(
                        blank=True,
                        help_text="Where its release notifies the workers (NULL: nowhere).",
                        null=True,
                    ),
                ),
            ],
            options={
                "verbose_name": "waiting message",
                "db_table": "pgqueue_waiting",
            },
        ),
        migrations.AddField(
            model_name="archivedmessage",
            name="composed",
            field=models.BooleanField(
                db_default=False,
                default=False,
                help_text="Part of a composition: a batch member, a dependency of a waiting message, or a message that waited. Only such rows make the archive's and the dead table's triggers look for what follows from them (core/_composition_sql.py).",
            ),
        ),
        migrations.AddField(
            model_name="deadmessage",
            name="composed",
            field=models.BooleanField(
                db_default=False,
                default=False,
                help_text="Part of a composition: a batch member, a dependency of a waiting message, or a message that waited. Only such rows make the archive's and the dead table's triggers look for what follows from them (core/_composition_sql.py).",
            ),
        ),
        migrations.AddField(
            model_name="message",
            name="composed",
            field=models.BooleanField(
                db_default=False,
                default=False,
                help_text="Part of a composition: a batch member, a dependency of a waiting message, or a message that waited. Only such rows make the archive's and the dead table's triggers look for what follows from them (core/_composition_sql.py).",
            ),
        ),
        migrations.AddIndex(
            model_name="batch",
            index=models.Index(
                condition=models.Q(("completed_at__isnull", True)),
                fields=["created_at"],
                name="pgq_batch_open",
            ),
        ),
        migrations.AddField(
            model_name="batchmember",
            name="batch",
            field=models.ForeignKey(
                on_delete=django.db.models.deletion.CASCADE,
                related_name="members",
                to="django_pgqueue.batch",
            ),
        ),
        migrations.AddIndex(
            model_name="dependency",
            index=models.Index(fields=["dependent_id"], name="pgq_dependency_dependent"),
        ),
        migrations.AddIndex(
            model_name="waitingmessage",
            index=models.Index(fields=["queue"], name="pgq_waiting_queue"),
        ),
        migrations.AddIndex(
            model_name="batch",
            index=models.Index(
                condition=models.Q(("on_complete_id__isnull", False)),
                fields=["on_complete_id"],
                name="pgq_batch_on_complete",
            ),
        ),
        migrations.AddIndex(
            model_name="batch",
            index=models.Index(
                condition=models.Q(("on_success_id__isnull", False)),
                fields=["on_success_id"],
                name="pgq_batch_on_success",
            ),
        ),
        migrations.AddIndex(
            model_name="batch",
            index=models.Index(
                condition=models.Q(("on_failure_id__isnull", False)),
                fields=["on_failure_id"],
                name="pgq_batch_on_failure",
            ),
        ),
        migrations.AddField(
            model_name="archivedmessage",
            name="headers",
            field=models.JSONField(
                blank=True,
                help_text="String headers given at enqueue (trace context among them); NULL: none.",
                null=True,
            ),
        ),
        migrations.AddField(
            model_name="deadmessage",
            name="headers",
            field=models.JSONField(
                blank=True,
                help_text="String headers given at enqueue (trace context among them); NULL: none.",
                null=True,
            ),
        ),
        migrations.AddField(
            model_name="message",
            name="headers",
            field=models.JSONField(
                blank=True,
                help_text="String headers given at enqueue (trace context among them); NULL: none.",
                null=True,
            ),
        ),
        migrations.AddField(
            model_name="waitingmessage",
            name="headers",
            field=models.JSONField(blank=True, help_text="Its headers (NULL: none).", null=True),
        ),
        # Dependencies released, failures passed on and batches counted in the database
        # (core/_composition_sql.py).
        migrations.RunSQL(
            sql=list(_composition_sql.DEFINITIONS),
            reverse_sql=list(_composition_sql.DROP),
        ),
        # Every acknowledgement of a batch member rewrites its batch's row, every finished
        # dependency its dependents' rows: room for HOT updates.
        migrations.RunSQL(
            sql="ALTER TABLE pgqueue_batch SET (fillfactor = 50);"
            " ALTER TABLE pgqueue_waiting SET (fillfactor = 70);",
            reverse_sql=migrations.RunSQL.noop,
        ),
    ]
