WITH target AS (
    SELECT id, (lease_token IS NOT NULL AND available_at > now()) AS held
    FROM pgqueue_message WHERE id = ANY(%s)
    FOR UPDATE
), removed AS (
    DELETE FROM pgqueue_message m USING target t
    WHERE m.id = t.id AND NOT t.held
    RETURNING m.*
), buried AS (
    INSERT INTO pgqueue_dead (message_id, queue, task, payload, priority, tenant, dedup_key, enqueued_at, attempts, max_attempts, errors, reason, details, worker_id, died_at)
    SELECT id, queue, task, payload, priority, tenant, dedup_key, enqueued_at, attempts, max_attempts, errors, 'cancelled',
           jsonb_build_object('type', 'Cancelled', 'message', %s, 'traceback', ''),
           leased_by, now()
    FROM removed
    RETURNING message_id
), flagged AS (
    UPDATE pgqueue_message m
    SET cancel_requested_at = COALESCE(m.cancel_requested_at, now())
    FROM target t
    WHERE m.id = t.id AND t.held
    RETURNING m.id
)
SELECT message_id, 'cancelled' FROM buried
UNION ALL
SELECT id, 'flagged' FROM flagged
