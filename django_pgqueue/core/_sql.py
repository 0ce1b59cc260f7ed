"""The hot-path SQL statements but the claims (``_claim_sql.py``), named and readable.

Rules these follow:
- database time only (``now()`` is the transaction's start; claims are short transactions);
- each move between the live, archive and dead tables is ONE statement
  (``WITH moved AS (DELETE ... RETURNING ...) INSERT ...``), so a crash cannot leave a
  message in two tables or in none;
- completions and failures are fenced by ``(id, lease_token)`` pairs: a worker whose lease
  expired and was taken over changes nothing;
- batch inputs travel as arrays: one round trip for N messages.
"""

from __future__ import annotations

# Columns every table shares (see models.MessageFields).
SHARED_COLUMNS = (
    "queue, task, payload, priority, tenant, dedup_key, enqueued_at, attempts, max_attempts, errors,"
    " composed, headers"
)

# The single-row enqueues, one per (fair queue?, dedup key?), each one statement with its
# wake-up folded in: Postgres delivers a NOTIFY only on commit and merges identical ones of
# one transaction, so N enqueues in one transaction send one. Parameters: ``queue``,
# ``task``, ``payload`` (JSON text), ``headers`` (JSON text or NULL), ``priority``, ``tenant``, ``dedup_key``,
# ``max_attempts``, ``composed`` (a batch member), ``run_at`` (NULL: ``delay`` seconds from the
# statement's time), in a fair queue ``step`` (1 / the tenant's weight), and the wake-up's ``channel`` (NULL: none) and
# ``wake`` (its payload). A message is available at the same instant as its ``enqueued_at``
# when neither is given. ON CONFLICT only when the message has a dedup key: with it Postgres
# inserts speculatively (an extra WAL record and a recheck per row), even for rows the
# partial unique index does not cover.
ENQUEUE = """
WITH inserted AS (
    INSERT INTO pgqueue_message
        (queue, task, payload, priority, tenant, dedup_key, max_attempts, composed, headers,
         available_at)
    VALUES
        (%(queue)s, %(task)s, %(payload)s::jsonb, %(priority)s, %(tenant)s, %(dedup_key)s,
         %(max_attempts)s, %(composed)s, %(headers)s::jsonb,
         COALESCE(%(run_at)s::timestamptz,
                  statement_timestamp() + make_interval(secs => %(delay)s::float8)))
    RETURNING id, enqueued_at, available_at
)
SELECT id, enqueued_at, available_at,
       CASE WHEN %(channel)s::text IS NOT NULL THEN pg_notify(%(channel)s, %(wake)s) END
FROM inserted
"""

ENQUEUE_DEDUP = """
WITH inserted AS (
    INSERT INTO pgqueue_message
        (queue, task, payload, priority, tenant, dedup_key, max_attempts, composed, headers,
         available_at)
    VALUES
        (%(queue)s, %(task)s, %(payload)s::jsonb, %(priority)s, %(tenant)s, %(dedup_key)s,
         %(max_attempts)s, %(composed)s, %(headers)s::jsonb,
         COALESCE(%(run_at)s::timestamptz,
                  statement_timestamp() + make_interval(secs => %(delay)s::float8)))
    ON CONFLICT (queue, dedup_key) WHERE dedup_key IS NOT NULL DO NOTHING
    RETURNING id, enqueued_at, available_at
)
SELECT id, enqueued_at, available_at,
       CASE WHEN %(channel)s::text IS NOT NULL THEN pg_notify(%(channel)s, %(wake)s) END
FROM inserted
"""


