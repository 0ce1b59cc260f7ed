INSERT INTO pgqueue_message
    (queue, task, payload, priority, tenant, dedup_key, max_attempts, available_at)
VALUES
    (%s, %s, %s::jsonb, %s, %s, %s, %s,
     COALESCE(%s::timestamptz, statement_timestamp() + make_interval(secs => %s)))
ON CONFLICT (queue, dedup_key) WHERE dedup_key IS NOT NULL DO NOTHING
RETURNING id, enqueued_at, available_at
