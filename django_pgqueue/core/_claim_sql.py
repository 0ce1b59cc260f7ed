"""The claim of each kind of queue, as one whole statement PostgreSQL runs as written.

Every claim has three parts, the same text in all three (``tests/core/test_claim_sql.py``
checks that):

1. the reaper (``exhausted`` .. ``buried``): leases that ran out on their last attempt are
   buried with reason ``lease_expired`` (attempts count at claim, so a message that kills its
   worker every time is not run in a loop), at most 100 per claim to keep it short; but a
   lease that gives its attempt back on expiry gets it back here instead, and runs again;
2. the candidates: what differs between the kinds of queue, up to ``%(batch)s`` messages
   locked ``FOR UPDATE SKIP LOCKED`` in claim order;
3. the lease (``batch`` .. the end): attempts + 1 (+ 0 after a lease that gave its attempt
   back), a fresh fencing token, visible again after the visibility timeout. Rows come back
   tagged ``claimed`` or ``buried`` (so the caller logs both), in claim order, as
   ``_claim.LEASED_COLUMNS`` then ``position``, ``redelivered`` and ``walk_position``: where
   the message was in the walk of its claim order, which the claimer's bounds move up to
   (``_claim_bound.py``). Timestamps travel as integer microseconds since the epoch (parsing
   timestamptz text costs a worker more than the rest of the row), clamped to Python's
   datetime range so that a stored ``'infinity'`` cannot fail every claim of its queue.

The attempt rule: a worker's claim session sets ``pgqueue.refund_on_expiry``
(``_execution.dedicate_to_claims``), so its leases are marked ``refund_on_expiry`` and one so
marked that expires gives its attempt back. A worker runs a redelivered message alone and
clears the mark in a committed statement just before its handler starts
(``_sql.START_ALONE``): when a worker dies, only a message whose handler was running alone
has spent an attempt. Any other claim (``lease()`` called by your code) counts every attempt.

Parameters are named (``%(name)s``): ``queue``, ``batch`` (how many at most), ``worker``,
``visibility_timeout`` (seconds), and per kind the ones its candidates read. Each text is
prepared once per session and run with a generic plan (``_claim._run_claim``).
"""

from __future__ import annotations

