WITH done AS (
    DELETE FROM pgqueue_message m
    USING unnest(%s::bigint[], %s::uuid[], %s::text[]) AS d(id, token, result)
    WHERE m.id = d.id AND m.lease_token = d.token
    RETURNING m.*, d.result
)
INSERT INTO pgqueue_archive
    (message_id, queue, task, payload, priority, tenant, dedup_key, enqueued_at, attempts, max_attempts, errors, started_at, finished_at, worker_id, result)
SELECT id, queue, task, payload, priority, tenant, dedup_key, enqueued_at, attempts, max_attempts, errors, leased_at, now(), leased_by, result::jsonb
FROM done
RETURNING message_id
