"""Every statement the worker sends beyond the core's (claims and acks live in ``core/_sql.py``).

Named here so a change to one shows up as one diff, and in ``tests/sql/golden/``.
"""

from __future__ import annotations

from ..core import _sql as core_sql

#: Ready messages older than a threshold, one per queue: a queue nobody serves (warned about).
STALE_READY = """
SELECT q.queue, (extract(epoch FROM now()) - extract(epoch FROM o.available_at))::float8
FROM unnest(%s::text[]) AS q(queue)
CROSS JOIN LATERAL (
    SELECT m.available_at FROM pgqueue_message m
    WHERE m.queue = q.queue AND m.attempts < m.max_attempts
      AND m.available_at <= now() - make_interval(secs => %s)
    LIMIT 1
) o
WHERE NOT EXISTS (SELECT 1 FROM pgqueue_queue p WHERE p.name = q.queue AND p.paused)
"""

#: The queues a worker without --queue serves: those with messages to run (LIVE_QUEUES), and
#: those holding a lease that ran out on its last attempt, which only a claim on that queue
#: buries (an index skip scan of pgq_message_exhausted).
QUEUES_TO_SERVE = f"""
WITH RECURSIVE live AS ({core_sql.LIVE_QUEUES}), e(queue) AS (
    (SELECT queue FROM pgqueue_message
     WHERE attempts >= max_attempts AND available_at <= now() ORDER BY queue LIMIT 1)
    UNION ALL
    SELECT (SELECT m.queue FROM pgqueue_message m
            WHERE m.queue > e.queue AND m.attempts >= m.max_attempts AND m.available_at <= now()
            ORDER BY m.queue LIMIT 1)
    FROM e WHERE e.queue IS NOT NULL
)
SELECT queue FROM live UNION SELECT queue FROM e WHERE queue IS NOT NULL ORDER BY 1
"""

#: The worker's row, beat by beat; ``last_seen_at`` is database time, like every other clock.
#: The last parameter is true on the first beat of a run: a worker restarted under the same
#: id starts its clock again.
HEARTBEAT = """
INSERT INTO pgqueue_worker
    (worker_id, hostname, pid, queues, concurrency, started_at, last_seen_at, stats)
VALUES (%s, %s, %s, %s::jsonb, %s, now(), now(), %s::jsonb)
ON CONFLICT (worker_id) DO UPDATE
SET hostname = EXCLUDED.hostname, pid = EXCLUDED.pid, queues = EXCLUDED.queues,
    concurrency = EXCLUDED.concurrency, last_seen_at = now(), stats = EXCLUDED.stats,
    started_at = CASE WHEN %s THEN now() ELSE pgqueue_worker.started_at END
"""

DELETE_HEARTBEAT = "DELETE FROM pgqueue_worker WHERE worker_id = %s"

#: Names the session in pg_stat_activity (each of the worker's connections says what it is).
SET_APPLICATION_NAME = "SELECT set_config('application_name', %s, false)"

#: The listener's probe: a notification the worker sends itself to prove its listener hears.
PROBE = "SELECT pg_notify(%s, %s)"

#: Which of the worker's leased messages ``cancel()`` flagged (read when a notification says
#: one was).
CANCEL_FLAGS = """
SELECT id FROM pgqueue_message WHERE id = ANY(%s) AND cancel_requested_at IS NOT NULL
"""
