"""The live messages' "Cancel" action, behind the ``cancel_message`` permission.

A mixin for ``MessageAdmin``: messages no worker holds go to the dead letters with reason
``cancelled``; the running ones are flagged for their handler (``core/_cancel.py``).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from django.contrib import admin, messages
from django.contrib.admin.models import CHANGE, LogEntry
from django.db.models import Model, QuerySet
from django.http import HttpRequest

from ..core._cancel import CancelResult, cancel_many
from ..models import Message
from .actions import ACTION_LIMIT, acting_user_id, bounded_selection, in_batches
from .compat import ActionLocation, action

if TYPE_CHECKING:
    BaseModelAdmin = admin.ModelAdmin[Any]
else:  # ModelAdmin is generic only in the type stubs
    BaseModelAdmin = admin.ModelAdmin

__all__ = ["CancelAction"]


class CancelAction(BaseModelAdmin):
    """Adds the ``cancel`` action; list it in the admin's ``actions``."""

    def has_cancel_permission(self, request: HttpRequest) -> bool:
        return request.user.has_perm(f"{self.opts.app_label}.cancel_message")

    @action(
        permissions=["cancel"],
        description="Cancel (dead letters now, or flag the running handler)",
        location=[ActionLocation.CHANGE_LIST, ActionLocation.CHANGE_FORM],
    )
    def cancel(self, request: HttpRequest, queryset: QuerySet[Message]) -> None:
        selection = bounded_selection(queryset)
        who = request.user.get_username()
        results: dict[int, CancelResult] = {}
        for batch in in_batches(selection.ids):
            results.update(cancel_many(batch, note=f"cancelled by {who} in the admin"))
        by_result: dict[CancelResult, list[Model]] = {result: [] for result in CancelResult}
        for row, row_id in zip(selection.rows, selection.ids, strict=True):
            by_result[results[row_id]].append(row)
        logged = {
            CancelResult.CANCELLED: "Cancelled to the dead letters (reason: cancelled).",
            CancelResult.FLAGGED: "Cancel requested; its running handler is told.",
        }
        for result, log_message in logged.items():
            if by_result[result]:
                LogEntry.objects.log_actions(
                    user_id=acting_user_id(request),
                    queryset=by_result[result],
                    action_flag=CHANGE,
                    change_message=log_message,
                )
        cancelled = len(by_result[CancelResult.CANCELLED])
        flagged = len(by_result[CancelResult.FLAGGED])
        missing = len(by_result[CancelResult.NOT_FOUND])
        text = f"Cancelled {cancelled:,}; flagged {flagged:,} running (their handlers are told)."
        if missing:
            text += f" Skipped {missing:,}: no longer live (finished or moved meanwhile)."
        if selection.truncated:
            text += f" Only the first {ACTION_LIMIT:,} selected were processed."
        level = messages.WARNING if missing or selection.truncated else messages.SUCCESS
        self.message_user(request, text, level)
