"""The numbers on the admin dashboard, read without a full ``COUNT(*)`` of any big table.

Every count here is *capped*: it walks at most ``cap + 1`` entries of an index range and
reports ``capped=True`` when there were more, so a page view costs the same with a thousand
or ten million rows. The ranges are contiguous in the existing indexes:

- live messages, per (queue, priority) found by a skip scan over ``pgq_message_claim``:
  ``available_at <= now()`` (ready) and ``available_at > now()`` (scheduled or leased);
- leases on their last attempt, over the small partial index ``pgq_message_exhausted``;
- ``pgq_dead_died (queue, died_at)`` and ``pgq_archive_finished (queue, finished_at)`` for
  the dead count and the 5 / 60 minute throughput;
- failed attempts in the last 5 / 60 minutes, read from the ``errors`` entries (one per
  failed attempt, with its time) of the rows that can hold recent ones: dead rows that died
  in the window, archived rows finished in it and live rows with errors, the last two over
  the small partial indexes ``pgq_archive_failed`` and ``pgq_message_failed``. A retry of
  a dead message carries its errors along, so it never erases a failure from the count.

Nothing the database may hold (an infinite or far-future timestamp, JSON Python cannot
decode) reaches Python as such: ages are computed in SQL as seconds, timestamps outside
Python's range arrive as NULL, JSON as text decoded with a fallback.

The whole dashboard is five statements, however many queues there are.
"""

from __future__ import annotations

import datetime as dt
import math
from dataclasses import dataclass, field
from typing import Any

from django.db import connections, transaction

from ..conf import get_settings
from ..models import ARCHIVE_TABLE, DEAD_TABLE, MESSAGE_TABLE
from .columns import SAFE_TIMESTAMP_RANGE, decode_json
from .display import LONGEST_AGE, activity_items, short_duration

__all__ = [
    "COUNT_CAP",
    "SAMPLE_CAP",
    "THROUGHPUT_CAP",
    "CappedCount",
    "Overview",
    "QueueOverview",
    "TableSize",
    "WorkerOverview",
    "known_queues",
    "live_worker_seconds",
    "read_overview",
]

# States are counted up to this many rows per queue; above it the page shows "10,000+".
COUNT_CAP = 10_000
# Whether a live row is leased or has failed before is read from the heap for this many rows
# per queue and side of now(); beyond it those counts are lower bounds.
SAMPLE_CAP = 1_000
# Throughput windows are index-only range scans, cheap enough to count further.
THROUGHPUT_CAP = 100_000
# Failed attempts are read from this many rows' errors per queue and table at most; beyond
# it the count is a lower bound.
FAILURE_ROWS_CAP = SAMPLE_CAP

# A worker counts as alive if its heartbeat is younger than this many heartbeat intervals.
LIVE_WORKER_INTERVALS = 3


@dataclass(frozen=True)
class CappedCount:
    """A count that stopped at ``cap``: ``capped`` means "at least ``value``"."""

    value: int
    capped: bool = False

    def __str__(self) -> str:
        return f"{self.value:,}+" if self.capped else f"{self.value:,}"

    def __add__(self, other: CappedCount) -> CappedCount:
        return CappedCount(self.value + other.value, self.capped or other.capped)


@dataclass
class QueueOverview:
    name: str
    paused: bool
    ready: CappedCount
    scheduled: CappedCount
    in_flight: CappedCount
    retrying: CappedCount
    dead: CappedCount
    oldest_ready_age: dt.timedelta | None
    processed_5m: CappedCount
    processed_60m: CappedCount
    failed_5m: CappedCount
    failed_60m: CappedCount

    @property
    def oldest_ready(self) -> str:
        return short_duration(self.oldest_ready_age) if self.oldest_ready_age else "—"


@dataclass(frozen=True)
class TableSize:
    """A table's row count: exact up to the cap, else the planner's estimate when it has one
    (``pg_class.reltuples``, refreshed by (auto)vacuum and analyze)."""

    counted: CappedCount | None
    estimate: int | None

    def __str__(self) -> str:
        if self.counted is not None and not self.counted.capped:
            return str(self.counted)
        if self.estimate is not None and (
            self.counted is None or self.estimate > self.counted.value
        ):
            return f"about {self.estimate:,} (planner estimate)"
        return str(self.counted) if self.counted is not None else "not yet analyzed"


