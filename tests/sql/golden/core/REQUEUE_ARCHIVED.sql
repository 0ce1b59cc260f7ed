INSERT INTO pgqueue_message (queue, task, payload, priority, tenant, max_attempts)
SELECT queue, task, payload, priority, tenant, max_attempts
FROM pgqueue_archive WHERE id = ANY(%s)
ORDER BY id
RETURNING id, queue
