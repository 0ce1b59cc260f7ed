"""prune: delete archive / dead rows of one destination's committed export, one range at a time.

Before it deletes a range, prune re-verifies the destination it was told against the latest
version of the source's Delta table: the version holds exactly the files the export recorded
for the range, with their recorded rows and sizes, and every one of them exists with the
recorded size and SHA-256. A range that fails any check is refused, with the
reason, and its rows stay. Each accepted range is deleted in its own short transaction by one
``DELETE ... RETURNING`` whose returned rows are counted and checksummed in the same statement;
when they differ from what the export verified (a late-committed row, a requeue since), the
transaction is rolled back and that range is left alone. So prune can never delete a row that
the destination's files do not hold. Only ranges of that destination are read or changed.
Not a Spark job: Spark's JDBC source cannot DELETE; this runs from the driver.
"""

from __future__ import annotations

import hashlib
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from datetime import timedelta
from typing import TYPE_CHECKING, Any

from django.db import connections, transaction
from django.utils import timezone

from ..conf import get_settings
from ..exceptions import NotPrunable, NoVerifiedExport, PipelineError
from .columns import SOURCES, SourceTable, sql_row_hash
from .committed import TableFile, files_by_range, open_table, table_uri
from .export import pruned_elsewhere
from .models import ExportRange, ExportRangeStatus
from .progress import Progress

if TYPE_CHECKING:
    from deltalake import DeltaTable


@dataclass
class PruneResult:
    destination: str = ""
    dry_run: bool = False
    rows: int = 0
    row_bytes: int = 0
    ranges_pruned: int = 0
    #: Ranges whose files did not re-verify: "<range>: <reason>" (rows kept, state unchanged).
    refused: list[str] = field(default_factory=list)
    #: Ranges whose rows differed from the export at delete time (rolled back, re-exported).
    skipped: list[str] = field(default_factory=list)
    relation_bytes_before: int = 0
    relation_bytes_after: int = 0
    vacuumed: bool = False
    vacuum_skipped: list[str] = field(default_factory=list)
    seconds: float = 0.0

    @property
    def relation_bytes_reclaimed(self) -> int:
        return self.relation_bytes_before - self.relation_bytes_after


class _Mismatch(PipelineError):
    def __init__(self, message: str, rows: int) -> None:
        super().__init__(message)
        self.rows = rows


def prune(
    *,
    destination: str | None,
    sources: Iterable[str] = ("archive", "dead"),
    keep_days: float | None = None,
    vacuum: bool = False,
    dry_run: bool = False,
    report: Callable[[str], None] | None = None,
    using: str | None = None,
) -> PruneResult:
    """Delete the rows of ``destination``'s committed ranges that re-verify, oldest first.

    ``destination`` is required: prune deletes only what it has just re-verified in that
    export's files. ``keep_days`` keeps ranges holding any row newer than that many days (by
    ``finished_at`` / ``died_at``). ``vacuum`` runs ``VACUUM (ANALYZE)`` afterwards so the
    freed space is reusable at once (skipped, and said so, for a table this role does not
    own). ``dry_run`` re-verifies and reports, deleting nothing. Raises
    :class:`NoVerifiedExport` when there is nothing verified to prune and
    :class:`NotPrunable` when the destination cannot be read.
    """
    if not destination:
        raise PipelineError(
            "prune needs --destination: it deletes only rows it has just re-verified in that "
            "export's files, so it must be told which export to check."
        )
    alias = using or get_settings().DATABASE_ALIAS
    destination = destination.rstrip("/")
    chosen: list[SourceTable] = []
    for name in sources:
        if name not in SOURCES:
            raise PipelineError(f"Unknown source {name!r}; use archive and/or dead.")
        chosen.append(SOURCES[name])
    candidates = ExportRange.objects.using(alias).filter(
        destination=destination,
        source__in=[s.name for s in chosen],
        status=ExportRangeStatus.VERIFIED,
    )
    if not candidates.exists():
        raise NoVerifiedExport(
            f"Nothing to prune: no verified export range to {destination}. Run `pgq_pipeline "
            "export` first; prune only deletes rows an export has written and verified."
        )
    files = _open(destination)
    tables = {s.name: open_table(destination, s.name) for s in chosen}
    committed = {name: files_by_range(table) for name, table in tables.items()}
    if keep_days is not None:
        if keep_days < 0:
            raise PipelineError(f"keep_days must be >= 0, got {keep_days}")
        with connections[alias].cursor() as cursor:
            cursor.execute("SELECT now()")  # database time, not the host clock
            cutoff = cursor.fetchone()[0] - timedelta(days=keep_days)
        candidates = candidates.filter(max_at__lt=cutoff) | candidates.filter(source_rows=0)
    ranges = list(candidates.order_by("source", "lo"))
    started = time.monotonic()
    result = PruneResult(destination=destination, dry_run=dry_run)
    result.relation_bytes_before = _relation_bytes(chosen, alias)
    progress = Progress("prune", len(ranges), report)
    for record in ranges:
        where = f"{record.source} [{record.lo}, {record.hi})"
        table = tables[record.source]
        reason = verify_committed(files, table, committed[record.source], record)
        if reason is not None:
            result.refused.append(f"{where}: {reason}")
            _say(report, f"prune: refused {where}: {reason}")
            continue
        if dry_run:
            result.rows += record.parquet_rows or 0
            result.ranges_pruned += 1
            _say(report, f"prune (dry run): would delete {record.parquet_rows:,} rows of {where}")
            continue
        try:
            rows, row_bytes = _delete_range(SOURCES[record.source], record, alias)
        except _Mismatch as exc:
            if pruned_elsewhere(record, alias):
                # Its rows went through another destination's prune: these files keep them.
                if exc.rows == 0:
                    _mark_pruned(record, 0, 0, alias)
                result.skipped.append(
                    f"{where}: {exc}; ids of it were pruned through another "
                    "destination, whose files hold them"
                )
            else:
                result.skipped.append(f"{where}: {exc}; re-run export")
                ExportRange.objects.using(alias).filter(pk=record.pk).update(
                    status=ExportRangeStatus.MISMATCH
                )
            progress.advance(0, note=f"skipped {where}")
            continue
        result.rows += rows
        result.row_bytes += row_bytes
        result.ranges_pruned += 1
        progress.advance(rows, note=f"{record.source} ids < {record.hi}")
    if vacuum and not dry_run:
        result.vacuum_skipped = _vacuum(chosen, alias)
        result.vacuumed = len(result.vacuum_skipped) < len(chosen)
    result.relation_bytes_after = _relation_bytes(chosen, alias)
    result.seconds = time.monotonic() - started
    return result