@dataclass
class WorkerOverview:
    worker_id: str
    hostname: str
    pid: int | None
    queues: list[str]
    concurrency: int
    # None when the stored value is outside what Python can hold.
    started_at: dt.datetime | None
    last_seen_at: dt.datetime | None
    seen_ago: dt.timedelta
    stats: dict[str, Any]

    @property
    def seen(self) -> str:
        return short_duration(self.seen_ago)

    @property
    def activity(self) -> list[tuple[str, str]]:
        """The heartbeat's counters as ``(label, value)``, in a fixed order."""
        return activity_items(self.stats)


@dataclass
class Overview:
    now: dt.datetime
    queues: list[QueueOverview] = field(default_factory=list)
    workers: list[WorkerOverview] = field(default_factory=list)
    # pg_class.reltuples of the tables the planner has estimated (after a vacuum or analyze).
    estimated_rows: dict[str, int] = field(default_factory=dict)
    # "live", "archive", "dead": each table's size as the dashboard says it.
    table_sizes: dict[str, TableSize] = field(default_factory=dict)


def _skip_scan(name: str, table: str, condition: str = "TRUE") -> str:
    """A recursive CTE listing the distinct queues of ``table``: one index probe per queue."""
    return f"""
{name}(queue) AS (
    (SELECT queue FROM {table} WHERE {condition} ORDER BY queue LIMIT 1)
    UNION ALL
    SELECT (SELECT t.queue FROM {table} t
            WHERE t.queue > {name}.queue AND {condition}
            ORDER BY t.queue LIMIT 1)
    FROM {name} WHERE {name}.queue IS NOT NULL
)"""


# Every queue anyone may care about: with live, exhausted, dead or archived rows, a state row,
# or a live worker listening to it. Paused state comes along.
QUEUES_SQL = f"""
WITH RECURSIVE
{_skip_scan("live", "pgqueue_message", "attempts < max_attempts")},
{_skip_scan("exhausted", "pgqueue_message", "attempts >= max_attempts")},
{_skip_scan("dead", "pgqueue_dead")},
{_skip_scan("archived", "pgqueue_archive")},
names(queue) AS (
    SELECT queue FROM live UNION SELECT queue FROM exhausted
    UNION SELECT queue FROM dead UNION SELECT queue FROM archived
    UNION SELECT name FROM pgqueue_queue
    UNION SELECT jsonb_array_elements_text(queues) FROM pgqueue_worker
          WHERE jsonb_typeof(queues) = 'array'
            AND last_seen_at > now() - make_interval(secs => %(live_window)s)
)
SELECT n.queue, COALESCE(s.paused, FALSE)
FROM names n LEFT JOIN pgqueue_queue s ON s.name = n.queue
WHERE n.queue IS NOT NULL
ORDER BY n.queue
"""

# (queue, priority) pairs of the claim index, by a two-level skip scan; every live-message
# count below is then a contiguous index range per pair, cut off after %(cap)s + 1 rows.
_QUEUE_PRIORITIES = """
qp(queue, priority) AS (
    (SELECT queue, priority FROM pgqueue_message
     WHERE attempts < max_attempts AND queue = ANY(%(queues)s)
     ORDER BY queue, priority DESC LIMIT 1)
    UNION ALL
    SELECT nxt.queue, nxt.priority FROM qp CROSS JOIN LATERAL (
        (SELECT m.queue, m.priority FROM pgqueue_message m
         WHERE m.attempts < m.max_attempts AND m.queue = qp.queue AND m.priority < qp.priority
         ORDER BY m.priority DESC LIMIT 1)
        UNION ALL
        (SELECT m.queue, m.priority FROM pgqueue_message m
         WHERE m.attempts < m.max_attempts AND m.queue > qp.queue AND m.queue = ANY(%(queues)s)
         ORDER BY m.queue, m.priority DESC LIMIT 1)
        LIMIT 1
    ) nxt
)"""


def _live_range(comparison: str, columns: str, cap: str) -> str:
    """Rows of one queue whose ``available_at`` is on one side of now(), at most cap + 1.

    In ``available_at`` order per priority: the future side starts with what falls due
    soonest, where the leases (expiring within a visibility timeout) are.
    """
    return f"""
    SELECT x.* FROM qp CROSS JOIN LATERAL (
        SELECT {columns} FROM pgqueue_message m
        WHERE m.queue = qp.queue AND m.attempts < m.max_attempts
          AND m.priority = qp.priority AND m.available_at {comparison} now()
        ORDER BY m.available_at
        LIMIT {cap} + 1
    ) x
    WHERE qp.queue = q.queue
    LIMIT {cap} + 1"""


