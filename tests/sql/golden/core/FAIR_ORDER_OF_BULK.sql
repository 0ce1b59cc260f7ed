SELECT v.available_at,
       CASE WHEN v.available_at <= statement_timestamp() THEN GREATEST(
    COALESCE((SELECT h.fair_order FROM pgqueue_message h
              WHERE h.queue = v.queue AND h.priority = v.priority AND h.fair_order >= 0
              ORDER BY h.fair_order LIMIT 1), 0),
    (SELECT t.fair_order + v.step FROM pgqueue_message t
     WHERE t.queue = v.queue AND t.tenant = v.tenant AND t.priority = v.priority
       AND t.fair_order >= 0
     ORDER BY t.fair_order DESC LIMIT 1),
    (SELECT t.fair_order + v.step FROM pgqueue_message t
     WHERE v.tenant IS NULL AND t.queue = v.queue AND t.tenant IS NULL
       AND t.priority = v.priority AND t.fair_order >= 0
     ORDER BY t.fair_order DESC LIMIT 1)) ELSE -1 END
FROM (SELECT %(queue)s::text AS queue, %(priority)s::smallint AS priority,
             %(tenant)s::text AS tenant, %(step)s::float8 AS step,
             COALESCE(%(run_at)s::timestamptz,
                      statement_timestamp() + make_interval(secs => %(delay)s::float8))
                 AS available_at) v
