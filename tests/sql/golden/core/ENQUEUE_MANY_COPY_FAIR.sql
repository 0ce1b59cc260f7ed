COPY pgqueue_message
    (queue, task, payload, priority, tenant, max_attempts, available_at, fair_order)
FROM STDIN