# A plain queue, from the head of the claim index
# (``pgq_message_claim (queue, priority DESC, available_at, id) WHERE attempts <
# max_attempts``): an index range scan whose cost does not depend on the backlog.
PLAIN_CLAIM = """
WITH exhausted AS (
    SELECT id, refund_on_expiry AND lease_token IS NOT NULL AS refund FROM pgqueue_message
    WHERE queue = %(queue)s AND attempts >= max_attempts AND available_at <= now()
    ORDER BY available_at
    LIMIT 100
    FOR UPDATE SKIP LOCKED
), refunded AS (
    -- Keeps its lease token: the next claim sees it redelivered (and the worker runs it
    -- alone), and counts that attempt again.
    UPDATE pgqueue_message m SET attempts = m.attempts - 1, refund_on_expiry = false
    WHERE m.id = ANY(ARRAY(SELECT id FROM exhausted WHERE refund))
), reaped AS (
    DELETE FROM pgqueue_message m
    WHERE m.id = ANY(ARRAY(SELECT id FROM exhausted WHERE NOT refund))
    RETURNING m.*
), buried AS (
    INSERT INTO pgqueue_dead
        (message_id, queue, task, payload, priority, tenant, dedup_key, enqueued_at, attempts,
         max_attempts, errors, composed, headers, reason, details, worker_id, died_at)
    SELECT id, queue, task, payload, priority, tenant, dedup_key, enqueued_at, attempts,
           max_attempts,
           errors || jsonb_build_array(jsonb_build_object(
               'attempt', attempts, 'at', now(), 'started_at', leased_at, 'worker', leased_by,
               'type', 'LeaseExpired',
               'message', 'the lease expired before the worker finished (crash or timeout)')),
           composed, headers, 'lease_expired',
           jsonb_build_object(
               'type', 'LeaseExpired',
               'message', format('lease taken by %%s at %%s expired on the last attempt (%%s of %%s)',
                                 leased_by, leased_at, attempts, max_attempts),
               'traceback', ''),
           leased_by, now()
    FROM reaped
    RETURNING message_id, queue, task, attempts, worker_id
), candidates AS (
    SELECT id, lease_token, available_at FROM pgqueue_message
    WHERE queue = %(queue)s AND attempts < max_attempts
      AND available_at <= statement_timestamp()
      AND NOT EXISTS (SELECT 1 FROM pgqueue_queue q WHERE q.name = %(queue)s AND q.paused)
    ORDER BY priority DESC, available_at, id
    LIMIT %(batch)s
    FOR UPDATE SKIP LOCKED
), batch AS (
    -- The batch as one row, in claim order. The lease joins this one row, so it reads the
    -- batch's rows by primary key once, whatever size a generic plan guesses for the batch:
    -- joined row by row to a batch guessed at one row, it would look every id up again for
    -- each row, O(batch²).
    SELECT array_agg(id) AS ids, array_agg(lease_token IS NOT NULL) AS redelivered,
           array_agg(extract(epoch FROM available_at)::float8) AS places
    FROM candidates
), claimed AS (
    UPDATE pgqueue_message m
    -- (SET reads the row as it was: ``m.lease_token`` is the expired lease's, if any.)
    SET attempts = m.attempts
                   + CASE WHEN m.refund_on_expiry AND m.lease_token IS NOT NULL THEN 0 ELSE 1 END,
        refund_on_expiry = COALESCE(current_setting('pgqueue.refund_on_expiry', true) = 'on',
                                    false),
        lease_token = gen_random_uuid(),
        leased_by = %(worker)s,
        leased_at = now(),
        available_at = now() + make_interval(secs => %(visibility_timeout)s),
        fair_order = CASE WHEN m.fair_order IS NULL THEN NULL ELSE -1 END
    FROM batch b
    WHERE m.id = ANY(b.ids)
    -- Re-checked on the row version this statement locked: a lease committed by another
    -- worker meanwhile is never taken over, whatever plan found the candidate. Written so
    -- that it does not imply the partial claim index's predicate: a plan made while the
    -- table was small would otherwise look each row up by walking that index.
      AND m.available_at <= statement_timestamp() AND m.attempts - m.max_attempts < 0
    RETURNING
        m.id, m.queue, m.task, m.payload, m.priority, m.tenant, m.dedup_key,
        (extract(epoch FROM LEAST(GREATEST(m.enqueued_at, '0001-01-02+00'::timestamptz),
                                  '9999-12-30+00'::timestamptz)) * 1000000)::int8,
        (extract(epoch FROM LEAST(GREATEST(m.available_at, '0001-01-02+00'::timestamptz),
                                  '9999-12-30+00'::timestamptz)) * 1000000)::int8,
        m.attempts, m.max_attempts, m.lease_token, m.leased_by,
        (extract(epoch FROM LEAST(GREATEST(m.leased_at, '0001-01-02+00'::timestamptz),
                                  '9999-12-30+00'::timestamptz)) * 1000000)::int8,
        m.headers,
        array_position(b.ids, m.id) AS position
)
SELECT 'claimed' AS outcome, claimed.*,
       b.redelivered[claimed.position] AS redelivered, b.places[claimed.position] AS walk_position
FROM claimed, batch b
UNION ALL
SELECT 'buried', message_id, queue, task, NULL, NULL, NULL, NULL, NULL, NULL, attempts, NULL,
       NULL, worker_id, NULL, NULL, 0, NULL, NULL
FROM buried
ORDER BY position
"""

