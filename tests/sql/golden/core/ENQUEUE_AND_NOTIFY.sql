WITH inserted AS (
INSERT INTO pgqueue_message
    (queue, task, payload, priority, tenant, dedup_key, max_attempts, available_at)
VALUES
    (%s, %s, %s::jsonb, %s, %s, %s, %s,
     COALESCE(%s::timestamptz, statement_timestamp() + make_interval(secs => %s)))
RETURNING id, enqueued_at, available_at
)
SELECT id, enqueued_at, available_at, pg_notify(%s, %s) FROM inserted
