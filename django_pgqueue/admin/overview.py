"""The numbers on the admin dashboard, read without a full ``COUNT(*)`` of any big table.

Every count here is *capped*: it walks at most ``cap + 1`` entries of an index range and
reports ``capped=True`` when there were more, so a page view costs the same with a thousand
or ten million rows. The ranges are contiguous in the existing indexes:

- live messages, per (queue, priority) found by a skip scan over ``pgq_message_claim``:
  ``available_at <= now()`` (ready) and ``available_at > now()`` (scheduled or leased);
- leases on their last attempt, over the small partial index ``pgq_message_exhausted``;
- ``pgq_dead_died (queue, died_at)`` and ``pgq_archive_finished (queue, finished_at)`` for
  the dead count and the 5 / 60 minute throughput.

The whole dashboard is five statements, however many queues there are.
"""

from __future__ import annotations

import datetime as dt
import json
from dataclasses import dataclass, field
from typing import Any

from django.db import connections, transaction

from ..conf import get_settings
from .display import short_duration

__all__ = [
    "COUNT_CAP",
    "SAMPLE_CAP",
    "THROUGHPUT_CAP",
    "CappedCount",
    "Overview",
    "QueueOverview",
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


@dataclass
class WorkerOverview:
    worker_id: str
    hostname: str
    pid: int | None
    queues: list[str]
    concurrency: int
    started_at: dt.datetime
    last_seen_at: dt.datetime
    seen_ago: dt.timedelta
    stats: dict[str, Any]

    @property
    def seen(self) -> str:
        return short_duration(self.seen_ago)


@dataclass
class Overview:
    now: dt.datetime
    queues: list[QueueOverview] = field(default_factory=list)
    workers: list[WorkerOverview] = field(default_factory=list)
    # pg_class.reltuples: the planner's estimate, refreshed by (auto)vacuum and analyze.
    estimated_rows: dict[str, int] = field(default_factory=dict)


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
       (SELECT min(o.available_at) FROM qp CROSS JOIN LATERAL (
            SELECT m.available_at FROM pgqueue_message m
            WHERE m.queue = qp.queue AND m.attempts < m.max_attempts
              AND m.priority = qp.priority AND m.available_at <= now()
            ORDER BY m.available_at LIMIT 1) o
        WHERE qp.queue = q.queue),
       {_window_count("pgqueue_archive", "finished_at", 5)},
       {_window_count("pgqueue_archive", "finished_at", 60)},
       {_window_count("pgqueue_dead", "died_at", 5)},
       {_window_count("pgqueue_dead", "died_at", 60)},
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
ORDER BY q.queue
"""

ESTIMATES_SQL = """
SELECT relname, GREATEST(reltuples, 0)::bigint FROM pg_class
WHERE relname = ANY(ARRAY['pgqueue_message', 'pgqueue_archive', 'pgqueue_dead'])
  AND relkind IN ('r', 'p')
"""

WORKERS_SQL = """
SELECT worker_id, hostname, pid, queues, concurrency, started_at, last_seen_at,
       now() - last_seen_at, stats
FROM pgqueue_worker
WHERE last_seen_at > now() - make_interval(secs => %s)
ORDER BY worker_id
"""


def _capped(value: int, cap: int) -> CappedCount:
    return CappedCount(min(value, cap), value > cap)


def _part(value: int, seen: int, cap: int) -> CappedCount:
    """One class of rows counted inside a capped walk: a lower bound when the walk stopped."""
    return CappedCount(min(value, cap), seen > cap)


def _json(value: Any) -> Any:
    """Django reads jsonb as text through raw cursors (its fields decode it themselves)."""
    return json.loads(value) if isinstance(value, str | bytes) else value


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
    }
    with transaction.atomic(using=alias, savepoint=False), connections[alias].cursor() as cursor:
        # JIT compilation costs more than these short index walks; off for this transaction.
        cursor.execute("SET LOCAL jit = off")
        cursor.execute(STATS_SQL, params)
        rows = cursor.fetchall()
        cursor.execute(ESTIMATES_SQL)
        estimates = {name: int(count) for name, count in cursor.fetchall()}
        cursor.execute(WORKERS_SQL, [live_worker_seconds()])
        worker_rows = cursor.fetchall()
        if not rows:
            cursor.execute("SELECT now()")
            now = cursor.fetchone()[0]
    overview = Overview(now=rows[0][-1] if rows else now, estimated_rows=estimates)
    for row in rows:
        (name, due_total, future_total, due_seen, due_retrying, fut_seen, fut_leased,
         fut_retrying, last_seen, last_leased, dead, oldest, done5, done60, failed5, failed60,
         now) = row  # fmt: skip
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
                oldest_ready_age=(now - oldest) if oldest is not None else None,
                processed_5m=_capped(done5, throughput_cap),
                processed_60m=_capped(done60, throughput_cap),
                failed_5m=_capped(failed5, throughput_cap),
                failed_60m=_capped(failed60, throughput_cap),
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
                queues=list(worker_queues) if isinstance(worker_queues, list) else [],
                concurrency=concurrency,
                started_at=started,
                last_seen_at=seen,
                seen_ago=ago,
                stats=stats if isinstance(stats, dict) else {},
            )
        )
    return overview
