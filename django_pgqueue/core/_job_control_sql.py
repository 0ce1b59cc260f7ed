"""The statements of job control: unique windows and debounce at enqueue
(``_enqueue_control.py``), handlers' progress (``_progress.py``) and their housekeeping
(``_retention.py``). A plain enqueue, a claim and an ack send none of them.

Database time only: a window's expiry and a debounced start are ``statement_timestamp()``
plus the seconds given, like a delayed enqueue's ``available_at``.
"""

from __future__ import annotations

# -- unique windows ---------------------------------------------------------------------------

# Take the key's window, or tell who holds it. The INSERT takes a free key; ON CONFLICT takes
# over an expired window (its row is locked meanwhile, so two enqueues of one key wait for
# each other, and the second sees the first's window once it commits; a rollback frees it).
# A first row ``(true, ...)``: taken, enqueue the message and record it
# (RECORD_WINDOW_HOLDER). ``(false, holder...)``: held; no row at all: held by a transaction
# that committed after this statement's snapshot, read it with WINDOW_HOLDER.
TAKE_WINDOW = """
WITH taken AS (
    INSERT INTO pgqueue_unique_window AS w (queue, key, expires_at)
    VALUES (%(queue)s, %(key)s,
            statement_timestamp() + make_interval(secs => %(window)s::float8))
    ON CONFLICT (queue, key) DO UPDATE
    SET expires_at = EXCLUDED.expires_at, message_id = NULL, task = NULL, enqueued_at = NULL,
        available_at = NULL
    WHERE w.expires_at <= statement_timestamp()
    RETURNING 1
)
SELECT true, NULL::bigint, NULL::text, NULL::timestamptz, NULL::timestamptz FROM taken
UNION ALL
SELECT false, w.message_id, w.task, w.enqueued_at, w.available_at
FROM pgqueue_unique_window w
WHERE w.queue = %(queue)s AND w.key = %(key)s AND NOT EXISTS (SELECT 1 FROM taken)
"""

WINDOW_HOLDER = """
SELECT false, message_id, task, enqueued_at, available_at FROM pgqueue_unique_window
WHERE queue = %(queue)s AND key = %(key)s
"""

RECORD_WINDOW_HOLDER = """
UPDATE pgqueue_unique_window
SET message_id = %(id)s, task = %(task)s, enqueued_at = %(enqueued_at)s,
    available_at = %(available_at)s
WHERE queue = %(queue)s AND key = %(key)s
"""

# -- debounce ---------------------------------------------------------------------------------

#: Serializes the debounced enqueues of one key until their transactions end (two int4 keys:
#: a lock space apart from the single-key locks retention and periodic jobs take).
DEBOUNCE_LOCK = """
SELECT pg_advisory_xact_lock(hashtext('pgqueue.debounce:' || %(queue)s), hashtext(%(key)s))
"""

# The key's message that has not started (never leased, never snoozed) takes the new payload
# and starts ``debounce`` seconds from now; else a new message is written, scheduled as far
# ahead. The UPDATE is fenced on ``lease_token IS NULL``: against a claim that leased the
# row meanwhile it waits for the claim to commit, re-reads the row, and changes nothing (the
# INSERT then runs). A pushed-back message in a fair queue leaves the fair order (-1) and
# takes a new place when it falls due, as a scheduled one does; ``fair_order`` is -1 for a
# new message in a fair queue, NULL elsewhere. The wake-up is folded in as at enqueue.
DEBOUNCE = """
WITH pushed AS (
    UPDATE pgqueue_message m
    SET payload = %(payload)s::jsonb, headers = %(headers)s::jsonb,
        available_at = statement_timestamp() + make_interval(secs => %(debounce)s::float8),
        fair_order = CASE WHEN m.fair_order IS NULL THEN NULL ELSE -1 END
    WHERE m.id = (SELECT w.id FROM pgqueue_message w
                  WHERE w.queue = %(queue)s AND w.debounce_key = %(key)s
                    AND w.task = %(task)s AND w.lease_token IS NULL AND w.attempts = 0
                    AND w.snoozes = 0
                  ORDER BY w.id DESC LIMIT 1)
      AND m.lease_token IS NULL AND m.attempts = 0 AND m.snoozes = 0
    RETURNING m.id, m.enqueued_at, m.available_at, true AS pushed
), inserted AS (
    INSERT INTO pgqueue_message
        (queue, task, payload, priority, tenant, max_attempts, available_at, debounce_key,
         fair_order, headers)
    SELECT %(queue)s, %(task)s, %(payload)s::jsonb, %(priority)s, %(tenant)s,
           %(max_attempts)s,
           statement_timestamp() + make_interval(secs => %(debounce)s::float8), %(key)s,
           %(fair_order)s::float8, %(headers)s::jsonb
    WHERE NOT EXISTS (SELECT 1 FROM pushed)
    RETURNING id, enqueued_at, available_at, false AS pushed
)
SELECT r.id, r.enqueued_at, r.available_at, r.pushed,
       CASE WHEN %(channel)s::text IS NOT NULL THEN pg_notify(%(channel)s, %(wake)s) END
FROM (SELECT * FROM pushed UNION ALL SELECT * FROM inserted) r
"""

