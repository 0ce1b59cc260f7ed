"""Read-only browsers for live, archived and dead messages, with the operator actions.

Rows never change through forms: every change is an action that runs statements of
``core.operations`` behind its own permission (the custom permissions of the models' Meta),
on ids read in batches. Timestamps and JSON are read through ``columns`` so that no stored
value can break a page.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from django.contrib import admin
from django.contrib.admin import DateFieldListFilter, ShowFacets
from django.db.models import BooleanField, ExpressionWrapper, F, Q, QuerySet, TextField
from django.db.models.fields.json import KeyTextTransform, KeyTransform
from django.db.models.functions import Cast, Coalesce, Left, Length, Now
from django.http import HttpRequest, HttpResponse, HttpResponseRedirect
from django.urls import reverse
from django.utils.html import format_html, format_html_join
from django.utils.safestring import SafeString

from ..core import operations
from ..core._progress import get_progress
from ..core.transitions import Outcome
from ..models import ArchivedMessage, DeadMessage, DeadReason, Message, WorkerHeartbeat
from .actions import CappedPaginator, Wording, bounded_selection, in_batches, report
from .cancel import CancelAction
from .columns import HistoryEnds, decode_json, json_text, safe_timestamps, timestamp_column
from .compat import CHANGE_FORM_ACTIONS, ActionLocation, action
from .composition import composition_html, locate, message_links
from .display import (
    DETAIL_LIMIT,
    PREVIEW_LIMIT,
    activity_items,
    errors_html,
    json_html,
    text_preview,
    traceback_html,
    undecodable_html,
)
from .filters import LiveStateFilter, QueueFilter, TaskFilter
from .overview import known_queues
from .reads import bounded_reads, offered_lookups

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
# The dead list shows this much of the final error; the whole of it is the cell's title.
ERROR_SUMMARY_LIMIT = 500


# What each operator action says: verb, noun, why rows were skipped, the log entry.
RUN_NOW = Wording(
    "Made available now:",
    "live message",
    "leased by a worker, already available, or no longer live",
    "Made available now (run now).",
)
RELEASED = Wording(
    "Released the leases of",
    "live message",
    "not leased, or no longer live (finished or moved meanwhile)",
    "Released its lease; the holder's late completion is fenced off.",
)
DISCARDED = Wording(
    "Discarded",
    "live message",
    "no longer live (finished, discarded or buried meanwhile)",
    "Discarded to the dead letters (reason: discarded).",
)
RETRIED = Wording(
    "Retried",
    "dead message",
    "already retried by someone else, or a live message holds the same dedup key",
    "Retried: live again under the same message id, attempts reset.",
)
REQUEUED = Wording(
    "Requeued",
    "archived message",
    "removed from the archive meanwhile",
    "Requeued as a new live message (new id, no dedup key).",
)


def _ran_from_change_form(request: HttpRequest) -> bool:
    return f"{ActionLocation.CHANGE_FORM.value}-action" in request.POST


def _json_detail(text: str | None) -> SafeString:
    """A JSON column's text pretty-printed, or shown as stored when Python cannot read it."""
    value, decoded = decode_json(text)
    if not decoded:
        return undecodable_html(str(value), DETAIL_LIMIT)
    try:
        return json_html(value)
    except RecursionError:
        return undecodable_html(str(text), DETAIL_LIMIT)


class ViewOnlyAdmin(BaseModelAdmin):
    """No add, change or delete through forms; view permission is enough."""

    # "Show counts" would count every filter choice over the whole table.
    show_facets = ShowFacets.NEVER

    class Media:
        css = {"all": ["django_pgqueue/admin.css"]}

    def has_add_permission(self, request: HttpRequest) -> bool:
        return False

    def has_change_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return False

    def has_delete_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return False

    def _has_perm(self, request: HttpRequest, codename: str) -> bool:
        return request.user.has_perm(f"{self.opts.app_label}.{codename}")

    def lookup_allowed(self, lookup: str, value: str, request: HttpRequest) -> bool:
        # Only what the list's filters offer: any other lookup may scan a big table.
        return lookup in offered_lookups(self, request)

    def changelist_view(
        self, request: HttpRequest, extra_context: dict[str, Any] | None = None
    ) -> HttpResponse:
        return bounded_reads(
            request,
            self.model,
            lambda: super(ViewOnlyAdmin, self).changelist_view(request, extra_context),
        )

    def change_view(
        self,
        request: HttpRequest,
        object_id: str,
        form_url: str = "",
        extra_context: dict[str, Any] | None = None,
    ) -> HttpResponse:
        return bounded_reads(
            request,
            self.model,
            lambda: super(ViewOnlyAdmin, self).change_view(
                request, object_id, form_url, extra_context
            ),
        )

    def history_view(
        self, request: HttpRequest, object_id: str, extra_context: dict[str, Any] | None = None
    ) -> HttpResponse:
        return bounded_reads(
            request,
            self.model,
            lambda: super(ViewOnlyAdmin, self).history_view(request, object_id, extra_context),
        )


