"""The periodic schedules in the admin: when each last ran and runs next, pause, "Run now".

Rows are written by the workers (``periodic.py``); the admin only reads them, pauses and
resumes them, and enqueues one run outside the slots, each behind its own permission.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from django.contrib import admin, messages
from django.contrib.admin.models import CHANGE, LogEntry
from django.db.models import QuerySet
from django.db.models.functions import Now
from django.http import HttpRequest

from ..core._periodic_models import PeriodicSchedule
from ..periodic import run_now, schedules
from .actions import acting_user_id
from .browsers import ViewOnlyAdmin

if TYPE_CHECKING:
    BaseModelAdmin = admin.ModelAdmin[Any]
else:  # ModelAdmin is generic only in the type stubs
    BaseModelAdmin = admin.ModelAdmin

__all__ = ["PeriodicScheduleAdmin"]


@admin.register(PeriodicSchedule)
class PeriodicScheduleAdmin(ViewOnlyAdmin):
    list_display = (
        "name",
        "task",
        "queue",
        "spec",
        "in_code",
        "paused",
        "last_run_at",
        "next_run_at",
        "last_message_id",
    )
    list_filter = ("paused", "queue")
    ordering = ("name",)
    readonly_fields = (
        "name",
        "task",
        "queue",
        "spec",
        "paused",
        "last_run_at",
        "next_run_at",
        "last_message_id",
        "updated_at",
    )
    actions = ("pause", "resume", "run_now")

    def has_pause_permission(self, request: HttpRequest) -> bool:
        return self._has_perm(request, "pause_periodicschedule")

    def has_run_permission(self, request: HttpRequest) -> bool:
        return self._has_perm(request, "run_periodicschedule")

    @admin.display(boolean=True, description="in the code")
    def in_code(self, obj: PeriodicSchedule) -> bool:
        # A schedule removed from the code keeps its row but is never enqueued again.
        return obj.name in {s.name for s in schedules()}

    def _log(self, request: HttpRequest, rows: list[PeriodicSchedule], text: str) -> None:
        if rows:
            LogEntry.objects.log_actions(
                user_id=acting_user_id(request),
                queryset=rows,
                action_flag=CHANGE,
                change_message=text,
            )

    def _set_paused(self, request: HttpRequest, queryset: QuerySet[Any], paused: bool) -> None:
        rows = list(queryset.filter(paused=not paused))
        PeriodicSchedule.objects.filter(pk__in=[r.pk for r in rows]).update(
            paused=paused, updated_at=Now()
        )
        verb = "Paused" if paused else "Resumed"
        self._log(request, rows, f"{verb} the schedule.")
        self.message_user(request, f"{verb} {len(rows)} schedule(s).", messages.SUCCESS)

    @admin.action(permissions=["pause"], description="Pause the selected schedules")
    def pause(self, request: HttpRequest, queryset: QuerySet[Any]) -> None:
        self._set_paused(request, queryset, True)

    @admin.action(permissions=["pause"], description="Resume the selected schedules")
    def resume(self, request: HttpRequest, queryset: QuerySet[Any]) -> None:
        self._set_paused(request, queryset, False)

    @admin.action(permissions=["run"], description="Run now (one extra message each)")
    def run_now(self, request: HttpRequest, queryset: QuerySet[Any]) -> None:
        done, missing = [], []
        for row in queryset.order_by("name"):
            try:
                run_now(row.name)
            except LookupError:
                missing.append(row.name)
            else:
                done.append(row)
        self._log(request, done, "Enqueued one run now.")
        text = f"Enqueued {len(done)} run(s) now."
        if missing:
            text += f" Skipped {', '.join(missing)}: not declared in the code."
        self.message_user(request, text, messages.WARNING if missing else messages.SUCCESS)