# -- progress ---------------------------------------------------------------------------------

# The latest report of each message in the batch, fenced by its lease token: a message that
# finished, went back to wait, or is held by another worker now is not written. Reads the
# live row by primary key and never writes it.
WRITE_PROGRESS = """
INSERT INTO pgqueue_progress AS p (message_id, done, total, note, updated_at)
SELECT r.id, r.done, r.total, r.note, now()
FROM unnest(%s::bigint[], %s::uuid[], %s::int8[], %s::int8[], %s::text[])
     AS r(id, token, done, total, note)
JOIN pgqueue_message m ON m.id = r.id AND m.lease_token = r.token
ON CONFLICT (message_id) DO UPDATE
SET done = EXCLUDED.done, total = EXCLUDED.total, note = EXCLUDED.note,
    updated_at = EXCLUDED.updated_at
"""

FORGET_PROGRESS = "DELETE FROM pgqueue_progress WHERE message_id = ANY(%s::bigint[])"

# A message's progress while a worker holds it (a released message keeps its row until it
# runs again or leaves the live table, and shows none meanwhile).
READ_PROGRESS = """
SELECT p.message_id, p.done, p.total, p.note, p.updated_at
FROM pgqueue_progress p
JOIN pgqueue_message m ON m.id = p.message_id AND m.lease_token IS NOT NULL
WHERE p.message_id = %s
"""

# The progress of messages a worker holds now (lease unexpired), for pgq_status: the table
# holds a row per message whose handler reported, so it is read whole.
RUNNING_PROGRESS = """
SELECT p.message_id, m.queue, m.task, p.done, p.total, p.note, p.updated_at,
       extract(epoch FROM now() - p.updated_at)::float8
FROM pgqueue_progress p
JOIN pgqueue_message m ON m.id = p.message_id
WHERE m.lease_token IS NOT NULL AND m.available_at > now()
  AND (cardinality(%(queues)s::text[]) = 0 OR m.queue = ANY(%(queues)s::text[]))
ORDER BY p.message_id
LIMIT %(limit)s
"""

# -- housekeeping (retention) -----------------------------------------------------------------

# One batch of expired windows, oldest first; the expiry is checked again on the row deleted,
# so a window an enqueue took over meanwhile stays.
DELETE_EXPIRED_WINDOWS = """
WITH gone AS (
    DELETE FROM pgqueue_unique_window w
    WHERE (w.queue, w.key) IN (SELECT queue, key FROM pgqueue_unique_window
                               WHERE expires_at <= now() ORDER BY expires_at LIMIT %s)
      AND w.expires_at <= now()
    RETURNING 1
)
SELECT count(*) FROM gone
"""

COUNT_EXPIRED_WINDOWS = """
SELECT count(*) FROM (SELECT 1 FROM pgqueue_unique_window WHERE expires_at <= now() LIMIT %s) x
"""

# Progress rows whose message left the live table without its worker deleting them (the
# worker died, an operator moved it, a consumer of its own acked it).
DELETE_ORPHAN_PROGRESS = """
WITH gone AS (
    DELETE FROM pgqueue_progress p
    WHERE p.message_id IN (
        SELECT o.message_id FROM pgqueue_progress o
        WHERE NOT EXISTS (SELECT 1 FROM pgqueue_message m WHERE m.id = o.message_id)
        LIMIT %s)
      AND NOT EXISTS (SELECT 1 FROM pgqueue_message m WHERE m.id = p.message_id)
    RETURNING 1
)
SELECT count(*) FROM gone
"""

COUNT_ORPHAN_PROGRESS = """
SELECT count(*) FROM (
    SELECT 1 FROM pgqueue_progress o
    WHERE NOT EXISTS (SELECT 1 FROM pgqueue_message m WHERE m.id = o.message_id)
    LIMIT %s) x
"""