class RetryOnItsPage(ViewOnlyAdmin):
    """An admin whose rows are retried (``retry_deadmessage``) from their own page too: dead
    messages, batches (their failed members). The page's button posts the change form action
    ``retry_action`` for that one row."""

    retry_action = "retry_dead"
    retry_label = "Retry"
    change_form_template = "admin/django_pgqueue/retry_change_form.html"

    def has_retry_permission(self, request: HttpRequest) -> bool:
        return self._has_perm(request, "retry_deadmessage")

    def offers_retry(self, obj: Any) -> bool:
        """Whether this row has anything to retry."""
        return True

    def render_change_form(
        self,
        request: HttpRequest,
        context: dict[str, Any],
        add: bool = False,
        change: bool = False,
        form_url: str = "",
        obj: Any = None,
    ) -> HttpResponse:
        # Before Django 6.1 actions run from the change list only: no Retry button here.
        context["pgq_retry"] = (
            CHANGE_FORM_ACTIONS
            and obj is not None
            and self.has_retry_permission(request)
            and self.offers_retry(obj)
        )
        context["pgq_retry_action"] = self.retry_action
        context["pgq_retry_label"] = self.retry_label
        return super().render_change_form(request, context, add, change, form_url, obj)


class ReadOnlyAdmin(ViewOnlyAdmin):
    """Browse only: no add, change or delete through forms; view permission is enough.

    Searches use indexes only (a message id; live messages also by exact dedup key): a
    search never scans a table that may hold millions of rows.
    """

    show_full_result_count = False
    paginator = CappedPaginator
    list_per_page = 50
    ordering = ("-id",)
    search_fields = ("=id",)  # shows the search box; get_search_results does the work
    search_help_text = "An exact message id."
    # Model fields never loaded as such: timestamps through safe_timestamps, JSON as text.
    timestamp_fields: tuple[str, ...] = ("enqueued_at",)
    json_fields: tuple[str, ...] = ("payload", "errors")
    # The column holding the message id ("id" in the live table, "message_id" elsewhere).
    message_id_field = "message_id"

    enqueued_at_shown = timestamp_column("enqueued_at", "enqueued at")

    def _admin_url(self, name: str, *args: Any) -> str:
        # Works on any AdminSite instance, not only the default one.
        return reverse(f"admin:django_pgqueue_{name}", args=args, current_app=self.admin_site.name)

    def get_queryset(self, request: HttpRequest) -> QuerySet[Any]:
        payload = Cast("payload", TextField())
        return (
            super()
            .get_queryset(request)
            .defer(*self.json_fields, *self.timestamp_fields)
            .annotate(
                **safe_timestamps(*self.timestamp_fields),
                payload_head=Left(payload, PREVIEW_LIMIT),
                payload_length=Length(payload),
            )
        )

    def indexed_search(self, term: str) -> Q | None:
        """The condition a search term stands for, served by an index; None: no match."""
        if term.isdigit() and len(term) <= _MAX_ID_DIGITS:
            return Q(**{self.message_id_field: int(term)})
        return None

    def get_search_results(
        self, request: HttpRequest, queryset: QuerySet[Any], search_term: str
    ) -> tuple[QuerySet[Any], bool]:
        term = search_term.strip()
        if not term:
            return queryset, False
        condition = self.indexed_search(term)
        return (queryset.filter(condition) if condition else queryset.none()), False

    def _run_and_report(
        self,
        request: HttpRequest,
        queryset: QuerySet[Any],
        operation: Callable[[list[int]], Outcome],
        wording: Wording,
        *,
        id_attribute: str = "pk",
    ) -> set[int]:
        """Run ``operation`` on the selected rows' ids (read from ``id_attribute``) batch by
        batch, report what was done and skipped, and return the ids done."""
        selection = bounded_selection(queryset, id_attribute)
        done: set[int] = set()
        skipped = 0
        for batch in in_batches(selection.ids):
            outcome = operation(batch)
            done.update(outcome.done)
            skipped += len(outcome.stale)
        report(
            self,
            request,
            done=selection.rows_with(done),
            skipped=skipped,
            wording=wording,
            truncated=selection.truncated,
        )
        return done

    @admin.display(description="message id", ordering="id")
    def message_number(self, obj: Any) -> int:
        return int(getattr(obj, self.message_id_field))

    @admin.display(description="task", ordering="task")
    def task_name(self, obj: Any) -> SafeString:
        # Cut to the column's width by the stylesheet; the whole name on hover.
        return format_html('<span title="{}">{}</span>', obj.task, obj.task)

    @admin.display(description="payload")
    def payload_preview(self, obj: Any) -> str:
        return text_preview(obj.payload_head, obj.payload_length)

    @admin.display(description="payload")
    def payload_pretty(self, obj: Any) -> SafeString:
        return _json_detail(json_text(obj, F("payload"), "payload"))

    @admin.display(description="headers")
    def headers_pretty(self, obj: Any) -> SafeString | str:
        text = json_text(obj, F("headers"), "headers")
        return "-" if text is None else _json_detail(text)

    @admin.display(description="errors of every attempt")
    def errors_pretty(self, obj: Any) -> SafeString:
        text = json_text(obj, HistoryEnds(F("errors")), "errors")
        errors, decoded = decode_json(text)
        if not decoded:
            return undecodable_html(str(errors), DETAIL_LIMIT)
        return errors_html(errors)

    @admin.display(description="attempts")
    def attempts_display(self, obj: Any) -> str:
        return f"{obj.attempts} / {obj.max_attempts}"

    @admin.display(description="dependencies and batch")
    def composition(self, obj: Any) -> SafeString:
        return composition_html(int(getattr(obj, self.message_id_field)), self.admin_site.name)


