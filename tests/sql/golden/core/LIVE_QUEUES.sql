WITH RECURSIVE q(queue) AS (
    (SELECT queue FROM pgqueue_message WHERE attempts < max_attempts ORDER BY queue LIMIT 1)
    UNION ALL
    SELECT (SELECT m.queue FROM pgqueue_message m
            WHERE m.queue > q.queue AND m.attempts < m.max_attempts
            ORDER BY m.queue LIMIT 1)
    FROM q WHERE q.queue IS NOT NULL
)
SELECT queue FROM q WHERE queue IS NOT NULL