# Errors entries of a failed attempt at or after $since (silent: an entry without a readable
# time is not counted rather than failing the page).
_RECENT_ERRORS = "'$[*] ? (@.at.datetime() >= $since.datetime())'"


def _errors_since(errors: str, minutes: int) -> str:
    """The entries of ``errors`` (an SQL expression) of the last ``minutes``, as an array."""
    return f"""jsonb_path_query_array_tz({errors}, {_RECENT_ERRORS},
        jsonb_build_object('since', now() - interval '{minutes} minutes'), true)"""


def _window_count(table: str, column: str, minutes: int) -> str:
    return f"""(SELECT count(*) FROM (
        SELECT 1 FROM {table} t
        WHERE t.queue = q.queue AND t.{column} > now() - interval '{minutes} minutes'
        LIMIT %(throughput_cap)s + 1) w)"""


# Totals are index-only walks (the claim index has queue, priority and available_at) capped
# at %(cap)s. Whether a row is leased or has failed before is only in the heap, so that split
# reads at most %(sample)s rows per side: exact below it, a lower bound ("N+") above it.
STATS_SQL = f"""
WITH RECURSIVE {_QUEUE_PRIORITIES}
SELECT q.queue,
       (SELECT count(*) FROM ({_live_range("<=", "1", "%(cap)s")}) r) AS due_total,
       (SELECT count(*) FROM ({_live_range(">", "1", "%(cap)s")}) r) AS future_total,
       due.seen, due.retrying,
       future.seen, future.leased, future.retrying,
       last.seen, last.leased,
       (SELECT count(*) FROM (
            SELECT 1 FROM pgqueue_dead d WHERE d.queue = q.queue LIMIT %(cap)s + 1) dd),
       -- In seconds, computed here: '-infinity' or a date BC is a valid, very old value.
       (SELECT extract(epoch FROM now())::float8 - extract(epoch FROM min(o.available_at))::float8
        FROM qp CROSS JOIN LATERAL (
            SELECT m.available_at FROM pgqueue_message m
            WHERE m.queue = qp.queue AND m.attempts < m.max_attempts
              AND m.priority = qp.priority AND m.available_at <= now()
            ORDER BY m.available_at LIMIT 1) o
        WHERE qp.queue = q.queue),
       {_window_count("pgqueue_archive", "finished_at", 5)},
       {_window_count("pgqueue_archive", "finished_at", 60)},
       failures.failed5, failures.failed60, failures.walked,
       now()
FROM unnest(%(queues)s::text[]) AS q(queue)
CROSS JOIN LATERAL (
    SELECT count(*) AS seen,
           count(*) FILTER (WHERE r.lease_token IS NULL AND r.attempts > 0) AS retrying
    FROM ({_live_range("<=", "m.lease_token, m.attempts", "%(sample)s")}) r
) due
CROSS JOIN LATERAL (
    SELECT count(*) AS seen,
           count(*) FILTER (WHERE f.lease_token IS NOT NULL) AS leased,
           count(*) FILTER (WHERE f.lease_token IS NULL AND f.attempts > 0) AS retrying
    FROM ({_live_range(">", "m.lease_token, m.attempts", "%(sample)s")}) f
) future
CROSS JOIN LATERAL (
    -- Rows past their attempts are leased on their last attempt (or expired, awaiting burial).
    SELECT count(*) AS seen, count(*) FILTER (WHERE e.available_at > now()) AS leased
    FROM (SELECT m.available_at FROM pgqueue_message m
          WHERE m.queue = q.queue AND m.attempts >= m.max_attempts
          LIMIT %(cap)s + 1) e
) last
CROSS JOIN LATERAL (
    -- Where a failed attempt of the last hour can be recorded; ``walked`` tells whether any
    -- of the three walks stopped at its cap (the count is then a lower bound).
    -- Each row's history is read once, for the hour; the 5 minutes from that (short) part.
    SELECT coalesce(sum(jsonb_array_length({_errors_since("h.hour", 5)})), 0) AS failed5,
           coalesce(sum(jsonb_array_length(h.hour)), 0) AS failed60,
           GREATEST(count(*) FILTER (WHERE r.walk = 1), count(*) FILTER (WHERE r.walk = 2),
                    count(*) FILTER (WHERE r.walk = 3)) AS walked
    FROM (
        (SELECT d.errors, 1 AS walk FROM pgqueue_dead d
         WHERE d.queue = q.queue AND d.died_at > now() - interval '60 minutes'
         LIMIT %(failure_rows)s + 1)
        UNION ALL
        (SELECT a.errors, 2 FROM pgqueue_archive a
         WHERE a.queue = q.queue AND a.errors <> '[]'::jsonb
           AND a.finished_at > now() - interval '60 minutes'
         LIMIT %(failure_rows)s + 1)
        UNION ALL
        (SELECT m.errors, 3 FROM pgqueue_message m
         WHERE m.queue = q.queue AND m.errors <> '[]'::jsonb
         LIMIT %(failure_rows)s + 1)
    ) r
    CROSS JOIN LATERAL (SELECT {_errors_since("r.errors", 60)} AS hour) h
) failures
ORDER BY q.queue
"""

