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
)
