"""The workers' maintenance state: one row per job (today ``retention``).

``next_run_at`` is when the job is due again (database time). A worker that finds it due moves
it on with a compare-and-set before doing the job, so among any number of workers one does it
per interval; an advisory lock held while it runs keeps a one-off ``pgq_prune`` from
overlapping it.
"""

from __future__ import annotations

from typing import Any

from django.db import models

MAINTENANCE_TABLE = "pgqueue_maintenance"


class MaintenanceState(models.Model):
    name = models.CharField(max_length=64, primary_key=True)
    next_run_at = models.DateTimeField(help_text="When a worker does the job next (database time).")
    last_started_at = models.DateTimeField(null=True, blank=True)
    last_finished_at = models.DateTimeField(null=True, blank=True)
    last_worker = models.CharField(max_length=255, blank=True, default="")
    last_report: models.JSONField[Any] = models.JSONField(
        default=dict, blank=True, help_text="What the last run did, as pgq_prune prints it."
    )

    class Meta:
        db_table = MAINTENANCE_TABLE
        verbose_name = "maintenance job"

    def __str__(self) -> str:
        return self.name
