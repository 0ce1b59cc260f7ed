"""Retention: how long archived and dead messages are kept, and the job that expires them.

``ARCHIVE_RETENTION`` and ``DEAD_RETENTION`` (seconds, ``None`` keeps forever), each with
per-queue overrides in ``QUEUES``. Two ways to expire, by cost:

- a day of the archive is dropped whole (:mod:`partitions`) once it is older than the
  *longest* archive retention in force: no row-by-row delete, no dead tuples, almost no WAL;
- rows of a queue whose retention is shorter than that (and rows the DEFAULT partition
  caught) are deleted in batches of ``RETENTION_DELETE_BATCH`` rows, at most
  ``RETENTION_DELETE_LIMIT`` rows a run, each batch its own short transaction. So is the
  dead table, which stays small.

Guards (:func:`register_retention_guard`) may hold rows back: each tells, per source, the id
below which rows may go (the pipeline's says "exported"), and nothing at or above the lowest
bound is dropped or deleted. Core knows guards only through this registry.

Workers run :func:`maintain` every ``RETENTION_INTERVAL``: one of them per interval (a
compare-and-set of ``pgqueue_maintenance.next_run_at`` in database time), and never beside
another run (an advisory lock, also taken by ``manage.py pgq_prune``).

A run has two kinds of steps: the day partitions (DDL: only the archive's owner may) and the
row deletes (DML). A step that cannot run is one line in the report's ``problems``, and the
others still run: a role with DML grants only expires dead letters and short retentions while
the owner creates and drops days from cron (``pgq_prune --partitions-only``).

The row deletes also keep job control's tables small (``housekeeping``): the unique windows
that expired, and the progress rows of messages that left the live table.
"""

from __future__ import annotations

import json
import logging
import time
from collections.abc import Callable, Iterator
from dataclasses import asdict, dataclass, field
from datetime import datetime, timedelta
from typing import Any

from django.db import DatabaseError, connections
from psycopg import sql as pgsql

from ..conf import PgQueueSettings, get_settings
from . import _job_control_sql, _partitions, _retention_sql
from ._partitions import ARCHIVE_TABLE, DEFAULT_PARTITION

logger = logging.getLogger("django_pgqueue.retention")

__all__ = [
    "RetentionReport",
    "maintain",
    "register_expiry_listener",
    "register_retention_guard",
    "run_retention",
    "unregister_expiry_listener",
    "unregister_retention_guard",
]

DEAD_TABLE = "pgqueue_dead"
JOB = "retention"
#: The advisory lock held while retention runs (one key, this app's own).
LOCK_KEY = 0x7067_7265_7400_0001

#: Where a problem line sends the operator.
ROLES_DOC = "how-to/database-roles in the docs"
#: SQLSTATE insufficient_privilege.
NO_PRIVILEGE = "42501"

#: ``guard(source, database alias)`` -> the id below which rows of ``source`` ("archive" or
#: "dead") may be expired, or None when it has no objection.
RetentionGuard = Callable[[str, str], "int | None"]
_GUARDS: list[RetentionGuard] = []


def register_retention_guard(guard: RetentionGuard) -> RetentionGuard:
    """Let ``guard`` hold rows back from expiry (see module doc); registering twice is once."""
    if guard not in _GUARDS:
        _GUARDS.append(guard)
    return guard


def unregister_retention_guard(guard: RetentionGuard) -> None:
    if guard in _GUARDS:
        _GUARDS.remove(guard)


#: ``listener(source, first id, last id, database alias)``: rows of ``source`` with ids in
#: ``[first, last]`` may have just been expired (called after each drop or delete).
ExpiryListener = Callable[[str, int, int, str], None]
_LISTENERS: list[ExpiryListener] = []


def register_expiry_listener(listener: ExpiryListener) -> ExpiryListener:
    """Tell ``listener`` what each run expires: a guard's owner keeps its records true (the
    pipeline marks its verified export ranges whose rows left the database as pruned)."""
    if listener not in _LISTENERS:
        _LISTENERS.append(listener)
    return listener


def unregister_expiry_listener(listener: ExpiryListener) -> None:
    if listener in _LISTENERS:
        _LISTENERS.remove(listener)


def _expired(source: str, first: int | None, last: int | None, alias: str) -> None:
    if first is None or last is None:
        return
    for listener in list(_LISTENERS):
        try:
            listener(source, first, last, alias)
        except Exception:
            logger.exception("Retention's expiry listener %r failed", listener)


