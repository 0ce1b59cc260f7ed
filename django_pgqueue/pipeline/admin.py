"""The pipeline's admin pages: the hourly stats drawn as charts, and the export runs and
ranges (read only: the pipeline's jobs write them)."""

from __future__ import annotations

from typing import Any

from django.contrib import admin
from django.core.exceptions import PermissionDenied
from django.http import HttpRequest, HttpResponse

from ..admin.browsers import ViewOnlyAdmin
from ..admin.reads import bounded_reads
from .models import ExportRange, ExportRun, QueueStatsHourly
from .views import render_stats


@admin.register(QueueStatsHourly)
class QueueStatsHourlyAdmin(ViewOnlyAdmin):
    """Its change list is the stats page (the queue dashboard links it as History & charts)."""

    def changelist_view(
        self, request: HttpRequest, extra_context: dict[str, Any] | None = None
    ) -> HttpResponse:
        if not self.has_view_permission(request):
            raise PermissionDenied
        return bounded_reads(request, self.model, lambda: render_stats(request, self.admin_site))


@admin.register(ExportRun)
class ExportRunAdmin(ViewOnlyAdmin):
    list_display = (
        "id",
        "destination",
        "status",
        "started_at",
        "finished_at",
        "ranges_done",
        "ranges_total",
        "rows_exported",
    )
    list_filter = ("status",)
    ordering = ("-id",)


@admin.register(ExportRange)
class ExportRangeAdmin(ViewOnlyAdmin):
    list_display = ("id", "destination", "source", "lo", "hi", "status", "source_rows")
    list_filter = ("source", "status")
    ordering = ("destination", "source", "-lo")
    list_select_related = False
    raw_id_fields = ("run",)
