WITH inserted AS (
INSERT INTO pgqueue_message
    (queue, task, payload, priority, tenant, dedup_key, max_attempts, available_at, fair_order)
SELECT v.queue, v.task, v.payload::jsonb, v.priority, v.tenant, v.dedup_key, v.max_attempts,
       v.available_at,
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
FROM (SELECT %s::text AS queue, %s::text AS task, %s::text AS payload,
             %s::smallint AS priority, %s::text AS tenant, %s::text AS dedup_key,
             %s::int AS max_attempts,
             COALESCE(%s::timestamptz, statement_timestamp() + make_interval(secs => %s::float8))
                 AS available_at,
             %s::float8 AS step) v
ON CONFLICT (queue, dedup_key) WHERE dedup_key IS NOT NULL DO NOTHING
RETURNING id, enqueued_at, available_at)
SELECT id, enqueued_at, available_at, pg_notify(%s, %s) FROM inserted