def guard_bound(source: str, alias: str) -> int | None:
    """The lowest bound any guard sets for ``source`` (None: no guard objects)."""
    bounds = [b for guard in list(_GUARDS) if (b := guard(source, alias)) is not None]
    return min(bounds) if bounds else None


@dataclass
class Step:
    """One thing a run did or, in a dry run, would do."""

    source: str  # "archive", "dead", or job control's "unique windows" and "progress"
    action: str  # "drop", "delete", "keep", "create"
    target: str  # a partition, or 'queue "name"'
    rows: int | None = None
    note: str = ""

    def line(self, dry_run: bool) -> str:
        verb = {
            "drop": ("would drop", "dropped"),
            "delete": ("would delete", "deleted"),
            "create": ("would create", "created"),
            "keep": ("keeps", "kept"),
        }[self.action][0 if dry_run else 1]
        rows = "" if self.rows is None else f" {self.rows:,} rows"
        if self.action == "drop":
            what = f"day {self.target}{f' ({rows.strip()})' if rows else ''}"
        elif self.action == "delete":
            what = f"{rows.strip()} of {self.target}"
        else:
            what = self.target
        return f"{self.source}: {verb} {what}{f': {self.note}' if self.note else ''}"


@dataclass
class RetentionReport:
    dry_run: bool = False
    #: Another run held the lock: this one did nothing.
    busy: bool = False
    steps: list[Step] = field(default_factory=list)
    #: Steps that could not run, one line each (a missing privilege, a failed statement).
    problems: list[str] = field(default_factory=list)
    seconds: float = 0.0

    @property
    def rows_expired(self) -> int:
        return sum(s.rows or 0 for s in self.steps if s.action in ("drop", "delete"))

    def lines(self) -> list[str]:
        if self.busy:
            return ["Another retention run is in progress (a worker or pgq_prune); nothing done."]
        lines = [step.line(self.dry_run) for step in self.steps]
        return lines or ([] if self.problems else ["Nothing to expire."])

    def as_json(self) -> dict[str, Any]:
        return {**asdict(self), "rows_expired": self.rows_expired}


def error_text(exc: DatabaseError) -> str:
    """The server's one-line message: what failed and on which object."""
    diag = getattr(exc.__cause__, "diag", None)
    primary = getattr(diag, "message_primary", None)
    return primary or (str(exc).strip().splitlines() or [type(exc).__name__])[0]


def drop_after(conf: PgQueueSettings) -> float | None:
    """Age at which a whole archive day may go: the longest archive retention in force (a
    day holds every queue's rows). None when some queue keeps its rows forever."""
    values = [conf.ARCHIVE_RETENTION] + [
        q["ARCHIVE_RETENTION"] for q in conf.QUEUES.values() if "ARCHIVE_RETENTION" in q
    ]
    if any(v is None for v in values):
        return None
    return float(max(values))


