"""Read-only browsers for live, archived and dead messages, with the operator actions.

Rows never change through forms: every change is an action that runs one statement of
``core.operations`` behind its own permission (the custom permissions of the models' Meta).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from django.contrib import admin
from django.contrib.admin import DateFieldListFilter
from django.db.models import Q, QuerySet
from django.db.models.functions import Now
from django.http import HttpRequest, HttpResponse, HttpResponseRedirect
from django.urls import reverse
from django.utils.html import format_html
from django.utils.safestring import SafeString

from ..core import operations
from ..core.transitions import Outcome
from ..models import ArchivedMessage, DeadMessage, Message, WorkerHeartbeat
from .actions import CappedPaginator, bounded_selection, report
from .compat import CHANGE_FORM_ACTIONS, ActionLocation, action
from .display import errors_html, json_html, json_preview, traceback_html
from .filters import LiveStateFilter, QueueFilter, TaskFilter

if TYPE_CHECKING:
    BaseModelAdmin = admin.ModelAdmin[Any]
else:  # ModelAdmin is generic only in the type stubs
    BaseModelAdmin = admin.ModelAdmin

__all__ = [
    "ArchivedMessageAdmin",
    "DeadMessageAdmin",
    "MessageAdmin",
    "ReadOnlyAdmin",
    "WorkerHeartbeatAdmin",
]

BOTH = [ActionLocation.CHANGE_LIST, ActionLocation.CHANGE_FORM]
# Ids are bigint: a longer digit string cannot be one.
_MAX_ID_DIGITS = 18


def _ran_from_change_form(request: HttpRequest) -> bool:
    return f"{ActionLocation.CHANGE_FORM.value}-action" in request.POST


class _ViewOnlyAdmin(BaseModelAdmin):
    """No add, change or delete through forms; view permission is enough."""

    def has_add_permission(self, request: HttpRequest) -> bool:
        return False

    def has_change_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return False

    def has_delete_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return False


class ReadOnlyAdmin(_ViewOnlyAdmin):
    """Browse only: no add, change or delete through forms; view permission is enough."""

    show_full_result_count = False
    paginator = CappedPaginator
    list_per_page = 50
    ordering = ("-id",)
    search_fields = ("=id",)  # shows the search box; get_search_results does the work
    search_help_text = "A message id, or an exact task name, dedup key or tenant."

    def _admin_url(self, name: str, *args: Any) -> str:
        # Works on any AdminSite instance, not only the default one.
        return reverse(f"admin:django_pgqueue_{name}", args=args, current_app=self.admin_site.name)

    def _has_perm(self, request: HttpRequest, codename: str) -> bool:
        return request.user.has_perm(f"{self.opts.app_label}.{codename}")

    def text_search(self, term: str) -> Q:
        return Q(task=term) | Q(dedup_key=term) | Q(tenant=term)

    def get_search_results(
        self, request: HttpRequest, queryset: QuerySet[Any], search_term: str
    ) -> tuple[QuerySet[Any], bool]:
        # Exact matches only: an id through the primary key, never LIKE over the payloads.
        term = search_term.strip()
        if not term:
            return queryset, False
        condition = self.text_search(term)
        if term.isdigit() and len(term) <= _MAX_ID_DIGITS:
            condition |= Q(pk=int(term))
            if any(f.name == "message_id" for f in self.opts.fields):
                condition |= Q(message_id=int(term))
        return queryset.filter(condition), False

    def _run_and_report(
        self,
        request: HttpRequest,
        queryset: QuerySet[Any],
        operation: Callable[[list[int]], Outcome],
        *,
        id_attribute: str = "id",
        verb: str,
        noun: str,
        why_skipped: str,
        log_message: str,
    ) -> set[int]:
        """Run ``operation`` on the selected rows' ids (read from ``id_attribute``), report
        what was done and skipped, and return the ids done."""
        rows, truncated = bounded_selection(queryset)
        outcome = operation([getattr(row, id_attribute) for row in rows])
        done = set(outcome.done)
        report(
            self,
            request,
            done=[row for row in rows if getattr(row, id_attribute) in done],
            skipped=len(outcome.stale),
            verb=verb,
            noun=noun,
            why_skipped=why_skipped,
            log_message=log_message,
            truncated=truncated,
        )
        return done

    @admin.display(description="payload")
    def payload_preview(self, obj: Any) -> str:
        return json_preview(obj.payload)

    @admin.display(description="payload")
    def payload_pretty(self, obj: Any) -> SafeString:
        return json_html(obj.payload)

    @admin.display(description="errors of every attempt")
    def errors_pretty(self, obj: Any) -> SafeString:
        return errors_html(obj.errors)

    @admin.display(description="attempts")
    def attempts_display(self, obj: Any) -> str:
        return f"{obj.attempts} / {obj.max_attempts}"


@admin.register(Message)
class MessageAdmin(ReadOnlyAdmin):
    list_display = (
        "id",
        "task",
        "queue",
        "state",
        "priority",
        "attempts_display",
        "available_at",
        "leased_by",
        "payload_preview",
    )
    list_filter = (QueueFilter, LiveStateFilter, TaskFilter, ("enqueued_at", DateFieldListFilter))
    fieldsets = (
        (None, {"fields": (("id", "queue", "task"), ("state", "priority", "tenant", "dedup_key"))}),
        (
            "Attempts and lease",
            {
                "fields": (
                    ("attempts", "max_attempts", "enqueued_at", "available_at"),
                    ("leased_by", "leased_at", "lease_token"),
                )
            },
        ),
        ("Payload", {"fields": ("payload_pretty",)}),
        ("Errors", {"fields": ("last_error_pretty", "errors_pretty")}),
    )
    readonly_fields = (
        "id",
        "queue",
        "task",
        "state",
        "priority",
        "tenant",
        "dedup_key",
        "attempts",
        "max_attempts",
        "enqueued_at",
        "available_at",
        "leased_by",
        "leased_at",
        "lease_token",
        "payload_pretty",
        "last_error_pretty",
        "errors_pretty",
    )
    actions = ("retry_now", "release_leases", "discard")

    def get_queryset(self, request: HttpRequest) -> QuerySet[Any]:
        # The state column compares with database time, not the web server's clock.
        return super().get_queryset(request).annotate(db_now=Now())

    @admin.display(description="state")
    def state(self, obj: Message) -> str:
        now = getattr(obj, "db_now", None)
        if now is None:
            return "?"
        if obj.lease_token is not None:
            return "in flight" if obj.available_at > now else "lease expired"
        if obj.available_at > now:
            return "retrying (backing off)" if obj.attempts else "scheduled"
        return "ready (retry)" if obj.attempts else "ready"

    @admin.display(description="last error")
    def last_error_pretty(self, obj: Message) -> SafeString:
        return json_html(obj.last_error) if obj.last_error else format_html("{}", "—")

    def has_retry_now_permission(self, request: HttpRequest) -> bool:
        return self._has_perm(request, "retry_now_message")

    def has_release_permission(self, request: HttpRequest) -> bool:
        return self._has_perm(request, "release_message")

    def has_discard_permission(self, request: HttpRequest) -> bool:
        return self._has_perm(request, "discard_message")

    @action(permissions=["retry_now"], description="Run now", location=BOTH)
    def retry_now(self, request: HttpRequest, queryset: QuerySet[Message]) -> None:
        self._run_and_report(
            request,
            queryset,
            operations.retry_now,
            verb="Made available now:",
            noun="live message",
            why_skipped="leased by a worker, already available, or no longer live",
            log_message="Made available now (run now).",
        )

    @action(permissions=["release"], description="Release lease", location=BOTH)
    def release_leases(self, request: HttpRequest, queryset: QuerySet[Message]) -> None:
        self._run_and_report(
            request,
            queryset,
            operations.release_leases,
            verb="Released the leases of",
            noun="live message",
            why_skipped="not leased, or no longer live (finished or moved meanwhile)",
            log_message="Released its lease; the holder's late completion is fenced off.",
        )

    @action(permissions=["discard"], description="Discard to the dead letters", location=BOTH)
    def discard(self, request: HttpRequest, queryset: QuerySet[Message]) -> HttpResponse | None:
        note = f"discarded by {request.user.get_username()} in the admin"
        self._run_and_report(
            request,
            queryset,
            lambda message_ids: operations.discard(message_ids, note=note),
            verb="Discarded",
            noun="live message",
            why_skipped="no longer live (finished, discarded or buried meanwhile)",
            log_message="Discarded to the dead letters (reason: discarded).",
        )
        if _ran_from_change_form(request):
            # The row has left the live table: show the list instead of a missing page.
            return HttpResponseRedirect(self._admin_url("message_changelist"))
        return None


@admin.register(DeadMessage)
class DeadMessageAdmin(ReadOnlyAdmin):
    list_display = (
        "id",
        "message_id",
        "task",
        "queue",
        "reason",
        "died_at",
        "attempts_display",
        "error_summary",
        "payload_preview",
    )
    list_filter = (QueueFilter, TaskFilter, "reason", ("died_at", DateFieldListFilter))
    fieldsets = (
        (
            None,
            {"fields": (("id", "message_id", "queue", "task"), ("reason", "died_at", "worker_id"))},
        ),
        ("Final error", {"fields": ("error_summary", "traceback_pretty")}),
        ("Payload", {"fields": ("payload_pretty",)}),
        (
            "Every attempt",
            {
                "fields": (
                    ("attempts", "max_attempts", "enqueued_at"),
                    ("priority", "tenant", "dedup_key"),
                    "errors_pretty",
                )
            },
        ),
    )
    readonly_fields = (
        "id",
        "message_id",
        "queue",
        "task",
        "reason",
        "died_at",
        "worker_id",
        "priority",
        "tenant",
        "dedup_key",
        "attempts",
        "max_attempts",
        "enqueued_at",
        "error_summary",
        "traceback_pretty",
        "payload_pretty",
        "errors_pretty",
    )
    actions = ("retry_dead",)
    change_form_template = "admin/django_pgqueue/deadmessage/change_form.html"

    def text_search(self, term: str) -> Q:
        return super().text_search(term) | Q(worker_id=term)

    @admin.display(description="error")
    def error_summary(self, obj: DeadMessage) -> str:
        details = obj.details if isinstance(obj.details, dict) else {}
        text = f"{details.get('type', '')}: {details.get('message', '')}".strip(": ")
        return text[:200] + ("…" if len(text) > 200 else "")

    @admin.display(description="traceback")
    def traceback_pretty(self, obj: DeadMessage) -> SafeString:
        details = obj.details if isinstance(obj.details, dict) else {}
        return traceback_html(details.get("traceback"))

    def has_retry_permission(self, request: HttpRequest) -> bool:
        return self._has_perm(request, "retry_deadmessage")

    def change_view(
        self,
        request: HttpRequest,
        object_id: str,
        form_url: str = "",
        extra_context: dict[str, Any] | None = None,
    ) -> HttpResponse:
        # Before Django 6.1 actions run from the change list only: no Retry button here.
        can_retry = CHANGE_FORM_ACTIONS and self.has_retry_permission(request)
        context = {**(extra_context or {}), "pgq_can_retry": can_retry}
        return super().change_view(request, object_id, form_url, context)

    @action(permissions=["retry"], description="Retry", location=BOTH)
    def retry_dead(
        self, request: HttpRequest, queryset: QuerySet[DeadMessage]
    ) -> HttpResponse | None:
        done = self._run_and_report(
            request,
            queryset,
            operations.retry_dead,
            id_attribute="message_id",
            verb="Retried",
            noun="dead message",
            why_skipped=(
                "already retried by someone else, or a live message holds the same dedup key"
            ),
            log_message="Retried: live again under the same message id, attempts reset.",
        )
        if _ran_from_change_form(request):
            if len(done) == 1:
                (message_id,) = done
                return HttpResponseRedirect(self._admin_url("message_change", message_id))
            return HttpResponseRedirect(self._admin_url("deadmessage_changelist"))
        return None


@admin.register(ArchivedMessage)
class ArchivedMessageAdmin(ReadOnlyAdmin):
    list_display = (
        "id",
        "message_id",
        "task",
        "queue",
        "finished_at",
        "duration",
        "attempts_display",
        "worker_id",
        "result_preview",
    )
    list_filter = (QueueFilter, TaskFilter, ("finished_at", DateFieldListFilter))
    fieldsets = (
        (
            None,
            {
                "fields": (
                    ("id", "message_id", "queue", "task"),
                    ("priority", "tenant", "dedup_key"),
                )
            },
        ),
        (
            "Run",
            {
                "fields": (
                    ("attempts", "max_attempts", "worker_id"),
                    ("enqueued_at", "started_at", "finished_at", "duration"),
                )
            },
        ),
        ("Payload and result", {"fields": ("payload_pretty", "result_pretty")}),
        ("Errors of earlier attempts", {"fields": ("errors_pretty",)}),
    )
    readonly_fields = (
        "id",
        "message_id",
        "queue",
        "task",
        "priority",
        "tenant",
        "dedup_key",
        "attempts",
        "max_attempts",
        "enqueued_at",
        "started_at",
        "finished_at",
        "duration",
        "worker_id",
        "payload_pretty",
        "result_pretty",
        "errors_pretty",
    )
    actions = ("requeue",)

    def text_search(self, term: str) -> Q:
        return super().text_search(term) | Q(worker_id=term)

    @admin.display(description="duration")
    def duration(self, obj: ArchivedMessage) -> str:
        if obj.started_at is None or obj.finished_at is None:
            return "—"
        return f"{(obj.finished_at - obj.started_at).total_seconds():.3f} s"

    @admin.display(description="result")
    def result_preview(self, obj: ArchivedMessage) -> str:
        return json_preview(obj.result)

    @admin.display(description="result")
    def result_pretty(self, obj: ArchivedMessage) -> SafeString:
        return json_html(obj.result)

    def has_requeue_permission(self, request: HttpRequest) -> bool:
        return self._has_perm(request, "requeue_archivedmessage")

    @action(permissions=["requeue"], description="Requeue as a new message", location=BOTH)
    def requeue(self, request: HttpRequest, queryset: QuerySet[ArchivedMessage]) -> None:
        rows, truncated = bounded_selection(queryset)
        new_ids = operations.requeue_archived([a.id for a in rows])
        done = rows
        if len(new_ids) != len(rows):
            # Some rows left the archive (retention) before the copy: those still here were copied.
            still_here = set(
                ArchivedMessage.objects.filter(id__in=[a.id for a in rows]).values_list(
                    "id", flat=True
                )
            )
            done = [a for a in rows if a.id in still_here]
        report(
            self,
            request,
            done=done,
            skipped=len(rows) - len(new_ids),
            verb="Requeued",
            noun="archived message",
            why_skipped="removed from the archive meanwhile",
            log_message="Requeued as a new live message (new id, no dedup key).",
            truncated=truncated,
        )


@admin.register(WorkerHeartbeat)
class WorkerHeartbeatAdmin(_ViewOnlyAdmin):
    list_display = ("worker_id", "hostname", "pid", "queues", "concurrency", "last_seen_at")
    ordering = ("-last_seen_at",)
    fields = readonly_fields = (
        "worker_id",
        "hostname",
        "pid",
        "queues",
        "concurrency",
        "started_at",
        "last_seen_at",
        "stats_pretty",
    )

    @admin.display(description="stats")
    def stats_pretty(self, obj: WorkerHeartbeat) -> SafeString:
        return json_html(obj.stats)
