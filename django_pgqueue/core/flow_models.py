"""Flow-control state: a row per queue with limits, its rate bucket in shards, and per-key
rate buckets (see ``core/flow_control.py``). All small, and only touched by claims of queues
with limits or rates.
"""

from __future__ import annotations

from django.db import models

from .validation import QUEUE_NAME_MAX_LENGTH, TENANT_MAX_LENGTH

FLOW_STATE_TABLE = "pgqueue_flow_state"
FLOW_KEY_BUCKET_TABLE = "pgqueue_flow_key_bucket"
FLOW_RATE_SHARD_TABLE = "pgqueue_flow_rate_shard"
FLOW_CREDIT_TABLE = "pgqueue_flow_credit"


class FlowState(models.Model):
    """One row per queue with limits, created by its first serialized claim: optimistic
    claims wait for it (claims lock the queue with an advisory lock, see ``core/sql.py``)."""

    queue = models.CharField(max_length=QUEUE_NAME_MAX_LENGTH, primary_key=True)

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


class FlowRateShard(models.Model):
    """One shard of a queue's rate-limit bucket and of its kept count of leases: twice as
    many shards as optimistic claims may run at once, so that claims and acks side by side
    update different rows (see ``core/sql.py``).

    - ``tokens``: the shard's share of the rate bucket (a queue with a rate; the first half
      of the shards): an optimistic claim takes tokens from its own shard, a serialized claim
      from all.
    - ``held``: the shard's part of the queue's leases not given back (a queue with a
      concurrency limit): optimistic claims add what they lease to theirs, acks take away
      what they end from one of the second half, a serialized claim counts them all and
      stamps ``counted_at``. Only the sum over the shards means anything.
    """

    pk = models.CompositePrimaryKey("queue", "shard")
    queue = models.CharField(max_length=QUEUE_NAME_MAX_LENGTH)
    shard = models.SmallIntegerField()
    tokens = models.FloatField()
    refilled_at = models.DateTimeField()
    held = models.BigIntegerField(default=0, db_default=0)
    counted_at = models.DateTimeField(null=True)

    class Meta:
        db_table = FLOW_RATE_SHARD_TABLE
        verbose_name = "flow-control rate shard"

    def __str__(self) -> str:
        return f"{self.queue}#{self.shard}"


class FlowCredit(models.Model):
    """A claim credit: what one claiming session (``holder``) of a queue with limits may still
    lease under the claims of fairness alone, until ``until`` (database time). Granted by an
    optimistic claim far from every limit, which counts the whole ``allowance`` as in flight
    and spends its tokens at once; every other claim counts it as in flight until ``until``
    (see ``core/sql.py``, "Claim credits")."""

    pk = models.CompositePrimaryKey("queue", "holder")
    queue = models.CharField(max_length=QUEUE_NAME_MAX_LENGTH)
    holder = models.CharField(max_length=64)
    allowance = models.IntegerField()
    until = models.DateTimeField()

    class Meta:
        db_table = FLOW_CREDIT_TABLE
        verbose_name = "flow-control claim credit"

    def __str__(self) -> str:
        return f"{self.queue}/{self.holder}"
