"""Retention never expires a row before the export it was promised to holds it.

Set ``PGQUEUE_PIPELINE = {"RETENTION_REQUIRES_EXPORT_TO": ["/srv/exports/pgqueue"]}`` and the
workers' retention (``core/_retention.py``) keeps every archived or dead row until each listed
destination has a verified (or pruned) export range holding it, however old it is. The guard
answers with an id: rows below it may go. That is the start of the first range of the
destination, in id order, that is not verified yet (the export's watermark when it is up to
date), moved down to below the newest verified ranges that the next export re-checks against
the database (``export.RECHECK_RANGES``): those must still find their rows.

Whatever retention expires, with or without a destination listed, export ranges that held
those rows are then marked pruned (:func:`mark_expired`): their files are the only copy now,
and nothing exports them again.
"""

from __future__ import annotations

from django.conf import settings
from django.core.exceptions import ImproperlyConfigured
from django.db.models import Max, Min
from django.utils import timezone

from ..core._retention import register_expiry_listener, register_retention_guard
from .columns import SOURCES
from .export import RECHECK_RANGES, source_figures
from .models import ExportRange, ExportRangeStatus

SETTING = "PGQUEUE_PIPELINE"
KEY = "RETENTION_REQUIRES_EXPORT_TO"

_DONE = (ExportRangeStatus.VERIFIED, ExportRangeStatus.PRUNED)


def destinations() -> list[str]:
    """The destinations ``PGQUEUE_PIPELINE["RETENTION_REQUIRES_EXPORT_TO"]`` lists."""
    value = getattr(settings, SETTING, {}).get(KEY, [])
    if isinstance(value, str) or not all(isinstance(d, str) and d for d in value):
        raise ImproperlyConfigured(
            f"{SETTING}[{KEY!r}] must be a list of export destinations (paths or URLs), "
            f"as given to `pgq_pipeline export`; got {value!r}."
        )
    return [d.rstrip("/") for d in value]


def exported_below(source: str, destination: str, alias: str) -> int:
    """The id below which every row of ``source`` is held by ``destination``'s export (0 when
    nothing is exported there yet)."""
    ranges = ExportRange.objects.using(alias).filter(destination=destination, source=source)
    bound = ranges.exclude(status__in=_DONE).aggregate(lo=Min("lo"))["lo"]
    if bound is None:
        bound = ranges.aggregate(hi=Max("hi"))["hi"] or 0
    rechecked = (
        ranges.filter(status=ExportRangeStatus.VERIFIED, lo__lt=bound)
        .order_by("-lo")
        .values_list("lo", flat=True)[:RECHECK_RANGES]
    )
    return min([bound, *rechecked])


def guard(source: str, alias: str) -> int | None:
    """core._retention's guard: the lowest bound over the listed destinations."""
    listed = destinations()
    if not listed:
        return None
    return min(exported_below(source, d, alias) for d in listed)


def install() -> None:
    register_retention_guard(guard)
    register_expiry_listener(mark_expired)


def mark_expired(source: str, first: int, last: int, alias: str) -> None:
    """core._retention's expiry listener: a verified range (of any destination) that held ids
    retention just expired is marked pruned once the database no longer holds all its rows.

    Its files keep the rows. Left verified, the range would read as changed to the next export
    and to prune, and be exported again from what is left in the database.
    """
    source_table = SOURCES[source]
    touched = ExportRange.objects.using(alias).filter(
        source=source, status=ExportRangeStatus.VERIFIED, lo__lte=last, hi__gt=first
    )
    for record in touched:
        rows, checksum, _, _ = source_figures(source_table, record.lo, record.hi, alias)
        if (rows, checksum) == (record.source_rows, record.source_checksum):
            continue
        ExportRange.objects.using(alias).filter(
            pk=record.pk, status=ExportRangeStatus.VERIFIED
        ).update(
            status=ExportRangeStatus.PRUNED,
            pruned_at=timezone.now(),
            pruned_rows=(record.source_rows or 0) - rows,
        )
