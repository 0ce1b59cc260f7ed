SELECT q.queue, (extract(epoch FROM now()) - extract(epoch FROM o.available_at))::float8
FROM unnest(%s::text[]) AS q(queue)
CROSS JOIN LATERAL (
    SELECT m.available_at FROM pgqueue_message m
    WHERE m.queue = q.queue AND m.attempts < m.max_attempts
      AND m.available_at <= now() - make_interval(secs => %s)
    LIMIT 1
) o
WHERE NOT EXISTS (SELECT 1 FROM pgqueue_queue p WHERE p.name = q.queue AND p.paused)
