"""Flow-control state: the lock row and rate bucket per queue, and per-key rate buckets
(see ``core/flow_control.py``). Both are small and only touched by claims of queues with
limits or rates.
"""

from __future__ import annotations

from django.db import models

from .validation import QUEUE_NAME_MAX_LENGTH, TENANT_MAX_LENGTH

FLOW_STATE_TABLE = "pgqueue_flow_state"
FLOW_KEY_BUCKET_TABLE = "pgqueue_flow_key_bucket"


class FlowState(models.Model):
    """One row per queue with limits: its rate bucket (claims lock the queue with an advisory
    lock, see ``core/sql.py``)."""

    queue = models.CharField(max_length=QUEUE_NAME_MAX_LENGTH, primary_key=True)
    tokens = models.FloatField(
        null=True, blank=True, help_text="Queue rate-limit bucket (NULL: full)."
    )
    refilled_at = models.DateTimeField(null=True, blank=True)

    class Meta:
        db_table = FLOW_STATE_TABLE
        verbose_name = "flow-control state"

    def __str__(self) -> str:
        return self.queue


class FlowKeyBucket(models.Model):
    """The rate-limit bucket of one key (tenant) of one queue."""

    pk = models.CompositePrimaryKey("queue", "key")
    queue = models.CharField(max_length=QUEUE_NAME_MAX_LENGTH)
    key = models.CharField(max_length=TENANT_MAX_LENGTH)
    tokens = models.FloatField()
    refilled_at = models.DateTimeField()

    class Meta:
        db_table = FLOW_KEY_BUCKET_TABLE
        verbose_name = "flow-control key bucket"

    def __str__(self) -> str:
        return f"{self.queue}/{self.key}"
