credits AS (
    SELECT COALESCE(sum(c.allowance), 0)::int AS n FROM pgqueue_flow_credit c
    WHERE c.queue = %(queue)s AND c.until > now() AND %(counted)s::boolean
      AND %(key_rate)s::float8 IS NULL AND c.holder IS DISTINCT FROM %(holder)s
),
shards AS (
    SELECT b.shard, b.tokens, b.refilled_at, b.held, b.counted_at
    FROM pgqueue_flow_rate_shard b
    WHERE b.queue = %(queue)s AND (%(rate)s::float8 IS NOT NULL OR %(counted)s::boolean)
), state AS (
    SELECT (SELECT LEAST(%(burst)s::float8 / %(tickets)s, b.tokens + %(rate)s::float8 / %(tickets)s * extract(epoch FROM clock_timestamp() - b.refilled_at))
            FROM shards b
            WHERE %(rate)s::float8 IS NOT NULL AND b.shard = NULLIF(current_setting('pgqueue.claim_ticket', true), '')::int) AS own_tokens,
           -- Shards to read imply the state row (the serialized claim that created the shards
           -- created it too): no probe.
           %(rate)s::float8 IS NOT NULL OR %(counted)s::boolean
             OR EXISTS (SELECT 1 FROM pgqueue_flow_state f WHERE f.queue = %(queue)s) AS known,
           EXISTS (SELECT 1 FROM pgqueue_queue q WHERE q.name = %(queue)s AND q.paused) AS paused,
           CASE WHEN NOT %(counted)s::boolean THEN 0
                WHEN (SELECT count(*) FROM shards WHERE counted_at > now() - make_interval(secs => %(recount)s::float8)) = 2 * %(tickets)s
                THEN (SELECT sum(held) FROM shards)::bigint END AS held,
           (SELECT n FROM credits) AS credits
)
