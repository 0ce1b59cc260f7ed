"""Composition's tables: messages waiting on others, the dependencies between messages, and
batches with their members. The claim never reads any of them; the moves between them run in
the database, on the archive's and the dead table's writes (``_composition_sql.py``).
"""

from __future__ import annotations

from django.db import models
from django.db.models.functions import Now

from ._validation import QUEUE_NAME_MAX_LENGTH, TASK_NAME_MAX_LENGTH, TENANT_MAX_LENGTH

WAITING_TABLE = "pgqueue_waiting"
DEPENDENCY_TABLE = "pgqueue_dependency"
BATCH_TABLE = "pgqueue_batch"
BATCH_MEMBER_TABLE = "pgqueue_batch_member"

BATCH_LABEL_MAX_LENGTH = 200


class WaitingMessage(models.Model):
    """A message that may not run yet: some of the messages it depends on have not finished,
    or it is a batch's callback and the batch has not. Its id comes from the live messages'
    sequence and stays its id once released into the live table, then the archive or the
    dead table. The fields it shares with a live message are the ones a release copies."""

    id = models.BigIntegerField(primary_key=True)
    queue = models.CharField(max_length=QUEUE_NAME_MAX_LENGTH)
    task = models.CharField(max_length=TASK_NAME_MAX_LENGTH)
    payload = models.JSONField(null=True, blank=True)
    priority = models.SmallIntegerField(default=0)
    tenant = models.CharField(max_length=TENANT_MAX_LENGTH, null=True, blank=True)
    enqueued_at = models.DateTimeField(db_default=Now())
    max_attempts = models.IntegerField(default=3)
    pending = models.IntegerField(
        help_text=(
            "Dependencies not finished yet; released into the live table at 0. A batch's "
            "callback waits on its batch instead (1), which releases it."
        )
    )
    run_at = models.DateTimeField(
        null=True, blank=True, help_text="Not available before this time, once released."
    )
    delay = models.FloatField(
        default=0, help_text="Seconds after its release before it is available."
    )
    fair = models.BooleanField(
        default=False, help_text="Its queue is fair: it enters the fair order once due."
    )
    wake_channel = models.TextField(
        null=True, blank=True, help_text="Where its release notifies the workers (NULL: nowhere)."
    )
    headers = models.JSONField(null=True, blank=True, help_text="Its headers (NULL: none).")

    class Meta:
        db_table = WAITING_TABLE
        verbose_name = "waiting message"
        indexes = [models.Index(fields=["queue"], name="pgq_waiting_queue")]

    def __str__(self) -> str:
        return f"{self.task} #{self.id} on {self.queue} (waiting on {self.pending})"


class Dependency(models.Model):
    """``dependent_id`` runs only after ``prerequisite_id`` finished successfully. Kept while
    the dependent may still need it: to read its prerequisites' results while it runs, and to
    come back when a failed prerequisite is retried."""

    pk = models.CompositePrimaryKey("prerequisite_id", "dependent_id")
    prerequisite_id = models.BigIntegerField()
    dependent_id = models.BigIntegerField()

    class Meta:
        db_table = DEPENDENCY_TABLE
        verbose_name = "dependency"
        indexes = [models.Index(fields=["dependent_id"], name="pgq_dependency_dependent")]

    def __str__(self) -> str:
        return f"#{self.dependent_id} after #{self.prerequisite_id}"


class Batch(models.Model):
    """Messages enqueued as one, counted as they finish, with callbacks that run once: on
    completion (every member finished or dead), on success (every member finished), on
    failure (completion with at least one member dead)."""

    id = models.BigAutoField(primary_key=True)
    label = models.CharField(max_length=BATCH_LABEL_MAX_LENGTH, blank=True, default="")
    total = models.IntegerField()
    succeeded = models.IntegerField(default=0, db_default=0)
    failed = models.IntegerField(default=0, db_default=0)
    created_at = models.DateTimeField(db_default=Now())
    completed_at = models.DateTimeField(
        null=True, blank=True, help_text="When every member had finished or died, first."
    )
    succeeded_at = models.DateTimeField(
        null=True, blank=True, help_text="When every member had finished successfully."
    )
    on_complete_id = models.BigIntegerField(null=True, blank=True)
    on_success_id = models.BigIntegerField(null=True, blank=True)
    on_failure_id = models.BigIntegerField(null=True, blank=True)

    class Meta:
        db_table = BATCH_TABLE
        verbose_name = "batch"
        verbose_name_plural = "batches"
        indexes = [
            models.Index(
                fields=["created_at"],
                name="pgq_batch_open",
                condition=models.Q(completed_at__isnull=True),
            ),
            # A callback finds its batch (``batch_of``).
            *(
                models.Index(
                    fields=[f"on_{kind}_id"],
                    name=f"pgq_batch_on_{kind}",
                    condition=models.Q(**{f"on_{kind}_id__isnull": False}),
                )
                for kind in ("complete", "success", "failure")
            ),
        ]

    def __str__(self) -> str:
        return self.label or f"batch #{self.id}"

    @property
    def pending(self) -> int:
        return self.total - self.succeeded - self.failed


class BatchMember(models.Model):
    """One message of a batch, by its message id (wherever the message is now)."""

    message_id = models.BigIntegerField(primary_key=True)
    batch = models.ForeignKey(Batch, on_delete=models.CASCADE, related_name="members")

    class Meta:
        db_table = BATCH_MEMBER_TABLE
        verbose_name = "batch member"

    def __str__(self) -> str:
        return f"#{self.message_id} of batch #{self.batch_id}"
