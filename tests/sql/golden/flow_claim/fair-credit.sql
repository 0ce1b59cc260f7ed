WITH 
reach AS (
    SELECT 0 AS n
),
budget AS (
    SELECT CASE WHEN s.paused OR NOT s.live THEN 0 ELSE %(n)s::int END AS n,
           NOT s.paused AND NOT s.live AS contended
    FROM (SELECT EXISTS (SELECT 1 FROM pgqueue_queue q
                         WHERE q.name = %(queue)s AND q.paused) AS paused,
                 COALESCE(current_setting('pgqueue.claim_ticket', true), '') <> ''
                   AND extract(epoch FROM clock_timestamp()) < %(credit_until)s::float8
                   AS live) s
),
due AS (
    SELECT (SELECT n FROM budget) > 0
           AND (EXISTS (SELECT 1 FROM pgqueue_message
                        WHERE queue = %(queue)s AND fair_order < 0 AND lease_token IS NULL
                          AND attempts < max_attempts AND available_at <= now())
                OR EXISTS (SELECT 1 FROM pgqueue_message
                           WHERE queue = %(queue)s AND fair_order < 0
                             AND lease_token IS NOT NULL AND available_at <= now()
                             AND attempts < max_attempts)) AS waiting
), head AS (
    SELECT id, lease_token, tenant, priority, fair_order AS place FROM pgqueue_message
    WHERE queue = %(queue)s AND fair_order >= 0
    ORDER BY priority DESC, fair_order, id
    LIMIT (SELECT CASE WHEN b.n > 0 AND NOT d.waiting THEN b.n + (SELECT n FROM reach) ELSE 0 END
           FROM budget b CROSS JOIN due d)
    FOR UPDATE SKIP LOCKED
), unplaced AS (
    SELECT EXISTS (SELECT 1 FROM (
               SELECT fair_order FROM pgqueue_message
               WHERE queue = %(queue)s AND attempts < max_attempts AND available_at <= now()
               ORDER BY priority DESC, available_at, id
               LIMIT %(unplaced_window)s) oldest
           WHERE fair_order IS NULL) AS waiting
    WHERE (SELECT n FROM budget) > 0 AND NOT (SELECT waiting FROM due)
      AND NOT EXISTS (SELECT 1 FROM head)
), candidate AS (
    SELECT id, lease_token, true AS locked, tenant, priority, place FROM head
),
exhausted AS (
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
    INSERT INTO pgqueue_dead (message_id, queue, task, payload, priority, tenant, dedup_key, enqueued_at, attempts, max_attempts, errors, reason, details, worker_id, died_at)
    SELECT id, queue, task, payload, priority, tenant, dedup_key, enqueued_at, attempts,
           max_attempts,
           errors || jsonb_build_array(jsonb_build_object(
               'attempt', attempts, 'at', now(), 'started_at', leased_at, 'worker', leased_by,
               'type', 'LeaseExpired',
               'message', 'the lease expired before the worker finished (crash or timeout)')),
           'lease_expired',
           jsonb_build_object(
               'type', 'LeaseExpired',
               'message', format('lease taken by %%s at %%s expired on the last attempt (%%s of %%s)',
                                 leased_by, leased_at, attempts, max_attempts),
               'traceback', ''),
           leased_by, now()
    FROM reaped
    RETURNING message_id, queue, task, attempts, worker_id
), candidates AS (
    SELECT id, lease_token FROM head
), numbered AS (
    -- The claim order, kept: an UPDATE ... FROM returns its rows in join order.
    SELECT id, lease_token, row_number() OVER () AS position FROM candidates
), claimed AS (
    UPDATE pgqueue_message m
    -- (SET reads the row as it was: ``m.lease_token`` is the expired lease's, if any.)
    SET attempts = m.attempts
                   + CASE WHEN m.refund_on_expiry AND m.lease_token IS NOT NULL THEN 0 ELSE 1 END,
        refund_on_expiry = COALESCE(current_setting('pgqueue.refund_on_expiry', true) = 'on',
                                    false),
        lease_token = gen_random_uuid(),
        leased_by = %(worker_id)s,
        leased_at = now(),
        available_at = now() + make_interval(secs => %(visibility_timeout)s),
        fair_order = -1
    FROM numbered c
    -- The rows by primary key, an index condition whatever the plan: joined on ``m.id =
    -- c.id`` alone, a generic plan made while the table was small hash-joins the batch
    -- against a walk of the whole primary key, O(table) per claim once a backlog arrives.
    WHERE m.id = ANY(ARRAY(SELECT id FROM numbered)) AND m.id = c.id
    -- Re-checked on the row version this statement locked: a lease committed by another
    -- worker meanwhile is never taken over, whatever plan found the candidate. Written so
    -- that it does not imply the partial claim index's predicate: a plan made while the
    -- table was small would otherwise look each row up by walking that index.
      AND m.available_at <= statement_timestamp() AND m.attempts - m.max_attempts < 0
    RETURNING m.id, m.queue, m.task, m.payload, m.priority, m.tenant, m.dedup_key, (extract(epoch FROM LEAST(GREATEST(m.enqueued_at, '0001-01-02+00'::timestamptz), '9999-12-30+00'::timestamptz)) * 1000000)::int8, (extract(epoch FROM LEAST(GREATEST(m.available_at, '0001-01-02+00'::timestamptz), '9999-12-30+00'::timestamptz)) * 1000000)::int8, m.attempts, m.max_attempts, m.lease_token, m.leased_by, (extract(epoch FROM LEAST(GREATEST(m.leased_at, '0001-01-02+00'::timestamptz), '9999-12-30+00'::timestamptz)) * 1000000)::int8, c.lease_token IS NOT NULL AS redelivered, c.position
)
SELECT 'claimed' AS outcome, claimed.* FROM claimed
UNION ALL
SELECT 'buried', message_id, queue, task, NULL, NULL, NULL, NULL, NULL, NULL, attempts, NULL,
       NULL, worker_id, NULL, NULL, 0
FROM buried
UNION ALL
SELECT 'contended', NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, 0 FROM budget WHERE contended
UNION ALL
SELECT 'placing', NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, 0 FROM due WHERE waiting
UNION ALL
SELECT 'placing', NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, 0 FROM unplaced WHERE waiting
ORDER BY position
