WITH 
credits AS (
    SELECT COALESCE(sum(c.allowance), 0)::int AS n FROM pgqueue_flow_credit c
    WHERE c.queue = %(queue)s AND c.until > now() AND %(counted)s::boolean
      AND %(key_rate)s::float8 IS NULL AND c.holder IS DISTINCT FROM %(holder)s
),
state AS (
    SELECT (SELECT LEAST(%(burst)s::float8 / %(tickets)s, b.tokens + %(rate)s::float8 / %(tickets)s * extract(epoch FROM clock_timestamp() - b.refilled_at))
            FROM pgqueue_flow_rate_shard b
            WHERE b.queue = %(queue)s AND %(rate)s::float8 IS NOT NULL
              AND b.shard = NULLIF(current_setting('pgqueue.claim_ticket', true), '')::int)
             AS own_tokens,
           -- With a rate, a missing shard reads as no tokens already; shards imply the state
           -- row (the serialized claim that created them created it too).
           CASE WHEN %(rate)s::float8 IS NOT NULL THEN true
                WHEN %(counted)s::boolean
                THEN EXISTS (SELECT 1 FROM pgqueue_flow_rate_shard b
                             WHERE b.queue = %(queue)s AND b.shard = NULLIF(current_setting('pgqueue.claim_ticket', true), '')::int)
                ELSE EXISTS (SELECT 1 FROM pgqueue_flow_state f WHERE f.queue = %(queue)s)
           END AS known,
           EXISTS (SELECT 1 FROM pgqueue_queue q WHERE q.name = %(queue)s AND q.paused) AS paused,
           CASE WHEN %(counted)s::boolean
                THEN (SELECT count(*)::int FROM pgqueue_message
                      WHERE queue = %(queue)s AND lease_token IS NOT NULL AND fair_order < 0 AND available_at > now())
                     + (SELECT n FROM credits)
                ELSE 0 END AS held,
           (SELECT n FROM credits) AS credits
),
in_flight AS (
    SELECT tenant AS key, count(*)::int AS n FROM pgqueue_message
    WHERE queue = %(queue)s AND lease_token IS NOT NULL AND fair_order < 0 AND available_at > now() AND tenant IS NOT NULL
      AND %(least_key_limit)s::int IS NOT NULL
      AND NOT COALESCE(%(least_key_limit)s::int - (SELECT held FROM state)
                       >= GREATEST(%(margin)s::int, %(n)s::int), false)
    GROUP BY tenant
), key_room AS (
    SELECT i.key,
           COALESCE((%(key_limits)s::jsonb ->> i.key)::int, %(key_limit)s::int, 2147483647)
             - i.n - (SELECT credits FROM state) AS room
    FROM in_flight i
  UNION ALL
    SELECT o.key, o.value::int - (SELECT credits FROM state)
    FROM jsonb_each_text(%(key_limits)s::jsonb) o
  UNION ALL
    SELECT b.key, floor(LEAST(%(key_burst)s::float8,
                              b.tokens + %(key_rate)s::float8
                                         * extract(epoch FROM clock_timestamp() - b.refilled_at)))::int
    FROM pgqueue_flow_key_bucket b
    WHERE b.queue = %(queue)s AND %(key_rate)s::float8 IS NOT NULL
),
room AS (
    SELECT COALESCE(current_setting('pgqueue.claim_ticket', true), '') <> ''
           AND s.known AND s.held IS NOT NULL
           AND COALESCE(%(queue_limit)s::int - s.held >= %(margin)s::int, true)
           AND (%(rate)s::float8 IS NULL OR COALESCE(s.own_tokens >= %(n)s::int, false))
           AND COALESCE(%(key_limit)s::int >= %(margin)s::int, true)
           AND COALESCE(%(key_burst)s::float8 >= %(margin)s::int, true)
           -- Room for every key: the queue's whole in flight leaves the default key limit
           -- ``margin`` away (no key has more), or else counted key by key.
           AND CASE WHEN %(key_limits)s::jsonb = '{}'::jsonb AND %(key_rate)s::float8 IS NULL
                         AND COALESCE(%(key_limit)s::int - s.held >= %(margin)s::int, true)
                    THEN true
                    ELSE NOT EXISTS (SELECT 1 FROM key_room WHERE room < %(margin)s::int) END
               AS ok
    FROM state s
), budget AS (
    SELECT CASE WHEN s.paused OR NOT r.ok THEN 0 ELSE GREATEST(0, LEAST(
               %(n)s::int,
               COALESCE(%(queue_limit)s::int - s.held, %(n)s::int),
               COALESCE(floor(s.own_tokens + 1e-9)::int, %(n)s::int))) END AS n,
           NOT s.paused AND NOT r.ok AS contended
    FROM state s CROSS JOIN room r
), credit AS (
    -- The claim credit this claim may grant its session (``credit_size`` > 0: see "Claim
    -- credits"): a ticket's share of what is left to spare under each limit once the margin
    -- and this batch are kept (the grants side by side, which do not see each other, fit
    -- together), and the tokens its shard has left; none with a key rate. Whole batches:
    -- what a session cannot lease in claims of its batch size is not taken from the others.
    SELECT GREATEST(0, LEAST(
               %(credit_size)s::int,
               (%(queue_limit)s::int - s.held - %(margin)s::int - b.n) / %(tickets)s,
               (%(least_key_limit)s::int - s.held - %(margin)s::int - b.n) / %(tickets)s,
               floor(s.own_tokens + 1e-9)::int - b.n)) / %(n)s::int * %(n)s::int AS allowance
    FROM state s CROSS JOIN budget b
    WHERE %(credit_size)s::int > 0 AND b.n = %(n)s::int AND %(key_rate)s::float8 IS NULL
),
uncapped AS (
    SELECT %(key_rate)s::float8 IS NULL
           AND COALESCE(%(least_key_limit)s::int - (SELECT held FROM state)
                        >= (SELECT n FROM budget), true) AS ok
), short AS (
    SELECT count(DISTINCT key)::int AS n FROM key_room WHERE room < (SELECT n FROM budget)
), reach AS (
    SELECT CASE WHEN (SELECT ok FROM uncapped) THEN 0
                WHEN %(key_limit)s::int - (SELECT credits FROM state) < (SELECT n FROM budget)
                     OR (SELECT n FROM short) > 0
                THEN (SELECT n FROM budget) + 2 * (SELECT n FROM short) + %(window)s::int
                ELSE 0 END AS n
),
head AS (
    SELECT id, lease_token, tenant, priority, fair_order AS place FROM pgqueue_message
    WHERE queue = %(queue)s AND fair_order >= 0
    ORDER BY priority DESC, fair_order, id
    LIMIT (SELECT CASE WHEN b.n > 0 THEN b.n + (SELECT n FROM reach) ELSE 0 END FROM budget b)
    FOR UPDATE SKIP LOCKED
), due_again AS (
    (SELECT id, lease_token, tenant, priority, available_at FROM pgqueue_message
     WHERE queue = %(queue)s AND fair_order < 0 AND lease_token IS NULL
       AND attempts < max_attempts AND available_at <= now()
     ORDER BY available_at, id
     LIMIT %(place_limit)s)
  UNION ALL
    (SELECT id, lease_token, tenant, priority, available_at FROM pgqueue_message
     WHERE queue = %(queue)s AND fair_order < 0 AND lease_token IS NOT NULL
       AND available_at <= now() AND attempts < max_attempts
     ORDER BY available_at
     LIMIT %(place_limit)s)
  UNION ALL
    SELECT id, lease_token, tenant, priority, available_at FROM (
        SELECT id, lease_token, tenant, priority, available_at, fair_order FROM pgqueue_message
        WHERE queue = %(queue)s AND attempts < max_attempts AND available_at <= now()
        ORDER BY priority DESC, available_at, id
        LIMIT %(unplaced_window)s) oldest
    WHERE fair_order IS NULL
), entry AS (
    SELECT g.tenant, g.priority, g.step,
           GREATEST(
    COALESCE((SELECT h.fair_order FROM pgqueue_message h
              WHERE h.queue = %(queue)s AND h.priority = g.priority AND h.fair_order >= 0
              ORDER BY h.fair_order LIMIT 1), 0),
    (SELECT t.fair_order + g.step FROM pgqueue_message t
     WHERE t.queue = %(queue)s AND t.tenant = g.tenant AND t.priority = g.priority
       AND t.fair_order >= 0
     ORDER BY t.fair_order DESC LIMIT 1),
    (SELECT t.fair_order + g.step FROM pgqueue_message t
     WHERE g.tenant IS NULL AND t.queue = %(queue)s AND t.tenant IS NULL
       AND t.priority = g.priority AND t.fair_order >= 0
     ORDER BY t.fair_order DESC LIMIT 1)) AS place
    FROM (SELECT tenant, priority,
                 1.0::float8 / COALESCE((%(weights)s::jsonb ->> tenant)::int, 1) AS step
          FROM due_again GROUP BY tenant, priority) g
), placed AS (
    SELECT d.id, d.lease_token, d.tenant, d.priority,
           e.place + (row_number() OVER (PARTITION BY d.tenant, d.priority
                                         ORDER BY d.available_at, d.id) - 1) * e.step AS place
    FROM due_again d
    JOIN entry e ON e.tenant IS NOT DISTINCT FROM d.tenant AND e.priority = d.priority
), candidate AS (
    SELECT id, lease_token, true AS locked, tenant, priority, place FROM head
  UNION ALL
    SELECT id, lease_token, false, tenant, priority, place FROM placed
),
capacity AS (
    SELECT t.tenant,
           LEAST(
               COALESCE((%(key_limits)s::jsonb ->> t.tenant)::int, %(key_limit)s::int, 2147483647)
                 - COALESCE(i.n, 0) - (SELECT credits FROM state),
               CASE WHEN %(key_rate)s::float8 IS NULL THEN 2147483647
                    ELSE floor(LEAST(%(key_burst)s::float8,
                                     COALESCE(b.tokens + %(key_rate)s::float8
                                              * extract(epoch FROM clock_timestamp() - b.refilled_at),
                                              %(key_burst)s::float8)) + 1e-9)::int
               END) AS n
    FROM (SELECT DISTINCT tenant FROM candidate WHERE tenant IS NOT NULL) t
    LEFT JOIN in_flight i ON i.key = t.tenant
    LEFT JOIN pgqueue_flow_key_bucket b ON b.queue = %(queue)s AND b.key = t.tenant
), ranked AS (
    SELECT c.*, row_number() OVER (PARTITION BY c.tenant ORDER BY c.priority DESC, c.place, c.id)
             AS nth
    FROM candidate c
), keyed_chosen AS (
    SELECT r.id, r.lease_token, r.locked,
           row_number() OVER (ORDER BY r.priority DESC, r.place, r.id) AS k
    FROM ranked r LEFT JOIN capacity c ON c.tenant = r.tenant
    WHERE r.tenant IS NULL OR r.nth <= c.n
    ORDER BY r.priority DESC, r.place, r.id
    LIMIT (SELECT n FROM budget)
), fair_chosen AS (
    SELECT id, lease_token, locked, row_number() OVER (ORDER BY priority DESC, place, id) AS k
    FROM candidate
    ORDER BY priority DESC, place, id
    LIMIT (SELECT n FROM budget)
), chosen AS (
    -- A CTE runs only when read: one of the two choices is computed.
    SELECT * FROM fair_chosen WHERE (SELECT ok FROM uncapped)
  UNION ALL
    SELECT * FROM keyed_chosen WHERE NOT (SELECT ok FROM uncapped)
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
granted AS (
    SELECT 0 AS allowance WHERE false
),
save_places AS (
    UPDATE pgqueue_message m SET fair_order = p.place
    FROM placed p
    -- By primary key whatever the plan, as LEASE's ``claimed``.
    WHERE m.id = ANY(ARRAY(SELECT id FROM placed)) AND m.id = p.id
      AND p.id <> ALL(ARRAY(SELECT id FROM chosen))
      AND (m.fair_order < 0 OR m.fair_order IS NULL) AND m.available_at <= now()
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