class _Run:
    """One retention run on one connection (autocommit: each batch commits by itself)."""

    def __init__(self, alias: str, conf: PgQueueSettings, dry_run: bool) -> None:
        self.connection = connections[alias]
        self.alias = alias
        self.conf = conf
        self.dry_run = dry_run
        self.report = RetentionReport(dry_run=dry_run)
        self.budget = conf.RETENTION_DELETE_LIMIT
        with self.connection.cursor() as cursor:
            cursor.execute(_retention_sql.NOW)
            self.now: datetime = cursor.fetchone()[0]

    def step(self, *args: Any, **kwargs: Any) -> None:
        self.report.steps.append(Step(*args, **kwargs))

    def problem(self, line: str) -> None:
        self.report.problems.append(line)

    def queues(self, table: str) -> list[str]:
        with self.connection.cursor() as cursor:
            cursor.execute(_retention_sql.fill(_retention_sql.QUEUES_OF, table=table))
            return [row[0] for row in cursor.fetchall()]

    # -- the archive's days (DDL) ----------------------------------------------------------------

    def maintain_days(self) -> None:
        """Create the days ahead, drop the expired ones: when this role may, else one line."""
        with self.connection.cursor() as cursor:
            missing = _partitions.missing_ddl_privilege(cursor)
        if missing is not None:
            self.problem(
                f"archive: day partitions not created or dropped: {missing}; run `manage.py "
                f"pgq_prune --partitions-only` as the owner (see {ROLES_DOC})"
            )
            return
        try:
            self.create_ahead()
            self.expire_days()
        except DatabaseError as exc:
            self.problem(f"archive: day partitions: {error_text(exc)}")

    def create_ahead(self) -> None:
        with self.connection.cursor() as cursor:
            first = _partitions.today(cursor)
        last = first + timedelta(days=self.conf.ARCHIVE_PARTITIONS_AHEAD)
        if self.dry_run:
            return
        for name in _partitions.ensure_days(self.connection, first, last):
            self.step("archive", "create", name)

    def expire_days(self) -> None:
        """Drop whole the days older than the longest archive retention in force."""
        bound = guard_bound("archive", self.alias)
        whole = drop_after(self.conf)
        with self.connection.cursor() as cursor:
            leftovers = _partitions.expired_leftovers(cursor)
        for name in leftovers:
            self.drop_leftover(name)
        if whole is None:
            return
        cutoff = self.now - timedelta(seconds=whole)
        with self.connection.cursor() as cursor:
            days = _partitions.attached_days(cursor)
        for part in days:
            if part.end > cutoff:
                break
            self.expire_day(part, bound)

    # -- the archive's rows (DML) ---------------------------------------------------------------

    def expire_archive_rows(self) -> None:
        """Delete the rows whose day cannot go whole: the DEFAULT partition's past the longest
        retention, and those of queues whose retention is shorter."""
        try:
            self._expire_archive_rows()
        except DatabaseError as exc:
            self.problem(f"archive: expired rows not deleted: {error_text(exc)}")

    def _expire_archive_rows(self) -> None:
        bound = guard_bound("archive", self.alias)
        whole = drop_after(self.conf)
        if whole is not None:
            cutoff = self.now - timedelta(seconds=whole)
            self.delete(
                "archive",
                DEFAULT_PARTITION,
                f"rows of {DEFAULT_PARTITION}",
                _retention_sql.FINISHED_BEFORE,
                [cutoff],
                bound,
            )
        for queue in self.queues(ARCHIVE_TABLE):
            seconds = self.conf.for_queue(queue, "ARCHIVE_RETENTION")
            if seconds is None or (whole is not None and seconds >= whole):
                continue
            cutoff = self.now - timedelta(seconds=seconds)
            # Partition by partition: a TID-list delete stays inside one table.
            with self.connection.cursor() as cursor:
                days = _partitions.attached_days(cursor)
            tables = [p.name for p in days if p.start < cutoff] + [DEFAULT_PARTITION]
            self.delete(
                "archive",
                tables,
                f'queue "{queue}"',
                _retention_sql.QUEUE_FINISHED_BEFORE,
                [queue, cutoff],
                bound,
            )

    def drop_leftover(self, name: str) -> None:
        """A day an earlier run detached but did not drop (it died in between)."""
        with self.connection.cursor() as cursor:
            cursor.execute(_retention_sql.fill(_retention_sql.ID_RANGE, table=name))
            first, last = cursor.fetchone()
        if not self.dry_run:
            _partitions.drop_expired(self.connection, name)
            _expired("archive", first, last, self.alias)
        self.step("archive", "drop", name, note="detached by an earlier run")

    def expire_day(self, part: _partitions.Partition, bound: int | None) -> None:
        with self.connection.cursor() as cursor:
            if bound is not None:
                cursor.execute(_retention_sql.fill(_retention_sql.NEWEST_ID, table=part.name))
                newest = cursor.fetchone()[0]
                if newest is not None and newest >= bound:
                    self.step(
                        "archive",
                        "keep",
                        f"day {part.name}",
                        note=f"a retention guard keeps ids from {bound:,} (not exported yet)",
                    )
                    return
            cursor.execute(_retention_sql.fill(_retention_sql.ID_RANGE, table=part.name))
            first, last = cursor.fetchone()
            if self.dry_run:
                cursor.execute(_retention_sql.fill(_retention_sql.COUNT_ROWS, table=part.name))
            else:
                cursor.execute(_retention_sql.ESTIMATED_ROWS, [part.name])
            counted = int(cursor.fetchone()[0])
        rows = counted if counted >= 0 else None
        if not self.dry_run:
            _partitions.expire_day(self.connection, part)
            _expired("archive", first, last, self.alias)
        estimated = "" if self.dry_run or rows is None else "rows estimated by the planner"
        self.step("archive", "drop", part.name, rows, note=estimated)

    # -- row by row: short retentions, the DEFAULT partition, the dead table --------------------

    def delete(
        self,
        source: str,
        tables: str | list[str],
        target: str,
        condition: str,
        params: list[Any],
        bound: int | None,
    ) -> None:
        if bound is not None:
            condition += _retention_sql.BELOW_GUARD
            params = [*params, bound]
        total = 0
        for table in [tables] if isinstance(tables, str) else tables:
            try:
                total += self._delete_from(source, table, condition, params)
            except DatabaseError as exc:
                denied = getattr(exc.__cause__, "sqlstate", None) == NO_PRIVILEGE
                needs = (
                    f" (the role needs SELECT and DELETE on it: see {ROLES_DOC})" if denied else ""
                )
                self.problem(
                    f"{source}: expired rows of {target} not deleted: {error_text(exc)}{needs}"
                )
                break
        limited = self.budget <= 0
        if total or limited:
            note = "RETENTION_DELETE_LIMIT reached: the rest next run" if limited else ""
            self.step(source, "delete", target, total, note=note)

    def _delete_from(self, source: str, table: str, condition: str, params: list[Any]) -> int:
        """Rows of ``table`` matching ``condition``, deleted (counted in a dry run) within
        the run's budget, one batch per transaction."""
        total = 0
        low: int | None = None
        high: int | None = None
        try:
            for done, *ids in self._batches(
                _retention_sql.fill(
                    _retention_sql.DELETE_EXPIRED, table=table, condition=pgsql.SQL(condition)
                ),
                _retention_sql.fill(
                    _retention_sql.COUNT_EXPIRED, table=table, condition=pgsql.SQL(condition)
                ),
                params,
            ):
                total += done
                if done and ids:  # a delete's batch: its lowest and highest id
                    low = ids[0] if low is None else min(low, ids[0])
                    high = ids[1] if high is None else max(high, ids[1])
        finally:
            # The batches committed before a failure are gone: the listeners hear of them.
            _expired(source, low, high, self.alias)
        return total

    def _batches(self, delete: str, count: str, params: list[Any]) -> Iterator[tuple[Any, ...]]:
        """Run ``delete`` one batch per transaction within the run's budget (``count`` once
        in a dry run), yielding each statement's row: the rows it deleted (or counted), then
        what else it returns."""
        with self.connection.cursor() as cursor:
            if self.dry_run:
                cursor.execute(count, [*params, max(self.budget, 0)])
                counted = int(cursor.fetchone()[0])
                self.budget -= counted
                yield (counted,)
                return
            while self.budget > 0:
                want = min(self.conf.RETENTION_DELETE_BATCH, self.budget)
                cursor.execute(delete, [*params, want])
                done, *rest = cursor.fetchone()
                self.budget -= done
                yield (int(done), *rest)
                if done < want:
                    break

    def expire_batches(self) -> None:
        """Batches completed longer ago than ``ARCHIVE_RETENTION`` (their members' results
        are gone with the archive by then)."""
        seconds = self.conf.ARCHIVE_RETENTION
        if seconds is None or self.dry_run:
            return
        try:
            with connections[self.alias].cursor() as cursor:
                cursor.execute(
                    _retention_sql.DELETE_COMPLETED_BATCHES,
                    [self.now - timedelta(seconds=seconds), self.conf.RETENTION_DELETE_BATCH],
                )
        except DatabaseError as exc:
            self.problem(f"batches: completed batches not deleted: {error_text(exc)}")

    def housekeeping(self) -> None:
        """Delete expired unique windows and orphaned progress rows, within the budget."""
        for source, delete, count, target in (
            (
                "unique windows",
                _job_control_sql.DELETE_EXPIRED_WINDOWS,
                _job_control_sql.COUNT_EXPIRED_WINDOWS,
                "expired windows",
            ),
            (
                "progress",
                _job_control_sql.DELETE_ORPHAN_PROGRESS,
                _job_control_sql.COUNT_ORPHAN_PROGRESS,
                "rows of messages no longer live",
            ),
        ):
            if self.budget <= 0:
                return  # the archive and dead rows spent the run's budget: the rest next run
            try:
                total = sum(done for done, *_ in self._batches(delete, count, []))
            except DatabaseError as exc:
                self.problem(f"{source}: {target} not deleted: {error_text(exc)}")
                continue
            if total:
                note = (
                    "RETENTION_DELETE_LIMIT reached: the rest next run" if self.budget <= 0 else ""
                )
                self.step(source, "delete", target, total, note=note)

    def expire_dead(self) -> None:
        try:
            self._expire_dead()
        except DatabaseError as exc:
            self.problem(f"dead: expired rows not deleted: {error_text(exc)}")

    def _expire_dead(self) -> None:
        bound = guard_bound("dead", self.alias)
        for queue in self.queues(DEAD_TABLE):
            seconds = self.conf.for_queue(queue, "DEAD_RETENTION")
            if seconds is None:
                continue
            self.delete(
                "dead",
                DEAD_TABLE,
                f'queue "{queue}"',
                _retention_sql.QUEUE_DIED_BEFORE,
                [queue, self.now - timedelta(seconds=seconds)],
                bound,
            )