# A message's place when it enters its queue's fair order (core/_flow_sql.py): the tenant's
# newest place + its step, or the head of the order when the tenant has none there.
# That is max(the head, the tenant's newest place + its step), since a tenant's places are at
# or after the head; but COALESCE stops at the first that is not NULL, so the head, whose walk
# passes the dead entries of every message claimed since the last vacuum, is probed only for
# a tenant with nothing waiting. The second probe is for messages without a tenant (a
# one-time filter skips it otherwise).
FAIR_ORDER_ENTRY = """COALESCE(
    (SELECT t.fair_order + {step} FROM pgqueue_message t
     WHERE t.queue = {queue} AND t.tenant = {tenant} AND t.priority = {priority}
       AND t.fair_order >= 0
     ORDER BY t.fair_order DESC LIMIT 1),
    (SELECT t.fair_order + {step} FROM pgqueue_message t
     WHERE {tenant} IS NULL AND t.queue = {queue} AND t.tenant IS NULL
       AND t.priority = {priority} AND t.fair_order >= 0
     ORDER BY t.fair_order DESC LIMIT 1),
    (SELECT h.fair_order FROM pgqueue_message h
     WHERE h.queue = {queue} AND h.priority = {priority} AND h.fair_order >= 0
     ORDER BY h.fair_order LIMIT 1),
    0)"""


# In a fair queue the message takes its place in the fair order at once when it is ready,
# -1 (outside the order until it falls due) when scheduled.
_ENTRY_OF_V = FAIR_ORDER_ENTRY.format(
    queue="v.queue", priority="v.priority", tenant="v.tenant", step="v.step"
)
_FAIR_VALUES = """(SELECT %(queue)s::text AS queue, %(task)s::text AS task,
             %(payload)s::text AS payload, %(priority)s::smallint AS priority,
             %(tenant)s::text AS tenant, %(dedup_key)s::text AS dedup_key,
             %(max_attempts)s::int AS max_attempts, %(headers)s::text AS headers,
             COALESCE(%(run_at)s::timestamptz,
                      statement_timestamp() + make_interval(secs => %(delay)s::float8))
                 AS available_at,
             %(step)s::float8 AS step) v"""

ENQUEUE_FAIR = f"""
WITH inserted AS (
    INSERT INTO pgqueue_message
        (queue, task, payload, priority, tenant, dedup_key, max_attempts, composed,
         headers, available_at, fair_order)
    SELECT v.queue, v.task, v.payload::jsonb, v.priority, v.tenant, v.dedup_key,
           v.max_attempts, %(composed)s, v.headers::jsonb, v.available_at,
           CASE WHEN v.available_at <= statement_timestamp() THEN {_ENTRY_OF_V} ELSE -1 END
    FROM {_FAIR_VALUES}
    RETURNING id, enqueued_at, available_at
)
SELECT id, enqueued_at, available_at,
       CASE WHEN %(channel)s::text IS NOT NULL THEN pg_notify(%(channel)s, %(wake)s) END
FROM inserted
"""

ENQUEUE_FAIR_DEDUP = f"""
WITH inserted AS (
    INSERT INTO pgqueue_message
        (queue, task, payload, priority, tenant, dedup_key, max_attempts, composed,
         headers, available_at, fair_order)
    SELECT v.queue, v.task, v.payload::jsonb, v.priority, v.tenant, v.dedup_key,
           v.max_attempts, %(composed)s, v.headers::jsonb, v.available_at,
           CASE WHEN v.available_at <= statement_timestamp() THEN {_ENTRY_OF_V} ELSE -1 END
    FROM {_FAIR_VALUES}
    ON CONFLICT (queue, dedup_key) WHERE dedup_key IS NOT NULL DO NOTHING
    RETURNING id, enqueued_at, available_at
)
SELECT id, enqueued_at, available_at,
       CASE WHEN %(channel)s::text IS NOT NULL THEN pg_notify(%(channel)s, %(wake)s) END
FROM inserted
"""

FIND_BY_DEDUP_KEY = """
SELECT id, enqueued_at, available_at FROM pgqueue_message
WHERE queue = %(queue)s AND dedup_key = %(dedup_key)s
"""

# Bulk rows (``_bulk.py``: enqueue_many() and the pipeline's partitions): COPY. The columns
# every row shares come first, the payload, then those that may differ from row to row;
# ``available_at`` is a time or ``now``, which PostgreSQL reads as the transaction's start.
BULK_COPY = """
COPY pgqueue_message (queue, task, max_attempts, available_at, headers, payload, priority, tenant,
                      dedup_key, fair_order) FROM STDIN
"""

