WITH released AS (
    UPDATE pgqueue_message m
    SET available_at = now(), lease_token = NULL, leased_by = NULL, leased_at = NULL,
        attempts = CASE WHEN %s THEN GREATEST(m.attempts - 1, 0) ELSE m.attempts END
    FROM unnest(%s::bigint[], %s::uuid[]) AS l(id, token)
    WHERE m.id = l.id AND m.lease_token = l.token
    RETURNING m.id, m.queue, m.fair_order
), uncounted AS (
    UPDATE pgqueue_flow_rate_shard b SET held = b.held - e.n
    FROM (SELECT count(*)::int AS n FROM released WHERE queue = %s AND fair_order < 0) e
    WHERE b.queue = %s AND b.shard = 1 + 4 + pg_backend_pid() %% 4 AND e.n > 0
)
SELECT id FROM released
