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
)
