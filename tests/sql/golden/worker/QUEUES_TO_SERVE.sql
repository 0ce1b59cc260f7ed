WITH RECURSIVE live AS (
WITH RECURSIVE q(queue) AS (
    (SELECT queue FROM pgqueue_message WHERE attempts < max_attempts ORDER BY queue LIMIT 1)
    UNION ALL
    SELECT (SELECT m.queue FROM pgqueue_message m
            WHERE m.queue > q.queue AND m.attempts < m.max_attempts
            ORDER BY m.queue LIMIT 1)
    FROM q WHERE q.queue IS NOT NULL
)
SELECT queue FROM q WHERE queue IS NOT NULL
), e(queue) AS (
    (SELECT queue FROM pgqueue_message
     WHERE attempts >= max_attempts AND available_at <= now() ORDER BY queue LIMIT 1)
    UNION ALL
    SELECT (SELECT m.queue FROM pgqueue_message m
            WHERE m.queue > e.queue AND m.attempts >= m.max_attempts AND m.available_at <= now()
            ORDER BY m.queue LIMIT 1)
    FROM e WHERE e.queue IS NOT NULL
)
SELECT queue FROM live UNION SELECT queue FROM e WHERE queue IS NOT NULL ORDER BY 1