# Which of the keys (a JSON array of strings, cheaper to send than a text[]) live messages of
# the queue hold: once a COPY met one, enqueue_many() leaves those rows out. One probe of the
# dedup index per key (LIMIT keeps each probe a nested index lookup): a bulk load that
# autovacuum has not analyzed yet otherwise makes the planner scan every key of the queue,
# or hash them all.
HELD_DEDUP_KEYS = """
SELECT k.key FROM jsonb_array_elements_text(%s::jsonb) AS k(key),
LATERAL (SELECT FROM pgqueue_message m WHERE m.queue = %s AND m.dedup_key = k.key LIMIT 1) held
"""

# Bulk rows when their COPY met a dedup key a live message holds: the same rows, skipping
# each such key; how many were written, and the wake-up (``channel`` NULL: none) only when
# there was one. A column NULL in every row is passed as NULL: ROWS FROM pads it.
BULK_INSERT_SKIPPING_HELD_KEYS = """
WITH written AS (
    INSERT INTO pgqueue_message
        (queue, task, max_attempts, available_at, headers, payload, priority, tenant, dedup_key,
         fair_order)
    SELECT %(queue)s, %(task)s, %(max_attempts)s, %(available_at)s::timestamptz,
           %(headers)s::jsonb, t.payload::jsonb, t.priority, t.tenant, t.dedup_key, t.fair_order
    FROM ROWS FROM (unnest(%(payloads)s::text[]), unnest(%(priorities)s::smallint[]),
                    unnest(%(tenants)s::text[]), unnest(%(keys)s::text[]),
                    unnest(%(places)s::float8[]))
         AS t(payload, priority, tenant, dedup_key, fair_order)
    ON CONFLICT (queue, dedup_key) WHERE dedup_key IS NOT NULL DO NOTHING
    RETURNING 1
)
SELECT count(*),
       CASE WHEN count(*) > 0 AND %(channel)s::text IS NOT NULL
            THEN pg_notify(%(channel)s, %(wake)s) END
FROM written
"""

# enqueue_many() with a delay: when its rows become available, by database time.
AVAILABLE_AFTER = "SELECT now() + make_interval(secs => %s::float8)"

# When a bulk enqueue into a fair queue becomes available, and the first message's place in
# the fair order (-1 when scheduled); the others follow it a step apart. Its wake-up is
# folded in, as in the single-row statements (``channel`` NULL: none).
FAIR_ORDER_OF_BULK = f"""
SELECT v.available_at,
       CASE WHEN v.available_at <= statement_timestamp() THEN {_ENTRY_OF_V} ELSE -1 END,
       CASE WHEN %(channel)s::text IS NOT NULL THEN pg_notify(%(channel)s, %(wake)s) END
FROM (SELECT %(queue)s::text AS queue, %(priority)s::smallint AS priority,
             %(tenant)s::text AS tenant, %(step)s::float8 AS step,
             COALESCE(%(run_at)s::timestamptz,
                      statement_timestamp() + make_interval(secs => %(delay)s::float8))
                 AS available_at) v
"""

NOTIFY_QUEUES = "SELECT pg_notify(%s, queue) FROM unnest(%s::text[]) AS q(queue)"

# The acknowledgements below take their batch as arrays (``batch``, inlined: its arrays are
# the statement's parameters) and find their rows by ``m.id = ANY(b.ids)``: an index
# condition on the primary key in any plan, with no join. Each is prepared once per session
# with a generic plan; a join of the table with the batch, planned while the table held a few
# rows (a drained queue after a vacuum), may walk the whole primary key for every batch once
# a backlog arrives, and one planned on a backlog may match every row against every pair in
# a join filter. A row is one of the batch's leases when the id paired with its current
# lease token is its own: the token fences it, and the token's position finds its values.
# ``array_position`` finds NULL too, so a row that is not leased is ruled out first.
LEASE_IN_BATCH = (
    "m.id = ANY(b.ids) AND m.lease_token IS NOT NULL"
    " AND b.ids[array_position(b.tokens, m.lease_token)] = m.id"
)