def _say(report: Callable[[str], None] | None, line: str) -> None:
    if report is not None:
        report(line)


def _open(destination: str) -> Any:
    """The file system of ``destination`` (pyarrow.fs), refusing one that is not there."""
    from pyarrow import fs

    try:
        filesystem, root = fs.FileSystem.from_uri(table_uri(destination, "").rstrip("/"))
        exists = filesystem.get_file_info(root).type != fs.FileType.NotFound
    except Exception as exc:  # any reason the files cannot be read refuses
        raise NotPrunable(
            f"Cannot read the export at {destination} from here to re-verify it ({exc}); "
            "nothing was pruned."
        ) from exc
    if not exists:
        raise NotPrunable(
            f"The export destination {destination} does not exist (deleted, moved or not "
            "mounted): prune deletes only rows it has just re-verified in the exported files, "
            "so nothing was pruned. Run `pgq_pipeline export` to that destination to write "
            "the rows that are still in the database again."
        )
    return filesystem


def verify_committed(
    filesystem: Any,
    table: DeltaTable | None,
    committed: dict[int, list[TableFile]],
    record: ExportRange,
) -> str | None:
    """Why the latest version of the table does not hold the rows of ``record``, or None
    when it does."""
    from pyarrow import fs

    if table is None:
        return f"the destination has no Delta table for {record.source}"
    recorded = {f["path"]: f for f in record.files or []}
    if sum(f["rows"] for f in recorded.values()) != record.parquet_rows:
        return "the files the export recorded do not add up to its row count"
    listed = {f.path: f for f in committed.get(record.lo, [])}
    version = table.version()
    extra = sorted(set(listed) - set(recorded))
    if extra:
        return f"version {version} of the table holds file {extra[0]} the export did not record"
    for path, expected in sorted(recorded.items()):
        if path not in listed:
            return f"file {path} is not in version {version} of the table"
        if (listed[path].bytes, listed[path].rows) != (expected["bytes"], expected["rows"]):
            return f"version {version} of the table lists file {path} with other size or rows"
    _, root = fs.FileSystem.from_uri(table.table_uri.rstrip("/"))
    try:
        for path, expected in sorted(recorded.items()):
            info = filesystem.get_file_info(f"{root}/{path}")
            if info.type == fs.FileType.NotFound:
                return f"file {path} is missing"
            if info.size != expected["bytes"]:
                return f"file {path} changed size"
            if _sha256(filesystem, f"{root}/{path}") != expected["sha256"]:
                return f"file {path} changed (SHA-256 differs)"
    except Exception as exc:  # unreadable means unverified
        return f"its files could not be read ({type(exc).__name__}: {exc})"
    return None


def _sha256(filesystem: Any, path: str) -> str:
    digest = hashlib.sha256()
    with filesystem.open_input_stream(path) as stream:
        while chunk := stream.read(1 << 20):
            digest.update(chunk)
    return digest.hexdigest()


def _mark_pruned(record: ExportRange, rows: int, row_bytes: int, alias: str) -> None:
    ExportRange.objects.using(alias).filter(pk=record.pk).update(
        status=ExportRangeStatus.PRUNED,
        pruned_at=timezone.now(),
        pruned_rows=rows,
        pruned_bytes=row_bytes,
    )


def _vacuum(sources: list[SourceTable], alias: str) -> list[str]:
    """VACUUM (ANALYZE) the tables this role may vacuum; the others are returned, with why.

    PostgreSQL only warns (and does nothing) when a non-owner asks, so ownership is checked
    first and a skipped table is reported instead of a vacuum that did not happen.
    """
    skipped = []
    with connections[alias].cursor() as cursor:
        for source in sources:
            cursor.execute(
                "SELECT pg_has_role(current_user, c.relowner, 'USAGE') "
                "OR pg_has_role(current_user, d.datdba, 'USAGE') "
                "OR (SELECT rolsuper FROM pg_roles WHERE rolname = current_user) "
                "FROM pg_class c, pg_database d "
                "WHERE c.oid = %s::regclass AND d.datname = current_database()",
                [source.table],
            )
            if not cursor.fetchone()[0]:
                skipped.append(
                    f"{source.table}: only its owner (or the database owner, or a superuser) "
                    "may vacuum it"
                )
                continue
            cursor.execute(f"VACUUM (ANALYZE) {source.table}")
    return skipped


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
                f"{record.parquet_rows} (checksum {record.parquet_checksum})",
                int(rows),
            )
        _mark_pruned(record, int(rows), int(row_bytes), alias)
    return int(rows), int(row_bytes)


def _relation_bytes(sources: list[SourceTable], alias: str) -> int:
    with connections[alias].cursor() as cursor:
        total = 0
        for source in sources:
            cursor.execute("SELECT pg_total_relation_size(%s::regclass)", [source.table])
            total += int(cursor.fetchone()[0])
    return total
