WITH 
leases AS (
    SELECT count(*) FILTER (WHERE available_at > now())::int AS held,
           count(*)::int AS members
    FROM pgqueue_message
    WHERE queue = %(queue)s AND lease_token IS NOT NULL AND fair_order < 0 AND %(counted)s::boolean
),
credits AS (
    SELECT COALESCE(sum(c.allowance), 0)::int AS n FROM pgqueue_flow_credit c
    WHERE c.queue = %(queue)s AND c.until > now() AND %(counted)s::boolean
      AND %(key_rate)s::float8 IS NULL AND c.holder IS DISTINCT FROM %(holder)s
),
shards AS (
    SELECT b.shard,
           LEAST(%(burst)s::float8 / %(tickets)s, b.tokens + %(rate)s::float8 / %(tickets)s * extract(epoch FROM clock_timestamp() - b.refilled_at)) AS tokens,
           b.held
    FROM pgqueue_flow_rate_shard b
    WHERE b.queue = %(queue)s AND (%(rate)s::float8 IS NOT NULL OR %(counted)s::boolean)
), state AS (
    SELECT %(burst)s::float8
             * (%(tickets)s - (SELECT count(*) FROM shards WHERE shard <= %(tickets)s))
             / %(tickets)s
             + COALESCE((SELECT sum(tokens) FROM shards WHERE shard <= %(tickets)s), 0) AS tokens,
           (SELECT tokens FROM shards WHERE shard = NULLIF(current_setting('pgqueue.claim_ticket', true), '')::int) AS own_tokens,
           f.queue IS NOT NULL AS known,
           EXISTS (SELECT 1 FROM pgqueue_queue q WHERE q.name = %(queue)s AND q.paused) AS paused,
           (SELECT held FROM leases) + (SELECT n FROM credits) AS held,
           (SELECT n FROM credits) AS credits
    FROM (SELECT 1) one LEFT JOIN pgqueue_flow_state f ON f.queue = %(queue)s
),
key_room AS (
    SELECT NULL::text AS key, 0 AS room WHERE %(key_limit)s::int IS NOT NULL
),
new_state AS (
    INSERT INTO pgqueue_flow_state (queue)
    SELECT %(queue)s FROM state WHERE NOT known
    ON CONFLICT (queue) DO NOTHING
), budget AS (
    SELECT CASE WHEN s.paused THEN 0 ELSE GREATEST(0, LEAST(
               %(n)s::int,
               COALESCE(%(queue_limit)s::int - s.held, %(n)s::int),
               COALESCE(floor(s.tokens + 1e-9)::int, %(n)s::int))) END AS n,
           false AS contended
    FROM state s
),
chosen AS (
    SELECT id, lease_token, false AS locked,
           row_number() OVER (ORDER BY priority DESC, available_at, id) AS k
    FROM (SELECT id, lease_token, priority, available_at FROM pgqueue_message
          WHERE queue = %(queue)s AND attempts < max_attempts AND available_at <= now()
          ORDER BY priority DESC, available_at, id
          LIMIT (SELECT n FROM budget)
          ) head
),
relocked AS (
    SELECT m.id, m.lease_token,
           array_position(ARRAY(SELECT id FROM chosen ORDER BY k), m.id) AS k
    FROM pgqueue_message m
    WHERE m.id = ANY(ARRAY(SELECT id FROM chosen WHERE NOT locked)) AND m.queue = %(queue)s
      AND m.attempts - m.max_attempts < 0 AND m.available_at <= now()
    FOR UPDATE OF m SKIP LOCKED
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
    SELECT id, lease_token FROM (
        SELECT id, lease_token, k FROM chosen WHERE locked
      UNION ALL
        SELECT id, lease_token, k FROM relocked) c
    ORDER BY k
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
),
own_credit_ended AS (
    DELETE FROM pgqueue_flow_credit
    WHERE queue = %(queue)s AND holder = %(holder)s AND %(key_rate)s::float8 IS NULL
)
SELECT 'claimed' AS outcome, claimed.* FROM claimed
UNION ALL
SELECT 'buried', message_id, queue, task, NULL, NULL, NULL, NULL, NULL, NULL, attempts, NULL,
       NULL, worker_id, NULL, NULL, 0
FROM buried
UNION ALL
SELECT 'contended', NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, 0 FROM budget WHERE contended
UNION ALL
SELECT 'held', NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, held - credits
FROM state WHERE %(counted)s::boolean AND held IS NOT NULL
ORDER BY position
