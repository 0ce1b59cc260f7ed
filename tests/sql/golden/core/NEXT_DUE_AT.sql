WITH RECURSIVE p(priority) AS (
    (SELECT priority FROM pgqueue_message
     WHERE queue = %(queue)s AND attempts < max_attempts
     ORDER BY priority DESC LIMIT 1)
    UNION ALL
    SELECT (SELECT m.priority FROM pgqueue_message m
            WHERE m.queue = %(queue)s AND m.attempts < m.max_attempts AND m.priority < p.priority
            ORDER BY m.priority DESC LIMIT 1)
    FROM p WHERE p.priority IS NOT NULL
)
SELECT (extract(epoch FROM min((SELECT m.available_at FROM pgqueue_message m
            WHERE m.queue = %(queue)s AND m.attempts < m.max_attempts
              AND m.priority = p.priority AND m.available_at > now()
            ORDER BY m.priority DESC, m.available_at LIMIT 1)))
        - extract(epoch FROM now()))::float8
FROM p WHERE p.priority IS NOT NULL
