WITH revived AS (
    DELETE FROM pgqueue_dead d
    WHERE d.message_id = ANY(%s)
      AND NOT EXISTS (
          SELECT 1 FROM pgqueue_message m
          WHERE m.queue = d.queue AND m.dedup_key = d.dedup_key)
    RETURNING d.*
)
INSERT INTO pgqueue_message (id, queue, task, payload, priority, tenant, dedup_key, enqueued_at, attempts, max_attempts, errors, available_at)
SELECT message_id, queue, task, payload, priority, tenant, dedup_key, enqueued_at, 0,
       max_attempts, errors, now()
FROM revived
RETURNING id, queue
