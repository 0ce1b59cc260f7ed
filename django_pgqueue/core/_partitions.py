"""The archive's daily partitions: the table, creating days ahead, expiring a day whole.

``pgqueue_archive`` is ``PARTITION BY RANGE (finished_at)``: one partition per UTC day, named
``pgqueue_archive_pYYYYMMDD``, and a DEFAULT partition that takes any row no day partition
covers (a day not created yet, a row written with a far past or future time), so an insert
never fails. Completions write ``finished_at = now()``, so each day's rows land in that day's
partition, created ahead of time by the maintenance (``core/_retention.py``).

Expiring a day is ``DETACH PARTITION`` then ``DROP TABLE``: no row is deleted one by one, so
it leaves no dead tuples and writes almost no WAL whatever the day holds. ``DETACH ...
CONCURRENTLY`` is not allowed beside a DEFAULT partition, so the detach takes the parent's
ACCESS EXCLUSIVE lock for a catalog change only, under a short ``lock_timeout``: it never
waits long behind a reader of the archive, and never holds completions back long behind it.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from datetime import UTC, date, datetime, timedelta
from typing import Any

from django.db import DatabaseError, transaction
from psycopg import sql as pgsql

from . import _retention_sql

ARCHIVE_TABLE = "pgqueue_archive"
DEFAULT_PARTITION = "pgqueue_archive_default"
PARTITION_PREFIX = "pgqueue_archive_p"
#: A detached day is renamed so before it is dropped: one left by a run that died between the
#: two steps is recognised as retention's own and dropped by the next run, never confused
#: with a table an operator detached on purpose.
EXPIRED_PREFIX = "pgqueue_archive_expired_p"
#: Days the migration creates before today (rows finishing around midnight UTC).
DAYS_BEHIND = 1
#: How often attaching or detaching a day tries, each try waiting at most
#: ``_retention_sql.SHORT_LOCK_TIMEOUT`` for the archive's lock.
LOCK_TRIES = 10


@dataclass(frozen=True)
class Partition:
    """One day of the archive: rows with ``start <= finished_at < end``."""

    name: str
    day: date

    @property
    def start(self) -> datetime:
        return datetime(self.day.year, self.day.month, self.day.day, tzinfo=UTC)

    @property
    def end(self) -> datetime:
        return self.start + timedelta(days=1)


def partition_name(day: date) -> str:
    return f"{PARTITION_PREFIX}{day:%Y%m%d}"


def _day_of(name: str, prefix: str) -> date | None:
    digits = name.removeprefix(prefix)
    if name == digits or len(digits) != 8 or not digits.isdigit():
        return None
    try:
        return datetime.strptime(digits, "%Y%m%d").date()
    except ValueError:
        return None


def _bound(moment: datetime) -> pgsql.Literal:
    # An explicit UTC offset: a bare date would be read in the session's time zone.
    return pgsql.Literal(f"{moment:%Y-%m-%d %H:%M:%S}+00")


def attached_days(cursor: Any) -> list[Partition]:
    """The day partitions attached to the archive, oldest first."""
    cursor.execute(_retention_sql.ATTACHED_PARTITIONS, [ARCHIVE_TABLE])
    days = []
    for (name,) in cursor.fetchall():
        day = _day_of(name, PARTITION_PREFIX)
        if day is not None:
            days.append(Partition(name, day))
    return sorted(days, key=lambda p: p.day)


def expired_leftovers(cursor: Any) -> list[str]:
    """Days detached by retention whose drop did not happen (the run died in between)."""
    cursor.execute(
        _retention_sql.EXPIRED_TABLES, [EXPIRED_PREFIX.replace("_", r"\_") + "%", ARCHIVE_TABLE]
    )
    return sorted(name for (name,) in cursor.fetchall() if _day_of(name, EXPIRED_PREFIX))


def today(cursor: Any) -> date:
    """The current UTC day, in database time."""
    cursor.execute(_retention_sql.TODAY)
    return cursor.fetchone()[0]


def missing_ddl_privilege(cursor: Any) -> str | None:
    """Why this session's role cannot create or drop the archive's days, or None when it can
    (or when the archive does not exist yet)."""
    cursor.execute(_retention_sql.DDL_PRIVILEGES)
    row = cursor.fetchone()
    if row is None:
        return None
    role, owns, owner, can_create, schema = row
    missing = []
    if not owns:
        missing.append(f'is not the owner of table {ARCHIVE_TABLE} (owner: "{owner}")')
    if not can_create:
        missing.append(f'lacks CREATE on schema "{schema}"')
    return f'role "{role}" ' + " and ".join(missing) if missing else None


def _with_lock_timeout(connection: Any, statements: list[str]) -> None:
    """Run ``statements`` in one transaction that waits at most SHORT_LOCK_TIMEOUT for each
    lock, tried LOCK_TRIES times: a reader holding the archive makes it wait, never queue for
    long."""
    for attempt in range(LOCK_TRIES):
        try:
            with transaction.atomic(using=connection.alias), connection.cursor() as cursor:
                cursor.execute(_retention_sql.SHORT_LOCK_TIMEOUT)
                for statement in statements:
                    cursor.execute(statement)
            return
        except DatabaseError as exc:
            if getattr(exc.__cause__, "sqlstate", None) != "55P03" or attempt == LOCK_TRIES - 1:
                raise
            time.sleep(0.05 * (attempt + 1))


def create_day(connection: Any, day: date) -> bool:
    """Create and attach ``day``'s partition; False when it exists, or when the DEFAULT
    partition already holds rows of that day (they stay there; retention deletes them)."""
    name = partition_name(day)
    part = Partition(name, day)
    with connection.cursor() as cursor:
        cursor.execute(_retention_sql.TABLE_EXISTS, [name])
        if cursor.fetchone()[0]:
            return False
        cursor.execute(_retention_sql.DEFAULT_HOLDS_DAY, [part.start, part.end])
        if cursor.fetchone()[0]:
            return False
    _with_lock_timeout(
        connection,
        [
            _retention_sql.fill(_retention_sql.CREATE_DAY, partition=name),
            _retention_sql.fill(
                _retention_sql.ATTACH_DAY,
                partition=name,
                start=_bound(part.start),
                end=_bound(part.end),
            ),
        ],
    )
    return True


def ensure_days(connection: Any, first: date, last: date) -> list[str]:
    """Create the missing day partitions from ``first`` to ``last``; returns their names."""
    created = []
    day = first
    while day <= last:
        if create_day(connection, day):
            created.append(partition_name(day))
        day += timedelta(days=1)
    return created


def expire_day(connection: Any, part: Partition) -> None:
    """Detach ``part`` (renamed as expired in the same transaction), then drop it."""
    expired = f"{EXPIRED_PREFIX}{part.day:%Y%m%d}"
    _with_lock_timeout(
        connection,
        [
            _retention_sql.fill(_retention_sql.DETACH_DAY, partition=part.name),
            _retention_sql.fill(
                _retention_sql.RENAME_EXPIRED, partition=part.name, expired=expired
            ),
        ],
    )
    drop_expired(connection, expired)


def drop_expired(connection: Any, name: str) -> None:
    with connection.cursor() as cursor:
        cursor.execute(_retention_sql.fill(_retention_sql.DROP_EXPIRED, table=name))


def create_archive_partitions(apps: Any, schema_editor: Any) -> None:
    """The migration's: yesterday to ``ARCHIVE_PARTITIONS_AHEAD`` days from today."""
    connection = schema_editor.connection
    with connection.cursor() as cursor:
        first = today(cursor) - timedelta(days=DAYS_BEHIND)
    ensure_days(connection, first, first + timedelta(days=DAYS_BEHIND + ahead_days()))


def ahead_days() -> int:
    from ..conf import get_settings

    return int(get_settings().ARCHIVE_PARTITIONS_AHEAD)
