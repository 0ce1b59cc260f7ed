"""Periodic schedules' state: one row per schedule declared in code (``periodic.py``).

``next_run_at`` is the slot the schedule waits for. A worker that finds it due moves it on
with a compare-and-set in the same transaction as the enqueue, so each slot is enqueued by
exactly one worker however many look at once.
"""

from __future__ import annotations

from django.db import models
from django.db.models.functions import Now

from ._validation import QUEUE_NAME_MAX_LENGTH, TASK_NAME_MAX_LENGTH

PERIODIC_TABLE = "pgqueue_periodic"


class PeriodicSchedule(models.Model):
    name = models.CharField(max_length=TASK_NAME_MAX_LENGTH, primary_key=True)
    task = models.CharField(max_length=TASK_NAME_MAX_LENGTH)
    queue = models.CharField(max_length=QUEUE_NAME_MAX_LENGTH)
    spec = models.CharField(
        max_length=300, help_text="What the code declares: cron or interval, and time zone."
    )
    next_run_at = models.DateTimeField(help_text="The next slot to enqueue (database time).")
    last_run_at = models.DateTimeField(null=True, blank=True, help_text="The last slot enqueued.")
    last_message_id = models.BigIntegerField(null=True, blank=True)
    paused = models.BooleanField(default=False, db_default=False)
    updated_at = models.DateTimeField(db_default=Now())

    class Meta:
        db_table = PERIODIC_TABLE
        verbose_name = "periodic schedule"
        permissions = [
            ("pause_periodicschedule", "Can pause and resume a periodic schedule"),
            ("run_periodicschedule", "Can run a periodic schedule now"),
        ]

    def __str__(self) -> str:
        return f"{self.name} ({self.spec})"
