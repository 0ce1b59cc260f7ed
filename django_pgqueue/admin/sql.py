"""Every statement the admin's pages and ``pgq_status`` send, read without a full ``COUNT(*)``
of any big table (see ``overview.py`` for what each count walks).

Named here so a change to one shows up as one diff, and in ``tests/sql/golden/``.
"""

from __future__ import annotations

from ..counts import (
    DEAD_COUNT,
    LAST_ATTEMPT_LEASES,
    OLDEST_READY_SECONDS,
    QUEUE_PRIORITIES,
    live_range,
)

#: JIT compilation costs more than the dashboard's short index walks; off for its transaction.
JIT_OFF = "SET LOCAL jit = off"

#: Database time, when no queue row brought it along.
NOW = "SELECT now()"


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
WITH RECURSIVE {QUEUE_PRIORITIES}
SELECT q.queue,
       (SELECT count(*) FROM ({live_range("<=", "1", "%(cap)s")}) r) AS due_total,
       (SELECT count(*) FROM ({live_range(">", "1", "%(cap)s")}) r) AS future_total,
       due.seen, due.retrying,
       future.seen, future.leased, future.retrying,
       last.seen, last.leased,
       {DEAD_COUNT},
       {OLDEST_READY_SECONDS},
       {_window_count("pgqueue_archive", "finished_at", 5)},
       {_window_count("pgqueue_archive", "finished_at", 60)},
       failures.failed5, failures.failed60, failures.walked,
       now()
FROM unnest(%(queues)s::text[]) AS q(queue)
CROSS JOIN LATERAL (
    SELECT count(*) AS seen,
           count(*) FILTER (WHERE r.lease_token IS NULL AND r.attempts > 0) AS retrying
    FROM ({live_range("<=", "m.lease_token, m.attempts", "%(sample)s")}) r
) due
CROSS JOIN LATERAL (
    SELECT count(*) AS seen,
           count(*) FILTER (WHERE f.lease_token IS NOT NULL) AS leased,
           count(*) FILTER (WHERE f.lease_token IS NULL AND f.attempts > 0) AS retrying
    FROM ({live_range(">", "m.lease_token, m.attempts", "%(sample)s")}) f
) future
{LAST_ATTEMPT_LEASES}
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
SIZES = """
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
