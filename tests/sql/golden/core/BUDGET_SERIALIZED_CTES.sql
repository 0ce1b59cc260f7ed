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
)
