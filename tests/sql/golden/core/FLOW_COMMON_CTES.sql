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
)
