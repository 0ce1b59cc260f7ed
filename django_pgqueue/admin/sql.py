"""Every statement the admin's pages and ``pgq_status`` send, read without a full ``COUNT(*)``
of any big table (see ``overview.py`` for what each count walks).

Named here so a change to one shows up as one diff, and in ``tests/sql/golden/``.
"""

from __future__ import annotations

#: JIT compilation costs more than the dashboard's short index walks; off for its transaction.
JIT_OFF = "SET LOCAL jit = off"

#: Database time, when no queue row brought it along.
NOW = "SELECT now()"


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
QUEUES = f"""
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
STATS = f"""
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
# the cap unless the estimate says it is far bigger: a new table's estimate says nothing.
SIZES = """
SELECT t.name, c.reltuples::bigint,
       CASE WHEN c.reltuples < 2 * %(cap)s THEN (
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
"""

# Timestamps outside Python's range come as NULL; the age is seconds computed here.
WORKERS = """
SELECT worker_id, hostname, pid, queues, concurrency,
       CASE WHEN started_at BETWEEN %(low)s AND %(high)s THEN started_at END,
       CASE WHEN last_seen_at BETWEEN %(low)s AND %(high)s THEN last_seen_at END,
       extract(epoch FROM now())::float8 - extract(epoch FROM last_seen_at)::float8, stats
FROM pgqueue_worker
WHERE last_seen_at > now() - make_interval(secs => %(live_window)s)
ORDER BY worker_id
"""


#: ``pgq_status``: the newest dead rows of each queue (at most %(cap)s), counted by reason.
DEAD_BY_REASON = """
SELECT q.queue, r.reason, count(*)
FROM unnest(%(queues)s::text[]) AS q(queue)
CROSS JOIN LATERAL (
    SELECT d.reason FROM pgqueue_dead d
    WHERE d.queue = q.queue
    ORDER BY d.died_at DESC
    LIMIT %(cap)s
) r
GROUP BY q.queue, r.reason
ORDER BY q.queue, r.reason
"""
