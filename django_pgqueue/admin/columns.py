"""Columns read so that no stored value can break an admin page.

Rows can hold what Python cannot load: a timestamp of ``infinity`` or year 275817 (written
by SQL, or by an old version), JSON nested too deep or with a number too long for ``int``.
The browsers therefore never load timestamps and JSON columns as model fields: each
timestamp comes as a value clamped to Python's range plus the database's own text of it, and
JSON comes as text, decoded here where a failure can be shown instead of raised.
"""

from __future__ import annotations

import datetime as dt
import json
from collections.abc import Callable
from typing import Any

from django.contrib import admin
from django.db.models import Case, DateTimeField, F, Func, JSONField, Model, Q, TextField, When
from django.db.models.functions import Cast
from django.utils import timezone

from ..core._sql import history_cut

__all__ = [
    "SAFE_TIMESTAMP_RANGE",
    "HistoryEnds",
    "decode_json",
    "json_text",
    "safe_timestamps",
    "show_timestamp",
    "timestamp_column",
]

# Inside Python's datetime range with a day to spare, so that converting to any local time
# zone cannot overflow either.
SAFE_TIMESTAMP_RANGE = (
    dt.datetime(1, 1, 2, tzinfo=dt.UTC),
    dt.datetime(9999, 12, 30, tzinfo=dt.UTC),
)
TIMESTAMP_FORMAT = "%Y-%m-%d %H:%M:%S"


def _safe(field: str) -> str:
    return f"{field}_safe"


def _text(field: str) -> str:
    return f"{field}_text"


def safe_timestamps(*fields: str) -> dict[str, Any]:
    """Annotations for each field: ``<field>_safe`` (NULL outside Python's range) and
    ``<field>_text`` (the database's text of the value, whatever it is)."""
    low, high = SAFE_TIMESTAMP_RANGE
    annotations: dict[str, Any] = {}
    for field in fields:
        within = Q(**{f"{field}__gte": low, f"{field}__lte": high})
        annotations[_safe(field)] = Case(
            When(within, then=F(field)), default=None, output_field=DateTimeField()
        )
        annotations[_text(field)] = Cast(field, TextField())
    return annotations


def show_timestamp(value: dt.datetime | None, text: str | None) -> str:
    """Local time to the second; a value Python cannot hold as the database wrote it."""
    if value is None:
        return text or "—"
    return timezone.localtime(value).strftime(TIMESTAMP_FORMAT)


def timestamp_column(field: str, description: str) -> Callable[[Any, Model], str]:
    """A display method for ``field`` read through :func:`safe_timestamps`, sortable by it."""

    @admin.display(description=description, ordering=field)
    def column(model_admin: Any, obj: Model) -> str:
        return show_timestamp(getattr(obj, _safe(field), None), getattr(obj, _text(field), None))

    column.__name__ = f"{field}_shown"
    return column


def json_text(obj: Model, expression: Any, cache_name: str) -> str | None:
    """One JSON column (or expression) of ``obj``'s row as the database's text, read on
    demand: detail pages only, so a change list never carries whole payloads."""
    cache = obj.__dict__.setdefault("_pgq_json_text", {})
    if cache_name not in cache:
        row = (
            type(obj)
            ._default_manager.filter(pk=obj.pk)
            .annotate(_value=Cast(expression, TextField()))
            .values_list("_value", flat=True)
            .first()
        )
        cache[cache_name] = row
    value: str | None = cache[cache_name]
    return value


class HistoryEnds(Func):
    """An error history as the queue keeps it, whatever the row holds (a history stored
    before it was bounded, or written by SQL): its first and last attempts and a count of
    those between, so a page reads and shows a bounded part of it. Not a list: as stored."""

    output_field = JSONField()
    template = (
        "(SELECT CASE WHEN jsonb_typeof(h.errors) = 'array' THEN "
        f"{history_cut('h.errors')} ELSE h.errors END "
        "FROM (SELECT %(expressions)s AS errors) h)"
    )


def decode_json(text: str | None) -> tuple[Any, bool]:
    """``(value, True)``, or ``(text, False)`` when Python cannot decode it."""
    if text is None:
        return None, True
    try:
        return json.loads(text), True
    except (ValueError, RecursionError):
        return text, False
