"""Flow-control state (see ``core/_flow_sql.py``): the sessions' allowances of queues with
limits, and the rates' theoretical arrival times. Small tables, touched only by claims of
queues with limits or rates; never by a plain queue's claim or by any ack.
"""

from __future__ import annotations

from django.db import models

from ._validation import QUEUE_NAME_MAX_LENGTH, TENANT_MAX_LENGTH

FLOW_ALLOWANCE_TABLE = "pgqueue_flow_allowance"
FLOW_RATE_TABLE = "pgqueue_flow_rate"


class FlowAllowance(models.Model):
    """What one claiming session (``holder``: its backend pid) of a queue with limits may
    still lease without counting, until ``until`` (database time): reserved by an exact claim
    out of the room under every limit and the rate's tokens, and spent by the session's
    claims after it. The next exact claim settles it once ``until`` has passed."""

    pk = models.CompositePrimaryKey("queue", "holder")
    queue = models.CharField(max_length=QUEUE_NAME_MAX_LENGTH)
    holder = models.IntegerField()
    units = models.IntegerField()
    until = models.DateTimeField()

    class Meta:
        db_table = FLOW_ALLOWANCE_TABLE
        verbose_name = "flow-control allowance"

    def __str__(self) -> str:
        return f"{self.queue}/{self.holder}"


class FlowRate(models.Model):
    """One rate limit as a GCRA: the queue's own (``key`` empty) or one tenant's. ``tat``,
    the theoretical arrival time, is how far ahead of now the tokens already spent reach."""

    pk = models.CompositePrimaryKey("queue", "key")
    queue = models.CharField(max_length=QUEUE_NAME_MAX_LENGTH)
    key = models.CharField(max_length=TENANT_MAX_LENGTH)
    tat = models.DateTimeField()

    class Meta:
        db_table = FLOW_RATE_TABLE
        verbose_name = "flow-control rate"

    def __str__(self) -> str:
        return f"{self.queue}/{self.key}" if self.key else self.queue
