"""The queue dashboard (the "Queues" page of the admin) and its pause, resume and purge views."""

from __future__ import annotations

from typing import Any

from django.contrib import admin, messages
from django.contrib.admin.models import CHANGE, LogEntry
from django.core.exceptions import BadRequest, PermissionDenied
from django.db.models import QuerySet
from django.http import HttpRequest, HttpResponse, HttpResponseNotAllowed, HttpResponseRedirect
from django.template.response import TemplateResponse
from django.urls import NoReverseMatch, URLPattern, path, reverse

from ..core import operations
from ..core._validation import validate_queue_name
from ..exceptions import QueueNameError
from ..models import QueueState
from .actions import acting_user_id
from .browsers import ViewOnlyAdmin
from .columns import safe_timestamps, timestamp_column
from .overview import COUNT_CAP, THROUGHPUT_CAP, live_worker_seconds, read_overview
from .reads import bounded_reads

__all__ = ["QueueStateAdmin"]

# The pipeline app's stats charts (its admin page), linked by name when that app is installed:
# the queue's admin never imports the pipeline.
HISTORY_URL_NAME = "admin:django_pgqueue_pipeline_queuestatshourly_changelist"
HISTORY_PERMISSION = "django_pgqueue_pipeline.view_queuestatshourly"
# Auto-refresh periods offered on the dashboard, in seconds.
REFRESH_CHOICES = (5, 15, 60)


def _refresh_seconds(request: HttpRequest) -> int | None:
    """``?refresh=N`` reloads the page every N seconds (one of REFRESH_CHOICES)."""
    try:
        seconds = int(request.GET.get("refresh", ""))
    except ValueError:
        return None
    return seconds if seconds in REFRESH_CHOICES else None


@admin.register(QueueState)
class QueueStateAdmin(ViewOnlyAdmin):
    """Its change list is the dashboard: every queue at a glance, with pause and purge."""

    fields = readonly_fields = ("name", "paused", "updated_at_shown")
    updated_at_shown = timestamp_column("updated_at", "updated at")

    def get_queryset(self, request: HttpRequest) -> QuerySet[QueueState]:
        # A queue's own page: its timestamp read so that no stored value breaks it.
        return (
            super()
            .get_queryset(request)
            .defer("updated_at")
            .annotate(**safe_timestamps("updated_at"))
        )

    def _admin_url(self, name: str) -> str:
        # Works on any AdminSite instance, not only the default one.
        return reverse(f"admin:django_pgqueue_{name}", current_app=self.admin_site.name)

    def has_pause_permission(self, request: HttpRequest) -> bool:
        return request.user.has_perm("django_pgqueue.pause_queue")

    def has_purge_permission(self, request: HttpRequest) -> bool:
        return request.user.has_perm("django_pgqueue.purge_queue")

    def get_urls(self) -> list[URLPattern]:
        wrap = self.admin_site.admin_view
        urls = [
            path("pause/", wrap(self.pause_view), name="django_pgqueue_queue_pause"),
            path("resume/", wrap(self.resume_view), name="django_pgqueue_queue_resume"),
            path("purge/", wrap(self.purge_view), name="django_pgqueue_queue_purge"),
        ]
        return urls + super().get_urls()

    def _require_view(self, request: HttpRequest) -> None:
        if not self.has_view_or_change_permission(request):
            raise PermissionDenied

    def changelist_view(
        self, request: HttpRequest, extra_context: dict[str, Any] | None = None
    ) -> HttpResponse:
        self._require_view(request)
        return bounded_reads(request, self.model, lambda: self._dashboard(request, extra_context))

    def _dashboard(
        self, request: HttpRequest, extra_context: dict[str, Any] | None
    ) -> HttpResponse:
        overview = read_overview()
        refresh = _refresh_seconds(request)
        context = {
            **self.admin_site.each_context(request),
            "title": "Queue dashboard",
            "opts": self.opts,
            "overview": overview,
            "count_cap": f"{COUNT_CAP:,}",
            "throughput_cap": f"{THROUGHPUT_CAP:,}",
            "live_window": f"{live_worker_seconds():g}",
            "can_pause": self.has_pause_permission(request),
            "can_purge": self.has_purge_permission(request),
            "history_url": self._history_url(request),
            "refresh": refresh,
            "refresh_choices": REFRESH_CHOICES,
            **(extra_context or {}),
        }
        return TemplateResponse(request, "admin/django_pgqueue/queuestate/dashboard.html", context)

    def _history_url(self, request: HttpRequest) -> str | None:
        # Present only when the pipeline app is installed (its page is on this admin site),
        # and only for those who may read the stats.
        if not request.user.has_perm(HISTORY_PERMISSION):
            return None
        try:
            return reverse(HISTORY_URL_NAME, current_app=self.admin_site.name)
        except NoReverseMatch:
            return None

    def _queue_from(self, request: HttpRequest) -> str:
        try:
            return validate_queue_name(request.POST.get("queue") or request.GET.get("queue"))
        except QueueNameError as exc:
            raise BadRequest(str(exc)) from exc

    def _log(self, request: HttpRequest, queue: str, message: str) -> None:
        LogEntry.objects.log_actions(
            user_id=acting_user_id(request),
            queryset=[QueueState(name=queue)],
            action_flag=CHANGE,
            change_message=message,
        )

    def _back(self) -> HttpResponseRedirect:
        return HttpResponseRedirect(self._admin_url("queuestate_changelist"))

    def _set_paused(self, request: HttpRequest, paused: bool) -> HttpResponse:
        if request.method != "POST":
            return HttpResponseNotAllowed(["POST"])
        if not self.has_pause_permission(request):
            raise PermissionDenied
        queue = self._queue_from(request)
        if paused:
            operations.pause_queue(queue)
        else:
            operations.resume_queue(queue)
        verb = "Paused" if paused else "Resumed"
        self._log(request, queue, f"{verb} the queue.")
        self.message_user(
            request,
            f"{verb} queue {queue}."
            + (" Workers stop claiming from it; messages in flight finish." if paused else ""),
            messages.SUCCESS,
        )
        return self._back()

    def pause_view(self, request: HttpRequest) -> HttpResponse:
        return self._set_paused(request, True)

    def resume_view(self, request: HttpRequest) -> HttpResponse:
        return self._set_paused(request, False)

    def purge_view(self, request: HttpRequest) -> HttpResponse:
        """GET: the confirmation page. POST with ``confirm=yes``: delete the queue's live rows."""
        if not self.has_purge_permission(request):
            raise PermissionDenied
        queue = self._queue_from(request)
        if request.method == "POST" and request.POST.get("confirm") == "yes":
            purged = operations.purge_queue(queue)
            self._log(request, queue, f"Purged {purged:,} live messages.")
            self.message_user(
                request, f"Purged {purged:,} live messages from queue {queue}.", messages.SUCCESS
            )
            return self._back()
        return bounded_reads(request, self.model, lambda: self._purge_page(request, queue))

    def _purge_page(self, request: HttpRequest, queue: str) -> HttpResponse:
        summary = next((q for q in read_overview().queues if q.name == queue), None)
        context = {
            **self.admin_site.each_context(request),
            "title": f"Purge queue {queue}?",
            "opts": self.opts,
            "queue": queue,
            "summary": summary,
        }
        return TemplateResponse(
            request, "admin/django_pgqueue/queuestate/purge_confirmation.html", context
        )
