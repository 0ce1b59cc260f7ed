WITH released AS (
    UPDATE pgqueue_message m
    SET available_at = now(), lease_token = NULL, leased_by = NULL, leased_at = NULL,
        attempts = CASE WHEN %s THEN GREATEST(m.attempts - 1, 0) ELSE m.attempts END
    FROM unnest(%s::bigint[], %s::uuid[]) AS l(id, token)
    WHERE m.id = l.id AND m.lease_token = l.token
    RETURNING m.id, m.queue, m.fair_order
)
SELECT id FROM released