@admin.register(Message)
class MessageAdmin(CancelAction, ReadOnlyAdmin):
    list_display = (
        "message_number",
        "task_name",
        "queue",
        "state",
        "priority",
        "attempts_display",
        "available_at_shown",
        "leased_by",
        "payload_preview",
    )
    list_display_links = ("message_number",)
    list_filter = (QueueFilter, LiveStateFilter, TaskFilter, ("enqueued_at", DateFieldListFilter))
    search_help_text = "An exact message id or dedup key."
    fieldsets = (
        (
            None,
            {
                "fields": (
                    ("message_number", "queue", "task"),
                    ("state", "priority", "tenant", "dedup_key", "debounce_key"),
                )
            },
        ),
        (
            "Attempts and lease",
            {
                "fields": (
                    ("attempts", "max_attempts", "enqueued_at_shown", "available_at_shown"),
                    ("leased_by", "leased_at_shown", "lease_token", "snoozes"),
                    ("progress_shown",),
                )
            },
        ),
        ("Composition", {"fields": ("composition",)}),
        ("Payload", {"fields": ("payload_pretty", "headers_pretty")}),
        ("Errors", {"fields": ("last_error_pretty", "errors_pretty")}),
    )
    readonly_fields = (
        "message_number",
        "queue",
        "task",
        "state",
        "priority",
        "tenant",
        "dedup_key",
        "debounce_key",
        "attempts",
        "max_attempts",
        "enqueued_at_shown",
        "available_at_shown",
        "leased_by",
        "leased_at_shown",
        "lease_token",
        "snoozes",
        "progress_shown",
        "payload_pretty",
        "headers_pretty",
        "last_error_pretty",
        "errors_pretty",
        "composition",
    )
    actions = ("retry_now", "release_leases", "discard", "cancel")
    timestamp_fields = ("enqueued_at", "available_at", "leased_at")
    json_fields = ("payload", "headers", "errors", "last_error")
    message_id_field = "id"

    available_at_shown = timestamp_column("available_at", "available at")
    leased_at_shown = timestamp_column("leased_at", "leased at")

    def get_queryset(self, request: HttpRequest) -> QuerySet[Any]:
        # The state column compares with database time, not the web server's clock.
        due = ExpressionWrapper(Q(available_at__lte=Now()), output_field=BooleanField())
        return super().get_queryset(request).annotate(is_due=due)

    def indexed_search(self, term: str) -> Q | None:
        # A dedup key is unique per queue: with every queue named, pgq_message_dedup_key
        # answers it with one probe per queue.
        by_key = Q(queue__in=[name for name, _ in known_queues()], dedup_key=term)
        by_id = super().indexed_search(term)
        return by_key | by_id if by_id else by_key

    @admin.display(description="state")
    def state(self, obj: Message) -> str:
        due = getattr(obj, "is_due", None)
        if due is None:
            return "?"
        if obj.lease_token is not None:
            return "lease expired" if due else "in flight"
        if not due:
            return "retrying (backing off)" if obj.attempts else "scheduled"
        return "ready (retry)" if obj.attempts else "ready"

    @admin.display(description="progress")
    def progress_shown(self, obj: Message) -> str:
        # The handler's last report while it runs (core/_progress.py).
        progress = get_progress(obj.pk) if obj.lease_token is not None else None
        if progress is None:
            return "—"
        return f"{progress.text()} (reported {progress.updated_at:%Y-%m-%d %H:%M:%S %Z})"

    @admin.display(description="last error")
    def last_error_pretty(self, obj: Message) -> SafeString:
        # A retried dead message comes back without last_error: its errors still say it.
        last = Coalesce(F("last_error"), KeyTransform("-1", "errors"))
        text = json_text(obj, last, "last_error")
        return _json_detail(text) if text is not None else format_html("{}", "—")

    def has_retry_now_permission(self, request: HttpRequest) -> bool:
        return self._has_perm(request, "retry_now_message")

    def has_release_permission(self, request: HttpRequest) -> bool:
        return self._has_perm(request, "release_message")

    def has_discard_permission(self, request: HttpRequest) -> bool:
        return self._has_perm(request, "discard_message")

    @action(permissions=["retry_now"], description="Run now", location=BOTH)
    def retry_now(self, request: HttpRequest, queryset: QuerySet[Message]) -> None:
        self._run_and_report(request, queryset, operations.retry_now, RUN_NOW)

    @action(permissions=["release"], description="Release lease", location=BOTH)
    def release_leases(self, request: HttpRequest, queryset: QuerySet[Message]) -> None:
        self._run_and_report(request, queryset, operations.release_leases, RELEASED)

    @action(permissions=["discard"], description="Discard to the dead letters", location=BOTH)
    def discard(self, request: HttpRequest, queryset: QuerySet[Message]) -> HttpResponse | None:
        note = f"discarded by {request.user.get_username()} in the admin"
        self._run_and_report(
            request, queryset, lambda ids: operations.discard(ids, note=note), DISCARDED
        )
        if _ran_from_change_form(request):
            # The row has left the live table: show the list instead of a missing page.
            return HttpResponseRedirect(self._admin_url("message_changelist"))
        return None


