"""What every operator action shares: a bounded selection read as ids, run in batches, an admin
log entry per object and a message saying how many were done, how many were skipped and why."""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from functools import cached_property
from typing import Any

from django.contrib import admin, messages
from django.contrib.admin.models import CHANGE, LogEntry
from django.core.exceptions import PermissionDenied
from django.core.paginator import Paginator
from django.db.models import Model, QuerySet
from django.http import HttpRequest

from .overview import COUNT_CAP

__all__ = [
    "ACTION_BATCH",
    "ACTION_LIMIT",
    "CappedPaginator",
    "Selection",
    "Wording",
    "acting_user_id",
    "bounded_selection",
    "in_batches",
    "report",
]

# One action run moves at most this many rows; "select all" over millions of rows is done in
# several runs.
ACTION_LIMIT = 10_000
# Each statement of a run takes this many ids: a short transaction holding few row locks.
ACTION_BATCH = 1_000


class CappedPaginator(Paginator):
    """Counts a change list up to COUNT_CAP rows instead of a full ``COUNT(*)``."""

    # True once ``count`` stopped at COUNT_CAP: there are more rows than it says.
    capped = False

    @cached_property
    def count(self) -> int:
        object_list: Any = self.object_list
        if not isinstance(object_list, QuerySet):
            return len(object_list)
        # By primary key alone: the list's display annotations need not be computed to count.
        counted = object_list.order_by().values("pk")[: COUNT_CAP + 1].count()
        self.capped = counted > COUNT_CAP
        return min(counted, COUNT_CAP)


@dataclass(frozen=True)
class Selection:
    """What an action reads of the selected rows: never their payloads, results or errors."""

    # The operation's argument, in primary key order.
    ids: list[int]
    # Stand-ins holding only primary key, task and queue: what the admin log entry needs.
    rows: list[Model]
    # More rows were selected than ACTION_LIMIT: the rest wait for the next run.
    truncated: bool

    def rows_with(self, done: set[int]) -> list[Model]:
        """The stand-ins of the rows whose id is in ``done``."""
        return [row for row, row_id in zip(self.rows, self.ids, strict=True) if row_id in done]


def bounded_selection(queryset: QuerySet[Any], id_attribute: str = "pk") -> Selection:
    """The selected rows (at most ACTION_LIMIT), read as ids and log labels only."""
    model = queryset.model
    # What the log entry's label shows: task, queue and the message id.
    labels = ["task", "queue", *(["message_id"] if hasattr(model, "message_id") else [])]
    columns = queryset.order_by("pk").values_list("pk", id_attribute, *labels)
    values = list(columns[: ACTION_LIMIT + 1])
    kept = values[:ACTION_LIMIT]
    return Selection(
        ids=[row[1] for row in kept],
        rows=[model(pk=row[0], **dict(zip(labels, row[2:], strict=True))) for row in kept],
        truncated=len(values) > ACTION_LIMIT,
    )


def in_batches(ids: Sequence[int]) -> Iterator[list[int]]:
    """``ids`` in slices of ACTION_BATCH: one statement, one short transaction each."""
    for start in range(0, len(ids), ACTION_BATCH):
        yield list(ids[start : start + ACTION_BATCH])


def acting_user_id(request: HttpRequest) -> int | str:
    """The logged-in user's id for the admin log (admin views never run anonymously)."""
    user_id = request.user.pk
    if user_id is None:
        raise PermissionDenied
    return user_id


@dataclass(frozen=True)
class Wording:
    """How an action speaks of what it did: "{verb} {count} {noun}s.", "Skipped {n}:
    {why_skipped}.", and the admin log entry of each object done."""

    verb: str
    noun: str
    why_skipped: str
    log_message: str


def _plural(count: int, noun: str) -> str:
    return f"{count:,} {noun}{'' if count == 1 else 's'}"


def report(
    model_admin: admin.ModelAdmin[Any],
    request: HttpRequest,
    *,
    done: Sequence[Model],
    skipped: int,
    wording: Wording,
    truncated: bool = False,
) -> None:
    """Log one admin LogEntry per object done and tell the operator what happened."""
    if done:
        LogEntry.objects.log_actions(
            user_id=acting_user_id(request),
            queryset=list(done),
            action_flag=CHANGE,
            change_message=wording.log_message,
        )
    text = f"{wording.verb} {_plural(len(done), wording.noun)}."
    if skipped:
        text += f" Skipped {skipped:,}: {wording.why_skipped}."
    if truncated:
        text += (
            f" Only the first {ACTION_LIMIT:,} selected were processed;"
            " run the action again for the rest."
        )
    level = messages.SUCCESS if done and not skipped and not truncated else messages.WARNING
    model_admin.message_user(request, text, level)
