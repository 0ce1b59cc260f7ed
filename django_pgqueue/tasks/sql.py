"""Every statement the Tasks backend sends beyond the core's enqueue.

Named here so a change to one shows up as one diff, and in ``tests/sql/golden/``.
"""

from __future__ import annotations

#: One statement, so a row moving between tables meanwhile is still found (one snapshot).
#: A message waiting on its dependencies (a chain's later step) is READY, as a queued one.
#: ``running`` uses database time: a lease that ran out is READY again, whatever the host says.
LOOKUP = """
SELECT 'live', task, payload, priority, queue, enqueued_at, available_at, attempts, errors,
       leased_by, leased_at, (lease_token IS NOT NULL AND available_at > now()),
       NULL::jsonb, NULL::timestamptz, NULL::text
FROM pgqueue_message WHERE id = %(id)s
UNION ALL
SELECT 'archive', task, payload, priority, queue, enqueued_at, NULL, attempts, errors,
       worker_id, started_at, false, result, finished_at, NULL
FROM pgqueue_archive WHERE message_id = %(id)s
UNION ALL
SELECT 'dead', task, payload, priority, queue, enqueued_at, NULL, attempts, errors,
       worker_id, NULL, false, NULL, died_at, reason
FROM pgqueue_dead WHERE message_id = %(id)s
UNION ALL
SELECT 'waiting', task, payload, priority, queue, enqueued_at, NULL, 0, '[]'::jsonb,
       NULL, NULL, false, NULL::jsonb, NULL::timestamptz, NULL::text
FROM pgqueue_waiting WHERE id = %(id)s
LIMIT 1
"""
