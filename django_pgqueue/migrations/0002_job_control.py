# Job control: unique windows, debounce keys, snooze counts and progress (docs/how-to/job-control.md).

import django.db.models.functions.datetime
from django.db import migrations, models


class Migration(migrations.Migration):
    dependencies = [
        ("django_pgqueue", "0001_initial"),
    ]

    operations = [
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
    ]