# Completed -> archive, fenced by lease token. Results travel as JSON text (NULL allowed).
COMPLETE = f"""
WITH batch AS NOT MATERIALIZED (
    SELECT %s::bigint[] AS ids, %s::uuid[] AS tokens, %s::text[] AS results
), done AS (
    DELETE FROM pgqueue_message m
    USING batch b
    WHERE {LEASE_IN_BATCH}
    RETURNING m.*, b.results[array_position(b.tokens, m.lease_token)] AS result
)
INSERT INTO pgqueue_archive
    (message_id, {SHARED_COLUMNS}, started_at, finished_at, worker_id, result)
SELECT id, {SHARED_COLUMNS}, leased_at, now(), leased_by, result::jsonb
FROM done
RETURNING message_id
"""

#: A message's error history keeps the errors of its first and last this many attempts and,
#: between them, ``{"omitted": n}`` counting the ones dropped: a message that fails for ever
#: stays a row of bounded size (and a bounded admin page).
ERROR_HISTORY_ENDS = 10


def history_with(history: str, entry: str) -> str:
    """SQL: the error history ``history`` with ``entry`` appended, cut to its ends (both are
    SQL expressions)."""
    return history_cut(f"{history} || jsonb_build_array({entry})")


def history_cut(errors: str) -> str:
    """SQL: the error history ``errors`` (an array expression) cut to its first and last
    :data:`ERROR_HISTORY_ENDS` entries, with ``{"omitted": n}`` between them. An earlier
    cut's count, right after the first end, adds to ``n``; a shorter history is unchanged."""
    ends = ERROR_HISTORY_ENDS
    return f"""(
        SELECT CASE WHEN c.omitted = 0 AND c.entries <= {2 * ends} THEN c.errors
                    ELSE jsonb_path_query_array(c.errors, '$[0 to {ends - 1}]')
                         || jsonb_build_array(jsonb_build_object(
                                'omitted', c.omitted + c.entries - {2 * ends}))
                         || jsonb_path_query_array(c.errors, '$[last - {ends - 1} to last]')
               END
        FROM (SELECT a.errors, d.omitted,
                     jsonb_array_length(a.errors) - (d.omitted > 0)::int AS entries
              FROM (SELECT {errors} AS errors) a
              CROSS JOIN LATERAL (
                  SELECT CASE WHEN jsonb_typeof(a.errors -> {ends} -> 'omitted') = 'number'
                              THEN GREATEST(LEAST((a.errors -> {ends} ->> 'omitted')::numeric,
                                                  1e15), 0)::bigint
                              ELSE 0 END AS omitted) d) c)"""


# A failed attempt: back off while attempts remain (and the failure is retryable), else
# bury with its reason. Fenced by lease token; ``delay`` is seconds added to database time.
# A buried row comes back with the reason it was buried with (``cancelled`` may override
# the caller's).
FAIL = f"""
WITH batch AS NOT MATERIALIZED (
    SELECT %s::bigint[] AS ids, %s::uuid[] AS tokens, %s::text[] AS errors,
           %s::text[] AS final_reasons, %s::float8[] AS delays
), target AS (
    -- Each error records when its attempt started and failed (database time), unless the
    -- caller set them: the Tasks backend reports a task's first start from this history.
    SELECT m.id, m.queue, m.fair_order,
           jsonb_build_object('started_at', m.leased_at, 'at', now()) || b.errors[at]::jsonb
               AS error,
           -- A message flagged by cancel() while it ran is never retried.
           CASE WHEN m.cancel_requested_at IS NULL THEN b.final_reasons[at] ELSE 'cancelled' END
               AS final_reason,
           b.delays[at] AS delay,
           (b.delays[at] IS NOT NULL AND m.attempts < m.max_attempts
            AND m.cancel_requested_at IS NULL) AS retry
    FROM pgqueue_message m
    CROSS JOIN batch b
    CROSS JOIN LATERAL array_position(b.tokens, m.lease_token) AS at
    WHERE m.id = ANY(b.ids) AND m.lease_token IS NOT NULL AND b.ids[at] = m.id
    FOR UPDATE OF m
), retried AS (
    UPDATE pgqueue_message m
    SET available_at = now() + make_interval(secs => t.delay),
        lease_token = NULL, leased_by = NULL, leased_at = NULL,
        last_error = t.error,
        errors = {history_with("m.errors", "t.error")}
    FROM target t
    WHERE m.id = ANY(ARRAY(SELECT id FROM target WHERE retry)) AND m.id = t.id AND t.retry
    RETURNING m.id
), removed AS (
    DELETE FROM pgqueue_message m USING target t
    WHERE m.id = ANY(ARRAY(SELECT id FROM target WHERE NOT retry)) AND m.id = t.id
      AND NOT t.retry
    RETURNING m.*, t.error, t.final_reason
), buried AS (
    INSERT INTO pgqueue_dead
        (message_id, {SHARED_COLUMNS}, reason, details, worker_id, died_at)
    SELECT id, queue, task, payload, priority, tenant, dedup_key, enqueued_at, attempts,
           max_attempts, {history_with("removed.errors", "removed.error")}, composed, headers,
           final_reason, error, leased_by, now()
    FROM removed
    RETURNING message_id, reason
)
SELECT id, 'retried', NULL FROM retried
UNION ALL
SELECT message_id, 'buried', reason FROM buried
"""

