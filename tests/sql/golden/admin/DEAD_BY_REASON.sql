SELECT q.queue, r.reason, count(*)
FROM unnest(%(queues)s::text[]) AS q(queue)
CROSS JOIN LATERAL (
    SELECT d.reason FROM pgqueue_dead d
    WHERE d.queue = q.queue
    ORDER BY d.died_at DESC
    LIMIT %(cap)s
) r
GROUP BY q.queue, r.reason
ORDER BY q.queue, r.reason