def run_retention(
    *,
    using: str | None = None,
    dry_run: bool = False,
    sources: tuple[str, ...] = ("archive", "dead"),
    partitions: bool = True,
    rows: bool = True,
    housekeeping: bool = True,
) -> RetentionReport:
    """Expire what the retention settings say is due, now; what ``pgq_prune`` runs.

    ``partitions``: create the archive's days ahead and drop the expired ones (DDL, the
    owner's); ``rows``: delete expired rows in batches (DML). Returns ``busy`` without doing
    anything when another run holds the lock. ``dry_run`` changes nothing and counts what
    would go. ``housekeeping`` (with ``rows``): also delete expired unique windows and the
    progress rows of messages no longer live. A step that cannot run is a line in ``problems``; the others still run.
    """
    conf = get_settings()
    alias = using or conf.DATABASE_ALIAS
    connection = connections[alias]
    if connection.in_atomic_block:
        raise RuntimeError("run_retention() commits batch by batch: call it outside atomic()")
    started = time.monotonic()
    with connection.cursor() as cursor:
        cursor.execute(_retention_sql.TRY_LOCK, [LOCK_KEY])
        if not cursor.fetchone()[0]:
            return RetentionReport(dry_run=dry_run, busy=True)
    try:
        run = _Run(alias, conf, dry_run)
        if "archive" in sources and partitions:
            run.maintain_days()
        if "archive" in sources and rows:
            run.expire_archive_rows()
        if "dead" in sources and rows:
            run.expire_dead()
        if "archive" in sources and rows:
            run.expire_batches()
        if housekeeping and rows:
            run.housekeeping()
        run.report.seconds = time.monotonic() - started
        return run.report
    finally:
        with connection.cursor() as cursor:
            cursor.execute(_retention_sql.UNLOCK, [LOCK_KEY])


