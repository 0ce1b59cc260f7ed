save_buckets AS (
    INSERT INTO pgqueue_flow_key_bucket AS b (queue, key, tokens, refilled_at)
    SELECT %(queue)s, tenant, %(key_burst)s::float8 - count(*), clock_timestamp()
    FROM claimed
    WHERE %(key_rate)s::float8 IS NOT NULL AND tenant IS NOT NULL
    GROUP BY tenant
    ON CONFLICT (queue, key) DO UPDATE
    SET tokens = LEAST(%(key_burst)s::float8,
                       b.tokens + %(key_rate)s::float8
                                  * extract(epoch FROM clock_timestamp() - b.refilled_at))
                 - (%(key_burst)s::float8 - EXCLUDED.tokens),
        refilled_at = clock_timestamp()
), idle_buckets AS (
    -- The idle keys worked out once (an array), then deleted by primary key: as ``key IN
    -- (...)`` the planner may run the subquery again for every bucket of the queue, O(buckets
    -- squared) on every claim.
    DELETE FROM pgqueue_flow_key_bucket
    WHERE queue = %(queue)s AND key = ANY(ARRAY(
        SELECT key FROM pgqueue_flow_key_bucket
        WHERE queue = %(queue)s AND %(key_rate)s::float8 IS NOT NULL
          AND key NOT IN (SELECT tenant FROM claimed WHERE tenant IS NOT NULL)
          AND refilled_at < clock_timestamp()
                            - make_interval(secs => %(key_burst)s::float8 / %(key_rate)s::float8)
        LIMIT 16))
)