# A plain queue walked from the claimer's lower bounds on ``available_at``
# (``_claim_bound.py``), one per priority level, highest first: each level's walk seeks its
# bound in the claim index, so the entries below it are passed over without being read (a
# single walk across levels could not seek past the ``priority`` column). The levels come in
# the order given and each walk in index order; the outer LIMIT stops the walks, and their
# locks, once the batch is full. ``levels``, ``bounds``: the priority levels and their bounds
# (seconds since the epoch), as array literals.
BOUNDED_CLAIM = """
WITH exhausted AS (
    SELECT id, refund_on_expiry AND lease_token IS NOT NULL AS refund FROM pgqueue_message
    WHERE queue = %(queue)s AND attempts >= max_attempts AND available_at <= now()
    ORDER BY available_at
    LIMIT 100
    FOR UPDATE SKIP LOCKED
), refunded AS (
    -- Keeps its lease token: the next claim sees it redelivered (and the worker runs it
    -- alone), and counts that attempt again.
    UPDATE pgqueue_message m SET attempts = m.attempts - 1, refund_on_expiry = false
    WHERE m.id = ANY(ARRAY(SELECT id FROM exhausted WHERE refund))
), reaped AS (
    DELETE FROM pgqueue_message m
    WHERE m.id = ANY(ARRAY(SELECT id FROM exhausted WHERE NOT refund))
    RETURNING m.*
), buried AS (
    INSERT INTO pgqueue_dead
        (message_id, queue, task, payload, priority, tenant, dedup_key, enqueued_at, attempts,
         max_attempts, errors, composed, headers, reason, details, worker_id, died_at)
    SELECT id, queue, task, payload, priority, tenant, dedup_key, enqueued_at, attempts,
           max_attempts,
           errors || jsonb_build_array(jsonb_build_object(
               'attempt', attempts, 'at', now(), 'started_at', leased_at, 'worker', leased_by,
               'type', 'LeaseExpired',
               'message', 'the lease expired before the worker finished (crash or timeout)')),
           composed, headers, 'lease_expired',
           jsonb_build_object(
               'type', 'LeaseExpired',
               'message', format('lease taken by %%s at %%s expired on the last attempt (%%s of %%s)',
                                 leased_by, leased_at, attempts, max_attempts),
               'traceback', ''),
           leased_by, now()
    FROM reaped
    RETURNING message_id, queue, task, attempts, worker_id
), candidates AS (
    SELECT m.id, m.lease_token, m.available_at
    FROM unnest(%(levels)s::int2[], %(bounds)s::float8[]) AS level(priority, bound)
    CROSS JOIN LATERAL (
        SELECT id, lease_token, available_at FROM pgqueue_message
        WHERE queue = %(queue)s AND priority = level.priority AND attempts < max_attempts
          AND available_at >= to_timestamp(level.bound)
          AND available_at <= statement_timestamp()
        ORDER BY available_at, id
        LIMIT %(batch)s
        FOR UPDATE SKIP LOCKED
    ) m
    WHERE NOT EXISTS (SELECT 1 FROM pgqueue_queue q WHERE q.name = %(queue)s AND q.paused)
    LIMIT %(batch)s
), batch AS (
    -- The batch as one row, in claim order. The lease joins this one row, so it reads the
    -- batch's rows by primary key once, whatever size a generic plan guesses for the batch:
    -- joined row by row to a batch guessed at one row, it would look every id up again for
    -- each row, O(batch²).
    SELECT array_agg(id) AS ids, array_agg(lease_token IS NOT NULL) AS redelivered,
           array_agg(extract(epoch FROM available_at)::float8) AS places
    FROM candidates
), claimed AS (
    UPDATE pgqueue_message m
    -- (SET reads the row as it was: ``m.lease_token`` is the expired lease's, if any.)
    SET attempts = m.attempts
                   + CASE WHEN m.refund_on_expiry AND m.lease_token IS NOT NULL THEN 0 ELSE 1 END,
        refund_on_expiry = COALESCE(current_setting('pgqueue.refund_on_expiry', true) = 'on',
                                    false),
        lease_token = gen_random_uuid(),
        leased_by = %(worker)s,
        leased_at = now(),
        available_at = now() + make_interval(secs => %(visibility_timeout)s),
        fair_order = CASE WHEN m.fair_order IS NULL THEN NULL ELSE -1 END
    FROM batch b
    WHERE m.id = ANY(b.ids)
    -- Re-checked on the row version this statement locked: a lease committed by another
    -- worker meanwhile is never taken over, whatever plan found the candidate. Written so
    -- that it does not imply the partial claim index's predicate: a plan made while the
    -- table was small would otherwise look each row up by walking that index.
      AND m.available_at <= statement_timestamp() AND m.attempts - m.max_attempts < 0
    RETURNING
        m.id, m.queue, m.task, m.payload, m.priority, m.tenant, m.dedup_key,
        (extract(epoch FROM LEAST(GREATEST(m.enqueued_at, '0001-01-02+00'::timestamptz),
                                  '9999-12-30+00'::timestamptz)) * 1000000)::int8,
        (extract(epoch FROM LEAST(GREATEST(m.available_at, '0001-01-02+00'::timestamptz),
                                  '9999-12-30+00'::timestamptz)) * 1000000)::int8,
        m.attempts, m.max_attempts, m.lease_token, m.leased_by,
        (extract(epoch FROM LEAST(GREATEST(m.leased_at, '0001-01-02+00'::timestamptz),
                                  '9999-12-30+00'::timestamptz)) * 1000000)::int8,
        m.headers,
        array_position(b.ids, m.id) AS position
)
SELECT 'claimed' AS outcome, claimed.*,
       b.redelivered[claimed.position] AS redelivered, b.places[claimed.position] AS walk_position
FROM claimed, batch b
UNION ALL
SELECT 'buried', message_id, queue, task, NULL, NULL, NULL, NULL, NULL, NULL, attempts, NULL,
       NULL, worker_id, NULL, NULL, 0, NULL, NULL
FROM buried
ORDER BY position
"""