# Each table's planner estimate (-1: never vacuumed or analyzed), and its exact size up to
# the cap unless the estimate says it is far bigger: a new table's estimate says nothing. A
# partitioned table (the archive) has no estimate of its own: its partitions' are summed.
SIZES_SQL = """
SELECT t.name, e.estimate,
       CASE WHEN e.estimate < 2 * %(cap)s THEN (
           CASE t.name
               WHEN 'live' THEN (SELECT count(*) FROM (
                   SELECT 1 FROM pgqueue_message LIMIT %(cap)s + 1) x)
               WHEN 'archive' THEN (SELECT count(*) FROM (
                   SELECT 1 FROM pgqueue_archive LIMIT %(cap)s + 1) x)
               ELSE (SELECT count(*) FROM (SELECT 1 FROM pgqueue_dead LIMIT %(cap)s + 1) x)
           END) END
FROM (VALUES ('live', 'pgqueue_message'), ('archive', 'pgqueue_archive'),
             ('dead', 'pgqueue_dead')) AS t(name, relation)
JOIN pg_class c ON c.oid = to_regclass(t.relation)
CROSS JOIN LATERAL (
    SELECT CASE WHEN c.relkind <> 'p' THEN c.reltuples::bigint
           ELSE (SELECT coalesce(sum(p.reltuples) FILTER (WHERE p.reltuples >= 0), -1)::bigint
                 FROM pg_inherits i JOIN pg_class p ON p.oid = i.inhrelid
                 WHERE i.inhparent = c.oid) END
) AS e(estimate)
"""

# Timestamps outside Python's range come as NULL; the age is seconds computed here.
WORKERS_SQL = """
SELECT worker_id, hostname, pid, queues, concurrency,
       CASE WHEN started_at BETWEEN %(low)s AND %(high)s THEN started_at END,
       CASE WHEN last_seen_at BETWEEN %(low)s AND %(high)s THEN last_seen_at END,
       extract(epoch FROM now())::float8 - extract(epoch FROM last_seen_at)::float8, stats
FROM pgqueue_worker
WHERE last_seen_at > now() - make_interval(secs => %(live_window)s)
ORDER BY worker_id
"""


def _capped(value: int, cap: int) -> CappedCount:
    return CappedCount(min(value, cap), value > cap)


def _part(value: int, seen: int, cap: int) -> CappedCount:
    """One class of rows counted inside a capped walk: a lower bound when the walk stopped."""
    return CappedCount(min(value, cap), seen > cap)


def _json(value: Any) -> Any:
    """Django reads jsonb as text through raw cursors (its fields decode it themselves);
    None for what Python cannot decode."""
    if isinstance(value, bytes):
        value = value.decode()
    if not isinstance(value, str):
        return value
    decoded, ok = decode_json(value)
    return decoded if ok else None


def _age(seconds: float | None) -> dt.timedelta | None:
    """An age in seconds as a timedelta, however large (an infinite one included)."""
    if seconds is None:
        return None
    if not math.isfinite(seconds) or seconds >= LONGEST_AGE.total_seconds():
        return LONGEST_AGE if seconds > 0 else dt.timedelta(0)
    return dt.timedelta(seconds=max(seconds, 0.0))


