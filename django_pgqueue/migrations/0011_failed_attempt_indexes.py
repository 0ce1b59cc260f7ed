"""Partial indexes over the rows that have failed before, for the dashboard's failed
attempts. Built concurrently: an existing archive keeps taking writes meanwhile."""

from django.contrib.postgres.operations import AddIndexConcurrently
from django.db import migrations, models


class Migration(migrations.Migration):
    atomic = False

    dependencies = [
        ("django_pgqueue", "0010_claim_credits"),
    ]

    operations = [
        AddIndexConcurrently(
            model_name="archivedmessage",
            index=models.Index(
                condition=models.Q(("errors", []), _negated=True),
                fields=["queue", "finished_at"],
                name="pgq_archive_failed",
            ),
        ),
        AddIndexConcurrently(
            model_name="message",
            index=models.Index(
                condition=models.Q(("errors", []), _negated=True),
                fields=["queue"],
                name="pgq_message_failed",
            ),
        ),
    ]
