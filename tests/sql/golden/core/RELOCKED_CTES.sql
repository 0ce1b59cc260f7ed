relocked AS (
    SELECT m.id, m.lease_token,
           array_position(ARRAY(SELECT id FROM chosen ORDER BY k), m.id) AS k
    FROM pgqueue_message m
    WHERE m.id = ANY(ARRAY(SELECT id FROM chosen WHERE NOT locked)) AND m.queue = %(queue)s
      AND m.attempts - m.max_attempts < 0 AND m.available_at <= now()
    FOR UPDATE OF m SKIP LOCKED
)