def live_worker_seconds() -> float:
    """How recent a heartbeat must be for its worker to count as alive."""
    return get_settings().HEARTBEAT_INTERVAL * LIVE_WORKER_INTERVALS


def known_queues(*, using: str | None = None) -> list[tuple[str, bool]]:
    """``(queue, paused)`` for every queue with rows, a state row or a live worker."""
    alias = using or get_settings().DATABASE_ALIAS
    with connections[alias].cursor() as cursor:
        cursor.execute(QUEUES_SQL, {"live_window": live_worker_seconds()})
        return [(name, bool(paused)) for name, paused in cursor.fetchall()]


def read_overview(
    *,
    cap: int = COUNT_CAP,
    sample: int = SAMPLE_CAP,
    throughput_cap: int = THROUGHPUT_CAP,
    failure_rows: int = FAILURE_ROWS_CAP,
    using: str | None = None,
) -> Overview:
    """Everything the dashboard shows, in five statements."""
    alias = using or get_settings().DATABASE_ALIAS
    queues = known_queues(using=alias)
    paused = dict(queues)
    params: dict[str, Any] = {
        "queues": list(paused),
        "cap": cap,
        "sample": sample,
        "throughput_cap": throughput_cap,
        "failure_rows": failure_rows,
    }
    low, high = SAFE_TIMESTAMP_RANGE
    with transaction.atomic(using=alias, savepoint=False), connections[alias].cursor() as cursor:
        # JIT compilation costs more than these short index walks; off for this transaction.
        cursor.execute("SET LOCAL jit = off")
        cursor.execute(STATS_SQL, params)
        rows = cursor.fetchall()
        cursor.execute(SIZES_SQL, {"cap": cap})
        size_rows = cursor.fetchall()
        cursor.execute(
            WORKERS_SQL, {"low": low, "high": high, "live_window": live_worker_seconds()}
        )
        worker_rows = cursor.fetchall()
        if not rows:
            cursor.execute("SELECT now()")
            now = cursor.fetchone()[0]
    overview = Overview(now=rows[0][-1] if rows else now)
    for name, estimate, counted in size_rows:
        table = {"live": MESSAGE_TABLE, "archive": ARCHIVE_TABLE, "dead": DEAD_TABLE}[name]
        if estimate >= 0:
            overview.estimated_rows[table] = int(estimate)
        overview.table_sizes[name] = TableSize(
            counted=_capped(counted, cap) if counted is not None else None,
            estimate=int(estimate) if estimate >= 0 else None,
        )
    for row in rows:
        (name, due_total, future_total, due_seen, due_retrying, fut_seen, fut_leased,
         fut_retrying, last_seen, last_leased, dead, oldest_seconds, done5, done60, failed5,
         failed60, failure_rows_walked, now) = row  # fmt: skip
        failures_capped = (failure_rows_walked or 0) > failure_rows
        in_flight = _part(fut_leased, fut_seen, sample) + _part(last_leased, last_seen, cap)
        scheduled = CappedCount(
            max(min(future_total, cap) - fut_leased, 0), future_total > cap or fut_seen > sample
        )
        overview.queues.append(
            QueueOverview(
                name=name,
                paused=paused[name],
                ready=_capped(due_total, cap),
                scheduled=scheduled,
                in_flight=in_flight,
                retrying=_part(due_retrying, due_seen, sample)
                + _part(fut_retrying, fut_seen, sample),
                dead=_capped(dead, cap),
                oldest_ready_age=_age(oldest_seconds),
                processed_5m=_capped(done5, throughput_cap),
                processed_60m=_capped(done60, throughput_cap),
                failed_5m=CappedCount(int(failed5), failures_capped),
                failed_60m=CappedCount(int(failed60), failures_capped),
            )
        )
    for row in worker_rows:
        worker_id, hostname, pid, worker_queues, concurrency, started, seen, ago, stats = row
        worker_queues, stats = _json(worker_queues), _json(stats)
        overview.workers.append(
            WorkerOverview(
                worker_id=worker_id,
                hostname=hostname,
                pid=pid,
                queues=sorted(str(q) for q in worker_queues)
                if isinstance(worker_queues, list)
                else [],
                concurrency=concurrency,
                started_at=started,
                last_seen_at=seen,
                seen_ago=_age(ago) or dt.timedelta(0),
                stats=stats if isinstance(stats, dict) else {},
            )
        )
    return overview
