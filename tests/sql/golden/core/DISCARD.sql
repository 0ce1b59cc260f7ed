WITH removed AS (
    DELETE FROM pgqueue_message WHERE id = ANY(%s) RETURNING *
)
INSERT INTO pgqueue_dead (message_id, queue, task, payload, priority, tenant, dedup_key, enqueued_at, attempts, max_attempts, errors, reason, details, worker_id, died_at)
SELECT id, queue, task, payload, priority, tenant, dedup_key, enqueued_at, attempts, max_attempts, errors, 'discarded',
       jsonb_build_object('type', 'Discarded', 'message', %s, 'traceback', ''),
       leased_by, now()
FROM removed
RETURNING message_id
