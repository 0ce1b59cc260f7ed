WITH input AS (
    SELECT * FROM unnest(%s::bigint[], %s::uuid[], %s::text[], %s::text[], %s::float8[])
        AS i(id, token, error, final_reason, delay)
), target AS (
    -- Each error records when its attempt started and failed (database time), unless the
    -- caller set them: the Tasks backend reports a task's first start from this history.
    SELECT m.id, m.queue, m.fair_order,
           jsonb_build_object('started_at', m.leased_at, 'at', now()) || i.error::jsonb AS error,
           -- A message flagged by cancel() while it ran is never retried.
           CASE WHEN m.cancel_requested_at IS NULL THEN i.final_reason ELSE 'cancelled' END
               AS final_reason,
           i.delay,
           (i.delay IS NOT NULL AND m.attempts < m.max_attempts
            AND m.cancel_requested_at IS NULL) AS retry
    FROM pgqueue_message m JOIN input i ON m.id = i.id AND m.lease_token = i.token
    FOR UPDATE OF m
), uncounted AS (
    UPDATE pgqueue_flow_rate_shard b SET held = b.held - e.n
    FROM (SELECT count(*)::int AS n FROM target WHERE queue = %s AND fair_order < 0) e
    WHERE b.queue = %s AND b.shard = 1 + 4 + pg_backend_pid() %% 4 AND e.n > 0
), retried AS (
    UPDATE pgqueue_message m
    SET available_at = now() + make_interval(secs => t.delay),
        lease_token = NULL, leased_by = NULL, leased_at = NULL,
        last_error = t.error,
        errors = m.errors || jsonb_build_array(t.error)
    FROM target t
    WHERE m.id = t.id AND t.retry
    RETURNING m.id
), removed AS (
    DELETE FROM pgqueue_message m USING target t
    WHERE m.id = t.id AND NOT t.retry
    RETURNING m.*, t.error, t.final_reason
), buried AS (
    INSERT INTO pgqueue_dead
        (message_id, queue, task, payload, priority, tenant, dedup_key, enqueued_at, attempts, max_attempts, errors, reason, details, worker_id, died_at)
    SELECT id, queue, task, payload, priority, tenant, dedup_key, enqueued_at, attempts,
           max_attempts, errors || jsonb_build_array(error), final_reason, error, leased_by, now()
    FROM removed
    RETURNING message_id
)
SELECT id, 'retried' FROM retried
UNION ALL
SELECT message_id, 'buried' FROM buried