# A handler snoozed (``django_pgqueue.Snooze``): the message waits ``delay`` seconds and runs
# again, the attempt counted at claim given back and a snooze counted instead, while it has
# snoozed fewer than its limit times and cancel() has not flagged it. The others come back
# still leased, with why ('limit', 'cancelled'): the caller buries them (``FAIL``). Fenced by
# lease token. In a fair queue the claim took the message out of the fair order (-1): it
# takes a new place when it falls due, as a retried one does.
SNOOZE = """
WITH batch AS NOT MATERIALIZED (
    SELECT %s::bigint[] AS ids, %s::uuid[] AS tokens, %s::float8[] AS delays,
           %s::int[] AS limits
), target AS (
    SELECT m.id, b.delays[at] AS delay,
           CASE WHEN m.cancel_requested_at IS NOT NULL THEN 'cancelled'
                WHEN m.snoozes >= b.limits[at] THEN 'limit' END AS refused
    FROM pgqueue_message m
    CROSS JOIN batch b
    CROSS JOIN LATERAL array_position(b.tokens, m.lease_token) AS at
    WHERE m.id = ANY(b.ids) AND m.lease_token IS NOT NULL AND b.ids[at] = m.id
    FOR UPDATE OF m
), snoozed AS (
    UPDATE pgqueue_message m
    SET available_at = now() + make_interval(secs => t.delay),
        lease_token = NULL, leased_by = NULL, leased_at = NULL,
        attempts = GREATEST(m.attempts - 1, 0), snoozes = m.snoozes + 1
    FROM target t
    WHERE m.id = ANY(ARRAY(SELECT id FROM target WHERE refused IS NULL)) AND m.id = t.id
      AND t.refused IS NULL
    RETURNING m.id
)
SELECT id, NULL FROM snoozed
UNION ALL
SELECT id, refused FROM target WHERE refused IS NOT NULL
"""

# Lengthen (or shorten) a lease: PGMQ's set_vt, fenced by lease token. Also tells which of
# them cancel() flagged meanwhile (the worker's heartbeat passes that on to the handlers).
EXTEND = f"""
WITH batch AS NOT MATERIALIZED (
    SELECT %s::float8 AS seconds, %s::bigint[] AS ids, %s::uuid[] AS tokens
)
UPDATE pgqueue_message m
SET available_at = now() + make_interval(secs => b.seconds)
FROM batch b
WHERE {LEASE_IN_BATCH}
RETURNING m.id, m.cancel_requested_at IS NOT NULL
"""

# A worker starts the handler of a redelivered message alone (worker/executor.py): from this
# statement's commit on, the lease no longer gives its attempt back if it expires (see "The
# attempt rule" in ``_claim_sql.py``). Fenced by lease token.
START_ALONE = """
UPDATE pgqueue_message SET refund_on_expiry = false
WHERE id = %s AND lease_token = %s
RETURNING id
"""

