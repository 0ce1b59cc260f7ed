save_state AS (
    -- Every shard written. Tokens: taken from every shard in proportion; shards not written
    -- yet are created full. Leases: the exact count (and what this claim leased) in shard 1,
    -- none in the others, each keeping what acks committed to it since this statement's
    -- snapshot: EXCLUDED.held less the shard as read, plus the shard as locked now.
    INSERT INTO pgqueue_flow_rate_shard AS b (queue, shard, tokens, refilled_at, held, counted_at)
    SELECT %(queue)s, g.shard,
           COALESCE(t.tokens * (1 - LEAST(1.0::float8,
                                          (SELECT count(*) FROM claimed)::float8
                                          / GREATEST((SELECT tokens FROM state), 1e-9))), 0),
           clock_timestamp(),
           CASE WHEN g.shard = 1 AND %(counted)s::boolean
                THEN (SELECT members FROM leases) + (SELECT count(*) FROM claimed)::int
                     + (SELECT n FROM credits)
                ELSE 0 END - t.held,
           CASE WHEN %(counted)s::boolean THEN clock_timestamp() END
    FROM generate_series(1, 2 * %(tickets)s) g(shard)
    CROSS JOIN LATERAL (
        SELECT CASE WHEN g.shard <= %(tickets)s
                    THEN COALESCE((SELECT s.tokens FROM shards s WHERE s.shard = g.shard),
                                  %(burst)s::float8 / %(tickets)s) END AS tokens,
               COALESCE((SELECT s.held FROM shards s WHERE s.shard = g.shard), 0) AS held) t
    WHERE %(rate)s::float8 IS NOT NULL OR %(counted)s::boolean
    ON CONFLICT (queue, shard) DO UPDATE
    SET tokens = EXCLUDED.tokens, refilled_at = EXCLUDED.refilled_at,
        held = CASE WHEN %(counted)s::boolean THEN EXCLUDED.held + b.held ELSE 0 END,
        counted_at = EXCLUDED.counted_at
)
