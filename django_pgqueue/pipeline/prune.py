"""prune: delete archive / dead rows that a completed export verified, one range at a time.

Each range is deleted in its own short transaction by one ``DELETE ... RETURNING`` whose
returned rows are counted and checksummed in the same statement; when they differ from what
the export verified (a late-committed row, a requeue since), the transaction is rolled back
and that range is left alone. So prune can never delete a row that is not in the export.
Not a Spark job: Spark's JDBC source cannot DELETE; this runs from the driver.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from datetime import timedelta

from django.db import connections, transaction
from django.utils import timezone

from ..conf import get_settings
from .columns import SOURCES, SourceTable, sql_row_hash
from .errors import NoVerifiedExport, PipelineError
from .models import ExportRange, ExportRangeStatus
from .progress import Progress


@dataclass
class PruneResult:
    rows: int = 0
    row_bytes: int = 0
    ranges_pruned: int = 0
    skipped: list[str] = field(default_factory=list)
    relation_bytes_before: int = 0
    relation_bytes_after: int = 0
    vacuumed: bool = False
    seconds: float = 0.0

    @property
    def relation_bytes_reclaimed(self) -> int:
        return self.relation_bytes_before - self.relation_bytes_after


class _Mismatch(Exception):
    pass


def prune(
    *,
    destination: str | None = None,
    sources: Iterable[str] = ("archive", "dead"),
    keep_days: float | None = None,
    vacuum: bool = False,
    dry_run: bool = False,
    report: Callable[[str], None] | None = None,
    using: str | None = None,
) -> PruneResult:
    """Delete the rows of verified export ranges, oldest first.

    ``keep_days`` keeps ranges holding any row newer than that many days (by ``finished_at``
    / ``died_at``). ``vacuum`` runs ``VACUUM (ANALYZE)`` afterwards so the freed space is
    reusable at once and the relation sizes in the result reflect it. Raises
    :class:`NoVerifiedExport` when there is nothing verified to prune.
    """
    alias = using or get_settings().DATABASE_ALIAS
    chosen: list[SourceTable] = []
    for name in sources:
        if name not in SOURCES:
            raise PipelineError(f"Unknown source {name!r}; use archive and/or dead.")
        chosen.append(SOURCES[name])
    candidates = ExportRange.objects.using(alias).filter(
        source__in=[s.name for s in chosen], status=ExportRangeStatus.VERIFIED
    )
    if destination is not None:
        candidates = candidates.filter(destination=destination.rstrip("/"))
    if not candidates.exists():
        where = f" to {destination}" if destination else ""
        raise NoVerifiedExport(
            f"Nothing to prune: no verified export range{where}. Run `pgq_pipeline export` "
            "first; prune only deletes rows an export has written and verified."
        )
    if keep_days is not None:
        if keep_days < 0:
            raise PipelineError(f"keep_days must be >= 0, got {keep_days}")
        with connections[alias].cursor() as cursor:
            cursor.execute("SELECT now()")  # database time, not the host clock
            cutoff = cursor.fetchone()[0] - timedelta(days=keep_days)
        candidates = candidates.filter(max_at__lt=cutoff) | candidates.filter(source_rows=0)
    ranges = list(candidates.order_by("source", "lo"))
    started = time.monotonic()
    result = PruneResult()
    result.relation_bytes_before = _relation_bytes(chosen, alias)
    progress = Progress("prune", len(ranges), report)
    for record in ranges:
        source = SOURCES[record.source]
        if dry_run:
            progress.advance(record.source_rows or 0, note="dry run")
            result.rows += record.source_rows or 0
            continue
        try:
            rows, row_bytes = _delete_range(source, record, alias)
        except _Mismatch as exc:
            result.skipped.append(f"{record}: {exc}")
            ExportRange.objects.using(alias).filter(pk=record.pk).update(
                status=ExportRangeStatus.MISMATCH
            )
            progress.advance(0, note=f"skipped {record.source} [{record.lo}, {record.hi})")
            continue
        result.rows += rows
        result.row_bytes += row_bytes
        result.ranges_pruned += 1
        progress.advance(rows, note=f"{record.source} ids < {record.hi}")
    if vacuum and not dry_run:
        with connections[alias].cursor() as cursor:
            for source in chosen:
                cursor.execute(f"VACUUM (ANALYZE) {source.table}")
        result.vacuumed = True
    result.relation_bytes_after = _relation_bytes(chosen, alias)
    result.seconds = time.monotonic() - started
    return result


def _delete_range(source: SourceTable, record: ExportRange, alias: str) -> tuple[int, int]:
    statement = f"""
        WITH doomed AS (
            DELETE FROM {source.table} AS t WHERE t.id >= %s AND t.id < %s
            RETURNING {sql_row_hash(source, "t")} AS h, pg_column_size(t.*) AS size
        )
        SELECT count(*), coalesce(sum(h), 0)::bigint, coalesce(sum(size), 0)::bigint FROM doomed
    """
    with transaction.atomic(using=alias), connections[alias].cursor() as cursor:
        cursor.execute(statement, [record.lo, record.hi])
        rows, checksum, row_bytes = cursor.fetchone()
        if (rows, checksum) != (record.parquet_rows, record.parquet_checksum):
            # Rolls the DELETE back: these rows are not exactly what the export holds.
            raise _Mismatch(
                f"database has {rows} rows (checksum {checksum}), the export verified "
                f"{record.parquet_rows} (checksum {record.parquet_checksum}); re-run export"
            )
        ExportRange.objects.using(alias).filter(pk=record.pk).update(
            status=ExportRangeStatus.PRUNED,
            pruned_at=timezone.now(),
            pruned_rows=rows,
            pruned_bytes=row_bytes,
        )
    return int(rows), int(row_bytes)


def _relation_bytes(sources: list[SourceTable], alias: str) -> int:
    with connections[alias].cursor() as cursor:
        total = 0
        for source in sources:
            cursor.execute("SELECT pg_total_relation_size(%s::regclass)", [source.table])
            total += int(cursor.fetchone()[0])
    return total