# Give leases back so the messages run again at once (graceful shutdown past its grace
# period). ``reset_attempt`` takes back the attempt counted at claim: it was not a failure.
RELEASE = f"""
WITH batch AS NOT MATERIALIZED (
    SELECT %s::boolean AS reset_attempt, %s::bigint[] AS ids, %s::uuid[] AS tokens
), released AS (
    UPDATE pgqueue_message m
    SET available_at = now(), lease_token = NULL, leased_by = NULL, leased_at = NULL,
        attempts = CASE WHEN b.reset_attempt THEN GREATEST(m.attempts - 1, 0)
                        ELSE m.attempts END
    FROM batch b
    WHERE {LEASE_IN_BATCH}
    RETURNING m.id, m.queue, m.fair_order
)
SELECT id FROM released
"""

# Operator: release leases by id, whoever holds them (a stuck worker).
RELEASE_BY_ID = """
UPDATE pgqueue_message
SET available_at = now(), lease_token = NULL, leased_by = NULL, leased_at = NULL
WHERE id = ANY(%s) AND lease_token IS NOT NULL
RETURNING id, queue
"""

# Operator: a scheduled or backing-off (not leased) message becomes available now.
RETRY_NOW = """
UPDATE pgqueue_message SET available_at = now()
WHERE id = ANY(%s) AND lease_token IS NULL AND available_at > now()
RETURNING id, queue
"""

# Operator: dead -> live with attempts reset, keeping the message id. Concurrent retries of
# one message: the DELETE locks the row, so exactly one of them moves it. A dead message whose
# dedup key is taken by a live one stays dead (reported, never dropped).
RETRY_DEAD = f"""
WITH revived AS (
    DELETE FROM pgqueue_dead d
    WHERE d.message_id = ANY(%s)
      AND NOT EXISTS (
          SELECT 1 FROM pgqueue_message m
          WHERE m.queue = d.queue AND m.dedup_key = d.dedup_key)
    RETURNING d.*
)
INSERT INTO pgqueue_message (id, {SHARED_COLUMNS}, available_at)
SELECT message_id, queue, task, payload, priority, tenant, dedup_key, enqueued_at, 0,
       max_attempts, errors, composed, headers, now()
FROM revived
RETURNING id, queue
"""

# Operator: live -> dead with reason ``discarded``.
DISCARD = f"""
WITH removed AS (
    DELETE FROM pgqueue_message WHERE id = ANY(%s) RETURNING *
)
INSERT INTO pgqueue_dead (message_id, {SHARED_COLUMNS}, reason, details, worker_id, died_at)
SELECT id, {SHARED_COLUMNS}, 'discarded',
       jsonb_build_object('type', 'Discarded', 'message', %s, 'traceback', ''),
       leased_by, now()
FROM removed
RETURNING message_id
"""

# cancel(): a message no worker holds (never leased, backing off, or its lease expired) goes
# to dead with reason ``cancelled``; one a worker holds is flagged for its handler to see,
# and comes back with that worker's id (``cancel()`` tells it). One statement: the row lock
# taken by ``target`` orders it against a concurrent claim.
CANCEL = f"""
WITH target AS (
    SELECT id, (lease_token IS NOT NULL AND available_at > now()) AS held
    FROM pgqueue_message WHERE id = ANY(%s)
    FOR UPDATE
), removed AS (
    DELETE FROM pgqueue_message m USING target t
    WHERE m.id = t.id AND NOT t.held
    RETURNING m.*
), buried AS (
    INSERT INTO pgqueue_dead (message_id, {SHARED_COLUMNS}, reason, details, worker_id, died_at)
    SELECT id, {SHARED_COLUMNS}, 'cancelled',
           jsonb_build_object('type', 'Cancelled', 'message', %s, 'traceback', ''),
           leased_by, now()
    FROM removed
    RETURNING message_id
), flagged AS (
    UPDATE pgqueue_message m
    SET cancel_requested_at = COALESCE(m.cancel_requested_at, now())
    FROM target t
    WHERE m.id = t.id AND t.held
    RETURNING m.id, m.leased_by
), unwaited AS (
    DELETE FROM pgqueue_waiting w WHERE w.id = ANY(%s) RETURNING w.*
), buried_waiting AS (
    INSERT INTO pgqueue_dead (message_id, {SHARED_COLUMNS}, reason, details, died_at)
    SELECT id, queue, task, payload, priority, tenant, NULL, enqueued_at, 0, max_attempts,
           '[]', true, headers, 'cancelled',
           jsonb_build_object('type', 'Cancelled', 'message', %s, 'traceback', ''), now()
    FROM unwaited
    RETURNING message_id
)
SELECT message_id, 'cancelled', NULL FROM buried
UNION ALL
SELECT id, 'flagged', leased_by FROM flagged
UNION ALL
SELECT message_id, 'cancelled', NULL FROM buried_waiting
"""

