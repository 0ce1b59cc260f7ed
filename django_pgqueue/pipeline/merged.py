"""The database side of a compaction: a merged range replaces its parts in PostgreSQL.

Compaction commits the merged files to the table first; a crash before the database follows
is finished by the next writer (export or compaction) from the table's latest commit, whose
``pgqueue`` commit info names the merged range and its files.
"""

from __future__ import annotations

from django.db import transaction

from .columns import SourceTable
from .commit import Committer
from .models import ExportRange, ExportRangeStatus


def merge_records(group: list[ExportRange], files: list[dict], alias: str) -> None:
    """The merged range replaces its parts in PostgreSQL, in one transaction."""
    first = group[0]
    with transaction.atomic(using=alias):
        ExportRange.objects.using(alias).filter(pk__in=[r.pk for r in group[1:]]).delete()
        first.hi = group[-1].hi
        for name in ("source_rows", "source_checksum", "parquet_rows", "parquet_checksum"):
            setattr(first, name, sum(getattr(r, name) or 0 for r in group))
        for name in ("pruned_rows", "pruned_bytes"):
            if first.status == ExportRangeStatus.PRUNED:
                setattr(first, name, sum(getattr(r, name) or 0 for r in group))
        times = [r.min_at for r in group if r.min_at] + [r.max_at for r in group if r.max_at]
        first.min_at = min(times) if times else None
        first.max_at = max(times) if times else None
        first.files = files
        first.save(using=alias)


def finish_interrupted(
    committer: Committer, source: SourceTable, destination: str, alias: str
) -> None:
    """Finish a compaction that committed to the table but not to the database: its commit
    is the table's latest (the next writer calls this first, under the lease)."""
    history = committer.table(source).history(1)
    info = history[0].get("pgqueue") if history else None
    if not isinstance(info, dict) or info.get("operation") != "compact":
        return
    records = list(
        ExportRange.objects.using(alias)
        .filter(destination=destination, source=source.name, lo__gte=info["lo"])
        .filter(hi__lte=info["hi"])
        .order_by("lo")
    )
    if len(records) > 1 and sum(r.parquet_rows or 0 for r in records) == info["rows"]:
        merge_records(records, info["files"], alias)