# A queue with fairness, limits or rates (``_flow_control.py``): the candidates come from the
# flow-control function (``_flow_sql.py``), which takes the queue's settings as JSON
# (``settings``), so one prepared text serves every such queue. ``exact``: count every limit
# and reserve no allowance (a claim inside the caller's transaction); ``levels``, ``bounds``,
# ``after``: the priority levels, their bounds in the fair order and the bounds' ids, as
# array literals (empty: from the head of the fair order). A leased message leaves the fair
# order (``fair_order = -1``) and counts in flight.
FLOW_CLAIM = """
WITH exhausted AS (
    SELECT id, refund_on_expiry AND lease_token IS NOT NULL AS refund FROM pgqueue_message
    WHERE queue = %(queue)s AND attempts >= max_attempts AND available_at <= now()
    ORDER BY available_at
    LIMIT 100
    FOR UPDATE SKIP LOCKED
), refunded AS (
    -- Keeps its lease token: the next claim sees it redelivered (and the worker runs it
    -- alone), and counts that attempt again.
    UPDATE pgqueue_message m SET attempts = m.attempts - 1, refund_on_expiry = false
    WHERE m.id = ANY(ARRAY(SELECT id FROM exhausted WHERE refund))
), reaped AS (
    DELETE FROM pgqueue_message m
    WHERE m.id = ANY(ARRAY(SELECT id FROM exhausted WHERE NOT refund))
    RETURNING m.*
), buried AS (
    INSERT INTO pgqueue_dead
        (message_id, queue, task, payload, priority, tenant, dedup_key, enqueued_at, attempts,
         max_attempts, errors, composed, headers, reason, details, worker_id, died_at)
    SELECT id, queue, task, payload, priority, tenant, dedup_key, enqueued_at, attempts,
           max_attempts,
           errors || jsonb_build_array(jsonb_build_object(
               'attempt', attempts, 'at', now(), 'started_at', leased_at, 'worker', leased_by,
               'type', 'LeaseExpired',
               'message', 'the lease expired before the worker finished (crash or timeout)')),
           composed, headers, 'lease_expired',
           jsonb_build_object(
               'type', 'LeaseExpired',
               'message', format('lease taken by %%s at %%s expired on the last attempt (%%s of %%s)',
                                 leased_by, leased_at, attempts, max_attempts),
               'traceback', ''),
           leased_by, now()
    FROM reaped
    RETURNING message_id, queue, task, attempts, worker_id
), candidates AS (
    SELECT id, lease_token, place
    FROM pgq_flow_candidates(%(queue)s::text, %(batch)s::int, %(exact)s::boolean,
                             %(settings)s::jsonb, %(levels)s::int2[], %(bounds)s::float8[],
                             %(after)s::int8[])
), batch AS (
    -- The batch as one row, in claim order. The lease joins this one row, so it reads the
    -- batch's rows by primary key once, whatever size a generic plan guesses for the batch:
    -- joined row by row to a batch guessed at one row, it would look every id up again for
    -- each row, O(batch²).
    SELECT array_agg(id) AS ids, array_agg(lease_token IS NOT NULL) AS redelivered,
           array_agg(place) AS places
    FROM candidates
), claimed AS (
    UPDATE pgqueue_message m
    -- (SET reads the row as it was: ``m.lease_token`` is the expired lease's, if any.)
    SET attempts = m.attempts
                   + CASE WHEN m.refund_on_expiry AND m.lease_token IS NOT NULL THEN 0 ELSE 1 END,
        refund_on_expiry = COALESCE(current_setting('pgqueue.refund_on_expiry', true) = 'on',
                                    false),
        lease_token = gen_random_uuid(),
        leased_by = %(worker)s,
        leased_at = now(),
        available_at = now() + make_interval(secs => %(visibility_timeout)s),
        fair_order = -1
    FROM batch b
    WHERE m.id = ANY(b.ids)
    -- Re-checked on the row version this statement locked: a lease committed by another
    -- worker meanwhile is never taken over, whatever plan found the candidate. Written so
    -- that it does not imply the partial claim index's predicate: a plan made while the
    -- table was small would otherwise look each row up by walking that index.
      AND m.available_at <= statement_timestamp() AND m.attempts - m.max_attempts < 0
    RETURNING
        m.id, m.queue, m.task, m.payload, m.priority, m.tenant, m.dedup_key,
        (extract(epoch FROM LEAST(GREATEST(m.enqueued_at, '0001-01-02+00'::timestamptz),
                                  '9999-12-30+00'::timestamptz)) * 1000000)::int8,
        (extract(epoch FROM LEAST(GREATEST(m.available_at, '0001-01-02+00'::timestamptz),
                                  '9999-12-30+00'::timestamptz)) * 1000000)::int8,
        m.attempts, m.max_attempts, m.lease_token, m.leased_by,
        (extract(epoch FROM LEAST(GREATEST(m.leased_at, '0001-01-02+00'::timestamptz),
                                  '9999-12-30+00'::timestamptz)) * 1000000)::int8,
        m.headers,
        array_position(b.ids, m.id) AS position
)
SELECT 'claimed' AS outcome, claimed.*,
       b.redelivered[claimed.position] AS redelivered, b.places[claimed.position] AS walk_position
FROM claimed, batch b
UNION ALL
SELECT 'buried', message_id, queue, task, NULL, NULL, NULL, NULL, NULL, NULL, attempts, NULL,
       NULL, worker_id, NULL, NULL, 0, NULL, NULL
FROM buried
ORDER BY position
"""

# The first messages a claim from the head would take, looked at without claiming them
# (the worker's head watcher, ``_claim.look_from_head``): each one's priority,
# ``available_at`` (seconds since the epoch) and id.
HEAD_OF_QUEUE = """
SELECT priority, extract(epoch FROM available_at)::float8, id
FROM pgqueue_message
WHERE queue = %(queue)s AND attempts < max_attempts AND available_at <= statement_timestamp()
ORDER BY priority DESC, available_at, id
LIMIT %(rows)s
"""

# HEAD_OF_QUEUE in a fair queue whose claims walk its fair order from bounds: each message's
# priority, place in that order and id.
FAIR_HEAD_OF_QUEUE = """
SELECT priority, fair_order, id FROM pgqueue_message
WHERE queue = %(queue)s AND fair_order >= 0
ORDER BY priority DESC, fair_order, id
LIMIT %(rows)s
"""