# Operator: a copy of an archived message as a new live message (new id, no dedup key).
REQUEUE_ARCHIVED = """
INSERT INTO pgqueue_message (queue, task, payload, priority, tenant, max_attempts, headers)
SELECT queue, task, payload, priority, tenant, max_attempts, headers
FROM pgqueue_archive WHERE id = ANY(%s)
ORDER BY id
RETURNING id, queue
"""

# Every live or waiting message of one queue, deleted; what waited on them in other queues is
# buried (reason ``dependency_failed``): it can no longer run.
PURGE_QUEUE = """
WITH purged AS (
    DELETE FROM pgqueue_message WHERE queue = %(queue)s RETURNING id
), purged_waiting AS (
    DELETE FROM pgqueue_waiting WHERE queue = %(queue)s RETURNING id
)
SELECT array_agg(id) FROM (SELECT id FROM purged UNION ALL SELECT id FROM purged_waiting) p
"""

# Distinct queues holding live messages, as a skip scan over the claim index:
# O(number of queues) index probes instead of a scan of the backlog.
LIVE_QUEUES = """
WITH RECURSIVE q(queue) AS (
    (SELECT queue FROM pgqueue_message WHERE attempts < max_attempts ORDER BY queue LIMIT 1)
    UNION ALL
    SELECT (SELECT m.queue FROM pgqueue_message m
            WHERE m.queue > q.queue AND m.attempts < m.max_attempts
            ORDER BY m.queue LIMIT 1)
    FROM q WHERE q.queue IS NOT NULL
)
SELECT queue FROM q WHERE queue IS NOT NULL
"""

# When the next message of one queue falls due, for the idle worker's sleep. A skip scan
# over the priorities of the claim index, then one probe per priority: O(priorities), not a
# scan of everything scheduled. Leased rows count too: their lease expiry is when they may
# be redelivered. The answer is seconds from now (a float, ``Infinity`` for 'infinity'), not
# a timestamp: a stored time past the year 9999 is no Python datetime, and must not stop the
# worker that reads it.
NEXT_DUE_AT = """
WITH RECURSIVE p(priority) AS (
    (SELECT priority FROM pgqueue_message
     WHERE queue = %(queue)s AND attempts < max_attempts
     ORDER BY priority DESC LIMIT 1)
    UNION ALL
    SELECT (SELECT m.priority FROM pgqueue_message m
            WHERE m.queue = %(queue)s AND m.attempts < m.max_attempts AND m.priority < p.priority
            ORDER BY m.priority DESC LIMIT 1)
    FROM p WHERE p.priority IS NOT NULL
)
SELECT (extract(epoch FROM min((SELECT m.available_at FROM pgqueue_message m
            WHERE m.queue = %(queue)s AND m.attempts < m.max_attempts
              AND m.priority = p.priority AND m.available_at > now()
            ORDER BY m.priority DESC, m.available_at LIMIT 1)))
        - extract(epoch FROM now()))::float8
FROM p WHERE p.priority IS NOT NULL
"""

SET_PAUSED = """
INSERT INTO pgqueue_queue (name, paused, updated_at) VALUES (%s, %s, now())
ON CONFLICT (name) DO UPDATE SET paused = EXCLUDED.paused, updated_at = now()
"""
