"""Every statement of periodic schedules (``django_pgqueue.periodic``): declaring them, finding
the due ones, and moving a slot on exactly once across workers.

Named here so a change to one shows up as one diff, and in ``tests/sql/golden/``.
"""

from __future__ import annotations

NOW = "SELECT now()"

#: Declares the schedules in code: a new one, or one whose timing, task or queue changed,
#: starts from its next slot after now; the others keep their place.
UPSERT_SCHEDULE = """
INSERT INTO pgqueue_periodic (name, task, queue, spec, next_run_at, paused, updated_at)
VALUES (%s, %s, %s, %s, %s, FALSE, now())
ON CONFLICT (name) DO UPDATE
SET task = EXCLUDED.task, queue = EXCLUDED.queue, spec = EXCLUDED.spec,
    next_run_at = EXCLUDED.next_run_at, updated_at = now()
WHERE (pgqueue_periodic.task, pgqueue_periodic.queue, pgqueue_periodic.spec)
      IS DISTINCT FROM (EXCLUDED.task, EXCLUDED.queue, EXCLUDED.spec)
"""

#: The schedules in code that are not paused: whether due, and how long until they are.
DUE_SCHEDULES = """
SELECT name, next_run_at, next_run_at <= now(),
       extract(epoch FROM next_run_at - now())::float8, now()
FROM pgqueue_periodic
WHERE name = ANY(%s) AND NOT paused
"""

#: The compare-and-set: only the worker that still sees the slot it read moves it on.
ADVANCE = """
UPDATE pgqueue_periodic
SET next_run_at = %s, last_run_at = COALESCE(%s, last_run_at), updated_at = now()
WHERE name = %s AND next_run_at = %s AND NOT paused
RETURNING name
"""

#: A slot's enqueue waits for its commit to be durable: a lost slot would not come back.
SYNCHRONOUS_COMMIT = "SET LOCAL synchronous_commit = on"

#: The message a slot enqueued, for the admin.
RAN_SLOT = "UPDATE pgqueue_periodic SET last_message_id = %s WHERE name = %s"

#: The message "Run now" enqueued, outside the slots.
RAN_NOW = "UPDATE pgqueue_periodic SET last_message_id = %s, updated_at = now() WHERE name = %s"
