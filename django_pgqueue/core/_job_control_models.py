"""Job control's state beside the live table: the unique windows of keys
(``enqueue(..., unique_for=...)``) and the progress handlers report. Small tables, touched
only by enqueues and handlers that use them; never by a plain enqueue, a claim or an ack.
Retention deletes what is no longer needed (``core/_retention.py``).
"""

from __future__ import annotations

from django.db import models
from django.db.models.functions import Now

from ._validation import (
    DEDUP_KEY_MAX_LENGTH,
    PROGRESS_NOTE_MAX_LENGTH,
    QUEUE_NAME_MAX_LENGTH,
    TASK_NAME_MAX_LENGTH,
)

UNIQUE_WINDOW_TABLE = "pgqueue_unique_window"
PROGRESS_TABLE = "pgqueue_progress"


class UniqueWindow(models.Model):
    """A key of a queue taken by the first ``unique_for`` enqueue, until ``expires_at``
    (database time): the enqueues of that key before then return the first message."""

    pk = models.CompositePrimaryKey("queue", "key")
    queue = models.CharField(max_length=QUEUE_NAME_MAX_LENGTH)
    key = models.CharField(max_length=DEDUP_KEY_MAX_LENGTH)
    expires_at = models.DateTimeField()
    # The first message, as enqueue returned it (NULL only inside the enqueue's transaction).
    message_id = models.BigIntegerField(null=True, blank=True)
    task = models.CharField(max_length=TASK_NAME_MAX_LENGTH, null=True, blank=True)
    enqueued_at = models.DateTimeField(null=True, blank=True)
    available_at = models.DateTimeField(null=True, blank=True)

    class Meta:
        db_table = UNIQUE_WINDOW_TABLE
        verbose_name = "unique window"
        # Retention deletes the expired windows from the oldest.
        indexes = [models.Index(fields=["expires_at"], name="pgq_unique_window_expires")]

    def __str__(self) -> str:
        return f"{self.queue}/{self.key}"


class MessageProgress(models.Model):
    """The last progress a live message's handler reported (one row per message, upserted by
    the worker's completer at most every ``PROGRESS_INTERVAL``)."""

    message_id = models.BigIntegerField(primary_key=True)
    done = models.BigIntegerField()
    total = models.BigIntegerField(null=True, blank=True)
    note = models.CharField(max_length=PROGRESS_NOTE_MAX_LENGTH, blank=True, default="")
    updated_at = models.DateTimeField(db_default=Now())

    class Meta:
        db_table = PROGRESS_TABLE
        verbose_name = "message progress"
        verbose_name_plural = "message progress"

    def __str__(self) -> str:
        return f"#{self.message_id}: {self.done}/{self.total if self.total is not None else '?'}"
