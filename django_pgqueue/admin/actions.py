"""What every operator action shares: a bounded selection, an admin log entry per object
and a message saying how many were done, how many were skipped and why."""

from __future__ import annotations

from collections.abc import Sequence
from functools import cached_property
from typing import Any

from django.contrib import admin, messages
from django.contrib.admin.models import CHANGE, LogEntry
from django.core.exceptions import PermissionDenied
from django.core.paginator import Paginator
from django.db.models import Model, QuerySet
from django.http import HttpRequest

from .overview import COUNT_CAP

__all__ = ["ACTION_LIMIT", "CappedPaginator", "acting_user_id", "bounded_selection", "report"]

# One action run moves at most this many rows (one statement); "select all" over millions of
# rows is done in several runs, each a short transaction.
ACTION_LIMIT = 10_000


class CappedPaginator(Paginator):
    """Counts a change list up to COUNT_CAP rows instead of a full ``COUNT(*)``."""

    # True once ``count`` stopped at COUNT_CAP: there are more rows than it says.
    capped = False

    @cached_property
    def count(self) -> int:
        object_list: Any = self.object_list
        if not isinstance(object_list, QuerySet):
            return len(object_list)
        counted = object_list.order_by()[: COUNT_CAP + 1].count()
        self.capped = counted > COUNT_CAP
        return min(counted, COUNT_CAP)


def bounded_selection[M: Model](queryset: QuerySet[M]) -> tuple[list[M], bool]:
    """The selected rows (at most ACTION_LIMIT) and whether more were selected."""
    rows = list(queryset.order_by("pk")[: ACTION_LIMIT + 1])
    return rows[:ACTION_LIMIT], len(rows) > ACTION_LIMIT


def acting_user_id(request: HttpRequest) -> int | str:
    """The logged-in user's id for the admin log (admin views never run anonymously)."""
    user_id = request.user.pk
    if user_id is None:
        raise PermissionDenied
    return user_id


def _plural(count: int, noun: str) -> str:
    return f"{count:,} {noun}{'' if count == 1 else 's'}"


def report(
    model_admin: admin.ModelAdmin[Any],
    request: HttpRequest,
    *,
    done: Sequence[Model],
    skipped: int,
    verb: str,
    noun: str,
    why_skipped: str,
    log_message: str,
    truncated: bool = False,
) -> None:
    """Log one admin LogEntry per object done and tell the operator what happened."""
    if done:
        LogEntry.objects.log_actions(
            user_id=acting_user_id(request),
            queryset=list(done),
            action_flag=CHANGE,
            change_message=log_message,
        )
    text = f"{verb} {_plural(len(done), noun)}."
    if skipped:
        text += f" Skipped {skipped:,}: {why_skipped}."
    if truncated:
        text += (
            f" Only the first {ACTION_LIMIT:,} selected were processed;"
            " run the action again for the rest."
        )
    level = messages.SUCCESS if done and not skipped and not truncated else messages.WARNING
    model_admin.message_user(request, text, level)