@admin.register(DeadMessage)
class DeadMessageAdmin(RetryOnItsPage, ReadOnlyAdmin):
    list_display = (
        "message_number",
        "task_name",
        "queue",
        "reason_code",
        "died_at_shown",
        "error_summary",
    )
    list_display_links = ("message_number",)
    list_filter = (QueueFilter, TaskFilter, "reason", ("died_at", DateFieldListFilter))
    fieldsets = (
        (
            None,
            {
                "fields": (
                    ("message_number", "queue", "task"),
                    ("reason", "died_at_shown", "worker_id"),
                )
            },
        ),
        ("Final error", {"fields": ("error_summary", "cause", "traceback_pretty")}),
        ("Composition", {"fields": ("composition",)}),
        ("Payload", {"fields": ("payload_pretty", "headers_pretty")}),
        (
            "Every attempt",
            {
                "fields": (
                    ("attempts", "max_attempts", "enqueued_at_shown"),
                    ("priority", "tenant", "dedup_key"),
                    "errors_pretty",
                )
            },
        ),
    )
    readonly_fields = (
        "message_number",
        "queue",
        "task",
        "reason",
        "died_at_shown",
        "worker_id",
        "priority",
        "tenant",
        "dedup_key",
        "attempts",
        "max_attempts",
        "enqueued_at_shown",
        "error_summary",
        "cause",
        "traceback_pretty",
        "payload_pretty",
        "headers_pretty",
        "errors_pretty",
        "composition",
    )
    actions = ("retry_dead",)
    timestamp_fields = ("enqueued_at", "died_at")
    json_fields = ("payload", "headers", "errors", "details")

    died_at_shown = timestamp_column("died_at", "died at")

    def get_queryset(self, request: HttpRequest) -> QuerySet[Any]:
        return (
            super()
            .get_queryset(request)
            .annotate(
                error_type=Left(KeyTextTransform("type", "details"), ERROR_SUMMARY_LIMIT),
                error_message=Left(KeyTextTransform("message", "details"), ERROR_SUMMARY_LIMIT),
            )
        )

    @admin.display(description="reason", ordering="reason")
    def reason_code(self, obj: DeadMessage) -> SafeString:
        # The short code in the list; its explanation on hover.
        label = dict(DeadReason.choices).get(obj.reason, obj.reason)
        return format_html('<span class="pgq-reason" title="{}">{}</span>', label, obj.reason)

    @admin.display(description="error")
    def error_summary(self, obj: DeadMessage) -> SafeString:
        error_type = getattr(obj, "error_type", None) or ""
        message = getattr(obj, "error_message", None) or ""
        text = f"{error_type}: {message}".strip(": ")
        return format_html('<span class="pgq-error" title="{}">{}</span>', text, text or "—")

    @admin.display(description="failed dependency")
    def cause(self, obj: DeadMessage) -> SafeString:
        """For reason ``dependency_failed``: the failed message it depended on, or the batch
        whose failure buried it (a success callback), linked."""
        if obj.reason != DeadReason.DEPENDENCY_FAILED:
            return format_html("{}", "—")
        dependency = json_text(obj, KeyTextTransform("dependency", "details"), "dependency")
        batch = json_text(obj, KeyTextTransform("batch", "details"), "batch")
        if dependency is not None and dependency.isdigit():
            places = locate([int(dependency)], self.admin_site.name)
            hint = ""
            if places[int(dependency)].state.startswith("dead"):
                hint = (
                    " Retry that one to bring this message back, waiting for it again"
                    " (retrying this one makes it wait for it too)."
                )
            return format_html("{}.{}", message_links(places), hint)
        if batch is not None and batch.isdigit():
            url = self._admin_url("batch_change", int(batch))
            hint = (
                " This success callback runs once the batch's failed members are retried and"
                " finish."
            )
            return format_html('<a href="{}">batch #{}</a> failed.{}', url, batch, hint)
        return format_html("{}", "—")

    @admin.display(description="traceback")
    def traceback_pretty(self, obj: DeadMessage) -> SafeString:
        return traceback_html(json_text(obj, KeyTextTransform("traceback", "details"), "tb"))

    @action(permissions=["retry"], description="Retry", location=BOTH)
    def retry_dead(
        self, request: HttpRequest, queryset: QuerySet[DeadMessage]
    ) -> HttpResponse | None:
        done = self._run_and_report(
            request, queryset, operations.retry_dead, RETRIED, id_attribute="message_id"
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
        "message_number",
        "task_name",
        "queue",
        "finished_at_shown",
        "duration",
        "attempts_display",
        "worker_id",
        "result_preview",
    )
    list_display_links = ("message_number",)
    list_filter = (QueueFilter, TaskFilter, ("finished_at", DateFieldListFilter))
    fieldsets = (
        (
            None,
            {
                "fields": (
                    ("message_number", "queue", "task"),
                    ("priority", "tenant", "dedup_key"),
                )
            },
        ),
        (
            "Run",
            {
                "fields": (
                    ("attempts", "max_attempts", "worker_id"),
                    ("enqueued_at_shown", "started_at_shown", "finished_at_shown", "duration"),
                )
            },
        ),
        ("Composition", {"fields": ("composition",)}),
        ("Payload and result", {"fields": ("payload_pretty", "headers_pretty", "result_pretty")}),
        ("Errors of earlier attempts", {"fields": ("errors_pretty",)}),
    )
    readonly_fields = (
        "message_number",
        "queue",
        "task",
        "priority",
        "tenant",
        "dedup_key",
        "attempts",
        "max_attempts",
        "enqueued_at_shown",
        "started_at_shown",
        "finished_at_shown",
        "duration",
        "worker_id",
        "payload_pretty",
        "headers_pretty",
        "result_pretty",
        "errors_pretty",
        "composition",
    )
    actions = ("requeue",)
    timestamp_fields = ("enqueued_at", "started_at", "finished_at")
    json_fields = ("payload", "headers", "errors", "result")

    started_at_shown = timestamp_column("started_at", "started at")
    finished_at_shown = timestamp_column("finished_at", "finished at")

    def get_queryset(self, request: HttpRequest) -> QuerySet[Any]:
        result = Cast("result", TextField())
        return (
            super()
            .get_queryset(request)
            .annotate(result_head=Left(result, PREVIEW_LIMIT), result_length=Length(result))
        )

    @admin.display(description="duration")
    def duration(self, obj: ArchivedMessage) -> str:
        started = getattr(obj, "started_at_safe", None)
        finished = getattr(obj, "finished_at_safe", None)
        if started is None or finished is None:
            return "—"
        return f"{(finished - started).total_seconds():.3f} s"

    @admin.display(description="result")
    def result_preview(self, obj: ArchivedMessage) -> str:
        return text_preview(getattr(obj, "result_head", None), getattr(obj, "result_length", None))

    @admin.display(description="result")
    def result_pretty(self, obj: ArchivedMessage) -> SafeString:
        return _json_detail(json_text(obj, F("result"), "result"))

    def has_requeue_permission(self, request: HttpRequest) -> bool:
        return self._has_perm(request, "requeue_archivedmessage")

    @action(permissions=["requeue"], description="Requeue as a new message", location=BOTH)
    def requeue(self, request: HttpRequest, queryset: QuerySet[ArchivedMessage]) -> None:
        selection = bounded_selection(queryset)
        copied: set[int] = set()
        for batch in in_batches(selection.ids):
            new_ids = operations.requeue_archived(batch)
            if len(new_ids) == len(batch):
                copied.update(batch)
                continue
            # Some rows left the archive (retention) before the copy: those still here were.
            still_here = ArchivedMessage.objects.filter(id__in=batch).values_list("id", flat=True)
            copied.update(still_here)
        report(
            self,
            request,
            done=selection.rows_with(copied),
            skipped=len(selection.ids) - len(copied),
            wording=REQUEUED,
            truncated=selection.truncated,
        )


