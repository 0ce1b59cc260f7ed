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
)
