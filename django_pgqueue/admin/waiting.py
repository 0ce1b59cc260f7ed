"""Messages waiting on others (``after=``, a chain's later steps) or on their batch (its
callbacks): read-only, with the live messages' Cancel action.

The list reads, per row, at most ``WAITS_ON_SHOWN`` + 1 of its dependencies (by the index
``pgq_dependency_dependent``) and whether it is the callback of a batch not complete yet (a
waiting callback's batch is open: over the partial index ``pgq_batch_open``). Where each
dependency is now is read once for the whole page.
"""

from __future__ import annotations

from typing import Any

from django.contrib import admin
from django.contrib.admin.views.main import ChangeList
from django.contrib.postgres.expressions import ArraySubquery
from django.db.models import OuterRef, Q, QuerySet, Subquery
from django.http import HttpRequest
from django.urls import reverse
from django.utils.html import format_html
from django.utils.safestring import SafeString

from ..composition.progress import waiting_by_queue
from ..core._composition_models import Batch, Dependency, WaitingMessage
from .browsers import ReadOnlyAdmin
from .cancel import CancelAction
from .columns import timestamp_column
from .composition import locate, message_links
from .filters import TaskFilter, _ExactValueFilter

__all__ = ["WaitingMessageAdmin"]

#: The list shows this many of a message's dependencies ("…" past them).
WAITS_ON_SHOWN = 5


class WaitingQueueFilter(_ExactValueFilter):
    """The queues of the waiting table (not of the live one), by a skip scan of its index."""

    title = "queue"
    parameter_name = "queue"

    def lookups(self, request: HttpRequest, model_admin: Any) -> list[tuple[str, str]]:
        return [(name, f"{name} ({count})") for name, count in waiting_by_queue().items()]


def _callback_of() -> Subquery:
    """The open batch whose callback the row is, if any."""
    row = OuterRef("id")
    batches = Batch.objects.filter(completed_at__isnull=True).filter(
        Q(on_complete_id=row) | Q(on_success_id=row) | Q(on_failure_id=row)
    )
    return Subquery(batches.order_by().values("id")[:1])


@admin.register(WaitingMessage)
class WaitingMessageAdmin(CancelAction, ReadOnlyAdmin):
    list_display = (
        "message_number",
        "task_name",
        "queue",
        "pending",
        "enqueued_at_shown",
        "waits_on",
        "batch_callback",
    )
    list_display_links = ("message_number",)
    list_filter = (WaitingQueueFilter, TaskFilter)
    fieldsets = (
        (
            None,
            {
                "fields": (
                    ("message_number", "queue", "task"),
                    ("pending", "priority", "tenant", "max_attempts"),
                    ("enqueued_at_shown", "run_at_shown", "delay", "fair"),
                )
            },
        ),
        ("Composition", {"fields": ("composition",)}),
        ("Payload", {"fields": ("payload_pretty",)}),
    )
    readonly_fields = (
        "message_number",
        "queue",
        "task",
        "pending",
        "priority",
        "tenant",
        "max_attempts",
        "enqueued_at_shown",
        "run_at_shown",
        "delay",
        "fair",
        "composition",
        "payload_pretty",
    )
    actions = ("cancel",)
    timestamp_fields = ("enqueued_at", "run_at")
    json_fields = ("payload",)
    message_id_field = "id"

    def get_queryset(self, request: HttpRequest) -> QuerySet[Any]:
        prerequisites = (
            Dependency.objects.filter(dependent_id=OuterRef("id"))
            .order_by("prerequisite_id")
            .values("prerequisite_id")[: WAITS_ON_SHOWN + 1]
        )
        return (
            super()
            .get_queryset(request)
            .annotate(prerequisite_ids=ArraySubquery(prerequisites), callback_of=_callback_of())
        )

    def get_changelist_instance(self, request: HttpRequest) -> ChangeList:
        changelist = super().get_changelist_instance(request)
        # Where the page's dependencies are now, in four statements for the whole page.
        rows = list(changelist.result_list)
        ids = {i for row in rows for i in (getattr(row, "prerequisite_ids", None) or ())}
        places = locate(ids, self.admin_site.name)
        for row in rows:
            row.pgq_places = places
        return changelist

    run_at_shown = timestamp_column("run_at", "not before")

    @admin.display(description="waits on")
    def waits_on(self, obj: WaitingMessage) -> SafeString:
        batch_id = getattr(obj, "callback_of", None)
        if batch_id is not None:
            url = reverse(
                "admin:django_pgqueue_batch_change",
                args=[batch_id],
                current_app=self.admin_site.name,
            )
            return format_html('<a href="{}">batch #{}</a>', url, batch_id)
        ids = list(getattr(obj, "prerequisite_ids", None) or ())
        if not ids:
            return format_html("{}", "—")
        shown = ids[:WAITS_ON_SHOWN]
        places = getattr(obj, "pgq_places", None) or locate(shown, self.admin_site.name)
        links = message_links({i: places[i] for i in shown}, states=False)
        return format_html("{}{}", links, ", …" if len(ids) > WAITS_ON_SHOWN else "")

    @admin.display(description="batch callback", boolean=True)
    def batch_callback(self, obj: WaitingMessage) -> bool:
        return getattr(obj, "callback_of", None) is not None