@admin.register(WorkerHeartbeat)
class WorkerHeartbeatAdmin(ViewOnlyAdmin):
    list_display = (
        "worker_id",
        "hostname",
        "pid",
        "queues_shown",
        "concurrency",
        "last_seen_at_shown",
    )
    ordering = ("-last_seen_at",)
    fields = readonly_fields = (
        "worker_id",
        "hostname",
        "pid",
        "queues_shown",
        "concurrency",
        "started_at_shown",
        "last_seen_at_shown",
        "stats_pretty",
    )

    started_at_shown = timestamp_column("started_at", "started at")
    last_seen_at_shown = timestamp_column("last_seen_at", "last heartbeat")

    def get_queryset(self, request: HttpRequest) -> QuerySet[Any]:
        return (
            super()
            .get_queryset(request)
            .defer("queues", "stats", "started_at", "last_seen_at")
            .annotate(
                **safe_timestamps("started_at", "last_seen_at"),
                queues_text=Cast("queues", TextField()),
            )
        )

    @admin.display(description="queues")
    def queues_shown(self, obj: WorkerHeartbeat) -> str:
        queues, decoded = decode_json(getattr(obj, "queues_text", None))
        if decoded and isinstance(queues, list):
            return ", ".join(sorted(str(name) for name in queues)) or "every queue (discovered)"
        return str(queues)

    @admin.display(description="activity (since it started)")
    def stats_pretty(self, obj: WorkerHeartbeat) -> SafeString:
        stats, decoded = decode_json(json_text(obj, F("stats"), "stats"))
        if not decoded:
            return undecodable_html(str(stats), DETAIL_LIMIT)
        items = activity_items(stats)
        if not items:
            return format_html("{}", "—")
        rows = format_html_join("", "<tr><th>{}</th><td>{}</td></tr>", items)
        return format_html('<table class="pgq-activity">{}</table>', rows)
