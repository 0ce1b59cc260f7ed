"""Capped counts of the queue tables: the building blocks of the admin dashboard
(``admin/overview.py``), ``pgq_status`` and the metrics' queue gauges (``metrics/queues.py``).

Every count here walks at most ``cap + 1`` entries of an index range and reports
``capped=True`` when there were more, so it costs the same with a thousand or ten million
rows. Live messages are walked per (queue, priority), found by a skip scan over
``pgq_message_claim``, on either side of now(): ``available_at <= now()`` (ready) and
``available_at > now()`` (scheduled or leased); leases on their last attempt over the small
partial index ``pgq_message_exhausted``; dead messages over ``pgq_dead_died``.

Outside the admin package, so that a project without ``django.contrib.admin`` can serve the
metrics.
"""

from __future__ import annotations

from dataclasses import dataclass

from django.db import connections

from .conf import get_settings

# States are counted up to this many rows per queue; above it the page shows "10,000+".
COUNT_CAP = 10_000
# Whether a live row is leased or has failed before is read from the heap for this many rows
# per queue and side of now(); beyond it those counts are lower bounds.
SAMPLE_CAP = 1_000
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
QUEUE_PRIORITIES = """
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


def live_range(comparison: str, columns: str, cap: str) -> str:
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


# Per queue ``q.queue`` of a query that has the ``qp`` CTE (QUEUE_PRIORITIES).
DEAD_COUNT = """(SELECT count(*) FROM (
            SELECT 1 FROM pgqueue_dead d WHERE d.queue = q.queue LIMIT %(cap)s + 1) dd)"""
# In seconds, computed here: '-infinity' or a date BC is a valid, very old value.
OLDEST_READY_SECONDS = """(
        SELECT extract(epoch FROM now())::float8 - extract(epoch FROM min(o.available_at))::float8
        FROM qp CROSS JOIN LATERAL (
            SELECT m.available_at FROM pgqueue_message m
            WHERE m.queue = qp.queue AND m.attempts < m.max_attempts
              AND m.priority = qp.priority AND m.available_at <= now()
            ORDER BY m.available_at LIMIT 1) o
        WHERE qp.queue = q.queue)"""
LAST_ATTEMPT_LEASES = """CROSS JOIN LATERAL (
    -- Rows past their attempts are leased on their last attempt (or expired, awaiting burial).
    SELECT count(*) AS seen, count(*) FILTER (WHERE e.available_at > now()) AS leased
    FROM (SELECT m.available_at FROM pgqueue_message m
          WHERE m.queue = q.queue AND m.attempts >= m.max_attempts
          LIMIT %(cap)s + 1) e
) last"""


def split_future(
    future_total: int, fut_seen: int, fut_leased: int, last_seen: int, last_leased: int,
    *, cap: int, sample: int,
) -> tuple[CappedCount, CappedCount]:  # fmt: skip
    """``(scheduled, in flight)`` from the walks of the future side and of the last attempts."""
    in_flight = capped_part(fut_leased, fut_seen, sample) + capped_part(last_leased, last_seen, cap)
    scheduled = CappedCount(
        max(min(future_total, cap) - fut_leased, 0), future_total > cap or fut_seen > sample
    )
    return scheduled, in_flight


def capped_count(value: int, cap: int) -> CappedCount:
    return CappedCount(min(value, cap), value > cap)


def capped_part(value: int, seen: int, cap: int) -> CappedCount:
    """One class of rows counted inside a capped walk: a lower bound when the walk stopped."""
    return CappedCount(min(value, cap), seen > cap)


def live_worker_seconds() -> float:
    """How recent a heartbeat must be for its worker to count as alive."""
    return get_settings().HEARTBEAT_INTERVAL * LIVE_WORKER_INTERVALS


def known_queues(*, using: str | None = None) -> list[tuple[str, bool]]:
    """``(queue, paused)`` for every queue with rows, a state row or a live worker."""
    alias = using or get_settings().DATABASE_ALIAS
    with connections[alias].cursor() as cursor:
        cursor.execute(QUEUES_SQL, {"live_window": live_worker_seconds()})
        return [(name, bool(paused)) for name, paused in cursor.fetchall()]