def maintain(*, worker_id: str, using: str | None = None) -> RetentionReport | None:
    """A worker's maintenance: run retention if it is due, else None.

    Due once per ``RETENTION_INTERVAL`` across all workers: the first to move the job's
    ``next_run_at`` on runs it.
    """
    conf = get_settings()
    if conf.RETENTION_INTERVAL is None:
        return None
    alias = using or conf.DATABASE_ALIAS
    connection = connections[alias]
    with connection.cursor() as cursor:
        cursor.execute(
            _retention_sql.CLAIM_RUN,
            {"name": JOB, "interval": conf.RETENTION_INTERVAL, "worker": worker_id},
        )
        if cursor.fetchone() is None:
            return None
    report = run_retention(using=alias)
    if report.busy:
        return report
    with connection.cursor() as cursor:
        cursor.execute(_retention_sql.FINISH_RUN, [json.dumps(report.as_json()), JOB])
    for line in report.lines():
        if report.steps:
            logger.info("Retention: %s", line)
    _log_problems(report.problems)
    return report


#: The problems the last run of this process logged.
_LOGGED_PROBLEMS: set[str] = set()


def _log_problems(problems: list[str]) -> None:
    """A problem is a warning when it appears, then DEBUG while it lasts: a role without a
    privilege says so once, not every interval."""
    global _LOGGED_PROBLEMS
    for line in problems:
        level = logging.DEBUG if line in _LOGGED_PROBLEMS else logging.WARNING
        logger.log(level, "Retention: %s", line)
    _LOGGED_PROBLEMS = set(problems)
