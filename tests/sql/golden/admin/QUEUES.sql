WITH RECURSIVE

live(queue) AS (
    (SELECT queue FROM pgqueue_message WHERE attempts < max_attempts ORDER BY queue LIMIT 1)
    UNION ALL
    SELECT (SELECT t.queue FROM pgqueue_message t
            WHERE t.queue > live.queue AND attempts < max_attempts
            ORDER BY t.queue LIMIT 1)
    FROM live WHERE live.queue IS NOT NULL
),

exhausted(queue) AS (
    (SELECT queue FROM pgqueue_message WHERE attempts >= max_attempts ORDER BY queue LIMIT 1)
    UNION ALL
    SELECT (SELECT t.queue FROM pgqueue_message t
            WHERE t.queue > exhausted.queue AND attempts >= max_attempts
            ORDER BY t.queue LIMIT 1)
    FROM exhausted WHERE exhausted.queue IS NOT NULL
),

dead(queue) AS (
    (SELECT queue FROM pgqueue_dead WHERE TRUE ORDER BY queue LIMIT 1)
    UNION ALL
    SELECT (SELECT t.queue FROM pgqueue_dead t
            WHERE t.queue > dead.queue AND TRUE
            ORDER BY t.queue LIMIT 1)
    FROM dead WHERE dead.queue IS NOT NULL
),

archived(queue) AS (
    (SELECT queue FROM pgqueue_archive WHERE TRUE ORDER BY queue LIMIT 1)
    UNION ALL
    SELECT (SELECT t.queue FROM pgqueue_archive t
            WHERE t.queue > archived.queue AND TRUE
            ORDER BY t.queue LIMIT 1)
    FROM archived WHERE archived.queue IS NOT NULL
),
names(queue) AS (
    SELECT queue FROM live UNION SELECT queue FROM exhausted
    UNION SELECT queue FROM dead UNION SELECT queue FROM archived
    UNION SELECT name FROM pgqueue_queue
    UNION SELECT jsonb_array_elements_text(queues) FROM pgqueue_worker
          WHERE jsonb_typeof(queues) = 'array'
            AND last_seen_at > now() - make_interval(secs => %(live_window)s)
)
SELECT n.queue, COALESCE(s.paused, FALSE)
FROM names n LEFT JOIN pgqueue_queue s ON s.name = n.queue
WHERE n.queue IS NOT NULL
ORDER BY n.queue
