"""cancel(): a live message's cancel flag, the dead reason ``cancelled`` and its permission."""

from django.db import migrations, models

REASONS = ["rejected", "error", "timeout", "lease_expired", "discarded", "cancelled"]
_IN = ", ".join(f"'{reason}'" for reason in REASONS)
_OLD_IN = ", ".join(f"'{reason}'" for reason in REASONS[:-1])


class Migration(migrations.Migration):
    # The dead table's new CHECK is added NOT VALID and validated in a later transaction:
    # validating scans the table, and must not do so under the ALTER's exclusive lock.
    atomic = False

    dependencies = [
        ("django_pgqueue", "0013_export_lease"),
    ]

    operations = [
        migrations.AddField(
            model_name="message",
            name="cancel_requested_at",
            field=models.DateTimeField(
                blank=True,
                help_text=(
                    "When cancel() flagged this message while a worker held it; its handler "
                    "sees context.cancel_requested after the worker's next lease extension."
                ),
                null=True,
            ),
        ),
        migrations.AlterModelOptions(
            name="message",
            options={
                "permissions": [
                    ("retry_now_message", "Can make a waiting live message available now"),
                    ("release_message", "Can release a live message's lease"),
                    ("discard_message", "Can discard a live message to the dead table"),
                    ("purge_queue", "Can purge all live messages of a queue"),
                    ("cancel_message", "Can cancel a live message"),
                ],
                "verbose_name": "live message",
            },
        ),
        migrations.AlterField(
            model_name="deadmessage",
            name="reason",
            field=models.CharField(
                choices=[
                    ("rejected", "rejected (unknown task or undecodable payload)"),
                    ("error", "error (handler raised on its last attempt)"),
                    ("timeout", "timeout"),
                    ("lease_expired", "lease expired on its last attempt"),
                    ("discarded", "discarded by an operator"),
                    ("cancelled", "cancelled (django_pgqueue.cancel)"),
                ],
                max_length=32,
            ),
        ),
        migrations.SeparateDatabaseAndState(
            state_operations=[
                migrations.RemoveConstraint(model_name="deadmessage", name="pgq_dead_reason_valid"),
                migrations.AddConstraint(
                    model_name="deadmessage",
                    constraint=models.CheckConstraint(
                        condition=models.Q(("reason__in", REASONS)),
                        name="pgq_dead_reason_valid",
                    ),
                ),
            ],
            database_operations=[
                migrations.RunSQL(
                    "ALTER TABLE pgqueue_dead DROP CONSTRAINT pgq_dead_reason_valid, "
                    f"ADD CONSTRAINT pgq_dead_reason_valid CHECK (reason IN ({_IN})) NOT VALID",
                    reverse_sql=(
                        "ALTER TABLE pgqueue_dead DROP CONSTRAINT pgq_dead_reason_valid, "
                        "ADD CONSTRAINT pgq_dead_reason_valid "
                        f"CHECK (reason IN ({_OLD_IN}))"
                    ),
                ),
                migrations.RunSQL(
                    "ALTER TABLE pgqueue_dead VALIDATE CONSTRAINT pgq_dead_reason_valid",
                    reverse_sql=migrations.RunSQL.noop,
                ),
            ],
        ),
    ]
